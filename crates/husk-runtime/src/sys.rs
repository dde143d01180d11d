//! Thin, safe wrappers over the raw syscalls the runtime needs. Every `unsafe` in the runtime's
//! sandbox set-up lives here, so the invariants are reviewed in one place; the functions take
//! and return std types (`CStr`, `OwnedFd`, `io::Result`).

use std::ffi::{CStr, CString};
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_i(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A path as a C string; paths with interior NULs are rejected, not truncated.
pub fn cpath(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

/// `struct clone_args` of clone3(2), for the fields husk uses.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// The result of [`clone3_fork`].
pub enum Forked {
    /// In the parent: the child's pid and a pidfd for it.
    Parent { pid: libc::pid_t, pidfd: OwnedFd },
    /// In the child.
    Child,
}

/// Number of threads of the calling process (from the link count of `/proc/self/task`, which is
/// two plus the threads: one stat, no parsing).
pub fn thread_count() -> io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    Ok(std::fs::metadata("/proc/self/task")?
        .nlink()
        .saturating_sub(2))
}

/// fork(2) into new namespaces with clone3(2), returning a pidfd in the parent.
///
/// # Safety
/// The calling process must be single-threaded: the child is a copy of the calling thread
/// only, and a lock another thread held (the allocator's, say) would stay locked in it forever.
///
/// With `cgroup` (an fd of a cgroup v2 directory) the child is born in that cgroup
/// (`CLONE_INTO_CGROUP`), which is cheaper than migrating it afterwards.
pub unsafe fn clone3_fork(
    namespaces: libc::c_int,
    cgroup: Option<BorrowedFd<'_>>,
) -> io::Result<Forked> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: namespaces as u64 | libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    if let Some(cg) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = cg.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid clone_args of the size passed; no stack is given, so the child
    // continues on a copy of this thread's stack exactly like fork(2). The caller guarantees the
    // process is single-threaded (this function's safety contract).
    let pid = cvt(unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            size_of::<CloneArgs>(),
        )
    })?;
    if pid == 0 {
        return Ok(Forked::Child);
    }
    // SAFETY: on success the kernel stored a fresh pidfd that nothing else owns.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Forked::Parent {
        pid: pid as libc::pid_t,
        pidfd,
    })
}

/// Plain fork(2). Returns 0 in the child.
///
/// # Safety
/// Same contract as [`clone3_fork`]: the calling process must be single-threaded.
pub unsafe fn fork() -> io::Result<libc::pid_t> {
    // SAFETY: fork itself has no memory-safety preconditions; the caller guarantees the
    // process is single-threaded, so the child's copy of memory is consistent.
    cvt_i(unsafe { libc::fork() })
}

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

/// unshare(2).
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes no pointers.
    cvt_i(unsafe { libc::unshare(flags) })?;
    Ok(())
}

/// sethostname(2) (in the caller's UTS namespace).
pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes.
    cvt_i(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })?;
    Ok(())
}

/// setresuid/setresgid/setgroups: become `uid`/`gid` with no supplementary groups.
pub fn become_user(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setgroups with size 0 reads no memory; the id calls take plain integers.
    unsafe {
        cvt_i(libc::setgroups(0, std::ptr::null()))?;
        cvt_i(libc::setresgid(gid, gid, gid))?;
        cvt_i(libc::setresuid(uid, uid, uid))?;
    }
    Ok(())
}

/// prctl(PR_SET_PDEATHSIG).
pub fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes an integer argument only.
    cvt_i(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) })?;
    Ok(())
}

/// The calling process's pid.
pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid cannot fail and takes no arguments.
    unsafe { libc::getpid() }
}

/// The calling process's parent pid.
pub fn getppid() -> libc::pid_t {
    // SAFETY: getppid cannot fail and takes no arguments.
    unsafe { libc::getppid() }
}

/// setsid(2): a new session, detached from any controlling terminal.
pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    cvt_i(unsafe { libc::setsid() })?;
    Ok(())
}

/// kill(2).
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers.
    cvt_i(unsafe { libc::kill(pid, sig) })?;
    Ok(())
}

/// pidfd_send_signal(2): signal a process through its pidfd (immune to pid reuse).
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: null siginfo is allowed; the fd is valid for the call.
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })?;
    Ok(())
}

/// How a child ended, as waitpid reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    Exited(i32),
    Signaled(i32),
}

impl ExitStatus {
    fn from_wait(status: libc::c_int) -> Self {
        if libc::WIFSIGNALED(status) {
            ExitStatus::Signaled(libc::WTERMSIG(status))
        } else {
            ExitStatus::Exited(libc::WEXITSTATUS(status))
        }
    }

    /// The shell convention: the exit code, or 128 + signal.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Exited(c) => c,
            ExitStatus::Signaled(s) => 128 + s,
        }
    }
}

/// waitpid(pid, flags); `Ok(None)` when WNOHANG finds nothing.
pub fn waitpid(
    pid: libc::pid_t,
    flags: libc::c_int,
) -> io::Result<Option<(libc::pid_t, ExitStatus)>> {
    let mut status = 0;
    // SAFETY: `status` is a valid out-pointer.
    let r = cvt_i(unsafe { libc::waitpid(pid, &mut status, flags) })?;
    if r == 0 {
        return Ok(None);
    }
    Ok(Some((r, ExitStatus::from_wait(status))))
}

/// waitid(P_PIDFD, ...): reap the child behind a pidfd; `Ok(None)` if it has not exited and
/// `nohang` is set.
pub fn waitid_pidfd(pidfd: BorrowedFd<'_>, nohang: bool) -> io::Result<Option<ExitStatus>> {
    let mut info = MaybeUninit::<libc::siginfo_t>::zeroed();
    let flags = libc::WEXITED | if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: `info` is a valid, zeroed out-buffer for a siginfo_t.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                info.as_mut_ptr(),
                flags,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break;
    }
    // SAFETY: waitid succeeded, so the buffer is initialised (zeroed when nothing was reaped).
    let info = unsafe { info.assume_init() };
    // SAFETY: for WEXITED results the kernel fills si_pid and si_status.
    let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
    if pid == 0 {
        return Ok(None);
    }
    Ok(Some(if info.si_code == libc::CLD_EXITED {
        ExitStatus::Exited(status)
    } else {
        ExitStatus::Signaled(status)
    }))
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

/// A pipe with both ends close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    cvt_i(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two new fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of close-on-exec SOCK_SEQPACKET unix sockets.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    cvt_i(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair returned two new fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one datagram with optional fds attached (SCM_RIGHTS).
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    const MAX_FDS: usize = 4;
    assert!(fds.len() <= MAX_FDS, "send_with_fds: at most {MAX_FDS} fds");
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let fd_bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer (64 bytes) holds one cmsghdr with up to MAX_FDS fds,
        // CMSG_FIRSTHDR points into it and CMSG_DATA has room for `fds`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let r = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(());
    }
}

/// Receives one datagram into `buf` and up to 4 fds. Returns (bytes, fds); 0 bytes = peer closed.
/// A datagram longer than `buf` is an error (the protocol bounds every message).
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    let n = loop {
        // SAFETY: msg points at live buffers for the duration of the call.
        let r = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break r as usize;
    };
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`, with the CMSG_* macros
    // that bound every access by msg_controllen; each SCM_RIGHTS fd is new and owned by us.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..len {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control message too long",
        ));
    }
    Ok((n, fds))
}

/// poll(2) over `fds` (fd, events) → revents per fd. Retries on EINTR only if `retry_eintr`.
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: the slice is a valid array of pollfd of the given length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    Ok(cvt_i(r)? as usize)
}

/// Blocks `signals` for the calling thread and returns a signalfd that reports them.
pub fn signalfd(signals: &[libc::c_int]) -> io::Result<OwnedFd> {
    let set = sigset(signals);
    // SAFETY: `set` is an initialised sigset; the old-mask pointer may be null.
    cvt_i(unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) })?;
    // SAFETY: -1 asks for a new fd; `set` is valid.
    let fd = cvt_i(unsafe { libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK) })?;
    // SAFETY: signalfd returned a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one pending signal number from a signalfd, if any.
pub fn read_signalfd(fd: BorrowedFd<'_>) -> io::Result<Option<libc::c_int>> {
    let mut info = MaybeUninit::<libc::signalfd_siginfo>::zeroed();
    // SAFETY: the buffer is exactly one signalfd_siginfo.
    let r = unsafe {
        libc::read(
            fd.as_raw_fd(),
            info.as_mut_ptr().cast(),
            size_of::<libc::signalfd_siginfo>(),
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(None);
        }
        return Err(e);
    }
    // SAFETY: the kernel wrote a full signalfd_siginfo.
    Ok(Some(unsafe { info.assume_init() }.ssi_signo as libc::c_int))
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    let mut set = MaybeUninit::<libc::sigset_t>::zeroed();
    // SAFETY: sigemptyset initialises the set; sigaddset only writes into it.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for &s in signals {
            libc::sigaddset(set.as_mut_ptr(), s);
        }
        set.assume_init()
    }
}

/// Unblocks every signal and restores default dispositions for the ones husk touches: a forked
/// child must not inherit the spawner's signal mask.
pub fn reset_signals() -> io::Result<()> {
    let set = sigset(&[]);
    // SAFETY: `set` is a valid empty sigset.
    cvt_i(unsafe { libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) })?;
    // Every catchable signal back to its default: an ignored disposition (husk ignores SIGTTIN
    // and SIGTTOU) would otherwise survive execve into the command.
    for sig in 1..libc::SIGRTMIN() {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            // SAFETY: SIG_DFL is a valid disposition for every catchable signal.
            unsafe { libc::signal(sig, libc::SIG_DFL) };
        }
    }
    Ok(())
}

/// Ignores `sig` (SIG_IGN) in the calling process.
pub fn ignore_signal(sig: libc::c_int) {
    // SAFETY: SIG_IGN is a valid disposition; the signals passed are catchable.
    unsafe { libc::signal(sig, libc::SIG_IGN) };
}

/// Whether the calling process is in the foreground process group of the terminal on `fd`.
pub fn is_foreground(fd: BorrowedFd<'_>) -> bool {
    // SAFETY: tcgetpgrp and getpgrp take no pointers.
    unsafe { libc::tcgetpgrp(fd.as_raw_fd()) == libc::getpgrp() }
}

/// Brings the loopback interface of the caller's network namespace up.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: plain socket creation.
    let fd =
        cvt_i(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: the fd is new and ours.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: zeroed ifreq is valid; the name fits in IFNAMSIZ.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads a valid ifreq.
    cvt_i(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) })?;
    Ok(())
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

/// execve(2); returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: argv and envp are NULL-terminated arrays of valid C strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), a.as_ptr(), e.as_ptr()) };
    io::Error::last_os_error()
}

/// _exit(2): leave without running destructors or atexit handlers (a forked child must not
/// flush or free state it shares by copy with its parent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// Writes all of `buf` to a raw fd, retrying on EINTR.
pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid readable slice.
        let r = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[r as usize..];
    }
    Ok(())
}

/// read(2) once into `buf`, retrying on EINTR.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid writable slice.
        let r = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(r as usize);
    }
}

/// dup2(2) (clears close-on-exec on `to`).
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: no pointers; closing whatever `to` was is the intended effect.
    cvt_i(unsafe { libc::dup2(from, to) })?;
    Ok(())
}

/// Sets or clears O_NONBLOCK.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take integers only.
    unsafe {
        let flags = cvt_i(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        cvt_i(libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags))?;
    }
    Ok(())
}

/// Closes every fd >= `lowest` except those in `keep` (close_range where possible).
pub fn close_fds_from(lowest: RawFd, keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&f| f >= lowest).collect();
    keep.sort_unstable();
    let mut start = lowest as u32;
    for k in keep {
        if k as u32 > start {
            // SAFETY: closing descriptors this forked child will not use again.
            unsafe { libc::syscall(libc::SYS_close_range, start, k as u32 - 1, 0) };
        }
        start = k as u32 + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, start, u32::MAX, 0) };
}

/// Whether `fd` refers to a terminal.
pub fn isatty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
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

/// umask(2).
pub fn umask(mask: u32) -> u32 {
    // SAFETY: no pointers.
    unsafe { libc::umask(mask) }
}

/// Writes `value` to /proc/<pid>/oom_score_adj or similar small proc files.
pub fn write_file(path: &Path, value: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    f.write_all(value)
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

/// 64 random bits from the kernel.
pub fn random_u64() -> io::Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: the buffer is valid for 8 bytes.
    let r = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), 0) };
    if r != 8 {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(buf))
}

/// write(2) once; returns how many bytes were written.
pub fn write_some(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid readable slice.
        let r = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok(r as usize);
    }
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (a process holding many sandboxes holds two
/// fds for each).
pub fn raise_nofile_limit() -> io::Result<()> {
    let mut rl = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `rl` is a valid out-pointer.
    cvt_i(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) })?;
    rl.rlim_cur = rl.rlim_max;
    // SAFETY: `rl` is a valid rlimit.
    cvt_i(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &rl) })?;
    Ok(())
}

/// The process's standard fd `i` (0, 1 or 2) for the life of the process.
pub fn stdio_fd(i: RawFd) -> BorrowedFd<'static> {
    assert!((0..3).contains(&i), "stdio_fd: {i} is not a standard fd");
    // SAFETY: fds 0-2 are open for the whole life of a process started normally, and husk never
    // closes them.
    unsafe { BorrowedFd::borrow_raw(i) }
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

/// Bind-mounts `source` onto the mount point `target` (an `O_PATH` fd, so the caller resolved it
/// safely) with `attrs` already set: open_tree(OPEN_TREE_CLONE) makes a detached copy,
/// mount_setattr sets the flags on it, move_mount attaches it. The mount never exists writable.
pub fn bind_onto_fd(source: &CStr, target: BorrowedFd<'_>, attrs: u64) -> io::Result<()> {
    const OPEN_TREE_CLONE: libc::c_uint = 1;
    const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
    const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;
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
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
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

/// setns(2): enter the namespace behind `fd`.
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers; the fd is valid for the call.
    cvt_i(unsafe { libc::setns(fd.as_raw_fd(), nstype) })?;
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

/// Whether `fd` may be handed to a sandbox as one of its stdio fds as it is: a pipe/FIFO or
/// `/dev/null`. Anything else must be relayed: a socket would give the sandbox the host's
/// network namespace (sendto on an unconnected socket), a terminal its ioctls, a regular file
/// its whole content and the power to rewrite it (pwrite, ftruncate, clearing O_APPEND), other
/// devices their own powers.
pub fn passable_stdio(fd: RawFd) -> bool {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a valid out-buffer for one stat.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: fstat succeeded and filled the buffer.
    let st = unsafe { st.assume_init() };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => true,
        libc::S_IFCHR => st.st_rdev == libc::makedev(1, 3),
        _ => false,
    }
}

/// Replaces what `/proc/self/cmdline` shows with `text` by overwriting the argument area the
/// kernel set up on the initial stack (PR_SET_MM would need CAP_SYS_RESOURCE, which not every
/// host gives root). The rest of the area is zeroed; `text` is cut to fit.
pub fn overwrite_cmdline(text: &str) -> io::Result<()> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name, which is in parentheses and may contain anything.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::other("unexpected /proc/self/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // arg_start and arg_end are fields 48 and 49 of stat; `rest` starts at field 3.
    let field = |n: usize| -> io::Result<usize> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse().ok())
            .ok_or_else(|| io::Error::other("no argument area in /proc/self/stat"))
    };
    let (start, end) = (field(48)?, field(49)?);
    if start == 0 || end <= start {
        return Err(io::Error::other("empty argument area"));
    }
    let len = end - start;
    let n = text.len().min(len - 1);
    // SAFETY: [start, end) is this process's argument area on its own stack, mapped writable
    // for the life of the process; no Rust value owns or borrows it (std only reads argv when
    // env::args() is called, and then sees valid NUL-terminated strings).
    unsafe {
        let area = start as *mut u8;
        std::ptr::copy_nonoverlapping(text.as_ptr(), area, n);
        std::ptr::write_bytes(area.add(n), 0, len - n);
    }
    Ok(())
}

/// A new, non-blocking open file description for the same pipe or terminal as `fd`, opened
/// write-only through `/proc/self/fd` (so setting O_NONBLOCK on it does not touch the
/// description husk shares with the user's shell). `None` for anything else: regular files
/// never block (and reopening one would lose O_APPEND), sockets cannot be reopened this way.
pub fn reopen_nonblocking_writer(fd: RawFd) -> io::Result<Option<OwnedFd>> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a valid out-buffer for one stat.
    cvt_i(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded and filled the buffer.
    let st = unsafe { st.assume_init() };
    if !matches!(st.st_mode & libc::S_IFMT, libc::S_IFIFO | libc::S_IFCHR) {
        return Ok(None);
    }
    let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(io::Error::other)?;
    open(&path, libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY, 0).map(Some)
}

/// Writes to a socket without blocking (MSG_DONTWAIT); to anything else with plain write(2).
pub fn write_dontwait(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is a valid readable slice.
        let r = unsafe {
            libc::send(
                fd.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENOTSOCK) => return write_some(fd, buf),
            _ => return Err(e),
        }
    }
}
