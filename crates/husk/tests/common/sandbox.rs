//! A sandbox of a real `husk serve` (made with E2B's `POST /sandboxes`, killed when dropped),
//! driven through its in-sandbox process API as the E2B SDKs drive it: Connect-JSON, whose
//! stream bodies are envelopes (a flags byte, the 4-byte big-endian length, the JSON) and
//! whose bytes are base64.

use std::io::Read;

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use serde_json::{json, Value};

use super::server::Server;

const START: &str = "/process.Process/Start";
const CONNECT_JSON: &str = "application/connect+json";

/// Standard base64 with padding optional, as Connect-JSON reads bytes.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// One Connect envelope (flags 0) holding `v`.
pub fn envelope(v: &Value) -> Vec<u8> {
    let json = v.to_string();
    let mut b = vec![0u8];
    b.extend_from_slice(&(json.len() as u32).to_be_bytes());
    b.extend_from_slice(json.as_bytes());
    b
}

/// Splits a Connect stream body into its envelopes' flags and JSON payloads (end-stream
/// included; a payload that is not JSON is `Null`); an incomplete last envelope is left out.
pub fn envelopes(mut b: &[u8]) -> Vec<(u8, Value)> {
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

/// Connect-JSON bytes (standard base64, padding optional).
pub fn decode_base64(text: &str) -> Vec<u8> {
    BASE64
        .decode(text)
        .unwrap_or_else(|e| panic!("bad base64 {text:?}: {e}"))
}

/// The `Authorization` value that makes an in-sandbox call run as `user` (Basic, no password).
pub fn basic_auth(user: &str) -> String {
    format!("Basic {}", STANDARD.encode(format!("{user}:")))
}

/// Header pairs as [`Server::request_with`] and [`Server::stream_with`] take them.
pub fn pairs<'h>(h: &'h [(&'static str, String)]) -> Vec<(&'static str, &'h str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// What a command run to its end did.
#[derive(Debug)]
pub struct Ran {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
    /// stdout and stderr, in the order they came.
    pub output: String,
}

/// A sandbox of the server; killed when dropped.
pub struct Sandbox<'a> {
    pub server: &'a Server,
    /// The API key it was created with (and is killed with).
    pub key: String,
    pub id: String,
    /// Its `envdAccessToken` (`X-Access-Token` of in-sandbox calls).
    pub token: String,
    /// The create answer.
    pub created: Value,
}

impl Drop for Sandbox<'_> {
    fn drop(&mut self) {
        let _ = self
            .server
            .request("DELETE", &format!("/sandboxes/{}", self.id), &self.key, "");
    }
}

impl<'a> Sandbox<'a> {
    /// `POST /sandboxes` with `body` and `key`; expects 201.
    pub fn create(server: &'a Server, key: &str, body: Value) -> Sandbox<'a> {
        let created = server
            .request("POST", "/sandboxes", key, body.to_string())
            .expect(201)
            .json();
        Sandbox {
            server,
            key: key.to_owned(),
            id: created["sandboxID"].as_str().unwrap().to_owned(),
            token: created["envdAccessToken"].as_str().unwrap().to_owned(),
            created,
        }
    }

    /// The headers of an in-sandbox API call as `user` ("root", "user"; none: no
    /// `Authorization`, the default user).
    pub fn headers(&self, user: Option<&str>, content_type: &str) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("Content-Type", content_type.to_owned()),
            ("E2b-Sandbox-Id", self.id.clone()),
            ("X-Access-Token", self.token.clone()),
        ];
        if let Some(user) = user {
            h.push(("Authorization", basic_auth(user)));
        }
        h
    }

    fn start_body(cmd: &str, args: &[&str], envs: &[(&str, &str)]) -> Vec<u8> {
        let envs: serde_json::Map<String, Value> = envs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Value::from(*v)))
            .collect();
        envelope(&json!({
            "process": {"cmd": cmd, "args": args, "envs": envs},
            "stdin": false,
        }))
    }

    /// Starts `cmd args` (with `envs` added to its environment) as the default user; returns
    /// its pid once its start event arrived. The stream is dropped; the process keeps running.
    pub fn spawn(&self, cmd: &str, args: &[&str], envs: &[(&str, &str)]) -> u32 {
        let mut s = self.server.stream_with(
            "POST",
            START,
            &pairs(&self.headers(None, CONNECT_JSON)),
            &Self::start_body(cmd, args, envs),
        );
        assert_eq!(s.status, 200, "{}", s.headers);
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

    /// Runs `cmd args` (with `envs`) to its end as `user` ("root", "user"; none: the default
    /// user).
    pub fn run(&self, user: Option<&str>, cmd: &str, args: &[&str], envs: &[(&str, &str)]) -> Ran {
        let answer = self
            .server
            .request_with(
                "POST",
                START,
                &pairs(&self.headers(user, CONNECT_JSON)),
                Self::start_body(cmd, args, envs),
            )
            .expect(200);
        let events = envelopes(&answer.body);
        let (mut stdout, mut stderr, mut output) = (Vec::new(), Vec::new(), Vec::new());
        for (_, v) in &events {
            for (stream, into) in [("stdout", &mut stdout), ("stderr", &mut stderr)] {
                if let Some(data) = v["event"]["data"][stream].as_str() {
                    let bytes = decode_base64(data);
                    output.extend_from_slice(&bytes);
                    into.extend(bytes);
                }
            }
        }
        let end = events
            .iter()
            .find_map(|(_, v)| v["event"].get("end").cloned())
            .unwrap_or_else(|| panic!("{cmd} {args:?}: no end event in {events:?}"));
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ran {
            code: end.get("exitCode").and_then(Value::as_i64).unwrap_or(0),
            stdout: text(&stdout),
            stderr: text(&stderr),
            output: text(&output),
        }
    }
}
