//! The seccomp policy, as data: every syscall (or syscall + argument pattern) that sandboxed code
//! may not make, why, which errno it gets, and a probe call that proves the rule works.
//!
//! Everything not listed here is allowed (the filter's default action is Allow); see
//! [`super::seccomp`] for how the table is compiled and installed.

/// A pattern on one syscall argument, compared on its low 32 bits.
///
/// Every argument the policy inspects is a 32-bit value in the kernel (`int` / `unsigned int`:
/// socket family, ioctl command, personality), or a flags word whose inspected bits are all in
/// the low 32 bits (clone/unshare flags). Comparing only the low half is therefore exact, and it
/// defeats "garbage in the upper half" tricks such as `ioctl(fd, 0x1_0000_5412)`, which the kernel
/// truncates to `TIOCSTI`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgMatch {
    /// `(args[index] as u32) & mask == value`.
    MaskedEq {
        /// Argument index, 0..=5.
        index: u8,
        /// Bits of the argument to compare.
        mask: u32,
        /// Expected value of the masked bits.
        value: u32,
    },
    /// `args[index] as u32` is none of `values`.
    NoneOf {
        /// Argument index, 0..=5.
        index: u8,
        /// The values that are allowed.
        values: &'static [u32],
    },
}

impl ArgMatch {
    /// Whether a call with these arguments matches (evaluates the pattern in Rust; the BPF
    /// program compiled from it must agree, which the tests check on the real kernel).
    pub fn matches(&self, args: &[u64; 6]) -> bool {
        match *self {
            ArgMatch::MaskedEq { index, mask, value } => {
                (args[usize::from(index)] as u32) & mask == value
            }
            ArgMatch::NoneOf { index, values } => {
                !values.contains(&(args[usize::from(index)] as u32))
            }
        }
    }
}

/// A call that a rule must deny. Its arguments are chosen so that, should the filter be missing,
/// the call fails harmlessly (bad fd, NULL pointer, invalid flags or magic) or only affects the
/// calling process. `vhangup` has no arguments: it hangs up the caller's controlling terminal,
/// so the tests call it from a process that `setsid()`ed first and therefore has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Syscall number (`libc::SYS_*`).
    pub nr: i64,
    /// The six raw arguments.
    pub args: [u64; 6],
}

/// One entry of the deny list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenyRule {
    /// Short unique name (used in test messages and logs).
    pub name: &'static str,
    /// Why sandboxed code may not make this call.
    pub why: &'static str,
    /// Syscall number (`libc::SYS_*`, x86_64).
    pub syscall: i64,
    /// Only deny calls whose arguments match; `None` denies every call.
    pub arg: Option<ArgMatch>,
    /// The errno the call fails with (`EPERM`, or `ENOSYS` for `clone3`).
    pub errno: i32,
    /// A call that this rule must deny.
    pub probe: Probe,
}

/// `-1` as a file descriptor argument.
pub(super) const BAD_FD: u64 = u64::MAX;
/// Flags with every bit set: rejected with `EINVAL` by every syscall taking flags.
pub(super) const BAD_FLAGS: u64 = 0xffff_ffff;
pub(super) const NULL: u64 = 0;
const EPERM: i32 = libc::EPERM;

pub(super) const fn probe(nr: i64, args: [u64; 6]) -> Probe {
    Probe { nr, args }
}

/// Shorthand for a rule denying every call of `syscall` with EPERM.
pub(super) const fn deny(
    name: &'static str,
    why: &'static str,
    syscall: i64,
    args: [u64; 6],
) -> DenyRule {
    DenyRule {
        name,
        why,
        syscall,
        arg: None,
        errno: EPERM,
        probe: probe(syscall, args),
    }
}

const CLONE_NEWUSER: u32 = libc::CLONE_NEWUSER as u32;

/// `fchmodat2` (Linux 6.6); not in every libc release yet.
const SYS_FCHMODAT2: i64 = 452;
const SETID_WHY: &str =
    "set-user/group-id bits: a file made set-id in a writable host mount would \
    run on the host as a sandbox uid (a later sandbox's), so sandboxed code may not create one";

/// A rule denying `syscall` when its mode argument `index` carries `bit` (S_ISUID or S_ISGID).
/// The probe passes a NULL path or a bad fd, so without the filter it fails with EFAULT/EBADF.
const fn setid(
    name: &'static str,
    syscall: i64,
    index: u8,
    bit: u32,
    mut args: [u64; 6],
) -> DenyRule {
    args[index as usize] = 0o755 | bit as u64;
    DenyRule {
        name,
        why: SETID_WHY,
        syscall,
        arg: Some(ArgMatch::MaskedEq {
            index,
            mask: bit,
            value: bit,
        }),
        errno: EPERM,
        probe: probe(syscall, args),
    }
}

const SUID: u32 = libc::S_ISUID;
const SGID: u32 = libc::S_ISGID;
const O_CREAT: u64 = libc::O_CREAT as u64;
const S_IFREG: u64 = libc::S_IFREG as u64;
const MOUNT_API_WHY: &str =
    "mount API: changing the mount tree is the sandbox supervisor's job, not the sandboxed code's";

/// THE seccomp policy. Order does not matter; rules for the same syscall are OR-ed.
pub static DENY_RULES: &[DenyRule] = &[
    // --- Set-id files (every call that sets a file's mode) ----------------------------------------
    setid(
        "chmod_setuid",
        libc::SYS_chmod,
        1,
        SUID,
        [NULL, 0, 0, 0, 0, 0],
    ),
    setid(
        "chmod_setgid",
        libc::SYS_chmod,
        1,
        SGID,
        [NULL, 0, 0, 0, 0, 0],
    ),
    setid(
        "fchmod_setuid",
        libc::SYS_fchmod,
        1,
        SUID,
        [BAD_FD, 0, 0, 0, 0, 0],
    ),
    setid(
        "fchmod_setgid",
        libc::SYS_fchmod,
        1,
        SGID,
        [BAD_FD, 0, 0, 0, 0, 0],
    ),
    setid(
        "fchmodat_setuid",
        libc::SYS_fchmodat,
        2,
        SUID,
        [BAD_FD, NULL, 0, 0, 0, 0],
    ),
    setid(
        "fchmodat_setgid",
        libc::SYS_fchmodat,
        2,
        SGID,
        [BAD_FD, NULL, 0, 0, 0, 0],
    ),
    setid(
        "fchmodat2_setuid",
        SYS_FCHMODAT2,
        2,
        SUID,
        [BAD_FD, NULL, 0, 0, 0, 0],
    ),
    setid(
        "fchmodat2_setgid",
        SYS_FCHMODAT2,
        2,
        SGID,
        [BAD_FD, NULL, 0, 0, 0, 0],
    ),
    setid(
        "open_setuid",
        libc::SYS_open,
        2,
        SUID,
        [NULL, O_CREAT, 0, 0, 0, 0],
    ),
    setid(
        "open_setgid",
        libc::SYS_open,
        2,
        SGID,
        [NULL, O_CREAT, 0, 0, 0, 0],
    ),
    setid(
        "openat_setuid",
        libc::SYS_openat,
        3,
        SUID,
        [BAD_FD, NULL, O_CREAT, 0, 0, 0],
    ),
    setid(
        "openat_setgid",
        libc::SYS_openat,
        3,
        SGID,
        [BAD_FD, NULL, O_CREAT, 0, 0, 0],
    ),
    setid(
        "creat_setuid",
        libc::SYS_creat,
        1,
        SUID,
        [NULL, 0, 0, 0, 0, 0],
    ),
    setid(
        "creat_setgid",
        libc::SYS_creat,
        1,
        SGID,
        [NULL, 0, 0, 0, 0, 0],
    ),
    setid(
        "mknod_setuid",
        libc::SYS_mknod,
        1,
        SUID,
        [NULL, S_IFREG, 0, 0, 0, 0],
    ),
    setid(
        "mknod_setgid",
        libc::SYS_mknod,
        1,
        SGID,
        [NULL, S_IFREG, 0, 0, 0, 0],
    ),
    setid(
        "mknodat_setuid",
        libc::SYS_mknodat,
        2,
        SUID,
        [BAD_FD, NULL, S_IFREG, 0, 0, 0],
    ),
    setid(
        "mknodat_setgid",
        libc::SYS_mknodat,
        2,
        SGID,
        [BAD_FD, NULL, S_IFREG, 0, 0, 0],
    ),
    DenyRule {
        name: "openat2",
        why: "openat2 passes its mode in memory, which seccomp cannot inspect (see the set-id \
              rules); ENOSYS makes callers fall back to openat",
        syscall: libc::SYS_openat2,
        arg: None,
        errno: libc::ENOSYS,
        probe: probe(libc::SYS_openat2, [BAD_FD, NULL, NULL, 0, 0, 0]),
    },
    // --- Large kernel attack surfaces with no use for sandboxed workloads -----------------------
    deny(
        "io_uring_setup",
        "io_uring: a large, often-exploited kernel surface whose operations bypass seccomp",
        libc::SYS_io_uring_setup,
        [1, NULL, 0, 0, 0, 0],
    ),
    deny(
        "io_uring_enter",
        "io_uring: a large, often-exploited kernel surface whose operations bypass seccomp",
        libc::SYS_io_uring_enter,
        [BAD_FD, 0, 0, 0, NULL, 0],
    ),
    deny(
        "io_uring_register",
        "io_uring: a large, often-exploited kernel surface whose operations bypass seccomp",
        libc::SYS_io_uring_register,
        [BAD_FD, 0, NULL, 0, 0, 0],
    ),
    deny(
        "bpf",
        "eBPF: verifier and JIT are a recurring source of kernel privilege escalations",
        libc::SYS_bpf,
        [0xffff, NULL, 0, 0, 0, 0],
    ),
    deny(
        "perf_event_open",
        "perf events: kernel attack surface and side channels on the host",
        libc::SYS_perf_event_open,
        [NULL, 0, BAD_FD, BAD_FD, 0, 0],
    ),
    // --- Kernel and module loading ----------------------------------------------------------------
    deny(
        "kexec_load",
        "replaces the running kernel",
        libc::SYS_kexec_load,
        [0, 0x1_0000, NULL, BAD_FLAGS, 0, 0],
    ),
    deny(
        "kexec_file_load",
        "replaces the running kernel",
        libc::SYS_kexec_file_load,
        [BAD_FD, BAD_FD, 0, NULL, BAD_FLAGS, 0],
    ),
    deny(
        "init_module",
        "loads code into the kernel",
        libc::SYS_init_module,
        [NULL, 0, NULL, 0, 0, 0],
    ),
    deny(
        "finit_module",
        "loads code into the kernel",
        libc::SYS_finit_module,
        [BAD_FD, NULL, BAD_FLAGS, 0, 0, 0],
    ),
    deny(
        "delete_module",
        "unloads kernel code",
        libc::SYS_delete_module,
        [NULL, 0, 0, 0, 0, 0],
    ),
    // --- Kernel keyring: not namespaced -----------------------------------------------------------
    deny(
        "add_key",
        "kernel keyring is not namespaced: keys could leak between sandboxes and the host",
        libc::SYS_add_key,
        [NULL, NULL, NULL, 0, 0, 0],
    ),
    deny(
        "request_key",
        "kernel keyring is not namespaced: keys could leak between sandboxes and the host",
        libc::SYS_request_key,
        [NULL, NULL, NULL, 0, 0, 0],
    ),
    deny(
        "keyctl",
        "kernel keyring is not namespaced: keys could leak between sandboxes and the host",
        libc::SYS_keyctl,
        [BAD_FLAGS, 0, 0, 0, 0, 0],
    ),
    // --- File handles: can open files outside the sandbox's root ---------------------------------
    deny(
        "open_by_handle_at",
        "opens files by handle, bypassing path-based confinement (the 'shocker' escape)",
        libc::SYS_open_by_handle_at,
        [BAD_FD, NULL, 0, 0, 0, 0],
    ),
    deny(
        "name_to_handle_at",
        "produces file handles for open_by_handle_at and leaks inode identities",
        libc::SYS_name_to_handle_at,
        [BAD_FD, NULL, NULL, NULL, 0, 0],
    ),
    deny(
        "userfaultfd",
        "lets code stall the kernel mid-copy, a standard tool for exploiting kernel races",
        libc::SYS_userfaultfd,
        [BAD_FLAGS, 0, 0, 0, 0, 0],
    ),
    // --- Namespaces ---------------------------------------------------------------------------------
    DenyRule {
        name: "unshare_newuser",
        why: "nested user namespaces hand full capabilities over new namespaces to the caller, \
              exposing much more kernel surface",
        syscall: libc::SYS_unshare,
        arg: Some(ArgMatch::MaskedEq {
            index: 0,
            mask: CLONE_NEWUSER,
            value: CLONE_NEWUSER,
        }),
        errno: EPERM,
        probe: probe(libc::SYS_unshare, [CLONE_NEWUSER as u64, 0, 0, 0, 0, 0]),
    },
    DenyRule {
        name: "clone_newuser",
        why: "nested user namespaces hand full capabilities over new namespaces to the caller, \
              exposing much more kernel surface",
        syscall: libc::SYS_clone,
        arg: Some(ArgMatch::MaskedEq {
            index: 0,
            mask: CLONE_NEWUSER,
            value: CLONE_NEWUSER,
        }),
        errno: EPERM,
        // CLONE_NEWUSER|CLONE_FS is rejected with EINVAL by the kernel: no child is created.
        probe: probe(
            libc::SYS_clone,
            [
                (CLONE_NEWUSER | libc::CLONE_FS as u32) as u64,
                0,
                0,
                0,
                0,
                0,
            ],
        ),
    },
    DenyRule {
        name: "clone3",
        why: "clone3 passes its flags in memory, which seccomp cannot inspect; ENOSYS makes libc \
              fall back to clone(2), whose flags the clone_newuser rule checks",
        syscall: libc::SYS_clone3,
        arg: None,
        errno: libc::ENOSYS,
        probe: probe(libc::SYS_clone3, [NULL, 0, 0, 0, 0, 0]),
    },
    deny(
        "setns",
        "joining other namespaces is the supervisor's job",
        libc::SYS_setns,
        [BAD_FD, 0, 0, 0, 0, 0],
    ),
    // --- Devices and terminals --------------------------------------------------------------------
    DenyRule {
        name: "socket_vsock",
        why: "AF_VSOCK reaches the hypervisor and host services, outside any network namespace",
        syscall: libc::SYS_socket,
        arg: Some(ArgMatch::MaskedEq {
            index: 0,
            mask: u32::MAX,
            value: libc::AF_VSOCK as u32,
        }),
        errno: EPERM,
        // An invalid type flag makes the kernel reject the call before creating a socket or
        // loading a protocol module.
        probe: probe(
            libc::SYS_socket,
            [
                libc::AF_VSOCK as u64,
                (libc::SOCK_STREAM | 0x0100_0000) as u64,
                0,
                0,
                0,
                0,
            ],
        ),
    },
    DenyRule {
        name: "ioctl_tiocsti",
        why: "TIOCSTI injects input into a terminal: a sandboxed process sharing a tty with a \
              more privileged one could type commands into it",
        syscall: libc::SYS_ioctl,
        arg: Some(ArgMatch::MaskedEq {
            index: 1,
            mask: u32::MAX,
            value: libc::TIOCSTI as u32,
        }),
        errno: EPERM,
        probe: probe(libc::SYS_ioctl, [BAD_FD, libc::TIOCSTI, NULL, 0, 0, 0]),
    },
    DenyRule {
        name: "ioctl_tioclinux",
        why: "TIOCLINUX can paste the console selection into a terminal (input injection)",
        syscall: libc::SYS_ioctl,
        arg: Some(ArgMatch::MaskedEq {
            index: 1,
            mask: u32::MAX,
            value: libc::TIOCLINUX as u32,
        }),
        errno: EPERM,
        probe: probe(libc::SYS_ioctl, [BAD_FD, libc::TIOCLINUX, NULL, 0, 0, 0]),
    },
    // --- Mounts -----------------------------------------------------------------------------------
    deny(
        "mount",
        MOUNT_API_WHY,
        libc::SYS_mount,
        [NULL, NULL, NULL, 0, NULL, 0],
    ),
    deny(
        "umount2",
        MOUNT_API_WHY,
        libc::SYS_umount2,
        [NULL, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "pivot_root",
        MOUNT_API_WHY,
        libc::SYS_pivot_root,
        [NULL, NULL, 0, 0, 0, 0],
    ),
    deny(
        "move_mount",
        MOUNT_API_WHY,
        libc::SYS_move_mount,
        [BAD_FD, NULL, BAD_FD, NULL, BAD_FLAGS, 0],
    ),
    deny(
        "open_tree",
        MOUNT_API_WHY,
        libc::SYS_open_tree,
        [BAD_FD, NULL, BAD_FLAGS, 0, 0, 0],
    ),
    deny(
        "fsopen",
        MOUNT_API_WHY,
        libc::SYS_fsopen,
        [NULL, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "fsmount",
        MOUNT_API_WHY,
        libc::SYS_fsmount,
        [BAD_FD, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "fsconfig",
        MOUNT_API_WHY,
        libc::SYS_fsconfig,
        [BAD_FD, BAD_FLAGS, NULL, NULL, 0, 0],
    ),
    deny(
        "fspick",
        MOUNT_API_WHY,
        libc::SYS_fspick,
        [BAD_FD, NULL, BAD_FLAGS, 0, 0, 0],
    ),
    deny(
        "mount_setattr",
        MOUNT_API_WHY,
        libc::SYS_mount_setattr,
        [BAD_FD, NULL, BAD_FLAGS, NULL, 0, 0],
    ),
    // --- Host-global administration ------------------------------------------------------------
    deny(
        "swapon",
        "swap is host-global",
        libc::SYS_swapon,
        [NULL, BAD_FLAGS, 0, 0, 0, 0],
    ),
    deny(
        "swapoff",
        "swap is host-global",
        libc::SYS_swapoff,
        [NULL, 0, 0, 0, 0, 0],
    ),
    deny(
        "reboot",
        "reboots or halts the machine (or the pid namespace); only the supervisor ends a sandbox",
        libc::SYS_reboot,
        // Wrong magic numbers: EINVAL, never a reboot.
        [0, 0, 0, NULL, 0, 0],
    ),
    deny(
        "acct",
        "process accounting is host-global",
        // A non-NULL, unmapped path pointer: EFAULT. acct(NULL) would switch accounting off.
        libc::SYS_acct,
        [1, 0, 0, 0, 0, 0],
    ),
    deny(
        "quotactl",
        "disk quotas are host-global",
        libc::SYS_quotactl,
        [BAD_FLAGS, NULL, 0, NULL, 0, 0],
    ),
    deny(
        "syslog",
        "the kernel log is host-global and leaks kernel addresses and other tenants' activity",
        libc::SYS_syslog,
        [9999, NULL, 0, 0, 0, 0],
    ),
    deny(
        "uselib",
        "obsolete a.out loader, historically buggy",
        libc::SYS_uselib,
        [NULL, 0, 0, 0, 0, 0],
    ),
    DenyRule {
        name: "personality",
        why: "personality flags such as ADDR_NO_RANDOMIZE or READ_IMPLIES_EXEC weaken exploit \
              mitigations; only PER_LINUX (0) and the query value 0xffffffff are allowed",
        syscall: libc::SYS_personality,
        arg: Some(ArgMatch::NoneOf {
            index: 0,
            values: &[0, 0xffff_ffff],
        }),
        errno: EPERM,
        // ADDR_NO_RANDOMIZE: without the filter it would only change the calling process.
        probe: probe(libc::SYS_personality, [0x0040000, 0, 0, 0, 0, 0]),
    },
    deny(
        "lookup_dcookie",
        "profiling interface that leaks host paths",
        libc::SYS_lookup_dcookie,
        [0, NULL, 0, 0, 0, 0],
    ),
    deny(
        "fanotify_init",
        "filesystem-wide monitoring (and permission events) reaching beyond the sandbox",
        libc::SYS_fanotify_init,
        [BAD_FLAGS, 0, 0, 0, 0, 0],
    ),
    deny(
        "iopl",
        "raw I/O port access",
        libc::SYS_iopl,
        // Level 4 is invalid: EINVAL.
        [4, 0, 0, 0, 0, 0],
    ),
    deny(
        "ioperm",
        "raw I/O port access",
        libc::SYS_ioperm,
        // An empty range is invalid: EINVAL.
        [0, 0, 0, 0, 0, 0],
    ),
    deny(
        "vhangup",
        "hangs up the controlling terminal, which may be shared with the supervisor",
        libc::SYS_vhangup,
        [0, 0, 0, 0, 0, 0],
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_well_formed() {
        let mut names = std::collections::BTreeSet::new();
        for rule in DENY_RULES {
            assert!(names.insert(rule.name), "duplicate rule name {}", rule.name);
            assert!(!rule.why.is_empty(), "rule {} has no reason", rule.name);
            assert_eq!(
                rule.probe.nr, rule.syscall,
                "rule {}: probe calls another syscall",
                rule.name
            );
            assert!(
                rule.errno == libc::EPERM || rule.errno == libc::ENOSYS,
                "rule {}: unexpected errno {}",
                rule.name,
                rule.errno
            );
            assert!(
                (0..0x4000_0000).contains(&rule.syscall),
                "rule {}: not an x86_64 syscall number",
                rule.name
            );
            if let Some(arg) = rule.arg {
                let index = match arg {
                    ArgMatch::MaskedEq { index, .. } | ArgMatch::NoneOf { index, .. } => index,
                };
                assert!(index <= 5, "rule {}: argument index {index}", rule.name);
                assert!(
                    arg.matches(&rule.probe.args),
                    "rule {}: probe does not match",
                    rule.name
                );
            }
        }
        // Only the calls whose arguments live in memory get ENOSYS (so that callers fall back
        // to clone / openat, whose arguments the other rules inspect).
        let mut enosys: Vec<_> = DENY_RULES
            .iter()
            .filter(|r| r.errno == libc::ENOSYS)
            .map(|r| r.name)
            .collect();
        enosys.sort_unstable();
        assert_eq!(enosys, ["clone3", "openat2"]);
    }

    #[test]
    fn arg_matches_evaluate_the_low_half_only() {
        let tiocsti = DENY_RULES
            .iter()
            .find(|r| r.name == "ioctl_tiocsti")
            .unwrap();
        let m = tiocsti.arg.unwrap();
        assert!(m.matches(&[3, libc::TIOCSTI, 0, 0, 0, 0]));
        assert!(m.matches(&[3, 0x1_0000_0000 | libc::TIOCSTI, 0, 0, 0, 0]));
        assert!(!m.matches(&[3, libc::TCGETS, 0, 0, 0, 0]));

        let pers = DENY_RULES.iter().find(|r| r.name == "personality").unwrap();
        let m = pers.arg.unwrap();
        assert!(!m.matches(&[0, 0, 0, 0, 0, 0]));
        assert!(!m.matches(&[0xffff_ffff, 0, 0, 0, 0, 0]));
        assert!(m.matches(&[8, 0, 0, 0, 0, 0]));

        let clone = DENY_RULES
            .iter()
            .find(|r| r.name == "clone_newuser")
            .unwrap();
        let m = clone.arg.unwrap();
        assert!(!m.matches(&[libc::SIGCHLD as u64, 0, 0, 0, 0, 0]));
        assert!(m.matches(&[(libc::CLONE_NEWUSER | libc::SIGCHLD) as u64, 0, 0, 0, 0, 0]));
    }
}
