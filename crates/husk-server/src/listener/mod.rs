//! husk's accept loop: what a client without a key can make the server hold, bounded.
//!
//! Every connection takes a [`admit::Slot`] first: at most [`ConnLimits::max_connections`] in
//! all and [`ConnLimits::max_connections_per_ip`] per peer; beyond that it is answered `503`
//! (if the socket takes it at once) and closed, without ever blocking the loop. A connection
//! then has [`ConnLimits::header_timeout`] for its first bytes and again for its request head,
//! a head of at most [`ConnLimits::max_head_bytes`], and is closed after
//! [`ConnLimits::idle_timeout`] with no request in flight (HTTP/1.1: after the header timeout,
//! which hyper starts again when a response ends). A stop lets requests in flight finish for at
//! most [`ConnLimits::shutdown_grace`].

mod admit;
mod conn;
mod idle;
mod io;
#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use admit::{Admission, Throttle};

/// What the listener serves: an HTTP service that it can clone into each connection's task.
pub trait HttpService:
    tower::Service<
        Request<Body>,
        Response = Response<Body>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S> HttpService for S
where
    S: tower::Service<Request<Body>, Response = Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
}

/// What one listener admits and how long it waits for a client. `husk serve`'s flags fill it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// Connections open at once, all peers together (upgraded ones until they end).
    pub max_connections: usize,
    /// Connections open at once from one peer: an IPv4 address or an IPv6 /64.
    pub max_connections_per_ip: usize,
    /// How long a client has for a connection's first bytes, and then for a whole request head.
    pub header_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    pub idle_timeout: Duration,
    /// Largest request head: request line and headers (HTTP/2: the decoded header list). At
    /// least 8 KiB (hyper's floor).
    pub max_head_bytes: usize,
    /// How long a stop waits for requests in flight.
    pub shutdown_grace: Duration,
}

impl Default for ConnLimits {
    /// Sized from measurement (docs/design.md §8, Listener): a stalled connection costs the
    /// server 18 KiB (a short head) to 72 KiB (a head just under the bound), so the total cap
    /// bounds what clients without a key can pin to about 290 MiB. One peer gets a quarter of
    /// the slots: enough for an orchestrator holding a stream to each of hundreds of sandboxes.
    fn default() -> ConnLimits {
        ConnLimits {
            max_connections: 4096,
            max_connections_per_ip: 1024,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_head_bytes: 64 << 10,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// What a connection over a cap is told before it is closed.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\
    Retry-After: 1\r\nContent-Length: 0\r\n\r\n";

/// How long the loop pauses after an accept error that is not about one connection (no file
/// descriptor left, no memory): trying again at once would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How often a kind of trouble (refusals, accept errors) may reach the log.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Serves `svc` on `listener` under `limits` until `shutdown` resolves; then stops accepting,
/// tells every connection to finish, and waits at most `limits.shutdown_grace` for them.
///
/// With `tls`, every connection is TLS (its handshake under the header timeout); HTTP/1.1 and
/// HTTP/2 are told apart inside it as on a plain connection.
pub async fn serve<S>(
    listener: TcpListener,
    svc: S,
    limits: ConnLimits,
    tls: Option<&crate::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send,
) where
    S: HttpService,
{
    let admission = Admission::new(limits.max_connections, limits.max_connections_per_ip);
    let plain = tls.is_none();
    let served = Arc::new(conn::Served {
        builder: Arc::new(conn::builder(&limits)),
        limits: Arc::new(limits),
        tls: tls.map(|t| t.acceptor()),
    });
    let limits = served.limits.clone();
    // Each connection holds a receiver: a send tells them all to finish, and `closed` resolves
    // when the last one has.
    let (stop, stopped) = watch::channel(());
    let mut refusals = Throttle::new(LOG_EVERY);
    let mut accept_errors = Throttle::new(LOG_EVERY);
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            r = listener.accept() => r,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                if let Some(held_back) = accept_errors.hit(Instant::now()) {
                    tracing::warn!(error = %e, held_back, "accept failed; pausing");
                }
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let slot = match admission.admit(peer.ip()) {
            Ok(s) => s,
            Err(why) => {
                // A TLS client would read the plain answer as a broken handshake: it is
                // closed without one.
                if plain {
                    refuse(tcp);
                }
                if let Some(held_back) = refusals.hit(Instant::now()) {
                    tracing::warn!(%peer, held_back, "connection refused: {why} is reached");
                }
                continue;
            }
        };
        // Streams (process output, Connect envelopes) are many small writes: without
        // TCP_NODELAY, Nagle's algorithm holds each one back until the client's delayed ACK.
        let _ = tcp.set_nodelay(true);
        tokio::spawn(conn::serve(
            tcp,
            peer,
            slot,
            svc.clone(),
            served.clone(),
            stopped.clone(),
        ));
    }
    // New connections now wait in the kernel's backlog and are reset when it closes.
    drop(listener);
    drop(stopped);
    let _ = stop.send(());
    if tokio::time::timeout(limits.shutdown_grace, stop.closed())
        .await
        .is_err()
    {
        tracing::warn!(
            open = stop.receiver_count(),
            "connections still open after the shutdown grace"
        );
    }
}

/// Answers a connection over a cap, if its socket takes the answer at once, and closes it.
fn refuse(tcp: TcpStream) {
    let _ = tcp.try_write(REFUSAL);
}

/// Errors of one connection (reset or aborted before it was accepted): the next accept is fine.
fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused
    )
}
