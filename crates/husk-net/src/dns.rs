//! husk's resolver for sandboxes. Two jobs:
//!
//! - a **forwarder** ([`Resolver::serve_udp`], [`Resolver::serve_tcp`]): the router redirects
//!   every sandbox's DNS (port 53) here; queries from a registered sandbox address go to the
//!   upstream servers unchanged but for their id (a fresh random one per upstream query, mapped
//!   back), answers come back unchanged. Nothing is filtered: an answer naming a private
//!   address is harmless because the router refuses the connection that would follow.
//! - a **lookup** ([`Resolver::lookup`]) for the domain proxy, which resolves the names it
//!   allows itself rather than trusting the address a sandbox connected to.
//!
//! Upstream sockets are made in the egress namespace (the one with the route out); they are
//! fresh per query, so each query also gets a fresh source port. Queries in flight, TCP
//! connections and message sizes are bounded, in total and per sandbox.

mod forward;
pub mod wire;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::limit::Limit;
use crate::netns::{self, NetNs};

pub const DNS_PORT: u16 = 53;
/// The largest DNS message over UDP, either way (a larger answer reaches the client as an
/// empty, truncated one, and the client asks again over TCP).
pub const MAX_UDP: usize = 4096;
/// How long one upstream server has to answer before the next one is asked.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(5);
/// Most upstream servers used (resolv.conf's own limit is 3).
const MAX_UPSTREAMS: usize = 8;
/// Queries forwarded at once over UDP: in all, and per sandbox.
const UDP_IN_FLIGHT: usize = 1024;
const UDP_IN_FLIGHT_PER_SANDBOX: usize = 64;
/// TCP connections from sandboxes at once: in all, and per sandbox.
const TCP_CONNS: usize = 256;
const TCP_CONNS_PER_SANDBOX: usize = 16;
/// Names the lookup remembers, and for at most how long (their TTL, if shorter).
const CACHE_ENTRIES: usize = 1024;
const CACHE_MAX_TTL: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no upstream DNS server is configured")]
    NoUpstream,
    #[error(transparent)]
    Name(#[from] wire::WireError),
    #[error("no upstream DNS server answered for {name:?}")]
    Failed {
        name: String,
        #[source]
        source: io::Error,
    },
}

/// The resolver: upstream servers and the namespace they are reached from.
#[derive(Debug)]
pub struct Resolver {
    upstreams: Vec<SocketAddr>,
    egress: Option<NetNs>,
    timeout: Duration,
    udp_limit: Arc<Limit>,
    tcp_limit: Arc<Limit>,
    cache: Mutex<HashMap<String, (Vec<IpAddr>, Instant)>>,
}

impl Resolver {
    /// Asks `upstreams` in order (see [`host_upstreams`] for the host's), from the `egress`
    /// namespace (None: the caller's).
    pub fn new(mut upstreams: Vec<SocketAddr>, egress: Option<NetNs>) -> Resolver {
        upstreams.truncate(MAX_UPSTREAMS);
        Resolver {
            upstreams,
            egress,
            timeout: UPSTREAM_TIMEOUT,
            udp_limit: Limit::new(UDP_IN_FLIGHT, UDP_IN_FLIGHT_PER_SANDBOX),
            tcp_limit: Limit::new(TCP_CONNS, TCP_CONNS_PER_SANDBOX),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// How long each upstream server has to answer (default [`UPSTREAM_TIMEOUT`]).
    pub fn with_timeout(mut self, timeout: Duration) -> Resolver {
        self.timeout = timeout;
        self
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// The addresses of `name` (IPv4 first, then IPv6), following CNAME chains in the answers.
    /// A name that does not exist has none. Results are remembered for their TTL (at most a
    /// minute).
    pub async fn lookup(&self, name: &str) -> Result<Vec<IpAddr>, LookupError> {
        let key = name.trim_end_matches('.').to_ascii_lowercase();
        if let Some(hit) = self.cached(&key) {
            return Ok(hit);
        }
        let (v4, v6) = tokio::join!(
            self.lookup_type(&key, wire::TYPE_A),
            self.lookup_type(&key, wire::TYPE_AAAA)
        );
        let (addrs, ttl) = match (v4, v6) {
            (Ok((mut a, t4)), Ok((b, t6))) => {
                a.extend(b);
                (a, t4.min(t6))
            }
            // One type failed: the other's addresses will do, but its "none" proves nothing.
            (Ok(r), Err(e)) | (Err(e), Ok(r)) if r.0.is_empty() => return Err(e),
            (Ok(r), Err(_)) | (Err(_), Ok(r)) => r,
            (Err(e), Err(_)) => return Err(e),
        };
        if !addrs.is_empty() {
            let ttl = Duration::from_secs(ttl.into()).min(CACHE_MAX_TTL);
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.len() >= CACHE_ENTRIES {
                let now = Instant::now();
                cache.retain(|_, (_, until)| *until > now);
                if cache.len() >= CACHE_ENTRIES {
                    cache.clear();
                }
            }
            cache.insert(key, (addrs.clone(), Instant::now() + ttl));
        }
        Ok(addrs)
    }

    fn cached(&self, key: &str) -> Option<Vec<IpAddr>> {
        let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match cache.get(key) {
            Some((addrs, until)) if *until > Instant::now() => Some(addrs.clone()),
            _ => None,
        }
    }

    /// One type's addresses and their smallest TTL. A failing or refusing server sends the
    /// question on to the next; "no such name" is an answer.
    async fn lookup_type(&self, name: &str, qtype: u16) -> Result<(Vec<IpAddr>, u32), LookupError> {
        let query = wire::query(0, name, qtype)?;
        if self.upstreams.is_empty() {
            return Err(LookupError::NoUpstream);
        }
        let mut last = io::Error::other("no answer");
        for &up in &self.upstreams {
            let asked = tokio::time::timeout(self.timeout, async {
                let r = self.ask(up, &query, false).await?;
                match wire::truncated(&r) {
                    true => self.ask(up, &query, true).await,
                    false => Ok(r),
                }
            })
            .await
            .unwrap_or_else(|_| Err(io::ErrorKind::TimedOut.into()));
            let reply = match asked {
                Ok(r) => r,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match wire::parse_response(&reply) {
                Ok(r) if r.rcode == wire::RCODE_NOERROR => {
                    return Ok(wire::addresses(name, &r.answers));
                }
                Ok(r) if r.rcode == wire::RCODE_NXDOMAIN => return Ok((Vec::new(), 0)),
                Ok(r) => last = io::Error::other(format!("{up} answered rcode {}", r.rcode)),
                Err(e) => last = io::Error::new(io::ErrorKind::InvalidData, e),
            }
        }
        Err(LookupError::Failed {
            name: name.to_owned(),
            source: last,
        })
    }

    /// Sends `query` to each upstream server in turn until one answers; the answer carries
    /// `query`'s id.
    pub(crate) async fn exchange(&self, query: &[u8], tcp: bool) -> io::Result<Vec<u8>> {
        let client_id =
            wire::id(query).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        let mut last = io::Error::other("no upstream DNS server is configured");
        for &up in &self.upstreams {
            match tokio::time::timeout(self.timeout, self.ask(up, query, tcp)).await {
                Ok(Ok(mut reply)) => {
                    wire::set_id(&mut reply, client_id);
                    return Ok(reply);
                }
                Ok(Err(e)) => last = e,
                Err(_) => last = io::ErrorKind::TimedOut.into(),
            }
        }
        Err(last)
    }

    /// One query to one upstream server under a fresh random id; the answer must carry that
    /// id and the same question (anything else arriving meanwhile is ignored).
    async fn ask(&self, upstream: SocketAddr, query: &[u8], tcp: bool) -> io::Result<Vec<u8>> {
        let mut q = query.to_vec();
        let ours = random_id()?;
        wire::set_id(&mut q, ours);
        let fits = |r: &[u8]| {
            wire::id(r) == Ok(ours) && wire::is_response(r) && wire::same_question(&q, r)
        };
        if tcp {
            let mut s = netns::tcp_connect(self.egress.as_ref(), upstream).await?;
            let mut framed = Vec::with_capacity(2 + q.len());
            framed.extend_from_slice(&(q.len() as u16).to_be_bytes());
            framed.extend_from_slice(&q);
            s.write_all(&framed).await?;
            let len = s.read_u16().await? as usize;
            let mut reply = vec![0; len];
            s.read_exact(&mut reply).await?;
            return match fits(&reply) {
                true => Ok(reply),
                false => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{upstream} answered another question"),
                )),
            };
        }
        let local = match upstream {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        let sock = netns::udp_bind(self.egress.as_ref(), local)?;
        // Connected: the kernel drops datagrams from anyone but the server.
        sock.connect(upstream).await?;
        sock.send(&q).await?;
        // One byte more than allowed, to tell an answer that is too big.
        let mut buf = vec![0; MAX_UDP + 1];
        loop {
            let n = sock.recv(&mut buf).await?;
            let reply = &buf[..n];
            if !fits(reply) {
                continue;
            }
            if n > MAX_UDP {
                let rcode = wire::rcode(reply).unwrap_or(wire::RCODE_SERVFAIL);
                return wire::empty_reply(&q, rcode, true)
                    .ok_or_else(|| io::Error::other("unreadable query"));
            }
            return Ok(reply.to_vec());
        }
    }
}

fn random_id() -> io::Result<u16> {
    let mut b = [0u8; 2];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(format!("random id: {e}")))?;
    Ok(u16::from_ne_bytes(b))
}

/// The host's name servers: `nameserver` lines of /etc/resolv.conf that are not loopback (a
/// local stub such as systemd-resolved's 127.0.0.53 is not reachable from another namespace;
/// its own upstreams, in /run/systemd/resolve/resolv.conf, are tried next).
pub fn host_upstreams() -> Vec<SocketAddr> {
    ["/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|text| parse_resolv_conf(&text))
        .find(|v| !v.is_empty())
        .unwrap_or_default()
}

/// The non-loopback name servers of a resolv.conf text, on port 53.
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            if words.next()? != "nameserver" {
                return None;
            }
            // A scoped IPv6 address (fe80::1%eth0) names an interface of the host's own
            // namespace: it does not parse, and is skipped.
            let ip: IpAddr = words.next()?.parse().ok()?;
            let ip = ip.to_canonical();
            (!ip.is_loopback() && !ip.is_unspecified()).then_some(SocketAddr::new(ip, DNS_PORT))
        })
        .take(MAX_UPSTREAMS)
        .collect()
}

#[cfg(test)]
pub(crate) mod tests;
