//! The domain proxy: for a sandbox whose policy names domains, the router redirects its TCP
//! connections to ports 80 and 443 here. For each one the proxy reads the name it is for
//! (HTTP `Host`, TLS SNI; [`crate::sniff`]) and decides ([`route`]):
//!
//! - a name an **allow** rule names is resolved by the proxy itself ([`Resolver::lookup`]) and
//!   reached at its own addresses, never at the one the sandbox connected to, so `/etc/hosts`
//!   edits or a rebinding resolver inside the sandbox gain nothing; addresses in the denied
//!   ranges are dropped, and a name left with none is refused;
//! - anything else is judged by the sandbox's policy on name and address together, and reaches
//!   the address the sandbox connected to.
//!
//! A refused connection is recorded in the sandbox's denial log and reset at once, so the
//! client fails fast rather than hanging. The proxy opens its upstream connections in the
//! egress namespace; what it forwards is no longer under the router's per-sandbox rules, so it
//! checks the denied ranges itself.
//!
//! A host the sandbox's header rules name ([`crate::rules`]) is not passed through: the proxy
//! answers the sandbox itself ([`crate::intercept`]), over TLS with a certificate from the
//! sandbox's CA when the sandbox speaks TLS, reaches the host at the addresses it resolves
//! itself (never the one the sandbox chose: the headers often carry a key), verifies the
//! host's certificate, and sets the rules' headers on each request. The policy still decides
//! first: rules open nothing.
//!
//! Known limits, as for any SNI/Host filter: a server that hosts an allowed name may serve
//! others on the same address (domain fronting, TLS ECH); the proxy only guarantees which
//! address the bytes go to.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::denied::is_denied;
use crate::dns::Resolver;
use crate::intercept::{Rewind, Transform};
use crate::limit::Limit;
use crate::netns::{self, NetNs};
use crate::policy::{NetPolicy, Verdict};
use crate::rules::HostRule;
use crate::sandboxes::{Denial, SandboxNet, Sandboxes};
use crate::sniff::{sniff, Sniffed, MAX_SNIFF, SNIFF_TIMEOUT};

/// How long one upstream connection attempt may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections proxied at once: in all, and per sandbox.
const MAX_CONNS: usize = 4096;
const MAX_CONNS_PER_SANDBOX: usize = 256;
/// Most of a name's addresses tried before giving up.
const MAX_ADDRS_TRIED: usize = 4;
/// Buffer of each direction of a proxied connection.
const COPY_BUF: usize = 64 << 10;
/// How long to wait before accepting again after accept failed (out of descriptors, say).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

pub const REASON_POLICY: &str = "policy";
pub const REASON_ALWAYS_DENIED: &str = "always denied";
pub const REASON_RESOLVES_DENIED: &str = "resolves to a denied address";
pub const REASON_NO_ADDRESS: &str = "name does not resolve";

/// Where a connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// To the addresses the proxy resolves for this name.
    Resolve(String),
    /// To the address the sandbox connected to.
    Original,
    /// Nowhere, for this reason.
    Deny(&'static str),
}

/// The route for a connection to `dst` for `host` (None: the first bytes named none) under
/// `policy`, with `denied` the ranges no policy opens.
pub fn route(policy: &NetPolicy, host: Option<&str>, dst: IpAddr, denied: &[IpNet]) -> Route {
    if let (Some(h), NetPolicy::Egress { allow, .. }) = (host, policy) {
        if allow.iter().any(|t| t.matches_domain(h)) {
            return Route::Resolve(h.to_owned());
        }
    }
    if is_denied(denied, dst) {
        return Route::Deny(REASON_ALWAYS_DENIED);
    }
    let verdict = match host {
        Some(h) => policy.decide_host(h, dst),
        None => policy.decide_ip(dst),
    };
    match verdict {
        Verdict::Allow => Route::Original,
        Verdict::Deny => Route::Deny(REASON_POLICY),
    }
}

/// Where the connection was going before the router's `redirect` sent it here.
pub fn original_dst(s: &TcpStream) -> io::Result<SocketAddr> {
    // socket2 wraps getsockopt(SOL_IP, SO_ORIGINAL_DST) safely: no unsafe needed here.
    socket2::SockRef::from(s)
        .original_dst_v4()?
        .as_socket()
        .ok_or_else(|| io::Error::other("SO_ORIGINAL_DST gave no IPv4 address"))
}

/// Closes `s` with a RST rather than a FIN, so the client's connect or first read fails at
/// once with "connection reset".
fn reset(s: TcpStream) {
    let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    drop(s);
}

#[derive(Debug)]
pub struct DomainProxy {
    sandboxes: Arc<Sandboxes>,
    resolver: Arc<Resolver>,
    denied: Arc<Vec<IpNet>>,
    egress: Option<NetNs>,
    connect_timeout: Duration,
    sniff_timeout: Duration,
    limit: Arc<Limit>,
    /// How upstream servers of header rules are verified (or why they cannot be).
    upstream_tls: Result<Arc<rustls::ClientConfig>, String>,
}

impl DomainProxy {
    /// A proxy for `sandboxes` that resolves names with `resolver`, never reaches `denied`
    /// (the always-denied ranges and the host's addresses) and connects out from `egress`
    /// (None: the caller's namespace).
    pub fn new(
        sandboxes: Arc<Sandboxes>,
        resolver: Arc<Resolver>,
        denied: Arc<Vec<IpNet>>,
        egress: Option<NetNs>,
    ) -> DomainProxy {
        DomainProxy {
            sandboxes,
            resolver,
            denied,
            egress,
            connect_timeout: CONNECT_TIMEOUT,
            sniff_timeout: SNIFF_TIMEOUT,
            limit: Limit::new(MAX_CONNS, MAX_CONNS_PER_SANDBOX),
            upstream_tls: Err("no upstream TLS configuration".into()),
        }
    }

    /// How the servers of header rules are verified ([`crate::intercept::client_config`]).
    pub fn with_upstream_tls(
        mut self,
        tls: Result<Arc<rustls::ClientConfig>, String>,
    ) -> DomainProxy {
        self.upstream_tls = tls;
        self
    }

    /// How long an upstream connect may take (default [`CONNECT_TIMEOUT`]) and how long the
    /// client has to send the name (default [`SNIFF_TIMEOUT`]).
    pub fn with_timeouts(mut self, connect: Duration, sniff: Duration) -> DomainProxy {
        self.connect_timeout = connect;
        self.sniff_timeout = sniff;
        self
    }

    /// Proxies the connections `listener` (bound in the router namespace) accepts, until the
    /// task running this is dropped, which also closes them. Connections from an address
    /// that is not a registered sandbox's, or over the connection limits, are reset.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut tasks = JoinSet::new();
        loop {
            while tasks.try_join_next().is_some() {}
            let (client, peer) = match listener.accept().await {
                Ok(r) => r,
                Err(e) => {
                    tracing::debug!("proxy: accept: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            };
            // A relay must not add Nagle's delay: two small writes to the sandbox (an HTTP
            // answer's head, then its body) would otherwise wait for the sandbox's delayed ACK
            // (40 ms a request, measured by `husk bench`'s HTTPS figures).
            let _ = client.set_nodelay(true);
            let source = peer.ip().to_canonical();
            let Some(sb) = self.sandboxes.by_address(source) else {
                reset(client);
                continue;
            };
            let Some(permit) = self.limit.try_acquire(source) else {
                reset(client);
                continue;
            };
            let me = self.clone();
            tasks.spawn(async move {
                let _permit = permit;
                if let Err(e) = me.connection(client, &sb).await {
                    tracing::debug!("proxy: {peer}: {e}");
                }
            });
        }
    }

    async fn connection(&self, mut client: TcpStream, sb: &SandboxNet) -> io::Result<()> {
        let dst = match (original_dst(&client), client.local_addr()) {
            // Not redirected: someone connected to the proxy's own port.
            (Ok(dst), Ok(local)) if dst == local => {
                reset(client);
                return Ok(());
            }
            (Ok(dst), _) => dst,
            (Err(e), _) => {
                reset(client);
                return Err(e);
            }
        };
        let sniffed = sniff(&mut client, MAX_SNIFF, self.sniff_timeout).await?;
        let host = sniffed.host.as_deref();
        if let Some(h) = host {
            let rules = sb.rules();
            if let Some(rule) = rules.for_host(h) {
                let h = h.to_owned();
                return self.intercept(client, sb, dst, &h, rule, sniffed).await;
            }
        }
        let upstream = match route(&sb.policy(), host, dst.ip(), &self.denied) {
            Route::Deny(reason) => {
                self.refuse(client, sb, dst, host, reason);
                return Ok(());
            }
            Route::Original => self.connect(&[dst]).await,
            Route::Resolve(name) => match self.resolve(&name, dst, |_| true).await {
                Ok(Ok(usable)) => self.connect(&usable).await,
                Ok(Err((at, reason))) => {
                    self.refuse(client, sb, at, host, reason);
                    return Ok(());
                }
                Err(e) => {
                    reset(client);
                    return Err(e);
                }
            },
        };
        let mut upstream = match upstream {
            Ok(u) => u,
            Err(e) => {
                reset(client);
                return Err(e);
            }
        };
        upstream.write_all(&sniffed.bytes).await?;
        // 64 KiB each way (tokio's default is 8 KiB: a 1 GB download then costs 125 000
        // read/write pairs, and the proxy ran at a tenth of the NAT's throughput).
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut upstream, COPY_BUF, COPY_BUF)
            .await?;
        Ok(())
    }

    /// A connection to a host with header rules: allowed by the policy as any other, then
    /// served by [`crate::intercept`] over a connection the proxy makes to the addresses it
    /// resolves for the name (each of them allowed by the policy too).
    async fn intercept(
        &self,
        client: TcpStream,
        sb: &SandboxNet,
        dst: SocketAddr,
        host: &str,
        rule: &HostRule,
        sniffed: Sniffed,
    ) -> io::Result<()> {
        let policy = sb.policy();
        if let Route::Deny(reason) = route(&policy, Some(host), dst.ip(), &self.denied) {
            self.refuse(client, sb, dst, Some(host), reason);
            return Ok(());
        }
        let allowed = |ip| policy.decide_host(host, ip) == Verdict::Allow;
        let usable = match self.resolve(host, dst, allowed).await {
            Ok(Ok(usable)) => usable,
            Ok(Err((at, reason))) => {
                self.refuse(client, sb, at, Some(host), reason);
                return Ok(());
            }
            Err(e) => {
                reset(client);
                return Err(e);
            }
        };
        let transform = Arc::new(Transform::new(host, rule)?);
        let tls = sniffed.bytes.first() == Some(&crate::sniff::TLS_HANDSHAKE);
        let client = Rewind::new(sniffed.bytes, client);
        let upstream = self.connect(&usable).await;
        if !tls {
            return crate::intercept::serve(client, upstream, transform).await;
        }
        let Some(ca) = sb.ca() else {
            return Err(io::Error::other("header rules without the sandbox's CA"));
        };
        let server_cfg = ca.server_config(host).map_err(io::Error::other)?;
        let accepted = tokio::time::timeout(
            self.sniff_timeout,
            tokio_rustls::TlsAcceptor::from(server_cfg).accept(client),
        )
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake with the sandbox"))??;
        let upstream = match (upstream, &self.upstream_tls) {
            (Ok(tcp), Ok(cfg)) => {
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(io::Error::other)?;
                let handshake = tokio_rustls::TlsConnector::from(cfg.clone()).connect(name, tcp);
                match tokio::time::timeout(self.connect_timeout, handshake).await {
                    Ok(r) => r,
                    Err(_) => Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "TLS handshake timed out",
                    )),
                }
            }
            (Ok(_), Err(why)) => Err(io::Error::other(why.clone())),
            (Err(e), _) => Err(e),
        };
        crate::intercept::serve(accepted, upstream, transform).await
    }

    /// `name`'s addresses (resolved by the proxy), at `dst`'s port, outside the denied ranges
    /// and admitted by `allowed`; when there are none, where the connection is refused and
    /// why (`dst` when the name has no address). `Err`: the lookup failed.
    async fn resolve(
        &self,
        name: &str,
        dst: SocketAddr,
        allowed: impl Fn(IpAddr) -> bool,
    ) -> io::Result<Result<Vec<SocketAddr>, (SocketAddr, &'static str)>> {
        let addrs = self.resolver.lookup(name).await.map_err(io::Error::other)?;
        let usable: Vec<SocketAddr> = addrs
            .iter()
            .filter(|ip| !is_denied(&self.denied, **ip) && allowed(**ip))
            .map(|ip| SocketAddr::new(*ip, dst.port()))
            .collect();
        if !usable.is_empty() {
            return Ok(Ok(usable));
        }
        Ok(Err(match addrs.first() {
            Some(ip) if is_denied(&self.denied, *ip) => {
                (SocketAddr::new(*ip, dst.port()), REASON_RESOLVES_DENIED)
            }
            Some(ip) => (SocketAddr::new(*ip, dst.port()), REASON_POLICY),
            None => (dst, REASON_NO_ADDRESS),
        }))
    }

    /// The first of `addrs` that accepts a connection (from the egress namespace).
    async fn connect(&self, addrs: &[SocketAddr]) -> io::Result<TcpStream> {
        let mut last = io::Error::other("no address to connect to");
        for &addr in addrs.iter().take(MAX_ADDRS_TRIED) {
            let attempt = netns::tcp_connect(self.egress.as_ref(), addr);
            match tokio::time::timeout(self.connect_timeout, attempt).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(e)) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
                Err(_) => last = io::Error::new(io::ErrorKind::TimedOut, format!("{addr}")),
            }
        }
        Err(last)
    }

    fn refuse(
        &self,
        client: TcpStream,
        sb: &SandboxNet,
        at: SocketAddr,
        host: Option<&str>,
        reason: &str,
    ) {
        let mut d = Denial::now("tcp", at.ip(), at.port(), reason);
        d.host = host.map(str::to_owned);
        sb.record(d);
        reset(client);
    }
}

#[cfg(test)]
mod tests;
