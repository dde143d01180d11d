//! The network helper: a privileged process of its own that holds the router (nftables,
//! links, the resolver, the domain proxy, the denial log) and makes sockets inside sandboxes'
//! namespaces, for a server that then needs neither `CAP_NET_ADMIN` nor `setns`.
//!
//! It is forked by `husk serve` before any thread (`husk_runtime::helper`) and answers
//! [`Request`]s: attach a sandbox (a link from the router's pool; its namespace is passed
//! back), change or read a link's policy and denials, detach it, and make a TCP socket in a
//! namespace the server passes in, which the server then connects itself: the socket belongs
//! to that namespace for life, so streams never pass through the helper.
//!
//! Everything it is sent is hostile: a link is named by a number only the helper hands out;
//! a namespace passed in must be a network namespace and not one of the helper's own (the
//! host's, the router's, the egress one), so no socket it makes can reach the sandboxes'
//! links or the host's loopback from inside the router.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use husk_runtime::failure::{Failure, FailureKind};
use husk_runtime::helper::{self as rt, Channels, HelperError};
use serde::{Deserialize, Serialize};

use crate::netns::NetNs;
use crate::policy::{NetPolicy, Target};
use crate::router::{Attachment, RouterError};
use crate::rules::HeaderRules;
use crate::sandboxes::Denial;
use crate::service::NetService;

/// Channels, so that this many requests are served at once (an `nft` run for one sandbox
/// never holds up a socket for another).
pub const CHANNELS: usize = 8;

/// A policy on the wire ([`NetPolicy`] is tagged for JSON, which postcard cannot read).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WirePolicy {
    None,
    Egress {
        allow: Vec<Target>,
        deny: Vec<Target>,
    },
}

impl From<NetPolicy> for WirePolicy {
    fn from(p: NetPolicy) -> WirePolicy {
        match p {
            NetPolicy::None => WirePolicy::None,
            NetPolicy::Egress { allow, deny } => WirePolicy::Egress { allow, deny },
        }
    }
}

impl From<WirePolicy> for NetPolicy {
    fn from(p: WirePolicy) -> NetPolicy {
        match p {
            WirePolicy::None => NetPolicy::None,
            WirePolicy::Egress { allow, deny } => NetPolicy::Egress { allow, deny },
        }
    }
}

/// A denial on the wire (every field present: [`Denial`] leaves out an absent host in JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireDenial {
    pub at: u64,
    pub protocol: String,
    pub address: std::net::IpAddr,
    pub port: u16,
    pub host: Option<String>,
    pub reason: String,
}

impl From<Denial> for WireDenial {
    fn from(d: Denial) -> WireDenial {
        WireDenial {
            at: d.at,
            protocol: d.protocol,
            address: d.address,
            port: d.port,
            host: d.host,
            reason: d.reason,
        }
    }
}

impl From<WireDenial> for Denial {
    fn from(d: WireDenial) -> Denial {
        Denial {
            at: d.at,
            protocol: d.protocol,
            address: d.address,
            port: d.port,
            host: d.host,
            reason: d.reason,
        }
    }
}

/// What the server asks the network helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// A link out under `policy`, for a new sandbox: [`Reply::Attached`], with the
    /// namespace the sandbox joins attached. With `rules` (even empty) the sandbox gets a CA
    /// of its own, for its header rules now and later.
    Attach {
        policy: WirePolicy,
        rules: Option<HeaderRules>,
    },
    /// Changes a link's policy and header rules (empty: none).
    SetPolicy {
        link: u64,
        policy: WirePolicy,
        rules: HeaderRules,
    },
    /// A link's denials (at most [`crate::sandboxes::MAX_DENIALS`], a few hundred KiB);
    /// `sync` first files what the kernel has logged so far.
    Denials { link: u64, sync: bool },
    /// Removes a link (its rules go; the namespace lives while the sandbox holds it).
    Detach { link: u64 },
    /// A TCP socket (IPv6 if `v6`) made in the network namespace attached to the request,
    /// not connected: [`Reply::Socket`] with it attached.
    Socket { v6: bool },
    /// Links the namespace attached to the request (a sandbox's that outlived an earlier
    /// helper) again as the recorded link `index`, under `policy` and `rules`:
    /// [`Reply::Attached`] (nothing attached).
    Reattach {
        index: u32,
        policy: WirePolicy,
        rules: Option<HeaderRules>,
    },
    /// Gives back the recorded links no sandbox was linked to again: [`Reply::Pruned`].
    PruneLinks,
}

/// The network helper's answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// `ca`: the sandbox's CA certificate (PEM), when it was attached with rules.
    Attached {
        link: u64,
        /// The router's index of the link (what a later helper takes it up by).
        index: u32,
        gateway: Ipv4Addr,
        ca: Option<String>,
    },
    Pruned(u32),
    Done,
    Denials(Vec<WireDenial>),
    Socket,
    Failed(Failure),
}

/// The helper's side: the service (if egress is on) and the links it handed out.
struct Helper {
    service: Option<NetService>,
    /// Namespaces no socket is made in: the helper's own (the host's), the router's, and the
    /// egress namespace.
    own: Vec<NetNs>,
    links: Mutex<HashMap<u64, Arc<Attachment>>>,
    next: AtomicU64,
}

fn failed(kind: FailureKind, message: impl Into<String>) -> (Reply, Option<OwnedFd>) {
    (Reply::Failed(Failure::new(kind, message)), None)
}

impl Helper {
    fn link(&self, link: u64) -> Option<Arc<Attachment>> {
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&link)
            .cloned()
    }

    fn handle(&self, req: Request, fd: Option<OwnedFd>) -> (Reply, Option<OwnedFd>) {
        if fd.is_some() && !matches!(req, Request::Socket { .. } | Request::Reattach { .. }) {
            return failed(
                FailureKind::InvalidSpec,
                "a descriptor with a request that takes none",
            );
        }
        match req {
            Request::Attach { policy, rules } => self.attach(policy.into(), rules),
            Request::Reattach {
                index,
                policy,
                rules,
            } => match fd {
                Some(fd) => self.reattach(fd, index, policy.into(), rules),
                None => failed(
                    FailureKind::InvalidSpec,
                    "a reattach request without a namespace",
                ),
            },
            Request::PruneLinks => {
                let pruned = self
                    .service
                    .as_ref()
                    .map_or(0, |s| s.router().prune_orphans());
                (Reply::Pruned(pruned as u32), None)
            }
            Request::SetPolicy {
                link,
                policy,
                rules,
            } => {
                let policy = NetPolicy::from(policy);
                if let Err(e) = policy.validate() {
                    return failed(FailureKind::InvalidSpec, format!("invalid policy: {e}"));
                }
                if let Err(e) = rules.validate() {
                    return failed(FailureKind::InvalidSpec, format!("invalid rules: {e}"));
                }
                // The link is taken out of the map's lock before its `nft` run: changes to
                // other links never wait for this one.
                let found = self.link(link);
                match found {
                    Some(a) => match a.set_policy(policy, rules) {
                        Ok(()) => (Reply::Done, None),
                        Err(RouterError::Rules(e)) => {
                            failed(FailureKind::InvalidSpec, e.to_string())
                        }
                        Err(e) => failed(
                            FailureKind::Internal,
                            format!(
                                "changing the sandbox's egress policy: {}",
                                husk_runtime::failure::chain(&e)
                            ),
                        ),
                    },
                    None => failed(FailureKind::NotFound, format!("no link {link}")),
                }
            }
            Request::Denials { link, sync } => {
                if sync {
                    if let Some(s) = &self.service {
                        s.sync_log(std::time::Duration::from_millis(500));
                    }
                }
                match self.link(link) {
                    Some(a) => {
                        let all = a.net.denials().into_iter().map(WireDenial::from);
                        (Reply::Denials(all.collect()), None)
                    }
                    None => failed(FailureKind::NotFound, format!("no link {link}")),
                }
            }
            Request::Detach { link } => {
                let gone = self
                    .links
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&link);
                match gone {
                    // Dropping it removes its rules (queued to the router's worker), once a
                    // policy change under way on it is done; its record goes with it.
                    Some(a) => {
                        a.detach();
                        drop(a);
                        (Reply::Done, None)
                    }
                    None => failed(FailureKind::NotFound, format!("no link {link}")),
                }
            }
            Request::Socket { v6 } => match fd {
                Some(fd) => self.socket(fd, v6),
                None => failed(
                    FailureKind::InvalidSpec,
                    "a socket request without a namespace",
                ),
            },
        }
    }

    /// The service a link is made by, once `policy` and `rules` from the wire are checked
    /// again; else the failure to answer.
    fn linking(
        &self,
        policy: &NetPolicy,
        rules: Option<&HeaderRules>,
    ) -> Result<&NetService, (Reply, Option<OwnedFd>)> {
        let Some(service) = &self.service else {
            return Err(failed(
                FailureKind::Host,
                "sandbox egress is off on this server",
            ));
        };
        if let Err(e) = policy.validate() {
            return Err(failed(
                FailureKind::InvalidSpec,
                format!("invalid policy: {e}"),
            ));
        }
        if let Some(Err(e)) = rules.map(HeaderRules::validate) {
            return Err(failed(
                FailureKind::InvalidSpec,
                format!("invalid rules: {e}"),
            ));
        }
        Ok(service)
    }

    /// The network namespace passed with a request: a sandbox's, never one of the helper's
    /// own (the host's, the router's, the egress one); else the failure to answer, which says
    /// that `what` is done only there.
    fn sandbox_ns(&self, fd: OwnedFd, what: &str) -> Result<NetNs, (Reply, Option<OwnedFd>)> {
        let ns = NetNs::from_fd(fd).map_err(|e| failed(FailureKind::InvalidSpec, e.to_string()))?;
        if self.own.iter().any(|o| o.same_as(&ns)) {
            return Err(failed(
                FailureKind::InvalidSpec,
                format!("{what} only in sandboxes' namespaces"),
            ));
        }
        Ok(ns)
    }

    fn attach(&self, policy: NetPolicy, rules: Option<HeaderRules>) -> (Reply, Option<OwnedFd>) {
        let service = match self.linking(&policy, rules.as_ref()) {
            Ok(s) => s,
            Err(f) => return f,
        };
        match service.attach(policy, rules) {
            Ok(a) => {
                let ns = a.netns.fd().try_clone_to_owned();
                match ns {
                    Ok(ns) => (self.register(a), Some(ns)),
                    Err(e) => failed(
                        FailureKind::Exhausted,
                        format!("passing the namespace: {e}"),
                    ),
                }
            }
            Err(e) => failed(
                FailureKind::Internal,
                format!(
                    "linking the sandbox to the router: {}",
                    husk_runtime::failure::chain(&e)
                ),
            ),
        }
    }

    /// Keeps a link the router made, under a number of its own.
    fn register(&self, a: Attachment) -> Reply {
        let link = self.next.fetch_add(1, Ordering::Relaxed);
        let reply = Reply::Attached {
            link,
            index: a.index(),
            gateway: a.gateway(),
            ca: a.ca_pem(),
        };
        self.links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(link, Arc::new(a));
        reply
    }

    fn reattach(
        &self,
        fd: OwnedFd,
        index: u32,
        policy: NetPolicy,
        rules: Option<HeaderRules>,
    ) -> (Reply, Option<OwnedFd>) {
        let (service, ns) = match (
            self.linking(&policy, rules.as_ref()),
            self.sandbox_ns(fd, "links are made"),
        ) {
            (Ok(s), Ok(ns)) => (s, ns),
            (Err(f), _) | (_, Err(f)) => return f,
        };
        match service.router().reattach(ns, index, policy, rules) {
            Ok(a) => (self.register(a), None),
            Err(RouterError::Config(m)) => failed(FailureKind::NotFound, m),
            Err(e) => failed(
                FailureKind::Internal,
                format!(
                    "linking the sandbox to the router again: {}",
                    husk_runtime::failure::chain(&e)
                ),
            ),
        }
    }

    fn socket(&self, fd: OwnedFd, v6: bool) -> (Reply, Option<OwnedFd>) {
        let ns = match self.sandbox_ns(fd, "sockets are made") {
            Ok(ns) => ns,
            Err(f) => return f,
        };
        let domain = if v6 {
            socket2::Domain::IPV6
        } else {
            socket2::Domain::IPV4
        };
        let made = ns.run(|| {
            socket2::Socket::new(
                domain,
                socket2::Type::STREAM.nonblocking().cloexec(),
                Some(socket2::Protocol::TCP),
            )
        });
        match made {
            Ok(s) => (Reply::Socket, Some(s.into())),
            Err(e) => failed(
                FailureKind::Exhausted,
                format!("a socket in the sandbox: {e}"),
            ),
        }
    }
}

/// The body of the helper process: starts the service with `setup` (inside a runtime of its
/// own: the resolver and proxy are its tasks), says [`Reply::Ready`] (or why not) on the
/// first channel, serves every channel on a thread of its own, and stops the service when the
/// server has closed them all.
fn run(channels: Vec<OwnedFd>, setup: impl FnOnce() -> Result<Option<NetService>, String>) -> i32 {
    let internal =
        |what: &str, e: std::io::Error| Failure::new(FailureKind::Internal, format!("{what}: {e}"));
    let started = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("husk-net")
        .enable_all()
        .build()
        .map_err(|e| internal("async runtime", e))
        .and_then(|runtime| {
            let service = runtime
                .block_on(async { setup() })
                .map_err(|e| Failure::new(FailureKind::Host, e))?;
            let mut own = vec![NetNs::current().map_err(|e| internal("own namespace", e))?];
            if let Some(s) = &service {
                own.push(s.router().namespace().clone());
                own.extend(s.router().egress().cloned());
            }
            let helper = Helper {
                service,
                own,
                links: Mutex::new(HashMap::new()),
                next: AtomicU64::new(1),
            };
            Ok((runtime, helper))
        });
    let (runtime, helper) = match started {
        Ok(x) => x,
        Err(f) => {
            let _ = rt::ready::<bool>(&channels, &Err(f));
            return 1;
        }
    };
    // Ready: whether sandboxes get links out (egress off: only sockets are made).
    if rt::ready(&channels, &Ok(helper.service.is_some())).is_err() {
        return 1;
    }
    rt::serve_channels(
        channels,
        "husk-net-chan",
        |req, fd, _| helper.handle(req, fd),
        |m| {
            Reply::Failed(Failure::new(
                FailureKind::InvalidSpec,
                format!("bad request: {m}"),
            ))
        },
    );
    // The server is gone or stopping: every link, then the router and what it made on the
    // host.
    helper
        .links
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clear();
    if let Some(s) = &helper.service {
        s.shutdown();
    }
    drop(runtime);
    0
}

/// The server's handle on the network helper.
#[derive(Debug)]
pub struct NetHelper {
    channels: Channels,
    pid: libc::pid_t,
    egress: bool,
}

impl NetHelper {
    /// Forks the helper; `setup` runs in it, inside its async runtime, and starts the router
    /// (`Ok(None)`: egress off). Blocks until the helper is ready. The calling process must be
    /// single-threaded.
    pub fn start(
        setup: impl FnOnce() -> Result<Option<NetService>, String>,
    ) -> Result<NetHelper, Failure> {
        let forked = rt::fork("husk-net", CHANNELS, &[], |channels| run(channels, setup))?;
        let egress = rt::await_ready::<bool>("network", &forked)?;
        Ok(NetHelper {
            channels: Channels::new("network", forked.channels),
            pid: forked.pid,
            egress,
        })
    }

    /// Whether sandboxes get links out.
    pub fn egress(&self) -> bool {
        self.egress
    }

    /// The helper's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Stops the helper (which removes its links, the router and what it made on the host)
    /// and waits for it to exit. Blocking. Later calls fail.
    pub fn shutdown(&self) {
        self.channels.close();
        let _ = husk_runtime::sys::waitpid(self.pid, 0);
    }

    fn call(
        &self,
        req: &Request,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(Reply, Option<OwnedFd>), HelperError> {
        match self.channels.call(req, fd)? {
            (Reply::Failed(f), _) => Err(HelperError::Failed(f)),
            ok => Ok(ok),
        }
    }

    fn unexpected(reply: &Reply) -> HelperError {
        HelperError::Protocol {
            helper: "network",
            message: format!("unexpected {reply:?}"),
        }
    }

    /// A link out for a new sandbox; with `rules` (even empty), a CA of its own for them
    /// ([`Link::ca_pem`]). Blocking.
    pub fn attach(
        self: &Arc<Self>,
        policy: NetPolicy,
        rules: Option<HeaderRules>,
    ) -> Result<Link, HelperError> {
        match self.call(
            &Request::Attach {
                policy: policy.clone().into(),
                rules,
            },
            None,
        )? {
            (reply @ Reply::Attached { .. }, Some(ns)) => {
                let netns = NetNs::from_fd(ns).map_err(|e| HelperError::Protocol {
                    helper: "network",
                    message: e.to_string(),
                })?;
                self.link(reply, netns, policy)
            }
            (other, _) => Err(Self::unexpected(&other)),
        }
    }

    /// Links `netns`, the namespace of a sandbox that outlived the helper its link `index`
    /// was made by, again (see [`crate::router::Router::reattach`]). Blocking.
    pub fn reattach(
        self: &Arc<Self>,
        netns: NetNs,
        index: u32,
        policy: NetPolicy,
        rules: Option<HeaderRules>,
    ) -> Result<Link, HelperError> {
        let req = Request::Reattach {
            index,
            policy: policy.clone().into(),
            rules,
        };
        match self.call(&req, Some(netns.fd()))? {
            (reply @ Reply::Attached { .. }, None) => self.link(reply, netns, policy),
            (other, _) => Err(Self::unexpected(&other)),
        }
    }

    /// The server's handle on the link an `Attached` reply names.
    fn link(
        self: &Arc<Self>,
        reply: Reply,
        netns: NetNs,
        policy: NetPolicy,
    ) -> Result<Link, HelperError> {
        let Reply::Attached {
            link,
            index,
            gateway,
            ca,
        } = reply
        else {
            return Err(Self::unexpected(&reply));
        };
        Ok(Link {
            helper: self.clone(),
            link,
            index,
            netns,
            gateway,
            ca,
            policy: Mutex::new(policy),
            kept: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Gives back the recorded links of an earlier helper that no sandbox was linked to
    /// again; how many. Blocking.
    pub fn prune_links(&self) -> Result<u32, HelperError> {
        match self.call(&Request::PruneLinks, None)? {
            (Reply::Pruned(n), None) => Ok(n),
            (other, _) => Err(Self::unexpected(&other)),
        }
    }

    /// A TCP socket made in `ns`, not yet connected. Blocking (microseconds).
    pub fn socket(&self, ns: &NetNs, v6: bool) -> Result<OwnedFd, HelperError> {
        match self.call(&Request::Socket { v6 }, Some(ns.fd()))? {
            (Reply::Socket, Some(fd)) => Ok(fd),
            (other, _) => Err(Self::unexpected(&other)),
        }
    }

    /// A TCP connection made from inside `ns` to `addr` (non-blocking, for tokio).
    pub async fn tcp_connect(
        self: &Arc<Self>,
        ns: &NetNs,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<tokio::net::TcpStream> {
        let (helper, ns2) = (self.clone(), ns.clone());
        let fd = tokio::task::spawn_blocking(move || helper.socket(&ns2, addr.is_ipv6()))
            .await
            .map_err(std::io::Error::other)?
            .map_err(std::io::Error::other)?;
        let s = socket2::Socket::from(fd);
        s.set_tcp_nodelay(true)?;
        tokio::net::TcpSocket::from_std_stream(s.into())
            .connect(addr)
            .await
    }
}

/// A sandbox's link out, held by the server; dropping it removes the link.
#[derive(Debug)]
pub struct Link {
    helper: Arc<NetHelper>,
    link: u64,
    /// The router's index of the link (see [`NetHelper::reattach`]).
    index: u32,
    /// Left to the next helper when dropped ([`Link::keep`]): not detached.
    kept: std::sync::atomic::AtomicBool,
    /// The namespace the sandbox joins.
    pub netns: NetNs,
    gateway: Ipv4Addr,
    ca: Option<String>,
    policy: Mutex<NetPolicy>,
}

impl Link {
    /// The router's index of the link.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Leaves the link to the next helper: dropping it no longer detaches it (its sandbox
    /// outlives the server, and is linked again by [`NetHelper::reattach`]).
    pub fn keep(&self) {
        self.kept.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The sandbox's CA certificate (PEM), when it was attached with header rules.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca.as_deref()
    }

    /// The router's side of the link (the sandbox's gateway and name server).
    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// The policy in force.
    pub fn policy(&self) -> NetPolicy {
        self.policy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Changes the policy and header rules (empty: none) while the sandbox runs. Blocking
    /// (one `nft` run in the helper).
    pub fn set_policy(&self, policy: NetPolicy, rules: HeaderRules) -> Result<(), HelperError> {
        let req = Request::SetPolicy {
            link: self.link,
            policy: policy.clone().into(),
            rules,
        };
        match self.helper.call(&req, None)? {
            (Reply::Done, None) => {
                *self.policy.lock().unwrap_or_else(|p| p.into_inner()) = policy;
                Ok(())
            }
            (other, _) => Err(NetHelper::unexpected(&other)),
        }
    }

    /// The connections refused so far (`sync`: with what the kernel logged up to now).
    /// Blocking.
    pub fn denials(&self, sync: bool) -> Result<Vec<Denial>, HelperError> {
        let req = Request::Denials {
            link: self.link,
            sync,
        };
        match self.helper.call(&req, None)? {
            (Reply::Denials(all), None) => Ok(all.into_iter().map(Denial::from).collect()),
            (other, _) => Err(NetHelper::unexpected(&other)),
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        if self.kept.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        // A round trip: the helper answers at once and removes the rules in the background.
        if let Err(e) = self.helper.call(&Request::Detach { link: self.link }, None) {
            tracing::warn!(error = %e, "removing a sandbox's link");
        }
    }
}

/// The helper's reading of one request frame, for husk's fuzz targets (`fuzz/`). Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Decodes `datagram` as the helper does and handles it, with `fd` attached, as a helper
    /// without egress would (sockets only; every link unknown). Returns the request encoded
    /// again and the reply; `None` if it is not a request.
    pub fn request(datagram: &[u8], fd: Option<OwnedFd>) -> Option<(Vec<u8>, Reply)> {
        let req: Request = postcard::from_bytes(datagram).ok()?;
        let encoded = postcard::to_stdvec(&req).expect("a decoded request encodes");
        let helper = Helper {
            service: None,
            own: NetNs::current().into_iter().collect(),
            links: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        };
        let (reply, _socket) = helper.handle(req, fd);
        Some((encoded, reply))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{HostRule, SecretValue};
    use std::os::fd::AsRawFd;

    /// The helper's request handling without its process (a test cannot fork: it has
    /// threads) and without a router: egress off, sockets only.
    fn helper() -> Helper {
        Helper {
            service: None,
            own: vec![NetNs::current().unwrap()],
            links: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    fn failure(reply: (Reply, Option<OwnedFd>)) -> Failure {
        match reply {
            (Reply::Failed(f), None) => f,
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn sockets_are_made_in_the_namespace_passed_and_only_in_a_sandbox_one() {
        let h = helper();
        // A namespace of the test's own (a sandbox's stands for it): the socket is made there.
        let ns = NetNs::create().unwrap();
        let (reply, fd) = h.handle(
            Request::Socket { v6: false },
            Some(ns.fd().try_clone_to_owned().unwrap()),
        );
        assert_eq!(reply, Reply::Socket);
        let sock = socket2::Socket::from(fd.unwrap());
        // Its loopback is down in a new namespace: connecting there fails, where the host's
        // loopback would have answered (ENETUNREACH, not a connection to the host).
        let err = sock
            .connect(&std::net::SocketAddr::from(([127, 0, 0, 1], 9)).into())
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENETUNREACH), "{err}");

        // The helper's own namespace (the host's) is refused.
        let host = std::fs::File::open("/proc/self/ns/net").unwrap();
        let f = failure(h.handle(Request::Socket { v6: false }, Some(host.into())));
        assert_eq!(f.kind, FailureKind::InvalidSpec);
        assert!(f.message.contains("only in sandboxes' namespaces"), "{f}");
        // Anything that is not a network namespace is refused.
        let mnt = std::fs::File::open("/proc/self/ns/mnt").unwrap();
        let f = failure(h.handle(Request::Socket { v6: true }, Some(mnt.into())));
        assert!(f.message.contains("not a network namespace"), "{f}");
        let (r, _w) = husk_runtime::sys::pipe().unwrap();
        assert!(r.as_raw_fd() > 2);
        let f = failure(h.handle(Request::Socket { v6: false }, Some(r)));
        assert_eq!(f.kind, FailureKind::InvalidSpec);
        // No namespace at all.
        let f = failure(h.handle(Request::Socket { v6: false }, None));
        assert_eq!(f.kind, FailureKind::InvalidSpec);
    }

    #[test]
    fn links_are_named_only_by_what_the_helper_handed_out() {
        let h = helper();
        // Egress is off: no link can be had, and none can be named.
        let f = failure(h.handle(
            Request::Attach {
                policy: WirePolicy::None,
                rules: None,
            },
            None,
        ));
        assert_eq!(f.kind, FailureKind::Host);
        for req in [
            Request::Detach { link: 1 },
            Request::Denials {
                link: 1,
                sync: true,
            },
            Request::SetPolicy {
                link: 1,
                policy: WirePolicy::None,
                rules: HeaderRules::default(),
            },
        ] {
            assert_eq!(failure(h.handle(req, None)).kind, FailureKind::NotFound);
        }
        // A descriptor where none is taken is refused (and closed).
        let (r, _w) = husk_runtime::sys::pipe().unwrap();
        let f = failure(h.handle(Request::Detach { link: 1 }, Some(r)));
        assert_eq!(f.kind, FailureKind::InvalidSpec);
        // A policy that did not come from the parsers is checked.
        let bad = WirePolicy::Egress {
            allow: vec![Target::Domain("evil.com\"; flush ruleset".into())],
            deny: Vec::new(),
        };
        let f = failure(h.handle(
            Request::SetPolicy {
                link: 1,
                policy: bad,
                rules: HeaderRules::default(),
            },
            None,
        ));
        assert_eq!(f.kind, FailureKind::InvalidSpec);
        // So are rules: a header that would split the request, a host that is an address.
        for bad in [
            HostRule {
                host: "api.example.com".into(),
                headers: vec![("x".into(), SecretValue::new(b"a\r\nhost: evil".to_vec()))],
            },
            HostRule {
                host: "10.0.0.1".into(),
                headers: Vec::new(),
            },
        ] {
            let rules = HeaderRules { hosts: vec![bad] };
            let f = failure(h.handle(
                Request::SetPolicy {
                    link: 1,
                    policy: WirePolicy::None,
                    rules: rules.clone(),
                },
                None,
            ));
            assert_eq!(f.kind, FailureKind::InvalidSpec, "{f}");
            assert!(f.message.contains("invalid rules"), "{f}");
        }
    }

    #[test]
    fn policies_and_denials_cross_the_wire_whole() {
        let policy = NetPolicy::from_flags(&["allow=example.com,10.0.0.0/8".into()]).unwrap();
        let rules = HeaderRules {
            hosts: vec![HostRule {
                host: "*.example.com".into(),
                headers: vec![("authorization".into(), SecretValue::new(b"k".to_vec()))],
            }],
        };
        let bytes = postcard::to_stdvec(&Request::Attach {
            policy: policy.clone().into(),
            rules: Some(rules.clone()),
        })
        .unwrap();
        match postcard::from_bytes::<Request>(&bytes).unwrap() {
            Request::Attach {
                policy: p,
                rules: r,
            } => {
                assert_eq!(NetPolicy::from(p), policy);
                assert_eq!(r, Some(rules));
            }
            other => panic!("{other:?}"),
        }
        let d = Denial::now("tcp", "203.0.113.7".parse().unwrap(), 443, "policy");
        let bytes = postcard::to_stdvec(&WireDenial::from(d.clone())).unwrap();
        assert_eq!(
            Denial::from(postcard::from_bytes::<WireDenial>(&bytes).unwrap()),
            d
        );
    }
}
