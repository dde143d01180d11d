//! Ingress through a real `husk serve`: servers started inside a sandbox (through the process
//! API, as the SDKs start them) are reached by header routing and by `Host` routing; bodies
//! stream both ways; a server bound to 127.0.0.1 or `::1` only is reached; an Upgrade is joined
//! byte for byte; a closed port, an unknown and a killed sandbox get the answers the SDKs
//! expect; a private sandbox admits only its traffic token or a key of its own team.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::sandbox::Sandbox;
use common::server::{Reply, Server};
use common::{wait_for, TempDir};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The in-sandbox test server: `/headers` (what it was sent, as JSON), `POST /sum` (length
/// and SHA-256 of the body, read as it comes), `POST /pingpong` (answers each request chunk
/// with a response chunk before reading the next: only a proxy that streams both ways gets
/// through), `/ws` (101, then echoes raw bytes) and `/switch` (101 to any request).
/// Arguments: address, port.
const SERVER_PY: &str = r#"
import hashlib, json, socket, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, code, body):
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def chunks(self):
        while True:
            size = int(self.rfile.readline().split(b";")[0], 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            data = self.rfile.read(size)
            self.rfile.readline()
            yield data

    def do_GET(self):
        if self.path == "/ws":
            if self.headers.get("Upgrade", "").lower() != "websocket":
                return self.reply(400, b'"not an upgrade"')
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            while True:
                data = self.rfile.read1(65536)
                if not data:
                    break
                self.wfile.write(data)
            self.close_connection = True
            return
        if self.path == "/switch":
            # A broken server: 101 whatever the request asked for.
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.close_connection = True
            return
        if self.path == "/headers":
            seen = {k.lower(): v for k, v in self.headers.items()}
            return self.reply(200, json.dumps(seen).encode())
        self.reply(404, b'"no such path"')

    def do_POST(self):
        if self.path == "/sum":
            h, n = hashlib.sha256(), 0
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                for c in self.chunks():
                    h.update(c)
                    n += len(c)
            else:
                left = int(self.headers.get("Content-Length", "0"))
                while left:
                    c = self.rfile.read(min(left, 65536))
                    if not c:
                        break
                    h.update(c)
                    n += len(c)
                    left -= len(c)
            return self.reply(200, json.dumps({"length": n, "sha256": h.hexdigest()}).encode())
        if self.path == "/pingpong":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for c in self.chunks():
                out = b"pong:" + c
                self.wfile.write(b"%x\r\n%s\r\n" % (len(out), out))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.reply(404, b'"no such path"')

class S(ThreadingHTTPServer):
    address_family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET

S((sys.argv[1], int(sys.argv[2])), H).serve_forever()
"#;

/// What the file server inside serves: every byte value, 100 KiB.
fn data() -> Vec<u8> {
    (0..400).flat_map(|_| 0..=255u8).collect()
}

/// The domain in `<port>-<id>.<domain>` hosts: the create answer's, or any (husk routes by the
/// first label).
const DOMAIN: &str = "husk.test";

/// Routing and the test server, for this test.
impl Sandbox<'_> {
    /// `<port>-<id>.<domain>`.
    fn host(&self, port: u16) -> String {
        let domain = self.created["domain"].as_str().unwrap_or(DOMAIN);
        format!("{port}-{}.{domain}", self.id)
    }

    /// Starts the test server on `addr:port` inside.
    fn serve_py(&self, addr: &str, port: u16) {
        let port = port.to_string();
        self.spawn("/usr/bin/python3", &["-c", SERVER_PY, addr, &port], &[]);
    }

    /// A request to `port` by the routing headers, with `extra` headers.
    fn via_headers(
        &self,
        method: &str,
        port: u16,
        path: &str,
        extra: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        let port = port.to_string();
        let mut h = vec![
            ("E2b-Sandbox-Id", self.id.as_str()),
            ("E2b-Sandbox-Port", port.as_str()),
        ];
        h.extend_from_slice(extra);
        self.server.request_with(method, path, &h, body)
    }

    /// A request to `port` by Host routing.
    fn via_host(&self, method: &str, port: u16, path: &str, extra: &[(&str, &str)]) -> Reply {
        let host = self.host(port);
        let mut h = vec![("Host", host.as_str())];
        h.extend_from_slice(extra);
        self.server.request_with(method, path, &h, b"")
    }

    /// Waits (bounded) until `GET path` on `port` answers 200.
    fn wait_serving(&self, port: u16, path: &str, extra: &[(&str, &str)]) -> Reply {
        let mut last = None;
        wait_for(Duration::from_secs(30), || {
            let r = self.via_headers("GET", port, path, extra, b"");
            if r.status == 200 {
                return Some(r);
            }
            last = Some((r.status, r.text()));
            None
        })
        .unwrap_or_else(|| panic!("port {port} never served {path}: last answer {last:?}"))
    }
}

/// A raw connection to the server that sends `head` (with `Host: host`) and reads the answer's
/// head; returns the head (lowercased) and the reader positioned at the body.
fn raw(server: &Server, host: &str, head: &str) -> (String, BufReader<TcpStream>) {
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("{head}Host: {host}\r\n\r\n").as_bytes())
        .unwrap();
    let mut r = BufReader::new(s);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
            break;
        }
        head.push_str(&line.to_lowercase());
    }
    (head, r)
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

#[test]
fn servers_in_a_sandbox_are_reached_by_header_and_by_host() {
    let state = TempDir::new("ingress");
    let server = Server::start(state.path());
    let sb = Sandbox::create(&server, &server.admin_key, json!({"templateID": "base"}));
    // A public sandbox has a traffic token too (the code interpreter wants it); its other
    // ports admit everyone without it.
    let token = sb.created["trafficAccessToken"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(token.len(), 40, "{}", sb.created);

    // Nothing listens yet: the SDKs' "port is not open".
    sb.via_headers("GET", 8000, "/", &[], b"")
        .error(502, "port is not open");

    // A file server on 0.0.0.0, the test server on 127.0.0.1 only.
    sb.spawn(
        "/bin/sh",
        &[
            "-c",
            "mkdir -p /tmp/www && /usr/bin/python3 -c \
             'import sys; sys.stdout.buffer.write(bytes(range(256)) * 400)' > /tmp/www/data.bin \
             && exec /usr/bin/python3 -m http.server 8000 --bind 0.0.0.0 --directory /tmp/www \
             2>/dev/null",
        ],
        &[],
    );
    sb.serve_py("127.0.0.1", 8001);

    let r = sb.wait_serving(8000, "/data.bin", &[]);
    assert_eq!(r.body, data());
    let r = sb.via_host("GET", 8000, "/data.bin", &[]).expect(200);
    assert_eq!(r.body, data());
    // The sandbox's server names itself, not husk.
    assert!(
        r.header("server").unwrap().contains("python"),
        "{}",
        r.headers
    );

    // The 127.0.0.1-only server; it sees the client's Host and who forwarded it, and none of
    // husk's routing headers.
    sb.wait_serving(8001, "/headers", &[]);
    let host = sb.host(8001);
    let seen = sb.via_host("GET", 8001, "/headers", &[]).expect(200).json();
    assert_eq!(seen["host"], host.as_str(), "{seen}");
    assert_eq!(seen["x-forwarded-for"], "127.0.0.1", "{seen}");
    assert_eq!(seen["x-forwarded-proto"], "http", "{seen}");
    let seen = sb
        .via_headers("GET", 8001, "/headers", &[("X-Custom", "kept")], b"")
        .expect(200)
        .json();
    assert_eq!(seen["x-custom"], "kept", "{seen}");
    for gone in ["e2b-sandbox-id", "e2b-sandbox-port", "connection"] {
        assert!(
            seen.get(gone).is_none(),
            "{gone} reached the sandbox: {seen}"
        );
    }

    // A server on the IPv6 loopback only.
    sb.serve_py("::1", 8002);
    sb.wait_serving(8002, "/headers", &[]);

    // 2 MiB up, with a length and chunked.
    let body: Vec<u8> = (0..2u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
    let want = json!({"length": body.len(), "sha256": sha256_hex(&body)});
    let r = sb.via_headers("POST", 8001, "/sum", &[], &body).expect(200);
    assert_eq!(r.json(), want);
    let chunked = [("Transfer-Encoding", "chunked")];
    let r = sb
        .via_headers("POST", 8001, "/sum", &chunked, &body)
        .expect(200);
    assert_eq!(r.json(), want);

    // Both directions stream: each response chunk comes back before the request is finished.
    let (head, mut r) = raw(
        &server,
        &host,
        "POST /pingpong HTTP/1.1\r\nTransfer-Encoding: chunked\r\n",
    );
    // (The head only arrives once the inside server has read the request's head.)
    assert!(head.starts_with("http/1.1 200"), "{head}");
    for word in ["one", "two", "three"] {
        let s = r.get_mut();
        s.write_all(format!("{:x}\r\n{word}\r\n", word.len()).as_bytes())
            .unwrap();
        let mut size = String::new();
        r.read_line(&mut size).unwrap();
        let n = usize::from_str_radix(size.trim(), 16).unwrap();
        let mut chunk = vec![0u8; n + 2];
        r.read_exact(&mut chunk).unwrap();
        assert_eq!(&chunk[..n], format!("pong:{word}").as_bytes());
    }
    r.get_mut().write_all(b"0\r\n\r\n").unwrap();
    let mut end = String::new();
    r.read_line(&mut end).unwrap();
    assert_eq!(end.trim(), "0");

    // An Upgrade: 101, then raw bytes both ways.
    let (head, mut r) = raw(
        &server,
        &host,
        "GET /ws HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n",
    );
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    let payload: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
    let writer = {
        let mut s = r.get_ref().try_clone().unwrap();
        let payload = payload.clone();
        std::thread::spawn(move || s.write_all(&payload).unwrap())
    };
    let mut echoed = vec![0u8; payload.len()];
    r.read_exact(&mut echoed).unwrap();
    writer.join().unwrap();
    assert!(
        echoed == payload,
        "the upgraded connection changed the bytes"
    );
    drop(r);

    // Issue 15 L2: a 101 to a request that asked for no upgrade is the server's fault, never
    // relayed (the client would be left in a protocol it never asked for).
    sb.via_host("GET", 8001, "/switch", &[])
        .error(502, "asked for no upgrade");
    let (head, _) = raw(
        &server,
        &host,
        "GET /switch HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n",
    );
    assert!(head.starts_with("http/1.1 101"), "{head}");

    // Another closed port, an unknown sandbox.
    sb.via_host("GET", 8009, "/", &[])
        .error(502, "port is not open");
    server
        .request_with(
            "GET",
            "/",
            &[("Host", &format!("8000-nosuchsandbox0000000.{DOMAIN}"))],
            b"",
        )
        .error(502, "not found");

    // Killed: the port is the not-found answer.
    server
        .request("DELETE", &format!("/sandboxes/{}", sb.id), &sb.key, "")
        .expect(204);
    sb.via_headers("GET", 8000, "/data.bin", &[], b"")
        .error(502, "not found");
}

#[test]
fn a_private_sandbox_admits_its_token_and_its_teams_keys_only() {
    let state = TempDir::new("ingress-private");
    let server = Server::start(state.path());
    let key = server.admin_key.clone();
    let other = server.key_for("other");
    let sb = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "network": {"allowPublicTraffic": false}}),
    );
    let token = sb.created["trafficAccessToken"]
        .as_str()
        .unwrap_or_else(|| panic!("no traffic token: {}", sb.created))
        .to_owned();
    assert_eq!(token.len(), 40);
    assert_ne!(token, sb.token);
    // get_info and connect say the same.
    let info = server
        .request("GET", &format!("/sandboxes/{}", sb.id), &key, "")
        .expect(200)
        .json();
    assert_eq!(info["network"]["allowPublicTraffic"], false, "{info}");
    assert_eq!(info["trafficAccessToken"], token.as_str());
    let conn = server
        .request(
            "POST",
            &format!("/v2/sandboxes/{}/connect", sb.id),
            &key,
            r#"{"timeout":120}"#,
        )
        .expect(200)
        .json();
    assert_eq!(conn["trafficAccessToken"], token.as_str());

    sb.serve_py("127.0.0.1", 8001);
    let good = [("E2B-Traffic-Access-Token", token.as_str())];
    sb.wait_serving(8001, "/headers", &good);

    let refused = |extra: &[(&str, &str)]| {
        sb.via_headers("GET", 8001, "/headers", extra, b"")
            .error(403, "private");
        sb.via_host("GET", 8001, "/headers", extra)
            .error(403, "private");
    };
    refused(&[]);
    let wrong = "0".repeat(40);
    refused(&[("E2B-Traffic-Access-Token", wrong.as_str())]);
    refused(&[("E2B-Traffic-Access-Token", "")]);
    refused(&[("X-API-Key", other.as_str())]);
    refused(&[("X-API-Key", "e2b_0000000000000000000000000000000000000000")]);
    // Another team's key with a wrong token is still nobody.
    refused(&[
        ("X-API-Key", other.as_str()),
        ("E2B-Traffic-Access-Token", &token[..39]),
    ]);
    // Whether a port is open is not told to strangers either.
    sb.via_headers("GET", 8009, "/", &[], b"")
        .error(403, "private");

    // The token, by either routing; the token does not reach the sandbox's server.
    let seen = sb
        .via_host("GET", 8001, "/headers", &good)
        .expect(200)
        .json();
    assert!(seen.get("e2b-traffic-access-token").is_none(), "{seen}");
    sb.via_headers("GET", 8001, "/headers", &good, b"")
        .expect(200);
    // A key of the sandbox's team; a husk key never reaches the sandbox's code.
    let own = server.key_for("default");
    for k in [key.as_str(), own.as_str()] {
        let seen = sb
            .via_host("GET", 8001, "/headers", &[("X-API-Key", k)])
            .expect(200)
            .json();
        assert!(seen.get("x-api-key").is_none(), "{seen}");
    }

    // The daemon's port keeps its own authentication, token or not.
    sb.via_headers("GET", 49983, "/health", &[], b"")
        .expect(204);
}
