//! `husk bench`'s figures for header rules (E2B's `network.rules`): HTTPS from a sandbox link
//! to a server of the simulated internet, side by side through the domain proxy passed through
//! (the sandbox's TLS reaches the server, the peer) and with a header rule (the proxy
//! terminates the sandbox's TLS with the sandbox's CA, sets the header, and sends the request
//! over a TLS connection of its own, verified). Set-up (connect, handshake, first answer),
//! requests on one kept-alive connection, and a download.
//!
//! The simulated internet gets a name server (`bench.test` is the server's address: the proxy
//! resolves a rule's name itself) and a TLS server on port 443 with a certificate from a CA of
//! the benchmark's own, which the router is told to trust (`upstream_ca`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use husk_net::ca::SandboxCa;
use husk_net::netns::NetNs;
use husk_net::rules::{HeaderRules, HostRule, SecretValue};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::bench::chain;

/// The name the rule and the requests are for.
pub const NAME: &str = "bench.test";
const CONNECTS: usize = 100;
const REQUESTS: usize = 1000;
/// Bytes of the download.
const DOWNLOAD: usize = 128 << 20;

/// The internet's name server and TLS server, bound (threads start in [`Upstream::serve`]).
pub struct Upstream {
    dns: UdpSocket,
    tls: TcpListener,
    server: Arc<ServerConfig>,
    root: CertificateDer<'static>,
    /// The CA's certificate, for the router's `upstream_ca`.
    pub ca_file: PathBuf,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.ca_file);
    }
}

impl Upstream {
    /// Binds the servers at `server`:53 (UDP) and `server`:443 in `internet`. No thread yet:
    /// the benchmark still forks sandboxes.
    pub fn bind(internet: &NetNs, server: &str) -> Result<Upstream, String> {
        let ca = SandboxCa::new("bench upstream").map_err(chain)?;
        let ca_file =
            std::env::temp_dir().join(format!("husk-bench-upstream-{}.pem", std::process::id()));
        std::fs::write(&ca_file, ca.pem()).map_err(chain)?;
        let at = |port: u16| -> SocketAddr { format!("{server}:{port}").parse().expect("address") };
        let dns = internet.run(|| UdpSocket::bind(at(53))).map_err(chain)?;
        let tls = internet.run(|| TcpListener::bind(at(443))).map_err(chain)?;
        Ok(Upstream {
            dns,
            tls,
            server: ca.server_config(NAME).map_err(chain)?,
            root: CertificateDer::from_pem_slice(ca.pem().as_bytes()).map_err(chain)?,
            ca_file,
        })
    }

    /// The name server's address.
    pub fn dns_addr(&self) -> Result<SocketAddr, String> {
        self.dns.local_addr().map_err(chain)
    }

    /// Starts answering (threads).
    pub fn serve(&self, server: std::net::Ipv4Addr) -> Result<(), String> {
        let dns = self.dns.try_clone().map_err(chain)?;
        std::thread::spawn(move || {
            let mut buf = [0u8; 512];
            while let Ok((n, peer)) = dns.recv_from(&mut buf) {
                if let Some(reply) = dns_answer(&buf[..n], server) {
                    let _ = dns.send_to(&reply, peer);
                }
            }
        });
        let (tls, cfg) = (self.tls.try_clone().map_err(chain)?, self.server.clone());
        std::thread::spawn(move || {
            for c in tls.incoming().flatten() {
                let cfg = cfg.clone();
                std::thread::spawn(move || serve_https(c, cfg));
            }
        });
        Ok(())
    }
}

/// An answer to a query: `NAME`'s A record is `server`; any other question gets none.
fn dns_answer(query: &[u8], server: std::net::Ipv4Addr) -> Option<Vec<u8>> {
    use husk_net::dns::wire;
    let end = wire::question_end(query).ok()?;
    let (name, qtype, _) = wire::question(query).ok()?;
    let mut r = query[..end].to_vec();
    r[2] |= 0x80; // a response
    r[3] = 0x80; // recursion available, NOERROR
    let answer = name.eq_ignore_ascii_case(NAME) && qtype == 1;
    r[6..12].copy_from_slice(&[0, u8::from(answer), 0, 0, 0, 0]);
    if answer {
        r.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]);
        r.extend_from_slice(&server.octets());
    }
    Some(r)
}

/// HTTP/1.1 over TLS, kept alive: `GET /bulk` gets [`DOWNLOAD`] bytes, anything else `ok`
/// when it carries the rule's header and `no` when not.
fn serve_https(tcp: TcpStream, cfg: Arc<ServerConfig>) {
    let _ = tcp.set_nodelay(true);
    let Ok(conn) = rustls::ServerConnection::new(cfg) else {
        return;
    };
    let mut s = BufReader::new(rustls::StreamOwned::new(conn, tcp));
    loop {
        let Some((first, keyed)) = read_head(&mut s) else {
            return;
        };
        let written = if first.starts_with("GET /bulk") {
            let chunk = vec![0x5au8; 1 << 20];
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {DOWNLOAD}\r\n\r\n");
            let w = s.get_mut();
            w.write_all(head.as_bytes())
                .and_then(|()| (0..DOWNLOAD / chunk.len()).try_for_each(|_| w.write_all(&chunk)))
        } else {
            let body: &[u8] = if keyed { b"ok" } else { b"no" };
            let w = s.get_mut();
            w.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
                .and_then(|()| w.write_all(body))
        };
        if written.and_then(|()| s.get_mut().flush()).is_err() {
            return;
        }
    }
}

/// A message head's first line and whether it carries the rule's header; `None` at the end.
fn read_head(r: &mut impl BufRead) -> Option<(String, bool)> {
    let mut first = String::new();
    let mut keyed = false;
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) if line == "\r\n" => return Some((first, keyed)),
            Ok(_) if first.is_empty() => first = line.clone(),
            Ok(_) => keyed |= line.eq_ignore_ascii_case(KEY_LINE),
        }
    }
}

/// The header line the rule sets, as the server reads it.
const KEY_LINE: &str = "authorization: Bearer bench-key\r\n";

/// A sandbox's header rule for [`NAME`].
pub fn rules() -> HeaderRules {
    HeaderRules {
        hosts: vec![HostRule {
            host: NAME.into(),
            headers: vec![(
                "authorization".into(),
                SecretValue::new(b"Bearer bench-key".to_vec()),
            )],
        }],
    }
}

type Client = BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>;

fn client_config(root: &CertificateDer<'static>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.add(root.clone()).map_err(chain)?;
    let cfg = ClientConfig::builder_with_provider(husk_net::ca::provider())
        .with_safe_default_protocol_versions()
        .map_err(chain)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}

fn connect(ns: &NetNs, at: SocketAddr, cfg: &Arc<ClientConfig>) -> Result<Client, String> {
    let tcp = crate::bench_net::connect_to(ns, at)?;
    let name = ServerName::try_from(NAME).map_err(chain)?;
    let conn = rustls::ClientConnection::new(cfg.clone(), name).map_err(chain)?;
    Ok(BufReader::new(rustls::StreamOwned::new(conn, tcp)))
}

/// One request and its whole answer: the body's length, and the body when it is small.
fn request(c: &mut Client, path: &str) -> Result<(usize, Vec<u8>), String> {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {NAME}\r\n\r\n");
    c.get_mut().write_all(req.as_bytes()).map_err(chain)?;
    c.get_mut().flush().map_err(chain)?;
    let mut len = None;
    let mut status = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if c.read_line(&mut line).map_err(chain)? == 0 {
            return Err("the connection closed mid-answer".into());
        }
        if status.is_empty() {
            status = line.trim_end().to_owned();
        } else if line == "\r\n" {
            break;
        } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse::<usize>().ok();
        }
    }
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("the server answered {status:?}"));
    }
    let len = len.ok_or("an answer without Content-Length")?;
    let mut left = len;
    let mut buf = vec![0u8; 1 << 20];
    let mut small = Vec::new();
    while left > 0 {
        let n = c
            .read(&mut buf[..left.min(1 << 20)])
            .map_err(|e| format!("reading the answer: {e}"))?;
        if n == 0 {
            return Err(format!("the answer ended {left} bytes short"));
        }
        if len <= 64 {
            small.extend_from_slice(&buf[..n]);
        }
        left -= n;
    }
    Ok((len, small))
}

/// Set-up times (ms), request times on one connection (µs) and download throughput (MB/s)
/// of HTTPS to `at` from `ns`, trusting `root`; every answer must say whether the server got
/// the rule's header as `keyed` says it should.
pub fn measure(
    ns: &NetNs,
    at: SocketAddr,
    root: &CertificateDer<'static>,
    keyed: bool,
) -> Result<(Vec<f64>, Vec<f64>, f64), String> {
    let cfg = client_config(root)?;
    let want: &[u8] = if keyed { b"ok" } else { b"no" };
    let check = |(_, body): (usize, Vec<u8>)| {
        if body == want {
            Ok(())
        } else {
            Err(format!(
                "the server answered {:?}, not {:?}",
                String::from_utf8_lossy(&body),
                String::from_utf8_lossy(want)
            ))
        }
    };
    let mut setup = Vec::with_capacity(CONNECTS);
    for _ in 0..CONNECTS {
        let t = Instant::now();
        let mut c = connect(ns, at, &cfg)?;
        check(request(&mut c, "/")?)?;
        setup.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut c = connect(ns, at, &cfg)?;
    let mut each = Vec::with_capacity(REQUESTS);
    for _ in 0..REQUESTS {
        let t = Instant::now();
        check(request(&mut c, "/")?)?;
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let t = Instant::now();
    let (got, _) = request(&mut c, "/bulk")?;
    let mbps = got as f64 / t.elapsed().as_secs_f64() / 1e6;
    Ok((setup, each, mbps))
}

impl Upstream {
    /// The upstream CA's certificate (what a sandbox whose TLS passes through must trust).
    pub fn root(&self) -> &CertificateDer<'static> {
        &self.root
    }
}
