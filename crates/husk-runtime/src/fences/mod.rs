//! The fences around a sandboxed process: resource limits, capabilities, no_new_privs, Landlock
//! and seccomp.
//!
//! Usage, in husk's init (the sandbox's PID 1):
//!
//! ```text
//! let fences = Fences::prepare()?;          // once, before forking: compiles BPF, opens "/"
//! fences.apply_to_init()?;                  // once init needs no more privileged setup
//! // for each command:
//! fork() -> in the child:
//!     setgroups / setresgid
//!     fences.drop_bounding(root)?;          // needs CAP_SETPCAP: before setresuid
//!     setresuid(uid, uid, uid)
//!     fences.apply_after_setuid(root, &rlimits)?;
//!     execve(...)
//! ```
//!
//! `prepare` allocates; `drop_bounding` and `apply_after_setuid` only make syscalls on prepared
//! data (they allocate nothing unless the root directory changed since `prepare`, see
//! [`Fences::prepare`]). The policy itself is data: [`DENY_RULES`] (seccomp),
//! [`DEFAULT_ROOT_CAPS`] (capabilities) and the Landlock rules described on [`Fences`].

mod caps;
mod landlock;
mod rlimits;
mod seccomp;
mod seccomp_rules;

use std::io;

pub use self::caps::{Capability, DEFAULT_ROOT_CAPS, INIT_EXTRA_CAPS};
pub use self::landlock::LandlockState;
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
/// [`Fences::landlock_state`].
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
    /// already filtered. Landlock is not applied here: the domain comes from init
    /// ([`Fences::apply_to_init`]).
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
    /// inherits the same domain, so commands of one sandbox can still signal each other (a
    /// `pkill` of a server started by an earlier command works) and init can signal them all,
    /// while nothing in the sandbox can signal or reach abstract sockets outside it. Doing it
    /// once also keeps the ruleset's cost off every command start.
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
