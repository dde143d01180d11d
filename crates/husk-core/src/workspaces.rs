//! Workspaces: persistent directory trees owned by a team, which sandboxes mount and clients
//! fill and read back.
//!
//! **Layout.** A workspace is the directory `STATE_DIR/workspaces/<team>/<name>/` (the
//! workspaces directory and the team directories are root's, 0700). Its files are owned by
//! [`WORKSPACE_OWNER`], the host ids that an id-mapped mount shows as the sandbox `user`.
//! Workspace names are 1–64 characters of `[A-Za-z0-9._-]`, not starting with `.` or `-`, so
//! every name starting with `.` in a team directory is husk's own (trash being removed).
//!
//! **Hostile trees.** A sandbox that had a workspace mounted read-write may have left
//! anything in it, and may still be changing it while husk works: symlinks (to `/etc`, to
//! host files), fifos, devices, deep trees, huge files, entries swapped between two calls.
//! So every path, from a client or from inside the tree, is resolved one component at a time
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)` relative to
//! an open directory of the workspace, and every change is made relative to an open
//! directory fd (`mkdirat`, `unlinkat`, `renameat2`, `symlinkat`, `fchownat(NOFOLLOW)`): no
//! host path string is ever joined with a workspace path. `..` and absolute paths are
//! refused; symlinks are never followed (listed as symlinks, exported as symlink entries,
//! removed as links, refused when a path goes through one); special files are never opened
//! (their type is checked with `lstat` first, and again with `fstat` after a non-blocking,
//! no-follow open); every listing, walk, depth, upload and archive is bounded.
//!
//! **Atomicity.** A deleted workspace is first renamed to a trash name in its team directory,
//! so it disappears at once (two concurrent deletes: one wins, the other finds nothing), and
//! then removed entry by entry; trash left by a crash is removed by the next
//! [`Workspaces::open`]. An uploaded file is written to a temporary file and renamed into
//! place. A tar import unpacks into a temporary directory and is merged into place only once
//! the whole archive was read within its limits, so a refused archive leaves nothing behind.
//! Those temporary entries live at the workspace root as `.husk-*`; a crash in the middle of
//! an upload can leave one there (removed with the workspace, or by hand).
//!
//! **Archives** ([`Workspaces::import_tar`]): tar or tar.gz (detected by the gzip magic).
//! Regular files, directories and symlinks (stored as symlinks, target text as is) are
//! unpacked; hard links, devices, fifos and sparse files are skipped and counted
//! ([`TarReport::skipped`]); absolute paths, `..`, entries through a symlink and nesting
//! deeper than [`MAX_DEPTH`] refuse the archive. Modes become 0644 (0755 when an execute bit
//! was set) for files and 0755 for directories; owners become [`WORKSPACE_OWNER`].
//!
//! **Quotas** ([`quota`]): with a [`WorkspaceQuota`], each team's directory is the mount point
//! of the team's own size-capped ext4 file system (a sparse image, loop-mounted), made with
//! its first workspace and mounted again at every [`Workspaces::open`]. Whatever writes into
//! it, past the quota the write fails with `ENOSPC`, which husk's own writes report as
//! [`WorkspaceError::QuotaExceeded`]. Where the host cannot mount such file systems, open
//! says so ([`Workspaces::notices`]) and new teams get plain directories, as do all teams
//! with [`WorkspaceQuota::Off`]; team directories that hold workspaces from before quotas stay
//! plain (see the notice for how to move them under the quota).

mod attrs;
mod backend;
pub mod quota;
#[cfg(test)]
mod quota_tests;
pub mod remote;
mod tarball;
mod teams;
#[cfg(test)]
mod tests;
mod tree;

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use husk_runtime::libc;
use husk_runtime::sys::{fstatat_nofollow, mkdirat, read_dir_names, renameat, FileStat};
use time::OffsetDateTime;

pub use attrs::{Attrs, WriteOptions, MAX_ID, MODE_BITS};
pub use backend::{Export, Workspaces};
pub use husk_runtime::helper::HelperError;
pub use quota::{QuotaState, WorkspaceQuota, DEFAULT_QUOTA, IMAGES_DIR, MIN_QUOTA};
pub use tarball::{export_local, import_local, ImportLimits, TarExport, TarReport};
pub use tree::{Entry, EntryKind, Listing};

use tree::Tree;

/// The directory of all workspaces in the state directory.
pub const WORKSPACES_DIR: &str = "workspaces";

/// Why a cluster's node has no workspaces: each would be on one machine, and a team's next
/// sandbox, on another, would not find them.
pub const NOT_SHARED: &str = "workspaces (and volumes) in a husk cluster need storage every \
    node mounts: mount one ReadWriteMany volume at STATE_DIR/workspaces on every node and \
    start them with --shared-workspaces (see docs/kubernetes.md)";

/// Host uid/gid that own workspace files: the sandbox `user`'s id (1000). Workspaces are mounted
/// id-mapped into sandboxes, so files owned by 1000 on the host are the sandbox user's.
pub const WORKSPACE_OWNER: (u32, u32) = (1000, 1000);

/// Longest workspace name.
pub const MAX_NAME_LEN: usize = 64;

/// Most entries one [`Workspaces::entries`] returns (the listing says it was cut short).
pub const MAX_LIST_ENTRIES: usize = 10_000;

/// Deepest directory nesting husk walks into (one open directory per level).
pub const MAX_DEPTH: usize = 128;

/// Most entries one walk of a tree visits: an export, or the size count of
/// [`Workspaces::info`] (which stops there: the figures are then lower bounds).
pub const MAX_TREE_ENTRIES: u64 = 1_000_000;

/// Longest path accepted (PATH_MAX).
pub const MAX_PATH_LEN: usize = 4096;

/// Longest name of one path component (NAME_MAX).
pub const MAX_COMPONENT_LEN: usize = 255;

/// Everything workspace operations can fail with. Messages name the workspace (or local
/// directory) and the path concerned.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The workspace does not exist (or belongs to another team, which is the same answer).
    #[error("workspace '{0}' not found")]
    NotFound(String),
    #[error("workspace '{0}' already exists")]
    AlreadyExists(String),
    #[error("invalid workspace name {0:?}: use 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-', not starting with '.' or '-'")]
    InvalidName(String),
    #[error("invalid team name {0:?}: use 1-64 characters of a-z, 0-9, '-' and '_'")]
    InvalidTeam(String),
    /// A path that is absolute, holds `..`, is too long, or goes through a symlink.
    #[error("invalid path {path:?} in {place}: {reason}")]
    InvalidPath {
        place: String,
        path: String,
        reason: String,
    },
    #[error("{path:?} not found in {place}")]
    PathNotFound { place: String, path: String },
    #[error("{path:?} in {place} is a {kind}, not a regular file")]
    NotAFile {
        place: String,
        path: String,
        kind: &'static str,
    },
    #[error("{path:?} in {place} is a {kind}, not a directory")]
    NotADirectory {
        place: String,
        path: String,
        kind: &'static str,
    },
    /// An import would put a file where a directory is (or the like).
    #[error("cannot import into {place}: {reason}")]
    Conflict { place: String, reason: String },
    /// An upload (a file, or the content of an archive) is over its byte limit.
    #[error("the upload to {place} is larger than the limit of {}", size_text(*.limit))]
    TooLarge { place: String, limit: u64 },
    #[error("{place}: more than {limit} entries")]
    TooManyEntries { place: String, limit: u64 },
    #[error("{place}: directories nest deeper than {max} levels at {path:?}")]
    TooDeep {
        place: String,
        path: String,
        max: usize,
    },
    /// A tar archive, or one of its entries, that husk does not unpack.
    #[error("archive for {place} refused at entry {entry:?}: {reason}")]
    BadArchive {
        place: String,
        entry: String,
        reason: String,
    },
    /// A write found the team's file system full: its workspaces hold all the quota allows.
    #[error(
        "the workspaces of team '{team}' are full: they may hold {} in all (the team's \
         workspace quota, file-system overhead included); remove files to make room",
        size_text(*.quota)
    )]
    QuotaExceeded { team: String, quota: u64 },
    /// The team's file system cannot be mounted (or would hide files): a problem of the host
    /// for its operator.
    #[error("the workspaces of team '{team}' are unavailable: {reason}")]
    TeamUnavailable { team: String, reason: String },
    /// The files helper failed the call, or is gone.
    #[error(transparent)]
    Helper(#[from] HelperError),
    #[error("{place}: cannot {op} {path:?}: {source}")]
    Io {
        place: String,
        /// What was being done ("create", "rename into place"...).
        op: std::borrow::Cow<'static, str>,
        path: String,
        #[source]
        source: io::Error,
    },
}

/// A workspace as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WorkspaceInfo {
    pub name: String,
    pub created_at: OffsetDateTime,
    /// Bytes of regular-file content (apparent sizes).
    pub size_bytes: u64,
    /// Regular files.
    pub files: u64,
}

/// A team's quota and what its workspaces use of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuotaUsage {
    /// The size of the team's file system.
    pub quota_bytes: u64,
    /// What is not free for writes in it: files, directories, and the file system's own
    /// overhead and reserve; writes fail when it reaches the quota.
    pub used_bytes: u64,
}

/// What [`Workspaces::write_file`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WriteReport {
    pub bytes: u64,
    /// No entry existed at the path before (else a file or symlink was replaced).
    pub created: bool,
}

/// The workspaces of every team, under one state directory.
#[derive(Debug)]
pub struct LocalWorkspaces {
    /// `STATE_DIR/workspaces`.
    dir: PathBuf,
    /// That directory, open: every lookup starts here.
    fd: File,
    /// Its device: a team directory on another one is a mounted team file system.
    dev: u64,
    /// Bounds of one upload (a file or an archive).
    upload: ImportLimits,
    /// The teams' file systems.
    teams: quota::TeamFs,
    /// What [`Self::open`] found that the operator should know.
    notices: Vec<String>,
}

impl LocalWorkspaces {
    /// Opens (creating, 0700 root) `STATE_DIR/workspaces` with the quota the last server
    /// configured there ([`Self::open_with_quota`]; none recorded: [`WorkspaceQuota::Off`]):
    /// what the command-line tools use next to a server.
    pub fn open(state_dir: &Path) -> Result<LocalWorkspaces, WorkspaceError> {
        Self::open_inner(state_dir, quota::recorded(state_dir), false)
    }

    /// Opens (creating, 0700 root) `STATE_DIR/workspaces` with `quota` for the teams'
    /// file systems, and records it for [`Self::open`]. Every team's image is mounted
    /// (a mount already there is adopted) and grown to a larger quota; a host that cannot
    /// mount them gets plain directories and a notice. Trash that an interrupted delete left
    /// behind is removed.
    pub fn open_with_quota(
        state_dir: &Path,
        quota: WorkspaceQuota,
    ) -> Result<LocalWorkspaces, WorkspaceError> {
        Self::open_inner(state_dir, quota, true)
    }

    fn open_inner(
        state_dir: &Path,
        quota: WorkspaceQuota,
        record: bool,
    ) -> Result<LocalWorkspaces, WorkspaceError> {
        let dir = state_dir.join(WORKSPACES_DIR);
        let io = |op: &'static str, source| WorkspaceError::Io {
            place: "the state directory".into(),
            op: op.into(),
            path: dir.display().to_string(),
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io("create", e))?;
        let fd = File::open(&dir).map_err(|e| io("open", e))?;
        let meta = fd.metadata().map_err(|e| io("stat", e))?;
        if !meta.is_dir() {
            return Err(io("open", io::Error::from_raw_os_error(libc::ENOTDIR)));
        }
        if meta.mode() & 0o077 != 0 {
            use std::os::unix::fs::PermissionsExt;
            fd.set_permissions(fs::Permissions::from_mode(0o700))
                .map_err(|e| io("chmod", e))?;
        }
        // Absolute: mount points are given to `mount` and to sandboxes by path.
        let dir = fs::canonicalize(&dir).map_err(|e| io("resolve", e))?;
        let (teams, notice) =
            quota::TeamFs::prepare(state_dir, quota, record).map_err(|e| WorkspaceError::Io {
                place: "the state directory".into(),
                op: "prepare".into(),
                path: state_dir.join(IMAGES_DIR).display().to_string(),
                source: e,
            })?;
        let mut ws = LocalWorkspaces {
            dir,
            dev: meta.dev(),
            fd,
            upload: ImportLimits::default(),
            teams,
            notices: Vec::new(),
        };
        if let Some(text) = notice {
            ws.notice(text);
        }
        ws.adopt();
        ws.sweep_trash();
        Ok(ws)
    }

    /// The same workspaces with other per-upload bounds (default: [`ImportLimits::default`]).
    pub fn with_upload_limits(mut self, limits: ImportLimits) -> LocalWorkspaces {
        self.upload = limits;
        self
    }

    /// The per-upload bounds servers apply to file uploads and archive imports.
    pub fn upload_limits(&self) -> ImportLimits {
        self.upload
    }

    /// Whether new teams get size-capped file systems.
    pub fn quota_state(&self) -> &QuotaState {
        self.teams.state()
    }

    /// What opening found that the operator should know (also logged as warnings): a quota
    /// that cannot be enforced here, teams whose workspaces are not under it, images that
    /// cannot be mounted or are larger than the quota.
    pub fn notices(&self) -> &[String] {
        &self.notices
    }

    /// The team's quota and how much of it is used; `None` when the team's workspaces are
    /// plain directories (no quota, or from before quotas). A team without workspaces yet
    /// shows the quota it will get.
    pub fn usage(&self, team: &str) -> Result<Option<QuotaUsage>, WorkspaceError> {
        let Some(dir) = self.team_dir(team, false)? else {
            return Ok(self.teams.quota().map(|q| QuotaUsage {
                quota_bytes: q,
                used_bytes: 0,
            }));
        };
        if !self.is_mount(&dir) {
            let fresh = read_dir_names(dir.as_fd(), 1).is_ok_and(|(n, _)| n.is_empty());
            return Ok(self.teams.quota().filter(|_| fresh).map(|q| QuotaUsage {
                quota_bytes: q,
                used_bytes: 0,
            }));
        }
        let Some(quota) = self.team_quota(team) else {
            return Ok(None);
        };
        let path = self.dir.join(team);
        let free = husk_runtime::sys::cpath(&path)
            .and_then(|c| husk_runtime::sys::statvfs(&c))
            .map(|space| space.available)
            .map_err(|e| self.team_io(team, "measure", e))?;
        Ok(Some(QuotaUsage {
            quota_bytes: quota,
            used_bytes: quota.saturating_sub(free),
        }))
    }

    /// [`WorkspaceError::QuotaExceeded`] for `team`, when its workspaces are on a team file
    /// system: what a write that found no space there means (for callers that write into a
    /// workspace themselves, like a run saving its outputs).
    pub fn quota_error(&self, team: &str) -> Option<WorkspaceError> {
        self.team_quota(team)
            .map(|quota| WorkspaceError::QuotaExceeded {
                team: team.to_string(),
                quota,
            })
    }

    /// Creates an empty workspace; [`WorkspaceError::AlreadyExists`] if the name is taken.
    pub fn create(&self, team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError> {
        self.create_inner(team, name)
            .map_err(|e| self.no_space(team, e))
    }

    fn create_inner(&self, team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError> {
        validate_name(name)?;
        let team_dir = self.team_dir(team, true)?.expect("created");
        let cname = cstring(name);
        let io = |op, source| self.io(team, op, name, source);
        match mkdirat(team_dir.as_fd(), &cname, 0o700) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                return Err(WorkspaceError::AlreadyExists(name.to_string()))
            }
            Err(e) => return Err(io("create", e)),
        }
        // Owner and mode through an fd of the directory just made: no path is followed.
        let root = tree::open_dir(team_dir.as_fd(), &cname).map_err(|e| io("open", e))?;
        tree::own_dir(&root, Some(WORKSPACE_OWNER)).map_err(|e| io("chown", e))?;
        self.info(team, name)
    }

    /// The names of the team's workspaces, sorted: what [`Self::list`] describes, without
    /// walking any of them.
    pub fn names(&self, team: &str) -> Result<Vec<String>, WorkspaceError> {
        let Some(team_dir) = self.team_dir(team, false)? else {
            return Ok(Vec::new());
        };
        let io = |source| self.io(team, "list", "", source);
        // Bounded: a team directory only ever holds what husk made in it.
        let (names, _) = read_dir_names(team_dir.as_fd(), 100_000).map_err(io)?;
        let mut names: Vec<String> = names
            .into_iter()
            .filter_map(|n| n.into_string().ok())
            .filter(|n| validate_name(n).is_ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// The team's workspaces, by name.
    pub fn list(&self, team: &str) -> Result<Vec<WorkspaceInfo>, WorkspaceError> {
        let names = self.names(team)?;
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            match self.info(team, &name) {
                Ok(info) => out.push(info),
                // Deleted meanwhile.
                Err(WorkspaceError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// One workspace: its creation time and the size of its files (counted by walking the
    /// tree, at most [`MAX_TREE_ENTRIES`] entries and [`MAX_DEPTH`] levels deep).
    pub fn info(&self, team: &str, name: &str) -> Result<WorkspaceInfo, WorkspaceError> {
        let tree = self.tree(team, name)?;
        let meta = tree.root.metadata().map_err(|e| tree.io("stat", "", e))?;
        let created = meta.created().or_else(|_| meta.modified()).ok();
        let (size_bytes, files) = tree::usage(&tree.root);
        Ok(WorkspaceInfo {
            name: name.to_string(),
            created_at: created.map_or(OffsetDateTime::UNIX_EPOCH, OffsetDateTime::from),
            size_bytes,
            files,
        })
    }

    /// Deletes a workspace and everything in it. It is renamed away first (so it is gone at
    /// once, and a concurrent create of the same name starts afresh), then removed without
    /// following any symlink in it.
    pub fn delete(&self, team: &str, name: &str) -> Result<(), WorkspaceError> {
        validate_name(name)?;
        let not_found = || WorkspaceError::NotFound(name.to_string());
        let team_dir = self.team_dir(team, false)?.ok_or_else(not_found)?;
        let trash = cstring(&format!(".trash-{:016x}", random()));
        match renameat(
            team_dir.as_fd(),
            &cstring(name),
            team_dir.as_fd(),
            &trash,
            true,
        ) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Err(not_found()),
            Err(e) => return Err(self.io(team, "delete", name, e)),
        }
        tree::purge(team_dir.as_fd(), &trash).map_err(|e| self.io(team, "remove", name, e))
    }

    /// The workspace's root directory on the host (it exists; [`WorkspaceError::NotFound`]
    /// otherwise): what gets mounted.
    pub fn dir(&self, team: &str, name: &str) -> Result<PathBuf, WorkspaceError> {
        self.tree(team, name)?;
        Ok(self.dir.join(team).join(name))
    }

    /// The entries at `path` (a directory's content, `depth` levels deep, 1 = its children;
    /// a file or symlink: itself), in name order, at most [`MAX_LIST_ENTRIES`].
    pub fn entries(
        &self,
        team: &str,
        name: &str,
        path: &str,
        depth: usize,
    ) -> Result<Listing, WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.entries(&tree.parse(path)?, depth)
    }

    /// The entry at `path` itself (`""`: the workspace root).
    pub fn stat(&self, team: &str, name: &str, path: &str) -> Result<Entry, WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.stat(&tree.parse(path)?)
    }

    /// The regular file at `path`, open for reading (to stream a download). Symlinks,
    /// directories and special files are [`WorkspaceError::NotAFile`].
    pub fn read_file(&self, team: &str, name: &str, path: &str) -> Result<File, WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.read_file(&tree.parse(path)?)
    }

    /// Writes `reader` to `path` (replacing a file or symlink there; missing parent
    /// directories are made 0755), owned by [`WORKSPACE_OWNER`], mode 0644. The data goes to
    /// a temporary file renamed into place at the end; more than `max_bytes` is
    /// [`WorkspaceError::TooLarge`] and leaves nothing behind.
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

    /// [`Self::write_file`] with the caller's choice of replacing what is there and of the
    /// new file's owner and mode (see [`Attrs`]).
    pub fn write_file_with(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        max_bytes: u64,
        options: &WriteOptions,
    ) -> Result<WriteReport, WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.write_file(&tree.parse(path)?, reader, max_bytes, options)
            .map_err(|e| self.no_space(team, e))
    }

    /// Makes the directory at `path` (see [`tree::Tree::make_dir`]: `parents` is `mkdir -p`).
    pub fn make_dir(
        &self,
        team: &str,
        name: &str,
        path: &str,
        parents: bool,
        attrs: &Attrs,
    ) -> Result<Entry, WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.make_dir(&tree.parse(path)?, parents, attrs)
            .map_err(|e| self.no_space(team, e))
    }

    /// Changes the owner and mode of the entry at `path` (see [`tree::Tree::set_attrs`]).
    pub fn set_attrs(
        &self,
        team: &str,
        name: &str,
        path: &str,
        attrs: &Attrs,
    ) -> Result<Entry, WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.set_attrs(&tree.parse(path)?, attrs)
    }

    /// Removes the file, symlink (not its target) or directory tree at `path`.
    pub fn remove(&self, team: &str, name: &str, path: &str) -> Result<(), WorkspaceError> {
        let tree = self.tree(team, name)?;
        tree.remove(&tree.parse(path)?)
    }

    /// Unpacks a tar or tar.gz archive under `path` (created if missing; merged with what is
    /// there, files replaced), within `limits`. See the module documentation for what is
    /// unpacked; a refused or oversized archive leaves nothing behind.
    pub fn import_tar(
        &self,
        team: &str,
        name: &str,
        path: &str,
        reader: impl Read,
        limits: ImportLimits,
    ) -> Result<TarReport, WorkspaceError> {
        let tree = self.tree(team, name)?;
        let dest = tree.parse(path)?;
        tarball::import(&tree, &dest, reader, limits).map_err(|e| self.no_space(team, e))
    }

    /// Writes a tar of the tree at `path` to `writer` (entries relative to it; a file: one
    /// entry of its name), symlinks as symlink entries, special files skipped.
    pub fn export_tar(
        &self,
        team: &str,
        name: &str,
        path: &str,
        writer: impl Write,
    ) -> Result<TarReport, WorkspaceError> {
        self.exporter(team, name, path)?.write_to(writer)
    }

    /// [`Self::export_tar`] in two steps: finding what to export (errors before any byte is
    /// written), then writing it.
    pub fn exporter(
        &self,
        team: &str,
        name: &str,
        path: &str,
    ) -> Result<TarExport, WorkspaceError> {
        let tree = self.tree(team, name)?;
        let rel = tree.parse(path)?;
        TarExport::new(tree, &rel)
    }

    /// The open root of one workspace.
    fn tree(&self, team: &str, name: &str) -> Result<Tree, WorkspaceError> {
        validate_name(name)?;
        let not_found = || WorkspaceError::NotFound(name.to_string());
        let team_dir = self.team_dir(team, false)?.ok_or_else(not_found)?;
        let root = match tree::open_dir(team_dir.as_fd(), &cstring(name)) {
            Ok(root) => root,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                return Err(not_found())
            }
            Err(e) => return Err(self.io(team, "open", name, e)),
        };
        Ok(Tree {
            root,
            place: format!("workspace '{name}'"),
            owner: Some(WORKSPACE_OWNER),
        })
    }

    /// Removes the trash of deletes that did not finish (best effort: what fails stays for
    /// the next time).
    fn sweep_trash(&self) {
        let Ok((teams, _)) = read_dir_names(self.fd.as_fd(), 100_000) else {
            return;
        };
        for team in teams {
            let Ok(dir) = tree::open_dir(self.fd.as_fd(), &team) else {
                continue;
            };
            let Ok((names, _)) = read_dir_names(dir.as_fd(), 100_000) else {
                continue;
            };
            for name in names {
                if name.to_bytes().starts_with(b".trash-") {
                    if let Err(e) = tree::purge(dir.as_fd(), &name) {
                        tracing::warn!(trash = ?name, error = %e, "removing workspace trash");
                    }
                }
            }
        }
    }

    fn io(&self, team: &str, op: &'static str, name: &str, source: io::Error) -> WorkspaceError {
        WorkspaceError::Io {
            place: format!("workspace '{name}' of team '{team}'"),
            op: op.into(),
            path: self.dir.join(team).join(name).display().to_string(),
            source,
        }
    }
}

/// Validates a workspace name: 1–64 characters of `[A-Za-z0-9._-]`, not starting with `.`
/// or `-` (so it is never `.`, `..`, husk's own dot names, or an option to a command).
pub fn validate_name(name: &str) -> Result<(), WorkspaceError> {
    let ok = (1..=MAX_NAME_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && !name.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(WorkspaceError::InvalidName(name.to_string()))
    }
}

/// Renders a byte count for messages: "1 GiB", "1.5 MiB", "512 bytes".
fn size_text(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    match UNITS.iter().find(|(size, _)| bytes >= *size) {
        Some((size, unit)) if bytes % size == 0 => format!("{} {unit}", bytes / size),
        Some((size, unit)) => format!("{:.1} {unit}", bytes as f64 / *size as f64),
        None => format!("{bytes} bytes"),
    }
}

/// A C string of a name already validated to hold no NUL.
fn cstring(s: &str) -> CString {
    CString::new(s).expect("validated names hold no NUL byte")
}

/// 64 random bits for temporary names (the clock when the kernel has none to give).
fn random() -> u64 {
    husk_runtime::sys::random_u64().unwrap_or_else(|_| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.as_nanos() as u64 ^ u64::from(std::process::id())
    })
}

/// `lstat` of `name` in `dir`; `None` when it does not exist.
fn lstat(dir: &File, name: &std::ffi::CStr) -> io::Result<Option<FileStat>> {
    match fstatat_nofollow(dir.as_fd(), name) {
        Ok(st) => Ok(Some(st)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What an entry of a given mode is, for messages.
fn kind_name(st: &FileStat) -> &'static str {
    match st.file_type() {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        _ => "device",
    }
}
