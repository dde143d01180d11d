//! The resolver against a fake upstream server, all inside a network namespace the test makes
//! (dropped, and so destroyed, at the end). Also the harness the proxy's tests share.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::wire::{self, Rdata};
use super::*;
use crate::policy::NetPolicy;
use crate::sandboxes::{SandboxNet, Sandboxes};

/// Runs a command inside `ns` (a child inherits the namespace of the thread that forks it),
/// with `stdin` fed to it; panics unless it succeeds.
pub(crate) fn run_in(ns: &NetNs, argv: &[&str], stdin: &str) {
    let out = ns
        .run(|| {
            let mut child = Command::new(argv[0])
                .args(&argv[1..])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()?;
            std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes())?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(
        out.status.success(),
        "{argv:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new namespace with loopback up and `addrs` (CIDRs) added to it.
pub(crate) fn test_ns(addrs: &[&str]) -> NetNs {
    let ns = NetNs::create().unwrap();
    run_in(&ns, &["ip", "link", "set", "lo", "up"], "");
    for a in addrs {
        run_in(&ns, &["ip", "addr", "add", a, "dev", "lo"], "");
    }
    ns
}

/// A TCP connection from `src` (a local address of `ns`) to `dst`.
pub(crate) async fn connect_from(
    ns: &NetNs,
    src: IpAddr,
    dst: SocketAddr,
) -> io::Result<TcpStream> {
    let sock = ns.run(|| {
        let s = tokio::net::TcpSocket::new_v4()?;
        s.bind(SocketAddr::new(src, 0))?;
        Ok(s)
    })?;
    sock.connect(dst).await
}

pub(crate) fn a(s: &str) -> Rdata {
    Rdata::A(s.parse().unwrap())
}

/// A fake upstream server on one port over UDP and TCP, answering from `zone` (owner, record)
/// with CNAME chains followed, "no such name" for owners it lacks. Returns its address and
/// the ids of the queries it got.
pub(crate) async fn fake_upstream(
    ns: &NetNs,
    zone: Vec<(&'static str, Rdata)>,
) -> (SocketAddr, Arc<Mutex<Vec<u16>>>) {
    let zone = Arc::new(zone);
    let ids = Arc::new(Mutex::new(Vec::new()));
    let udp = netns::udp_bind(Some(ns), "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = udp.local_addr().unwrap();
    let tcp = netns::tcp_listen(ns, addr).unwrap();
    let (z, seen) = (zone.clone(), ids.clone());
    tokio::spawn(async move {
        let mut buf = vec![0; 65536];
        loop {
            let (n, peer) = udp.recv_from(&mut buf).await.unwrap();
            seen.lock().unwrap().push(wire::id(&buf[..n]).unwrap());
            let reply = zone_answer(&z, &buf[..n]);
            udp.send_to(&reply, peer).await.unwrap();
        }
    });
    tokio::spawn(async move {
        loop {
            let (mut s, _) = tcp.accept().await.unwrap();
            let z = zone.clone();
            tokio::spawn(async move {
                let len = s.read_u16().await.unwrap() as usize;
                let mut q = vec![0; len];
                s.read_exact(&mut q).await.unwrap();
                let reply = zone_answer(&z, &q);
                s.write_u16(reply.len() as u16).await.unwrap();
                s.write_all(&reply).await.unwrap();
            });
        }
    });
    (addr, ids)
}

fn zone_answer(zone: &[(&'static str, Rdata)], query: &[u8]) -> Vec<u8> {
    let (qname, qtype, _) = wire::question(query).unwrap();
    let mut records = Vec::new();
    let mut name = qname.clone();
    for _ in 0..8 {
        let mut next = None;
        for (owner, data) in zone.iter().filter(|(o, _)| *o == name) {
            match data {
                Rdata::Cname(t) => {
                    next = Some(t.clone());
                    records.push((*owner, data.clone()));
                }
                Rdata::A(_) if qtype == wire::TYPE_A => records.push((*owner, data.clone())),
                Rdata::Aaaa(_) if qtype == wire::TYPE_AAAA => records.push((*owner, data.clone())),
                _ => {}
            }
        }
        match next {
            Some(t) => name = t,
            None => break,
        }
    }
    let known = zone.iter().any(|(o, _)| *o == qname);
    let rcode = if known {
        wire::RCODE_NOERROR
    } else {
        wire::RCODE_NXDOMAIN
    };
    wire::tests::answer(query, rcode, &records)
}

#[test]
fn resolv_conf_gives_its_non_loopback_servers() {
    let text = "# comment\nsearch example.com\nnameserver 127.0.0.53\nnameserver 192.0.2.53\n\
                nameserver ::1\nnameserver 2001:db8::53\nnameserver fe80::1%eth0\n\
                nameserver ::ffff:127.0.0.1\nnameserver\noptions edns0\n";
    assert_eq!(
        parse_resolv_conf(text),
        vec![
            "192.0.2.53:53".parse().unwrap(),
            "[2001:db8::53]:53".parse().unwrap()
        ]
    );
}

/// The zone the tests use: one plain name, a CNAME chain, and one name whose answer is too
/// big for UDP.
fn zone() -> Vec<(&'static str, Rdata)> {
    let mut z = vec![
        ("allowed.test", a("203.0.113.10")),
        ("allowed.test", Rdata::Aaaa("2001:db8::10".parse().unwrap())),
        ("www.allowed.test", Rdata::Cname("edge.allowed.test".into())),
        ("edge.allowed.test", a("203.0.113.11")),
    ];
    for i in 0..300u32 {
        z.push(("big.test", Rdata::A(Ipv4Addr::from(0xcb00_7100 + i))));
    }
    z
}

async fn udp_ask(ns: &NetNs, src: &str, server: SocketAddr, q: &[u8]) -> Option<Vec<u8>> {
    let sock = netns::udp_bind(Some(ns), SocketAddr::new(src.parse().unwrap(), 0)).unwrap();
    sock.send_to(q, server).await.unwrap();
    let mut buf = vec![0; 65536];
    let wait = Duration::from_millis(700);
    let n = tokio::time::timeout(wait, sock.recv(&mut buf))
        .await
        .ok()?
        .unwrap();
    Some(buf[..n].to_vec())
}

async fn tcp_ask(ns: &NetNs, src: &str, server: SocketAddr, q: &[u8]) -> io::Result<Vec<u8>> {
    let mut s = connect_from(ns, src.parse().unwrap(), server).await?;
    s.write_u16(q.len() as u16).await?;
    s.write_all(q).await?;
    let len = s.read_u16().await? as usize;
    let mut r = vec![0; len];
    s.read_exact(&mut r).await?;
    Ok(r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_forwarder_answers_registered_sandboxes_through_upstream() {
    let ns = test_ns(&[]);
    let (upstream, upstream_ids) = fake_upstream(&ns, zone()).await;
    // A server that never answers comes first: the forwarder moves on after the timeout.
    let silent = netns::udp_bind(Some(&ns), "127.0.0.1:0".parse().unwrap()).unwrap();
    let resolver = Arc::new(
        Resolver::new(
            vec![silent.local_addr().unwrap(), upstream],
            Some(ns.clone()),
        )
        .with_timeout(Duration::from_millis(200)),
    );
    let sandboxes = Arc::new(Sandboxes::default());
    let gw = Ipv4Addr::new(127, 0, 0, 1);
    let sb = |a: [u8; 4], p| Arc::new(SandboxNet::new(Ipv4Addr::from(a), gw, p));
    sandboxes.insert(sb([127, 0, 0, 2], NetPolicy::internet()));
    sandboxes.insert(sb([127, 0, 0, 4], NetPolicy::None));
    let udp = netns::udp_bind(Some(&ns), "127.0.0.1:0".parse().unwrap()).unwrap();
    let server = udp.local_addr().unwrap();
    let tcp = netns::tcp_listen(&ns, server).unwrap();
    let u = tokio::spawn(resolver.clone().serve_udp(udp, sandboxes.clone()));
    let t = tokio::spawn(resolver.clone().serve_tcp(tcp, sandboxes.clone()));

    // A sandbox's query: the upstream's answer, under the client's id; the upstream saw
    // other, random ids.
    for _ in 0..3 {
        let q = wire::query(0x1234, "allowed.test", wire::TYPE_A).unwrap();
        let r = udp_ask(&ns, "127.0.0.2", server, &q)
            .await
            .expect("an answer");
        assert_eq!(wire::id(&r).unwrap(), 0x1234);
        let parsed = wire::parse_response(&r).unwrap();
        let (addrs, _) = wire::addresses("allowed.test", &parsed.answers);
        assert_eq!(addrs, vec!["203.0.113.10".parse::<IpAddr>().unwrap()]);
    }
    let ids = upstream_ids.lock().unwrap().clone();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().any(|&i| i != 0x1234), "{ids:?}");

    // No such name: the upstream's NXDOMAIN, passed on.
    let q = wire::query(7, "nothing.test", wire::TYPE_A).unwrap();
    let r = udp_ask(&ns, "127.0.0.2", server, &q).await.unwrap();
    assert_eq!(wire::rcode(&r).unwrap(), wire::RCODE_NXDOMAIN);

    // Too big for UDP: an empty truncated answer; over TCP, the whole of it.
    let q = wire::query(8, "big.test", wire::TYPE_A).unwrap();
    let r = udp_ask(&ns, "127.0.0.2", server, &q).await.unwrap();
    assert!(wire::truncated(&r) && wire::parse_response(&r).unwrap().answers.is_empty());
    let r = tcp_ask(&ns, "127.0.0.2", server, &q).await.unwrap();
    assert!(r.len() > MAX_UDP && !wire::truncated(&r));
    assert_eq!(wire::id(&r).unwrap(), 8);

    // Not a sandbox: no answer over UDP, the connection closed over TCP.
    let q = wire::query(9, "allowed.test", wire::TYPE_A).unwrap();
    assert!(udp_ask(&ns, "127.0.0.3", server, &q).await.is_none());
    assert!(tcp_ask(&ns, "127.0.0.3", server, &q).await.is_err());
    // A sandbox without network: refused.
    let r = udp_ask(&ns, "127.0.0.4", server, &q).await.unwrap();
    assert_eq!(wire::rcode(&r).unwrap(), wire::RCODE_REFUSED);
    // Not a query, or garbage: FORMERR, NOTIMP or nothing.
    let mut bad = q.clone();
    bad.truncate(15);
    let r = udp_ask(&ns, "127.0.0.2", server, &bad).await.unwrap();
    assert_eq!(wire::rcode(&r).unwrap(), wire::RCODE_FORMERR);
    let mut update = q.clone();
    update[2] = 5 << 3;
    let r = udp_ask(&ns, "127.0.0.2", server, &update).await.unwrap();
    assert_eq!(wire::rcode(&r).unwrap(), wire::RCODE_NOTIMP);
    assert!(udp_ask(&ns, "127.0.0.2", server, &r).await.is_none());

    u.abort();
    t.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookup_follows_cnames_and_fails_fast_without_upstream() {
    let ns = test_ns(&[]);
    let (upstream, ids) = fake_upstream(&ns, zone()).await;
    let resolver = Resolver::new(vec![upstream], Some(ns.clone()));
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert_eq!(
        resolver.lookup("Allowed.Test.").await.unwrap(),
        vec![ip("203.0.113.10"), ip("2001:db8::10")]
    );
    assert_eq!(
        resolver.lookup("www.allowed.test").await.unwrap(),
        vec![ip("203.0.113.11")]
    );
    assert!(resolver.lookup("nothing.test").await.unwrap().is_empty());
    // Truncated over UDP: asked again over TCP (and capped at 256 records).
    assert_eq!(resolver.lookup("big.test").await.unwrap().len(), 256);
    // A second lookup of a name is answered from the cache.
    let before = ids.lock().unwrap().len();
    resolver.lookup("allowed.test").await.unwrap();
    assert_eq!(ids.lock().unwrap().len(), before);
    assert!(matches!(
        resolver.lookup("bad name").await,
        Err(LookupError::Name(_))
    ));

    let silent = netns::udp_bind(Some(&ns), "127.0.0.1:0".parse().unwrap()).unwrap();
    let dead = Resolver::new(vec![silent.local_addr().unwrap()], Some(ns.clone()))
        .with_timeout(Duration::from_millis(100));
    let started = std::time::Instant::now();
    assert!(matches!(
        dead.lookup("allowed.test").await,
        Err(LookupError::Failed { .. })
    ));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(matches!(
        Resolver::new(vec![], None).lookup("allowed.test").await,
        Err(LookupError::NoUpstream)
    ));
}
