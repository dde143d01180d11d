//! When a connection is idle: no request in flight, from the moment hyper hands a request to
//! the service until the response's body is dropped (sent in full, or abandoned).
//!
//! HTTP/1.1 needs none of this to close an idle connection: hyper's header-read timer starts as
//! soon as a response ends. HTTP/2 has no such timer; its keep-alive pings only find dead
//! peers, so a live peer could keep a connection with no stream open for ever.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

/// The requests in flight on one connection.
#[derive(Default)]
pub(super) struct Activity {
    in_flight: AtomicUsize,
    changed: Notify,
}

impl Activity {
    /// Marks a request in flight until the returned guard is dropped.
    pub(super) fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Busy(self.clone())
    }

    /// Resolves once the connection has had no request in flight for `idle`, uninterrupted.
    pub(super) async fn idle_for(&self, idle: Duration) {
        loop {
            // Registered before the count is read, so no change between the two is missed.
            let changed = self.changed.notified();
            if self.in_flight.load(Ordering::SeqCst) == 0 {
                tokio::select! {
                    _ = tokio::time::sleep(idle) => return,
                    _ = changed => {}
                }
            } else {
                changed.await;
            }
        }
    }
}

/// One request in flight.
pub(super) struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// A response body that keeps its request counted as in flight until it is dropped: a
/// streamed response (process output) is not idleness.
pub(super) struct Tracked<B> {
    pub(super) body: B,
    pub(super) _busy: Busy,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_the_last_request_and_restarts_on_each() {
        let a = Arc::new(Activity::default());
        let idle = Duration::from_secs(10);
        let busy = a.busy();
        let start = tokio::time::Instant::now();
        let waiter = {
            let a = a.clone();
            tokio::spawn(async move { a.idle_for(idle).await })
        };
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(!waiter.is_finished(), "idle while a request was in flight");
        drop(busy);
        tokio::time::sleep(Duration::from_secs(5)).await;
        // A request in between starts the wait over.
        drop(a.busy());
        waiter.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(45));
    }
}
