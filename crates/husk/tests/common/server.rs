//! A real `husk serve` for end-to-end tests: started on 127.0.0.1:0 with its own state
//! directory, stopped with SIGTERM when dropped (it destroys its sandboxes; SIGKILL after 5 s),
//! and plain HTTP/1.0 requests to it (HTTP/1.0: responses are never chunked, so a streamed body
//! can be read line by line).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::HUSK;

pub struct Server {
    child: Child,
    pub port: u16,
    pub admin_key: String,
    pub state: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
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

    pub fn header(&self, name: &str) -> Option<String> {
        self.headers.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
    }
}

/// A response whose body is read as it arrives.
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
    pub fn events(mut self) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        while let Some(l) = self.next_line() {
            let v: serde_json::Value =
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad event line {l:?}: {e}"));
            if v["type"] != "keepalive" {
                out.push(v);
            }
        }
        out
    }
}

impl Server {
    /// Starts `husk serve` on 127.0.0.1:0 with state in `state`.
    pub fn start(state: &Path) -> Server {
        let mut child = Command::new(HUSK)
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, lines) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            port: 0,
            admin_key: String::new(),
            state: state.to_path_buf(),
            lines,
        };
        let line = server.wait_line("listening on http://127.0.0.1:");
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

    fn send(&self, method: &str, path: &str, key: &str, body: &[u8], extra: &str) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nX-API-Key: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n{extra}\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s
    }

    /// One request, read in full.
    pub fn request(&self, method: &str, path: &str, key: &str, body: &[u8]) -> Reply {
        let mut s = self.send(method, path, key, body, "");
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("a response head");
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        Reply {
            status: head[9..12].parse().unwrap(),
            headers: head,
            body: raw[split + 4..].to_vec(),
        }
    }

    /// A JSON request with the admin key.
    pub fn admin(&self, method: &str, path: &str, body: serde_json::Value) -> Reply {
        let b = if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        };
        self.request(method, path, &self.admin_key, &b)
    }

    /// A request whose body is read as it streams.
    pub fn stream(&self, method: &str, path: &str, key: &str, body: &[u8]) -> Streaming {
        let s = self.send(method, path, key, body, "");
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
