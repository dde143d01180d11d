//! A secret given to one command stays with that command, through a real `husk serve` and its
//! in-sandbox API (Connect-JSON, as the E2B SDKs speak it): another command of the same sandbox
//! cannot read it from `/proc/PID/environ` (as the user, as root, through `sudo`), while the
//! command itself can and `kill` across commands still works; the process list shows the
//! `husk-secret://` reference, never the value; PID 1's environment does not hold it.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{sandbox_pids, wait_for, TempDir, HUSK};
use serde_json::{json, Value};

const SECRET: &str = "BARRIER_KEY";
const VALUE: &str = "sk-barrier-5e1d7c0a9b-not-for-siblings";
/// `root:` in Basic auth: the call runs as the sandbox's root.
const AS_ROOT: &str = "Basic cm9vdDo=";

/// A running `husk serve`; killed on drop (a failing test must not leave it behind).
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer, body de-chunked.
struct Answer {
    status: u16,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn expect(self, status: u16) -> Answer {
        assert_eq!(self.status, status, "{}", self.text());
        self
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
}

/// Splits a chunked body into its data; stops at an incomplete chunk (`complete` false).
fn dechunk(mut b: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap().trim(), 16)
            .unwrap_or_else(|_| panic!("bad chunk size {size_text:?}"));
        if size == 0 {
            return (out, true);
        }
        if b.len() < eol + 2 + size {
            return (out, false);
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = b.get(eol + 4 + size..).unwrap_or_default();
    }
}

/// Splits a Connect stream body into its envelopes' JSON payloads (end-stream included).
fn envelopes(mut b: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while b.len() >= 5 {
        let len = u32::from_be_bytes(b[1..5].try_into().unwrap()) as usize;
        if b.len() < 5 + len {
            break;
        }
        let v = serde_json::from_slice(&b[5..5 + len]).unwrap_or(Value::Null);
        out.push((b[0], v));
        b = &b[5 + len..];
    }
    out
}

/// Standard base64 (Connect-JSON's encoding of bytes), padding optional.
fn base64(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let (mut out, mut acc, mut bits) = (Vec::new(), 0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let v = ALPHABET.iter().position(|&a| a == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

fn envelope(v: &Value) -> Vec<u8> {
    let json = v.to_string();
    let mut b = vec![0u8];
    b.extend_from_slice(&(json.len() as u32).to_be_bytes());
    b.extend_from_slice(json.as_bytes());
    b
}

/// Where a request goes: husk's own API, or a sandbox's in-sandbox API.
enum To<'a> {
    Api(&'a str),
    Sandbox {
        id: &'a str,
        token: &'a str,
        user: Option<&'a str>,
    },
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
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("server: {line}");
                let _ = tx.send(line);
            }
        });
        let mut server = Server { child, port: 0 };
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("husk serve never said where it listens");
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                server.port = rest.split_whitespace().next().unwrap().parse().unwrap();
                return server;
            }
        }
    }

    /// Sends one request on a fresh connection; returns the connection.
    fn send(&self, method: &str, path: &str, to: &To<'_>, ctype: &str, body: &[u8]) -> TcpStream {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {ctype}\r\n\
             Content-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        match to {
            To::Api(key) => head.push_str(&format!("X-API-KEY: {key}\r\n")),
            To::Sandbox { id, token, user } => {
                head.push_str(&format!(
                    "E2b-Sandbox-Id: {id}\r\nX-Access-Token: {token}\r\n"
                ));
                if let Some(auth) = user {
                    head.push_str(&format!("Authorization: {auth}\r\n"));
                }
            }
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s
    }

    fn request(&self, method: &str, path: &str, to: &To<'_>, ctype: &str, body: &[u8]) -> Answer {
        let mut s = self.send(method, path, to, ctype, body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("no end of headers");
        let headers = String::from_utf8_lossy(&raw[..split]).to_lowercase();
        let mut body = raw[split + 4..].to_vec();
        if headers.contains("transfer-encoding: chunked") {
            body = dechunk(&body).0;
        }
        Answer {
            status: headers[9..12].parse().unwrap(),
            body,
        }
    }

    fn api(&self, method: &str, path: &str, key: &str, body: &str) -> Answer {
        self.request(
            method,
            path,
            &To::Api(key),
            "application/json",
            body.as_bytes(),
        )
    }
}

/// A sandbox of the server, driven through its in-sandbox API.
struct Sandbox<'a> {
    server: &'a Server,
    key: String,
    id: String,
    token: String,
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        let _ = self
            .server
            .api("DELETE", &format!("/sandboxes/{}", self.id), &self.key, "");
    }
}

impl Sandbox<'_> {
    fn to(&self, user: Option<&'static str>) -> To<'_> {
        To::Sandbox {
            id: &self.id,
            token: &self.token,
            user,
        }
    }

    fn start_body(cmd: &str, args: &[&str], envs: Value) -> Vec<u8> {
        envelope(&json!({
            "process": {"cmd": cmd, "args": args, "envs": envs},
            "stdin": false,
        }))
    }

    /// Starts a command and returns its pid once started, leaving it running (the stream is
    /// dropped; the process keeps running).
    fn spawn(&self, cmd: &str, args: &[&str], envs: Value) -> u32 {
        let mut s = self.server.send(
            "POST",
            "/process.Process/Start",
            &self.to(None),
            "application/connect+json",
            &Self::start_body(cmd, args, envs),
        );
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "stream ended before start: {}",
                String::from_utf8_lossy(&raw)
            );
            raw.extend_from_slice(&buf[..n]);
            let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let (body, _) = dechunk(&raw[split + 4..]);
            if let Some((_, first)) = envelopes(&body).into_iter().next() {
                let pid = first["event"]["start"]["pid"].as_u64();
                return pid.unwrap_or_else(|| panic!("no start event: {first}")) as u32;
            }
        }
    }

    /// Runs a command to its end as `user`; returns its exit code and its output (stdout and
    /// stderr, in order).
    fn run(
        &self,
        user: Option<&'static str>,
        cmd: &str,
        args: &[&str],
        envs: Value,
    ) -> (i64, String) {
        let answer = self
            .server
            .request(
                "POST",
                "/process.Process/Start",
                &self.to(user),
                "application/connect+json",
                &Self::start_body(cmd, args, envs),
            )
            .expect(200);
        let events = envelopes(&answer.body);
        let mut output = Vec::new();
        for (_, v) in &events {
            for stream in ["stdout", "stderr"] {
                if let Some(data) = v["event"]["data"][stream].as_str() {
                    output.extend(base64(data));
                }
            }
        }
        let end = events
            .iter()
            .find_map(|(_, v)| v["event"].get("end").cloned())
            .unwrap_or_else(|| panic!("{cmd} {args:?}: no end event in {events:?}"));
        let code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0);
        (code, String::from_utf8_lossy(&output).into_owned())
    }

    fn sh(&self, user: Option<&'static str>, script: &str) -> (i64, String) {
        self.run(user, "/bin/sh", &["-c", script], json!({}))
    }

    fn list(&self) -> Answer {
        self.server
            .request(
                "POST",
                "/process.Process/List",
                &self.to(None),
                "application/json",
                b"{}",
            )
            .expect(200)
    }
}

/// Host pid of the process with pid `ns_pid` in the sandbox with runtime id `runtime_id`.
fn host_pid(runtime_id: &str, ns_pid: u32) -> Option<i32> {
    sandbox_pids(runtime_id).into_iter().find_map(|(pid, _)| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let nspid = status.lines().find(|l| l.starts_with("NSpid:"))?;
        (nspid.split_whitespace().last()? == ns_pid.to_string()).then_some(pid)
    })
}

#[test]
fn a_commands_secret_is_out_of_reach_of_the_other_commands() {
    let state = TempDir::new("secret-barrier");
    let server = Server::start(&state);
    let key = std::fs::read_to_string(state.path().join("admin.key"))
        .unwrap()
        .trim()
        .to_string();
    server
        .api("PUT", &format!("/husk/v1/secrets/{SECRET}"), &key, VALUE)
        .expect(204);
    let created = server
        .api(
            "POST",
            "/sandboxes",
            &key,
            &json!({
                "templateID": "base",
                "envVars": {"FROM_SANDBOX": format!("husk-secret://{SECRET}")},
            })
            .to_string(),
        )
        .expect(201)
        .json();
    let sb = Sandbox {
        server: &server,
        key: key.clone(),
        id: created["sandboxID"].as_str().unwrap().to_string(),
        token: created["envdAccessToken"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    };
    let runtime_id = husk_core::store::Store::open(state.path())
        .unwrap()
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .map(|r| r.runtime_id)
        .next()
        .expect("no sandbox record");

    // Command A holds the secret (its own env and the sandbox's reference).
    let reference = format!("husk-secret://{SECRET}");
    let a = sb.spawn("/bin/sleep", &["60"], json!({ "S": reference }));
    // From the host: A's environment does hold the value (so the checks below mean
    // something); PID 1's (the agent's) does not.
    let a_host = wait_for(Duration::from_secs(10), || host_pid(&runtime_id, a))
        .expect("command A not found on the host");
    let a_env = std::fs::read(format!("/proc/{a_host}/environ")).unwrap();
    let a_env = String::from_utf8_lossy(&a_env);
    assert!(
        a_env.contains(&format!("S={VALUE}\0")),
        "A's environment: {a_env:?}"
    );
    assert!(
        a_env.contains(&format!("FROM_SANDBOX={VALUE}\0")),
        "{a_env:?}"
    );
    let pid1 = host_pid(&runtime_id, 1).expect("no PID 1 on the host");
    let pid1_env = std::fs::read(format!("/proc/{pid1}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&pid1_env).contains(VALUE),
        "the agent's environment holds the secret"
    );

    // The process list shows the reference, never the value.
    let list = sb.list();
    assert!(
        !list.text().contains(VALUE),
        "List returns the secret: {}",
        list.text()
    );
    let listed = list.json()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(u64::from(a)))
        .cloned()
        .unwrap_or_else(|| panic!("A ({a}) not listed: {}", list.text()));
    assert_eq!(
        listed["config"]["envs"],
        json!({ "S": reference }),
        "{listed}"
    );

    // Command B cannot read A's environment: as the user, as root, through sudo. Nor PID 1's.
    let environ = format!("/proc/{a}/environ");
    for (who, user, cmd) in [
        ("user", None, format!("cat {environ}")),
        ("root", Some(AS_ROOT), format!("cat {environ}")),
        ("sudo", None, format!("sudo cat {environ}")),
        ("user, mem", None, format!("head -c1 /proc/{a}/mem")),
        ("root, maps", Some(AS_ROOT), format!("cat /proc/{a}/maps")),
        (
            "root, fds",
            Some(AS_ROOT),
            format!("readlink -v /proc/{a}/fd/1"),
        ),
        ("root, fd", Some(AS_ROOT), format!("cat /proc/{a}/fd/0")),
        (
            "root, PID 1",
            Some(AS_ROOT),
            "cat /proc/1/environ".to_string(),
        ),
    ] {
        let (code, output) = sb.sh(user, &cmd);
        assert_ne!(code, 0, "{who}: `{cmd}` succeeded: {output}");
        assert!(output.contains("Permission denied"), "{who}: {output}");
        assert!(!output.contains(VALUE), "{who}: {output}");
    }

    // A command reads its own environment (and its children's): same command, same domain.
    let script = format!(
        "grep -qzx 'S={VALUE}' /proc/$$/environ && grep -qzx 'S={VALUE}' /proc/self/environ"
    );
    let (code, output) = sb.run(None, "/bin/sh", &["-c", &script], json!({ "S": reference }));
    assert_eq!(
        code, 0,
        "a command cannot read its own environment: {output}"
    );

    // Signals still cross commands: B kills A.
    let (code, output) = sb.sh(None, &format!("kill {a}"));
    assert_eq!(code, 0, "kill from another command failed: {output}");
    wait_for(Duration::from_secs(10), || {
        let list = sb.list().json();
        // An empty list has no `processes` at all (proto3 JSON).
        let running = list["processes"]
            .as_array()
            .is_some_and(|l| l.iter().any(|p| p["pid"].as_u64() == Some(u64::from(a))));
        (!running).then_some(())
    })
    .expect("A still runs after kill");

    drop(sb);
    server
        .api("DELETE", &format!("/husk/v1/secrets/{SECRET}"), &key, "")
        .expect(204);
    wait_for(Duration::from_secs(10), || {
        sandbox_pids(&runtime_id).is_empty().then_some(())
    })
    .expect("the sandbox's processes outlived it");
}
