//! Files an operator changes under a running process (the cluster token while it rotates, a
//! listener's certificate when it is renewed), read again on a period by whoever may read
//! them (the process itself, or its state helper), and handed to what uses them.

use std::sync::Arc;
use std::time::Duration;

/// Every `period` (the first after one period), runs `read` on a blocking thread and hands
/// what it read to `apply`, for as long as the runtime runs. A read that fails is logged at
/// debug level, naming `what`, and skipped: the next one may succeed.
pub fn spawn<T, R, A>(what: &'static str, period: Duration, read: R, mut apply: A)
where
    T: Send + 'static,
    R: Fn() -> Result<T, String> + Send + Sync + 'static,
    A: FnMut(T) + Send + 'static,
{
    let read = Arc::new(read);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            let read = read.clone();
            match tokio::task::spawn_blocking(move || read()).await {
                Ok(Ok(read)) => apply(read),
                Ok(Err(e)) => tracing::debug!(error = %e, "reading the {what} failed"),
                Err(_) => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test(start_paused = true)]
    async fn reads_are_applied_each_period_and_failed_ones_skipped() {
        let reads = Arc::new(AtomicU32::new(0));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = reads.clone();
        spawn(
            "test file",
            Duration::from_secs(2),
            move || match r.fetch_add(1, Ordering::SeqCst) {
                1 => Err("gone for a moment".to_string()),
                n => Ok(n),
            },
            move |n| tx.send(n).unwrap(),
        );
        // Nothing before the first period; then every read that worked, in order.
        tokio::time::sleep(Duration::from_millis(1900)).await;
        assert!(rx.try_recv().is_err());
        assert_eq!(rx.recv().await, Some(0));
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(3));
    }
}
