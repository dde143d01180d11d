//! One open tree (a workspace, or a local directory of the CLI's) and the fd-relative
//! operations on it: path parsing, lookups that never follow a symlink, listing, reading,
//! writing, removal and size counting.

use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;

use husk_runtime::libc;
use husk_runtime::sys::{
    fchownat_nofollow, fstatat_nofollow, mkdirat, openat2, read_dir_names, readlinkat, renameat,
    unlinkat, FileStat,
};
use time::OffsetDateTime;

use super::attrs::{set, WriteOptions};
use super::{
    kind_name, lstat, random, WorkspaceError, WriteReport, MAX_COMPONENT_LEN, MAX_DEPTH,
    MAX_LIST_ENTRIES, MAX_PATH_LEN, MAX_TREE_ENTRIES,
};

/// Every lookup: beneath the directory it starts from, no symlink or magic link on the way.
pub(super) const RESOLVE: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// Copy buffer: large enough for throughput, small enough to bound memory.
pub(super) const BUF_SIZE: usize = 128 * 1024;

/// How many entries one removal may handle before giving up (a sandbox that keeps writing
/// into a tree being removed must not keep husk busy forever).
const REMOVE_BUDGET: u64 = 20_000_000;

/// Names read from a directory at a time while removing it.
const REMOVE_BATCH: usize = 4096;

/// An open tree: its root directory, how messages name it, and who owns what husk creates
/// in it (`None`: the caller, for the CLI's local directories).
pub(crate) struct Tree {
    pub root: File,
    pub place: String,
    pub owner: Option<(u32, u32)>,
}

/// A validated path relative to a tree's root: no `..`, no empty or `.` components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RelPath {
    pub comps: Vec<CString>,
    /// The normalized text (`a/b`; empty for the root), for messages and entry paths.
    pub text: String,
}

impl RelPath {
    pub fn is_root(&self) -> bool {
        self.comps.is_empty()
    }

    /// The parent's components and the last name (`None` for the root).
    pub fn split_last(&self) -> Option<(&[CString], &CStr)> {
        self.comps
            .split_last()
            .map(|(last, parent)| (parent, last.as_c_str()))
    }

    /// The text of the first `n` components.
    pub fn prefix(&self, n: usize) -> String {
        join(&self.comps[..n])
    }
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    /// A fifo, socket or device: listed, never opened.
    Other,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EntryKind::File => "file",
            EntryKind::Dir => "dir",
            EntryKind::Symlink => "symlink",
            EntryKind::Other => "other",
        }
    }

    fn of(st: &FileStat) -> EntryKind {
        match st.file_type() {
            libc::S_IFREG => EntryKind::File,
            libc::S_IFDIR => EntryKind::Dir,
            libc::S_IFLNK => EntryKind::Symlink,
            _ => EntryKind::Other,
        }
    }
}

/// One listed entry. Names that are not UTF-8 are shown lossily.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Entry {
    pub name: String,
    /// Relative to the workspace root.
    pub path: String,
    pub kind: EntryKind,
    /// Bytes (a symlink: the length of its target).
    pub size: u64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    /// Owner ids on the host, which are the sandbox's (workspaces are mounted with the
    /// sandbox's own id mapping).
    pub uid: u32,
    pub gid: u32,
    pub mtime: OffsetDateTime,
    pub atime: OffsetDateTime,
    /// Last status change.
    pub ctime: OffsetDateTime,
    /// A symlink's target text, as stored (never resolved).
    pub target: Option<String>,
}

/// A directory listing, cut short at [`MAX_LIST_ENTRIES`].
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Listing {
    pub entries: Vec<Entry>,
    /// More entries existed than were listed.
    pub truncated: bool,
}

impl Tree {
    /// A local directory of the CLI's (trusted, but handled the same way).
    pub fn local(dir: &std::path::Path) -> Result<Tree, WorkspaceError> {
        let place = format!("directory {}", dir.display());
        let root = File::open(dir).map_err(|source| WorkspaceError::Io {
            place: place.clone(),
            op: "open".into(),
            path: String::new(),
            source,
        })?;
        if !root.metadata().is_ok_and(|m| m.is_dir()) {
            return Err(WorkspaceError::NotADirectory {
                place,
                path: String::new(),
                kind: "file",
            });
        }
        Ok(Tree {
            root,
            place,
            owner: None,
        })
    }

    pub fn io(&self, op: &'static str, path: &str, source: io::Error) -> WorkspaceError {
        WorkspaceError::Io {
            place: self.place.clone(),
            op: op.into(),
            path: path.to_string(),
            source,
        }
    }

    pub fn invalid(&self, path: &str, reason: impl Into<String>) -> WorkspaceError {
        WorkspaceError::InvalidPath {
            place: self.place.clone(),
            path: path.to_string(),
            reason: reason.into(),
        }
    }

    fn not_found(&self, path: &str) -> WorkspaceError {
        WorkspaceError::PathNotFound {
            place: self.place.clone(),
            path: path.to_string(),
        }
    }

    /// Parses a client's path: relative to the root (`""` and `.` are the root), `/`-separated,
    /// no `..`, no NUL, at most [`MAX_PATH_LEN`] bytes and [`MAX_COMPONENT_LEN`] per name.
    pub fn parse(&self, path: &str) -> Result<RelPath, WorkspaceError> {
        if path.len() > MAX_PATH_LEN {
            return Err(self.invalid(path, format!("longer than {MAX_PATH_LEN} bytes")));
        }
        if path.starts_with('/') {
            return Err(self.invalid(
                path,
                "absolute paths are refused; paths are relative to the workspace root",
            ));
        }
        let mut comps = Vec::new();
        for part in path.split('/') {
            match part {
                "" | "." => {}
                ".." => return Err(self.invalid(path, "`..` is refused")),
                _ if part.len() > MAX_COMPONENT_LEN => {
                    return Err(self.invalid(
                        path,
                        format!("a name is longer than {MAX_COMPONENT_LEN} bytes"),
                    ))
                }
                _ => comps.push(
                    CString::new(part).map_err(|_| self.invalid(path, "contains a NUL byte"))?,
                ),
            }
        }
        if comps.len() > MAX_DEPTH {
            return Err(self.invalid(path, format!("deeper than {MAX_DEPTH} levels")));
        }
        let text = join(&comps);
        Ok(RelPath { comps, text })
    }

    /// Opens the directory `comps` names (for reading), one component at a time: a symlink
    /// anywhere is refused, never followed.
    pub fn open_dirs(&self, comps: &[CString], rel: &RelPath) -> Result<File, WorkspaceError> {
        let mut cur = self.root.try_clone().map_err(|e| self.io("open", "", e))?;
        for (i, name) in comps.iter().enumerate() {
            cur = match open_dir(cur.as_fd(), name) {
                Ok(dir) => dir,
                Err(e) => return Err(self.dir_error(&cur, name, &rel.prefix(i + 1), e)),
            };
        }
        Ok(cur)
    }

    /// Like [`Self::open_dirs`], making missing directories (0755, owned by the tree's owner).
    pub fn ensure_dirs(&self, comps: &[CString], rel: &RelPath) -> Result<File, WorkspaceError> {
        let mut cur = self.root.try_clone().map_err(|e| self.io("open", "", e))?;
        for (i, name) in comps.iter().enumerate() {
            cur = ensure_dir(&cur, name, self.owner)
                .map_err(|e| self.dir_error(&cur, name, &rel.prefix(i + 1), e))?
                .0;
        }
        Ok(cur)
    }

    /// Why `name` in `dir` could not be opened as a directory.
    fn dir_error(&self, dir: &File, name: &CStr, path: &str, e: io::Error) -> WorkspaceError {
        match e.raw_os_error() {
            Some(libc::ENOENT) => self.not_found(path),
            Some(libc::ELOOP) => self.invalid(path, "it is a symlink, which husk never follows"),
            Some(libc::ENOTDIR) => WorkspaceError::NotADirectory {
                place: self.place.clone(),
                path: path.to_string(),
                kind: lstat(dir, name)
                    .ok()
                    .flatten()
                    .map_or("file", |st| kind_name(&st)),
            },
            _ => self.io("open", path, e),
        }
    }

    /// The parent directory of `rel` (not the root), open, and what is at `rel` in it.
    pub fn lookup<'r>(
        &self,
        rel: &'r RelPath,
    ) -> Result<(File, &'r CStr, Option<FileStat>), WorkspaceError> {
        let (parent, name) = rel.split_last().expect("not the root");
        let dir = self.open_dirs(parent, rel)?;
        let st = lstat(&dir, name).map_err(|e| self.io("stat", &rel.text, e))?;
        Ok((dir, name, st))
    }

    pub fn stat(&self, rel: &RelPath) -> Result<Entry, WorkspaceError> {
        if rel.is_root() {
            let st =
                fstatat_nofollow(self.root.as_fd(), c"").map_err(|e| self.io("stat", "", e))?;
            return Ok(entry(&self.root, c"", "", st));
        }
        let (dir, name, st) = self.lookup(rel)?;
        let st = st.ok_or_else(|| self.not_found(&rel.text))?;
        Ok(entry(&dir, name, &rel.text, st))
    }

    pub fn entries(&self, rel: &RelPath, depth: usize) -> Result<Listing, WorkspaceError> {
        let dir = if rel.is_root() {
            self.open_dirs(&[], rel)?
        } else {
            let (parent, name, st) = self.lookup(rel)?;
            let st = st.ok_or_else(|| self.not_found(&rel.text))?;
            if !st.is_dir() {
                return Ok(Listing {
                    entries: vec![entry(&parent, name, &rel.text, st)],
                    truncated: false,
                });
            }
            open_dir(parent.as_fd(), name)
                .map_err(|e| self.dir_error(&parent, name, &rel.text, e))?
        };
        let mut listing = Listing::default();
        let depth = depth.clamp(1, MAX_DEPTH);
        list(&dir, &rel.text, depth, &mut listing).map_err(|e| self.io("list", &rel.text, e))?;
        Ok(listing)
    }

    pub fn read_file(&self, rel: &RelPath) -> Result<File, WorkspaceError> {
        let not_a_file = |kind| WorkspaceError::NotAFile {
            place: self.place.clone(),
            path: rel.text.clone(),
            kind,
        };
        if rel.is_root() {
            return Err(not_a_file("directory"));
        }
        let (dir, name, st) = self.lookup(rel)?;
        let st = st.ok_or_else(|| self.not_found(&rel.text))?;
        if !st.is_file() {
            return Err(not_a_file(kind_name(&st)));
        }
        // Checked again on the open file: the entry may have been swapped meanwhile, and
        // O_NONBLOCK|O_NOFOLLOW keep a swapped-in fifo or symlink from blocking or leading
        // anywhere.
        let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
        let file = match openat2(dir.as_fd(), name, flags, 0, RESOLVE) {
            Ok(fd) => File::from(fd),
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return Err(not_a_file("symlink")),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(self.not_found(&rel.text))
            }
            Err(e) => return Err(self.io("open", &rel.text, e)),
        };
        let st = fstatat_nofollow(file.as_fd(), c"").map_err(|e| self.io("stat", &rel.text, e))?;
        if !st.is_file() {
            return Err(not_a_file(kind_name(&st)));
        }
        Ok(file)
    }

    pub fn write_file(
        &self,
        rel: &RelPath,
        mut reader: impl Read,
        max_bytes: u64,
        options: &WriteOptions,
    ) -> Result<WriteReport, WorkspaceError> {
        self.check_attrs(rel, &options.attrs)?;
        let exists = || WorkspaceError::Conflict {
            place: self.place.clone(),
            reason: format!(
                "{:?} already exists (write with force to replace it)",
                rel.text
            ),
        };
        let Some((parent, name)) = rel.split_last() else {
            return Err(WorkspaceError::NotAFile {
                place: self.place.clone(),
                path: String::new(),
                kind: "directory",
            });
        };
        // Refused before the data is read when it is clear the file cannot go there (a
        // missing parent is fine: it is made).
        match self.lookup(rel) {
            Ok((_, _, Some(st))) if st.is_dir() => {
                return Err(WorkspaceError::NotAFile {
                    place: self.place.clone(),
                    path: rel.text.clone(),
                    kind: "directory",
                })
            }
            Ok((_, _, Some(_))) if !options.replace => return Err(exists()),
            Ok(_) | Err(WorkspaceError::PathNotFound { .. }) => {}
            Err(e) => return Err(e),
        }
        // The data goes to a temporary file at the root; parents are made only once all of
        // it arrived within the limit, so a refused upload leaves nothing.
        let tmp = Temp::file(&self.root).map_err(|e| self.io("create", &rel.text, e))?;
        let mut file = tmp.file.as_ref().expect("a file");
        let mut buf = vec![0u8; BUF_SIZE];
        let mut bytes = 0u64;
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io("read the upload for", &rel.text, e)),
            };
            bytes += n as u64;
            if bytes > max_bytes {
                return Err(WorkspaceError::TooLarge {
                    place: self.place.clone(),
                    limit: max_bytes,
                });
            }
            file.write_all(&buf[..n])
                .map_err(|e| self.io("write", &rel.text, e))?;
        }
        let mode = options.attrs.mode.unwrap_or(0o644);
        set(file, self.owner_for(&options.attrs), mode)
            .map_err(|e| self.io("chown", &rel.text, e))?;
        let dir = self.ensure_dirs(parent, rel)?;
        let existed = lstat(&dir, name).map_err(|e| self.io("stat", &rel.text, e))?;
        // Without `replace`, the rename itself refuses what appeared meanwhile.
        match renameat(
            self.root.as_fd(),
            &tmp.name,
            dir.as_fd(),
            name,
            !options.replace,
        ) {
            Ok(()) => tmp.disarm(),
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => return Err(exists()),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EISDIR | libc::ENOTEMPTY)) => {
                return Err(WorkspaceError::NotAFile {
                    place: self.place.clone(),
                    path: rel.text.clone(),
                    kind: "directory",
                })
            }
            Err(e) => return Err(self.io("rename into place", &rel.text, e)),
        }
        Ok(WriteReport {
            bytes,
            created: existed.is_none(),
        })
    }

    pub fn remove(&self, rel: &RelPath) -> Result<(), WorkspaceError> {
        if rel.is_root() {
            return Err(self.invalid(
                "",
                "the workspace root cannot be removed (delete the workspace instead)",
            ));
        }
        let (dir, name, st) = self.lookup(rel)?;
        let st = st.ok_or_else(|| self.not_found(&rel.text))?;
        let removed = if st.is_dir() {
            remove_tree(&self.root, &dir, name)
        } else {
            unlinkat(dir.as_fd(), name, false)
        };
        match removed {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Err(self.not_found(&rel.text)),
            Err(e) => Err(self.io("remove", &rel.text, e)),
        }
    }
}

/// `a/b/c` from components.
fn join(comps: &[CString]) -> String {
    let parts: Vec<String> = comps
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    parts.join("/")
}

/// Opens directory `name` in `dir` for reading; a symlink is `ELOOP` (`RESOLVE_NO_SYMLINKS`;
/// with `O_NOFOLLOW` it would be `ENOTDIR`), anything else not a directory `ENOTDIR`
/// (`O_DIRECTORY` is checked before a fifo or device would be opened).
pub(crate) fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<File> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY;
    openat2(dir, name, flags, 0, RESOLVE).map(File::from)
}

/// Opens directory `name` in `dir`, making it (0755, `owner`) if missing.
/// Says whether it made it.
pub(super) fn ensure_dir(
    dir: &File,
    name: &CStr,
    owner: Option<(u32, u32)>,
) -> io::Result<(File, bool)> {
    match open_dir(dir.as_fd(), name) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        other => return other.map(|d| (d, false)),
    }
    let created = match mkdirat(dir.as_fd(), name, 0o700) {
        Ok(()) => true,
        // Someone else made it meanwhile: theirs, left as it is.
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => false,
        Err(e) => return Err(e),
    };
    let sub = open_dir(dir.as_fd(), name)?;
    if created {
        own_dir(&sub, owner)?;
    }
    Ok((sub, created))
}

/// Gives a directory husk made its owner and mode 0755, through its fd.
pub(crate) fn own_dir(dir: &File, owner: Option<(u32, u32)>) -> io::Result<()> {
    set_owner_mode(dir, owner, 0o755)
}

/// chown (first: it clears set-id bits) and chmod of an open file or directory.
pub(super) fn set_owner_mode(file: &File, owner: Option<(u32, u32)>, mode: u32) -> io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::fchown(file, Some(uid), Some(gid))?;
    }
    file.set_permissions(Permissions::from_mode(mode))
}

/// Gives an entry husk made (a symlink) its owner, without following it.
pub(super) fn own_entry(dir: &File, name: &CStr, owner: Option<(u32, u32)>) -> io::Result<()> {
    match owner {
        Some((uid, gid)) => fchownat_nofollow(dir.as_fd(), name, uid, gid),
        None => Ok(()),
    }
}

/// A temporary entry at a tree's root (`.husk-*`), removed on drop unless disarmed.
pub(super) struct Temp<'a> {
    root: &'a File,
    pub name: CString,
    pub file: Option<File>,
    armed: bool,
}

impl<'a> Temp<'a> {
    /// A new empty file, 0600 until the caller sets its mode.
    pub fn file(root: &'a File) -> io::Result<Temp<'a>> {
        let name = temp_name("upload");
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = openat2(root.as_fd(), &name, flags, 0o600, RESOLVE)?;
        Ok(Temp {
            root,
            name,
            file: Some(File::from(fd)),
            armed: true,
        })
    }

    /// A new empty directory, 0700 until the caller sets its mode; open in `file`.
    pub fn dir(root: &'a File) -> io::Result<Temp<'a>> {
        let name = temp_name("import");
        mkdirat(root.as_fd(), &name, 0o700)?;
        let mut tmp = Temp {
            root,
            name,
            file: None,
            armed: true,
        };
        tmp.file = Some(open_dir(root.as_fd(), &tmp.name)?);
        Ok(tmp)
    }

    /// It was moved into place: nothing to remove.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for Temp<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let is_dir = self
            .file
            .as_ref()
            .and_then(|f| f.metadata().ok())
            .is_some_and(|m| m.is_dir());
        let r = if is_dir {
            purge(self.root.as_fd(), &self.name)
        } else {
            unlinkat(self.root.as_fd(), &self.name, false)
        };
        if let Err(e) = r {
            if e.raw_os_error() != Some(libc::ENOENT) {
                tracing::warn!(name = ?self.name, error = %e, "removing a temporary workspace entry");
            }
        }
    }
}

/// `.husk-<what>-<random>`: hidden, and never a valid name of a client's choosing to collide
/// with by chance.
fn temp_name(what: &str) -> CString {
    CString::new(format!(".husk-{what}-{:016x}", random())).expect("no NUL")
}

/// The [`Entry`] of `name` in `dir` (`""`: `dir` itself).
pub(super) fn entry(dir: &File, name: &CStr, path: &str, st: FileStat) -> Entry {
    let kind = EntryKind::of(&st);
    let target = (kind == EntryKind::Symlink)
        .then(|| readlinkat(dir.as_fd(), name).ok())
        .flatten()
        .map(|t| String::from_utf8_lossy(&t).into_owned());
    let name_text = if name.is_empty() {
        String::new()
    } else {
        String::from_utf8_lossy(name.to_bytes()).into_owned()
    };
    let at = |secs: i64, nsec: i64| {
        OffsetDateTime::from_unix_timestamp(secs)
            .map(|t| t + time::Duration::nanoseconds(nsec))
            .unwrap_or(OffsetDateTime::UNIX_EPOCH)
    };
    Entry {
        name: name_text,
        path: path.to_string(),
        kind,
        size: st.size,
        mode: st.mode & 0o7777,
        uid: st.uid,
        gid: st.gid,
        mtime: at(st.mtime, st.mtime_nsec),
        atime: at(st.atime, st.atime_nsec),
        ctime: at(st.ctime, st.ctime_nsec),
        target,
    }
}

/// `prefix/name`, or `name` at the root.
pub(super) fn child_path(prefix: &str, name: &CStr) -> String {
    let name = String::from_utf8_lossy(name.to_bytes());
    if prefix.is_empty() {
        name.into_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Lists `dir` into `out`, `depth` levels deep, in name order, until [`MAX_LIST_ENTRIES`].
/// Entries that vanish or change type while being listed are skipped.
fn list(dir: &File, prefix: &str, depth: usize, out: &mut Listing) -> io::Result<()> {
    let room = MAX_LIST_ENTRIES - out.entries.len();
    let (mut names, more) = read_dir_names(dir.as_fd(), room)?;
    names.sort();
    for name in names {
        let Some(st) = lstat(dir, &name)? else {
            continue;
        };
        let path = child_path(prefix, &name);
        out.entries.push(entry(dir, &name, &path, st));
        if st.is_dir() && depth > 1 {
            match open_dir(dir.as_fd(), &name) {
                Ok(sub) => list(&sub, &path, depth - 1, out)?,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        if out.entries.len() >= MAX_LIST_ENTRIES {
            out.truncated = true;
            return Ok(());
        }
    }
    out.truncated |= more;
    Ok(())
}

/// Bytes and count of the regular files under `dir`: a walk bounded by [`MAX_TREE_ENTRIES`]
/// and [`MAX_DEPTH`] (past them the figures are lower bounds). Errors are skipped: the
/// figures are informative, and the tree may change while it is walked.
pub(super) fn usage(dir: &File) -> (u64, u64) {
    fn walk(dir: &File, depth: usize, budget: &mut u64, total: &mut (u64, u64)) {
        let room = usize::try_from(*budget).unwrap_or(usize::MAX);
        let Ok((names, _)) = read_dir_names(dir.as_fd(), room) else {
            return;
        };
        for name in names {
            if *budget == 0 {
                return;
            }
            *budget -= 1;
            let Ok(Some(st)) = lstat(dir, &name) else {
                continue;
            };
            if st.is_file() {
                total.0 += st.size;
                total.1 += 1;
            } else if st.is_dir() && depth < MAX_DEPTH {
                if let Ok(sub) = open_dir(dir.as_fd(), &name) {
                    walk(&sub, depth + 1, budget, total);
                }
            }
        }
    }
    let (mut total, mut budget) = ((0, 0), MAX_TREE_ENTRIES);
    walk(dir, 1, &mut budget, &mut total);
    total
}

/// Removes the directory `name` in `parent` and everything in it: renamed to a temporary
/// name at `root` first (it is gone from its place at once), then emptied and removed.
pub(super) fn remove_tree(root: &File, parent: &File, name: &CStr) -> io::Result<()> {
    let tmp = temp_name("rm");
    renameat(parent.as_fd(), name, root.as_fd(), &tmp, true)?;
    purge(root.as_fd(), &tmp)
}

/// Removes the directory `name` in `dir` and everything in it, never following a symlink.
/// At most [`MAX_DEPTH`] directories are open at once: deeper ones are moved up to the top
/// and removed from there. A sandbox writing into the tree meanwhile may make this fail
/// (after [`REMOVE_BUDGET`] entries), never make it touch anything outside the tree.
pub(crate) fn purge(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    let top = match open_dir(dir, name) {
        Ok(top) => top,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)) => {
            return ignore_enoent(unlinkat(dir, name, false))
        }
        Err(e) => return Err(e),
    };
    let mut budget = REMOVE_BUDGET;
    empty(&top, &top, 0, &mut budget)?;
    ignore_enoent(unlinkat(dir, name, true))
}

fn ignore_enoent(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Removes everything in `dir`, which is `depth` levels below `top`.
fn empty(top: &File, dir: &File, depth: usize, budget: &mut u64) -> io::Result<()> {
    loop {
        let (names, _) = read_dir_names(dir.as_fd(), REMOVE_BATCH)?;
        if names.is_empty() {
            return Ok(());
        }
        for name in names {
            if *budget == 0 {
                return Err(io::Error::other(
                    "the tree keeps changing while it is removed; gave up",
                ));
            }
            *budget -= 1;
            let Some(st) = lstat(dir, &name)? else {
                continue;
            };
            if !st.is_dir() {
                match unlinkat(dir.as_fd(), &name, false) {
                    // Gone, or swapped for a directory: the next round sees it again.
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EISDIR)) => {}
                    other => other?,
                }
                continue;
            }
            if depth + 1 >= MAX_DEPTH {
                // Too deep to hold one more open directory: moved up to the top, whose own
                // loop finds it in a later round.
                let up = temp_name("deep");
                ignore_enoent(renameat(dir.as_fd(), &name, top.as_fd(), &up, true))?;
                continue;
            }
            match open_dir(dir.as_fd(), &name) {
                Ok(sub) => empty(top, &sub, depth + 1, budget)?,
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP)
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
            match unlinkat(dir.as_fd(), &name, true) {
                // Gone, refilled or swapped meanwhile: the next round sees it again.
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::ENOENT | libc::ENOTEMPTY | libc::EEXIST | libc::ENOTDIR)
                    ) => {}
                other => other?,
            }
        }
    }
}

/// The name of a directory entry as a path component (for tar entries).
pub(super) fn os_name(name: &CStr) -> &OsStr {
    OsStr::from_bytes(name.to_bytes())
}
