//! A cancellation token shared by a run, its handle, its batch and the cancel endpoint.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Cancelled once, for good; every clone sees it.
#[derive(Clone, Default, Debug)]
pub struct Cancel(Arc<Inner>);

#[derive(Default, Debug)]
struct Inner {
    flag: AtomicBool,
    notify: Notify,
}

impl Cancel {
    pub fn cancel(&self) {
        self.0.flag.store(true, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.flag.load(Ordering::SeqCst)
    }

    /// Returns once cancelled.
    pub async fn cancelled(&self) {
        loop {
            // Registered before the flag is read, so a cancel in between is not missed.
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_wake_and_late_waiters_return_at_once() {
        let c = Cancel::default();
        let c2 = c.clone();
        let waiter = tokio::spawn(async move { c2.cancelled().await });
        tokio::task::yield_now().await;
        assert!(!c.is_cancelled());
        c.cancel();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("waiter woke")
            .unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), c.cancelled())
            .await
            .expect("late waiter returns");
    }
}
