//! Syscalls that only ask the kernel whether it has a feature (see [`crate::probe`]): each
//! either changes nothing or is made to fail before it could.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::{cvt, cvt_i};

/// pidfd_open(2) of the calling process (Linux 5.3).
pub fn pidfd_open_self() -> io::Result<OwnedFd> {
    // SAFETY: integer arguments only.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) })?;
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Whether `waitid(P_PIDFD)` is known (Linux 5.4): asked about the process's own pidfd, which
/// is never its child, a kernel that knows P_PIDFD says ECHILD, an older one EINVAL.
pub fn waitid_pidfd_known(pidfd: &OwnedFd) -> io::Result<()> {
    let mut info = std::mem::MaybeUninit::<libc::siginfo_t>::zeroed();
    // SAFETY: `info` is a valid, zeroed out-buffer for one siginfo_t.
    let r = unsafe {
        libc::waitid(
            libc::P_PIDFD,
            pidfd.as_raw_fd() as libc::id_t,
            info.as_mut_ptr(),
            libc::WEXITED | libc::WNOHANG,
        )
    };
    match (r, io::Error::last_os_error().raw_os_error()) {
        (0, _) | (_, Some(libc::ECHILD)) => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Whether clone3(2) knows `CLONE_INTO_CGROUP` (Linux 5.7), asked so that no process can be
/// created: the cgroup is an fd of `/dev/null`, which a kernel that knows the flag refuses with
/// EBADF before forking; an older kernel says EINVAL or E2BIG, one without clone3 ENOSYS.
pub fn clone_into_cgroup_known() -> io::Result<()> {
    let not_a_cgroup = super::open(c"/dev/null", libc::O_RDONLY, 0)?;
    let args = super::process::CloneArgs {
        flags: super::process::CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: not_a_cgroup.as_raw_fd() as u64,
        ..Default::default()
    };
    // SAFETY: `args` is a valid clone_args of the size passed. Its cgroup fd is not a cgroup
    // directory, so the kernel fails the call (EBADF) before a child exists; were one ever
    // created, it gets 0 and leaves at once through _exit, touching nothing of the parent's.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const super::process::CloneArgs,
            size_of::<super::process::CloneArgs>(),
        )
    };
    if r == 0 {
        super::exit_now(0);
    }
    let err = io::Error::last_os_error();
    match (r, err.raw_os_error()) {
        (_, Some(libc::EBADF)) => Ok(()),
        (r, _) if r > 0 => {
            let _ = super::waitpid(r as libc::pid_t, 0);
            Ok(())
        }
        _ => Err(err),
    }
}

/// The seccomp mode of the calling thread (prctl PR_GET_SECCOMP): EINVAL without
/// CONFIG_SECCOMP.
pub fn seccomp_mode() -> io::Result<i32> {
    // SAFETY: integer arguments only.
    cvt_i(unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) })
}

/// seccomp(SECCOMP_GET_ACTION_AVAIL): whether a filter may return `action` (e.g.
/// `SECCOMP_RET_USER_NOTIF`, Linux 5.0).
pub fn seccomp_action_available(action: u32) -> io::Result<()> {
    const SECCOMP_GET_ACTION_AVAIL: libc::c_ulong = 2;
    // SAFETY: the kernel reads one u32 from the pointer, which points at `action`.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            SECCOMP_GET_ACTION_AVAIL,
            0,
            &action as *const u32,
        )
    })?;
    Ok(())
}

/// The caller's real and effective uid.
pub fn uids() -> (u32, u32) {
    // SAFETY: no arguments; these calls cannot fail.
    unsafe { (libc::getuid(), libc::geteuid()) }
}

/// The running kernel's release (`uname -r`).
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
