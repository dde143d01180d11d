//! Bytes of husk's own memory that one team may hold, by purpose.
//!
//! husk's memory is charged to no sandbox: what a team's requests make it buffer would, unbounded,
//! grow the server until the kernel killed it and every team's sandboxes with it. Each buffer
//! that a team's traffic fills (request bodies read whole, events of polling watchers) reserves
//! its bytes from the team's [`Budget`] first; past it, the request is refused (429) or the
//! oldest buffered events are dropped, and only that team notices.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One purpose's bytes per team.
#[derive(Debug)]
pub struct Budget {
    /// What the bytes are for, in errors ("request bodies").
    what: &'static str,
    per_team: u64,
    held: Mutex<HashMap<String, u64>>,
}

/// Bytes of a team's budget held until dropped (or shrunk).
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    team: String,
    bytes: u64,
}

/// The team's budget is spent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "team '{team}' holds {limit} bytes of {what} in the server, its limit; \
     retry when some of its requests have ended"
)]
pub struct Spent {
    pub team: String,
    pub what: &'static str,
    pub limit: u64,
}

impl Budget {
    pub fn new(what: &'static str, per_team: u64) -> Arc<Budget> {
        Arc::new(Budget {
            what,
            per_team,
            held: Mutex::default(),
        })
    }

    pub fn per_team(&self) -> u64 {
        self.per_team
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An empty reservation of `team`'s, to grow.
    pub fn reservation(self: &Arc<Self>, team: &str) -> Reservation {
        Reservation {
            budget: self.clone(),
            team: team.to_owned(),
            bytes: 0,
        }
    }

    /// Bytes `team` holds.
    pub fn held(&self, team: &str) -> u64 {
        self.lock().get(team).copied().unwrap_or(0)
    }
}

impl Reservation {
    /// Takes `n` more bytes, if the team has them.
    pub fn grow(&mut self, n: u64) -> Result<(), Spent> {
        let mut held = self.budget.lock();
        let mine = held.get(&self.team).copied().unwrap_or(0);
        if mine.saturating_add(n) > self.budget.per_team {
            return Err(Spent {
                team: self.team.clone(),
                what: self.budget.what,
                limit: self.budget.per_team,
            });
        }
        *held.entry(self.team.clone()).or_default() = mine + n;
        self.bytes += n;
        Ok(())
    }

    /// Gives back `n` of its bytes.
    pub fn shrink(&mut self, n: u64) {
        let n = n.min(self.bytes);
        if n == 0 {
            return;
        }
        self.bytes -= n;
        let mut held = self.budget.lock();
        if let Some(h) = held.get_mut(&self.team) {
            *h = h.saturating_sub(n);
            if *h == 0 {
                held.remove(&self.team);
            }
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_team_spends_its_own_budget_only() {
        let b = Budget::new("things", 100);
        let mut a1 = b.reservation("a");
        a1.grow(60).unwrap();
        let mut a2 = b.reservation("a");
        let e = a2.grow(41).unwrap_err();
        assert_eq!(e.limit, 100);
        assert!(e.to_string().contains("things"), "{e}");
        a2.grow(40).unwrap();
        // Another team is untouched.
        let mut other = b.reservation("b");
        other.grow(100).unwrap();
        assert_eq!((b.held("a"), b.held("b")), (100, 100));
        a1.shrink(50);
        assert_eq!(a1.bytes(), 10);
        a2.grow(50).unwrap();
        drop((a1, a2, other));
        assert_eq!((b.held("a"), b.held("b")), (0, 0));
        assert!(b.lock().is_empty());
    }
}
