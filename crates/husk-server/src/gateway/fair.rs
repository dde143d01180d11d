//! Fair shares of the gateway's database calls: every call a request makes (its key's check,
//! a create's quota claim) waits first for one of its API key's [`PER_KEY`] places, so a
//! client flooding the gateway queues behind its own calls, never in front of another
//! tenant's. The database threads' queue is shared; this keeps any one key to a small part of
//! it. Keys are told apart by a keyed hash (the key itself is not kept).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Database calls one API key may have waiting or running at once.
pub const PER_KEY: usize = 16;
/// How long a call waits for its key's place before it is refused (429).
pub const WAIT: Duration = Duration::from_secs(10);

/// Every key's places.
pub struct Fair {
    per_key: usize,
    hasher: std::collections::hash_map::RandomState,
    gates: Mutex<HashMap<u64, Arc<Semaphore>>>,
}

/// One of a key's places, until dropped.
pub struct Place {
    permit: Option<OwnedSemaphorePermit>,
    gate: Arc<Semaphore>,
    id: u64,
    fair: Arc<Fair>,
}

impl Fair {
    pub fn new(per_key: usize) -> Arc<Fair> {
        Arc::new(Fair {
            per_key,
            hasher: Default::default(),
            gates: Mutex::default(),
        })
    }

    fn gates(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Semaphore>>> {
        self.gates.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place of `key`'s, waited for at most [`WAIT`]; `None` when none came in time.
    pub async fn enter(self: &Arc<Self>, key: &str) -> Option<Place> {
        let id = self.hasher.hash_one(key);
        let gate = self
            .gates()
            .entry(id)
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_key)))
            .clone();
        let mut place = Place {
            permit: None,
            gate: gate.clone(),
            id,
            fair: self.clone(),
        };
        // Dropped unentered (a timeout, a client gone), `place` still cleans its key up.
        let permit = tokio::time::timeout(WAIT, gate.acquire_owned()).await;
        place.permit = Some(permit.ok()?.ok()?);
        Some(place)
    }

    /// Keys with places held or waited for.
    #[cfg(test)]
    fn keys(&self) -> usize {
        self.gates().len()
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        drop(self.permit.take());
        let mut gates = self.fair.gates();
        // Nobody else holds or waits for this key's gate (the map's and ours are the only
        // references): forget the key, so the map holds only keys in use.
        if Arc::strong_count(&self.gate) == 2 {
            if let Some(g) = gates.get(&self.id) {
                if Arc::ptr_eq(g, &self.gate) {
                    gates.remove(&self.id);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_key_that_floods_waits_behind_itself_alone() {
        let fair = Fair::new(3);
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(fair.enter("flood").await.unwrap());
        }
        // Its fourth call waits; another key's goes at once.
        let f = fair.clone();
        let waiting = tokio::spawn(async move { f.enter("flood").await.is_some() });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        let other = tokio::time::timeout(Duration::from_millis(1), fair.enter("calm")).await;
        assert!(matches!(other, Ok(Some(_))));
        drop(other);
        // A place given back lets the waiting call in.
        held.pop();
        assert!(waiting.await.unwrap());
        // One that waits too long is refused.
        held.push(fair.enter("flood").await.unwrap());
        let late = fair.enter("flood").await;
        assert!(late.is_none());
        // Keys nobody uses are forgotten.
        drop(held);
        assert_eq!(fair.keys(), 0);
    }
}
