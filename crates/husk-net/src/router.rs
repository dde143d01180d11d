//! husk's router: a network namespace of its own (held by descriptors only, so it disappears
//! with the husk process that made it, crash or not), with
//! - the uplink `up0`: a veth to the host (NATed there, see [`crate::host_uplink`]) or to a
//!   namespace standing for the internet (tests);
//! - one veth per sandbox (`sb<N>` here, `eth0` in the sandbox, a /31 each);
//! - the nftables table of [`crate::nft`] enforcing the always-denied ranges and each
//!   sandbox's policy, and masquerading sandboxes onto the uplink.
//!
//! Sandbox namespaces are prepared ahead (a pool, refilled by a background thread), so that
//! creating a sandbox with a network costs no more than one without.
//!
//! A server's router (`RouterConfig::links_dir`) keeps a record of each link it hands out
//! (its index, and the sandbox's CA if it has one), removed when the link is detached. A
//! sandbox that outlives the server keeps its namespace but loses its link with the router's
//! namespace; the next router reserves the recorded links at start, and
//! [`Router::reattach`] links the sandbox's namespace again, at the same addresses, with the
//! same CA, under the policy it had. What no sandbox claims is given back
//! ([`Router::prune_orphans`]).

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;

use ipnet::{IpNet, Ipv4Net};

use crate::addressing::Links;
use crate::ca::{CaError, SandboxCa};
use crate::cmd;
use crate::netns::NetNs;
use crate::nft::{self, Installed};
use crate::policy::NetPolicy;
use crate::rules::HeaderRules;
use crate::sandboxes::{NoCa, SandboxNet, Sandboxes};
use husk_runtime::modules::Module;

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("no free sandbox link: all {0} addresses of the sandbox subnet are in use")]
    Exhausted(u32),
    #[error("the router has stopped")]
    Stopped,
    #[error("the sandbox's CA: {0}")]
    Ca(#[source] CaError),
    #[error(transparent)]
    Rules(NoCa),
}

fn ctx(what: impl Into<String>) -> impl FnOnce(io::Error) -> RouterError {
    let what = what.into();
    move |source| RouterError::Io { what, source }
}

/// Where the router's traffic goes out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Uplink {
    /// The host's own routing: a veth into the host's namespace, masqueraded there.
    Host,
    /// A veth into the namespace at `path` (a simulated internet): the far end gets
    /// `gateway`, the router `address` (same prefix); the router routes everything there.
    Netns {
        path: PathBuf,
        address: Ipv4Net,
        gateway: Ipv4Addr,
    },
}

#[derive(Debug, Clone)]
pub struct RouterConfig {
    pub uplink: Uplink,
    /// Cut into /31s, one per sandbox link. Always denied to sandboxes (so they cannot reach
    /// each other).
    pub subnet: Ipv4Net,
    /// The operator's additions to the always-denied ranges.
    pub extra_denied: Vec<String>,
    /// Upstream name servers of husk's resolver (empty: the host's, from /etc/resolv.conf).
    pub dns: Vec<SocketAddr>,
    /// Sandbox namespaces kept ready by a background thread (0: no thread; each link is made
    /// when asked for).
    pub pool: usize,
    /// Where host-side records live (for clean-up after a crash): `<run_dir>/net`.
    pub run_dir: PathBuf,
    /// PEM files of CAs the domain proxy trusts, besides the host's, for the servers it
    /// reaches on behalf of header rules (a corporate CA; a test's).
    pub upstream_ca: Vec<PathBuf>,
    /// Where each link's record is kept (see the module's documentation), so that the next
    /// router takes up the links of sandboxes that outlived this one (`husk serve`); `None`:
    /// links end with the router (`husk run`).
    pub links_dir: Option<PathBuf>,
}

impl RouterConfig {
    pub fn new(uplink: Uplink) -> RouterConfig {
        RouterConfig {
            uplink,
            subnet: DEFAULT_SUBNET.parse().expect("literal subnet"),
            extra_denied: Vec::new(),
            dns: Vec::new(),
            pool: 4,
            run_dir: PathBuf::from("/run/husk"),
            upstream_ca: Vec::new(),
            links_dir: None,
        }
    }
}

/// The default sandbox subnet (shared address space: never on the internet, and inside the
/// always-denied 100.64.0.0/10).
pub const DEFAULT_SUBNET: &str = "100.96.0.0/16";
/// Where the resolver listens on the router (sandbox DNS to any address is redirected here).
pub const RESOLVER_PORT: u16 = 53;
/// Where the domain proxy listens on the router.
pub const PROXY_PORT: u16 = 15001;

/// A sandbox namespace with its link configured, not yet handed out.
#[derive(Debug)]
struct Prepared {
    index: u32,
    ns: NetNs,
}

#[derive(Debug)]
struct Release {
    index: u32,
    installed: Installed,
}

#[derive(Debug, Default)]
struct Work {
    ready: VecDeque<Prepared>,
    releases: Vec<Release>,
    stop: bool,
}

#[derive(Debug)]
struct Inner {
    ns: NetNs,
    cfg: RouterConfig,
    denied: Arc<Vec<IpNet>>,
    sandboxes: Arc<Sandboxes>,
    links: Mutex<Links>,
    work: Mutex<Work>,
    wake: Condvar,
    host: Mutex<Option<crate::host_uplink::HostUplink>>,
    /// Where the resolver's and the proxy's own connections are made (None: the caller's).
    egress: Option<NetNs>,
    /// Whether a pool thread runs (`pool > 0`); without one, links are made and removed by
    /// the caller, and the router starts no thread at all (`husk run` forks after it).
    background: bool,
    /// Links an earlier router recorded, reserved until a sandbox claims them or they are
    /// pruned: index → the sandbox's CA (certificate and key, PEM), if it had one.
    orphans: Mutex<std::collections::HashMap<u32, Option<LinkRecord>>>,
}

/// What a link's record holds beyond its index (the file's name).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
struct LinkRecord {
    ca_cert: String,
    ca_key: String,
}

/// husk's router. Dropping it (or [`Router::shutdown`]) removes what it made.
#[derive(Debug)]
pub struct Router {
    inner: Arc<Inner>,
    pool_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Router {
    /// Builds the router namespace, its uplink and rules, and starts filling the pool.
    /// Blocking (tens of milliseconds).
    pub fn start(cfg: RouterConfig) -> Result<Router, RouterError> {
        // Distribution kernels have veth and nf_tables as modules: load them first, as other
        // container runtimes do (best effort: a kernel with them built in may show no trace
        // of them, and using them below reports what is really missing).
        for m in [Module::NfTables, Module::Veth] {
            let _ = husk_runtime::modules::ensure(m);
        }
        let mut denied =
            crate::denied::always_denied(&cfg.extra_denied).map_err(RouterError::Config)?;
        denied.push(IpNet::V4(cfg.subnet.trunc()));
        // The host's own addresses (on every interface of its namespace).
        denied.extend(host_addresses().map_err(ctx("list the host's addresses"))?);
        let ns = NetNs::create().map_err(ctx("create the router namespace"))?;
        for (key, value) in [
            ("net/ipv4/ip_forward", "1"),
            ("net/ipv4/conf/all/rp_filter", "1"),
            ("net/ipv4/conf/default/rp_filter", "1"),
            ("net/ipv6/conf/all/disable_ipv6", "1"),
            ("net/ipv6/conf/default/disable_ipv6", "1"),
        ] {
            cmd::sysctl(Some(&ns), key, value).map_err(ctx("set up the router namespace"))?;
        }
        cmd::ip(Some(&ns), "link set lo up\n").map_err(ctx("set up the router namespace"))?;
        let (host, egress) = match &cfg.uplink {
            Uplink::Host => {
                let h = crate::host_uplink::HostUplink::attach(&ns, &cfg.run_dir)
                    .map_err(ctx("connect the router to the host"))?;
                denied.push(IpNet::V4(h.transit()));
                (Some(h), None)
            }
            Uplink::Netns {
                path,
                address,
                gateway,
            } => {
                let far = NetNs::open(path).map_err(ctx(format!("open {}", path.display())))?;
                // Named per router: several routers may share one uplink namespace (husk run
                // after husk run: a finished router's link goes only when the kernel has
                // dismantled its namespace, shortly after).
                let mut tag = [0u8; 3];
                getrandom::fill(&mut tag).map_err(|e| RouterError::Config(e.to_string()))?;
                let far_name = format!("husk-{:02x}{:02x}{:02x}", tag[0], tag[1], tag[2]);
                connect_uplink(&ns, &far, &far_name, *address, *gateway)
                    .map_err(ctx("connect the router to the uplink namespace"))?;
                // The uplink's own network (its gateway, whatever else is on it) is the
                // operator's, never a sandbox's destination: as the host's transit net is.
                denied.push(IpNet::V4(address.trunc()));
                (None, Some(ns.clone()))
            }
        };
        cmd::nft(
            Some(&ns),
            &nft::base_table(&denied, RESOLVER_PORT, PROXY_PORT),
        )
        .map_err(ctx("load the router's nftables rules"))?;
        let cfg_pool = cfg.pool;
        // Before the pool takes any index: those of recorded links stay reserved.
        let mut links = Links::new(cfg.subnet);
        let orphans = match &cfg.links_dir {
            Some(dir) => read_records(dir, &mut links).map_err(ctx("read the links' records"))?,
            None => Default::default(),
        };
        let inner = Arc::new(Inner {
            links: Mutex::new(links),
            orphans: Mutex::new(orphans),
            ns,
            cfg,
            denied: Arc::new(denied),
            sandboxes: Arc::default(),
            work: Mutex::default(),
            wake: Condvar::new(),
            host: Mutex::new(host),
            egress,
            background: cfg_pool > 0,
        });
        let pool_thread = if inner.background {
            let weak = Arc::downgrade(&inner);
            Some(
                std::thread::Builder::new()
                    .name("husk-net-pool".into())
                    .spawn(move || pool_loop(weak))
                    .map_err(ctx("start the pool thread"))?,
            )
        } else {
            None
        };
        Ok(Router {
            inner,
            pool_thread: Mutex::new(pool_thread),
        })
    }

    /// The router's namespace (for its listeners: resolver, proxy, denial log).
    pub fn namespace(&self) -> &NetNs {
        &self.inner.ns
    }

    /// Where the resolver's and the proxy's outgoing connections must be made (None: the
    /// caller's namespace, i.e. the host's).
    pub fn egress(&self) -> Option<&NetNs> {
        self.inner.egress.as_ref()
    }

    /// The ranges no sandbox reaches: built-in, the operator's, the host's addresses, the
    /// sandbox subnet and the uplink's network.
    pub fn denied(&self) -> Arc<Vec<IpNet>> {
        self.inner.denied.clone()
    }

    pub fn sandboxes(&self) -> Arc<Sandboxes> {
        self.inner.sandboxes.clone()
    }

    pub fn config(&self) -> &RouterConfig {
        &self.inner.cfg
    }

    /// A namespace with a link out under `policy`, for a new sandbox (taken from the pool when
    /// one is ready). With `rules` (even empty), the sandbox gets a CA of its own
    /// ([`Attachment::ca_pem`]) and its HTTP and TLS to the rules' hosts go through the
    /// domain proxy. Blocking.
    pub fn attach(
        &self,
        policy: NetPolicy,
        rules: Option<HeaderRules>,
    ) -> Result<Attachment, RouterError> {
        // Made before a link is taken: a failure here costs nothing to undo.
        let ca = match &rules {
            Some(_) => Some(SandboxCa::new("sandbox").map_err(RouterError::Ca)?),
            None => None,
        };
        let ready = {
            let mut w = self.inner.work.lock().unwrap_or_else(|p| p.into_inner());
            if w.stop {
                return Err(RouterError::Stopped);
            }
            w.ready.pop_front()
        };
        self.inner.wake.notify_all();
        let prepared = match ready {
            Some(p) => p,
            None => self.inner.prepare()?,
        };
        let (gateway, address) = self.inner.links().addresses(prepared.index);
        let intercept = rules.as_ref().is_some_and(|r| !r.is_empty());
        let (script, installed) =
            nft::apply(prepared.index, Installed::default(), &policy, intercept);
        let recorded = self.inner.write_record(prepared.index, ca.as_ref());
        let applied = recorded.and_then(|()| match script.is_empty() {
            true => Ok(()),
            false => cmd::nft(Some(&self.inner.ns), &script),
        });
        if let Err(e) = applied {
            self.inner.release(Release {
                index: prepared.index,
                installed: Installed::default(),
            });
            self.inner.remove_record(prepared.index);
            return Err(ctx("apply the sandbox's network policy")(e));
        }
        let mut net = SandboxNet::new(address, gateway, policy);
        if let Some(ca) = ca {
            net = net.with_ca(ca);
        }
        if let Some(r) = rules {
            // The CA is there: this cannot fail.
            let _ = net.set_rules(r);
        }
        let net = Arc::new(net);
        self.inner.sandboxes.insert(net.clone());
        Ok(Attachment {
            netns: prepared.ns,
            net,
            index: prepared.index,
            installed: Mutex::new(installed),
            router: Arc::downgrade(&self.inner),
            detached: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Links the namespace `ns` of a sandbox that outlived the router it was attached to
    /// (its link `index`, recorded by that router) again: the same addresses, the CA it had,
    /// `policy` and `rules`. Blocking.
    pub fn reattach(
        &self,
        ns: NetNs,
        index: u32,
        policy: NetPolicy,
        rules: Option<HeaderRules>,
    ) -> Result<Attachment, RouterError> {
        let orphan = self
            .inner
            .orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&index);
        let Some(record) = orphan else {
            return Err(RouterError::Config(format!(
                "no recorded link {index} to take up"
            )));
        };
        let ca = record
            .as_ref()
            .map(|r| SandboxCa::restore("sandbox", &r.ca_cert, &r.ca_key).map_err(RouterError::Ca));
        let done = (|| {
            let ca = ca.transpose()?;
            let (gateway, address) = self.inner.links().addresses(index);
            self.inner
                .link(&ns, index)
                .map_err(ctx("link the sandbox to the router again"))?;
            let intercept = rules.as_ref().is_some_and(|r| !r.is_empty());
            let (script, installed) = nft::apply(index, Installed::default(), &policy, intercept);
            if !script.is_empty() {
                cmd::nft(Some(&self.inner.ns), &script)
                    .map_err(ctx("apply the sandbox's network policy"))?;
            }
            let mut net = SandboxNet::new(address, gateway, policy);
            if let Some(ca) = ca {
                net = net.with_ca(ca);
            }
            if let Some(r) = rules {
                net.set_rules(r).map_err(RouterError::Rules)?;
            }
            let net = Arc::new(net);
            self.inner.sandboxes.insert(net.clone());
            Ok(Attachment {
                netns: ns,
                net,
                index,
                installed: Mutex::new(installed),
                router: Arc::downgrade(&self.inner),
                detached: std::sync::atomic::AtomicBool::new(false),
            })
        })();
        if done.is_err() {
            // Not linked: as no sandbox's (the record goes, the index comes back).
            self.inner.remove_record(index);
            self.inner.release(Release {
                index,
                installed: Installed::default(),
            });
        }
        done
    }

    /// Gives back the recorded links no sandbox claimed (their sandboxes are gone). Returns
    /// how many.
    pub fn prune_orphans(&self) -> usize {
        let orphans: Vec<u32> = self
            .inner
            .orphans
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(i, _)| i)
            .collect();
        for &index in &orphans {
            self.inner.remove_record(index);
            self.inner.release(Release {
                index,
                installed: Installed::default(),
            });
        }
        orphans.len()
    }

    /// Stops the pool and removes everything the router made on the host. The namespace itself
    /// (and every link in it) goes when the last descriptor of it closes.
    pub fn shutdown(&self) {
        {
            let mut w = self.inner.work.lock().unwrap_or_else(|p| p.into_inner());
            w.stop = true;
        }
        self.inner.wake.notify_all();
        if let Some(t) = self
            .pool_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = t.join();
        }
        let ready: Vec<Prepared> = {
            let mut w = self.inner.work.lock().unwrap_or_else(|p| p.into_inner());
            w.ready.drain(..).collect()
        };
        for p in ready {
            self.inner.release(Release {
                index: p.index,
                installed: Installed::default(),
            });
        }
        if let Some(h) = self
            .inner
            .host
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            h.detach();
        }
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn links(&self) -> std::sync::MutexGuard<'_, Links> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new sandbox namespace with its link up: `eth0` there, `sb<N>` here.
    fn prepare(&self) -> Result<Prepared, RouterError> {
        let index = {
            let mut l = self.links();
            l.take().ok_or(RouterError::Exhausted(l.capacity()))?
        };
        let made = (|| -> io::Result<NetNs> {
            let ns = NetNs::create()?;
            // No IPv6 on the link (the router speaks IPv4 only); loopback keeps ::1.
            cmd::sysctl(Some(&ns), "net/ipv6/conf/default/disable_ipv6", "1")?;
            self.link(&ns, index)?;
            Ok(ns)
        })();
        match made {
            Ok(ns) => Ok(Prepared { index, ns }),
            Err(e) => {
                self.release(Release {
                    index,
                    installed: Installed::default(),
                });
                Err(ctx("prepare a sandbox link")(e))
            }
        }
    }

    /// Link `index` between the router and the sandbox namespace `ns`: `sb<N>` here, `eth0`
    /// there, with the link's addresses and the sandbox's default route.
    fn link(&self, ns: &NetNs, index: u32) -> io::Result<()> {
        let (gateway, address) = self.links().addresses(index);
        let link = nft::link_name(index);
        let script = format!(
            "link add {link} type veth peer name eth0 netns {}\n\
             addr add {gateway}/31 dev {link}\n\
             link set {link} up\n",
            fd_path(ns)
        );
        // `File exists`: a released link whose namespace is still held somewhere (see
        // release), or, taking a sandbox up again, the `eth0` of its old link while the kernel
        // dismantles the earlier router's namespace: wait for it, within a bound.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match cmd::ip(Some(&self.ns), &script) {
                Ok(()) => break,
                Err(e)
                    if e.to_string().contains("File exists")
                        && std::time::Instant::now() < deadline =>
                {
                    let _ = cmd::ip(Some(&self.ns), &format!("link del {link}\n"));
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => return Err(e),
            }
        }
        cmd::ip(
            Some(ns),
            &format!(
                "link set lo up\n\
                 addr add {address}/31 dev eth0\n\
                 link set eth0 up\n\
                 route add default via {gateway} dev eth0\n"
            ),
        )
    }

    /// Records link `index` (with the sandbox's CA) for the next router, when this one keeps
    /// records: written whole (a temporary file renamed), root's alone.
    fn write_record(&self, index: u32, ca: Option<&SandboxCa>) -> io::Result<()> {
        let Some(dir) = &self.cfg.links_dir else {
            return Ok(());
        };
        let record = ca.map(|ca| LinkRecord {
            ca_cert: ca.pem().to_owned(),
            ca_key: ca.key_pem(),
        });
        let bytes = postcard::to_stdvec(&record).map_err(io::Error::other)?;
        let tmp = dir.join(format!(".{index}.tmp"));
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&bytes)?;
        }
        std::fs::rename(&tmp, dir.join(index.to_string()))
    }

    /// Forgets link `index`'s record.
    fn remove_record(&self, index: u32) {
        if let Some(dir) = &self.cfg.links_dir {
            let _ = std::fs::remove_file(dir.join(index.to_string()));
        }
    }

    /// Removes a link, its rules and its address's use.
    fn release(&self, r: Release) {
        let (_, address) = self.links().addresses(r.index);
        self.sandboxes.remove(address);
        let script = nft::remove(r.index, r.installed);
        if !script.is_empty() {
            if let Err(e) = cmd::nft(Some(&self.ns), &script) {
                tracing::warn!("remove the rules of sandbox link {}: {e}", r.index);
            }
        }
        // The link itself goes with the sandbox's namespace (a veth pair dies with either
        // end's namespace): no `ip link del` here, which would double the pool thread's work.
        // Should the namespace outlive its sandbox (a descriptor still open somewhere) until
        // the index comes round again, `prepare` removes the stale link then.
        self.links().give_back(r.index);
    }
}

/// The background thread: removes released links and keeps `pool` namespaces ready.
fn pool_loop(inner: Weak<Inner>) {
    let mut failures = 0u32;
    loop {
        let Some(me) = inner.upgrade() else { return };
        let (releases, refill) = {
            let mut w = me.work.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if w.stop {
                    return;
                }
                let need = w.ready.len() < me.cfg.pool && failures < 3;
                if need || !w.releases.is_empty() {
                    break;
                }
                let (g, _) = me
                    .wake
                    .wait_timeout(w, std::time::Duration::from_secs(5))
                    .unwrap_or_else(|p| p.into_inner());
                w = g;
                failures = 0;
            }
            (std::mem::take(&mut w.releases), w.ready.len() < me.cfg.pool)
        };
        for r in releases {
            me.release(r);
        }
        if refill && failures < 3 {
            match me.prepare() {
                Ok(p) => {
                    failures = 0;
                    let mut w = me.work.lock().unwrap_or_else(|p| p.into_inner());
                    if w.stop {
                        drop(w);
                        me.release(Release {
                            index: p.index,
                            installed: Installed::default(),
                        });
                        return;
                    }
                    w.ready.push_back(p);
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!("prepare a sandbox link for the pool: {e}");
                }
            }
        }
    }
}

/// A sandbox's link out. Its namespace is what the sandbox joins; dropping it removes the link
/// and the sandbox's rules.
#[derive(Debug)]
pub struct Attachment {
    pub netns: NetNs,
    pub net: Arc<SandboxNet>,
    index: u32,
    installed: Mutex<Installed>,
    router: Weak<Inner>,
    /// Detached for good ([`Attachment::detach`]): its record goes with it. Otherwise (the
    /// router stopping) the record stays for the next router.
    detached: std::sync::atomic::AtomicBool,
}

impl Attachment {
    /// Changes the policy and the header rules (empty: none) while the sandbox runs. Rules
    /// need the CA the sandbox got at creation. Blocking (one `nft` run).
    pub fn set_policy(&self, policy: NetPolicy, rules: HeaderRules) -> Result<(), RouterError> {
        let router = self.router.upgrade().ok_or(RouterError::Stopped)?;
        if self.net.ca().is_none() && !rules.is_empty() {
            return Err(RouterError::Rules(NoCa));
        }
        let mut installed = self.installed.lock().unwrap_or_else(|p| p.into_inner());
        let (script, next) = nft::apply(self.index, *installed, &policy, !rules.is_empty());
        if !script.is_empty() {
            cmd::nft(Some(&router.ns), &script)
                .map_err(ctx("change the sandbox's network policy"))?;
        }
        *installed = next;
        self.net.set_policy(policy);
        self.net.set_rules(rules).map_err(RouterError::Rules)?;
        Ok(())
    }

    /// The link's index (what [`Router::reattach`] takes it up again by).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Marks the link as ended for good: when it is dropped, its record goes too.
    pub fn detach(&self) {
        self.detached
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The sandbox's CA certificate (PEM), when it was created with header rules.
    pub fn ca_pem(&self) -> Option<String> {
        self.net.ca().map(|c| c.pem().to_owned())
    }

    /// The router's side of the link (the sandbox's gateway and name server).
    pub fn gateway(&self) -> Ipv4Addr {
        self.net.gateway
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let Some(router) = self.router.upgrade() else {
            return;
        };
        // Stop serving it at once; the link and rules go in the background.
        router.sandboxes.remove(self.net.address);
        if self.detached.load(std::sync::atomic::Ordering::Relaxed) {
            router.remove_record(self.index);
        }
        let installed = *self.installed.lock().unwrap_or_else(|p| p.into_inner());
        let release = Release {
            index: self.index,
            installed,
        };
        if !router.background {
            router.release(release);
            return;
        }
        let mut w = router.work.lock().unwrap_or_else(|p| p.into_inner());
        w.releases.push(release);
        drop(w);
        router.wake.notify_all();
    }
}

/// Reads the links' records in `dir` (made root's alone if new): each recorded index is
/// reserved in `links`. A record that cannot be read is a link with no CA; a file that names
/// no index of the subnet is removed.
fn read_records(
    dir: &std::path::Path,
    links: &mut Links,
) -> io::Result<std::collections::HashMap<u32, Option<LinkRecord>>> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    let mut out = std::collections::HashMap::new();
    for entry in std::fs::read_dir(dir)?.flatten() {
        let name = entry.file_name();
        let index = name
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            .filter(|&i| i < links.capacity() && links.reserve(i));
        let Some(index) = index else {
            let _ = std::fs::remove_file(entry.path());
            continue;
        };
        let record = std::fs::read(entry.path())
            .ok()
            .and_then(|b| postcard::from_bytes::<Option<LinkRecord>>(&b).ok())
            .flatten();
        out.insert(index, record);
    }
    Ok(out)
}

/// A path through which a child process opens `ns` (an `ip … netns PATH` argument).
fn fd_path(ns: &NetNs) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), ns.fd().as_raw_fd())
}

/// A veth from the router (`up0`, `address`, default route via `gateway`) into `far`
/// (`far_name`, `gateway`).
pub(crate) fn connect_uplink(
    router: &NetNs,
    far: &NetNs,
    far_name: &str,
    address: Ipv4Net,
    gateway: Ipv4Addr,
) -> io::Result<()> {
    let up = nft::UPLINK;
    let script = format!(
        "link add {up} type veth peer name {far_name} netns {}\n\
         addr add {address} dev {up}\n\
         link set {up} up\n\
         route add default via {gateway} dev {up}\n",
        fd_path(far)
    );
    // A link of the same name can be on its way out (an earlier instance's, in a namespace the
    // kernel is still dismantling): wait for it, within a bound.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        match cmd::ip(Some(router), &script) {
            Ok(()) => break,
            Err(e)
                if e.to_string().contains("File exists")
                    && std::time::Instant::now() < deadline =>
            {
                let _ = cmd::ip(Some(router), &format!("link del {up}\n"));
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
    let prefix = address.prefix_len();
    cmd::ip(
        Some(far),
        &format!(
            "addr add {gateway}/{prefix} dev {far_name}\n\
             link set {far_name} up\n"
        ),
    )
}

/// Every address of the host's namespace (the caller's), as /32 and /128 nets.
fn host_addresses() -> io::Result<Vec<IpNet>> {
    let out = cmd::output(None, "ip", &["-o", "addr", "show"])?;
    let mut nets = Vec::new();
    for line in out.lines() {
        // "2: eth0    inet 192.0.2.2/24 brd … scope global eth0"
        let mut words = line.split_whitespace();
        while let Some(w) = words.next() {
            if w == "inet" || w == "inet6" {
                if let Some(addr) = words.next().and_then(|a| a.split('/').next()) {
                    if let Ok(ip) = addr.parse::<IpAddr>() {
                        nets.push(IpNet::from(ip));
                    }
                }
            }
        }
    }
    Ok(nets)
}
