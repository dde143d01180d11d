//! The events a polling watcher keeps between two polls, bounded in count and in bytes, per
//! watcher and (through its team's [`Budget`]) per team: a client that never polls costs the
//! server a fixed amount, and loses the oldest events beyond it (as E2B's daemon does).

use std::collections::VecDeque;

use husk_proto::FsEvent;

use crate::budget::{Budget, Reservation};

/// Events one watcher keeps; older ones are dropped beyond it.
pub const MAX_EVENTS: usize = 10_000;
/// Bytes one watcher keeps (an event costs its path and [`EVENT_OVERHEAD`]).
pub const MAX_BYTES: u64 = 1 << 20;
/// What an event costs besides its path (the struct, the queue slot).
pub const EVENT_OVERHEAD: u64 = 64;
/// Bytes of buffered events one team's polling watchers hold in all.
pub const TEAM_BYTES: u64 = 16 << 20;

/// The budget of watcher events the server's teams share.
pub fn team_budget() -> std::sync::Arc<Budget> {
    Budget::new("buffered watcher events", TEAM_BYTES)
}

/// One watcher's buffer.
#[derive(Debug)]
pub struct EventBuffer {
    events: VecDeque<(FsEvent, u64)>,
    held: Reservation,
    /// Events dropped since the last poll (the oldest, or new ones when the team had no room).
    pub dropped: u64,
}

fn cost(ev: &FsEvent) -> u64 {
    ev.name.len() as u64 + EVENT_OVERHEAD
}

impl EventBuffer {
    pub fn new(held: Reservation) -> EventBuffer {
        EventBuffer {
            events: VecDeque::new(),
            held,
            dropped: 0,
        }
    }

    /// Keeps `ev`, dropping the oldest events while it does not fit this watcher's bounds or
    /// its team's budget; drops `ev` itself when even an empty buffer has no room for it.
    pub fn push(&mut self, ev: FsEvent) {
        let c = cost(&ev);
        loop {
            let fits = self.events.len() < MAX_EVENTS && self.held.bytes() + c <= MAX_BYTES;
            if fits && self.held.grow(c).is_ok() {
                self.events.push_back((ev, c));
                return;
            }
            match self.events.pop_front() {
                Some((_, old)) => {
                    self.held.shrink(old);
                    self.dropped += 1;
                }
                None => {
                    self.dropped += 1;
                    return;
                }
            }
        }
    }

    /// Every event kept, oldest first; the buffer is then empty (and its bytes given back).
    pub fn take(&mut self) -> Vec<FsEvent> {
        self.held.shrink(self.held.bytes());
        self.dropped = 0;
        self.events.drain(..).map(|(ev, _)| ev).collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use husk_proto::FsOp;

    fn ev(name: &str) -> FsEvent {
        FsEvent {
            name: name.to_owned(),
            op: FsOp::Create,
        }
    }

    #[test]
    fn a_watcher_keeps_its_newest_events_within_its_bytes() {
        let budget = Budget::new("w", 1 << 30);
        let mut b = EventBuffer::new(budget.reservation("t"));
        // Deep paths: 4 KiB each, far fewer than MAX_EVENTS fit in MAX_BYTES.
        let long = "d/".repeat(2048);
        for i in 0..1000 {
            b.push(ev(&format!("{long}{i}")));
        }
        let per = 4096 + 4 + EVENT_OVERHEAD;
        assert_eq!(b.len() as u64, MAX_BYTES / per);
        assert!(budget.held("t") <= MAX_BYTES);
        assert_eq!(b.dropped, 1000 - b.len() as u64);
        let got = b.take();
        assert!(
            got.last().unwrap().name.ends_with("999"),
            "the newest are kept"
        );
        assert_eq!(budget.held("t"), 0);
        // Short names: the count bound.
        for i in 0..(MAX_EVENTS + 5) {
            b.push(ev(&i.to_string()));
        }
        assert_eq!(b.len(), MAX_EVENTS);
    }

    #[test]
    fn a_teams_watchers_share_its_budget_and_other_teams_are_untouched() {
        let budget = Budget::new("w", 3 * (100 + EVENT_OVERHEAD));
        let mut a1 = EventBuffer::new(budget.reservation("a"));
        let mut a2 = EventBuffer::new(budget.reservation("a"));
        let mut other = EventBuffer::new(budget.reservation("b"));
        let name = "x".repeat(100);
        for _ in 0..3 {
            a1.push(ev(&name));
        }
        // The team's budget is spent: a2 has no room at all, and drops what comes.
        a2.push(ev(&name));
        assert_eq!((a2.len(), a2.dropped), (0, 1));
        other.push(ev(&name));
        assert_eq!(other.len(), 1);
        drop(a1);
        a2.push(ev(&name));
        assert_eq!(a2.len(), 1);
    }
}
