//! The forwarder's listeners: sandbox queries in over UDP and TCP, each passed upstream over
//! the same transport (so a truncated UDP answer makes the client ask again over TCP, as it
//! would with any server).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinSet;

use super::{wire, Resolver, MAX_UDP};
use crate::policy::NetPolicy;
use crate::sandboxes::Sandboxes;

/// How long a TCP client may sit between (or inside) its messages.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// How long to wait before accepting again after accept failed (out of descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What to do with a message from a sandbox.
enum Sender {
    /// Not a sandbox: no answer at all.
    Unknown,
    /// A sandbox without network: refused.
    NoNetwork,
    Sandbox,
}

fn sender(sandboxes: &Sandboxes, peer: SocketAddr) -> Sender {
    // A dual-stack socket shows IPv4 peers as ::ffff:a.b.c.d.
    match sandboxes.by_address(peer.ip().to_canonical()) {
        None => Sender::Unknown,
        Some(sb) if sb.policy() == NetPolicy::None => Sender::NoNetwork,
        Some(_) => Sender::Sandbox,
    }
}

impl Resolver {
    /// Answers DNS over UDP on `sock` (bound in the router namespace) until the task running
    /// it is dropped, which also drops the queries in flight. Datagrams from addresses that
    /// are not a registered sandbox's, over [`MAX_UDP`] bytes, or over the in-flight limits are
    /// dropped unanswered.
    pub async fn serve_udp(self: Arc<Self>, sock: UdpSocket, sandboxes: Arc<Sandboxes>) {
        let sock = Arc::new(sock);
        let mut tasks = JoinSet::new();
        let mut buf = vec![0u8; MAX_UDP + 1];
        loop {
            while tasks.try_join_next().is_some() {}
            let (n, peer) = match sock.recv_from(&mut buf).await {
                Ok(r) => r,
                Err(e) => {
                    // Errors on an unconnected UDP socket concern one datagram, not the socket.
                    tracing::debug!("resolver: udp receive: {e}");
                    continue;
                }
            };
            if !(wire::HEADER_LEN..=MAX_UDP).contains(&n) {
                continue;
            }
            let query = buf[..n].to_vec();
            match sender(&sandboxes, peer) {
                Sender::Unknown => continue,
                Sender::NoNetwork => {
                    if let Some(r) = wire::empty_reply(&query, wire::RCODE_REFUSED, false) {
                        let _ = sock.send_to(&r, peer).await;
                    }
                    continue;
                }
                Sender::Sandbox => {}
            }
            let Some(permit) = self.udp_limit.try_acquire(peer.ip().to_canonical()) else {
                continue;
            };
            let (me, sock) = (self.clone(), sock.clone());
            tasks.spawn(async move {
                let _permit = permit;
                if let Some(reply) = me.answer(&query, false).await {
                    if let Err(e) = sock.send_to(&reply, peer).await {
                        tracing::debug!("resolver: answer to {peer}: {e}");
                    }
                }
            });
        }
    }

    /// Answers DNS over TCP (2-byte length prefix, RFC 7766) on `listener` until the task
    /// running it is dropped, which also closes its connections. Connections from addresses
    /// that are not a registered sandbox's, or over the connection limits, are closed at once.
    pub async fn serve_tcp(self: Arc<Self>, listener: TcpListener, sandboxes: Arc<Sandboxes>) {
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let (stream, peer) = match listener.accept().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("resolver: accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            if !matches!(sender(&sandboxes, peer), Sender::Sandbox) {
                continue;
            }
            let Some(permit) = self.tcp_limit.try_acquire(peer.ip().to_canonical()) else {
                continue;
            };
            let me = self.clone();
            tasks.spawn(async move {
                let _permit = permit;
                if let Err(e) = me.tcp_client(stream).await {
                    tracing::debug!("resolver: tcp client {peer}: {e}");
                }
            });
        }
    }

    /// One TCP client's queries, one after another, until it closes or idles.
    async fn tcp_client(&self, mut s: TcpStream) -> io::Result<()> {
        async fn within<T>(f: impl std::future::Future<Output = io::Result<T>>) -> io::Result<T> {
            tokio::time::timeout(TCP_IDLE, f)
                .await
                .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()))
        }
        loop {
            let len = match within(s.read_u16()).await {
                Ok(n) => n as usize,
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            };
            if len < wire::HEADER_LEN {
                return Err(io::ErrorKind::InvalidData.into());
            }
            let mut query = vec![0; len];
            within(s.read_exact(&mut query)).await?;
            let Some(reply) = self.answer(&query, true).await else {
                return Err(io::ErrorKind::InvalidData.into());
            };
            // Upstream answers arrive through a u16 length, so they fit one.
            let mut framed = Vec::with_capacity(2 + reply.len());
            framed.extend_from_slice(&(reply.len() as u16).to_be_bytes());
            framed.extend_from_slice(&reply);
            within(s.write_all(&framed)).await?;
        }
    }

    /// The answer to a sandbox's query: the upstream's, or an error answer of our own so the
    /// client fails fast. `None`: not a query; no answer.
    async fn answer(&self, query: &[u8], tcp: bool) -> Option<Vec<u8>> {
        if query.len() < wire::HEADER_LEN || wire::is_response(query) {
            return None;
        }
        if wire::opcode(query).ok()? != 0 {
            return wire::empty_reply(query, wire::RCODE_NOTIMP, false);
        }
        if wire::question_end(query).is_err() {
            return wire::empty_reply(query, wire::RCODE_FORMERR, false);
        }
        match self.exchange(query, tcp).await {
            Ok(reply) => Some(reply),
            Err(e) => {
                tracing::debug!("resolver: upstream: {e}");
                wire::empty_reply(query, wire::RCODE_SERVFAIL, false)
            }
        }
    }
}
