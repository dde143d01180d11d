//! `husk bench`'s network figures, on a simulated internet (a network namespace of the
//! benchmark's own with a server in it; no packet leaves this machine's namespaces):
//!
//! - create → ready of an idle sandbox with a link out (taken from links prepared in advance,
//!   as the server's pool does) against one without, interleaved; and what preparing a link
//!   costs (the pool's background work);
//! - connection set-up, round-trip latency and download throughput to the simulated internet
//!   from three places: a namespace with a plain veth into it (direct, the peer), a sandbox
//!   link through husk's router (nftables + NAT), and a sandbox whose policy names a domain
//!   (its HTTP goes through husk's domain proxy);
//! - HTTPS through the domain proxy, passed through and with a header rule
//!   ([`crate::bench_rules`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use husk_net::netns::NetNs;
use husk_net::router::{Router, RouterConfig, Uplink};
use husk_net::service::NetService;
use husk_net::{cmd, NetPolicy, Target};
use husk_runtime::{NetworkMode, SandboxSpec, Spawner};

use crate::bench::{chain, percentile, stats};

const SERVER: &str = "198.51.100.10";
/// Bytes of each download.
const DOWNLOAD: usize = 256 << 20;
const ROUND_TRIPS: usize = 2000;
const CONNECTS: usize = 200;

/// The simulated internet: a namespace with a server at [`SERVER`]:80 that reads a request
/// head, then for `GET /bulk` sends [`DOWNLOAD`] bytes and closes, for `GET /echo` echoes
/// every byte back.
struct Internet {
    ns: NetNs,
}

impl Internet {
    fn start() -> Result<Internet, String> {
        let ns = NetNs::create().map_err(chain)?;
        cmd::ip(
            Some(&ns),
            &format!("link set lo up\naddr add {SERVER}/32 dev lo\n"),
        )
        .map_err(chain)?;
        Ok(Internet { ns })
    }

    /// Starts the server (a thread: only once this process forks no more sandboxes).
    fn serve(&self) -> Result<(), String> {
        let at: SocketAddr = format!("{SERVER}:80").parse().expect("literal address");
        let l = self.ns.run(|| TcpListener::bind(at)).map_err(chain)?;
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                std::thread::spawn(move || serve(c));
            }
        });
        Ok(())
    }

    fn path(&self) -> std::path::PathBuf {
        format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.ns.fd().as_raw_fd()
        )
        .into()
    }
}

fn serve(mut c: TcpStream) {
    let _ = c.set_nodelay(true);
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 4096 {
        match c.read(&mut b) {
            Ok(1) => head.push(b[0]),
            _ => return,
        }
    }
    if head.starts_with(b"GET /bulk") {
        let chunk = vec![0x5au8; 1 << 20];
        for _ in 0..DOWNLOAD / chunk.len() {
            if c.write_all(&chunk).is_err() {
                return;
            }
        }
    } else {
        let mut buf = [0u8; 64];
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 || c.write_all(&buf[..n]).is_err() {
                return;
            }
        }
    }
}

/// A namespace with a plain veth into the internet: the direct path.
fn direct(internet: &Internet) -> Result<NetNs, String> {
    let ns = NetNs::create().map_err(chain)?;
    let fd = format!("/proc/{}/fd/{}", std::process::id(), ns.fd().as_raw_fd());
    cmd::ip(
        Some(&internet.ns),
        &format!(
            "link add direct0 type veth peer name eth0 netns {fd}\n\
             addr add 10.99.0.1/30 dev direct0\nlink set direct0 up\n"
        ),
    )
    .map_err(chain)?;
    cmd::ip(
        Some(&ns),
        "link set lo up\naddr add 10.99.0.2/30 dev eth0\nlink set eth0 up\n\
         route add default via 10.99.0.1\n",
    )
    .map_err(chain)?;
    Ok(ns)
}

fn connect(ns: &NetNs) -> Result<TcpStream, String> {
    connect_to(ns, format!("{SERVER}:80").parse().expect("literal address"))
}

/// A TCP connection from `ns` to `at` (no delay; reads time out after 30 s).
pub(crate) fn connect_to(ns: &NetNs, at: SocketAddr) -> Result<TcpStream, String> {
    let s = ns
        .run(|| TcpStream::connect_timeout(&at, Duration::from_secs(5)))
        .map_err(|e| format!("connect to the simulated internet: {e}"))?;
    s.set_nodelay(true).map_err(chain)?;
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(chain)?;
    Ok(s)
}

/// Connect + request + first byte back, `CONNECTS` times (ms).
fn setup_times(ns: &NetNs) -> Result<Vec<f64>, String> {
    let mut v = Vec::with_capacity(CONNECTS);
    for _ in 0..CONNECTS {
        let t = Instant::now();
        let mut s = connect(ns)?;
        s.write_all(b"GET /echo HTTP/1.1\r\nHost: bench\r\n\r\nx")
            .map_err(chain)?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).map_err(chain)?;
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(v)
}

/// One-byte round trips on one connection (µs).
fn round_trips(ns: &NetNs) -> Result<Vec<f64>, String> {
    let mut s = connect(ns)?;
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: bench\r\n\r\n")
        .map_err(chain)?;
    let mut v = Vec::with_capacity(ROUND_TRIPS);
    let mut b = [0u8; 1];
    for _ in 0..ROUND_TRIPS {
        let t = Instant::now();
        s.write_all(b"x").map_err(chain)?;
        s.read_exact(&mut b).map_err(chain)?;
        v.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(v)
}

/// Download throughput of one connection (MB/s).
fn download(ns: &NetNs) -> Result<f64, String> {
    let mut s = connect(ns)?;
    let t = Instant::now();
    s.write_all(b"GET /bulk HTTP/1.1\r\nHost: bench\r\n\r\n")
        .map_err(chain)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(format!("download: {e}")),
        }
    }
    if got != DOWNLOAD {
        return Err(format!("download: got {got} of {DOWNLOAD} bytes"));
    }
    Ok(got as f64 / t.elapsed().as_secs_f64() / 1e6)
}

/// The first path measured (the peer), which the next ones are compared with.
#[derive(Default)]
struct Peer(Option<(f64, f64, f64)>);

impl Peer {
    /// The set-up p50, the p50 and p99 of `each` (µs per `what`), and how they and `mbps`
    /// compare with the peer's (empty for the peer itself, which this records).
    fn figures(
        &mut self,
        setup: &mut [f64],
        each: &mut [f64],
        mbps: f64,
        what: &str,
        digits: usize,
    ) -> (f64, f64, f64, String) {
        let (s50, r50, r99) = (
            percentile_us(setup, 0.5),
            percentile_us(each, 0.5),
            percentile_us(each, 0.99),
        );
        let vs = match self.0 {
            Some((bs, br, bt)) => format!(
                "  (x{:.2} set-up, +{:.digits$} µs {what}, {:.0}% throughput)",
                s50 / bs,
                r50 - br,
                mbps / bt * 100.0
            ),
            None => {
                self.0 = Some((s50, r50, mbps));
                String::new()
            }
        };
        (s50, r50, r99, vs)
    }
}

fn percentile_us(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    percentile(v, p)
}

/// Runs the network figures (skipped, with a note, when `ip` or `nft` is missing).
pub fn run(runs: usize) -> Result<(), String> {
    println!("network (on a simulated internet in a namespace of the benchmark's own):");
    for tool in ["ip", "nft"] {
        if cmd::output(None, tool, &["--version"]).is_err()
            && cmd::output(None, tool, &["-V"]).is_err()
        {
            println!("  skipped: `{tool}` is not installed (apt-get install iproute2 nftables)");
            return Ok(());
        }
    }
    let internet = Internet::start()?;
    let upstream = crate::bench_rules::Upstream::bind(&internet.ns, SERVER)?;
    let mut cfg = RouterConfig::new(Uplink::Netns {
        path: internet.path(),
        address: "203.0.113.2/24".parse().expect("literal CIDR"),
        gateway: "203.0.113.1".parse().expect("literal address"),
    });
    // No pool thread: the spawner below forks in this process, which must not have threads
    // then. Links are prepared in advance here instead, as the server's pool does.
    cfg.pool = 0;
    cfg.run_dir = std::env::temp_dir().join(format!("husk-bench-net-{}", std::process::id()));
    cfg.dns = vec![upstream.dns_addr()?];
    cfg.upstream_ca = vec![upstream.ca_file.clone()];
    let router = Router::start(cfg).map_err(chain)?;

    // Create → ready, with a prepared link and without, interleaved.
    let mut prepare = Vec::with_capacity(runs);
    let mut links = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        links.push(router.attach(NetPolicy::internet(), None).map_err(chain)?);
        prepare.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let spawner = Spawner::new().map_err(chain)?;
    let devnull = std::fs::File::open("/dev/null").map_err(chain)?;
    let stdio = Some([devnull.as_fd(), devnull.as_fd(), devnull.as_fd()]);
    let (mut plain, mut linked) = (Vec::new(), Vec::new());
    for link in links.drain(..) {
        let spec = SandboxSpec::idle();
        let t = Instant::now();
        let mut sb = spawner.create(&spec, stdio).map_err(chain)?;
        plain.push(t.elapsed().as_secs_f64() * 1000.0);
        sb.destroy().map_err(chain)?;
        let mut spec = SandboxSpec::idle();
        spec.network = NetworkMode::Joined {
            nameserver: link.gateway(),
        };
        let t = Instant::now();
        let fd = link.netns.fd().try_clone_to_owned().map_err(chain)?;
        let mut sb = spawner.create_in(&spec, stdio, Some(fd)).map_err(chain)?;
        linked.push(t.elapsed().as_secs_f64() * 1000.0);
        sb.destroy().map_err(chain)?;
        drop(link);
    }
    println!("  create -> ready of an idle sandbox ({runs} each, interleaved, in process):");
    let without = stats("without network", &mut plain);
    let with = stats("with internet (pooled link)", &mut linked);
    println!(
        "  ratio with/without             p50 {:7.2}      p99 {:7.2}",
        with.0 / without.0,
        with.1 / without.1
    );
    stats("preparing a link (pool, bg)", &mut prepare);

    // Traffic: the server and the services are threads (from here on, no more sandboxes).
    internet.serve()?;
    upstream.serve(SERVER.parse().expect("literal address"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(chain)?;
    let service = {
        let _in = runtime.enter();
        NetService::serve(router).map_err(chain)?
    };
    let nat = service
        .router()
        .attach(NetPolicy::internet(), None)
        .map_err(chain)?;
    // A domain rule puts the sandbox's HTTP through the proxy; the benchmark's requests name
    // another host, which the policy (no deny list) lets through to the address asked for.
    let proxied = service
        .router()
        .attach(
            NetPolicy::Egress {
                allow: vec![Target::Domain("unused.invalid".into())],
                deny: Vec::new(),
            },
            None,
        )
        .map_err(chain)?;
    let direct = direct(&internet)?;
    let paths: [(&str, &NetNs); 3] = [
        ("direct (plain veth)", &direct),
        ("through the router (NAT)", &nat.netns),
        ("through the domain proxy", &proxied.netns),
    ];
    println!("  to the simulated internet (TCP, port 80):");
    let mut base = Peer::default();
    for (name, ns) in paths {
        let mut setup = setup_times(ns)?;
        let mut rtt = round_trips(ns)?;
        // The median of three downloads (the first one also warms the path up).
        let mut d = [download(ns)?, download(ns)?, download(ns)?];
        d.sort_by(|a, b| a.total_cmp(b));
        let mbps = d[1];
        let (s50, r50, r99, vs) = base.figures(&mut setup, &mut rtt, mbps, "rtt", 1);
        println!(
            "    {name:<26} set-up p50 {s50:6.3} ms   rtt p50 {r50:6.1} µs p99 {r99:6.1} µs   \
             download {mbps:7.0} MB/s{vs}"
        );
    }
    let ruled = service
        .router()
        .attach(NetPolicy::internet(), Some(crate::bench_rules::rules()))
        .map_err(chain)?;
    let sandbox_ca = ruled.ca_pem().ok_or("a link with rules has no CA")?;
    let sandbox_root = {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(sandbox_ca.as_bytes()).map_err(chain)?
    };
    let https: SocketAddr = format!("{SERVER}:443").parse().expect("literal address");
    println!(
        "  HTTPS to {}, HTTP/1.1 (set-up: connect + handshake + first answer; requests on one connection):",
        crate::bench_rules::NAME
    );
    let mut base = Peer::default();
    for (name, ns, root, keyed) in [
        (
            "domain proxy, passed through",
            &proxied.netns,
            upstream.root(),
            false,
        ),
        (
            "header rule (terminated, set)",
            &ruled.netns,
            &sandbox_root,
            true,
        ),
    ] {
        let (mut setup, mut each, mbps) = crate::bench_rules::measure(ns, https, root, keyed)?;
        let (s50, r50, r99, vs) = base.figures(&mut setup, &mut each, mbps, "a request", 0);
        println!(
            "    {name:<30} set-up p50 {s50:6.2} ms   request p50 {r50:6.0} µs p99 {r99:6.0} µs   \
             download {mbps:6.0} MB/s{vs}"
        );
    }
    drop((nat, proxied, ruled));
    service.shutdown();
    drop(service);
    runtime.shutdown_background();
    Ok(())
}
