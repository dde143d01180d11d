//! The router end to end, on a simulated internet: a namespace this test creates, with its own
//! servers on a "public" address and on addresses in the always-denied ranges. No traffic
//! leaves the test's namespaces. Needs root (as the server does).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use husk_net::cmd;
use husk_net::netns::NetNs;
use husk_net::router::{Router, RouterConfig, Uplink};
use husk_net::rules::HeaderRules;
use husk_net::NetPolicy;

const PUBLIC: &str = "198.51.100.10";
/// Targets the test places in always-denied ranges, inside its own internet namespace.
const DENIED_TARGETS: &[&str] = &[
    "10.20.30.40",
    "172.16.5.5",
    "192.168.7.7",
    "169.254.169.254",
    "100.64.1.1",
];

struct Internet {
    ns: NetNs,
}

impl Internet {
    fn new() -> Internet {
        let ns = NetNs::create().unwrap();
        let mut script = String::from("link set lo up\n");
        for a in std::iter::once(PUBLIC).chain(DENIED_TARGETS.iter().copied()) {
            script.push_str(&format!("addr add {a}/32 dev lo\n"));
        }
        cmd::ip(Some(&ns), &script).unwrap();
        Internet { ns }
    }

    fn path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.ns.fd().as_raw_fd()
        ))
    }

    /// A server at `addr` that answers every connection with "hello".
    fn serve(&self, addr: &str) -> SocketAddr {
        let addr: SocketAddr = format!("{addr}:0").parse().unwrap();
        let l = self.ns.run(|| TcpListener::bind(addr)).unwrap();
        let local = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let _ = c.write_all(b"hello");
            }
        });
        local
    }
}

fn router(internet: &Internet) -> Router {
    let mut cfg = RouterConfig::new(Uplink::Netns {
        path: internet.path(),
        address: "203.0.113.2/24".parse().unwrap(),
        gateway: Ipv4Addr::new(203, 0, 113, 1),
    });
    cfg.pool = 1;
    cfg.run_dir = std::env::temp_dir().join(format!("husk-net-test-{}", std::process::id()));
    Router::start(cfg).unwrap()
}

/// Connects from inside `ns`: Ok(what the server said) or the error, within 5 s.
fn fetch(ns: &NetNs, to: SocketAddr) -> std::io::Result<String> {
    ns.run(|| {
        let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
}

fn refused_fast(ns: &NetNs, to: SocketAddr) {
    let t = Instant::now();
    let e = fetch(ns, to).expect_err(&format!("{to} was reachable"));
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{to}: {e}");
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{to}: took {:?}",
        t.elapsed()
    );
}

#[test]
fn internet_answers_and_denied_ranges_router_and_peers_are_refused() {
    let internet = Internet::new();
    let r = router(&internet);
    let public = internet.serve(PUBLIC);
    let a = r.attach(NetPolicy::internet(), None).unwrap();
    let b = r.attach(NetPolicy::internet(), None).unwrap();
    assert_eq!(fetch(&a.netns, public).unwrap(), "hello");
    for target in DENIED_TARGETS {
        let at = internet.serve(target);
        refused_fast(&a.netns, at);
    }
    // The uplink's own network (its gateway is the internet side's address here).
    let gateway = internet.serve("203.0.113.1");
    refused_fast(&a.netns, gateway);
    // The router itself (its side of the link; only DNS and the proxy listen there, and
    // nothing else is let in).
    refused_fast(&a.netns, SocketAddr::new(a.gateway().into(), 22));
    // Another sandbox: a server in b, reached from a.
    let l = b
        .netns
        .run(|| TcpListener::bind(SocketAddr::new(b.net.address.into(), 0)))
        .unwrap();
    refused_fast(&a.netns, l.local_addr().unwrap());
    // Denials were not silent: UDP too is refused at once (ICMP), not dropped.
    let err = a
        .netns
        .run(|| {
            let s = std::net::UdpSocket::bind("0.0.0.0:0")?;
            s.connect(public)?;
            s.set_read_timeout(Some(Duration::from_secs(3)))?;
            s.send(b"x")?;
            let mut buf = [0u8; 8];
            s.recv(&mut buf).map(|_| ())
        })
        .expect_err("udp to the internet is not allowed by default");
    assert_ne!(
        err.kind(),
        std::io::ErrorKind::WouldBlock,
        "udp: silent drop"
    );
}

#[test]
fn cidr_lists_allow_beats_deny_and_policies_change_at_run_time() {
    let internet = Internet::new();
    let r = router(&internet);
    let public = internet.serve(PUBLIC);
    let a = r
        .attach(
            NetPolicy::from_flags(&["deny=198.51.100.0/24".into()]).unwrap(),
            None,
        )
        .unwrap();
    refused_fast(&a.netns, public);
    a.set_policy(
        NetPolicy::from_flags(&["deny=198.51.100.0/24".into(), format!("allow={PUBLIC}")]).unwrap(),
        HeaderRules::default(),
    )
    .unwrap();
    assert_eq!(fetch(&a.netns, public).unwrap(), "hello");
    a.set_policy(NetPolicy::None, HeaderRules::default())
        .unwrap();
    refused_fast(&a.netns, public);
    a.set_policy(NetPolicy::internet(), HeaderRules::default())
        .unwrap();
    assert_eq!(fetch(&a.netns, public).unwrap(), "hello");
    // An allow list cannot open an always-denied range.
    let private = internet.serve(DENIED_TARGETS[0]);
    a.set_policy(
        NetPolicy::from_flags(&["allow=10.0.0.0/8".into()]).unwrap(),
        HeaderRules::default(),
    )
    .unwrap();
    refused_fast(&a.netns, private);
}

#[test]
fn nothing_of_the_router_remains_after_it_is_dropped() {
    let internet = Internet::new();
    let links_before = cmd::output(Some(&internet.ns), "ip", &["-o", "link"]).unwrap();
    let r = router(&internet);
    let a = r.attach(NetPolicy::internet(), None).unwrap();
    let during = cmd::output(Some(&internet.ns), "ip", &["-o", "link"]).unwrap();
    assert!(during.contains("husk-"), "{during}");
    drop(a);
    drop(r);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let after = cmd::output(Some(&internet.ns), "ip", &["-o", "link"]).unwrap();
        if after.lines().count() == links_before.lines().count() && !after.contains("husk-") {
            break;
        }
        assert!(Instant::now() < deadline, "left behind: {after}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_link_whose_namespace_outlives_its_sandbox_does_not_block_its_address() {
    let internet = Internet::new();
    let mut cfg = RouterConfig::new(Uplink::Netns {
        path: internet.path(),
        address: "203.0.113.2/24".parse().unwrap(),
        gateway: Ipv4Addr::new(203, 0, 113, 1),
    });
    // Room for two links only, no pool: indexes come round again at once.
    cfg.subnet = "100.96.0.0/30".parse().unwrap();
    cfg.pool = 0;
    cfg.run_dir = std::env::temp_dir().join(format!("husk-net-test-{}", std::process::id()));
    let r = Router::start(cfg).unwrap();
    let public = internet.serve(PUBLIC);
    let first = r.attach(NetPolicy::internet(), None).unwrap();
    // Something keeps the first sandbox's namespace (and so its link) alive after it ends.
    let held = first.netns.clone();
    drop(first);
    let second = r.attach(NetPolicy::internet(), None).unwrap();
    drop(second);
    // The first index again: its stale link is replaced, and the new sandbox works.
    let third = r.attach(NetPolicy::internet(), None).unwrap();
    assert_eq!(fetch(&third.netns, public).unwrap(), "hello");
    drop(held);
}
