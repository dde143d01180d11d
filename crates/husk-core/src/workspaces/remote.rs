//! The files helper: the process that holds the workspaces (their files under
//! `STATE_DIR/workspaces`, the teams' loop-mounted file systems) and copies runs' outputs out
//! of sandboxes; and the server's side of it ([`RemoteWorkspaces`]).
//!
//! `husk serve` forks it before any thread (`husk_runtime::helper`), with the spawner's root
//! channel: a run's outputs are copied from the root the spawner hands out for a sandbox id
//! ([`husk_runtime::service::RootChannel`]), never from a directory the server names.
//!
//! One [`FilesRequest`] per workspace operation. Streams go through pipes passed with the
//! request: an upload (a file, a tar archive) as [`ChunkWriter`] chunks, so that an upload
//! the server's client broke off is thrown away, never kept short; an export as the tar
//! itself, announced by [`FilesReply::Exporting`] once the helper found what to export (so
//! that errors still come before any byte), and ended by its report. A file to download
//! comes back open. Every request is hostile: names, paths and sizes are checked in the
//! helper by the same code that checks them for the CLI.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use husk_runtime::failure::{Failure, FailureKind};
use husk_runtime::helper::{self as rt, Channels, HelperError};
use husk_runtime::service::RootChannel;
use husk_runtime::transfer::OutputLimits;
use serde::{Deserialize, Serialize};

use super::{
    Attrs, Entry, ImportLimits, Listing, LocalWorkspaces, QuotaState, QuotaUsage, TarReport,
    WorkspaceError, WorkspaceInfo, WriteOptions, WriteReport,
};
use crate::runs::outputs::{self, OutputsReport, SaveError};

/// The most channels for transfers (and so threads) the files helper is given.
pub const MAX_CHANNELS: usize = 256;

/// Channels kept for the calls the core makes from its own tasks (a workspace's directory
/// for a mount, a team's quota): never held up behind transfers.
const QUICK_CHANNELS: usize = 4;

/// What the server asks the files helper.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FilesRequest {
    Usage {
        team: String,
    },
    QuotaError {
        team: String,
    },
    Create {
        team: String,
        name: String,
    },
    List {
        team: String,
    },
    Names {
        team: String,
    },
    Info {
        team: String,
        name: String,
    },
    Delete {
        team: String,
        name: String,
    },
    Dir {
        team: String,
        name: String,
    },
    Entries {
        team: String,
        name: String,
        path: String,
        depth: u64,
    },
    Stat {
        team: String,
        name: String,
        path: String,
    },
    /// Answered [`FilesReply::File`] with the file open for reading.
    ReadFile {
        team: String,
        name: String,
        path: String,
    },
    /// With the read end of a pipe carrying the content as chunks.
    WriteFile {
        team: String,
        name: String,
        path: String,
        max_bytes: u64,
        options: WriteOptions,
    },
    MakeDir {
        team: String,
        name: String,
        path: String,
        parents: bool,
        attrs: Attrs,
    },
    SetAttrs {
        team: String,
        name: String,
        path: String,
        attrs: Attrs,
    },
    Remove {
        team: String,
        name: String,
        path: String,
    },
    /// With the read end of a pipe carrying the archive as chunks.
    ImportTar {
        team: String,
        name: String,
        path: String,
        limits: ImportLimits,
    },
    /// With the write end of a pipe for the tar: answered [`FilesReply::Exporting`] (or an
    /// error), then, once it is written, [`FilesReply::Tar`] (or an error).
    Export {
        team: String,
        name: String,
        path: String,
    },
    /// Freeze sandbox `sandbox` (the spawner's id) and copy `outputs` into
    /// `runs/<run_id>/` of the team's workspace.
    SaveOutputs {
        team: String,
        workspace: String,
        run_id: String,
        sandbox: String,
        outputs: Vec<String>,
        limits: OutputLimits,
    },
    /// Freeze sandbox `runtime_id` (the spawner's id) and copy its writable layer into a new
    /// layer of `owner` (a paused sandbox or a snapshot, `crate::saved_layers`), merged with
    /// the layer `below`.
    CaptureLayer {
        runtime_id: String,
        into: crate::saved_layers::Home,
        owner: String,
        below: Option<crate::saved_layers::LayerRef>,
    },
    /// Remove layer `layer` of `owner`, or all of them.
    DropLayers {
        home: crate::saved_layers::Home,
        owner: String,
        layer: Option<String>,
    },
    /// Remove every saved layer in `home` but these (owner, layer) pairs.
    PruneLayers {
        home: crate::saved_layers::Home,
        keep: Vec<(String, String)>,
    },
}

/// The files helper's answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FilesReply {
    Unit,
    Usage(Option<QuotaUsage>),
    QuotaError(Option<WireWorkspaceError>),
    Info(WorkspaceInfo),
    Infos(Vec<WorkspaceInfo>),
    Names(Vec<String>),
    Dir(PathBuf),
    Listing(Listing),
    Entry(Entry),
    /// The file, open for reading, comes with this reply.
    File,
    Written(WriteReport),
    Tar(TarReport),
    /// The export was found; the tar follows through the pipe.
    Exporting,
    /// The report as JSON ([`OutputsReport`] leaves empty fields out, which postcard cannot
    /// read back).
    Outputs(String),
    NotSaved(SaveError),
    Captured(crate::saved_layers::Captured),
    Pruned(u64),
    /// A layer could not be saved or removed: the message, and whether the sandbox was the
    /// cause (gone, or without a layer of its own) rather than the host.
    LayerFailed {
        message: String,
        sandbox: bool,
    },
    Workspace(WireWorkspaceError),
    Failed(Failure),
}

/// What the helper says when it is ready: what the server reports of the workspaces.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ready {
    quota: QuotaState,
    notices: Vec<String>,
}

/// A [`WorkspaceError`] as it crosses the channel: every field kept, an I/O error as its
/// OS error number (or message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireWorkspaceError {
    NotFound(String),
    AlreadyExists(String),
    InvalidName(String),
    InvalidTeam(String),
    InvalidPath {
        place: String,
        path: String,
        reason: String,
    },
    PathNotFound {
        place: String,
        path: String,
    },
    NotAFile {
        place: String,
        path: String,
        kind: String,
    },
    NotADirectory {
        place: String,
        path: String,
        kind: String,
    },
    Conflict {
        place: String,
        reason: String,
    },
    TooLarge {
        place: String,
        limit: u64,
    },
    TooManyEntries {
        place: String,
        limit: u64,
    },
    TooDeep {
        place: String,
        path: String,
        max: u64,
    },
    BadArchive {
        place: String,
        entry: String,
        reason: String,
    },
    QuotaExceeded {
        team: String,
        quota: u64,
    },
    TeamUnavailable {
        team: String,
        reason: String,
    },
    Io {
        place: String,
        op: String,
        path: String,
        errno: Option<i32>,
        message: String,
    },
    /// An error of the helper itself (an error the server made of a broken pipe, say).
    Helper(Failure),
}

/// The kinds of entry errors name (`super::kind_name` and the literals of the tree code).
fn static_kind(kind: &str) -> &'static str {
    const KINDS: [&str; 7] = [
        "regular file",
        "directory",
        "symlink",
        "fifo",
        "socket",
        "device",
        "file",
    ];
    KINDS
        .into_iter()
        .find(|k| *k == kind)
        .unwrap_or("special file")
}

impl From<&WorkspaceError> for WireWorkspaceError {
    fn from(e: &WorkspaceError) -> WireWorkspaceError {
        use WireWorkspaceError as W;
        use WorkspaceError as E;
        match e {
            E::NotFound(n) => W::NotFound(n.clone()),
            E::AlreadyExists(n) => W::AlreadyExists(n.clone()),
            E::InvalidName(n) => W::InvalidName(n.clone()),
            E::InvalidTeam(n) => W::InvalidTeam(n.clone()),
            E::InvalidPath {
                place,
                path,
                reason,
            } => W::InvalidPath {
                place: place.clone(),
                path: path.clone(),
                reason: reason.clone(),
            },
            E::PathNotFound { place, path } => W::PathNotFound {
                place: place.clone(),
                path: path.clone(),
            },
            E::NotAFile { place, path, kind } => W::NotAFile {
                place: place.clone(),
                path: path.clone(),
                kind: (*kind).into(),
            },
            E::NotADirectory { place, path, kind } => W::NotADirectory {
                place: place.clone(),
                path: path.clone(),
                kind: (*kind).into(),
            },
            E::Conflict { place, reason } => W::Conflict {
                place: place.clone(),
                reason: reason.clone(),
            },
            E::TooLarge { place, limit } => W::TooLarge {
                place: place.clone(),
                limit: *limit,
            },
            E::TooManyEntries { place, limit } => W::TooManyEntries {
                place: place.clone(),
                limit: *limit,
            },
            E::TooDeep { place, path, max } => W::TooDeep {
                place: place.clone(),
                path: path.clone(),
                max: *max as u64,
            },
            E::BadArchive {
                place,
                entry,
                reason,
            } => W::BadArchive {
                place: place.clone(),
                entry: entry.clone(),
                reason: reason.clone(),
            },
            E::QuotaExceeded { team, quota } => W::QuotaExceeded {
                team: team.clone(),
                quota: *quota,
            },
            E::TeamUnavailable { team, reason } => W::TeamUnavailable {
                team: team.clone(),
                reason: reason.clone(),
            },
            E::Io {
                place,
                op,
                path,
                source,
            } => W::Io {
                place: place.clone(),
                op: op.to_string(),
                path: path.clone(),
                errno: source.raw_os_error(),
                message: source.to_string(),
            },
            E::Helper(h) => W::Helper(match h {
                HelperError::Failed(f) => f.clone(),
                other => Failure::new(other.kind(), other.to_string()),
            }),
        }
    }
}

impl From<WireWorkspaceError> for WorkspaceError {
    fn from(w: WireWorkspaceError) -> WorkspaceError {
        use WireWorkspaceError as W;
        use WorkspaceError as E;
        match w {
            W::NotFound(n) => E::NotFound(n),
            W::AlreadyExists(n) => E::AlreadyExists(n),
            W::InvalidName(n) => E::InvalidName(n),
            W::InvalidTeam(n) => E::InvalidTeam(n),
            W::InvalidPath {
                place,
                path,
                reason,
            } => E::InvalidPath {
                place,
                path,
                reason,
            },
            W::PathNotFound { place, path } => E::PathNotFound { place, path },
            W::NotAFile { place, path, kind } => E::NotAFile {
                place,
                path,
                kind: static_kind(&kind),
            },
            W::NotADirectory { place, path, kind } => E::NotADirectory {
                place,
                path,
                kind: static_kind(&kind),
            },
            W::Conflict { place, reason } => E::Conflict { place, reason },
            W::TooLarge { place, limit } => E::TooLarge { place, limit },
            W::TooManyEntries { place, limit } => E::TooManyEntries { place, limit },
            W::TooDeep { place, path, max } => E::TooDeep {
                place,
                path,
                max: usize::try_from(max).unwrap_or(usize::MAX),
            },
            W::BadArchive {
                place,
                entry,
                reason,
            } => E::BadArchive {
                place,
                entry,
                reason,
            },
            W::QuotaExceeded { team, quota } => E::QuotaExceeded { team, quota },
            W::TeamUnavailable { team, reason } => E::TeamUnavailable { team, reason },
            W::Io {
                place,
                op,
                path,
                errno,
                message,
            } => E::Io {
                place,
                op: op.into(),
                path,
                source: match errno {
                    Some(n) => io::Error::from_raw_os_error(n),
                    None => io::Error::other(message),
                },
            },
            W::Helper(f) => E::Helper(HelperError::Failed(f)),
        }
    }
}

fn unexpected(reply: &FilesReply) -> WorkspaceError {
    WorkspaceError::Helper(HelperError::Protocol {
        helper: "files",
        message: format!("unexpected answer {reply:?}"),
    })
}

/// The server's side of the files helper: the same operations as [`LocalWorkspaces`], each
/// one call (blocking).
#[derive(Debug)]
pub struct RemoteWorkspaces {
    /// For the operations of the workspace API and runs' saves: each holds one for its whole
    /// transfer.
    channels: Arc<Channels>,
    /// For [`Self::dir`] and [`Self::quota_error`].
    quick: Channels,
    pid: husk_runtime::libc::pid_t,
    quota: QuotaState,
    notices: Vec<String>,
    /// The server's per-upload bounds (sent with each upload).
    upload: Mutex<ImportLimits>,
}

impl RemoteWorkspaces {
    /// Forks the files helper with channels for `transfers` operations at once (at most
    /// [`MAX_CHANNELS`]; more wait for one); it runs `setup` (opening the workspaces: mounts,
    /// trash) and then serves. `roots` are the spawners' root channels, for runs' outputs. The
    /// process must be single-threaded.
    pub fn start(
        transfers: usize,
        roots: Option<RootChannel>,
        setup: impl FnOnce() -> Result<LocalWorkspaces, String>,
    ) -> Result<RemoteWorkspaces, Failure> {
        let keep: Vec<_> = roots.iter().flat_map(RootChannel::raw_fds).collect();
        let forked = rt::fork(
            "husk-files",
            transfers.clamp(1, MAX_CHANNELS) + QUICK_CHANNELS,
            &keep,
            |channels| {
                let ws = match setup() {
                    Ok(ws) => ws,
                    Err(e) => {
                        let _ =
                            rt::ready::<Ready>(&channels, &Err(Failure::new(FailureKind::Host, e)));
                        return 1;
                    }
                };
                let ready = Ready {
                    quota: ws.quota_state().clone(),
                    notices: ws.notices().to_vec(),
                };
                if rt::ready(&channels, &Ok(ready)).is_err() {
                    return 1;
                }
                let served = Served {
                    state_dir: ws.dir.parent().map(Path::to_path_buf),
                    ws,
                    roots,
                };
                serve(channels, &served);
                0
            },
        )?;
        let ready = rt::await_ready::<Ready>("files", &forked)?;
        let mut channels = forked.channels;
        let quick = channels.split_off(channels.len() - QUICK_CHANNELS);
        Ok(RemoteWorkspaces {
            channels: Arc::new(Channels::new("files", channels)),
            quick: Channels::new("files", quick),
            pid: forked.pid,
            quota: ready.quota,
            notices: ready.notices,
            upload: Mutex::new(ImportLimits::default()),
        })
    }

    pub fn pid(&self) -> husk_runtime::libc::pid_t {
        self.pid
    }

    fn layer_call(&self, req: FilesRequest) -> Result<FilesReply, crate::saved_layers::LayerError> {
        use crate::saved_layers::LayerError;
        match self.channels.call::<_, FilesReply>(&req, None) {
            Ok((FilesReply::LayerFailed { message, sandbox }, _)) => Err(if sandbox {
                LayerError::Sandbox(message)
            } else {
                LayerError::Host(message)
            }),
            Ok((other, _)) => Ok(other),
            Err(e) => Err(LayerError::Host(format!("the files helper: {e}"))),
        }
    }

    /// Closes the channels: the helper ends once the calls in progress are done.
    pub fn shutdown(&self) {
        self.channels.close();
        self.quick.close();
    }

    pub(super) fn set_upload_limits(&self, limits: ImportLimits) {
        *self.upload.lock().unwrap_or_else(|p| p.into_inner()) = limits;
    }

    pub fn upload_limits(&self) -> ImportLimits {
        *self.upload.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn quota_state(&self) -> &QuotaState {
        &self.quota
    }

    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    fn call(&self, req: FilesRequest) -> Result<(FilesReply, Option<OwnedFd>), WorkspaceError> {
        let pool = match req {
            FilesRequest::Dir { .. } | FilesRequest::QuotaError { .. } => &self.quick,
            _ => &*self.channels,
        };
        let (reply, fd) = pool.call(&req, None)?;
        match reply {
            FilesReply::Workspace(e) => Err(e.into()),
            FilesReply::Failed(f) => Err(WorkspaceError::Helper(HelperError::Failed(f))),
            other => Ok((other, fd)),
        }
    }

    pub fn usage(&self, team: &str) -> Result<Option<QuotaUsage>, WorkspaceError> {
        match self.call(FilesRequest::Usage { team: team.into() })?.0 {
            FilesReply::Usage(u) => Ok(u),
            other => Err(unexpected(&other)),
        }
    }

    pub fn quota_error(&self, team: &str) -> Option<WorkspaceError> {
        match self.call(FilesRequest::QuotaError { team: team.into() }) {
            Ok((FilesReply::QuotaError(e), _)) => e.map(Into::into),
            _ => None,
        }
    }

    pub fn create(&self, team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError> {
        let req = FilesRequest::Create {
            team: team.into(),
            name: name.into(),
        };
        match self.call(req)?.0 {
            FilesReply::Info(i) => Ok(i),
            other => Err(unexpected(&other)),
        }
    }

    pub fn list(&self, team: &str) -> Result<Vec<WorkspaceInfo>, WorkspaceError> {
        match self.call(FilesRequest::List { team: team.into() })?.0 {
            FilesReply::Infos(i) => Ok(i),
            other => Err(unexpected(&other)),
        }
    }

    pub fn names(&self, team: &str) -> Result<Vec<String>, WorkspaceError> {
        match self.call(FilesRequest::Names { team: team.into() })?.0 {
            FilesReply::Names(n) => Ok(n),
            other => Err(unexpected(&other)),
        }
    }

    pub fn info(&self, team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError> {
        let req = FilesRequest::Info {
            team: team.into(),
            name: name.into(),
        };
        match self.call(req)?.0 {
            FilesReply::Info(i) => Ok(i),
            other => Err(unexpected(&other)),
        }
    }

    pub fn delete(&self, team: &str, name: &str) -> Result<(), WorkspaceError> {
        let req = FilesRequest::Delete {
            team: team.into(),
            name: name.into(),
        };
        match self.call(req)?.0 {
            FilesReply::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub fn dir(&self, team: &str, name: &str) -> Result<PathBuf, WorkspaceError> {
        let req = FilesRequest::Dir {
            team: team.into(),
            name: name.into(),
        };
        match self.call(req)?.0 {
            FilesReply::Dir(d) => Ok(d),
            other => Err(unexpected(&other)),
        }
    }

    pub fn entries(
        &self,
        team: &str,
        name: &str,
        path: &str,
        depth: usize,
    ) -> Result<Listing, WorkspaceError> {
        let req = FilesRequest::Entries {
            team: team.into(),
            name: name.into(),
            path: path.into(),
            depth: depth as u64,
        };
        match self.call(req)?.0 {
            FilesReply::Listing(l) => Ok(l),
            other => Err(unexpected(&other)),
        }
    }

    pub fn stat(&self, team: &str, name: &str, path: &str) -> Result<Entry, WorkspaceError> {
        let req = FilesRequest::Stat {
            team: team.into(),
            name: name.into(),
            path: path.into(),
        };
        match self.call(req)?.0 {
            FilesReply::Entry(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    pub fn read_file(&self, team: &str, name: &str, path: &str) -> Result<File, WorkspaceError> {
        let req = FilesRequest::ReadFile {
            team: team.into(),
            name: name.into(),
            path: path.into(),
        };
        match self.call(req)? {
            (FilesReply::File, Some(fd)) => Ok(File::from(fd)),
            (other, _) => Err(unexpected(&other)),
        }
    }

    pub fn remove(&self, team: &str, name: &str, path: &str) -> Result<(), WorkspaceError> {
        let req = FilesRequest::Remove {
            team: team.into(),
            name: name.into(),
            path: path.into(),
        };
        match self.call(req)?.0 {
            FilesReply::Unit => Ok(()),
            other => Err(unexpected(&other)),
        }
    }

    pub fn make_dir(
        &self,
        team: &str,
        name: &str,
        path: &str,
        parents: bool,
        attrs: &Attrs,
    ) -> Result<Entry, WorkspaceError> {
        let req = FilesRequest::MakeDir {
            team: team.into(),
            name: name.into(),
            path: path.into(),
            parents,
            attrs: *attrs,
        };
        match self.call(req)?.0 {
            FilesReply::Entry(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    pub fn set_attrs(
        &self,
        team: &str,
        name: &str,
        path: &str,
        attrs: &Attrs,
    ) -> Result<Entry, WorkspaceError> {
        let req = FilesRequest::SetAttrs {
            team: team.into(),
            name: name.into(),
            path: path.into(),
            attrs: *attrs,
        };
        match self.call(req)?.0 {
            FilesReply::Entry(e) => Ok(e),
            other => Err(unexpected(&other)),
        }
    }

    pub fn write_file_with(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        max_bytes: u64,
        options: &WriteOptions,
    ) -> Result<WriteReport, WorkspaceError> {
        let req = FilesRequest::WriteFile {
            team: team.into(),
            name: name.into(),
            path: path.into(),
            max_bytes,
            options: *options,
        };
        match self.upload(&req, reader)? {
            FilesReply::Written(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    pub fn import_tar(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        limits: ImportLimits,
    ) -> Result<TarReport, WorkspaceError> {
        let req = FilesRequest::ImportTar {
            team: team.into(),
            name: name.into(),
            path: path.into(),
            limits,
        };
        match self.upload(&req, reader)? {
            FilesReply::Tar(r) => Ok(r),
            other => Err(unexpected(&other)),
        }
    }

    /// Sends `req` with a pipe, writes what `reader` gives into it as chunks, and returns the
    /// reply. The helper stops reading when it has had enough (an error, a limit): the pipe
    /// breaks, and its answer says why. A `reader` that fails leaves the stream without its
    /// end: the helper throws the upload away, and the reader's error is the answer.
    fn upload(&self, req: &FilesRequest, reader: impl Read) -> Result<FilesReply, WorkspaceError> {
        let (theirs, ours) = rt::stream_pipe().map_err(|e| pipe_error("pipe", e))?;
        let mut lent = self.channels.lend()?;
        lent.send(req, Some(theirs.as_fd()))?;
        drop(theirs);
        match rt::send_stream(reader, ours) {
            rt::Sent::ReaderFailed(e) => {
                // The helper answers the cut stream; the reader's error is what happened.
                let _ = lent.recv::<FilesReply>();
                Err(pipe_error("read the upload for", e))
            }
            rt::Sent::Whole | rt::Sent::Refused => match lent.recv::<FilesReply>()?.0 {
                FilesReply::Workspace(e) => Err(e.into()),
                FilesReply::Failed(f) => Err(WorkspaceError::Helper(HelperError::Failed(f))),
                other => Ok(other),
            },
        }
    }

    pub fn exporter(
        &self,
        team: &str,
        name: &str,
        path: &str,
    ) -> Result<RemoteExport, WorkspaceError> {
        let req = FilesRequest::Export {
            team: team.into(),
            name: name.into(),
            path: path.into(),
        };
        let (ours, theirs) = rt::stream_pipe().map_err(|e| pipe_error("pipe", e))?;
        let mut lent = self.channels.clone().lend_owned()?;
        lent.send(&req, Some(theirs.as_fd()))?;
        drop(theirs);
        match lent.recv_more::<FilesReply>()?.0 {
            FilesReply::Exporting => Ok(RemoteExport {
                tar: File::from(ours),
                lent,
            }),
            other => {
                lent.settled();
                match other {
                    FilesReply::Workspace(e) => Err(e.into()),
                    FilesReply::Failed(f) => Err(WorkspaceError::Helper(HelperError::Failed(f))),
                    other => Err(unexpected(&other)),
                }
            }
        }
    }

    pub fn save_outputs(
        &self,
        team: &str,
        workspace: &str,
        run_id: &str,
        sandbox: &str,
        outputs: &[String],
        limits: &OutputLimits,
    ) -> Result<OutputsReport, SaveError> {
        let req = FilesRequest::SaveOutputs {
            team: team.into(),
            workspace: workspace.into(),
            run_id: run_id.into(),
            sandbox: sandbox.into(),
            outputs: outputs.to_vec(),
            limits: *limits,
        };
        match self.channels.call::<_, FilesReply>(&req, None) {
            Ok((FilesReply::Outputs(r), _)) => serde_json::from_str(&r)
                .map_err(|e| SaveError::Other(format!("the files helper's report: {e}"))),
            Ok((FilesReply::NotSaved(e), _)) => Err(e),
            Ok((FilesReply::Workspace(e), _)) => {
                Err(SaveError::Other(WorkspaceError::from(e).to_string()))
            }
            Ok((other, _)) => Err(SaveError::Other(unexpected(&other).to_string())),
            Err(e) => Err(SaveError::Other(e.to_string())),
        }
    }
}

fn pipe_error(op: &'static str, source: io::Error) -> WorkspaceError {
    WorkspaceError::Io {
        place: "the files helper's channel".into(),
        op: op.into(),
        path: String::new(),
        source,
    }
}

/// An export the files helper is writing: its tar, read from a pipe, then its report.
pub struct RemoteExport {
    // Dropped first: a caller that gives up closes the pipe, the helper's writes fail, and it
    // answers; the channel reads that answer when it goes back.
    tar: File,
    lent: rt::Lent<Arc<Channels>>,
}

impl RemoteExport {
    /// Copies the tar to `writer`, then takes the helper's report (or the error that cut the
    /// export short: a tar that ended early is never taken for a whole one).
    pub fn write_to(self, mut writer: impl Write) -> Result<TarReport, WorkspaceError> {
        let RemoteExport { mut tar, mut lent } = self;
        let copied = io::copy(&mut tar, &mut writer);
        drop(tar);
        let reply = lent.recv::<FilesReply>()?.0;
        let report = match reply {
            FilesReply::Tar(r) => r,
            FilesReply::Workspace(e) => return Err(e.into()),
            FilesReply::Failed(f) => return Err(WorkspaceError::Helper(HelperError::Failed(f))),
            other => return Err(unexpected(&other)),
        };
        copied.map_err(|e| WorkspaceError::Io {
            place: "the export".into(),
            op: "write the archive of".into(),
            path: String::new(),
            source: e,
        })?;
        writer.flush().map_err(|e| WorkspaceError::Io {
            place: "the export".into(),
            op: "write the archive of".into(),
            path: String::new(),
            source: e,
        })?;
        Ok(report)
    }
}

impl crate::saved_layers::SavedLayers for RemoteWorkspaces {
    fn capture(
        &self,
        runtime_id: &str,
        into: crate::saved_layers::Home,
        owner: &str,
        below: Option<&crate::saved_layers::LayerRef>,
    ) -> Result<crate::saved_layers::Captured, crate::saved_layers::LayerError> {
        let req = FilesRequest::CaptureLayer {
            runtime_id: runtime_id.into(),
            into,
            owner: owner.into(),
            below: below.cloned(),
        };
        match self.layer_call(req)? {
            FilesReply::Captured(c) => Ok(c),
            other => Err(crate::saved_layers::LayerError::Host(
                unexpected(&other).to_string(),
            )),
        }
    }

    fn drop_layers(
        &self,
        home: crate::saved_layers::Home,
        owner: &str,
        layer: Option<&str>,
    ) -> Result<(), crate::saved_layers::LayerError> {
        let req = FilesRequest::DropLayers {
            home,
            owner: owner.into(),
            layer: layer.map(str::to_owned),
        };
        match self.layer_call(req)? {
            FilesReply::Unit => Ok(()),
            other => Err(crate::saved_layers::LayerError::Host(
                unexpected(&other).to_string(),
            )),
        }
    }

    fn prune(
        &self,
        home: crate::saved_layers::Home,
        keep: &[(String, String)],
    ) -> Result<u64, crate::saved_layers::LayerError> {
        match self.layer_call(FilesRequest::PruneLayers {
            home,
            keep: keep.to_vec(),
        })? {
            FilesReply::Pruned(n) => Ok(n),
            other => Err(crate::saved_layers::LayerError::Host(
                unexpected(&other).to_string(),
            )),
        }
    }
}

/// What the helper serves from.
struct Served {
    ws: LocalWorkspaces,
    roots: Option<RootChannel>,
    /// The state directory (paused sandboxes' layers live below it).
    state_dir: Option<PathBuf>,
}

/// Serves every channel on a thread of its own until the server closes them all.
fn serve(channels: Vec<OwnedFd>, served: &Served) {
    rt::serve_channels(
        channels,
        "husk-files",
        |req, fd, sock| answer(served, req, fd, sock),
        bad_request,
    );
}

/// One request of a channel, its reply bounded to a frame.
fn answer(
    served: &Served,
    req: FilesRequest,
    fd: Option<OwnedFd>,
    sock: BorrowedFd<'_>,
) -> (FilesReply, Option<OwnedFd>) {
    let (reply, fd) = match req {
        FilesRequest::CaptureLayer { .. }
        | FilesRequest::DropLayers { .. }
        | FilesRequest::PruneLayers { .. } => (layers(served, req), None),
        req => handle(&served.ws, served.roots.as_ref(), req, fd, sock),
    };
    (bounded(reply), fd)
}

/// Saving and removing paused sandboxes' layers.
fn layers(served: &Served, req: FilesRequest) -> FilesReply {
    layers_in(served.state_dir.as_deref(), served.roots.as_ref(), req)
}

/// [`layers`], below `state_dir` (a capture also needs the spawner's root channel).
fn layers_in(
    state_dir: Option<&Path>,
    roots: Option<&RootChannel>,
    req: FilesRequest,
) -> FilesReply {
    use crate::saved_layers::{host, LayerError};
    let Some(state_dir) = state_dir else {
        return FilesReply::LayerFailed {
            message: LayerError::Unavailable.to_string(),
            sandbox: false,
        };
    };
    let done = match req {
        FilesRequest::CaptureLayer {
            runtime_id,
            into,
            owner,
            below,
        } => match roots {
            Some(roots) => {
                host::capture(state_dir, roots, &runtime_id, into, &owner, below.as_ref())
                    .map(FilesReply::Captured)
            }
            None => Err(LayerError::Unavailable),
        },
        FilesRequest::DropLayers { home, owner, layer } => {
            host::drop_layers(state_dir, home, &owner, layer.as_deref()).map(|()| FilesReply::Unit)
        }
        FilesRequest::PruneLayers { home, keep } => {
            host::prune(state_dir, home, &keep).map(FilesReply::Pruned)
        }
        _ => Err(LayerError::Unavailable),
    };
    done.unwrap_or_else(|e| FilesReply::LayerFailed {
        sandbox: matches!(e, LayerError::Sandbox(_)),
        message: e.to_string(),
    })
}

fn bad_request(m: String) -> FilesReply {
    FilesReply::Failed(Failure::new(
        FailureKind::InvalidSpec,
        format!("bad request: {m}"),
    ))
}

/// A reply that would not fit a frame becomes an error that does.
fn bounded(reply: FilesReply) -> FilesReply {
    match postcard::to_stdvec(&reply) {
        Ok(b) if b.len() <= rt::MAX_MESSAGE => reply,
        _ => FilesReply::Failed(Failure::new(
            FailureKind::Internal,
            "the answer is larger than the files helper's channel carries",
        )),
    }
}

/// One request, against the helper's workspaces. `sock` is the channel it came on: an export
/// says on it that it starts before it writes. The reply comes with a descriptor for
/// [`FilesRequest::ReadFile`].
fn handle(
    ws: &LocalWorkspaces,
    roots: Option<&RootChannel>,
    req: FilesRequest,
    fd: Option<OwnedFd>,
    sock: BorrowedFd<'_>,
) -> (FilesReply, Option<OwnedFd>) {
    use FilesReply as R;
    use FilesRequest as Q;
    let needs_pipe = matches!(
        req,
        Q::WriteFile { .. } | Q::ImportTar { .. } | Q::Export { .. }
    );
    if needs_pipe != fd.is_some() {
        let f = Failure::new(
            FailureKind::InvalidSpec,
            if needs_pipe {
                "a stream request without its pipe"
            } else {
                "a descriptor with a request that takes none"
            },
        );
        return (R::Failed(f), None);
    }
    let wire = |e: WorkspaceError| R::Workspace((&e).into());
    let reply = |r: Result<R, WorkspaceError>| (r.unwrap_or_else(wire), None);
    match req {
        Q::Usage { team } => reply(ws.usage(&team).map(R::Usage)),
        Q::QuotaError { team } => (
            R::QuotaError(ws.quota_error(&team).as_ref().map(Into::into)),
            None,
        ),
        Q::Create { team, name } => reply(ws.create(&team, &name).map(R::Info)),
        Q::List { team } => reply(ws.list(&team).map(R::Infos)),
        Q::Names { team } => reply(ws.names(&team).map(R::Names)),
        Q::Info { team, name } => reply(ws.info(&team, &name).map(R::Info)),
        Q::Delete { team, name } => reply(ws.delete(&team, &name).map(|()| R::Unit)),
        Q::Dir { team, name } => reply(ws.dir(&team, &name).map(R::Dir)),
        Q::Entries {
            team,
            name,
            path,
            depth,
        } => reply(
            ws.entries(
                &team,
                &name,
                &path,
                usize::try_from(depth).unwrap_or(usize::MAX),
            )
            .map(R::Listing),
        ),
        Q::Stat { team, name, path } => reply(ws.stat(&team, &name, &path).map(R::Entry)),
        Q::ReadFile { team, name, path } => match ws.read_file(&team, &name, &path) {
            Ok(file) => (R::File, Some(OwnedFd::from(file))),
            Err(e) => (wire(e), None),
        },
        Q::Remove { team, name, path } => reply(ws.remove(&team, &name, &path).map(|()| R::Unit)),
        Q::WriteFile {
            team,
            name,
            path,
            max_bytes,
            options,
        } => {
            let pipe = rt::chunk_reader(fd.expect("checked above"));
            reply(
                ws.write_file_with(&team, &name, &path, pipe, max_bytes, &options)
                    .map(R::Written),
            )
        }
        Q::MakeDir {
            team,
            name,
            path,
            parents,
            attrs,
        } => reply(
            ws.make_dir(&team, &name, &path, parents, &attrs)
                .map(R::Entry),
        ),
        Q::SetAttrs {
            team,
            name,
            path,
            attrs,
        } => reply(ws.set_attrs(&team, &name, &path, &attrs).map(R::Entry)),
        Q::ImportTar {
            team,
            name,
            path,
            limits,
        } => {
            let pipe = rt::chunk_reader(fd.expect("checked above"));
            reply(ws.import_tar(&team, &name, &path, pipe, limits).map(R::Tar))
        }
        Q::Export { team, name, path } => {
            let out = File::from(fd.expect("checked above"));
            let exporter = match ws.exporter(&team, &name, &path) {
                Ok(e) => e,
                Err(e) => return (wire(e), None),
            };
            if rt::send(sock, &R::Exporting, None).is_err() {
                // The server is gone; the answer below goes nowhere either.
                return (
                    R::Failed(Failure::new(FailureKind::Internal, "channel closed")),
                    None,
                );
            }
            reply(exporter.write_to(out).map(R::Tar))
        }
        Q::SaveOutputs {
            team,
            workspace,
            run_id,
            sandbox,
            outputs,
            limits,
        } => (
            save(
                ws, roots, &team, &workspace, &run_id, &sandbox, &outputs, &limits,
            ),
            None,
        ),
        // Answered by `layers` (they need the state directory, not the workspaces).
        Q::CaptureLayer { .. } | Q::DropLayers { .. } | Q::PruneLayers { .. } => (
            R::Failed(Failure::new(
                FailureKind::Internal,
                "layer requests are not workspace requests",
            )),
            None,
        ),
    }
}

/// A run's outputs: the workspace is the team's (its directory found here, by team and name),
/// the sandbox's root comes from the spawner by id.
#[allow(clippy::too_many_arguments)]
fn save(
    ws: &LocalWorkspaces,
    roots: Option<&RootChannel>,
    team: &str,
    workspace: &str,
    run_id: &str,
    sandbox: &str,
    outputs: &[String],
    limits: &OutputLimits,
) -> FilesReply {
    let Some(roots) = roots else {
        return FilesReply::NotSaved(SaveError::Other(
            "copying outputs out of sandboxes is not available here".into(),
        ));
    };
    let dir = match ws.dir(team, workspace) {
        Ok(d) => d,
        Err(e) => return FilesReply::Workspace((&e).into()),
    };
    let root = match roots.frozen_root(sandbox) {
        Ok(r) => r,
        Err(e) => {
            return FilesReply::NotSaved(SaveError::Other(format!(
                "the sandbox's root: {}",
                crate::error_chain(&e)
            )))
        }
    };
    match outputs::save(root.as_fd(), workspace, &dir, run_id, outputs, limits) {
        Ok(r) => match serde_json::to_string(&r) {
            Ok(json) => FilesReply::Outputs(json),
            Err(e) => FilesReply::NotSaved(SaveError::Other(e.to_string())),
        },
        Err(e) => FilesReply::NotSaved(e),
    }
}

/// The helper's reading of one request frame, for husk's fuzz targets (`fuzz/`). Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Decodes `frame` as the helper does and handles it against `ws` (the fuzz target's own,
    /// in a scratch directory), with a pipe when the request takes one (its other end gets
    /// `stream`, or reads the export); returns the request encoded again, the reply, and the
    /// content of a file the reply opened.
    pub fn request(
        frame: &[u8],
        ws: &LocalWorkspaces,
        stream: &[u8],
    ) -> Option<(Vec<u8>, FilesReply, Option<Vec<u8>>)> {
        let req: FilesRequest = postcard::from_bytes(frame).ok()?;
        let encoded = postcard::to_stdvec(&req).expect("a decoded request encodes");
        // The channel, for the export's first frame (read by nobody: it fits the buffer).
        let (ours, _theirs) = husk_runtime::sys::stream_pair().ok()?;
        let (r, w) = husk_runtime::sys::pipe().ok()?;
        let (reply, fd) = match &req {
            FilesRequest::WriteFile { .. } | FilesRequest::ImportTar { .. } => {
                drop(r);
                let stream = stream.to_vec();
                let (r, w2) = husk_runtime::sys::pipe().ok()?;
                drop(w);
                let writer = std::thread::spawn(move || {
                    let _ = File::from(w2).write_all(&stream);
                });
                let out = handle(ws, None, req, Some(r), ours.as_fd());
                let _ = writer.join();
                out
            }
            FilesRequest::Export { .. } => {
                let reader = std::thread::spawn(move || {
                    let _ = io::copy(&mut File::from(r), &mut io::sink());
                });
                let out = handle(ws, None, req, Some(w), ours.as_fd());
                let _ = reader.join();
                out
            }
            // Layer requests against the scratch state directory (no spawner: a capture
            // answers that it cannot; a removal checks its names, then removes there).
            FilesRequest::CaptureLayer { .. }
            | FilesRequest::DropLayers { .. }
            | FilesRequest::PruneLayers { .. } => {
                drop((r, w));
                let state_dir = ws.dir.parent().map(Path::to_path_buf);
                (layers_in(state_dir.as_deref(), None, req.clone()), None)
            }
            _ => {
                drop((r, w));
                handle(ws, None, req, None, ours.as_fd())
            }
        };
        let content = fd.map(|fd| {
            let mut v = Vec::new();
            let _ = File::from(fd).take(1 << 20).read_to_end(&mut v);
            v
        });
        Some((encoded, bounded(reply), content))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::State;
    use super::super::{Export, Workspaces};
    use super::*;

    /// A files helper served on threads of this process (a test cannot fork) over the
    /// workspaces of a scratch state directory, and the server's side of it.
    struct Pair {
        ws: Workspaces,
        remote: Arc<RemoteWorkspaces>,
        threads: Vec<std::thread::JoinHandle<()>>,
        _state: State,
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            self.remote.shutdown();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
        }
    }

    fn pair(tag: &str, transfers: usize) -> Pair {
        let state = State::new(tag);
        let local = LocalWorkspaces::open(&state.0).unwrap();
        let served = Arc::new(Served {
            ws: local,
            roots: None,
            state_dir: Some(state.0.clone()),
        });
        let mut ours = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..transfers + QUICK_CHANNELS {
            let (a, b) = husk_runtime::sys::stream_pair().unwrap();
            ours.push(a);
            let served = served.clone();
            threads.push(std::thread::spawn(move || {
                rt::serve_channel(
                    b,
                    |req, fd, sock| answer(&served, req, fd, sock),
                    bad_request,
                )
            }));
        }
        let quick = ours.split_off(transfers);
        let remote = Arc::new(RemoteWorkspaces {
            channels: Arc::new(Channels::new("files", ours)),
            quick: Channels::new("files", quick),
            pid: 0,
            quota: QuotaState::Off,
            notices: Vec::new(),
            upload: Mutex::new(ImportLimits::default()),
        });
        Pair {
            ws: Workspaces::remote(remote.clone()),
            remote,
            threads,
            _state: state,
        }
    }

    fn read_all(mut f: File) -> Vec<u8> {
        let mut v = Vec::new();
        f.read_to_end(&mut v).unwrap();
        v
    }

    /// A reader that gives `n` bytes and then fails, as a client that broke off does.
    struct Breaks(usize);

    impl Read for Breaks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0 == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "client gone",
                ));
            }
            let n = buf.len().min(self.0);
            buf[..n].fill(b'x');
            self.0 -= n;
            Ok(n)
        }
    }

    #[test]
    fn workspaces_work_the_same_through_the_helper() {
        let p = pair("remote-ops", 2);
        let ws = &p.ws;
        let info = ws.create("acme", "data").unwrap();
        assert_eq!((info.name.as_str(), info.files), ("data", 0));
        assert_eq!(ws.names("acme").unwrap(), ["data"]);
        assert!(ws.names("other-team").unwrap().is_empty());
        // Errors keep their type (and their text) across.
        let e = ws.create("acme", "data").unwrap_err();
        assert!(matches!(e, WorkspaceError::AlreadyExists(_)), "{e}");
        let e = ws.create("acme", "../x").unwrap_err();
        assert!(matches!(e, WorkspaceError::InvalidName(_)), "{e}");
        let e = ws.info("other-team", "data").unwrap_err();
        assert!(matches!(e, WorkspaceError::NotFound(_)), "{e}");
        let e = ws.create("Not A Team", "data").unwrap_err();
        assert!(matches!(e, WorkspaceError::InvalidTeam(_)), "{e}");
        // A file in (larger than a chunk), out again, listed and stat'ed.
        let content: Vec<u8> = (0..(3 << 20) + 5).map(|i| (i % 251) as u8).collect();
        let r = ws
            .write_file("acme", "data", "dir/a.bin", &content[..], 1 << 30)
            .unwrap();
        assert_eq!((r.bytes, r.created), (content.len() as u64, true));
        assert_eq!(
            read_all(ws.read_file("acme", "data", "dir/a.bin").unwrap()),
            content
        );
        let entry = ws.stat("acme", "data", "dir/a.bin").unwrap();
        assert_eq!(
            (entry.kind, entry.size),
            (EntryKindFile, content.len() as u64)
        );
        let listing = ws.entries("acme", "data", "", 2).unwrap();
        let names: Vec<&str> = listing.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(names, ["dir", "dir/a.bin"]);
        // The volume API's operations: owners, modes, no replacing, `mkdir -p`.
        let attrs = Attrs {
            uid: Some(1001),
            gid: Some(1002),
            mode: Some(0o700),
        };
        let made = ws.make_dir("acme", "data", "m/n", true, &attrs).unwrap();
        assert_eq!(
            (made.path.as_str(), made.uid, made.gid, made.mode),
            ("m/n", 1001, 1002, 0o700)
        );
        let e = ws
            .make_dir("acme", "data", "m/n", false, &attrs)
            .unwrap_err();
        assert!(matches!(e, WorkspaceError::Conflict { .. }), "{e}");
        let keep = WriteOptions {
            replace: false,
            attrs,
        };
        let e = ws
            .write_file_with("acme", "data", "dir/a.bin", &b"x"[..], 10, &keep)
            .unwrap_err();
        assert!(matches!(e, WorkspaceError::Conflict { .. }), "{e}");
        let changed = ws
            .set_attrs(
                "acme",
                "data",
                "dir/a.bin",
                &Attrs {
                    mode: Some(0o640),
                    ..Attrs::default()
                },
            )
            .unwrap();
        assert_eq!((changed.mode, changed.uid), (0o640, 1000));
        let e = ws
            .set_attrs(
                "acme",
                "data",
                "dir/a.bin",
                &Attrs {
                    mode: Some(0o6755),
                    ..Attrs::default()
                },
            )
            .unwrap_err();
        assert!(matches!(e, WorkspaceError::InvalidPath { .. }), "{e}");
        ws.remove("acme", "data", "m").unwrap();
        let e = ws.read_file("acme", "data", "dir").unwrap_err();
        assert!(
            matches!(
                e,
                WorkspaceError::NotAFile {
                    kind: "directory",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = ws.stat("acme", "data", "../../etc/passwd").unwrap_err();
        assert!(matches!(e, WorkspaceError::InvalidPath { .. }), "{e}");
        // Over the upload's bound: refused, nothing left behind.
        let e = ws
            .write_file("acme", "data", "big", &content[..], 1000)
            .unwrap_err();
        assert!(
            matches!(e, WorkspaceError::TooLarge { limit: 1000, .. }),
            "{e}"
        );
        let e = ws.stat("acme", "data", "big").unwrap_err();
        assert!(matches!(e, WorkspaceError::PathNotFound { .. }), "{e}");
        // A tar out, and in again elsewhere.
        let mut tar = Vec::new();
        let report = ws.export_tar("acme", "data", "dir", &mut tar).unwrap();
        assert_eq!((report.files, report.bytes), (1, content.len() as u64));
        let e = ws.exporter("acme", "data", "nowhere").err().unwrap();
        assert!(matches!(e, WorkspaceError::PathNotFound { .. }), "{e}");
        let report = ws
            .import_tar("acme", "data", "copy", &tar[..], ImportLimits::default())
            .unwrap();
        assert_eq!(report.files, 1);
        assert_eq!(
            read_all(ws.read_file("acme", "data", "copy/a.bin").unwrap()),
            content
        );
        let e = ws
            .import_tar(
                "acme",
                "data",
                "bad",
                &b"not a tar at all"[..],
                ImportLimits::default(),
            )
            .unwrap_err();
        assert!(matches!(e, WorkspaceError::BadArchive { .. }), "{e}");
        // The directory that gets mounted, and the team's usage.
        let dir = ws.dir("acme", "data").unwrap();
        assert!(dir.ends_with("workspaces/acme/data"), "{}", dir.display());
        assert_eq!(ws.usage("acme").unwrap(), None);
        assert!(ws.quota_error("acme").is_none());
        let listed = ws.list("acme").unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].files, 2);
        ws.remove("acme", "data", "copy").unwrap();
        ws.delete("acme", "data").unwrap();
        assert!(ws.list("acme").unwrap().is_empty());
    }

    use super::super::EntryKind::File as EntryKindFile;

    #[test]
    fn a_broken_upload_or_an_abandoned_export_leaves_nothing_and_no_channel_lost() {
        // One channel for transfers: a call that left it out of step would break the next.
        let p = pair("remote-broken", 1);
        let ws = &p.ws;
        ws.create("acme", "data").unwrap();
        for round in 0..3 {
            // The client goes away after 300 KiB: the reader's error is the answer, and the
            // helper kept nothing of it (no file, no temporary file).
            let e = ws
                .write_file("acme", "data", "up.bin", Breaks(300 << 10), 1 << 30)
                .unwrap_err();
            assert!(e.to_string().contains("client gone"), "round {round}: {e}");
            let listing = ws.entries("acme", "data", "", 1).unwrap();
            assert!(listing.entries.is_empty(), "round {round}: {listing:?}");
            let e = ws
                .import_tar("acme", "data", "", Breaks(4096), ImportLimits::default())
                .unwrap_err();
            assert!(matches!(e, WorkspaceError::Io { .. }), "round {round}: {e}");
        }
        // An export given up after its first bytes: the channel reads the helper's answer
        // when it goes back, and the next call finds it in step.
        let big: Vec<u8> = vec![7; 8 << 20];
        ws.write_file("acme", "data", "big", &big[..], 1 << 30)
            .unwrap();
        for _ in 0..3 {
            let export = ws.exporter("acme", "data", "").unwrap();
            let Export::Remote(mut export) = export else {
                panic!("not through the helper");
            };
            let mut first = [0u8; 4096];
            export.tar.read_exact(&mut first).unwrap();
            drop(export);
            assert_eq!(
                ws.stat("acme", "data", "big").unwrap().size,
                big.len() as u64
            );
        }
        let mut tar = Vec::new();
        assert_eq!(
            ws.export_tar("acme", "data", "", &mut tar).unwrap().files,
            1
        );
    }

    #[test]
    fn hostile_requests_are_refused_and_a_gone_helper_is_told() {
        let p = pair("remote-hostile", 1);
        p.ws.create("acme", "data").unwrap();
        let (r, w) = husk_runtime::sys::pipe().unwrap();
        // A descriptor with a request that takes none: refused, nothing done.
        let req = FilesRequest::Delete {
            team: "acme".into(),
            name: "data".into(),
        };
        let (reply, _) = p
            .remote
            .channels
            .call::<_, FilesReply>(&req, Some(r.as_fd()))
            .unwrap();
        assert!(matches!(reply, FilesReply::Failed(_)), "{reply:?}");
        assert_eq!(p.ws.list("acme").unwrap().len(), 1);
        // A stream request without its pipe.
        let req = FilesRequest::WriteFile {
            team: "acme".into(),
            name: "data".into(),
            path: "x".into(),
            max_bytes: 10,
            options: WriteOptions::default(),
        };
        let (reply, _) = p.remote.channels.call::<_, FilesReply>(&req, None).unwrap();
        assert!(matches!(reply, FilesReply::Failed(_)), "{reply:?}");
        drop((r, w));
        // Bytes that are no request: answered, and the channel goes on.
        let (reply, _) = p
            .remote
            .channels
            .call::<_, FilesReply>(&[0xffu8; 9], None)
            .unwrap();
        assert!(matches!(reply, FilesReply::Failed(_)), "{reply:?}");
        assert_eq!(p.ws.list("acme").unwrap().len(), 1);
        // Team names no team can have (found by the files_helper fuzz target: a NUL byte
        // panicked the helper): nothing, for every request that takes a team.
        for team in ["bad\0team", "../..", "", "/etc"] {
            let (reply, _) = p
                .remote
                .quick
                .call::<_, FilesReply>(&FilesRequest::QuotaError { team: team.into() }, None)
                .unwrap();
            assert_eq!(reply, FilesReply::QuotaError(None), "{team:?}");
            let (reply, _) = p
                .remote
                .channels
                .call::<_, FilesReply>(&FilesRequest::Usage { team: team.into() }, None)
                .unwrap();
            assert!(
                matches!(
                    reply,
                    FilesReply::Workspace(WireWorkspaceError::InvalidTeam(_))
                ),
                "{team:?}: {reply:?}"
            );
        }
        // Outputs without the spawner's root channel are refused, not taken from elsewhere.
        let e = p
            .remote
            .save_outputs(
                "acme",
                "data",
                "run-1",
                "s1-x",
                &["/out".into()],
                &OutputLimits::default(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("not available"), "{e}");
        // A reply too large for a frame becomes an error that fits.
        let reply = bounded(FilesReply::Dir(PathBuf::from("x".repeat(rt::MAX_MESSAGE))));
        assert!(matches!(reply, FilesReply::Failed(_)), "{reply:?}");
        p.remote.shutdown();
        let e = p.ws.list("acme").unwrap_err();
        assert!(
            matches!(e, WorkspaceError::Helper(HelperError::Gone("files"))),
            "{e}"
        );
    }

    #[test]
    fn every_reply_crosses_the_channel_whole() {
        // Fields serde leaves out when empty would break postcard: the outputs report crosses
        // as JSON.
        let report = OutputsReport {
            workspace: "data".into(),
            dir: "runs/r1".into(),
            skipped: vec![crate::runs::OutputSkipped {
                path: "pipe".into(),
                kind: "fifo".into(),
                target: None,
            }],
            ..OutputsReport::default()
        };
        let reply = FilesReply::Outputs(serde_json::to_string(&report).unwrap());
        let bytes = postcard::to_stdvec(&reply).unwrap();
        let back: FilesReply = postcard::from_bytes(&bytes).unwrap();
        let FilesReply::Outputs(json) = back else {
            panic!("{back:?}");
        };
        assert_eq!(
            serde_json::from_str::<OutputsReport>(&json).unwrap(),
            report
        );
        let entry = Entry {
            name: "l".into(),
            path: "d/l".into(),
            kind: super::super::EntryKind::Symlink,
            size: 3,
            mode: 0o777,
            uid: 1000,
            gid: 1000,
            mtime: time::OffsetDateTime::UNIX_EPOCH,
            atime: time::OffsetDateTime::UNIX_EPOCH,
            ctime: time::OffsetDateTime::UNIX_EPOCH,
            target: None,
        };
        for reply in [
            FilesReply::Entry(entry.clone()),
            FilesReply::Listing(Listing {
                entries: vec![entry],
                truncated: true,
            }),
            FilesReply::Usage(None),
            FilesReply::QuotaError(None),
            FilesReply::NotSaved(SaveError::NoSpace("x".into())),
        ] {
            let bytes = postcard::to_stdvec(&reply).unwrap();
            assert_eq!(postcard::from_bytes::<FilesReply>(&bytes).unwrap(), reply);
        }
    }
}
