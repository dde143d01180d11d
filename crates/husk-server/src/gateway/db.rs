//! The gateway's database calls, on threads of their own.
//!
//! The store's PostgreSQL client is synchronous and must not run on a Tokio runtime's thread
//! (`store::backend::off_runtime` would start a thread per call there). A few plain threads,
//! as many as the pool has connections, take calls from a bounded queue instead: a call costs
//! a channel hop each way, and a database that stalls fills the queue, which then refuses at
//! once (503) rather than queueing without bound.

use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

use husk_core::store::{Store, StoreError};

type Job = Box<dyn FnOnce(&Store) + Send>;

/// Calls waiting for a thread, at most.
const QUEUE: usize = 1024;

/// The store, behind its threads.
#[derive(Clone)]
pub struct Db {
    jobs: SyncSender<Job>,
}

impl Db {
    /// Starts `threads` threads serving calls on `store`. They end when every [`Db`] clone
    /// is dropped.
    pub fn start(store: Arc<Store>, threads: usize) -> std::io::Result<Db> {
        let (jobs, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let (rx, store) = (rx.clone(), store.clone());
            std::thread::Builder::new()
                .name(format!("husk-db-{i}"))
                .spawn(move || serve(&rx, &store))?;
        }
        Ok(Db { jobs })
    }

    /// Runs `f` on the store, off the runtime.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |store| {
            let _ = tx.send(f(store));
        });
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(StoreError::Unavailable(
                    "the gateway's database calls are all busy".into(),
                ))
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(StoreError::Unavailable(
                    "the gateway's database threads are gone".into(),
                ))
            }
        }
        rx.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "a database call of the gateway's failed".into(),
            ))
        })
    }
}

fn serve(rx: &Mutex<Receiver<Job>>, store: &Store) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            rx.recv()
        };
        match job {
            // A panic in one call must not take the thread: the caller sees its channel
            // dropped (an error), the next call is served.
            Ok(job) => {
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(store)));
            }
            Err(_) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn calls_run_off_the_runtime_and_a_panic_is_an_error() {
        let db = Db::start(Arc::new(Store::open_in_memory().unwrap()), 2).unwrap();
        let on_runtime = db
            .call(|_| Ok(tokio::runtime::Handle::try_current().is_ok()))
            .await
            .unwrap();
        assert!(!on_runtime);
        let quota = db.call(|s| s.team_quota("acme")).await.unwrap();
        assert_eq!(quota, None);
        let panicked: Result<(), _> = db.call(|_| panic!("boom")).await;
        assert!(matches!(panicked, Err(StoreError::Unavailable(_))));
        // The thread that panicked still serves.
        for _ in 0..4 {
            assert_eq!(db.call(|_| Ok(7)).await.unwrap(), 7);
        }
    }
}
