//! The events polling watchers keep between two polls, bounded in count and bytes per watcher
//! and in bytes per team: a client that never polls costs the server a fixed amount, and loses
//! the oldest events beyond it (as E2B's daemon does).
//!
//! When a team's watchers together reach the team's bound, room is made in the team's *largest*
//! buffer (its oldest events go), never by refusing a new event: a watcher that is polled often
//! (a small buffer) keeps getting its events, however many of the team's watchers nobody polls.
//! All of a team's buffers sit behind one lock, so that taking from one to give to another
//! needs no lock order.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use husk_core::calls::FsEvent;

/// Events one watcher keeps; older ones are dropped beyond it.
pub const MAX_EVENTS: usize = 10_000;
/// Bytes one watcher keeps (an event costs its path and [`EVENT_OVERHEAD`]).
pub const MAX_BYTES: u64 = 1 << 20;
/// What an event costs besides its path (the struct, the queue slot).
pub const EVENT_OVERHEAD: u64 = 64;
/// Bytes of buffered events one team's polling watchers hold in all.
pub const TEAM_BYTES: u64 = 16 << 20;

/// A watcher: (sandbox id, watcher id).
pub type WatcherKey = (String, String);

/// Every polling watcher's buffer, by team.
#[derive(Debug)]
pub struct Buffers {
    max_bytes: u64,
    team_bytes: u64,
    teams: Mutex<HashMap<String, Team>>,
}

#[derive(Debug, Default)]
struct Team {
    bytes: u64,
    watchers: HashMap<WatcherKey, Buffer>,
}

#[derive(Debug, Default)]
struct Buffer {
    events: VecDeque<(FsEvent, u64)>,
    bytes: u64,
}

impl Buffer {
    /// Drops the oldest event; its cost.
    fn pop(&mut self) -> Option<u64> {
        let (_, c) = self.events.pop_front()?;
        self.bytes -= c;
        Some(c)
    }
}

fn cost(ev: &FsEvent) -> u64 {
    ev.name.len() as u64 + EVENT_OVERHEAD
}

impl Default for Buffers {
    fn default() -> Buffers {
        Buffers::new(MAX_BYTES, TEAM_BYTES)
    }
}

impl Buffers {
    /// Buffers of at most `max_bytes` each and `team_bytes` per team.
    pub fn new(max_bytes: u64, team_bytes: u64) -> Buffers {
        Buffers {
            max_bytes,
            team_bytes: team_bytes.max(max_bytes),
            teams: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Team>> {
        self.teams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty buffer for a new watcher of `team`.
    pub fn open(&self, team: &str, key: WatcherKey) {
        self.lock()
            .entry(team.to_owned())
            .or_default()
            .watchers
            .insert(key, Buffer::default());
    }

    /// Keeps `events` for the watcher (dropping the oldest where they do not fit); `false` when
    /// the watcher is gone.
    pub fn push(&self, team: &str, key: &WatcherKey, events: Vec<FsEvent>) -> bool {
        let mut teams = self.lock();
        let Some(t) = teams.get_mut(team) else {
            return false;
        };
        if !t.watchers.contains_key(key) {
            return false;
        }
        for ev in events {
            let c = cost(&ev);
            if c > self.max_bytes {
                continue;
            }
            // The watcher's own bounds: its oldest go.
            let Some(buf) = t.watchers.get_mut(key) else {
                return false;
            };
            while buf.events.len() >= MAX_EVENTS || buf.bytes + c > self.max_bytes {
                let Some(old) = buf.pop() else { break };
                t.bytes -= old;
            }
            // The team's: the largest buffer's oldest go, a quarter of it at a time (so that
            // finding the largest is rare).
            while t.bytes + c > self.team_bytes {
                let Some(largest) = t
                    .watchers
                    .iter_mut()
                    .max_by_key(|(_, b)| b.bytes)
                    .map(|(_, b)| b)
                else {
                    break;
                };
                let goal = (largest.bytes / 4).max(c);
                let mut freed = 0;
                while freed < goal {
                    let Some(old) = largest.pop() else { break };
                    freed += old;
                }
                if freed == 0 {
                    break;
                }
                t.bytes -= freed;
            }
            let Some(buf) = t.watchers.get_mut(key) else {
                return false;
            };
            buf.events.push_back((ev, c));
            buf.bytes += c;
            t.bytes += c;
        }
        true
    }

    /// Every event the watcher kept, oldest first (its buffer is then empty); `None` when the
    /// watcher is gone.
    pub fn take(&self, team: &str, key: &WatcherKey) -> Option<Vec<FsEvent>> {
        let mut teams = self.lock();
        let t = teams.get_mut(team)?;
        let buf = t.watchers.get_mut(key)?;
        let taken = std::mem::take(buf);
        t.bytes -= taken.bytes;
        Some(taken.events.into_iter().map(|(ev, _)| ev).collect())
    }

    /// Forgets the watcher and its events.
    pub fn close(&self, team: &str, key: &WatcherKey) {
        let mut teams = self.lock();
        if let Some(t) = teams.get_mut(team) {
            if let Some(buf) = t.watchers.remove(key) {
                t.bytes -= buf.bytes;
            }
            if t.watchers.is_empty() {
                teams.remove(team);
            }
        }
    }

    /// Bytes the team's buffers hold.
    #[cfg(test)]
    fn held(&self, team: &str) -> u64 {
        self.lock().get(team).map_or(0, |t| t.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use husk_core::calls::FsOp;

    fn ev(name: String) -> FsEvent {
        FsEvent {
            name,
            op: FsOp::Create,
        }
    }

    fn key(w: &str) -> WatcherKey {
        ("sb".to_owned(), w.to_owned())
    }

    #[test]
    fn a_watcher_keeps_its_newest_events_within_its_bytes_and_count() {
        let b = Buffers::default();
        b.open("t", key("w"));
        // Deep paths: 4 KiB each, far fewer than MAX_EVENTS fit in MAX_BYTES.
        let long = "d/".repeat(2048);
        b.push(
            "t",
            &key("w"),
            (0..1000).map(|i| ev(format!("{long}{i}"))).collect(),
        );
        let per = 4096 + 3 + EVENT_OVERHEAD;
        assert_eq!(b.held("t"), MAX_BYTES / per * per);
        let got = b.take("t", &key("w")).unwrap();
        assert_eq!(got.len() as u64, MAX_BYTES / per);
        assert!(
            got.last().unwrap().name.ends_with("999"),
            "the newest are kept"
        );
        assert_eq!(b.held("t"), 0);
        // Short names: the count bound.
        let many = (0..MAX_EVENTS + 5).map(|i| ev(i.to_string())).collect();
        b.push("t", &key("w"), many);
        assert_eq!(b.take("t", &key("w")).unwrap().len(), MAX_EVENTS);
        // Gone: nothing is kept, and the caller is told.
        b.close("t", &key("w"));
        assert!(!b.push("t", &key("w"), vec![ev("x".into())]));
        assert!(b.take("t", &key("w")).is_none());
        assert_eq!(b.held("t"), 0);
    }

    /// The team's bound takes from its largest buffers: a watcher that is polled keeps getting
    /// events while the team's others, never polled, fill up; another team is untouched.
    #[test]
    fn a_polled_watcher_is_never_starved_by_its_teams_idle_ones() {
        let b = Buffers::new(1000, 3000);
        let e = |i: usize| ev(format!("{:036}", i)); // 100 bytes each
        for w in ["idle1", "idle2", "idle3", "idle4", "polled"] {
            b.open("a", key(w));
        }
        b.open("b", key("theirs"));
        for round in 0..50 {
            for w in ["idle1", "idle2", "idle3", "idle4"] {
                b.push("a", &key(w), vec![e(round)]);
            }
            b.push("a", &key("polled"), vec![e(round)]);
            assert!(b.held("a") <= 3000);
            // Polled every round: it has its event, every time.
            let got = b.take("a", &key("polled")).unwrap();
            assert_eq!(got.len(), 1, "round {round}");
        }
        b.push("b", &key("theirs"), (0..10).map(e).collect());
        assert_eq!(b.take("b", &key("theirs")).unwrap().len(), 10);
        // The idle ones kept their newest events, within the team's bound.
        let idle = b.take("a", &key("idle1")).unwrap();
        assert!(!idle.is_empty() && idle.len() < 10, "{}", idle.len());
        assert_eq!(idle.last().unwrap().name, format!("{:036}", 49));
    }
}
