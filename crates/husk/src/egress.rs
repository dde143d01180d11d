//! The flags that set up sandbox egress (`husk serve`), and starting it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use husk_net::router::{RouterConfig, Uplink, DEFAULT_SUBNET};
use husk_net::service::NetService;
use ipnet::Ipv4Net;

/// Where sandbox traffic goes out (`husk serve`, and `husk run --net`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct UplinkArgs {
    /// Where sandboxes' traffic goes out: `host` (through the host's own routing, masqueraded;
    /// see the README for what husk changes on the host), `off` (sandboxes get loopback only),
    /// or `netns:PATH` (a veth into the network namespace at PATH, with --egress-address and
    /// --egress-gateway) [default: host, or off with a warning when it cannot be set up]
    #[arg(long, value_name = "host|off|netns:PATH")]
    pub egress: Option<String>,
    /// With `--egress netns:PATH`: the router's address on that link (CIDR).
    #[arg(long, value_name = "CIDR")]
    pub egress_address: Option<Ipv4Net>,
    /// With `--egress netns:PATH`: the far end's address (gets it; the router's default route).
    #[arg(long, value_name = "IP")]
    pub egress_gateway: Option<Ipv4Addr>,
    /// A range no sandbox may reach, on top of the built-in ones (repeatable).
    #[arg(long = "net-deny", value_name = "CIDR")]
    pub net_deny: Vec<String>,
    /// Upstream name server of husk's resolver (repeatable) [default: the host's, from
    /// /etc/resolv.conf].
    #[arg(long = "net-dns", value_name = "IP[:PORT]")]
    pub net_dns: Vec<String>,
    /// The subnet sandbox links are cut from (a /31 each).
    #[arg(long, value_name = "CIDR", default_value = DEFAULT_SUBNET)]
    pub net_subnet: Ipv4Net,
}

/// `husk serve`'s network flags.
#[derive(clap::Args, Debug, Clone)]
pub struct EgressArgs {
    #[command(flatten)]
    pub uplink: UplinkArgs,
    /// The egress policy of sandboxes that ask for none: `internet`, `none`, `allow=LIST`,
    /// `deny=LIST` (repeatable, as `husk run --net`).
    #[arg(
        long = "net-default",
        value_name = "POLICY",
        default_value = "internet"
    )]
    pub net_default: Vec<String>,
    /// Sandbox network namespaces kept ready, so creating one with a network costs no more.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub net_pool: usize,
    /// A CA certificate file (PEM) trusted for the servers that sandboxes' header rules
    /// (`network.rules`) reach, besides the host's CA bundle: a corporate CA (repeatable).
    #[arg(long = "net-upstream-ca", value_name = "PEM")]
    pub net_upstream_ca: Vec<PathBuf>,
}

impl UplinkArgs {
    /// The router's configuration; `Ok(None)`: `--egress off`.
    pub fn config(&self, run_dir: PathBuf) -> Result<Option<RouterConfig>, String> {
        let uplink = match self.egress.as_deref().unwrap_or("host") {
            "off" => return Ok(None),
            "host" => Uplink::Host,
            other => match other.strip_prefix("netns:") {
                Some(path) => Uplink::Netns {
                    path: PathBuf::from(path),
                    address: self
                        .egress_address
                        .ok_or("--egress netns:PATH needs --egress-address")?,
                    gateway: self
                        .egress_gateway
                        .ok_or("--egress netns:PATH needs --egress-gateway")?,
                },
                None => {
                    return Err(format!(
                        "invalid --egress {other:?}: use host, off or netns:PATH"
                    ))
                }
            },
        };
        let mut dns = Vec::new();
        for d in &self.net_dns {
            let addr = d
                .parse::<SocketAddr>()
                .or_else(|_| d.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| format!("invalid --net-dns {d:?}: expected IP or IP:PORT"))?;
            dns.push(addr);
        }
        let mut cfg = RouterConfig::new(uplink);
        cfg.subnet = self.net_subnet;
        cfg.extra_denied = self.net_deny.clone();
        cfg.dns = dns;
        cfg.pool = 0;
        cfg.run_dir = run_dir;
        Ok(Some(cfg))
    }
}

impl EgressArgs {
    /// The default policy, or what is wrong with it.
    pub fn default_policy(&self) -> Result<husk_net::NetPolicy, String> {
        husk_net::NetPolicy::from_flags(&self.net_default).map_err(|e| e.to_string())
    }

    /// Starts egress as configured; `Ok(None)`: off. When egress was left at its default and
    /// cannot be set up, warns and goes on without it. Call inside the async runtime.
    pub fn start(&self, run_dir: PathBuf) -> Result<Option<NetService>, String> {
        let Some(mut cfg) = self.uplink.config(run_dir.clone())? else {
            // No router of its own, but what a crashed one left on the host goes all the same.
            husk_net::host_uplink::reap(&run_dir);
            return Ok(None);
        };
        cfg.pool = self.net_pool;
        cfg.upstream_ca = self.net_upstream_ca.clone();
        // A server's sandboxes outlive it: their links are recorded for the next one.
        cfg.links_dir = Some(run_dir.join("net/links"));
        match NetService::start(cfg) {
            Ok(s) => Ok(Some(s)),
            Err(e) if self.uplink.egress.is_none() => {
                eprintln!(
                    "husk: warning: sandbox egress is off: {e} (sandboxes get loopback only; \
                     pass --egress off to silence this, or fix the cause: nftables and \
                     iproute2 must be installed; `husk doctor` tells what is missing)"
                );
                Ok(None)
            }
            Err(e) => Err(format!("sandbox egress: {e}")),
        }
    }
}
