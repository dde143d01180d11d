//! Directory-fd-relative file operations that act on an entry itself, never on what a symlink
//! points to: the building blocks for working in a tree that someone else may be changing at
//! the same time (a workspace a sandbox has mounted). Each takes a directory fd and one name
//! in it; lookups through several components go through [`super::openat2`] instead.

use std::ffi::{CStr, CString};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd};
use std::ptr::NonNull;

use super::{cvt, cvt_i};

/// What `lstat` says about an entry (the fields husk uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    /// Type and permission bits (`st_mode`).
    pub mode: u32,
    /// Size in bytes (for a symlink, the length of its target).
    pub size: u64,
    /// Last modification, seconds since the epoch.
    pub mtime: i64,
    /// Nanoseconds of `mtime`.
    pub mtime_nsec: i64,
    /// Last access, seconds since the epoch, and its nanoseconds.
    pub atime: i64,
    pub atime_nsec: i64,
    /// Last status change, seconds since the epoch, and its nanoseconds.
    pub ctime: i64,
    pub ctime_nsec: i64,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub ino: u64,
    pub dev: u64,
}

impl FileStat {
    /// The type bits (`mode & S_IFMT`).
    pub fn file_type(&self) -> u32 {
        self.mode & libc::S_IFMT
    }

    pub fn is_dir(&self) -> bool {
        self.file_type() == libc::S_IFDIR
    }

    pub fn is_file(&self) -> bool {
        self.file_type() == libc::S_IFREG
    }

    pub fn is_symlink(&self) -> bool {
        self.file_type() == libc::S_IFLNK
    }
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: a symlink is described, not followed. An empty
/// `name` describes `dir` itself (`AT_EMPTY_PATH`; works on `O_PATH` fds too).
pub fn fstatat_nofollow(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<FileStat> {
    let mut flags = libc::AT_SYMLINK_NOFOLLOW;
    if name.is_empty() {
        flags |= libc::AT_EMPTY_PATH;
    }
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `name` is a valid C string and `st` a valid out-buffer for one stat.
    cvt_i(unsafe { libc::fstatat(dir.as_raw_fd(), name.as_ptr(), st.as_mut_ptr(), flags) })?;
    // SAFETY: fstatat succeeded and filled the buffer (it was zeroed before, too).
    let st = unsafe { st.assume_init() };
    Ok(FileStat {
        mode: st.st_mode,
        size: st.st_size as u64,
        mtime: st.st_mtime,
        mtime_nsec: st.st_mtime_nsec,
        atime: st.st_atime,
        atime_nsec: st.st_atime_nsec,
        ctime: st.st_ctime,
        ctime_nsec: st.st_ctime_nsec,
        uid: st.st_uid,
        gid: st.st_gid,
        nlink: st.st_nlink,
        ino: st.st_ino,
        dev: st.st_dev,
    })
}

/// `mkdirat(2)`: never follows a final symlink (an existing entry of any kind is `EEXIST`).
/// The umask applies to `mode`.
pub fn mkdirat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    cvt_i(unsafe { libc::mkdirat(dir.as_raw_fd(), name.as_ptr(), mode) })?;
    Ok(())
}

/// `unlinkat(2)`: removes the entry itself (a symlink, not its target); `rmdir` semantics
/// (an empty directory only) when `is_dir`.
pub fn unlinkat(dir: BorrowedFd<'_>, name: &CStr, is_dir: bool) -> io::Result<()> {
    let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
    // SAFETY: `name` is a valid C string.
    cvt_i(unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), flags) })?;
    Ok(())
}

/// `renameat2(2)`: moves the entry itself (a symlink is moved, never followed). With
/// `noreplace` an existing destination is `EEXIST`; otherwise a non-directory destination is
/// replaced atomically.
pub fn renameat(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
    noreplace: bool,
) -> io::Result<()> {
    let flags: libc::c_uint = if noreplace { libc::RENAME_NOREPLACE } else { 0 };
    // SAFETY: both names are valid C strings; the fds are valid for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            flags,
        )
    })?;
    Ok(())
}

/// `symlinkat(2)`: creates `name` in `dir` pointing at `target` (stored as is, never
/// resolved); an existing `name` is `EEXIST`.
pub fn symlinkat(target: &CStr, dir: BorrowedFd<'_>, name: &CStr) -> io::Result<()> {
    // SAFETY: both strings are valid C strings.
    cvt_i(unsafe { libc::symlinkat(target.as_ptr(), dir.as_raw_fd(), name.as_ptr()) })?;
    Ok(())
}

/// `fchownat(dir, name, AT_SYMLINK_NOFOLLOW)`: changes the owner of the entry itself.
pub fn fchownat_nofollow(dir: BorrowedFd<'_>, name: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    cvt_i(unsafe {
        libc::fchownat(
            dir.as_raw_fd(),
            name.as_ptr(),
            uid,
            gid,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    Ok(())
}

/// `readlinkat(2)`: a symlink's target, as stored. Targets are shorter than `PATH_MAX`; a
/// full buffer is reported (`ENAMETOOLONG`) rather than truncated.
pub fn readlinkat(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: `name` is a valid C string and `buf` has `buf.len()` writable bytes, the most
    // readlinkat writes.
    let len = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    let len = usize::try_from(len).map_err(|_| io::Error::last_os_error())?;
    if len >= buf.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    buf.truncate(len);
    Ok(buf)
}

/// Owns a `DIR*`, closed on drop.
struct Dir(NonNull<libc::DIR>);

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: the stream came from fdopendir and is closed exactly once.
        unsafe { libc::closedir(self.0.as_ptr()) };
    }
}

/// The names in the directory open at `dir` (an fd opened for reading, not `O_PATH`), from its
/// start, without `.` and `..`, in directory order: at most `max` of them, and whether there
/// were more. A hostile directory cannot make this use more memory than `max` names.
pub fn read_dir_names(dir: BorrowedFd<'_>, max: usize) -> io::Result<(Vec<CString>, bool)> {
    // fdopendir takes its fd over: give it a duplicate so `dir` stays usable. The duplicate
    // shares the file offset, hence the rewind.
    let raw = dir.try_clone_to_owned()?.into_raw_fd();
    // SAFETY: `raw` is an open fd that we own; on success the stream owns it.
    let ptr = unsafe { libc::fdopendir(raw) };
    let Some(ptr) = NonNull::new(ptr) else {
        let err = io::Error::last_os_error();
        // SAFETY: fdopendir failed, so `raw` is still ours alone to close.
        drop(unsafe { OwnedFd::from_raw_fd(raw) });
        return Err(err);
    };
    let stream = Dir(ptr);
    // SAFETY: the stream is valid.
    unsafe { libc::rewinddir(stream.0.as_ptr()) };
    let mut names = Vec::new();
    loop {
        // SAFETY: errno is thread-local; zeroing it tells the end of the stream (NULL, errno
        // untouched) from an error (NULL, errno set).
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: the stream is valid and used by this thread only.
        let ent = unsafe { libc::readdir64(stream.0.as_ptr()) };
        if ent.is_null() {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(0) {
                return Ok((names, false));
            }
            return Err(err);
        }
        // SAFETY: readdir64 returned a valid entry whose d_name is NUL-terminated and valid
        // until the next readdir64 call; it is copied before then. addr_of! avoids asserting
        // the declared array size.
        let name = unsafe { CStr::from_ptr(std::ptr::addr_of!((*ent).d_name).cast()) };
        if name == c"." || name == c".." {
            continue;
        }
        if names.len() == max {
            return Ok((names, true));
        }
        names.push(name.to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    fn tempdir() -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!(
            "husk-dirfd-{}-{:x}",
            std::process::id(),
            super::super::random_u64().unwrap()
        ));
        std::fs::create_dir(&p).unwrap();
        p
    }

    #[test]
    fn entries_are_acted_on_never_followed() {
        let p = tempdir();
        let d = File::open(&p).unwrap();
        let fd = d.as_fd();
        mkdirat(fd, c"sub", 0o755).unwrap();
        assert_eq!(
            mkdirat(fd, c"sub", 0o755).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        symlinkat(c"/etc/passwd", fd, c"link").unwrap();
        let st = fstatat_nofollow(fd, c"link").unwrap();
        assert!(st.is_symlink() && st.size == 11);
        assert!(fstatat_nofollow(fd, c"sub").unwrap().is_dir());
        assert!(fstatat_nofollow(fd, c"").unwrap().is_dir());
        assert_eq!(readlinkat(fd, c"link").unwrap(), b"/etc/passwd");
        fchownat_nofollow(fd, c"link", 1000, 1000).unwrap();
        assert_eq!(fstatat_nofollow(fd, c"link").unwrap().uid, 1000);
        // The file the link names keeps its owner.
        assert_eq!(std::fs::metadata("/etc/passwd").unwrap().uid(), 0);
        std::fs::write(p.join("f"), b"x").unwrap();
        assert_eq!(
            renameat(fd, c"f", fd, c"link", true)
                .unwrap_err()
                .raw_os_error(),
            Some(libc::EEXIST)
        );
        renameat(fd, c"f", fd, c"link", false).unwrap();
        assert!(fstatat_nofollow(fd, c"link").unwrap().is_file());
        let (names, more) = read_dir_names(fd, 10).unwrap();
        assert!(!more);
        assert_eq!(names.len(), 2);
        let (names, more) = read_dir_names(fd, 1).unwrap();
        assert!(more && names.len() == 1);
        // Listing again starts over.
        assert_eq!(read_dir_names(fd, 10).unwrap().0.len(), 2);
        unlinkat(fd, c"link", false).unwrap();
        unlinkat(fd, c"sub", true).unwrap();
        assert!(read_dir_names(fd, 10).unwrap().0.is_empty());
        std::fs::remove_dir(&p).unwrap();
    }
}
