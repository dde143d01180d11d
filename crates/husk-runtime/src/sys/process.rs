//! Processes, namespaces, credentials and signals.

use std::ffi::{CStr, CString};
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::{cvt, cvt_i};

/// `struct clone_args` of clone3(2), for the fields husk uses (up to `cgroup`,
/// CLONE_ARGS_SIZE_VER2).
#[repr(C)]
#[derive(Default)]
pub(super) struct CloneArgs {
    pub(super) flags: u64,
    pub(super) pidfd: u64,
    pub(super) child_tid: u64,
    pub(super) parent_tid: u64,
    pub(super) exit_signal: u64,
    pub(super) stack: u64,
    pub(super) stack_size: u64,
    pub(super) tls: u64,
    pub(super) set_tid: u64,
    pub(super) set_tid_size: u64,
    pub(super) cgroup: u64,
}

pub(super) const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

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

/// [`thread_count`], once threads that are on their way out have gone: a thread that was
/// joined has run its last user code, but the kernel counts it (its `/proc/self/task` entry
/// stays) until it has finished exiting, a moment after the join returned. A helper thread
/// just joined (a namespace worker, say) must not make a caller that is about to fork look
/// multi-threaded, so a count above one is read again for up to 100 ms; a thread that is
/// really alive is still counted then.
pub fn settled_thread_count() -> io::Result<u64> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(100);
    loop {
        let n = thread_count()?;
        if n <= 1 || std::time::Instant::now() >= deadline {
            return Ok(n);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
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

/// Sets the effective uid and gid only (the real and saved ids unchanged). From root, the
/// permitted capabilities stay (the effective set empties).
pub fn set_effective_ids(uid: u32, gid: u32) -> io::Result<()> {
    const KEEP: u32 = u32::MAX;
    // SAFETY: the id calls take plain integers (-1: unchanged).
    unsafe {
        cvt_i(libc::setresgid(KEEP, gid, KEEP))?;
        cvt_i(libc::setresuid(KEEP, uid, KEEP))?;
    }
    Ok(())
}

/// pidfd_open(2) of `pid` (Linux 5.3): readable once the process has exited.
pub fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments only.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// prctl(PR_SET_NAME): the calling thread's name (at most 15 bytes are kept; a name with a
/// NUL byte is refused), as `ps` and `top` show it.
pub fn set_thread_name(name: &str) -> io::Result<()> {
    let name =
        std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: the pointer is to a NUL-terminated string that outlives the call; the kernel
    // copies at most 16 bytes of it.
    cvt_i(unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0) })?;
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

/// Sets the calling process's own `oom_score_adj` to `adj` (-1000..=1000), allocating nothing
/// (for a forked child before `execve`).
///
/// A non-dumpable process (a sandbox's PID 1 is, and so is its fork until `execve`) cannot
/// open its own `/proc/self` files for writing: they belong to root of the user namespace its
/// memory was made in, for sandbox processes the host's root. So the process is made dumpable
/// for the one write and non-dumpable again at once. Meanwhile only its own Landlock domain
/// and its ancestors could trace it (a sandbox's commands are in domains nested below PID 1's,
/// never above).
pub fn set_own_oom_score_adj(adj: i32) -> io::Result<()> {
    // SAFETY: PR_GET_DUMPABLE takes no pointer.
    let was = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
    if was < 0 {
        return Err(io::Error::last_os_error());
    }
    let set_dumpable = |on: libc::c_ulong| {
        // SAFETY: PR_SET_DUMPABLE takes an integer argument and touches no memory.
        cvt_i(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on, 0, 0, 0) }).map(drop)
    };
    if was != 1 {
        set_dumpable(1)?;
    }
    let mut buf = [0u8; 12];
    let text = format_i32(adj, &mut buf);
    let written = super::open(c"/proc/self/oom_score_adj", libc::O_WRONLY, 0)
        .and_then(|fd| super::write_all(fd.as_fd(), text));
    // prctl only takes 0 or 1: whatever non-dumpable state it was in becomes plain 0.
    let restored = if was != 1 { set_dumpable(0) } else { Ok(()) };
    written.and(restored)
}

/// Formats `v` in decimal into `buf` without allocating.
fn format_i32(v: i32, buf: &mut [u8; 12]) -> &[u8] {
    let mut n = v.unsigned_abs();
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    if v < 0 {
        i -= 1;
        buf[i] = b'-';
    }
    &buf[i..]
}

/// _exit(2): leave without running destructors or atexit handlers (a forked child must not
/// flush or free state it shares by copy with its parent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

/// umask(2).
pub fn umask(mask: u32) -> u32 {
    // SAFETY: no pointers.
    unsafe { libc::umask(mask) }
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

/// Raises the soft RLIMIT_NOFILE to the hard limit (a process holding many sandboxes holds
/// several fds for each: a spawner four). The hard limit is the operator's.
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

/// Like [`raise_nofile_limit`], but first lifts the hard limit to the kernel's `fs.nr_open`
/// where this process may (`CAP_SYS_RESOURCE`): for `husk bench`'s density figure, where a
/// login shell's hard limit (often 4,096 or 20,000) would end the count long before memory.
pub fn lift_nofile_limit() -> io::Result<()> {
    let nr_open = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<libc::rlim_t>().ok());
    if let Some(max) = nr_open {
        let lifted = libc::rlimit {
            rlim_cur: max,
            rlim_max: max,
        };
        // SAFETY: `lifted` is a valid rlimit. Refused (EPERM) without CAP_SYS_RESOURCE, or
        // where the hard limit is already higher: then the soft limit goes to the hard one.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lifted) } == 0 {
            return Ok(());
        }
    }
    raise_nofile_limit()
}

/// setns(2): enter the namespace behind `fd`.
pub fn setns(fd: BorrowedFd<'_>, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers; the fd is valid for the call.
    cvt_i(unsafe { libc::setns(fd.as_raw_fd(), nstype) })?;
    Ok(())
}

/// Where the kernel put this process's argument strings (what `/proc/self/cmdline` shows):
/// `[start, end)` on the initial stack. The same addresses hold in a forked child.
#[derive(Debug, Clone, Copy)]
pub struct ArgArea {
    start: usize,
    end: usize,
}

/// Finds the argument area from `/proc/self/stat`.
pub fn arg_area() -> io::Result<ArgArea> {
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
    Ok(ArgArea { start, end })
}

/// Replaces what `/proc/self/cmdline` shows with `text` by overwriting the argument area the
/// kernel set up on the initial stack (PR_SET_MM would need CAP_SYS_RESOURCE, which not every
/// host gives root). The rest of the area is zeroed; `text` is cut to fit. `area` must be this
/// process's own, from [`arg_area`] here or in the process this one was forked from.
pub fn overwrite_cmdline(area: ArgArea, text: &str) {
    let len = area.end - area.start;
    let n = text.len().min(len - 1);
    // SAFETY: [start, end) is this process's argument area on its own stack (found by
    // arg_area in this process or in its parent before the fork, which copies the stack at
    // the same addresses), mapped writable for the life of the process; no Rust value owns or
    // borrows it (std only reads argv when env::args() is called, and then sees valid
    // NUL-terminated strings).
    unsafe {
        let p = area.start as *mut u8;
        std::ptr::copy_nonoverlapping(text.as_ptr(), p, n);
        std::ptr::write_bytes(p.add(n), 0, len - n);
    }
}

/// A user namespace that maps ids `0..count` to host ids `base..base+count` and has no
/// process in it: the id mapping of id-mapped mounts. A short-lived child creates it; the
/// returned fd keeps it alive.
///
/// # Safety
/// Forks: the calling process must be single-threaded (see [`clone3_fork`]).
pub unsafe fn idmap_userns(base: u32, count: u32) -> io::Result<OwnedFd> {
    let line = format!("0 {base} {count}\n");
    // SAFETY: the caller guarantees the process is single-threaded.
    unsafe { userns_with_maps(&line, &line) }
}

/// A user namespace with the given `uid_map` and `gid_map` contents and no process in it (see
/// [`idmap_userns`]).
///
/// # Safety
/// Forks: the calling process must be single-threaded (see [`clone3_fork`]).
pub unsafe fn userns_with_maps(uid_map: &str, gid_map: &str) -> io::Result<OwnedFd> {
    let (r, w) = super::pipe()?;
    // SAFETY: the caller guarantees the process is single-threaded.
    match unsafe { clone3_fork(libc::CLONE_NEWUSER, None) }? {
        Forked::Child => {
            drop(w);
            // Wait until the parent has what it needs (EOF), then leave without running
            // anything of the parent's (no destructors, no atexit handlers).
            let mut b = [0u8; 1];
            let _ = super::read(r.as_fd(), &mut b);
            exit_now(0)
        }
        Forked::Parent { pid, pidfd } => {
            drop(r);
            let made = super::write_file(
                std::path::Path::new(&format!("/proc/{pid}/uid_map")),
                uid_map.as_bytes(),
            )
            .and_then(|()| {
                super::write_file(
                    std::path::Path::new(&format!("/proc/{pid}/gid_map")),
                    gid_map.as_bytes(),
                )
            })
            .and_then(|()| {
                super::open(
                    &super::cpath(std::path::Path::new(&format!("/proc/{pid}/ns/user")))?,
                    libc::O_RDONLY,
                    0,
                )
            });
            drop(w);
            let _ = waitid_pidfd(pidfd.as_fd(), false);
            made
        }
    }
}

/// pidfd_getfd(2) (Linux 5.6): a duplicate, close-on-exec, of descriptor `target` of the
/// process behind `pidfd`. Needs ptrace access to it (`PTRACE_MODE_ATTACH_REALCREDS`): the
/// spawner, root of the host, takes back what an adopted sandbox's PID 1 kept for it.
pub fn pidfd_getfd(pidfd: BorrowedFd<'_>, target: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: integer arguments only.
    let fd = cvt(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) })?;
    // SAFETY: pidfd_getfd returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// Waits up to `timeout` for the process behind `pidfd` (not necessarily a child: its parent
/// reaps it) to exit; whether it did.
pub fn pidfd_wait_exit(pidfd: BorrowedFd<'_>, timeout: std::time::Duration) -> io::Result<bool> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut p = [libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        match super::poll(
            &mut p,
            left.as_millis().min(i32::MAX as u128) as libc::c_int,
        ) {
            Ok(0) if left.is_zero() => return Ok(false),
            Ok(0) => {}
            Ok(_) => return Ok(true),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// When process `pid` started, in clock ticks after boot (`/proc/PID/stat`, field 22): with
/// the pid, what names one process for good (a pid alone may be reused).
pub fn process_start_time(pid: libc::pid_t) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) is in parentheses and may hold anything: count from after
    // its last ')'. Field 3 is the first after it, so field 22 is the 20th.
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| io::Error::other("malformed /proc stat"))?;
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other("malformed /proc stat"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_without_allocating() {
        let mut buf = [0u8; 12];
        for v in [0, 7, -900, 1000, -1000, i32::MIN, i32::MAX] {
            assert_eq!(format_i32(v, &mut buf), v.to_string().as_bytes());
        }
    }

    #[test]
    fn a_non_dumpable_process_sets_its_own_oom_score_adj_and_stays_non_dumpable() {
        // SAFETY: the child makes only syscalls (nothing that allocates or takes a lock another
        // thread of the test harness could hold) before _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: integer arguments only.
            unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
            // Raising is allowed to anyone, so this works whatever the test runs as.
            let set = set_own_oom_score_adj(500).is_ok();
            // SAFETY: no pointer.
            let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) };
            let mut buf = [0u8; 16];
            let read = super::super::open(c"/proc/self/oom_score_adj", libc::O_RDONLY, 0)
                .and_then(|fd| super::super::read(fd.as_fd(), &mut buf));
            let value_ok = matches!(read, Ok(n) if &buf[..n] == b"500\n");
            exit_now(match (set, dumpable, value_ok) {
                (false, _, _) => 1,
                (_, d, _) if d != 0 => 2,
                (_, _, false) => 3,
                _ => 0,
            });
        }
        let (_, status) = waitpid(pid, 0).unwrap().unwrap();
        assert_eq!(status, ExitStatus::Exited(0));
    }
}
