//! A real `husk serve` for end-to-end tests: started on 127.0.0.1:0 with its own state
//! directory (and any extra `husk serve` flags), its log echoed to the test's output, stopped
//! with SIGTERM when dropped (it destroys its sandboxes; SIGKILL after 5 s) or killed outright
//! with [`Server::kill_hard`] (a crash).
//!
//! Requests go on a fresh connection each: [`Server::request`] with an API key and a JSON
//! content type, [`Server::request_with`] with exactly the headers given (a
//! `Transfer-Encoding: chunked` among them sends the body chunked). Both are HTTP/1.1 and read
//! the whole answer, de-chunked; a chunked body that breaks off panics (a broken transfer must
//! not pass for a complete one). [`Server::stream`] and [`Server::stream_with`] are HTTP/1.0:
//! the answer is never chunked, so its body can be read as it arrives, line by line or raw.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{wait_for, HUSK};

/// How long a request waits for the server's next bytes (template builds are slow).
const READ_TIMEOUT: Duration = Duration::from_secs(300);

pub struct Server {
    child: Child,
    pub port: u16,
    pub admin_key: String,
    pub state: PathBuf,
    lines: mpsc::Receiver<String>,
    /// What it logged before it listened (its helpers' start-up warnings among them).
    pub startup: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        // Already ended (and reaped): its pid may be another process's by now.
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SIGTERM first: the server destroys its sandboxes; then make sure it is gone.
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A response read in full.
pub struct Reply {
    pub status: u16,
    /// The status line and the headers, lowercased.
    pub headers: String,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// A header's (lowercased) value.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }

    /// Asserts the status; shows the body when it differs.
    pub fn expect(self, status: u16) -> Reply {
        assert_eq!(self.status, status, "{}", self.text());
        self
    }

    /// Asserts an error answer: the status, and a JSON `{code, message}` whose message holds
    /// `text`.
    pub fn error(self, status: u16, text: &str) -> Reply {
        let r = self.expect(status);
        let v = r.json();
        assert_eq!(v["code"], status, "{v}");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains(text), "{text:?} not in {msg:?}");
        r
    }
}

/// A response whose body is read as it arrives: by line, or raw through [`Read`].
pub struct Streaming {
    pub status: u16,
    pub headers: String,
    reader: BufReader<TcpStream>,
}

impl Streaming {
    /// The next line of the body (without its newline); `None` at the end.
    pub fn next_line(&mut self) -> Option<String> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end_matches('\n').to_owned()),
        }
    }

    /// Every remaining NDJSON event (keepalives dropped).
    pub fn events(self) -> Vec<serde_json::Value> {
        self.events_within(Duration::MAX)
    }

    /// [`Self::events`], failing once `limit` has passed: keepalives keep a stuck stream going
    /// past any read timeout.
    pub fn events_within(mut self, limit: Duration) -> Vec<serde_json::Value> {
        let started = std::time::Instant::now();
        let mut out = Vec::new();
        while let Some(l) = self.next_line() {
            let v: serde_json::Value =
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad event line {l:?}: {e}"));
            if v["type"] != "keepalive" {
                out.push(v);
            }
            assert!(
                started.elapsed() < limit,
                "not done after {limit:?}: {out:?}"
            );
        }
        out
    }
}

impl Read for Streaming {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.reader.read(buf)
    }
}

impl Server {
    /// Starts `husk serve` on 127.0.0.1:0 with state in `state`.
    pub fn start(state: &Path) -> Server {
        Server::start_with(state, &[])
    }

    /// Starts `husk serve` with `args` added (e.g. `--workspace-upload-limit N`). Without an
    /// `--egress` among them, sandboxes get no network (`--egress off`): tests never change
    /// the host's routing unless they are about it.
    pub fn start_with(state: &Path, args: &[&str]) -> Server {
        Server::start_wrapped(&[], state, args)
    }

    /// [`Server::start_with`], run through `wrapper` (a command that ends by exec'ing its
    /// arguments in the same process, e.g. `unshare -m ... sh -c '...; exec "$@"' sh`), so
    /// the server's pid is the wrapper's.
    pub fn start_wrapped(wrapper: &[&str], state: &Path, args: &[&str]) -> Server {
        Server::spawn(wrapper, state, args, false)
    }

    /// [`Server::start_with`] as `husk serve` runs by default: its sandboxes outlive it (a
    /// stop, a crash) and the next server on `state` takes them up. Every other start passes
    /// `--destroy-on-exit`, so that a test's server takes its sandboxes with it.
    pub fn start_keeping(state: &Path, args: &[&str]) -> Server {
        Server::spawn(&[], state, args, true)
    }

    fn spawn(wrapper: &[&str], state: &Path, args: &[&str], keep: bool) -> Server {
        let egress: &[&str] = if args.iter().any(|a| a.starts_with("--egress")) {
            &[]
        } else {
            &["--egress", "off"]
        };
        let destroy: &[&str] = if keep { &[] } else { &["--destroy-on-exit"] };
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(HUSK);
                c
            }
            None => Command::new(HUSK),
        };
        let mut child = cmd
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .args(egress)
            .args(destroy)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // The log stays visible for failing tests.
                eprintln!("server: {line}");
                let _ = tx.send(line);
            }
        });
        let mut server = Server {
            child,
            port: 0,
            admin_key: String::new(),
            state: state.to_path_buf(),
            lines,
            startup: Vec::new(),
        };
        let line = loop {
            match server.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains("listening on http://127.0.0.1:") => break l,
                Ok(l) => server.startup.push(l),
                Err(e) => panic!("the server did not start listening: {e}"),
            }
        };
        let port = line.rsplit(':').next().unwrap();
        server.port = port.split_whitespace().next().unwrap().parse().unwrap();
        server.admin_key = std::fs::read_to_string(state.join("admin.key"))
            .unwrap()
            .trim()
            .to_owned();
        server
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The `husk serve` process (to signal it or wait for it).
    pub fn child(&mut self) -> &mut Child {
        &mut self.child
    }

    /// A crash: SIGKILL, and waits until it is gone.
    pub fn kill_hard(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// A crash of the server and its helper `helper` (its thread name, `husk-net`) together:
    /// the helper is SIGKILLed first. A server that dies alone closes its helpers' channels a
    /// moment before the kernel's parent-death SIGKILL reaches them, and a helper that sees its
    /// server gone cleans up if it gets the time; killing it first is the crash in which
    /// nothing does.
    pub fn kill_hard_with(mut self, helper: &str) {
        let server = self.child.id().to_string();
        let mut killed = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            // `pid (comm) state ppid ...`; the name may hold spaces, so split at its ")".
            let Some((head, tail)) = stat.rsplit_once(") ") else {
                continue;
            };
            let comm = head.split_once(" (").map_or("", |(_, c)| c);
            let ppid = tail.split_whitespace().nth(1).unwrap_or("");
            if comm == helper && ppid == server {
                let pid = entry.file_name().to_string_lossy().into_owned();
                let ok = Command::new("kill").args(["-KILL", &pid]).status().unwrap();
                assert!(ok.success(), "kill -KILL {pid}");
                killed.push(pid);
            }
        }
        assert!(!killed.is_empty(), "the server has no {helper} helper");
        // Dead (a zombie until the server reaps it, or gone) before the server goes.
        for pid in &killed {
            wait_for(Duration::from_secs(10), || {
                let state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map(|s| s.rsplit_once(") ").map(|(_, t)| t.chars().next()));
                match state {
                    Ok(Some(Some('Z'))) | Err(_) => Some(()),
                    _ => None,
                }
            })
            .unwrap_or_else(|| panic!("{helper} ({pid}) outlived SIGKILL"));
        }
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Waits (bounded) for a log line containing `text`; returns it.
    pub fn wait_line(&self, text: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains(text) => return l,
                Ok(_) => {}
                Err(e) => panic!("no log line with {text:?}: {e}"),
            }
        }
    }

    /// A key of another team (made with the CLI on the same state directory).
    pub fn key_for(&self, team: &str) -> String {
        let out = Command::new(HUSK)
            .args(["key", "create", "--team", team, "--state-dir"])
            .arg(&self.state)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Sends a request on a fresh connection: Host (unless `headers` name one), the body's
    /// length (none when `headers` say chunked: the body goes in chunks), and `headers`.
    fn send(
        &self,
        version: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        let chunked = headers.iter().any(|(k, v)| {
            k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
        });
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        let mut head = format!("{method} {path} {version}\r\n");
        // The caller's Host (host-based routing) replaces the default.
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str("Host: 127.0.0.1\r\n");
        }
        if !chunked {
            head.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        if version == "HTTP/1.1" {
            head.push_str("Connection: close\r\n");
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        if chunked {
            for chunk in body.chunks(64 << 10) {
                s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .unwrap();
                s.write_all(chunk).unwrap();
                s.write_all(b"\r\n").unwrap();
            }
            s.write_all(b"0\r\n\r\n").unwrap();
        } else {
            s.write_all(body).unwrap();
        }
        s
    }

    /// One request with `key` (X-API-Key) and a JSON content type, read in full.
    pub fn request(&self, method: &str, path: &str, key: &str, body: impl AsRef<[u8]>) -> Reply {
        let headers = [("X-API-Key", key), ("Content-Type", "application/json")];
        self.request_with(method, path, &headers, body)
    }

    /// One request with exactly `headers` (besides Host, Content-Length and Connection: close),
    /// read in full.
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: impl AsRef<[u8]>,
    ) -> Reply {
        let mut s = self.send("HTTP/1.1", method, path, headers, body.as_ref());
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
        let mut body = raw[split + 4..].to_vec();
        if head.contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        Reply {
            status: head[9..12].parse().unwrap(),
            headers: head,
            body,
        }
    }

    /// A JSON request with the admin key.
    pub fn admin(&self, method: &str, path: &str, body: serde_json::Value) -> Reply {
        let b = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        self.request(method, path, &self.admin_key, b)
    }

    /// A request with `key` and a JSON content type whose body is read as it streams.
    pub fn stream(&self, method: &str, path: &str, key: &str, body: &[u8]) -> Streaming {
        let headers = [("X-API-Key", key), ("Content-Type", "application/json")];
        self.stream_with(method, path, &headers, body)
    }

    /// POSTs the JSON `spec` to a streaming endpoint (a run or a batch) with `key`, expects
    /// 200, and reads its NDJSON events to the end (keepalives dropped).
    pub fn post_events(
        &self,
        path: &str,
        key: &str,
        spec: &serde_json::Value,
    ) -> Vec<serde_json::Value> {
        let s = self.stream("POST", path, key, spec.to_string().as_bytes());
        assert_eq!(s.status, 200, "{}", s.headers);
        s.events()
    }

    /// A request with exactly `headers` whose body is read as it streams.
    pub fn stream_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Streaming {
        let s = self.send("HTTP/1.0", method, path, headers, body);
        let mut reader = BufReader::new(s);
        let mut headers = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                break;
            }
            headers.push_str(&line);
        }
        Streaming {
            status: headers[9..12].parse().unwrap(),
            headers,
            reader,
        }
    }

    /// Sandbox ids the server lists for `key`'s team (E2B's list).
    pub fn sandboxes(&self, key: &str) -> Vec<String> {
        let r = self.request("GET", "/v2/sandboxes", key, b"");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sandboxID"].as_str().unwrap().to_owned())
            .collect()
    }
}

/// A chunked body, put back together; panics on a body that ends without its last chunk.
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("truncated chunked body");
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 4 + size..];
    }
}
