//! Mounts, path-based and fd-relative file operations, file-system ids.

use std::ffi::CStr;
use std::io;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::{cvt, cvt_i};

/// mount(2).
pub fn mount(
    source: Option<&CStr>,
    target: &CStr,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let p = |s: Option<&CStr>| s.map_or(std::ptr::null(), |s| s.as_ptr());
    // SAFETY: every pointer is either null or a valid NUL-terminated string that outlives the call.
    cvt_i(unsafe { libc::mount(p(source), target.as_ptr(), p(fstype), flags, p(data).cast()) })?;
    Ok(())
}

/// umount2(2).
pub fn umount2(target: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: `target` is a valid C string.
    cvt_i(unsafe { libc::umount2(target.as_ptr(), flags) })?;
    Ok(())
}

/// pivot_root(2).
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> io::Result<()> {
    // SAFETY: both arguments are valid C strings.
    cvt(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })?;
    Ok(())
}

/// `struct open_how` of openat2(2) (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// openat2(2) with a `RESOLVE_*` mask; `O_CLOEXEC` is always added.
pub fn openat2(
    dirfd: BorrowedFd<'_>,
    path: &CStr,
    flags: libc::c_int,
    mode: u32,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: mode as u64,
        resolve,
    };
    // EAGAIN means a concurrent rename made the kernel unsure the lookup stayed inside the
    // root; retrying is the documented answer, bounded so a hostile sandbox cannot spin us.
    for _ in 0..64 {
        // SAFETY: `how` is a valid open_how of the size passed; `path` is a valid C string.
        let r = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dirfd.as_raw_fd(),
                path.as_ptr(),
                &how as *const OpenHow,
                size_of::<OpenHow>(),
            )
        };
        match cvt(r) {
            // SAFETY: openat2 returned a new fd owned by nobody else.
            Ok(fd) => return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EINTR)) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// open(2) of a host path with O_CLOEXEC.
pub fn open(path: &CStr, flags: libc::c_int, mode: u32) -> io::Result<OwnedFd> {
    // SAFETY: `path` is a valid C string.
    let fd = cvt_i(unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC, mode) })?;
    // SAFETY: open returned a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// mknod(2) of a character device.
pub fn mknod_char(path: &CStr, mode: u32, major: u32, minor: u32) -> io::Result<()> {
    // SAFETY: `path` is a valid C string.
    cvt_i(unsafe {
        libc::mknod(
            path.as_ptr(),
            libc::S_IFCHR | mode,
            libc::makedev(major, minor),
        )
    })?;
    Ok(())
}

/// lsetxattr(2): sets an extended attribute on `path` itself (not a symlink's target).
pub fn lsetxattr(path: &CStr, name: &str, value: &[u8]) -> io::Result<()> {
    let name = std::ffi::CString::new(name)?;
    // SAFETY: `path` and `name` are valid C strings; `value` is valid for `value.len()` bytes.
    cvt_i(unsafe {
        libc::lsetxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })?;
    Ok(())
}

/// getxattr(2) of `path` (following symlinks): `None` where the attribute is not set.
pub fn getxattr(path: &CStr, name: &str) -> io::Result<Option<Vec<u8>>> {
    let name = std::ffi::CString::new(name)?;
    let mut buf = vec![0u8; 256];
    // SAFETY: `path` and `name` are valid C strings; `buf` is valid for `buf.len()` bytes.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENODATA) | Some(libc::EOPNOTSUPP) => Ok(None),
            _ => Err(e),
        };
    }
    buf.truncate(n as usize);
    Ok(Some(buf))
}

/// chown of an open fd.
pub fn fchown(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: no pointers.
    cvt_i(unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) })?;
    Ok(())
}

/// lchown of a path (never follows a final symlink).
pub fn lchown(path: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: `path` is a valid C string.
    cvt_i(unsafe { libc::lchown(path.as_ptr(), uid, gid) })?;
    Ok(())
}

/// Writes `value` to /proc/<pid>/oom_score_adj or similar small proc files.
pub fn write_file(path: &Path, value: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value)
}

/// Opens the lock file `path` read-write, creating it (0600) if missing, never through a
/// symlink, closed at exec; its contents are left as they are.
pub fn create_lock_file(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
}

/// A record lock of `kind` (`F_WRLCK`, `F_RDLCK`) over `len` bytes from `start` (`len` 0: to
/// the end of the file), for [`fcntl_lock`].
pub fn lock_range(kind: libc::c_int, start: libc::off_t, len: libc::off_t) -> libc::flock {
    libc::flock {
        l_type: kind as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: start,
        l_len: len,
        l_pid: 0,
    }
}

/// Whether an open-file-description lock held through another description would keep a write
/// lock of the range from being taken (`F_OFD_GETLK`).
pub fn ofd_range_held(fd: RawFd, start: libc::off_t, len: libc::off_t) -> io::Result<bool> {
    let mut fl = lock_range(libc::F_WRLCK, start, len);
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// fcntl record-lock commands (F_OFD_SETLK / F_OFD_GETLK). For SETLK returns `Ok(false)` when
/// the range is held by someone else.
pub fn fcntl_lock(fd: RawFd, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<bool> {
    // SAFETY: `fl` is a valid flock for the duration of the call.
    let r = unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(true)
}

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// mount_setattr flag: read-only.
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;

/// mount_setattr flag: ignore set-user/group-id bits.
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;

/// mount_setattr flag: no device files.
pub const MOUNT_ATTR_NODEV: u64 = 0x4;

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// A detached copy of the mount tree at `source` (open_tree(OPEN_TREE_CLONE)) with `attrs` set
/// (mount_setattr), id-mapped through `userns` when given: the mount never exists without them.
pub fn detached_clone(
    source: &CStr,
    attrs: u64,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<OwnedFd> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    // SAFETY: `source` is a valid C string; the flags ask for a new detached tree fd.
    let tree = cvt(unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            source.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    })?;
    // SAFETY: open_tree returned a new fd owned by nobody else.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as RawFd) };
    let attr = MountAttr {
        attr_set: attrs | userns.map_or(0, |_| MOUNT_ATTR_IDMAP),
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map_or(0, |u| u.as_raw_fd() as u64),
    };
    // SAFETY: `attr` is a valid mount_attr of the size passed; the empty path with
    // AT_EMPTY_PATH names the tree fd itself.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            size_of::<MountAttr>(),
        )
    })?;
    Ok(tree)
}

/// Bind-mounts `source` onto the mount point `target` (an `O_PATH` fd, so the caller resolved it
/// safely) with `attrs` already set, id-mapped through `userns` when given: a detached copy gets
/// the flags, move_mount attaches it. The mount never exists writable or unmapped.
pub fn bind_onto_fd(
    source: &CStr,
    target: BorrowedFd<'_>,
    attrs: u64,
    userns: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    attach_tree(detached_clone(source, attrs, userns)?.as_fd(), target)
}

/// Attaches the detached tree `tree` ([`detached_clone`]) onto the mount point `target` (an
/// `O_PATH` fd): move_mount(2). The mount point must be in the caller's mount namespace.
pub fn attach_tree(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> io::Result<()> {
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
    // SAFETY: both fds are valid; empty paths with the *_EMPTY_PATH flags name the fds.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// Changes options of the file system whose root `root` is (an fd of the root directory of a
/// mount, attached or not): fspick(2), then fsconfig(2) sets each `(key, value)` and
/// reconfigures the superblock. Unnamed options keep their values.
pub fn reconfigure(root: BorrowedFd<'_>, options: &[(&CStr, &CStr)]) -> io::Result<()> {
    const FSPICK_CLOEXEC: libc::c_uint = 0x1;
    const FSPICK_EMPTY_PATH: libc::c_uint = 0x8;
    const FSCONFIG_SET_STRING: libc::c_uint = 1;
    const FSCONFIG_CMD_RECONFIGURE: libc::c_uint = 7;
    // SAFETY: the empty path with FSPICK_EMPTY_PATH names `root`; a new fd is returned.
    let fc = cvt(unsafe {
        libc::syscall(
            libc::SYS_fspick,
            root.as_raw_fd(),
            c"".as_ptr(),
            FSPICK_CLOEXEC | FSPICK_EMPTY_PATH,
        )
    })?;
    // SAFETY: fspick returned a new fd owned by nobody else.
    let fc = unsafe { OwnedFd::from_raw_fd(fc as RawFd) };
    for (key, value) in options {
        // SAFETY: key and value are valid C strings for the call; aux is unused (0).
        cvt(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fc.as_raw_fd(),
                FSCONFIG_SET_STRING,
                key.as_ptr(),
                value.as_ptr(),
                0,
            )
        })?;
    }
    // SAFETY: no pointers are passed (key and value are null for a command).
    cvt(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fc.as_raw_fd(),
            FSCONFIG_CMD_RECONFIGURE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })?;
    Ok(())
}

/// While alive, file-system operations of the calling thread run as `uid`/`gid` (setfsuid,
/// setfsgid): new files get that owner without a chown each. Dropping restores the previous fs
/// ids (guards nest). Only for husk's set-up code running as host root.
pub struct FsIds {
    prev: (u32, u32),
}

impl FsIds {
    /// Switches the fs ids.
    pub fn enter(uid: u32, gid: u32) -> io::Result<FsIds> {
        // SAFETY: setfsgid/setfsuid take integers only. They return the previous id and cannot
        // report errors, so success is checked by reading the id back (an invalid id, -1,
        // changes nothing and returns the current one).
        unsafe {
            let prev_gid = libc::setfsgid(gid) as u32;
            let prev_uid = libc::setfsuid(uid) as u32;
            if libc::setfsuid(u32::MAX) as u32 != uid || libc::setfsgid(u32::MAX) as u32 != gid {
                libc::setfsuid(prev_uid);
                libc::setfsgid(prev_gid);
                return Err(io::Error::other("setfsuid/setfsgid did not take effect"));
            }
            Ok(FsIds {
                prev: (prev_uid, prev_gid),
            })
        }
    }
}

impl Drop for FsIds {
    fn drop(&mut self) {
        // SAFETY: as in `enter`; going back to ids this process had always succeeds.
        unsafe {
            libc::setfsuid(self.prev.0);
            libc::setfsgid(self.prev.1);
        }
    }
}

/// The space of a file system, in bytes (statvfs(2)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsSpace {
    pub total: u64,
    /// Every free block (`f_bfree`, those reserved for root included), so `total - free` is
    /// the used space as `df` shows it.
    pub free: u64,
    /// What an unprivileged writer can still write (`f_bavail`).
    pub available: u64,
}

/// statvfs(2) of `path`.
pub fn statvfs(path: &CStr) -> io::Result<FsSpace> {
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a valid C string and `st` is a valid out-buffer for one statvfs.
    cvt_i(unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: statvfs succeeded and filled the buffer (it was zeroed before, too).
    let st = unsafe { st.assume_init() };
    // All are u64 on the 64-bit targets husk supports.
    let frsize = st.f_frsize;
    Ok(FsSpace {
        total: st.f_blocks.saturating_mul(frsize),
        free: st.f_bfree.saturating_mul(frsize),
        available: st.f_bavail.saturating_mul(frsize),
    })
}

/// mount_setattr flag: the mount's ids are mapped through a user namespace.
pub const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Mounts an id-mapped view of the tree at `source` on `target`: a detached clone
/// (open_tree), given `attrs` and the id mapping of user namespace `userns` (mount_setattr),
/// attached at `target` (move_mount). Files owned by id N in the source appear owned by the
/// host id that `userns` maps N to, so a sandbox with the same mapping sees them as N.
pub fn idmapped_mount(
    source: &CStr,
    userns: BorrowedFd<'_>,
    attrs: u64,
    target: &CStr,
) -> io::Result<()> {
    let tree = detached_clone(source, attrs, Some(userns))?;
    // SAFETY: the tree fd is valid, `target` a valid C string; the empty source path with
    // MOVE_MOUNT_F_EMPTY_PATH names the tree fd.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    })?;
    Ok(())
}

/// The file-system type magic of the file system `path` is on (statfs(2) `f_type`).
pub fn statfs_type(path: &CStr) -> io::Result<i64> {
    // SAFETY: an all-zero statfs is a valid value of the plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `st` a valid out-pointer.
    cvt_i(unsafe { libc::statfs(path.as_ptr(), &mut st) })?;
    Ok(st.f_type as i64)
}

/// `struct loop_info64` of <linux/loop.h>.
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` of <linux/loop.h>.
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// Attaches `file` (an open, read-only file) to a free loop device, read-only and
/// auto-clearing (the device detaches when its last user, the mount, goes away); returns the
/// device's path and an open fd of it, to keep until the device is mounted (closing the last
/// fd of an unused auto-clearing device detaches it at once). For kernels that cannot mount an
/// erofs image file directly.
pub fn loop_attach_ro(file: BorrowedFd<'_>) -> io::Result<(std::path::PathBuf, OwnedFd)> {
    const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
    const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
    const LO_FLAGS_READ_ONLY: u32 = 1;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;
    let ctl = open(c"/dev/loop-control", libc::O_RDWR, 0)?;
    // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number.
    let n = cvt_i(unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) })?;
    let path = std::path::PathBuf::from(format!("/dev/loop{n}"));
    let dev = open(&super::cpath(&path)?, libc::O_RDWR, 0)?;
    // SAFETY: an all-zero loop_config is valid (the plain C struct has no invariants).
    let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
    cfg.fd = file.as_raw_fd() as u32;
    cfg.info.flags = LO_FLAGS_READ_ONLY | LO_FLAGS_AUTOCLEAR;
    // SAFETY: `cfg` is a valid loop_config that outlives the call.
    cvt_i(unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &cfg as *const LoopConfig) })?;
    Ok((path, dev))
}

/// Where the next data (`SEEK_DATA`) or hole (`SEEK_HOLE`) of file `fd` starts at or after
/// `from`: `Ok(None)` when there is no more data (`ENXIO`).
pub fn seek_extent(fd: BorrowedFd<'_>, from: u64, whence: i32) -> io::Result<Option<u64>> {
    let from =
        libc::off_t::try_from(from).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `fd` is a valid open file descriptor; lseek only moves its offset.
    let at = unsafe { libc::lseek(fd.as_raw_fd(), from, whence) };
    if at < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok(Some(at as u64))
}

/// syncfs(2): writes out everything cached for the file system `fd` is on.
pub fn syncfs(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: `fd` is a valid open file descriptor.
    cvt_i(unsafe { libc::syncfs(fd.as_raw_fd()) })?;
    Ok(())
}
