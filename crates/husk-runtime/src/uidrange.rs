//! Allocation of a unique host uid/gid range per sandbox.
//!
//! Sandbox ids 0..65535 map to host ids `BASE + slot * 65536 ..`, so no two live sandboxes, and
//! no sandbox and the host, share a uid. A slot is held by an open-file-description lock
//! (`F_OFD_SETLK`) on its own lock file, `<dir>/<slot>`: the kernel releases it when the
//! holder's fd closes, including when the holder crashes, so slots cannot leak and separate
//! husk processes (several `husk run`s, a server) never hand out the same range.
//!
//! One file per slot, not one byte per slot of a shared file: every close of any descriptor
//! of a file with POSIX or OFD locks walks the file's whole lock list (`locks_remove_posix`),
//! and every sandbox's first process inherits, and closes, the descriptors of every live
//! slot. With one shared file a create cost O(live²) lock-list steps: 746 creates/s with none
//! alive fell to 22/s with 2,700 alive (issue 20). With a file per slot each list holds one
//! lock.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
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

/// Takes `slot`'s lock through a description of its own: OFD locks taken through one
/// description never conflict with each other.
fn take(dir: &Path, slot: u32) -> io::Result<Option<UidRange>> {
    let file = open_lock_file(dir, slot)?;
    let mut whole = crate::sys::lock_range(libc::F_WRLCK, 0, 0);
    let taken = crate::sys::fcntl_lock(file.as_raw_fd(), libc::F_OFD_SETLK, &mut whole)?;
    Ok(taken.then_some(UidRange { slot, _lock: file }))
}

/// Takes a free slot, starting the search at a random point so concurrent allocators rarely
/// probe the same bytes. `usable` is asked, with the slot's lock held, whether the range may
/// be handed out (the caller checks that nothing of a previous owner is left).
pub fn allocate(lock_dir: &Path, mut usable: impl FnMut(u32) -> bool) -> io::Result<UidRange> {
    let start = crate::sys::random_u64()? as u32 % SLOTS;
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        if let Some(held) = take(lock_dir, slot)?.filter(|_| usable(slot)) {
            return Ok(held);
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
    lock_dir: &Path,
    preferred: &[u32],
    mut usable: impl FnMut(u32) -> bool,
) -> io::Result<UidRange> {
    for &slot in preferred.iter().filter(|s| **s < SLOTS).take(16) {
        if let Some(held) = take(lock_dir, slot)?.filter(|_| usable(slot)) {
            return Ok(held);
        }
    }
    allocate(lock_dir, usable)
}

/// Takes `slot` if nobody holds it (to clean up after its dead owner without racing a new one).
pub fn try_take(lock_dir: &Path, slot: u32) -> io::Result<Option<UidRange>> {
    if slot >= SLOTS {
        return Ok(None);
    }
    take(lock_dir, slot)
}

/// Whether `slot` is free right now (nobody holds its lock). Used to reap what a crashed husk
/// left behind: a cgroup whose slot is free has no living owner.
pub fn is_free(lock_dir: &Path, slot: u32) -> io::Result<bool> {
    if slot >= SLOTS {
        return Ok(true);
    }
    let file = open_lock_file(lock_dir, slot)?;
    Ok(!crate::sys::ofd_range_held(file.as_raw_fd(), 0, 0)?)
}

/// Whether a husk from before the lock file per slot holds `slot` through byte `slot` of its
/// shared lock file (`legacy`, `uid-slots.lock`), during an upgrade with both running. Only
/// asked before a registered slot's leftovers are removed: never on the usual create path.
pub fn held_by_legacy(legacy: &Path, slot: u32) -> bool {
    let Ok(file) = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(legacy)
    else {
        return false;
    };
    // An error counts as held: leftovers are then kept, never a live sandbox removed.
    crate::sys::ofd_range_held(file.as_raw_fd(), slot as libc::off_t, 1).unwrap_or(true)
}

/// `<dir>/<slot>`, created on first use and never removed: a lock file removed while someone
/// holds it would let the next allocator lock a new file of the same name.
fn open_lock_file(dir: &Path, slot: u32) -> io::Result<File> {
    let open = || crate::sys::create_lock_file(&dir.join(slot.to_string()));
    match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
            open()
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_exclusive_and_returned() {
        let dir = std::env::temp_dir().join(format!("husk-uid-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("slots");
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
        // Each slot has a lock file of its own.
        assert!(path.join(b.slot().to_string()).is_file());
        drop(b);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_slot_held_in_the_legacy_shared_file_is_seen() {
        let dir = std::env::temp_dir().join(format!("husk-uid-legacy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let legacy = dir.join("uid-slots.lock");
        assert!(!held_by_legacy(&legacy, 5), "no legacy file, nothing held");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&legacy)
            .unwrap();
        let mut fl = crate::sys::lock_range(libc::F_WRLCK, 5, 1);
        assert!(crate::sys::fcntl_lock(file.as_raw_fd(), libc::F_OFD_SETLK, &mut fl).unwrap());
        assert!(held_by_legacy(&legacy, 5));
        assert!(!held_by_legacy(&legacy, 6));
        drop(file);
        assert!(!held_by_legacy(&legacy, 5));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
