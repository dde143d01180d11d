//! Starting a sandbox's first process without copying the spawner's descriptor table.
//!
//! A spawner holds descriptors for every live sandbox (its pidfd, control socket, uid slot
//! lock and writable layer: four each). A plain fork copies that whole table into the child,
//! which then closes all but a handful: O(live sandboxes) per create, about a millisecond with
//! 3,000 alive here (issue 20). Instead the child is forked sharing the spawner's table
//! (`CLONE_FILES`) and, as its very first act, takes a private copy of only its lowest
//! descriptors (`close_range(top, ~0, CLOSE_RANGE_UNSHARE)`, which copies the table only below
//! `top`): O(1).
//!
//! What the child needs must therefore sit below `top`. The spawner reserves a few low
//! *slots* at its start (placeholders on `/dev/null`), and before each fork duplicates the
//! child's descriptors into them. While the table is shared the spawner changes nothing in it:
//! right after the fork it waits until the child says it has its own (an eventfd, also below
//! `top`) or has died (its pidfd), and only then puts the slots back on `/dev/null`. That
//! matters for more than tidiness: a copy of the child's end of its control socket left in a
//! slot would keep the spawner from ever seeing that end close.
//!
//! A fork that needs more descriptors than there are slots (a spec with many owner-mapped
//! mounts) takes the plain fork.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};

use crate::sys;

/// Slots reserved: a sandbox's control socket, agent socket, id map, three kept descriptors,
/// three stdio descriptors, and a few owner-mapped mounts.
const SLOTS: usize = 16;

/// The spawner's reserved low descriptors (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Handoff {
    /// Written by the child once it has its own table.
    sync: OwnedFd,
    /// `/dev/null`, put back into each slot after a fork.
    null: OwnedFd,
    slots: Vec<OwnedFd>,
    /// One above the highest of `sync` and the slots: the child keeps what is below.
    top: RawFd,
}

/// What the child needs to take its own table: [`Handoff::child_unshare`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChildHandoff {
    top: RawFd,
    sync: RawFd,
}

impl Handoff {
    /// Reserves the slots; call it early, while the process's lowest descriptors are free.
    pub(crate) fn new() -> io::Result<Handoff> {
        let sync = sys::eventfd_nonblocking()?;
        let null = sys::open(c"/dev/null", libc::O_RDWR | libc::O_CLOEXEC, 0)?;
        let slots = (0..SLOTS)
            .map(|_| null.try_clone())
            .collect::<io::Result<Vec<_>>>()?;
        let top = slots
            .iter()
            .chain([&sync])
            .map(AsRawFd::as_raw_fd)
            .max()
            .unwrap_or(0)
            + 1;
        Ok(Handoff {
            sync,
            null,
            slots,
            top,
        })
    }

    /// A signal of its own for a forked copy of this process (another spawner, see
    /// [`crate::service`]): the same descriptor number, below `top`, on a new eventfd, so that
    /// no other process's child can signal this one's forks.
    pub(crate) fn renew(&mut self) -> io::Result<()> {
        let fresh = sys::eventfd_nonblocking()?;
        sys::dup3(fresh.as_raw_fd(), self.sync.as_raw_fd(), libc::O_CLOEXEC)
    }

    /// Starts placing one fork's descriptors; the slots go back to `/dev/null` when the
    /// [`Placing`] is dropped, whatever happened in between.
    pub(crate) fn placing(&self) -> Placing<'_> {
        Placing {
            handoff: self,
            used: 0,
            overflowed: false,
        }
    }
}

/// One fork's descriptors in the slots (see [`Handoff::placing`]).
#[derive(Debug)]
pub(crate) struct Placing<'a> {
    handoff: &'a Handoff,
    used: usize,
    /// More descriptors were put than there are slots: the fork must be a plain one.
    overflowed: bool,
}

impl Placing<'_> {
    /// The number the child sees `fd` under: a slot holding a duplicate (with `fd`'s
    /// close-on-exec flag), or `fd` itself once the slots are used up.
    pub(crate) fn put(&mut self, fd: RawFd) -> io::Result<RawFd> {
        let Some(slot) = self.handoff.slots.get(self.used) else {
            self.overflowed = true;
            return Ok(fd);
        };
        let flags = if sys::is_cloexec(fd)? {
            libc::O_CLOEXEC
        } else {
            0
        };
        sys::dup3(fd, slot.as_raw_fd(), flags)?;
        self.used += 1;
        Ok(slot.as_raw_fd())
    }

    /// What the child needs to take its own table, when every descriptor it keeps is in a
    /// slot; `None`: fork plainly (without `CLONE_FILES`).
    pub(crate) fn for_child(&self) -> Option<ChildHandoff> {
        (!self.overflowed).then_some(ChildHandoff {
            top: self.handoff.top,
            sync: self.handoff.sync.as_raw_fd(),
        })
    }

    /// In the spawner, first thing after a fork that shares the table: waits until the child
    /// has its own table or has died. (Dropping `self` then empties the slots.)
    pub(crate) fn wait_for(&self, child: BorrowedFd<'_>) -> io::Result<()> {
        let mut fds = [
            libc::pollfd {
                fd: self.handoff.sync.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: child.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        while fds.iter().all(|f| f.revents == 0) {
            match sys::poll(&mut fds, -1) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => {
                    r?;
                }
            }
        }
        // The counter goes back to zero for the next fork (nonblocking: when the child died
        // before writing, there is nothing to read).
        let _ = sys::read_eventfd(self.handoff.sync.as_fd());
        Ok(())
    }
}

impl Drop for Placing<'_> {
    /// Puts the used slots back on `/dev/null`, closing the copies placed there: a copy of
    /// the child's end of its control socket left with the spawner would keep the spawner
    /// from seeing that end close, one of a caller's pipe from seeing its end of file.
    fn drop(&mut self) {
        for slot in &self.handoff.slots[..self.used] {
            let _ = sys::dup3(
                self.handoff.null.as_raw_fd(),
                slot.as_raw_fd(),
                libc::O_CLOEXEC,
            );
        }
    }
}

impl ChildHandoff {
    /// In the child, before anything else: a private descriptor table of what lies below
    /// `top`, then a word to the spawner. Allocates nothing (the child is a fork of a process
    /// whose other threads' locks it may not know about).
    pub(crate) fn child_unshare(self) -> io::Result<()> {
        sys::close_range_unshare(self.top)?;
        // SAFETY: `sync` is the spawner's eventfd, below `top`, so in this process's own table.
        let sync = unsafe { BorrowedFd::borrow_raw(self.sync) };
        sys::write_eventfd(sync, 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn ident(fd: RawFd) -> (u64, u64) {
        let m = std::fs::metadata(format!("/proc/self/fd/{fd}")).unwrap();
        (m.dev(), m.ino())
    }

    #[test]
    fn slots_take_the_childs_descriptors_and_give_them_back() {
        let h = Handoff::new().unwrap();
        let (r, w) = std::io::pipe().unwrap();
        let mut placing = h.placing();
        let placed = placing.put(w.as_raw_fd()).unwrap();
        assert!(placed < h.top, "a slot lies below the top the child keeps");
        assert_eq!(ident(placed), ident(w.as_raw_fd()));
        assert!(sys::is_cloexec(placed).unwrap());
        assert!(placing.for_child().is_some());
        // The child said it has its own table: the counter goes back to zero, and the slots
        // back to /dev/null once the placing ends.
        sys::write_eventfd(h.sync.as_fd(), 1).unwrap();
        placing.wait_for(r.as_fd()).unwrap();
        assert_eq!(
            sys::read_eventfd(h.sync.as_fd()).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(placing);
        let null = std::fs::metadata("/dev/null").unwrap();
        assert_eq!(ident(placed), (null.dev(), null.ino()));
        // No copy of the write end is left: dropping the original ends the pipe.
        drop(w);
        let mut buf = [0u8; 1];
        assert_eq!(std::io::Read::read(&mut &r, &mut buf).unwrap(), 0);
    }

    #[test]
    fn a_renewed_signal_is_no_longer_shared() {
        let mut h = Handoff::new().unwrap();
        let number = h.sync.as_raw_fd();
        // What a forked copy of the process would still hold: the same eventfd.
        let other = h.sync.try_clone().unwrap();
        h.renew().unwrap();
        assert_eq!(h.sync.as_raw_fd(), number, "the signal stays below the top");
        assert!(sys::is_cloexec(number).unwrap());
        sys::write_eventfd(other.as_fd(), 1).unwrap();
        assert_eq!(
            sys::read_eventfd(h.sync.as_fd()).unwrap_err().kind(),
            io::ErrorKind::WouldBlock,
            "another process's child signalled this one"
        );
        sys::write_eventfd(h.sync.as_fd(), 1).unwrap();
        assert_eq!(sys::read_eventfd(h.sync.as_fd()).unwrap(), 1);
    }

    #[test]
    fn more_descriptors_than_slots_take_a_plain_fork() {
        let h = Handoff::new().unwrap();
        let fd = h.null.as_raw_fd();
        let mut placing = h.placing();
        for _ in 0..SLOTS {
            assert_ne!(placing.put(fd).unwrap(), fd);
        }
        assert!(placing.for_child().is_some());
        // One more stays where it is, and the fork cannot share the table.
        assert_eq!(placing.put(fd).unwrap(), fd);
        assert!(placing.for_child().is_none());
    }
}
