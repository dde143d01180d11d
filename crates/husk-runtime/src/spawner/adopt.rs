//! Taking up the kept sandboxes of the spawner's owner (see [`crate::keep`]): each with its
//! uid slot held again, its cgroups, and its rendezvous and writable layer taken back from
//! its PID 1.
//!
//! A kept sandbox's slot lock is free while no spawner holds the sandbox, but other husk
//! processes on the host take free slots' locks for a moment: another server's or a
//! `husk run`'s reaper tries every registered slot, and a create probes slots for a free
//! one; a spawner of the owner's previous server that is still exiting holds its own until
//! it is gone. A spawner that found the lock held once and gave up would leave a live
//! sandbox behind, that its server then counts as lost. So an entry of this owner whose PID 1
//! runs is tried again until [`ADOPT_WAIT`] has passed.

use std::fs;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::{parse_slot, Sandbox, Spawner};
use crate::cgroup::SandboxCgroup;
use crate::keep::{split_entry, KeepRecord};
use crate::{sys, uidrange};

/// How long a spawner keeps trying the slots of its owner's live kept sandboxes whose lock
/// another process holds. Those holders let go within milliseconds; only a second server on
/// the same state directory would hold them for good, and `husk serve` refuses to be one (it
/// locks the directory first).
pub(crate) const ADOPT_WAIT: Duration = Duration::from_secs(10);

/// How often those slots are tried.
const RETRY_EVERY: Duration = Duration::from_millis(10);

/// What became of one registry entry.
enum Adoption {
    Taken(Box<Sandbox>),
    /// A live kept sandbox of this owner whose slot another process holds right now.
    Held,
    /// Not this spawner's to take up (another owner's, another spawner's share, PID 1 gone,
    /// a descriptor gone): left to its owner or to the reaper.
    Not,
}

impl Spawner {
    /// Takes up the kept sandboxes of this spawner's owner whose PID 1 still runs (call it
    /// before [`Spawner::reap_stale`], which would count them as others'). An entry that
    /// cannot be taken up (its PID 1 ended, a descriptor is gone) is left to the reaper.
    pub fn adopt(&self) -> Vec<Sandbox> {
        self.adopt_where(|_| true)
    }

    /// [`Spawner::adopt`], of the kept sandboxes whose id `wanted` accepts only: several
    /// spawners of one server share them out by id, each taking up its own. The entry is read
    /// before the slot is locked, so that no spawner holds, even briefly, another's slot.
    /// A live one of the owner's whose slot another process holds is tried again until
    /// [`ADOPT_WAIT`] has passed.
    pub(crate) fn adopt_where(&self, wanted: impl Fn(&str) -> bool) -> Vec<Sandbox> {
        let Some(owner) = &self.owner else {
            return Vec::new();
        };
        let mut adopted = Vec::new();
        let mut held = Vec::new();
        for slot in self.registered_slots() {
            match self.adopt_slot(slot, owner, &wanted) {
                Adoption::Taken(sb) => adopted.push(*sb),
                Adoption::Held => held.push(slot),
                Adoption::Not => {}
            }
        }
        let deadline = Instant::now() + ADOPT_WAIT;
        while !held.is_empty() && Instant::now() < deadline {
            std::thread::sleep(RETRY_EVERY.min(deadline.saturating_duration_since(Instant::now())));
            held.retain(|&slot| match self.adopt_slot(slot, owner, &wanted) {
                Adoption::Taken(sb) => {
                    adopted.push(*sb);
                    false
                }
                Adoption::Held => true,
                Adoption::Not => false,
            });
        }
        adopted
    }

    /// The kept sandbox of registry slot `slot`, if it is `owner`'s, `wanted`, alive, and its
    /// slot's lock can be taken now.
    fn adopt_slot(&self, slot: u32, owner: &str, wanted: &impl Fn(&str) -> bool) -> Adoption {
        let entry = self.registry_entry(slot);
        let named = fs::read_to_string(&entry)
            .ok()
            .and_then(|t| split_entry(&t).1);
        let Some(named) = named.filter(|keep| wanted(&keep.id)) else {
            return Adoption::Not;
        };
        let Ok(Some(uids)) = uidrange::try_take(&self.lock_path(), slot) else {
            // Read without the lock: only a hint that waiting may pay.
            return if named.owner == owner && named.alive().is_some() {
                Adoption::Held
            } else {
                Adoption::Not
            };
        };
        // Read again with the lock held: the entry may have changed meanwhile.
        let Some((cgroup, Some(keep))) = fs::read_to_string(&entry).ok().map(|t| split_entry(&t))
        else {
            return Adoption::Not;
        };
        if keep.owner != owner || !names_slot(&keep, slot) {
            return Adoption::Not;
        }
        let Some(cgroup) = SandboxCgroup::from_registry(&cgroup) else {
            return Adoption::Not;
        };
        let Some(pidfd) = keep.alive() else {
            return Adoption::Not;
        };
        let take = |fd| sys::pidfd_getfd(pidfd.as_fd(), fd);
        let Ok(rendezvous) = take(keep.send) else {
            return Adoption::Not;
        };
        let Ok(upper) = keep.layer.map(take).transpose() else {
            return Adoption::Not;
        };
        Adoption::Taken(Box::new(Sandbox {
            id: keep.id,
            pid: keep.pid,
            pidfd: Some(pidfd),
            control: None,
            cgroup,
            uids: Some(uids),
            limits_memory: 0,
            files_in_memory: 0,
            pty_master: None,
            upper,
            fate: None,
            destroyed: false,
            registry: Some(entry),
            agent_conn: None,
            rendezvous: Some(rendezvous),
            adopted: true,
        }))
    }
}

/// Whether the kept sandbox's id names `slot` (`s<slot>-…`): an entry is only ever taken up
/// into the slot it was made in.
fn names_slot(keep: &KeepRecord, slot: u32) -> bool {
    keep.id.split('-').next().and_then(parse_slot) == Some(slot)
}
