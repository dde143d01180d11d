//! A secret given to one command stays with that command, through a real `husk serve` and its
//! in-sandbox API (Connect-JSON, as the E2B SDKs speak it): another command of the same sandbox
//! cannot read it from `/proc/PID/environ` (as the user, as root, through `sudo`), while the
//! command itself can and `kill` across commands still works; the process list shows the
//! `husk-secret://` reference, never the value; PID 1's environment does not hold it.

mod common;

use std::io::Read;
use std::time::Duration;

use common::server::{Reply, Server};
use common::{sandbox_pids, wait_for, TempDir};
use serde_json::{json, Value};

const SECRET: &str = "BARRIER_KEY";
const VALUE: &str = "sk-barrier-5e1d7c0a9b-not-for-siblings";
/// `root:` in Basic auth: the call runs as the sandbox's root.
const AS_ROOT: &str = "Basic cm9vdDo=";

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
            .request("DELETE", &format!("/sandboxes/{}", self.id), &self.key, "");
    }
}

impl Sandbox<'_> {
    /// The headers of an in-sandbox API call as `user` (Basic auth; none: the default user).
    fn headers<'h>(&'h self, user: Option<&'h str>, ctype: &'h str) -> Vec<(&'h str, &'h str)> {
        let mut h = vec![
            ("Content-Type", ctype),
            ("E2b-Sandbox-Id", self.id.as_str()),
            ("X-Access-Token", self.token.as_str()),
        ];
        if let Some(auth) = user {
            h.push(("Authorization", auth));
        }
        h
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
        let mut s = self.server.stream_with(
            "POST",
            "/process.Process/Start",
            &self.headers(None, "application/connect+json"),
            &Self::start_body(cmd, args, envs),
        );
        let mut body = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = s.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "stream ended before start: {}",
                String::from_utf8_lossy(&body)
            );
            body.extend_from_slice(&buf[..n]);
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
            .request_with(
                "POST",
                "/process.Process/Start",
                &self.headers(user, "application/connect+json"),
                Self::start_body(cmd, args, envs),
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

    fn list(&self) -> Reply {
        self.server
            .request_with(
                "POST",
                "/process.Process/List",
                &self.headers(None, "application/json"),
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
    let server = Server::start(state.path());
    let key = server.admin_key.clone();
    server
        .request("PUT", &format!("/husk/v1/secrets/{SECRET}"), &key, VALUE)
        .expect(204);
    let created = server
        .request(
            "POST",
            "/sandboxes",
            &key,
            json!({
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
        .request("DELETE", &format!("/husk/v1/secrets/{SECRET}"), &key, "")
        .expect(204);
    wait_for(Duration::from_secs(10), || {
        sandbox_pids(&runtime_id).is_empty().then_some(())
    })
    .expect("the sandbox's processes outlived it");
}
