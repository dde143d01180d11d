//! Thin fd-relative syscall wrappers. Each takes a directory fd plus one
//! path component (or a path resolved under openat2's resolve flags), so no
//! host path string is ever joined with a sandbox path.

use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use super::{Side, SkipKind};

/// Resolve flags for every lookup: symlinks and magic links are never
/// followed; sandbox paths are clamped to the root, host paths to beneath.
fn resolve_flags(side: Side) -> u64 {
    let scope = match side {
        Side::Sandbox => libc::RESOLVE_IN_ROOT,
        Side::Host => libc::RESOLVE_BENEATH,
    };
    scope | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS
}

/// `openat2` relative to `dir`; `O_CLOEXEC` is always added. `mode` only
/// matters with `O_CREAT` (the kernel rejects a non-zero mode otherwise).
pub(super) fn open_at(
    dir: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
    mode: libc::mode_t,
    side: Side,
) -> io::Result<OwnedFd> {
    crate::sys::openat2(dir, path, flags, mode, resolve_flags(side))
}

/// Maps `-1` returns to the thread's errno.
fn check(ret: libc::c_int) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// File types we distinguish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    File,
    Dir,
    Symlink,
    /// Never opened, only reported.
    Special(Special),
}

/// Special files: opening one could block (FIFO) or have side effects (device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Special {
    Device,
    Fifo,
    Socket,
}

impl Kind {
    pub(super) fn from_mode(mode: u32) -> Kind {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Special(Special::Fifo),
            libc::S_IFSOCK => Kind::Special(Special::Socket),
            // Char/block devices, and anything unknown: never opened either way.
            _ => Kind::Special(Special::Device),
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Kind::File => "regular file",
            Kind::Dir => "directory",
            Kind::Symlink => "symlink",
            Kind::Special(Special::Device) => "device",
            Kind::Special(Special::Fifo) => "fifo",
            Kind::Special(Special::Socket) => "socket",
        }
    }
}

impl From<Special> for SkipKind {
    fn from(special: Special) -> SkipKind {
        match special {
            Special::Device => SkipKind::Device,
            Special::Fifo => SkipKind::Fifo,
            Special::Socket => SkipKind::Socket,
        }
    }
}

/// `lstat` of `name` in `dir`: the type and permission bits.
pub(super) fn stat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<(Kind, u32)> {
    let mut st = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated and `st` is writable memory of the
    // right type; AT_SYMLINK_NOFOLLOW describes a symlink, never its target.
    let ret = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    check(ret)?;
    // SAFETY: fstatat succeeded, so it initialised the whole struct.
    let st = unsafe { st.assume_init() };
    Ok((Kind::from_mode(st.st_mode), st.st_mode))
}

pub(super) fn mkdir_at(dir: BorrowedFd<'_>, name: &CStr, mode: libc::mode_t) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; mkdirat never follows a final symlink.
    check(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })
}

/// Removes a non-directory entry itself (a symlink is removed, not followed).
pub(super) fn unlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; unlinkat acts on the entry itself.
    check(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) })
}

pub(super) fn symlink_at(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are NUL-terminated; symlinkat fails on an existing name.
    check(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })
}

/// Changes the owner of `name` itself, never of what a symlink points to.
pub(super) fn lchown_at(dir: BorrowedFd<'_>, name: &CStr, owner: (u32, u32)) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated; AT_SYMLINK_NOFOLLOW keeps us on the entry.
    check(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            owner.0,
            owner.1,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// Reads a symlink's target (see [`crate::sys::readlinkat`]).
pub(super) fn readlink_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    crate::sys::readlinkat(dir, name)
}

/// Lists the names in the directory open at `dir` (not `.`/`..`), sorted.
/// Stops after `max + 1` names so a hostile directory cannot exhaust memory;
/// callers treat more than `max` as over their limit.
pub(super) fn list_dir(dir: BorrowedFd<'_>, max: u64) -> io::Result<Vec<CString>> {
    let bound = usize::try_from(max).unwrap_or(usize::MAX).saturating_add(1);
    let (mut names, _more) = crate::sys::read_dir_names(dir, bound)?;
    names.sort();
    Ok(names)
}
