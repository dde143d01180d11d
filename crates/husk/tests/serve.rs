//! `husk serve` as an operator runs it: first start, an orderly stop (SIGTERM) and a crash
//! (SIGKILL) followed by a restart, checked from the host: no process, cgroup, uid slot,
//! registry entry or mount of any of its sandboxes may survive.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{assert_gone, sandbox_pids, signal_process, wait_for, TempDir, HUSK};

/// A running `husk serve`; killed on drop (a failing test must not leave it behind).
struct Server {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn start(state: &TempDir) -> Server {
        let mut child = Command::new(HUSK)
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state.path())
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
            lines,
        };
        let line = server.wait_line("listening on http://127.0.0.1:");
        let port = line.rsplit(':').next().unwrap();
        server.port = port.split_whitespace().next().unwrap().parse().unwrap();
        server
    }

    /// Waits (bounded) for a log line containing `text`; returns it.
    fn wait_line(&self, text: &str) -> String {
        loop {
            match self.lines.recv_timeout(Duration::from_secs(30)) {
                Ok(l) if l.contains(text) => return l,
                Ok(_) => {}
                Err(e) => panic!("no log line with {text:?}: {e}"),
            }
        }
    }

    /// One HTTP/1.1 request on a fresh connection: (status, body).
    fn request(&self, method: &str, path: &str, key: &str, body: &str) -> (u16, String) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-KEY: {key}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).unwrap();
        let status = resp[9..12].parse().unwrap();
        let body = resp.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, body.to_string())
    }

    fn create(&self, key: &str) {
        let (status, body) = self.request("POST", "/v2/sandboxes", key, r#"{"templateID":"base"}"#);
        assert_eq!(status, 201, "{body}");
    }
}

/// The runtime ids of the sandboxes the server has recorded.
fn runtime_ids(state: &TempDir) -> Vec<String> {
    husk_core::store::Store::open(state.path())
        .unwrap()
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .map(|r| r.runtime_id)
        .collect()
}

#[test]
fn serve_recovers_from_a_crash_and_stops_cleanly() {
    let state = TempDir::new("serve");
    let server = Server::start(&state);
    let key_file = state.path().join("admin.key");
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        server.request("GET", "/v2/sandboxes", "e2b_wrong", "").0,
        401
    );
    server.create(&key);
    server.create(&key);
    let crashed = runtime_ids(&state);
    assert_eq!(crashed.len(), 2);
    for id in &crashed {
        assert!(!sandbox_pids(id).is_empty(), "sandbox {id} has no process");
    }

    // A crash: the spawner and every sandbox's PID 1 die with the server (parent-death
    // signals); what they leave on the host is cleaned up at the next start.
    drop(server);
    for id in &crashed {
        wait_for(Duration::from_secs(10), || {
            sandbox_pids(id).is_empty().then_some(())
        })
        .unwrap_or_else(|| panic!("processes of {id} outlived the server"));
    }
    let mut server = Server::start(&state);
    for id in &crashed {
        assert_gone(id);
    }
    assert!(
        runtime_ids(&state).is_empty(),
        "records of crashed sandboxes kept"
    );

    // An orderly stop destroys everything before the server exits.
    server.create(&key);
    let live = runtime_ids(&state);
    assert_eq!(live.len(), 1);
    signal_process(&server.child, "TERM");
    server.wait_line("husk: stopped");
    let status = wait_for(Duration::from_secs(30), || server.child.try_wait().unwrap())
        .expect("husk serve did not exit after SIGTERM");
    assert!(status.success(), "{status}");
    assert_gone(&live[0]);
    assert!(runtime_ids(&state).is_empty());
}

#[test]
fn secrets_api_stores_lists_and_removes_without_ever_returning_a_value() {
    let state = TempDir::new("serve-secrets");
    let server = Server::start(&state);
    let admin = std::fs::read_to_string(state.path().join("admin.key"))
        .unwrap()
        .trim()
        .to_string();
    let out = Command::new(HUSK)
        .args(["key", "create", "--team", "other", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let other = String::from_utf8(out.stdout).unwrap().trim().to_string();
    const VALUE: &str = "sk-http-9f8e7d6c5b4a-never-returned";
    assert_eq!(
        server
            .request("PUT", "/husk/v1/secrets/API_KEY", &admin, VALUE)
            .0,
        204
    );
    let (status, body) = server.request("GET", "/husk/v1/secrets", &admin, "");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("\"API_KEY\"") && !body.contains(VALUE),
        "{body}"
    );
    // Another team: not listed, not removable.
    let (_, body) = server.request("GET", "/husk/v1/secrets", &other, "");
    assert!(!body.contains("API_KEY"), "{body}");
    assert_eq!(
        server
            .request("DELETE", "/husk/v1/secrets/API_KEY", &other, "")
            .0,
        404
    );
    // Bad input: clear errors, nothing stored.
    let (status, body) = server.request("PUT", "/husk/v1/secrets/bad-name", &admin, "v");
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("invalid secret name"), "{body}");
    let big = "x".repeat(64 * 1024 + 1);
    assert_eq!(
        server
            .request("PUT", "/husk/v1/secrets/BIG", &admin, &big)
            .0,
        413
    );
    assert_eq!(
        server
            .request("PUT", "/husk/v1/secrets/EMPTY", &admin, "")
            .0,
        400
    );
    assert_eq!(
        server.request("GET", "/husk/v1/secrets", "e2b_bogus", "").0,
        401
    );
    // The CLI sees what the API stored (one database, one master key).
    let out = Command::new(HUSK)
        .args(["secret", "list", "--team", "default", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("API_KEY") && !listed.contains("BIG"),
        "{listed}"
    );
    // Nothing in the state directory holds the value in clear.
    for e in std::fs::read_dir(state.path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
                "{} holds the secret in clear",
                p.display()
            );
        }
    }
    assert_eq!(
        server
            .request("DELETE", "/husk/v1/secrets/API_KEY", &admin, "")
            .0,
        204
    );
    assert_eq!(
        server
            .request("DELETE", "/husk/v1/secrets/API_KEY", &admin, "")
            .0,
        404
    );
}
