//! The request body of an upload (a template's build context, a workspace file or archive),
//! streamed: to a reader on a blocking thread as it arrives, and drained when husk answers
//! before reading all of it.

use std::io::{self, Read};

use axum::body::{Body, BodyDataStream};
use axum::http::{header, HeaderMap};
use bytes::{Buf, Bytes};
use futures_util::StreamExt;
use tokio::sync::mpsc;

/// The request body as a blocking reader (for a reader on a blocking thread), fed by
/// [`pump`].
pub struct BodyReader {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    chunk: Bytes,
}

impl Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.chunk.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.chunk = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        Ok(n)
    }
}

/// A channel from [`pump`] to a [`BodyReader`].
pub fn body_channel() -> (mpsc::Sender<io::Result<Bytes>>, BodyReader) {
    let (tx, rx) = mpsc::channel(16);
    (
        tx,
        BodyReader {
            rx,
            chunk: Bytes::new(),
        },
    )
}

/// Most of a request body read and thrown away after husk has refused it (see [`drain`]).
pub const MAX_DRAIN_BYTES: u64 = 64 << 20;

/// How the body fed by [`pump`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyEnd {
    /// All of it went to the reader (or the reader stopped taking it).
    Complete,
    /// It passed `max_bytes`; the reader got an error.
    TooLarge,
    /// The client stopped sending at the body rate rule's pace (see [`crate::body`]); the
    /// reader got an error. The answer is the client's fault: 408.
    Stalled(crate::body::Stalled),
    /// It broke off (the client went away); the reader got an error.
    Failed,
}

/// Feeds the request body to the reader until it ends, passes `max_bytes`, stalls or breaks
/// off (then the reader gets an error); says which. Once the reader is gone (done, or it
/// refused the upload) the rest of the body is drained, so that the client gets the answer.
pub async fn pump(body: Body, tx: mpsc::Sender<io::Result<Bytes>>, max_bytes: u64) -> BodyEnd {
    let mut stream = body.into_data_stream();
    let mut total = 0u64;
    while let Some(chunk) = stream.next().await {
        let (item, end) = match chunk {
            Ok(b) => {
                total += b.len() as u64;
                if total > max_bytes {
                    (
                        Err(io::Error::other("the upload is too large")),
                        BodyEnd::TooLarge,
                    )
                } else {
                    (Ok(b), BodyEnd::Complete)
                }
            }
            Err(e) => match crate::body::stalled_in(&e) {
                Some(s) => (
                    Err(io::Error::new(io::ErrorKind::TimedOut, s.clone())),
                    BodyEnd::Stalled(s.clone()),
                ),
                None => (
                    Err(io::Error::other(format!("reading the request body: {e}"))),
                    BodyEnd::Failed,
                ),
            },
        };
        if item.is_err() {
            let _ = tx.send(item).await;
            return end;
        }
        if tx.send(item).await.is_err() {
            break;
        }
    }
    drain_stream(stream).await;
    BodyEnd::Complete
}

/// Reads and discards what is left of a request body (at most [`MAX_DRAIN_BYTES`]) before an
/// early error answer. A client that sends the whole body before reading the answer (most do
/// without `Expect: 100-continue`) would otherwise get a reset connection instead of the
/// answer: the kernel resets a connection closed with unread data. With `Expect:
/// 100-continue` nothing was sent yet, and nothing is read.
pub async fn drain(headers: &HeaderMap, body: Body) {
    let expects = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if !expects {
        drain_stream(body.into_data_stream()).await;
    }
}

/// Reads and discards a body's data until it ends, fails, or passes [`MAX_DRAIN_BYTES`].
pub(crate) async fn drain_stream(mut stream: BodyDataStream) {
    let mut n = 0u64;
    while let Some(Ok(chunk)) = stream.next().await {
        n += chunk.len() as u64;
        if n > MAX_DRAIN_BYTES {
            return;
        }
    }
}
