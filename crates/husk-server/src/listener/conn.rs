//! One admitted connection, from its first byte to its end: the TLS handshake (on a listener
//! with a certificate) and the protocol sniffed under the header timeout, then hyper serving
//! HTTP/1.1 (with upgrades) or HTTP/2 under husk's bounds, told to finish when it has been
//! idle too long or the server stops.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use super::admit::Slot;
use super::idle::{Activity, Tracked};
use super::io::{sniff, Sniffed};
use super::ConnLimits;
use super::HttpService;

/// HTTP/2 streams one connection may have open at once (RFC 9113 asks for at least 100).
const MAX_CONCURRENT_STREAMS: u32 = 100;
/// Streams a peer may open and reset before husk accepts them ("rapid reset") before the
/// connection is closed; h2's own default, stated here so that it is a decision.
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Streams husk may reset for a peer's malformed frames before it closes the connection
/// ("MadeYouReset"); hyper's default, stated here for the same reason.
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;
/// How long an HTTP/2 connection may be silent before husk pings it.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);

/// hyper's connection builder with husk's bounds.
pub(super) fn builder(limits: &ConnLimits) -> auto::Builder<TokioExecutor> {
    let mut b = auto::Builder::new(TokioExecutor::new());
    b.http1()
        .timer(TokioTimer::new())
        // The whole head, from the first byte of the request line; hyper starts it again as
        // soon as a response ends, so it is also the keep-alive idle time of HTTP/1.1.
        .header_read_timeout(limits.header_timeout)
        // hyper answers 431 once this much is buffered without a complete head. It also bounds
        // each read of a body (hyper's default is ~400 KiB) and how much of a response hyper
        // queues before writing.
        .max_buf_size(limits.max_head_bytes.max(MIN_BUF));
    b.http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(limits.max_head_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        // Pings find a peer that vanished without closing, even while a stream is open.
        .keep_alive_interval(KEEP_ALIVE_INTERVAL)
        // As long to answer a ping as to send a head.
        .keep_alive_timeout(limits.header_timeout)
        // WebSockets over HTTP/2 (extended CONNECT, RFC 8441), as axum::serve allowed.
        .enable_connect_protocol();
    b
}

/// hyper refuses a smaller read buffer.
const MIN_BUF: usize = 8192;

/// What every connection of a listener is served with.
pub(super) struct Served {
    pub builder: Arc<auto::Builder<TokioExecutor>>,
    pub limits: Arc<ConnLimits>,
    pub tls: Option<TlsAcceptor>,
}

/// Serves one connection to its end.
pub(super) async fn serve<S>(
    tcp: TcpStream,
    peer: SocketAddr,
    slot: Slot,
    svc: S,
    with: Arc<Served>,
    mut stop: watch::Receiver<()>,
) where
    S: HttpService,
{
    let Some(acceptor) = with.tls.clone() else {
        return serve_stream(tcp, peer, slot, svc, with, stop).await;
    };
    // The handshake has the header timeout, as a request head has: a peer that starts one
    // and stalls holds its slot no longer than one that sends half a head.
    let handshake = tokio::time::timeout(with.limits.header_timeout, acceptor.accept(tcp));
    tokio::pin!(handshake);
    let tls = tokio::select! {
        r = &mut handshake => match r {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => None,
        },
        _ = stop.changed() => None,
    };
    match tls {
        Some(tls) => serve_stream(tls, peer, slot, svc, with, stop).await,
        // The slot first, as below: free by the time the peer sees the close (a handshake cut
        // short still holds the socket, which goes with it at the end of this function).
        None => drop(slot),
    }
}

/// Serves one connection, past its TLS handshake if it has one, to its end.
async fn serve_stream<S, IO>(
    mut tcp: IO,
    peer: SocketAddr,
    slot: Slot,
    svc: S,
    with: Arc<Served>,
    mut stop: watch::Receiver<()>,
) where
    S: HttpService,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let limits = &with.limits;
    // A peer that sends nothing (or a piece of the HTTP/2 preface) is closed after the header
    // timeout, as one that sends half a head is. A stop meanwhile closes it too.
    let prefix = tokio::select! {
        r = tokio::time::timeout(limits.header_timeout, sniff(&mut tcp)) => match r {
            Ok(Ok(p)) if !p.is_empty() => Some(p),
            _ => None,
        },
        _ = stop.changed() => None,
    };
    let Some(prefix) = prefix else {
        // The slot first: free by the time the peer sees the close.
        drop(slot);
        return;
    };
    let activity = Arc::new(Activity::default());
    let hyper_svc = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let busy = activity.busy();
            let mut req = req.map(Body::new);
            // The peer's address rides along for ingress's X-Forwarded-For.
            req.extensions_mut().insert(ConnectInfo(peer));
            let svc = svc.clone();
            async move {
                let resp = svc.oneshot(req).await?;
                Ok::<_, Infallible>(resp.map(|body| Tracked { body, _busy: busy }))
            }
        })
    };
    let io = TokioIo::new(Sniffed::new(prefix, tcp, slot));
    let conn = with.builder.serve_connection_with_upgrades(io, hyper_svc);
    tokio::pin!(conn);
    let idle = activity.idle_for(limits.idle_timeout);
    tokio::pin!(idle);
    // Once told to finish, the connection has `shutdown_grace` to do so; then it is dropped (a
    // peer that never acknowledges HTTP/2's GOAWAY must not keep it).
    let drain = tokio::time::sleep(limits.shutdown_grace);
    tokio::pin!(drain);
    let mut draining = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(%peer, error = %e, "connection ended");
                }
                return;
            }
            _ = &mut idle, if !draining => {}
            _ = stop.changed(), if !draining => {}
            _ = &mut drain, if draining => return,
        }
        // Idle, or the server stops: no new request; what is in flight may finish.
        conn.as_mut().graceful_shutdown();
        draining = true;
        drain
            .as_mut()
            .reset(tokio::time::Instant::now() + limits.shutdown_grace);
    }
}
