//! File operations of the filesystem service and of `/files` uploads and downloads.
//!
//! The agent is the sandbox's root (uid 0 of its user namespace) after `pivot_root`, like
//! E2B's envd, so every absolute path here is inside the sandbox and no permission checks are
//! made on behalf of `user`: the sandbox is that user's to break, and `user` has passwordless
//! sudo anyway. What the agent creates on behalf of `user` (files, directories, parents) is
//! chowned to uid/gid 1000 so the user's own processes can use it.
//!
//! Everything here runs on the agent's single thread: nothing may block indefinitely (FIFOs
//! and devices are refused, never opened for I/O), and everything kept or returned is bounded
//! (open handles, listing sizes, metadata).

mod entry;
mod error;
mod handles;
mod path;
#[cfg(test)]
pub(crate) mod tests;

use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use husk_proto::{AgentError, Entry, ErrorKind, FileType, Reply, Request, User, MAX_FRAME};

pub(crate) use error::{invalid, io_error};
pub use path::resolve;

use entry::{encoded_size_bound, entry_of};
use handles::Handles;

/// Most entries one `ListDir` returns.
const MAX_LIST_ENTRIES: usize = 100_000;
/// Most bytes (an upper bound of the encoding) of one `ListDir` reply: it must fit one frame,
/// with room for the reply's envelope.
const MAX_LIST_BYTES: usize = MAX_FRAME - (16 << 10);

/// The file side of the agent: open handles and the operations on paths.
#[derive(Default)]
pub struct Files {
    handles: Handles,
}

impl Files {
    /// No open handles.
    pub fn new() -> Files {
        Files::default()
    }

    /// Handles `Stat`, `MakeDir`, `Move`, `ListDir`, `Remove`, `OpenRead`, `OpenWrite`,
    /// `Read`, `Write`, `Close` and `Disk`; any other request is an `InvalidArgument`.
    pub fn handle(&mut self, req: &Request) -> Result<Reply, AgentError> {
        match req {
            Request::Stat { path, user } => {
                let path = resolve(path, *user)?;
                Ok(Reply::Entry(stat(&path)?))
            }
            Request::MakeDir { path, user } => make_dir(&resolve(path, *user)?, *user),
            Request::Move { from, to, user } => {
                move_entry(&resolve(from, *user)?, &resolve(to, *user)?, *user)
            }
            Request::ListDir { path, depth, user } => {
                Ok(Reply::Entries(list_dir(&resolve(path, *user)?, *depth)?))
            }
            Request::Remove { path, user } => remove(&resolve(path, *user)?),
            Request::OpenRead { path, user } => self.handles.open_read(&resolve(path, *user)?),
            Request::OpenWrite {
                path,
                user,
                metadata,
            } => self
                .handles
                .open_write(&resolve(path, *user)?, *user, metadata),
            Request::Read {
                handle,
                offset,
                len,
            } => self.handles.read(*handle, *offset, *len),
            Request::Write { handle, data } => self.handles.write(*handle, data),
            Request::Close { handle } => self.handles.close(*handle),
            Request::Disk => disk(),
            _ => Err(invalid("not a file-system request")),
        }
    }
}

/// The entry of `path` (a symlink with its target's type, see [`entry_of`]).
fn stat(path: &Path) -> Result<Entry, AgentError> {
    entry_of(path).map_err(|e| io_error("stat", path, &e))
}

/// Creates a directory and its missing parents, all owned by `user`. An existing path (of
/// any type, a dangling symlink included) is `AlreadyExists`, which `make_dir()` in the SDKs
/// turns into `False`.
fn make_dir(path: &Path, user: User) -> Result<Reply, AgentError> {
    let exists = || {
        AgentError::new(
            ErrorKind::AlreadyExists,
            format!("path '{}' already exists", path.display()),
        )
    };
    match std::fs::symlink_metadata(path) {
        Ok(_) => return Err(exists()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("stat", path, &e)),
    }
    if let Some(parent) = path.parent() {
        make_dirs(parent, user)?;
    }
    match create_dir(path, user) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Err(exists()),
        Err(e) => return Err(io_error("create directory", path, &e)),
    }
    Ok(Reply::Entry(stat(path)?))
}

/// Makes sure `dir` is a directory, creating it and its missing ancestors for `user` (like
/// `mkdir -p`, but chowning each directory it creates). An ancestor that exists but is no
/// directory is an `InvalidArgument`.
pub(crate) fn make_dirs(dir: &Path, user: User) -> Result<(), AgentError> {
    let not_dir = |p: &Path| invalid(format!("path '{}' is not a directory", p.display()));
    let mut missing = Vec::new();
    let mut cur = dir;
    loop {
        match std::fs::metadata(cur) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(not_dir(cur)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(cur),
            Err(e) => return Err(io_error("stat", cur, &e)),
        }
        match cur.parent() {
            Some(parent) => cur = parent,
            None => break,
        }
    }
    for d in missing.into_iter().rev() {
        match create_dir(d, user) {
            Ok(()) => {}
            // Created meanwhile by someone else: fine if it is a directory.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !std::fs::metadata(d).is_ok_and(|m| m.is_dir()) {
                    return Err(not_dir(d));
                }
            }
            Err(e) => return Err(io_error("create directory", d, &e)),
        }
    }
    Ok(())
}

/// mkdir (mode 0755 before the umask) and, for `user`, lchown of what was just created.
fn create_dir(path: &Path, user: User) -> io::Result<()> {
    std::fs::DirBuilder::new().mode(0o755).create(path)?;
    if user != User::Root {
        std::os::unix::fs::lchown(path, Some(user.id()), Some(user.id()))?;
    }
    Ok(())
}

/// rename(2), creating the destination's parents as envd does → the destination's entry.
fn move_entry(from: &Path, to: &Path, user: User) -> Result<Reply, AgentError> {
    std::fs::symlink_metadata(from).map_err(|e| io_error("move", from, &e))?;
    if let Some(parent) = to.parent() {
        make_dirs(parent, user)?;
    }
    std::fs::rename(from, to).map_err(|e| {
        // ENOENT now can only be about the source vanishing meanwhile.
        let path = if e.kind() == io::ErrorKind::NotFound {
            from
        } else {
            to
        };
        io_error("move to", path, &e)
    })?;
    Ok(Reply::Entry(stat(to)?))
}

/// Removes a file, a symlink (the link, not its target) or a whole directory tree
/// (`remove_dir_all` never follows symlinks); a path that does not exist is no error. `/` is
/// refused: removing the sandbox's root is never what a file-API call means.
fn remove(path: &Path) -> Result<Reply, AgentError> {
    if path == Path::new("/") {
        return Err(invalid("refusing to remove '/'"));
    }
    // What is not there is removed already (envd's `os.RemoveAll`): code that cleans up
    // before it starts must not fail on a first run.
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Reply::Done),
        Err(e) => return Err(io_error("remove", path, &e)),
    };
    let result = if meta.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(Reply::Done),
        // Removed by someone else meanwhile.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Reply::Done),
        Err(e) => Err(io_error("remove", path, &e)),
    }
}

/// The entries below `path` down to `depth` levels (0 and 1: the direct children), sorted by
/// path. `path` itself may be a symlink to a directory; symlinks below it are listed but
/// never followed. Bounded by [`MAX_LIST_ENTRIES`] and [`MAX_LIST_BYTES`]: a larger listing
/// is `ResourceExhausted` rather than a reply too large to send.
fn list_dir(path: &Path, depth: u32) -> Result<Vec<Entry>, AgentError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error("list", path, &e))?;
    if !meta.is_dir() {
        return Err(invalid(format!(
            "path '{}' is not a directory",
            path.display()
        )));
    }
    let depth = depth.max(1);
    let too_large = || {
        AgentError::new(
            ErrorKind::ResourceExhausted,
            format!(
                "listing '{}' exceeds {MAX_LIST_ENTRIES} entries or {MAX_LIST_BYTES} bytes; \
                 list a smaller depth or a subdirectory",
                path.display()
            ),
        )
    };
    let mut out = Vec::new();
    let mut bytes = 0usize;
    let mut pending: Vec<(PathBuf, u32)> = vec![(path.to_owned(), 1)];
    while let Some((dir, level)) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if dir == path => return Err(io_error("list", path, &e)),
            // A subdirectory removed or made unreadable meanwhile: list what there is.
            Err(_) => continue,
        };
        for dirent in entries {
            let Ok(dirent) = dirent else { continue };
            let child = dir.join(dirent.file_name());
            // Vanished between readdir and lstat: skip it.
            let Ok(e) = entry_of(&child) else { continue };
            // Symlinks are listed, never followed (a link to a directory shows its type).
            if e.file_type == FileType::Dir && e.symlink_target.is_none() && level < depth {
                pending.push((child, level + 1));
            }
            bytes += encoded_size_bound(&e);
            out.push(e);
            if out.len() > MAX_LIST_ENTRIES || bytes > MAX_LIST_BYTES {
                return Err(too_large());
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Size and use of the sandbox's root file system (its writable layer).
fn disk() -> Result<Reply, AgentError> {
    let space = husk_runtime::sys::statvfs(c"/")
        .map_err(|e| AgentError::new(ErrorKind::Internal, format!("statvfs '/': {e}")))?;
    Ok(Reply::Disk {
        used: space.total.saturating_sub(space.free),
        total: space.total,
    })
}
