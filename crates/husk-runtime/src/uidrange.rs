//! Allocation of a unique host uid/gid range per sandbox.
//!
//! Sandbox ids 0..65535 map to host ids `BASE + slot * 65536 ..`, so no two live sandboxes, and
//! no sandbox and the host, share a uid. A slot is held by an open-file-description lock
//! (`F_OFD_SETLK`) on one byte of a lock file: the kernel releases it when the holder's fd
//! closes, including when the holder crashes, so slots cannot leak and separate husk processes
//! (several `husk run`s, a server) never hand out the same range.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// First host uid/gid used for sandboxes (far above any real account and subuid range).
pub const BASE: u32 = 0x4000_0000;
/// Ids per sandbox.
pub const RANGE: u32 = 65536;
/// Number of slots: BASE + SLOTS * RANGE stays below 2^31.
pub const SLOTS: u32 = 16384;

/// A held slot; dropping it returns the range.
#[derive(Debug)]
pub struct UidRange {
    slot: u32,
    _lock: File,
}

impl UidRange {
    /// The slot number.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The host uid (and gid) that sandbox id 0 maps to.
    pub fn base(&self) -> u32 {
        base_of(self.slot)
    }
}

/// Host uid of sandbox id 0 for `slot`.
pub fn base_of(slot: u32) -> u32 {
    BASE + slot * RANGE
}

/// The slot a host uid belongs to, if it is a sandbox uid.
pub fn slot_of(uid: u32) -> Option<u32> {
    (BASE..BASE + SLOTS * RANGE)
        .contains(&uid)
        .then(|| (uid - BASE) / RANGE)
}

fn lock_byte(file: &File, slot: u32, kind: libc::c_short) -> io::Result<bool> {
    let mut fl = libc::flock {
        l_type: kind,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: slot as libc::off_t,
        l_len: 1,
        l_pid: 0,
    };
    crate::sys::fcntl_lock(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl)
}

/// Takes a free slot, starting the search at a random point so concurrent allocators rarely
/// probe the same bytes. `usable` is asked, with the slot's lock held, whether the range may
/// be handed out (the caller checks that nothing of a previous owner is left).
pub fn allocate(lock_path: &Path, mut usable: impl FnMut(u32) -> bool) -> io::Result<UidRange> {
    let start = crate::sys::random_u64()? as u32 % SLOTS;
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        // Each holder needs its own open file description: OFD locks taken through the same
        // description never conflict with each other.
        let file = open_lock_file(lock_path)?;
        if lock_byte(&file, slot, libc::F_WRLCK as libc::c_short)? && usable(slot) {
            return Ok(UidRange { slot, _lock: file });
        }
    }
    // QuotaExceeded: callers report it as a resource that ran out, not as a failure.
    Err(io::Error::new(
        io::ErrorKind::QuotaExceeded,
        format!("all {SLOTS} sandbox uid ranges are in use"),
    ))
}

/// Like [`allocate`], trying first up to 16 of the `preferred` slots (slots whose id-map
/// namespace the caller already has: reusing one saves creating one).
pub fn allocate_preferring(
    lock_path: &Path,
    preferred: &[u32],
    mut usable: impl FnMut(u32) -> bool,
) -> io::Result<UidRange> {
    for &slot in preferred.iter().filter(|s| **s < SLOTS).take(16) {
        let file = open_lock_file(lock_path)?;
        if lock_byte(&file, slot, libc::F_WRLCK as libc::c_short)? && usable(slot) {
            return Ok(UidRange { slot, _lock: file });
        }
    }
    allocate(lock_path, usable)
}

/// Takes `slot` if nobody holds it (to clean up after its dead owner without racing a new one).
pub fn try_take(lock_path: &Path, slot: u32) -> io::Result<Option<UidRange>> {
    if slot >= SLOTS {
        return Ok(None);
    }
    let file = open_lock_file(lock_path)?;
    Ok(lock_byte(&file, slot, libc::F_WRLCK as libc::c_short)?
        .then_some(UidRange { slot, _lock: file }))
}

/// Whether `slot` is free right now (nobody holds its lock). Used to reap what a crashed husk
/// left behind: a cgroup whose slot is free has no living owner.
pub fn is_free(lock_path: &Path, slot: u32) -> io::Result<bool> {
    let file = open_lock_file(lock_path)?;
    let mut fl = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: slot as libc::off_t,
        l_len: 1,
        l_pid: 0,
    };
    crate::sys::fcntl_lock(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type == libc::F_UNLCK as libc::c_short)
}

fn open_lock_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_returned() {
        let dir = std::env::temp_dir().join(format!("husk-uid-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("slots.lock");
        let a = allocate(&path, |_| true).unwrap();
        let b = allocate(&path, |_| true).unwrap();
        // A slot the caller finds unusable is skipped, not handed out.
        let c = allocate(&path, |s| s != a.slot() + 1 && s % 2 == 0).unwrap();
        assert_eq!(c.slot() % 2, 0);
        drop(c);
        assert_ne!(a.slot(), b.slot());
        assert!(!is_free(&path, a.slot()).unwrap());
        let slot = a.slot();
        drop(a);
        assert!(is_free(&path, slot).unwrap());
        assert_eq!(slot_of(base_of(b.slot()) + 1000), Some(b.slot()));
        assert!(
            try_take(&path, b.slot()).unwrap().is_none(),
            "a held slot was taken"
        );
        let free = (b.slot() + 1) % SLOTS;
        if free != slot {
            assert!(try_take(&path, free).unwrap().is_some());
        }
        assert_eq!(slot_of(1000), None);
        drop(b);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
