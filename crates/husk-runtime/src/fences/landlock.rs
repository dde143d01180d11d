//! The Landlock rulesets (see [`super::Fences`] for the policy).
//!
//! Two rulesets. The sandbox's, enforced once on PID 1 by [`LandlockFence::apply`]: Landlock
//! rules name inodes, and the fences are prepared before `pivot_root`, so `apply` builds it
//! for the root PID 1 has then. And each command's own, nested in the sandbox's
//! ([`LandlockFence::command_ruleset`]): built once in PID 1 for its root and kept open; the
//! forked child only calls `landlock_restrict_self` on the kept fd (one syscall, no
//! allocation).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Mutex;

use ::landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, Scope, ABI,
};

use super::FenceError;

/// The newest Landlock ABI the `landlock` crate knows: all its filesystem rights are handled.
/// Rights the running kernel lacks are dropped (best-effort compatibility).
const NEWEST_ABI: ABI = ABI::V10;

/// Whether the fences will enforce Landlock on this kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LandlockState {
    /// The kernel has no (enabled) Landlock: the other fences still apply.
    Unsupported,
    /// Landlock is enforced, with the kernel's ABI version. Device ioctls are controlled from
    /// ABI 5, signal and abstract-socket scoping from ABI 6.
    Enforced {
        /// The kernel's Landlock ABI version.
        abi: i32,
    },
}

impl LandlockState {
    /// Whether signals to processes outside the sandbox's Landlock domain are blocked.
    pub fn scopes_signals(self) -> bool {
        matches!(self, LandlockState::Enforced { abi } if abi >= 6)
    }
}

#[derive(Debug)]
pub(super) struct LandlockFence {
    abi: i32,
    prepared: Option<Prepared>,
    /// The per-command ruleset, once built.
    command: Mutex<Option<CommandRuleset>>,
}

/// The ruleset every command's own domain is made of, and the root it was built for.
#[derive(Debug)]
struct CommandRuleset {
    fd: OwnedFd,
    /// `(st_dev, st_ino)` of `/` when it was built.
    root: (u64, u64),
}

/// A ruleset built at prepare time. Kept only to show (in a test) why `apply` never uses it:
/// built before pivot_root, its rules point at the host's directories.
#[derive(Debug)]
struct Prepared {
    #[cfg_attr(not(test), allow(dead_code))]
    ruleset: RulesetCreated,
}

/// The kernel's Landlock ABI version, or <= 0 if unsupported.
pub(super) fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr, size 0 and the VERSION flag the kernel only returns the ABI.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(v).unwrap_or(0).max(0)
}

fn open(path: &'static str) -> Result<PathFd, FenceError> {
    PathFd::new(path).map_err(|error| FenceError::LandlockPath { path, error })
}

/// Creates the ruleset for the current root directory.
fn build_ruleset() -> Result<RulesetCreated, FenceError> {
    let all = AccessFs::from_all(NEWEST_ABI);
    let devices = AccessFs::MakeChar | AccessFs::MakeBlock | AccessFs::IoctlDev;
    let mut ruleset = Ruleset::default()
        .handle_access(all)?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?
        .create()?
        .add_rule(PathBeneath::new(open("/")?, all & !devices))?;
    // A root without /dev gets no device ioctls at all.
    if let Ok(dev) = PathFd::new("/dev") {
        ruleset = ruleset.add_rule(PathBeneath::new(dev, AccessFs::IoctlDev))?;
    }
    Ok(ruleset)
}

/// The ruleset of a command's own domain: it handles `Execute` and `Refer` and allows both
/// beneath `/`, so it restricts nothing the sandbox's domain allows (Landlock needs at least
/// one handled right for a ruleset). `Refer` must be granted explicitly: Landlock treats it as
/// handled by every domain (ABI >= 2), so a domain without it makes every link or rename into
/// another directory fail with EXDEV. No scopes: signals and abstract sockets between the
/// commands of one sandbox keep working; the sandbox's domain already scopes both to the
/// sandbox.
fn build_command_ruleset() -> Result<OwnedFd, FenceError> {
    let rights = AccessFs::Execute | AccessFs::Refer;
    let ruleset = Ruleset::default()
        .handle_access(rights)?
        .create()?
        .add_rule(PathBeneath::new(open("/")?, rights))?;
    Option::<OwnedFd>::from(ruleset).ok_or_else(|| FenceError::Sys {
        op: "landlock: the per-command ruleset has no fd",
        error: std::io::Error::from_raw_os_error(libc::EOPNOTSUPP),
    })
}

fn root_id() -> Result<(u64, u64), FenceError> {
    let m = std::fs::metadata("/").map_err(|error| FenceError::Sys {
        op: "stat /",
        error,
    })?;
    Ok((m.dev(), m.ino()))
}

impl LandlockFence {
    pub(super) fn prepare() -> Result<LandlockFence, FenceError> {
        let abi = kernel_abi();
        let prepared = if abi > 0 {
            Some(Prepared {
                ruleset: build_ruleset()?,
            })
        } else {
            None
        };
        Ok(LandlockFence {
            abi,
            prepared,
            command: Mutex::new(None),
        })
    }

    pub(super) fn state(&self) -> LandlockState {
        if self.prepared.is_some() {
            LandlockState::Enforced { abi: self.abi }
        } else {
            LandlockState::Unsupported
        }
    }

    /// Restricts the calling thread (and its future children). Also sets no_new_privs.
    /// Does nothing if the kernel does not support Landlock.
    pub(super) fn apply(&self) -> Result<(), FenceError> {
        if self.prepared.is_none() {
            return Ok(());
        }
        // Always built here, for the root the caller has now: a ruleset prepared before
        // pivot_root points at the host's directories (and its fd may have been closed since).
        build_ruleset()?.restrict_self()?;
        // The commands' ruleset too, now rather than at the first command.
        self.command_ruleset()?;
        Ok(())
    }

    /// In the parent, before forking a command: the fd of the ruleset of its own domain (see
    /// [`build_command_ruleset`]), built on first use for the current root and rebuilt if the
    /// root changed since; `None` without Landlock. The fd stays open as long as `self`.
    pub(super) fn command_ruleset(&self) -> Result<Option<RawFd>, FenceError> {
        if self.prepared.is_none() {
            return Ok(None);
        }
        let root = root_id()?;
        let mut slot = self.command.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = slot.as_ref().filter(|c| c.root == root) {
            return Ok(Some(c.fd.as_raw_fd()));
        }
        let fd = build_command_ruleset()?;
        let raw = fd.as_raw_fd();
        *slot = Some(CommandRuleset { fd, root });
        Ok(Some(raw))
    }
}

/// In a forked child with no_new_privs set: enters a new Landlock domain made of the ruleset
/// `fd`, nested in the current one. One syscall, no allocation; async-signal-safe.
pub(super) fn restrict_self(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: landlock_restrict_self(2) takes a ruleset fd and flags (0) and reads no memory
    // of the caller; `fd` is the parent's ruleset fd, inherited across fork and still open.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_restrict_self,
            fd as libc::c_long,
            0 as libc::c_long,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    use super::super::testing::{errno, in_child, TempDir};
    use super::*;

    fn cpath(p: &std::path::Path) -> CString {
        CString::new(p.as_os_str().as_bytes()).unwrap()
    }

    /// 0 on success, else errno.
    fn rc(r: libc::c_int) -> i32 {
        if r == 0 {
            0
        } else {
            errno()
        }
    }

    struct Paths {
        fifo: CString,
        chr: CString,
        blk: CString,
        /// A /dev/null node created outside /dev before the domain.
        null_outside: CString,
    }

    fn paths(dir: &TempDir) -> Paths {
        let null_outside = dir.0.join("null");
        let c = cpath(&null_outside);
        // SAFETY: c is NUL-terminated.
        let r = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
        assert_eq!(r, 0, "mknod: {}", std::io::Error::last_os_error());
        Paths {
            fifo: cpath(&dir.0.join("fifo")),
            chr: cpath(&dir.0.join("chr")),
            blk: cpath(&dir.0.join("blk")),
            null_outside: c,
        }
    }

    /// In the child: mknod fifo/chr/blk, TCGETS on /dev/null and on the copy outside /dev,
    /// kill(getppid(), 0). Sends 6 errnos (0 = success).
    fn probe(out: &super::super::testing::Child, p: &Paths) {
        // SAFETY: all paths are NUL-terminated; ioctl writes a termios into a local; kill
        // with signal 0 only checks permissions.
        unsafe {
            out.send_i32(rc(libc::mknod(p.fifo.as_ptr(), libc::S_IFIFO | 0o600, 0)));
            let dev = libc::makedev(1, 3);
            out.send_i32(rc(libc::mknod(p.chr.as_ptr(), libc::S_IFCHR | 0o600, dev)));
            let dev = libc::makedev(7, 200);
            out.send_i32(rc(libc::mknod(p.blk.as_ptr(), libc::S_IFBLK | 0o600, dev)));
            let mut tio: libc::termios = std::mem::zeroed();
            for path in [c"/dev/null".as_ptr(), p.null_outside.as_ptr()] {
                let fd = libc::open(path, libc::O_RDWR | libc::O_CLOEXEC);
                if fd < 0 {
                    out.send_i32(-errno());
                } else {
                    out.send_i32(rc(libc::ioctl(fd, libc::TCGETS, &mut tio)));
                    libc::close(fd);
                }
            }
            out.send_i32(rc(libc::kill(libc::getppid(), 0)));
        }
    }

    #[test]
    fn landlock_denies_devices_and_signals_outside_the_domain() {
        let fence = LandlockFence::prepare().expect("prepare");
        let state = fence.state();
        assert_eq!(
            state == LandlockState::Unsupported,
            kernel_abi() <= 0,
            "{state:?}"
        );

        let control_dir = TempDir::new("ll-control");
        let p = paths(&control_dir);
        let control = in_child(|out| {
            probe(out, &p);
            0
        });
        assert!(control.exited(0), "{control:?}");
        // Without Landlock, root creates all three nodes, /dev/null is no tty wherever it is,
        // and may signal its parent.
        assert_eq!(
            control.i32s(),
            [0, 0, 0, libc::ENOTTY, libc::ENOTTY, 0],
            "control"
        );

        let dir = TempDir::new("ll");
        let p = paths(&dir);
        let child = in_child(|out| {
            if fence.apply().is_err() {
                return 2;
            }
            probe(out, &p);
            0
        });
        assert!(child.exited(0), "{child:?}");
        let got = child.i32s();
        match state {
            LandlockState::Unsupported => assert_eq!(got, control.i32s()),
            LandlockState::Enforced { abi } => {
                assert_eq!(got[0], 0, "FIFO creation must stay allowed");
                assert_eq!(got[1], libc::EACCES, "char device creation must be denied");
                assert_eq!(got[2], libc::EACCES, "block device creation must be denied");
                assert_eq!(
                    got[3],
                    libc::ENOTTY,
                    "ioctls beneath /dev must reach the device"
                );
                let outside = if abi >= 5 { libc::EACCES } else { libc::ENOTTY };
                assert_eq!(got[4], outside, "device ioctl outside /dev");
                let signal = if abi >= 6 { libc::EPERM } else { 0 };
                assert_eq!(got[5], signal, "kill(getppid(), 0) from inside the domain");
            }
        }
    }

    /// The commands' ruleset is built once and kept: every command enters the same one.
    #[test]
    fn the_command_ruleset_is_built_once() {
        let fence = LandlockFence::prepare().expect("prepare");
        let first = fence.command_ruleset().expect("command ruleset");
        assert_eq!(first.is_none(), fence.state() == LandlockState::Unsupported);
        assert_eq!(fence.command_ruleset().expect("command ruleset"), first);
    }

    /// Linking and renaming into another directory (npm's cache, git's objects, pip, `mv`)
    /// work inside the sandbox's domain and a command's domain nested in it. Landlock treats
    /// `Refer` as handled by every ruleset (ABI >= 2): a domain that does not grant it beneath
    /// `/` makes both fail with EXDEV. Same-directory links and renames never need it.
    #[test]
    fn links_and_renames_across_directories_work_in_a_command_domain() {
        let fence = LandlockFence::prepare().expect("prepare");
        let dir = TempDir::new("ll-refer");
        for sub in ["a", "b"] {
            std::fs::create_dir(dir.0.join(sub)).unwrap();
        }
        for f in ["a/f", "a/g"] {
            std::fs::write(dir.0.join(f), b"x").unwrap();
        }
        let (src, dst) = (cpath(&dir.0.join("a/f")), cpath(&dir.0.join("b/f")));
        let (from, to) = (cpath(&dir.0.join("a/g")), cpath(&dir.0.join("b/g")));
        let child = in_child(|out| {
            if fence.apply().is_err() {
                return 2;
            }
            match fence.command_ruleset() {
                Ok(Some(fd)) => {
                    if restrict_self(fd).is_err() {
                        return 3;
                    }
                }
                Ok(None) => {}
                Err(_) => return 4,
            }
            // SAFETY: NUL-terminated paths.
            unsafe {
                out.send_i32(rc(libc::link(src.as_ptr(), dst.as_ptr())));
                out.send_i32(rc(libc::rename(from.as_ptr(), to.as_ptr())));
            }
            0
        });
        assert!(child.exited(0), "{child:?}");
        // ABI 1 has no `Refer`: reparenting is always denied under it.
        let want = match fence.state() {
            LandlockState::Enforced { abi: 1 } => libc::EXDEV,
            _ => 0,
        };
        assert_eq!(
            child.i32s(),
            [want, want],
            "link, rename across directories"
        );
    }

    /// If the root changed after prepare (prepare ran before pivot_root), the ruleset is rebuilt
    /// for the new root; the stale one would deny everything there.
    #[test]
    fn ruleset_is_rebuilt_for_a_new_root() {
        let fence = LandlockFence::prepare().expect("prepare");
        let Some(prepared) = &fence.prepared else {
            // Nothing to rebuild without Landlock; apply must still succeed.
            let child = in_child(|_| i32::from(fence.apply().is_err()));
            assert!(child.exited(0), "{child:?}");
            return;
        };
        let dir = TempDir::new("ll-root");
        let new_root = cpath(&dir.0);
        let old_root = cpath(&dir.0.join("old"));
        let run = |stale: bool| {
            in_child(|out| {
                // SAFETY: NUL-terminated paths and NULL optional arguments; this forked child
                // has its own mount namespace, so nothing outside it changes.
                let pivoted = unsafe {
                    let null = std::ptr::null();
                    libc::unshare(libc::CLONE_NEWNS) == 0
                        && libc::mount(
                            null,
                            c"/".as_ptr(),
                            null,
                            libc::MS_REC | libc::MS_PRIVATE,
                            null.cast(),
                        ) == 0
                        && libc::mount(
                            c"tmpfs".as_ptr(),
                            new_root.as_ptr(),
                            c"tmpfs".as_ptr(),
                            0,
                            null.cast(),
                        ) == 0
                        && libc::mkdir(old_root.as_ptr(), 0o700) == 0
                        && libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), old_root.as_ptr())
                            == 0
                        && libc::chdir(c"/".as_ptr()) == 0
                        && libc::umount2(c"/old".as_ptr(), libc::MNT_DETACH) == 0
                };
                if !pivoted {
                    return 3;
                }
                let applied = if stale {
                    match prepared.ruleset.try_clone() {
                        Ok(r) => r.restrict_self().is_ok(),
                        Err(_) => false,
                    }
                } else {
                    fence.apply().is_ok()
                };
                if !applied {
                    return 2;
                }
                // SAFETY: NUL-terminated paths.
                unsafe {
                    out.send_i32(rc(libc::mknod(c"/fifo".as_ptr(), libc::S_IFIFO | 0o600, 0)));
                    let dev = libc::makedev(1, 3);
                    out.send_i32(rc(libc::mknod(
                        c"/chr".as_ptr(),
                        libc::S_IFCHR | 0o600,
                        dev,
                    )));
                }
                0
            })
        };
        let stale = run(true);
        assert!(stale.exited(0), "{stale:?}");
        assert_eq!(
            stale.i32s(),
            [libc::EACCES, libc::EACCES],
            "the stale ruleset denies all"
        );
        let rebuilt = run(false);
        assert!(rebuilt.exited(0), "{rebuilt:?}");
        assert_eq!(rebuilt.i32s(), [0, libc::EACCES]);
    }
}
