//! Capabilities: the keep-sets, the bounding set, and the process's own sets.

use super::FenceError;

/// A Linux capability (`CAP_*`), numbered as in `<linux/capability.h>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[non_exhaustive]
pub enum Capability {
    Chown = 0,
    DacOverride = 1,
    DacReadSearch = 2,
    Fowner = 3,
    Fsetid = 4,
    Kill = 5,
    Setgid = 6,
    Setuid = 7,
    Setpcap = 8,
    LinuxImmutable = 9,
    NetBindService = 10,
    NetBroadcast = 11,
    NetAdmin = 12,
    NetRaw = 13,
    IpcLock = 14,
    IpcOwner = 15,
    SysModule = 16,
    SysRawio = 17,
    SysChroot = 18,
    SysPtrace = 19,
    SysPacct = 20,
    SysAdmin = 21,
    SysBoot = 22,
    SysNice = 23,
    SysResource = 24,
    SysTime = 25,
    SysTtyConfig = 26,
    Mknod = 27,
    Lease = 28,
    AuditWrite = 29,
    AuditControl = 30,
    Setfcap = 31,
    MacOverride = 32,
    MacAdmin = 33,
    Syslog = 34,
    WakeAlarm = 35,
    BlockSuspend = 36,
    AuditRead = 37,
    Perfmon = 38,
    Bpf = 39,
    CheckpointRestore = 40,
}

impl Capability {
    /// The capability number (`CAP_CHOWN` = 0, ...).
    pub const fn number(self) -> u32 {
        self as u32
    }

    /// The set as a bit mask, as shown by `/proc/<pid>/status` (`CapBnd` etc.).
    pub const fn mask(caps: &[Capability]) -> u64 {
        let mut mask = 0u64;
        let mut i = 0;
        while i < caps.len() {
            mask |= 1 << caps[i].number();
            i += 1;
        }
        mask
    }
}

/// The capabilities the sandbox's root keeps (a docker-like minimal set). Absent on purpose,
/// among others: `NET_RAW` (packet spoofing), `MKNOD`, `AUDIT_WRITE`, `SETFCAP`, `SYS_ADMIN`,
/// `SYS_PTRACE`.
pub const DEFAULT_ROOT_CAPS: &[Capability] = &[
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fowner,
    Capability::Fsetid,
    Capability::Kill,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
];

/// What init needs beyond [`DEFAULT_ROOT_CAPS`] to start commands as root or as the user
/// (switch uid/gid, trim the child's bounding set, signal any process). All of them are in
/// [`DEFAULT_ROOT_CAPS`] today; listed so that trimming that set never breaks init.
pub const INIT_EXTRA_CAPS: &[Capability] = &[
    Capability::Setuid,
    Capability::Setgid,
    Capability::Setpcap,
    Capability::Kill,
];

pub(super) fn keep_mask(root: bool) -> u64 {
    if root {
        Capability::mask(DEFAULT_ROOT_CAPS)
    } else {
        0
    }
}

pub(super) fn init_mask() -> u64 {
    Capability::mask(DEFAULT_ROOT_CAPS) | Capability::mask(INIT_EXTRA_CAPS)
}

/// Whether `cap` is in the bounding set; `None` if the kernel does not know it.
fn in_bounding(cap: u32) -> Option<bool> {
    // SAFETY: PR_CAPBSET_READ takes an integer and touches no memory.
    match unsafe { libc::prctl(libc::PR_CAPBSET_READ, libc::c_ulong::from(cap), 0, 0, 0) } {
        r if r < 0 => None,
        r => Some(r == 1),
    }
}

/// The highest capability number the running kernel knows (`cap_last_cap`), probed without
/// /proc.
pub(super) fn last_cap() -> u32 {
    (0..64)
        .take_while(|&c| in_bounding(c).is_some())
        .last()
        .unwrap_or(Capability::CheckpointRestore.number())
}

/// Drops from the bounding set every capability not in `keep`. Needs `CAP_SETPCAP`.
pub(super) fn drop_bounding_except(keep: u64, last_cap: u32) -> Result<(), FenceError> {
    for cap in 0..=last_cap.min(63) {
        if keep & (1 << cap) != 0 || in_bounding(cap) != Some(true) {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes an integer and touches no memory.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) } != 0 {
            return Err(FenceError::last_os("prctl(PR_CAPBSET_DROP)"));
        }
    }
    Ok(())
}

/// Checks that the bounding set holds nothing outside `keep`, dropping leftovers if the process
/// still can; fails with [`FenceError::BoundingSetNotDropped`] otherwise.
pub(super) fn ensure_bounding_within(keep: u64, last_cap: u32) -> Result<(), FenceError> {
    for cap in 0..=last_cap.min(63) {
        if keep & (1 << cap) != 0 || in_bounding(cap) != Some(true) {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes an integer and touches no memory.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) } != 0 {
            return Err(FenceError::BoundingSetNotDropped { cap });
        }
    }
    Ok(())
}

/// `struct __user_cap_header_struct`.
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// `struct __user_cap_data_struct`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// The process's capability sets (capget, version 3: two halves of 32 bits).
fn get_caps() -> Result<[CapData; 2], FenceError> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget writes two __user_cap_data_struct (version 3) into `data`.
    if unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } != 0 {
        return Err(FenceError::last_os("capget"));
    }
    Ok(data)
}

/// Sets the process's capability sets (capset, version 3).
fn set_caps(data: &[CapData; 2]) -> Result<(), FenceError> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    // SAFETY: capset reads the header and two __user_cap_data_struct from valid memory.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(FenceError::last_os("capset"));
    }
    Ok(())
}

/// Makes the effective set the permitted set (after a change of the effective uid from root
/// emptied it, the real and saved uids staying root).
pub(crate) fn raise_effective() -> Result<(), FenceError> {
    let mut data = get_caps()?;
    for d in data.iter_mut() {
        d.effective = d.permitted;
    }
    set_caps(&data)
}

/// Limits the permitted and effective sets to `keep` (intersected with what the process has),
/// empties the inheritable and ambient sets.
pub(super) fn restrict_process_caps(keep: u64) -> Result<(), FenceError> {
    let mut data = get_caps()?;
    let permitted = u64::from(data[0].permitted) | (u64::from(data[1].permitted) << 32);
    let new = permitted & keep;
    for (i, d) in data.iter_mut().enumerate() {
        let half = (new >> (32 * i)) as u32;
        *d = CapData {
            effective: half,
            permitted: half,
            inheritable: 0,
        };
    }
    set_caps(&data)?;
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integers and touches no memory.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if r != 0 {
        return Err(FenceError::last_os("prctl(PR_CAP_AMBIENT_CLEAR_ALL)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_match_the_kernel_numbering() {
        // CAP_CHOWN(0) DAC_OVERRIDE(1) FOWNER(3) FSETID(4) KILL(5) SETGID(6) SETUID(7)
        // SETPCAP(8) NET_BIND_SERVICE(10) SYS_CHROOT(18): docker's 0x...5fb minus the rest.
        assert_eq!(Capability::mask(DEFAULT_ROOT_CAPS), 0x0004_05fb);
        assert_eq!(init_mask(), Capability::mask(DEFAULT_ROOT_CAPS));
        assert_eq!(keep_mask(false), 0);
        for absent in [
            Capability::NetRaw,
            Capability::Mknod,
            Capability::AuditWrite,
            Capability::Setfcap,
            Capability::SysAdmin,
            Capability::SysPtrace,
        ] {
            assert!(!DEFAULT_ROOT_CAPS.contains(&absent), "{absent:?}");
        }
    }

    #[test]
    fn last_cap_matches_proc() {
        let proc: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .expect("cap_last_cap")
            .trim()
            .parse()
            .unwrap();
        assert_eq!(last_cap(), proc);
    }
}
