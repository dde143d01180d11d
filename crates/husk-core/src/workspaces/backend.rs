//! [`Workspaces`]: the workspaces as their users see them, whichever process holds them. In
//! `husk serve` the files helper holds the state directory's workspaces (their files, the
//! teams' loop-mounted file systems) and the server holds a
//! [`RemoteWorkspaces`](super::remote::RemoteWorkspaces); the CLI and tests open the
//! directory themselves ([`LocalWorkspaces`]).

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use husk_runtime::transfer::OutputLimits;

use super::remote::{RemoteExport, RemoteWorkspaces};
use super::{
    Attrs, Entry, ImportLimits, Listing, LocalWorkspaces, QuotaState, QuotaUsage, TarExport,
    TarReport, WorkspaceError, WorkspaceInfo, WorkspaceQuota, WriteOptions, WriteReport,
};
use crate::manager::LiveSandbox;
use crate::runs::outputs::{self, OutputsReport, SaveError};

/// The workspaces of every team: this process's, or the files helper's.
#[derive(Debug)]
pub struct Workspaces(Backend);

#[derive(Debug)]
enum Backend {
    Local(Box<LocalWorkspaces>),
    Remote(Arc<RemoteWorkspaces>),
}

/// What [`Workspaces::exporter`] found to export, to be written.
pub enum Export {
    Local(TarExport),
    Remote(RemoteExport),
}

impl Export {
    /// Writes the tar to `writer` (see [`Workspaces::export_tar`]).
    pub fn write_to(self, writer: impl Write) -> Result<TarReport, WorkspaceError> {
        match self {
            Export::Local(e) => e.write_to(writer),
            Export::Remote(e) => e.write_to(writer),
        }
    }
}

/// Each method goes to the backend's method of the same name and signature.
macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {$(
        pub fn $name(&self, $($arg: $ty),*) -> $ret {
            match &self.0 {
                Backend::Local(w) => w.$name($($arg),*),
                Backend::Remote(w) => w.$name($($arg),*),
            }
        }
    )*};
}

impl Workspaces {
    /// [`LocalWorkspaces::open`].
    pub fn open(state_dir: &Path) -> Result<Workspaces, WorkspaceError> {
        LocalWorkspaces::open(state_dir).map(Workspaces::local)
    }

    /// [`LocalWorkspaces::open_with_quota`].
    pub fn open_with_quota(
        state_dir: &Path,
        quota: WorkspaceQuota,
    ) -> Result<Workspaces, WorkspaceError> {
        LocalWorkspaces::open_with_quota(state_dir, quota).map(Workspaces::local)
    }

    pub fn local(local: LocalWorkspaces) -> Workspaces {
        Workspaces(Backend::Local(Box::new(local)))
    }

    /// The files helper's workspaces, through its channels.
    pub fn remote(remote: Arc<RemoteWorkspaces>) -> Workspaces {
        Workspaces(Backend::Remote(remote))
    }

    /// The same workspaces with other per-upload bounds.
    pub fn with_upload_limits(self, limits: ImportLimits) -> Workspaces {
        match self.0 {
            Backend::Local(w) => Workspaces::local(w.with_upload_limits(limits)),
            Backend::Remote(w) => {
                w.set_upload_limits(limits);
                Workspaces(Backend::Remote(w))
            }
        }
    }

    pub fn quota_state(&self) -> &QuotaState {
        match &self.0 {
            Backend::Local(w) => w.quota_state(),
            Backend::Remote(w) => w.quota_state(),
        }
    }

    pub fn notices(&self) -> &[String] {
        match &self.0 {
            Backend::Local(w) => w.notices(),
            Backend::Remote(w) => w.notices(),
        }
    }

    delegate! {
        upload_limits() -> ImportLimits;
        usage(team: &str) -> Result<Option<QuotaUsage>, WorkspaceError>;
        quota_error(team: &str) -> Option<WorkspaceError>;
        create(team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError>;
        list(team: &str) -> Result<Vec<WorkspaceInfo>, WorkspaceError>;
        names(team: &str) -> Result<Vec<String>, WorkspaceError>;
        info(team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError>;
        delete(team: &str, name: &str) -> Result<(), WorkspaceError>;
        dir(team: &str, name: &str) -> Result<PathBuf, WorkspaceError>;
        entries(team: &str, name: &str, path: &str, depth: usize) -> Result<Listing, WorkspaceError>;
        stat(team: &str, name: &str, path: &str) -> Result<Entry, WorkspaceError>;
        read_file(team: &str, name: &str, path: &str) -> Result<File, WorkspaceError>;
        remove(team: &str, name: &str, path: &str) -> Result<(), WorkspaceError>;
        make_dir(team: &str, name: &str, path: &str, parents: bool, attrs: &Attrs) -> Result<Entry, WorkspaceError>;
        set_attrs(team: &str, name: &str, path: &str, attrs: &Attrs) -> Result<Entry, WorkspaceError>;
    }

    /// [`LocalWorkspaces::write_file`].
    pub fn write_file(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        max_bytes: u64,
    ) -> Result<WriteReport, WorkspaceError> {
        self.write_file_with(
            team,
            name,
            path,
            reader,
            max_bytes,
            &WriteOptions::default(),
        )
    }

    /// [`LocalWorkspaces::write_file_with`].
    pub fn write_file_with(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        max_bytes: u64,
        options: &WriteOptions,
    ) -> Result<WriteReport, WorkspaceError> {
        match &self.0 {
            Backend::Local(w) => w.write_file_with(team, name, path, reader, max_bytes, options),
            Backend::Remote(w) => w.write_file_with(team, name, path, reader, max_bytes, options),
        }
    }

    /// [`LocalWorkspaces::import_tar`].
    pub fn import_tar(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        limits: ImportLimits,
    ) -> Result<TarReport, WorkspaceError> {
        match &self.0 {
            Backend::Local(w) => w.import_tar(team, name, path, reader, limits),
            Backend::Remote(w) => w.import_tar(team, name, path, reader, limits),
        }
    }

    /// [`LocalWorkspaces::export_tar`].
    pub fn export_tar(
        &self,
        team: &str,
        name: &str,
        path: &str,
        writer: impl Write,
    ) -> Result<TarReport, WorkspaceError> {
        self.exporter(team, name, path)?.write_to(writer)
    }

    /// [`LocalWorkspaces::exporter`]: errors before any byte is written.
    pub fn exporter(&self, team: &str, name: &str, path: &str) -> Result<Export, WorkspaceError> {
        match &self.0 {
            Backend::Local(w) => w.exporter(team, name, path).map(Export::Local),
            Backend::Remote(w) => w.exporter(team, name, path).map(Export::Remote),
        }
    }

    /// Freezes `sandbox` and copies its `outputs` into `runs/<run_id>/` of `team`'s
    /// workspace `workspace` ([`outputs::save`]). Blocking. Through the files helper, the
    /// sandbox is named by its id only: the helper gets its root from the spawner.
    pub fn save_outputs(
        &self,
        team: &str,
        workspace: &str,
        run_id: &str,
        sandbox: &LiveSandbox,
        outputs: &[String],
        limits: &OutputLimits,
    ) -> Result<OutputsReport, SaveError> {
        match &self.0 {
            Backend::Local(w) => {
                let dir = w
                    .dir(team, workspace)
                    .map_err(|e| SaveError::Other(e.to_string()))?;
                sandbox
                    .freeze()
                    .map_err(|e| SaveError::Other(crate::error_chain(&e)))?;
                let root = sandbox
                    .root_dir()
                    .map_err(|e| SaveError::Other(format!("open the sandbox's root: {e}")))?;
                use std::os::fd::AsFd;
                outputs::save(root.as_fd(), workspace, &dir, run_id, outputs, limits)
            }
            Backend::Remote(w) => w.save_outputs(
                team,
                workspace,
                run_id,
                sandbox.runtime_id(),
                outputs,
                limits,
            ),
        }
    }
}
