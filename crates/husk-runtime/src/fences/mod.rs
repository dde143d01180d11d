//! The fences around a sandboxed process: resource limits, capabilities, no_new_privs, Landlock
//! and seccomp.
//!
//! Usage, in husk's init (the sandbox's PID 1):
//!
//! ```text
//! let fences = Fences::prepare()?;          // once, before forking: compiles BPF, opens "/"
//! fences.apply_to_init()?;                  // once init needs no more privileged setup
//! // for each command:
//! let domain = fences.command_domain()?;    // in the parent: the command's own Landlock domain
//! fork() -> in the child:
//!     setgroups / setresgid
//!     fences.drop_bounding(root)?;          // needs CAP_SETPCAP: before setresuid
//!     setresuid(uid, uid, uid)
//!     fences.apply_after_setuid(root, &rlimits)?;
//!     domain.enter()?;                      // needs no_new_privs (set just before)
//!     execve(...)
//! ```
//!
//! `prepare` allocates; `drop_bounding`, `apply_after_setuid` and `CommandDomain::enter` only
//! make syscalls on prepared data (they allocate nothing unless the root directory changed
//! since `prepare`, see [`Fences::prepare`]). The policy itself is data: [`DENY_RULES`]
//! (seccomp), [`DEFAULT_ROOT_CAPS`] (capabilities) and the Landlock rules described on
//! [`Fences`] and [`CommandDomain`].

mod caps;
mod landlock;
mod rlimits;
mod seccomp;
mod seccomp_rules;
pub mod server;

use std::io;

pub(crate) use self::caps::raise_effective;
pub use self::caps::{Capability, DEFAULT_ROOT_CAPS, INIT_EXTRA_CAPS};
pub use self::landlock::LandlockState;

/// The running kernel's Landlock ABI version; 0 when Landlock is missing or not enabled.
pub fn landlock_abi() -> i32 {
    landlock::kernel_abi()
}
pub use self::rlimits::Rlimits;
pub use self::seccomp_rules::{ArgMatch, DenyRule, Probe, DENY_RULES};

/// Everything that can go wrong preparing or applying the fences.
///
/// The message includes the underlying error (so `to_string()` tells the whole story); the
/// underlying error is not also reported as `source()`, to avoid printing it twice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The seccomp policy does not compile (a bug in [`DENY_RULES`]).
    #[error("compiling the seccomp policy: {0}")]
    SeccompCompile(seccompiler::BackendError),
    /// A seccomp rule is unusable (a bug in the rule table).
    #[error("seccomp rule {rule}: {reason}")]
    InvalidRule {
        /// The offending rule.
        rule: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `seccomp(2)` (or the `prctl` before it) failed.
    #[error("installing the seccomp filter: {0}")]
    SeccompInstall(seccompiler::Error),
    /// Building or enforcing the Landlock ruleset failed (an unsupported kernel is not an error).
    #[error("landlock: {0}")]
    Landlock(::landlock::RulesetError),
    /// A path needed by a Landlock rule could not be opened.
    #[error("landlock: opening {path}: {error}")]
    LandlockPath {
        /// The path.
        path: &'static str,
        /// Why.
        error: ::landlock::PathFdError,
    },
    /// Setting a resource limit failed.
    #[error("setting RLIMIT_{resource}: {error}")]
    Rlimit {
        /// `NOFILE`, `NPROC`, ...
        resource: &'static str,
        /// Why.
        error: io::Error,
    },
    /// A capability outside the keep-set is still in the bounding set and the process can no
    /// longer drop it (call [`Fences::drop_bounding`] before `setresuid`).
    #[error(
        "capability {cap} is still in the bounding set (drop_bounding must run before setresuid)"
    )]
    BoundingSetNotDropped {
        /// Capability number.
        cap: u32,
    },
    /// Some other system call failed.
    #[error("{op}: {error}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// Why.
        error: io::Error,
    },
}

impl From<::landlock::RulesetError> for FenceError {
    fn from(e: ::landlock::RulesetError) -> Self {
        FenceError::Landlock(e)
    }
}

impl FenceError {
    /// A [`FenceError::Sys`] from `errno`. Does not allocate.
    pub(crate) fn last_os(op: &'static str) -> FenceError {
        FenceError::Sys {
            op,
            error: io::Error::last_os_error(),
        }
    }
}

/// The prepared fences: compiled seccomp programs, the Landlock ruleset, capability sets.
///
/// The Landlock policy: every filesystem access right of the newest ABI the `landlock` crate
/// knows is handled; everything beneath `/` is allowed except creating character and block
/// devices (`MakeChar`, `MakeBlock`, even for a root that has `CAP_MKNOD`) and device ioctls
/// (`IoctlDev`), which are allowed beneath `/dev` only (ptys and ttys need them). Abstract unix
/// sockets and signals are scoped (ABI 6+): sandboxed processes cannot connect to abstract
/// sockets or signal processes outside their own Landlock domain, PID 1 included. On kernels
/// without (some of) these features the rest still applies (best effort); see
/// [`Fences::landlock_state`]. Each command also gets a domain of its own, nested in the
/// sandbox's ([`CommandDomain`]).
#[derive(Debug)]
pub struct Fences {
    seccomp: Vec<seccompiler::BpfProgram>,
    landlock: landlock::LandlockFence,
    last_cap: u32,
}

impl Fences {
    /// Compiles everything once (in the parent).
    ///
    /// The Landlock rules refer to the inodes of `/` and `/dev` as seen now, so call this in the
    /// sandbox's final root (after `pivot_root`). If the root differs when the fences are applied,
    /// `apply_after_setuid` rebuilds the ruleset for the new root (correct, but it allocates).
    pub fn prepare() -> Result<Fences, FenceError> {
        Ok(Fences {
            seccomp: seccomp::compile(DENY_RULES)?,
            landlock: landlock::LandlockFence::prepare()?,
            last_cap: caps::last_cap(),
        })
    }

    /// Whether (and at which ABI) Landlock will be enforced on this kernel; for logging.
    pub fn landlock_state(&self) -> LandlockState {
        self.landlock.state()
    }

    /// In the parent (PID 1), before forking a command: the command's own Landlock domain,
    /// entered in the child with [`CommandDomain::enter`]. Its ruleset is built once (by
    /// [`Fences::apply_to_init`], or here on first use) for the current root, and kept open.
    pub fn command_domain(&self) -> Result<CommandDomain, FenceError> {
        Ok(CommandDomain {
            ruleset: self.landlock.command_ruleset()?,
        })
    }

    /// In the forked child, before `setresuid` (dropping needs `CAP_SETPCAP`): removes from the
    /// capability bounding set every capability not in the keep-set ([`DEFAULT_ROOT_CAPS`] for
    /// `root`, none otherwise).
    pub fn drop_bounding(&self, root: bool) -> Result<(), FenceError> {
        caps::drop_bounding_except(caps::keep_mask(root), self.last_cap)
    }

    /// In the forked child right before `execve`, running as the target uid (0 or the user's).
    ///
    /// In order: rlimits; capabilities (checks the bounding set holds nothing outside the
    /// keep-set, dropping leftovers if still possible; limits permitted and effective to the
    /// keep-set, clears inheritable and ambient); no_new_privs; seccomp, unless the process is
    /// already filtered. Landlock is not applied here: the sandbox's domain comes from init
    /// ([`Fences::apply_to_init`]), the command's own is entered next ([`CommandDomain`]).
    ///
    /// Commands forked by init inherit init's seccomp filter, so installing the same filter again
    /// would only stack a second copy that every syscall of the command then runs through.
    pub fn apply_after_setuid(&self, root: bool, rlimits: &Rlimits) -> Result<(), FenceError> {
        rlimits.apply()?;
        let keep = caps::keep_mask(root);
        caps::ensure_bounding_within(keep, self.last_cap)?;
        caps::restrict_process_caps(keep)?;
        set_no_new_privs()?;
        // SAFETY: PR_GET_SECCOMP takes no pointers; it returns the current seccomp mode.
        let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) };
        if mode == 2 {
            return Ok(());
        }
        seccomp::install(&self.seccomp, false)
    }

    /// For PID 1 itself once its privileged setup is done: trims the bounding set to what it
    /// needs to start commands as root or as the user ([`DEFAULT_ROOT_CAPS`] plus
    /// [`INIT_EXTRA_CAPS`]), makes the process non-dumpable (`PR_SET_DUMPABLE` 0), sets
    /// no_new_privs and installs the seccomp filter on all its threads. After this, init can no
    /// longer mount, unshare a user namespace, etc.
    ///
    /// Landlock is enforced here too, once for the whole sandbox: every command init starts
    /// is inside this domain (in a nested one of its own, [`CommandDomain`], which scopes
    /// nothing), so commands of one sandbox can still signal each other (a `pkill` of a server
    /// started by an earlier command works) and init can signal them all, while nothing in the
    /// sandbox can signal or reach abstract sockets outside it. The commands' ruleset is built
    /// here as well, so neither ruleset costs anything at a command's start.
    pub fn apply_to_init(&self) -> Result<(), FenceError> {
        caps::drop_bounding_except(caps::init_mask(), self.last_cap)?;
        // SAFETY: PR_SET_DUMPABLE takes an integer argument and touches no memory.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            return Err(FenceError::last_os("prctl(PR_SET_DUMPABLE, 0)"));
        }
        set_no_new_privs()?;
        self.landlock.apply()?;
        seccomp::install(&self.seccomp, true)
    }
}

/// A command's own Landlock domain, nested in the sandbox's: what keeps the processes of one
/// command from inspecting those of another command of the same sandbox.
///
/// Every command PID 1 (the agent or husk's init) starts enters a new domain of its own, made
/// of a ruleset that restricts nothing beyond the sandbox's domain (it handles `Execute` and
/// `Refer` and allows both beneath `/`) and scopes nothing. What it changes is the domain
/// hierarchy: Landlock lets a process ptrace another, which includes `PTRACE_MODE_READ` (reading
/// `/proc/PID/environ`, `mem`, `maps`, `fd/N`, `cwd`, `exe`, `stack`, and `process_vm_readv`,
/// `pidfd_getfd`, `kcmp`), only if the tracer's domain is the target's or one of its
/// ancestors. Sibling domains are neither, so a command cannot read another command's
/// environment (and the secrets in it) or memory: not as the same uid, and not as the sandbox's
/// root (`sudo` commands are started by the agent, in domains of their own too). Nor can it
/// read PID 1's. (Linux 6.18 still lets a holder of `CAP_SYS_ADMIN` or
/// `CAP_CHECKPOINT_RESTORE` open another process's `environ` and `maps` across domains:
/// neither may ever be in [`DEFAULT_ROOT_CAPS`].)
///
/// It must be every command, not only those given secrets: the protection comes from the two
/// processes being in different domains, so a command without secrets must not share a domain
/// with (or be an ancestor of) one that has them.
///
/// What it does not block: processes a command forks stay in its domain, so a command can
/// still `strace`/`gdb` its own children and read their `/proc` files; PID 1 (an ancestor)
/// still can; signals between commands (no signal scope here: `kill`/`pkill` across commands
/// of a sandbox work, the sandbox's domain scopes them to the sandbox) and abstract unix
/// sockets (the agent's `sudo` socket among them); `/proc/PID/cmdline`, `status` and `stat`,
/// which need no ptrace access (`ps` and `pkill -f` work); and anything a process shares
/// deliberately (files, pipes, its own children's environment). Without Landlock in the kernel
/// there is no such barrier: [`CommandDomain::enter`] does nothing.
#[derive(Clone, Copy, Debug)]
pub struct CommandDomain {
    ruleset: Option<std::os::fd::RawFd>,
}

impl CommandDomain {
    /// In the forked child, after [`Fences::apply_after_setuid`] (which sets no_new_privs) and
    /// before the ruleset's fd is closed: enters the command's own domain. One syscall, no
    /// allocation.
    pub fn enter(self) -> io::Result<()> {
        match self.ruleset {
            Some(fd) => landlock::restrict_self(fd),
            None => Ok(()),
        }
    }
}

// Fences are prepared once and may be shared (e.g. in an Arc) with the code that forks.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Fences>();
    assert_send_sync::<FenceError>();
};

fn set_no_new_privs() -> Result<(), FenceError> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(FenceError::last_os("prctl(PR_SET_NO_NEW_PRIVS)"));
    }
    Ok(())
}

/// Test support: running code in a forked child of the (multithreaded) test process.
#[cfg(test)]
mod testing {
    use std::os::fd::RawFd;

    /// The current errno. Async-signal-safe.
    pub(super) fn errno() -> i32 {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }

    /// The write end of the pipe to the parent.
    pub(super) struct Child {
        fd: RawFd,
    }

    impl Child {
        pub(super) fn fd(&self) -> RawFd {
            self.fd
        }

        /// Writes all of `bytes`. Async-signal-safe.
        pub(super) fn send(&self, mut bytes: &[u8]) {
            while !bytes.is_empty() {
                // SAFETY: writing from a valid slice to our pipe fd.
                let n = unsafe { libc::write(self.fd, bytes.as_ptr().cast(), bytes.len()) };
                if n <= 0 {
                    if n < 0 && errno() == libc::EINTR {
                        continue;
                    }
                    return;
                }
                bytes = &bytes[n as usize..];
            }
        }

        pub(super) fn send_i32(&self, v: i32) {
            self.send(&v.to_ne_bytes());
        }
    }

    /// What a child did.
    #[derive(Debug)]
    pub(super) struct Outcome {
        pub(super) status: libc::c_int,
        pub(super) output: Vec<u8>,
    }

    impl Outcome {
        pub(super) fn exited(&self, code: i32) -> bool {
            libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == code
        }

        pub(super) fn signal(&self) -> Option<i32> {
            libc::WIFSIGNALED(self.status).then(|| libc::WTERMSIG(self.status))
        }

        /// The output as native-endian i32s.
        pub(super) fn i32s(&self) -> Vec<i32> {
            self.output
                .chunks_exact(4)
                .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
                .collect()
        }
    }

    /// Forks; the child calls `setsid` (so it has no controlling terminal), runs `body` and
    /// `_exit`s with its return value. `body` must only do async-signal-safe things: the test
    /// process is multithreaded. Returns the child's exit status and everything it wrote.
    pub(super) fn in_child(body: impl FnOnce(&Child) -> i32) -> Outcome {
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two fds into the array.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        let [read_fd, write_fd] = fds;
        // SAFETY: the child only runs `body` (async-signal-safe by contract) and `_exit`s; it
        // never returns into the test harness.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: closing our copy of the read end; setsid takes no arguments.
            let detached = unsafe {
                libc::close(read_fd);
                libc::setsid()
            };
            let code = if detached < 0 {
                90
            } else {
                let child = Child { fd: write_fd };
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&child)))
                    .unwrap_or(91)
            };
            // SAFETY: terminating the forked child without running the parent's atexit
            // handlers or destructors.
            unsafe { libc::_exit(code) };
        }
        // SAFETY: closing the parent's copy of the write end.
        unsafe { libc::close(write_fd) };
        let mut output = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reading into a valid buffer from our pipe fd.
            let n = unsafe { libc::read(read_fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            if n <= 0 {
                break;
            }
            output.extend_from_slice(&buf[..n as usize]);
        }
        let mut status = 0;
        // SAFETY: closing our fd and reaping our own child.
        unsafe {
            libc::close(read_fd);
            while libc::waitpid(pid, &mut status, 0) < 0 && errno() == libc::EINTR {}
        }
        Outcome { status, output }
    }

    /// Reads a whole (small) file with raw syscalls into `buf`; returns the length. For
    /// /proc files in forked children. Async-signal-safe.
    pub(super) fn read_file(path: &std::ffi::CStr, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: path is NUL-terminated; the fd is ours and closed below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return None;
        }
        let mut len = 0;
        while len < buf.len() {
            // SAFETY: reading into the unfilled tail of a valid buffer.
            let n = unsafe { libc::read(fd, buf[len..].as_mut_ptr().cast(), buf.len() - len) };
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        // SAFETY: closing our fd.
        unsafe { libc::close(fd) };
        Some(len)
    }

    /// A field of /proc/<pid>/status, e.g. `status_field(text, "CapBnd")`.
    pub(super) fn status_field<'a>(status: &'a str, name: &str) -> Option<&'a str> {
        status.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k == name).then(|| v.trim())
        })
    }

    /// A fresh directory under the temp dir, removed on drop.
    pub(super) struct TempDir(pub(super) std::path::PathBuf);

    impl TempDir {
        pub(super) fn new(tag: &str) -> TempDir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "husk-fences-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir(&path).expect("create temp dir");
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{in_child, read_file, status_field};
    use super::*;

    /// Runs `setup` then reads /proc/self/status in a forked child; returns the status text.
    fn status_after(setup: impl FnOnce() -> i32) -> String {
        let child = in_child(|out| {
            let code = setup();
            if code != 0 {
                return code;
            }
            let mut buf = [0u8; 8192];
            match read_file(c"/proc/self/status", &mut buf) {
                Some(n) => {
                    out.send(&buf[..n]);
                    0
                }
                None => 4,
            }
        });
        assert!(child.exited(0), "child failed: {child:?}");
        String::from_utf8(child.output).expect("status is UTF-8")
    }

    fn hex(status: &str, field: &str) -> u64 {
        let v = status_field(status, field).unwrap_or_else(|| panic!("no {field} in {status}"));
        u64::from_str_radix(v, 16).unwrap_or_else(|_| panic!("{field}: {v}"))
    }

    #[test]
    fn user_ends_with_no_capabilities_and_no_new_privs() {
        let fences = Fences::prepare().expect("prepare");
        let rlimits = Rlimits::default();
        let status = status_after(|| {
            if fences.drop_bounding(false).is_err() {
                return 10;
            }
            let nobody = 65534;
            // SAFETY: setgroups with an empty list; setresgid/setresuid take integers.
            let switched = unsafe {
                libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(nobody, nobody, nobody) == 0
                    && libc::setresuid(nobody, nobody, nobody) == 0
            };
            if !switched {
                return 11;
            }
            if fences.apply_after_setuid(false, &rlimits).is_err() {
                return 12;
            }
            0
        });
        for field in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(hex(&status, field), 0, "{field} in\n{status}");
        }
        assert_eq!(status_field(&status, "NoNewPrivs"), Some("1"), "{status}");
        assert_eq!(status_field(&status, "Seccomp"), Some("2"), "{status}");
        assert_eq!(
            status_field(&status, "Uid"),
            Some("65534\t65534\t65534\t65534")
        );
    }

    #[test]
    fn root_keeps_exactly_the_default_root_caps() {
        let fences = Fences::prepare().expect("prepare");
        let rlimits = Rlimits::default();
        let status = status_after(|| {
            if fences.drop_bounding(true).is_err() {
                return 10;
            }
            if fences.apply_after_setuid(true, &rlimits).is_err() {
                return 12;
            }
            0
        });
        let mask = Capability::mask(DEFAULT_ROOT_CAPS);
        assert_eq!(hex(&status, "CapBnd"), mask, "{status}");
        // The test runs as root with (nearly) all capabilities: the keep-set is what remains.
        let parent = std::fs::read_to_string("/proc/self/status").unwrap();
        let expected = hex(&parent, "CapPrm") & mask;
        assert_eq!(hex(&status, "CapPrm"), expected, "{status}");
        assert_eq!(hex(&status, "CapEff"), expected, "{status}");
        assert_eq!(hex(&status, "CapInh"), 0, "{status}");
        assert_eq!(hex(&status, "CapAmb"), 0, "{status}");
        assert_eq!(status_field(&status, "NoNewPrivs"), Some("1"), "{status}");
        assert_eq!(status_field(&status, "Seccomp"), Some("2"), "{status}");
    }

    #[test]
    fn user_without_drop_bounding_is_refused() {
        // Forgetting drop_bounding before setresuid must not silently leave a full bounding set.
        let fences = Fences::prepare().expect("prepare");
        let child = in_child(|out| {
            let nobody = 65534;
            // SAFETY: setresgid/setresuid take integers.
            let switched = unsafe {
                libc::setresgid(nobody, nobody, nobody) == 0
                    && libc::setresuid(nobody, nobody, nobody) == 0
            };
            if !switched {
                return 11;
            }
            let refused = matches!(
                fences.apply_after_setuid(false, &Rlimits::default()),
                Err(FenceError::BoundingSetNotDropped { .. })
            );
            out.send_i32(i32::from(refused));
            0
        });
        assert!(child.exited(0), "{child:?}");
        assert_eq!(child.i32s(), [1]);
    }

    /// 0 if `path` opens for reading, else errno. Async-signal-safe.
    fn open_rc(path: &std::ffi::CStr) -> i32 {
        // SAFETY: NUL-terminated path; the fd is closed right away.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if fd < 0 {
                return testing::errno();
            }
            libc::close(fd);
        }
        0
    }

    /// In a forked child of "PID 1": what `exec::exec_child` does to a command as root or as
    /// the user (uid 1000), made dumpable as `execve` would, then, with `isolate`, the
    /// command's own domain. False if a step failed.
    fn become_command(fences: &Fences, domain: CommandDomain, user: bool, isolate: bool) -> bool {
        if fences.drop_bounding(!user).is_err() {
            return false;
        }
        if user {
            // SAFETY: setgroups with an empty list; setresgid/setresuid take integers.
            let switched = unsafe {
                libc::setgroups(0, std::ptr::null()) == 0
                    && libc::setresgid(1000, 1000, 1000) == 0
                    && libc::setresuid(1000, 1000, 1000) == 0
            };
            if !switched {
                return false;
            }
        }
        if fences
            .apply_after_setuid(!user, &Rlimits::default())
            .is_err()
        {
            return false;
        }
        // SAFETY: integer arguments only.
        unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) };
        !isolate || domain.enter().is_ok()
    }

    /// Forks a process that runs `setup`, dies with its parent, writes to `ready` one byte
    /// (0: it read its own /proc/self/environ, 1: it could not, 2: `setup` failed) and waits to
    /// be killed.
    fn fork_waiting(setup: impl FnOnce() -> bool, ready: std::os::fd::RawFd) -> libc::pid_t {
        // SAFETY: the caller is a single-threaded forked child; the child `_exit`s or pauses.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid != 0 {
            return pid;
        }
        let state = if setup() {
            let mut buf = [0u8; 4096];
            u8::from(read_file(c"/proc/self/environ", &mut buf).is_none())
        } else {
            2
        };
        // SAFETY: integer prctl arguments (after setup: a uid change clears the setting); a
        // one-byte write from a local to our pipe; pause takes no arguments.
        unsafe {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
            libc::write(ready, (&state as *const u8).cast(), 1);
            loop {
                libc::pause();
            }
        }
    }

    fn wait_ready(ready: std::os::fd::RawFd) -> i32 {
        let mut b = [0u8; 1];
        // SAFETY: reading one byte into a local from our pipe.
        if unsafe { libc::read(ready, b.as_mut_ptr().cast(), 1) } == 1 {
            i32::from(b[0])
        } else {
            -1
        }
    }

    /// Two commands A and B of one sandbox, as PID 1 starts them (root or the user; with or
    /// without their own domains). Returns: whether A reads its own environ (0), then what B
    /// gets (0 or errno) opening A's environ and mem, from kill(A, 0), and opening the environ
    /// of a child of its own.
    fn sibling_commands(fences: &Fences, user: bool, isolate: bool) -> Vec<i32> {
        let sandbox = in_child(|out| {
            if fences.apply_to_init().is_err() {
                return 2;
            }
            let Ok(domain) = fences.command_domain() else {
                return 3;
            };
            let mut p = [0; 2];
            // SAFETY: pipe2 writes two fds into the array.
            if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
                return 4;
            }
            let (ready_r, ready_w) = (p[0], p[1]);
            let a = fork_waiting(|| become_command(fences, domain, user, isolate), ready_w);
            out.send_i32(wait_ready(ready_r));
            // This process is single-threaded: it and its children may allocate.
            let environ = std::ffi::CString::new(format!("/proc/{a}/environ")).unwrap();
            let mem = std::ffi::CString::new(format!("/proc/{a}/mem")).unwrap();
            // SAFETY: single-threaded; the child `_exit`s.
            let b = unsafe { libc::fork() };
            if b == 0 {
                let code = if become_command(fences, domain, user, isolate) {
                    out.send_i32(open_rc(&environ));
                    out.send_i32(open_rc(&mem));
                    // SAFETY: signal 0 only checks that A may be signalled.
                    let killed = unsafe { libc::kill(a, 0) };
                    out.send_i32(if killed == 0 { 0 } else { testing::errno() });
                    let own = fork_waiting(|| true, ready_w);
                    let _ = wait_ready(ready_r);
                    let path = std::ffi::CString::new(format!("/proc/{own}/environ")).unwrap();
                    out.send_i32(open_rc(&path));
                    // SAFETY: ends and reaps our own child.
                    unsafe {
                        libc::kill(own, libc::SIGKILL);
                        libc::waitpid(own, std::ptr::null_mut(), 0);
                    }
                    0
                } else {
                    6
                };
                // SAFETY: ends the forked child.
                unsafe { libc::_exit(code) };
            }
            let mut status = 0;
            // SAFETY: reaps B; ends and reaps A.
            unsafe {
                libc::waitpid(b, &mut status, 0);
                libc::kill(a, libc::SIGKILL);
                libc::waitpid(a, std::ptr::null_mut(), 0);
            }
            if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                0
            } else {
                7
            }
        });
        assert!(sandbox.exited(0), "{sandbox:?}");
        sandbox.i32s()
    }

    #[test]
    fn every_command_has_its_own_landlock_domain() {
        let fences = Fences::prepare().expect("prepare");
        let enforced = fences.landlock_state() != LandlockState::Unsupported;
        for user in [false, true] {
            // In one shared domain (as before), a command reads another's environment and
            // memory: the test can tell.
            assert_eq!(
                sibling_commands(&fences, user, false),
                [0, 0, 0, 0, 0],
                "user {user}, one domain: A's own environ; B: A's environ, A's mem, kill(A, 0), \
                 its child's environ"
            );
            let barred = if enforced { libc::EACCES } else { 0 };
            assert_eq!(
                sibling_commands(&fences, user, true),
                [0, barred, barred, 0, 0],
                "user {user}, own domains: A's own environ; B: A's environ, A's mem, \
                 kill(A, 0), its child's environ"
            );
        }
    }

    #[test]
    fn init_keeps_switching_caps_and_is_not_dumpable() {
        let fences = Fences::prepare().expect("prepare");
        let child = in_child(|out| {
            if fences.apply_to_init().is_err() {
                return 10;
            }
            // SAFETY: PR_GET_DUMPABLE takes no pointer.
            out.send_i32(unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) });
            // init may still switch users (CAP_SETUID/SETGID kept) ...
            // SAFETY: setresuid takes integers.
            out.send_i32(unsafe { libc::setresuid(0, 0, 0) });
            // ... but no longer create user namespaces.
            // SAFETY: unshare takes an integer.
            let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
            out.send_i32(if r == 0 { 0 } else { testing::errno() });
            let mut buf = [0u8; 8192];
            if let Some(n) = read_file(c"/proc/self/status", &mut buf) {
                out.send(&buf[..n]);
            }
            0
        });
        assert!(child.exited(0), "{child:?}");
        let (head, status) = child.output.split_at(12);
        let nums: Vec<i32> = head
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(nums, [0, 0, libc::EPERM], "dumpable, setresuid, unshare");
        let status = std::str::from_utf8(status).unwrap();
        let init = Capability::mask(DEFAULT_ROOT_CAPS) | Capability::mask(INIT_EXTRA_CAPS);
        assert_eq!(hex(status, "CapBnd"), init, "{status}");
        assert_eq!(status_field(status, "NoNewPrivs"), Some("1"));
        assert_eq!(status_field(status, "Seccomp"), Some("2"));
    }
}
