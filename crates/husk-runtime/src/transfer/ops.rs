//! Building blocks shared by `copy_out` and `copy_in`: fd-relative file and
//! directory operations whose errors name the path and side concerned.

use std::ffi::{CStr, CString, OsStr};
use std::fs::{File, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::sys::{self, Kind};
use super::{Side, TransferError};

/// Deepest directory nesting we recurse into. Each level holds two fds, so
/// this also keeps us far from the usual 1024-fd soft limit.
pub(super) const MAX_DEPTH: usize = 128;
/// Mode of directories created inside the sandbox.
pub(super) const SANDBOX_DIR_MODE: u32 = 0o755;
/// Copy buffer size: large enough for throughput, small enough to bound memory.
pub(super) const BUF_SIZE: usize = 128 * 1024;

/// Builds the `map_err` closure for a failed syscall on `path`.
pub(super) fn io_err(
    op: &'static str,
    side: Side,
    path: &Path,
) -> impl FnOnce(io::Error) -> TransferError {
    let path = path.to_path_buf();
    move |source| TransferError::Io {
        op,
        side,
        path,
        source,
    }
}

/// A directory entry name as a path component.
pub(super) fn name_path(name: &CStr) -> &Path {
    Path::new(OsStr::from_bytes(name.to_bytes()))
}

/// Splits an absolute sandbox path into its components. `..` is refused so
/// that what we touch is exactly what was named (openat2 would clamp it to
/// the root anyway, but silently).
pub(super) fn sandbox_components(path: &Path) -> Result<Vec<CString>, TransferError> {
    let invalid = |reason| TransferError::InvalidPath {
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_absolute() {
        return Err(invalid("must be absolute"));
    }
    let mut comps = Vec::new();
    for comp in path.components() {
        match comp {
            Component::Normal(name) => comps
                .push(CString::new(name.as_bytes()).map_err(|_| invalid("contains a NUL byte"))?),
            Component::ParentDir => return Err(invalid("must not contain `..`")),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(comps)
}

/// Opens the sandbox root directory itself, readable for listing.
pub(super) fn open_sandbox_root(root: BorrowedFd<'_>) -> Result<File, TransferError> {
    sys::open_at(
        root,
        c"/",
        libc::O_RDONLY | libc::O_DIRECTORY,
        0,
        Side::Sandbox,
    )
    .map(File::from)
    .map_err(io_err("open", Side::Sandbox, Path::new("/")))
}

/// Opens the sandbox directory named by `comps` one component at a time, so
/// an error names the exact offending component. With `create`, missing
/// directories are made [`SANDBOX_DIR_MODE`] and chowned to the given owner.
pub(super) fn walk_sandbox(
    root: BorrowedFd<'_>,
    comps: &[CString],
    full: &Path,
    create: Option<(u32, u32)>,
) -> Result<OwnedFd, TransferError> {
    let mut cur =
        root.try_clone_to_owned()
            .map_err(io_err("duplicate root fd for", Side::Sandbox, full))?;
    let mut prefix = PathBuf::from("/");
    for name in comps {
        prefix.push(name_path(name));
        // O_PATH: we only need a dirfd. No O_NOFOLLOW (O_PATH|O_NOFOLLOW would
        // open a symlink itself); RESOLVE_NO_SYMLINKS makes one fail instead.
        let flags = libc::O_PATH | libc::O_DIRECTORY;
        cur = match sys::open_at(cur.as_fd(), name, flags, 0, Side::Sandbox) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => match create {
                None => {
                    return Err(TransferError::NotFound {
                        path: full.to_path_buf(),
                    })
                }
                Some(owner) => {
                    let (dir, created) = ensure_dir(cur.as_fd(), name, Side::Sandbox, &prefix)?;
                    // Someone else's concurrent mkdir keeps its owner.
                    if created {
                        chown(&dir, owner, &prefix)?;
                        set_mode(&dir, SANDBOX_DIR_MODE, Side::Sandbox, &prefix)?;
                    }
                    dir.into()
                }
            },
            Err(e) => return Err(open_dir_error(e, Side::Sandbox, &prefix)),
        };
    }
    Ok(cur)
}

/// Classifies why opening a directory failed.
fn open_dir_error(err: io::Error, side: Side, path: &Path) -> TransferError {
    let path = path.to_path_buf();
    match (err.raw_os_error(), side) {
        (Some(libc::ELOOP), Side::Sandbox) => TransferError::Symlink { path },
        (Some(libc::ELOOP | libc::ENOTDIR), _) => TransferError::NotADirectory { side, path },
        _ => TransferError::Io {
            op: "open directory",
            side,
            path,
            source: err,
        },
    }
}

/// `lstat` of `name` in `dir`; `None` if it does not exist.
pub(super) fn lookup(
    dir: BorrowedFd<'_>,
    name: &CStr,
    side: Side,
    path: &Path,
) -> Result<Option<(Kind, u32)>, TransferError> {
    match sys::stat_at(dir, name) {
        Ok(found) => Ok(Some(found)),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(None),
        Err(e) => Err(io_err("stat", side, path)(e)),
    }
}

/// Opens directory `name` in `dir` for listing, never through a symlink.
pub(super) fn open_dir(
    dir: BorrowedFd<'_>,
    name: &CStr,
    side: Side,
    path: &Path,
) -> Result<File, TransferError> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    sys::open_at(dir, name, flags, 0, side)
        .map(File::from)
        .map_err(|e| open_dir_error(e, side, path))
}

/// Opens directory `name` in `dir`, creating it (mode 0700 until the caller
/// sets the final mode) if missing; reports whether it was created.
pub(super) fn ensure_dir(
    dir: BorrowedFd<'_>,
    name: &CStr,
    side: Side,
    path: &Path,
) -> Result<(File, bool), TransferError> {
    let created = match lookup(dir, name, side, path)? {
        Some((Kind::Dir, _)) => false,
        Some((Kind::Symlink, _)) if side == Side::Sandbox => {
            return Err(TransferError::Symlink {
                path: path.to_path_buf(),
            })
        }
        Some(_) => {
            return Err(TransferError::NotADirectory {
                side,
                path: path.to_path_buf(),
            })
        }
        None => match sys::mkdir_at(dir, name, 0o700) {
            Ok(()) => true,
            // Lost a race with a concurrent mkdir: not ours (its mode is left alone), and
            // open_dir re-checks the type.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => false,
            Err(e) => return Err(io_err("create directory", side, path)(e)),
        },
    };
    Ok((open_dir(dir, name, side, path)?, created))
}

/// Creates file `name` in `dir` with O_CREAT|O_EXCL|O_NOFOLLOW (mode 0600
/// until the caller sets it), so we never write through an existing entry.
/// An existing regular file is unlinked first (not truncated: it may be a
/// hard link to something else). In the sandbox an existing symlink is
/// replaced too (removing a link never touches its target); on the host a
/// symlink is not ours to remove, so it is an error, like any other kind.
pub(super) fn create_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    side: Side,
    path: &Path,
) -> Result<File, TransferError> {
    clear_slot(dir, name, side, path)?;
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
    sys::open_at(dir, name, flags, 0o600, side)
        .map(File::from)
        .map_err(io_err("create", side, path))
}

/// Makes room for a new non-directory `name` in `dir` (see [`create_file`]).
pub(super) fn clear_slot(
    dir: BorrowedFd<'_>,
    name: &CStr,
    side: Side,
    path: &Path,
) -> Result<(), TransferError> {
    match lookup(dir, name, side, path)? {
        None => Ok(()),
        Some((Kind::File, _)) => sys::unlink_at(dir, name).map_err(io_err("remove", side, path)),
        Some((Kind::Symlink, _)) if side == Side::Sandbox => {
            sys::unlink_at(dir, name).map_err(io_err("remove", side, path))
        }
        Some((kind, _)) => Err(TransferError::Exists {
            side,
            path: path.to_path_buf(),
            kind: kind.name(),
        }),
    }
}

/// Opens `name` in `dir` for reading without following a symlink and without
/// blocking should it have been swapped for a FIFO; returns the file with
/// its type, permission bits and size as seen by fstat after the open.
pub(super) fn open_for_read(
    dir: BorrowedFd<'_>,
    name: &CStr,
    side: Side,
    path: &Path,
) -> Result<(File, Kind, u32, u64), TransferError> {
    let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY;
    let file = match sys::open_at(dir, name, flags, 0, side) {
        Ok(fd) => File::from(fd),
        // We saw a regular file a moment ago; a symlink now means a swap.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(TransferError::Raced {
                side,
                path: path.to_path_buf(),
            })
        }
        Err(e) => return Err(io_err("open", side, path)(e)),
    };
    let meta = file.metadata().map_err(io_err("stat", side, path))?;
    Ok((file, Kind::from_mode(meta.mode()), meta.mode(), meta.len()))
}

/// Source and destination of one file copy, for error messages.
pub(super) struct Ends<'a> {
    pub(super) src: (Side, &'a Path),
    pub(super) dst: (Side, &'a Path),
}

/// Copies at most `size` bytes (the size fstat reported at open), so a file
/// that keeps growing while we read cannot make us copy more than we checked
/// against the limits. Returns the bytes copied (less if the file shrank).
pub(super) fn copy_bounded(
    src: &mut File,
    dst: &mut impl Write,
    size: u64,
    buf: &mut [u8],
    ends: &Ends<'_>,
) -> Result<u64, TransferError> {
    let mut done = 0u64;
    while done < size {
        let want = buf
            .len()
            .min(usize::try_from(size - done).unwrap_or(usize::MAX));
        let n = match src.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("read", ends.src.0, ends.src.1)(e)),
        };
        dst.write_all(&buf[..n])
            .map_err(io_err("write", ends.dst.0, ends.dst.1))?;
        done += n as u64;
    }
    Ok(done)
}

/// fchmod; bypasses the umask, and only ever gets permission bits.
pub(super) fn set_mode(
    file: &File,
    mode: u32,
    side: Side,
    path: &Path,
) -> Result<(), TransferError> {
    file.set_permissions(Permissions::from_mode(mode & 0o777))
        .map_err(io_err("set permissions of", side, path))
}

/// fchown of a sandbox entry we created.
pub(super) fn chown(file: &File, owner: (u32, u32), path: &Path) -> Result<(), TransferError> {
    chown_on(file, owner, Side::Sandbox, path)
}

/// fchown of an entry we created on `side`.
pub(super) fn chown_on(
    file: &File,
    owner: (u32, u32),
    side: Side,
    path: &Path,
) -> Result<(), TransferError> {
    std::os::unix::fs::fchown(file, Some(owner.0), Some(owner.1))
        .map_err(io_err("chown", side, path))
}
