//! Workspace operations (file and archive transfers above all) on threads of their own, a few at
//! a time per team.
//!
//! Why not tokio's blocking pool: sandbox creation uses it (the spawner, template resolution),
//! and a transfer lasts as long as its client takes. A team that opened hundreds of uploads and
//! stalled them would have filled the pool and stopped every team's creates. Here each
//! operation takes a [`Permit`] first: at most [`TransferLimits::per_team`] per team and
//! [`TransferLimits::total`] in all, beyond which the answer is 429 at once. The permit goes
//! with the operation's thread (and with a download's body), so a slot is free again only when
//! the work really ended. Bodies that stall are cut by [`crate::body`]'s rate rule, which
//! frees their slots too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many workspace operations may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferLimits {
    /// Per team.
    pub per_team: usize,
    /// On the whole server.
    pub total: usize,
}

impl Default for TransferLimits {
    fn default() -> TransferLimits {
        TransferLimits {
            per_team: 8,
            total: 64,
        }
    }
}

/// Why an operation could not start (or ended without an answer).
#[derive(Debug, thiserror::Error)]
pub enum Busy {
    #[error(
        "team '{team}' has {limit} workspace transfers in progress, its limit; \
         retry when one has ended"
    )]
    Team { team: String, limit: usize },
    #[error("the server has {limit} workspace transfers in progress, its limit; retry shortly")]
    Server { limit: usize },
    #[error("could not start a thread for the transfer")]
    Thread(#[source] std::io::Error),
    /// The thread ended without an answer (it panicked).
    #[error("the transfer's thread ended without an answer")]
    Lost,
}

/// The operations in progress, by team.
#[derive(Debug, Default)]
pub struct Transfers {
    limits: TransferLimits,
    running: Mutex<Running>,
}

#[derive(Debug, Default)]
struct Running {
    total: usize,
    by_team: HashMap<String, usize>,
}

/// One operation's slot; dropping it frees the slot.
#[derive(Debug)]
pub struct Permit {
    transfers: Arc<Transfers>,
    team: String,
}

impl Transfers {
    pub fn new(limits: TransferLimits) -> Transfers {
        Transfers {
            limits,
            running: Mutex::default(),
        }
    }

    pub fn limits(&self) -> TransferLimits {
        self.limits
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A slot for `team`, if it and the server are below their limits.
    pub fn try_acquire(self: &Arc<Self>, team: &str) -> Result<Permit, Busy> {
        let mut r = self.lock();
        let mine = r.by_team.get(team).copied().unwrap_or(0);
        if mine >= self.limits.per_team {
            return Err(Busy::Team {
                team: team.to_owned(),
                limit: self.limits.per_team,
            });
        }
        if r.total >= self.limits.total {
            return Err(Busy::Server {
                limit: self.limits.total,
            });
        }
        r.total += 1;
        *r.by_team.entry(team.to_owned()).or_default() += 1;
        Ok(Permit {
            transfers: self.clone(),
            team: team.to_owned(),
        })
    }

    /// Operations in progress: (of `team`, in all).
    pub fn running(&self, team: &str) -> (usize, usize) {
        let r = self.lock();
        (r.by_team.get(team).copied().unwrap_or(0), r.total)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut r = self.transfers.lock();
        r.total = r.total.saturating_sub(1);
        if let Some(n) = r.by_team.get_mut(&self.team) {
            *n -= 1;
            if *n == 0 {
                r.by_team.remove(&self.team);
            }
        }
    }
}

/// Runs `work` on a thread of its own that holds `permit` until `work` returns; its result
/// when it does. (The thread is not tokio's: see the module's documentation.)
pub async fn on_thread<T: Send + 'static>(
    permit: Permit,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Busy> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    spawn(permit, move |permit| {
        let out = work();
        // Free before answering: whoever gets the answer may start the next one.
        drop(permit);
        let _ = tx.send(out);
    })?;
    rx.await.map_err(|_| Busy::Lost)
}

/// Starts `work` on a thread of its own, given `permit` to hold (until it returns, unless it
/// drops it sooner).
pub fn spawn(permit: Permit, work: impl FnOnce(Permit) + Send + 'static) -> Result<(), Busy> {
    std::thread::Builder::new()
        .name("husk-transfer".into())
        .spawn(move || work(permit))
        .map(drop)
        .map_err(Busy::Thread)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teams_and_the_server_have_their_limits() {
        let t = Arc::new(Transfers::new(TransferLimits {
            per_team: 2,
            total: 3,
        }));
        let a1 = t.try_acquire("a").unwrap();
        let a2 = t.try_acquire("a").unwrap();
        assert!(matches!(
            t.try_acquire("a"),
            Err(Busy::Team { limit: 2, .. })
        ));
        let b1 = t.try_acquire("b").unwrap();
        // The server is full: even a team with none running waits.
        assert!(matches!(t.try_acquire("c"), Err(Busy::Server { limit: 3 })));
        assert_eq!(t.running("a"), (2, 3));
        drop(a1);
        let c1 = t.try_acquire("c").unwrap();
        drop((a2, b1, c1));
        assert_eq!(t.running("a"), (0, 0));
        assert!(t.lock().by_team.is_empty());
    }

    #[tokio::test]
    async fn a_thread_holds_its_permit_until_it_ends() {
        let t = Arc::new(Transfers::new(TransferLimits {
            per_team: 1,
            total: 1,
        }));
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let p = t.try_acquire("a").unwrap();
        let running = tokio::spawn(on_thread(p, move || {
            go_rx.recv().unwrap();
            7
        }));
        // While it runs, the slot is taken (and not by a tokio blocking thread).
        assert!(t.try_acquire("a").is_err());
        go_tx.send(()).unwrap();
        assert_eq!(running.await.unwrap().unwrap(), 7);
        assert_eq!(t.running("a"), (0, 0));
    }
}
