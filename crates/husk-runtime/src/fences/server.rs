//! The fences of `husk serve`'s own process, the one that parses tenants' HTTP: once its
//! privileged helpers are forked and its listener is bound, it becomes an unprivileged user
//! with no capability (none in any set, the bounding set emptied), non-dumpable, under
//! `no_new_privs`, a Landlock domain that lets it open nothing but a few read-only places
//! (`/proc`, the cgroup tree for sandboxes' usage, the kernel's random devices), and a seccomp filter against what a
//! compromised server could still try without privileges: new namespaces (an unprivileged
//! user namespace would give it capabilities over new ones), mounts, module loading,
//! tracing, BPF, keyrings, io_uring, handles to files by number, and running any program.
//!
//! [`ServerFences::prepare`] allocates (compiles the filter, opens the Landlock paths);
//! [`ServerFences::apply`] only makes system calls, in a process that must be
//! single-threaded (Landlock restricts the calling thread, and the threads it starts later).

use std::path::Path;

use ::landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreated,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use seccompiler::BpfProgram;

use super::seccomp_rules::{deny, probe, ArgMatch, DenyRule, BAD_FD, BAD_FLAGS, NULL};
use super::{caps, landlock, seccomp, FenceError, LandlockState};

/// Namespace flags of `clone(2)`: each gets a rule of its own (a rule matches one bit).
const CLONE_NEW: [(&str, u32); 7] = [
    ("clone_newns", libc::CLONE_NEWNS as u32),
    ("clone_newcgroup", libc::CLONE_NEWCGROUP as u32),
    ("clone_newuts", libc::CLONE_NEWUTS as u32),
    ("clone_newipc", libc::CLONE_NEWIPC as u32),
    ("clone_newuser", libc::CLONE_NEWUSER as u32),
    ("clone_newpid", libc::CLONE_NEWPID as u32),
    ("clone_newnet", libc::CLONE_NEWNET as u32),
];

/// A rule denying `clone` with namespace flag `flag`. The probe adds `CLONE_NEWNS|CLONE_FS`,
/// which the kernel refuses with EINVAL: no child is ever made.
const fn clone_new(name: &'static str, flag: u32) -> DenyRule {
    let bad = (flag | libc::CLONE_NEWNS as u32 | libc::CLONE_FS as u32) as u64;
    DenyRule {
        name,
        why: "new namespaces are the spawner's to make; an unprivileged user namespace would \
              give the server capabilities over new ones",
        syscall: libc::SYS_clone,
        arg: Some(ArgMatch::MaskedEq {
            index: 0,
            mask: flag,
            value: flag,
        }),
        errno: libc::EPERM,
        probe: probe(libc::SYS_clone, [bad, 0, 0, 0, 0, 0]),
    }
}

const NS: &str = "namespaces and mounts are the spawner's";
const KERNEL: &str = "the server changes nothing in the kernel";
const TRACE: &str = "the server reads no other process's memory";
const SURFACE: &str = "kernel interfaces the server never uses, with a history of exploits";
const IDS: &str = "the server's ids are set once, at the drop";
const EXEC: &str = "the server runs no program: a shell is the first thing an attacker wants";

/// What the server may not call once it is unprivileged. Probes fail harmlessly without the
/// filter (NULL pointers, bad descriptors, invalid flags), or change nothing.
pub static SERVER_DENY_RULES: &[DenyRule] = &[
    clone_new(CLONE_NEW[0].0, CLONE_NEW[0].1),
    clone_new(CLONE_NEW[1].0, CLONE_NEW[1].1),
    clone_new(CLONE_NEW[2].0, CLONE_NEW[2].1),
    clone_new(CLONE_NEW[3].0, CLONE_NEW[3].1),
    clone_new(CLONE_NEW[4].0, CLONE_NEW[4].1),
    clone_new(CLONE_NEW[5].0, CLONE_NEW[5].1),
    clone_new(CLONE_NEW[6].0, CLONE_NEW[6].1),
    DenyRule {
        name: "clone3",
        why: "clone3 passes its flags in memory, which seccomp cannot inspect; ENOSYS makes libc \
              fall back to clone(2), whose flags the rules above check",
        syscall: libc::SYS_clone3,
        arg: None,
        errno: libc::ENOSYS,
        probe: probe(libc::SYS_clone3, [NULL, 0, 0, 0, 0, 0]),
    },
    deny("unshare", NS, libc::SYS_unshare, [BAD_FLAGS, 0, 0, 0, 0, 0]),
    deny("setns", NS, libc::SYS_setns, [BAD_FD, 0, 0, 0, 0, 0]),
    deny("mount", NS, libc::SYS_mount, [NULL, NULL, NULL, 0, NULL, 0]),
    deny("umount2", NS, libc::SYS_umount2, [NULL, 0, 0, 0, 0, 0]),
    deny(
        "pivot_root",
        NS,
        libc::SYS_pivot_root,
        [NULL, NULL, 0, 0, 0, 0],
    ),
    deny("chroot", NS, libc::SYS_chroot, [NULL, 0, 0, 0, 0, 0]),
    deny(
        "open_tree",
        NS,
        libc::SYS_open_tree,
        [BAD_FD, NULL, BAD_FLAGS, 0, 0, 0],
    ),
    deny(
        "move_mount",
        NS,
        libc::SYS_move_mount,
        [BAD_FD, NULL, BAD_FD, NULL, BAD_FLAGS, 0],
    ),
    deny(
        "fsopen",
        NS,
        libc::SYS_fsopen,
        [NULL, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "fsconfig",
        NS,
        libc::SYS_fsconfig,
        [BAD_FD, BAD_FLAGS, NULL, NULL, 0, 0],
    ),
    deny(
        "fsmount",
        NS,
        libc::SYS_fsmount,
        [BAD_FD, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "fspick",
        NS,
        libc::SYS_fspick,
        [BAD_FD, NULL, BAD_FLAGS, 0, 0, 0],
    ),
    deny(
        "mount_setattr",
        NS,
        libc::SYS_mount_setattr,
        [BAD_FD, NULL, BAD_FLAGS, NULL, 0, 0],
    ),
    deny(
        "init_module",
        KERNEL,
        libc::SYS_init_module,
        [NULL, 0, NULL, 0, 0, 0],
    ),
    deny(
        "finit_module",
        KERNEL,
        libc::SYS_finit_module,
        [BAD_FD, NULL, BAD_FLAGS, 0, 0, 0],
    ),
    deny(
        "delete_module",
        KERNEL,
        libc::SYS_delete_module,
        [NULL, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "kexec_load",
        KERNEL,
        libc::SYS_kexec_load,
        [0, 0, NULL, BAD_FLAGS, 0, 0],
    ),
    deny(
        "kexec_file_load",
        KERNEL,
        libc::SYS_kexec_file_load,
        [BAD_FD, BAD_FD, 0, NULL, BAD_FLAGS, 0],
    ),
    // Bad magic numbers: EINVAL.
    deny("reboot", KERNEL, libc::SYS_reboot, [0, 0, 0, NULL, 0, 0]),
    deny("swapon", KERNEL, libc::SYS_swapon, [NULL, 0, 0, 0, 0, 0]),
    deny("swapoff", KERNEL, libc::SYS_swapoff, [NULL, 0, 0, 0, 0, 0]),
    // A pointer to nowhere (not NULL, which would turn accounting off): EFAULT.
    deny("acct", KERNEL, libc::SYS_acct, [1, 0, 0, 0, 0, 0]),
    deny(
        "ptrace",
        TRACE,
        libc::SYS_ptrace,
        [BAD_FLAGS, 0, 0, 0, 0, 0],
    ),
    deny(
        "process_vm_readv",
        TRACE,
        libc::SYS_process_vm_readv,
        [0, NULL, 0, NULL, 0, BAD_FLAGS],
    ),
    deny(
        "process_vm_writev",
        TRACE,
        libc::SYS_process_vm_writev,
        [0, NULL, 0, NULL, 0, BAD_FLAGS],
    ),
    deny("bpf", SURFACE, libc::SYS_bpf, [BAD_FLAGS, NULL, 0, 0, 0, 0]),
    deny(
        "perf_event_open",
        SURFACE,
        libc::SYS_perf_event_open,
        [NULL, 0, 0, 0, 0, 0],
    ),
    deny(
        "userfaultfd",
        SURFACE,
        libc::SYS_userfaultfd,
        [BAD_FLAGS, 0, 0, 0, 0, 0],
    ),
    deny(
        "io_uring_setup",
        SURFACE,
        libc::SYS_io_uring_setup,
        [0, NULL, 0, 0, 0, 0],
    ),
    deny(
        "keyctl",
        SURFACE,
        libc::SYS_keyctl,
        [BAD_FLAGS, 0, 0, 0, 0, 0],
    ),
    deny(
        "add_key",
        SURFACE,
        libc::SYS_add_key,
        [NULL, NULL, NULL, 0, 0, 0],
    ),
    deny(
        "request_key",
        SURFACE,
        libc::SYS_request_key,
        [NULL, NULL, NULL, 0, 0, 0],
    ),
    deny(
        "open_by_handle_at",
        SURFACE,
        libc::SYS_open_by_handle_at,
        [BAD_FD, NULL, 0, 0, 0, 0],
    ),
    deny(
        "name_to_handle_at",
        SURFACE,
        libc::SYS_name_to_handle_at,
        [BAD_FD, NULL, NULL, NULL, BAD_FLAGS, 0],
    ),
    deny(
        "execve",
        EXEC,
        libc::SYS_execve,
        [NULL, NULL, NULL, 0, 0, 0],
    ),
    deny(
        "execveat",
        EXEC,
        libc::SYS_execveat,
        [BAD_FD, NULL, NULL, NULL, 0, 0],
    ),
    // -1 for every id: "leave it as it is", a no-op when unfiltered.
    deny(
        "setuid",
        IDS,
        libc::SYS_setuid,
        [u32::MAX as u64, 0, 0, 0, 0, 0],
    ),
    deny(
        "setgid",
        IDS,
        libc::SYS_setgid,
        [u32::MAX as u64, 0, 0, 0, 0, 0],
    ),
    deny(
        "setreuid",
        IDS,
        libc::SYS_setreuid,
        [u32::MAX as u64, u32::MAX as u64, 0, 0, 0, 0],
    ),
    deny(
        "setregid",
        IDS,
        libc::SYS_setregid,
        [u32::MAX as u64, u32::MAX as u64, 0, 0, 0, 0],
    ),
    deny(
        "setresuid",
        IDS,
        libc::SYS_setresuid,
        [u32::MAX as u64, u32::MAX as u64, u32::MAX as u64, 0, 0, 0],
    ),
    deny(
        "setresgid",
        IDS,
        libc::SYS_setresgid,
        [u32::MAX as u64, u32::MAX as u64, u32::MAX as u64, 0, 0, 0],
    ),
    deny(
        "setgroups",
        IDS,
        libc::SYS_setgroups,
        [BAD_FLAGS, NULL, 0, 0, 0, 0],
    ),
];

/// The server's fences, prepared.
pub struct ServerFences {
    programs: Vec<BpfProgram>,
    /// `None` on a kernel without Landlock.
    ruleset: Option<RulesetCreated>,
    last_cap: u32,
}

/// What [`ServerFences::apply`] could enforce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub landlock: LandlockState,
    /// Landlock enforced every right it was asked to (a kernel older than the newest ABI
    /// enforces what it has).
    pub landlock_complete: bool,
}

impl std::fmt::Debug for ServerFences {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerFences")
            .field("programs", &self.programs.len())
            .field("landlock", &self.ruleset.is_some())
            .finish()
    }
}

impl ServerFences {
    /// Compiles the filter and builds the Landlock ruleset: every file-system right handled,
    /// reading files and listing directories allowed beneath each of `readable` that exists
    /// (a file: reading it),
    /// nothing else anywhere; signals and abstract sockets scoped to the server's own domain.
    pub fn prepare(readable: &[&'static str]) -> Result<ServerFences, FenceError> {
        let programs = seccomp::compile(SERVER_DENY_RULES)?;
        let ruleset = if landlock::kernel_abi() > 0 {
            let all = AccessFs::from_all(ABI::V10);
            let mut r = Ruleset::default()
                .handle_access(all)?
                .scope(Scope::AbstractUnixSocket | Scope::Signal)?
                .create()?;
            for path in readable {
                if !Path::new(path).exists() {
                    continue;
                }
                let fd =
                    PathFd::new(path).map_err(|error| FenceError::LandlockPath { path, error })?;
                r = r.add_rule(PathBeneath::new(fd, AccessFs::ReadFile | AccessFs::ReadDir))?;
            }
            Some(r)
        } else {
            None
        };
        Ok(ServerFences {
            programs,
            ruleset,
            last_cap: caps::last_cap(),
        })
    }

    /// Becomes `uid`:`gid` (no supplementary groups) with no capability, non-dumpable, under
    /// `no_new_privs`, the Landlock domain and the filter. The process must be
    /// single-threaded (checked), and the ids not root's.
    pub fn apply(self, uid: u32, gid: u32) -> Result<Applied, FenceError> {
        if uid == 0 || gid == 0 {
            return Err(FenceError::Sys {
                op: "dropping to root's uid or gid",
                error: std::io::Error::from_raw_os_error(libc::EINVAL),
            });
        }
        match crate::sys::settled_thread_count() {
            Ok(1) => {}
            Ok(_) => {
                return Err(FenceError::Sys {
                    op: "dropping privileges in a process with threads",
                    error: std::io::Error::from_raw_os_error(libc::EBUSY),
                })
            }
            Err(error) => {
                return Err(FenceError::Sys {
                    op: "counting threads",
                    error,
                })
            }
        }
        // Needs CAP_SETPCAP: before the uid changes.
        caps::drop_bounding_except(0, self.last_cap)?;
        // SAFETY: setgroups with an empty list; setresgid/setresuid take integers.
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(FenceError::last_os("setgroups"));
            }
            if libc::setresgid(gid, gid, gid) != 0 {
                return Err(FenceError::last_os("setresgid"));
            }
            if libc::setresuid(uid, uid, uid) != 0 {
                return Err(FenceError::last_os("setresuid"));
            }
        }
        // Leaving uid 0 cleared the permitted and effective sets (no SECBIT_KEEP_CAPS); this
        // also empties the inheritable and ambient ones, and checks.
        caps::restrict_process_caps(0)?;
        undumpable_without_new_privs()?;
        let (landlock, landlock_complete) = match self.ruleset {
            Some(r) => {
                let status = r.restrict_self()?;
                let abi = landlock::kernel_abi();
                match status.ruleset {
                    RulesetStatus::NotEnforced => (LandlockState::Unsupported, false),
                    RulesetStatus::PartiallyEnforced => (LandlockState::Enforced { abi }, false),
                    RulesetStatus::FullyEnforced => (LandlockState::Enforced { abi }, true),
                }
            }
            None => (LandlockState::Unsupported, false),
        };
        seccomp::install(&self.programs, true)?;
        Ok(Applied {
            landlock,
            landlock_complete,
        })
    }
}

/// For a helper that keeps root's uid but needs no privilege once it is set up (the state
/// helper, once the database and the master key are open): every capability set emptied,
/// non-dumpable, `no_new_privs`, and the server's seccomp filter. As uid 0 it still opens the
/// files it owns (the state directory's), and nothing of another user's.
pub fn drop_all_capabilities() -> Result<(), FenceError> {
    let programs = seccomp::compile(SERVER_DENY_RULES)?;
    caps::drop_bounding_except(0, caps::last_cap())?;
    caps::restrict_process_caps(0)?;
    undumpable_without_new_privs()?;
    seccomp::install(&programs, true)
}

/// Non-dumpable (no ptrace or /proc access by processes of the same uid), and
/// `no_new_privs` (which seccomp needs, and which no exec could undo).
fn undumpable_without_new_privs() -> Result<(), FenceError> {
    // SAFETY: PR_SET_DUMPABLE and PR_SET_NO_NEW_PRIVS take integers and touch no memory.
    unsafe {
        if libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 {
            return Err(FenceError::last_os("prctl(PR_SET_DUMPABLE)"));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(FenceError::last_os("prctl(PR_SET_NO_NEW_PRIVS)"));
        }
    }
    Ok(())
}
