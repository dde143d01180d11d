//! Request bodies a client cannot stall: every body husk reads (but a sandbox server's, through
//! ingress, and a Connect client stream, which may rightly pause) must keep arriving at a
//! minimum rate, measured only over the time husk spends waiting for the client.
//!
//! Why: a handler reading a body holds what it works with (a thread writing a workspace, a
//! transfer slot, a sandbox's file) until the body ends. A client that sends one byte and stops
//! would hold them for as long as its connection lives. [`Guarded`] ends such a body with
//! [`Stalled`] once a window of [`BodyPolicy::window`] spent waiting brought fewer than
//! [`BodyPolicy::min_bytes`] bytes. Time husk itself spends not reading (a slow disk behind a
//! full channel) is not the client's and is not counted.
//!
//! The same rule bounds a response that a client does not read ([`RateMeter`] in the writers of
//! [`crate::transfers`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::time::{Instant, Sleep};

/// How fast a client must send a request body (or read a streamed response).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPolicy {
    /// The measuring window: of husk's waiting on the client, never more than this passes
    /// without [`BodyPolicy::min_bytes`] arriving. Also the longest pause a client may make.
    pub window: Duration,
    /// Bytes each window must bring.
    pub min_bytes: u64,
}

impl Default for BodyPolicy {
    /// 30 s windows of at least 32 KiB (about 1 KiB/s): far below any real link, far above a
    /// slowloris trickle.
    fn default() -> BodyPolicy {
        BodyPolicy {
            window: Duration::from_secs(30),
            min_bytes: 32 << 10,
        }
    }
}

impl BodyPolicy {
    /// The policy with `window` and the same rate.
    pub fn with_window(window: Duration) -> BodyPolicy {
        let d = BodyPolicy::default();
        let per_sec = d.min_bytes / d.window.as_secs().max(1);
        BodyPolicy {
            window,
            min_bytes: (per_sec as f64 * window.as_secs_f64()).ceil() as u64,
        }
    }
}

/// A body that stopped coming (or a response that stopped being read) at the policy's rate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the client sent (or read) fewer than {min_bytes} bytes in {}s of waiting; \
     the transfer was cut",
    window.as_secs_f64()
)]
pub struct Stalled {
    pub window: Duration,
    pub min_bytes: u64,
}

/// The policy's arithmetic, without clocks: time spent waiting for the client and bytes it
/// moved, window by window.
#[derive(Debug, Clone)]
pub struct RateMeter {
    policy: BodyPolicy,
    waited: Duration,
    bytes: u64,
}

impl RateMeter {
    pub fn new(policy: BodyPolicy) -> RateMeter {
        RateMeter {
            policy,
            waited: Duration::ZERO,
            bytes: 0,
        }
    }

    /// The client moved `n` bytes.
    pub fn progress(&mut self, n: usize) {
        self.bytes = self.bytes.saturating_add(n as u64);
    }

    /// husk waited `d` for the client. Each window that this completes must have brought
    /// enough bytes; a window that did not is [`Stalled`].
    pub fn waited(&mut self, d: Duration) -> Result<(), Stalled> {
        self.waited += d;
        while self.waited >= self.policy.window {
            if self.bytes < self.policy.min_bytes {
                return Err(Stalled {
                    window: self.policy.window,
                    min_bytes: self.policy.min_bytes,
                });
            }
            self.waited -= self.policy.window;
            self.bytes = 0;
        }
        Ok(())
    }

    /// Waiting left before the current window ends.
    pub fn remaining(&self) -> Duration {
        self.policy.window.saturating_sub(self.waited)
    }
}

/// A request body held to a [`BodyPolicy`] (see the module's documentation).
pub struct Guarded {
    inner: Body,
    meter: RateMeter,
    /// Since when husk has been waiting on the client, if it is.
    waiting_since: Option<Instant>,
    /// Fires when the current window ends while waiting.
    timer: Pin<Box<Sleep>>,
    failed: bool,
}

impl Guarded {
    pub fn new(inner: Body, policy: BodyPolicy) -> Guarded {
        Guarded {
            inner,
            meter: RateMeter::new(policy),
            waiting_since: None,
            timer: Box::pin(tokio::time::sleep(policy.window)),
            failed: false,
        }
    }

    /// `n` bytes arrived, ending the current wait: they count in the window the wait ended in
    /// (the one that is open, unless the wait went past its end).
    fn arrived(&mut self, n: usize) -> Result<(), Stalled> {
        let waited = self.waiting_since.take().map(|t| t.elapsed());
        match waited {
            Some(d) if d > self.meter.remaining() => {
                self.meter.waited(d)?;
                self.meter.progress(n);
            }
            Some(d) => {
                self.meter.progress(n);
                self.meter.waited(d)?;
            }
            None => self.meter.progress(n),
        }
        Ok(())
    }
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.failed {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    let n = frame.data_ref().map_or(0, |d| d.len());
                    if let Err(e) = this.arrived(n) {
                        this.failed = true;
                        return Poll::Ready(Some(Err(axum::Error::new(e))));
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(other) => {
                    this.waiting_since = None;
                    return Poll::Ready(other);
                }
                Poll::Pending => {}
            }
            let now = Instant::now();
            let since = *this.waiting_since.get_or_insert(now);
            // The window's end, counted from when this wait began.
            let end = since + this.meter.remaining();
            if this.timer.deadline() != end {
                this.timer.as_mut().reset(end);
            }
            if this.timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // The window ended while waiting: judge it, and go on waiting in the next one.
            let waited = this.waiting_since.replace(now).map(|t| now - t);
            if let Err(e) = this.meter.waited(waited.unwrap_or_default()) {
                this.failed = true;
                return Poll::Ready(Some(Err(axum::Error::new(e))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.failed || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Why a whole body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    #[error(transparent)]
    Stalled(Stalled),
    #[error("reading the request body: {0}")]
    Failed(String),
    /// The team's requests already hold its budget of buffered bodies.
    #[error(transparent)]
    Spent(crate::budget::Spent),
}

impl ReadError {
    /// 413, 408, 400 or 429.
    pub fn status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            ReadError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ReadError::Stalled(_) => StatusCode::REQUEST_TIMEOUT,
            ReadError::Failed(_) => StatusCode::BAD_REQUEST,
            ReadError::Spent(_) => StatusCode::TOO_MANY_REQUESTS,
        }
    }
}

/// Reads a whole body of at most `limit` bytes into memory that `held` reserves from its
/// team's budget chunk by chunk (so that many bodies read at once cannot together grow the
/// server past the team's budget). Keep `held` while the bytes, or what is parsed from them,
/// live.
pub async fn read_all_within(
    mut body: Body,
    limit: usize,
    held: &mut crate::budget::Reservation,
) -> Result<Bytes, ReadError> {
    let mut buf = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| match stalled_in(&e) {
            Some(s) => ReadError::Stalled(s.clone()),
            None => ReadError::Failed(e.to_string()),
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let refused = if buf.len() + data.len() > limit {
            ReadError::TooLarge(limit)
        } else if let Err(e) = held.grow(data.len() as u64) {
            ReadError::Spent(e)
        } else {
            buf.extend_from_slice(&data);
            continue;
        };
        // Nothing of a refused body is kept; the rest is read and thrown away (bounded, at the
        // body rate), so that a client that sends its whole body before reading the answer
        // gets the answer, not a reset.
        drop(buf);
        held.shrink(held.bytes());
        crate::upload::drain_stream(body.into_data_stream()).await;
        return Err(refused);
    }
    Ok(buf.freeze())
}

/// Finds a [`Stalled`] in an error's chain (a guarded body's error, wrapped by whoever read
/// it).
pub fn stalled_in<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e Stalled> {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(s) = e.downcast_ref::<Stalled>() {
            return Some(s);
        }
        cur = e.source();
    }
    None
}

/// Reads a whole body of at most `limit` bytes.
pub async fn read_all(body: Body, limit: usize) -> Result<Bytes, ReadError> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ReadError::TooLarge(limit)),
        Err(e) => match stalled_in(e.as_ref()) {
            Some(s) => Err(ReadError::Stalled(s.clone())),
            None => Err(ReadError::Failed(e.to_string())),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn policy(ms: u64, min: u64) -> BodyPolicy {
        BodyPolicy {
            window: Duration::from_millis(ms),
            min_bytes: min,
        }
    }

    #[test]
    fn a_window_must_bring_its_bytes() {
        let mut m = RateMeter::new(policy(1000, 100));
        m.progress(60);
        assert!(m.waited(Duration::from_millis(600)).is_ok());
        assert_eq!(m.remaining(), Duration::from_millis(400));
        m.progress(40);
        // The window closes with 100 bytes: enough; the next starts empty.
        assert!(m.waited(Duration::from_millis(500)).is_ok());
        assert_eq!(m.remaining(), Duration::from_millis(900));
        m.progress(99);
        let e = m.waited(Duration::from_millis(900)).unwrap_err();
        assert_eq!(e.min_bytes, 100);
    }

    #[test]
    fn a_long_wait_spans_windows_and_an_empty_one_fails() {
        let mut m = RateMeter::new(policy(1000, 10));
        m.progress(10);
        // The first window had its bytes, the second had none.
        assert!(m.waited(Duration::from_millis(2500)).is_err());
    }

    #[test]
    fn the_default_rate_is_kept_by_a_shorter_window() {
        let p = BodyPolicy::with_window(Duration::from_secs(3));
        assert_eq!(p.window, Duration::from_secs(3));
        assert_eq!(p.min_bytes, 3 * ((32 << 10) / 30));
    }

    /// A body fed by hand through a channel.
    fn channel_body() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let stream = tokio_stream(rx).map(Ok::<_, std::io::Error>);
        (tx, Body::from_stream(stream))
    }

    fn tokio_stream(
        mut rx: tokio::sync::mpsc::Receiver<Bytes>,
    ) -> impl futures_util::Stream<Item = Bytes> {
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_body_ends_with_stalled_after_a_window() {
        let (tx, body) = channel_body();
        let guarded = Body::new(Guarded::new(body, policy(10_000, 100)));
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        let read = tokio::spawn(read_all(guarded, 1 << 20));
        // (Paused time: the runtime jumps to the window's end once everything waits.)
        let started = Instant::now();
        let r = read.await.unwrap();
        assert!(matches!(r, Err(ReadError::Stalled(_))), "{r:?}");
        assert_eq!(r.unwrap_err().status(), 408);
        assert!(started.elapsed() >= Duration::from_secs(10));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn a_steady_body_is_read_to_its_end() {
        let (tx, body) = channel_body();
        let guarded = Body::new(Guarded::new(body, policy(1000, 100)));
        let feed = tokio::spawn(async move {
            // 30 windows' worth of time; every window brings at least three chunks.
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(300)).await;
                tx.send(Bytes::from(vec![7u8; 60])).await.unwrap();
            }
        });
        let r = read_all(guarded, 1 << 20).await.unwrap();
        assert_eq!(r.len(), 6000);
        feed.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_is_cut() {
        let (tx, body) = channel_body();
        let guarded = Body::new(Guarded::new(body, policy(1000, 100)));
        let feed = tokio::spawn(async move {
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(900)).await;
                if tx.send(Bytes::from_static(b"x")).await.is_err() {
                    return;
                }
            }
        });
        assert!(matches!(
            read_all(guarded, 1 << 20).await,
            Err(ReadError::Stalled(_))
        ));
        feed.await.unwrap();
    }

    #[tokio::test]
    async fn bodies_read_at_once_share_their_teams_budget() {
        let budget = crate::budget::Budget::new("request bodies", 150);
        let mut first = budget.reservation("a");
        let one = read_all_within(Body::from(vec![1u8; 100]), 1000, &mut first)
            .await
            .unwrap();
        assert_eq!(one.len(), 100);
        // While the first is held, a second body of the team's does not fit; another team's does.
        let mut second = budget.reservation("a");
        let r = read_all_within(Body::from(vec![2u8; 100]), 1000, &mut second).await;
        assert!(matches!(r, Err(ReadError::Spent(_))), "{r:?}");
        assert_eq!(r.unwrap_err().status(), 429);
        let mut theirs = budget.reservation("b");
        read_all_within(Body::from(vec![3u8; 100]), 1000, &mut theirs)
            .await
            .unwrap();
        drop((first, second));
        let mut third = budget.reservation("a");
        read_all_within(Body::from(vec![4u8; 100]), 1000, &mut third)
            .await
            .unwrap();
        // Over the size limit is 413, whatever the budget.
        let mut fourth = budget.reservation("b");
        let r = read_all_within(Body::from(vec![5u8; 100]), 10, &mut fourth).await;
        assert!(matches!(r, Err(ReadError::TooLarge(10))), "{r:?}");
    }

    #[tokio::test]
    async fn too_large_is_told_apart() {
        let body = Body::new(Guarded::new(
            Body::from(vec![0u8; 100]),
            BodyPolicy::default(),
        ));
        assert!(matches!(
            read_all(body, 10).await,
            Err(ReadError::TooLarge(10))
        ));
    }
}
