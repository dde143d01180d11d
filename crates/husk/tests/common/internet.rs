//! A simulated internet for network tests: a network namespace this test process creates and
//! holds (it disappears when the test ends, whatever happens), with
//! - a web server at [`PUBLIC`] (ports 80 and 443) that answers `public host=<Host>` and
//!   records every connection it gets;
//! - a name server at [`DNS`] answering the test's names;
//! - targets in the always-denied ranges ([`DENIED_TARGETS`]), listening on port 80, each
//!   recording any connection that reaches it (none ever should).
//!
//! husk serve reaches it with `--egress netns:PATH` ([`Internet::serve_args`]). No traffic
//! ever leaves the test's namespaces.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use husk_net::cmd;
use husk_net::netns::NetNs;

pub const PUBLIC: &str = "198.51.100.10";
pub const DNS: &str = "198.51.100.53";
/// The router's address on the uplink, and the internet's side of it.
pub const UPLINK_ADDRESS: &str = "203.0.113.2/24";
pub const UPLINK_GATEWAY: &str = "203.0.113.1";
/// One target in each always-denied range the issue names (host-local ones are tested from
/// the host's side).
pub const DENIED_TARGETS: &[&str] = &[
    "10.20.30.40",
    "172.16.5.5",
    "192.168.7.7",
    "169.254.169.254",
    "100.64.1.1",
    "198.18.0.5",
];

/// What the name server answers (A records); anything else is NXDOMAIN.
pub const NAMES: &[(&str, &str)] = &[
    ("allowed.test", PUBLIC),
    ("other.test", PUBLIC),
    ("api.wild.test", PUBLIC),
    // A name that points into the private network.
    ("rebind.test", "10.20.30.40"),
];

/// A rebinding name: its A answers alternate between [`PUBLIC`] and a private target, with a
/// TTL of 0 (so that whoever asks second gets the other one).
pub const FLIP: &str = "flip.test";

/// A connection a server of the internet got: (the address it was made to, the first line or
/// `Host` it carried).
pub type Hit = (String, String);

pub struct Internet {
    pub ns: NetNs,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Internet {
    pub fn new() -> Internet {
        let ns = NetNs::create().unwrap();
        let mut script = String::from("link set lo up\n");
        for a in [PUBLIC, DNS].iter().chain(DENIED_TARGETS) {
            script.push_str(&format!("addr add {a}/32 dev lo\n"));
        }
        cmd::ip(Some(&ns), &script).unwrap();
        let net = Internet {
            ns,
            hits: Arc::default(),
        };
        for a in std::iter::once(&PUBLIC).chain(DENIED_TARGETS) {
            net.web(a, 80);
        }
        net.web(PUBLIC, 443);
        net.dns();
        net
    }

    /// `husk serve` flags that make this its uplink (and its name server).
    pub fn serve_args(&self) -> Vec<String> {
        vec![
            "--egress".into(),
            format!(
                "netns:/proc/{}/fd/{}",
                std::process::id(),
                self.ns.fd().as_raw_fd()
            ),
            "--egress-address".into(),
            UPLINK_ADDRESS.into(),
            "--egress-gateway".into(),
            UPLINK_GATEWAY.into(),
            "--net-dns".into(),
            DNS.into(),
        ]
    }

    /// Every connection the servers got, so far.
    pub fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Connections that reached an always-denied target (must stay empty).
    pub fn denied_hits(&self) -> Vec<Hit> {
        self.hits()
            .into_iter()
            .filter(|(to, _)| {
                DENIED_TARGETS
                    .iter()
                    .any(|d| to.starts_with(&format!("{d}:")))
            })
            .collect()
    }

    /// The names of the links in the internet's namespace.
    pub fn links(&self) -> String {
        cmd::output(Some(&self.ns), "ip", &["-o", "link"]).unwrap()
    }

    fn web(&self, addr: &str, port: u16) {
        let at: SocketAddr = format!("{addr}:{port}").parse().unwrap();
        let l = self.ns.run(|| TcpListener::bind(at)).unwrap();
        let hits = self.hits.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = [0u8; 2048];
                let n = c.read(&mut buf).unwrap_or(0);
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                let host = text
                    .lines()
                    .find_map(|l| {
                        l.strip_prefix("Host: ")
                            .or_else(|| l.strip_prefix("host: "))
                    })
                    .unwrap_or(if port == 443 { "tls" } else { "-" })
                    .trim()
                    .to_owned();
                hits.lock().unwrap().push((at.to_string(), host.clone()));
                let body = format!("public host={host}");
                let _ = c.write_all(
                    format!(
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
    }

    fn dns(&self) {
        let at: SocketAddr = format!("{DNS}:53").parse().unwrap();
        let sock = self.ns.run(|| UdpSocket::bind(at)).unwrap();
        let names: BTreeMap<&str, Ipv4Addr> = NAMES
            .iter()
            .map(|(n, a)| (*n, a.parse().unwrap()))
            .collect();
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            let mut flips = 0u64;
            while let Ok((n, from)) = sock.recv_from(&mut buf) {
                let mut names = names.clone();
                if let Ok((name, 1, _)) = husk_net::dns::wire::question(&buf[..n]) {
                    if name.trim_end_matches('.').eq_ignore_ascii_case(FLIP) {
                        let to = if flips % 2 == 0 {
                            PUBLIC
                        } else {
                            DENIED_TARGETS[0]
                        };
                        names.insert(FLIP, to.parse().unwrap());
                        flips += 1;
                    }
                }
                if let Some(reply) = answer(&buf[..n], &names) {
                    let _ = sock.send_to(&reply, from);
                }
            }
        });
    }
}

/// A reply to a one-question query: the A record the test knows, or NXDOMAIN (or an empty
/// answer for other types).
fn answer(q: &[u8], names: &BTreeMap<&str, Ipv4Addr>) -> Option<Vec<u8>> {
    let (name, qtype, _) = husk_net::dns::wire::question(q).ok()?;
    let end = husk_net::dns::wire::question_end(q).ok()?;
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let mut r = q[..end].to_vec();
    r[2] = 0x81 | (q[2] & 0x01); // QR, RD copied
    r[3] = 0x80; // RA, NOERROR
    r[6..12].copy_from_slice(&[0, 0, 0, 0, 0, 0]);
    match names.get(name.as_str()) {
        Some(ip) if qtype == 1 => {
            r[7] = 1;
            let ttl = if name == FLIP { 0 } else { 30 };
            r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, ttl, 0, 4]);
            r.extend_from_slice(&ip.octets());
        }
        Some(_) => {}
        None => r[3] = 0x83, // NXDOMAIN
    }
    Some(r)
}
