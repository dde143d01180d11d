//! Caps on concurrent work (queries, connections) in total and per source address, so one
//! sandbox cannot use up what the resolver and the domain proxy have for all of them
//! (PeerDoS). Work over the cap is refused at once, not queued.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

#[derive(Debug)]
pub struct Limit {
    total: usize,
    per_source: usize,
    held: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// One unit of work under a [`Limit`]; dropping it gives the unit back.
#[derive(Debug)]
pub struct Permit {
    limit: Arc<Limit>,
    source: IpAddr,
}

impl Limit {
    pub fn new(total: usize, per_source: usize) -> Arc<Limit> {
        Arc::new(Limit {
            total,
            per_source,
            held: Mutex::new(Held::default()),
        })
    }

    /// A permit for work from `source`, or `None` when the total or that source's share is
    /// in use.
    pub fn try_acquire(self: &Arc<Self>, source: IpAddr) -> Option<Permit> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.total >= self.total {
            return None;
        }
        let n = held.by_source.entry(source).or_insert(0);
        if *n >= self.per_source {
            return None;
        }
        *n += 1;
        held.total += 1;
        Some(Permit {
            limit: self.clone(),
            source,
        })
    }

    /// Units in use.
    pub fn in_use(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut held = self.limit.held.lock().unwrap_or_else(|p| p.into_inner());
        held.total = held.total.saturating_sub(1);
        if let Some(n) = held.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                held.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_are_capped_in_total_and_per_source_and_come_back_on_drop() {
        let l = Limit::new(3, 2);
        let (a, b, c) = (
            "100.96.0.1".parse().unwrap(),
            "100.96.0.3".parse().unwrap(),
            "100.96.0.5".parse().unwrap(),
        );
        let a1 = l.try_acquire(a).unwrap();
        let _a2 = l.try_acquire(a).unwrap();
        assert!(l.try_acquire(a).is_none(), "over the per-source cap");
        let _b1 = l.try_acquire(b).unwrap();
        assert!(l.try_acquire(c).is_none(), "over the total cap");
        assert_eq!(l.in_use(), 3);
        drop(a1);
        assert!(l.try_acquire(c).is_some());
        assert_eq!(l.in_use(), 2);
    }
}
