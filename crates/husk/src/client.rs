//! A small client of husk's native HTTP API (`/husk/v1/...`), for the commands that drive a
//! server: `husk run --server` and `husk batch`.
//!
//! The server is `--server URL`, else `$HUSK_SERVER`, else [`DEFAULT_SERVER`]. The key is never
//! taken from the command line (argv is readable by every local user): `$HUSK_API_KEY`, else
//! `$E2B_API_KEY`, else the admin key in the state directory (`STATE_DIR/admin.key`) when it is
//! readable. Streamed answers are NDJSON (one JSON object per line), read with a bounded line
//! buffer; the server's errors are JSON `{"code", "message"}` and are shown by their message.

use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use zeroize::Zeroizing;

/// Where a server is when nothing says otherwise (`husk serve`'s default listen address).
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:3000";

/// Longest line of a streamed answer: a batch's final record with every item fits well.
pub const MAX_LINE: usize = 16 << 20;

/// Silence after which a stream is taken for dead (the server sends a keepalive every 15 s).
const STREAM_SILENCE: Duration = Duration::from_secs(90);

/// Time to connect to the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Time a plain (not streamed) request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The server URL: the flag, else `$HUSK_SERVER`, else [`DEFAULT_SERVER`].
pub fn server_url(flag: Option<&str>) -> String {
    flag.map(str::to_owned)
        .or_else(|| std::env::var("HUSK_SERVER").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| DEFAULT_SERVER.to_owned())
}

/// The API key: `$HUSK_API_KEY`, else `$E2B_API_KEY`, else `STATE_DIR/admin.key`.
pub fn api_key(state_dir: Option<&Path>) -> Result<Zeroizing<String>> {
    for var in ["HUSK_API_KEY", "E2B_API_KEY"] {
        if let Ok(v) = std::env::var(var) {
            let v = v.trim();
            if !v.is_empty() {
                return Ok(Zeroizing::new(v.to_owned()));
            }
        }
    }
    let dir = state_dir.unwrap_or(Path::new(husk_core::store::DEFAULT_STATE_DIR));
    let file = dir.join("admin.key");
    match std::fs::read_to_string(&file) {
        Ok(text) => {
            let text = Zeroizing::new(text);
            let key = text.trim();
            if key.is_empty() {
                bail!("{} is empty", file.display());
            }
            Ok(Zeroizing::new(key.to_owned()))
        }
        Err(e) => bail!(
            "no API key: set HUSK_API_KEY (or E2B_API_KEY), or make {} readable \
             (--state-dir names another state directory): {e}",
            file.display()
        ),
    }
}

/// A client of one server with one key.
pub struct Client {
    http: reqwest::Client,
    /// The server's URL without a trailing `/`.
    base: String,
    key: Zeroizing<String>,
}

/// A streamed answer: NDJSON events, and the id of the run or batch it is about.
pub struct EventStream {
    resp: reqwest::Response,
    buf: Vec<u8>,
    /// The `x-husk-id` header: the run's or batch's id.
    pub id: Option<String>,
    done: bool,
}

impl Client {
    pub fn new(server: &str, key: Zeroizing<String>) -> Result<Client> {
        let base = server.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("invalid server URL {server:?}: expected http://HOST:PORT or https://...");
        }
        // The server is named explicitly; a proxy from the environment would be a surprise
        // (and most point at the internet, not at a local husk).
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .no_proxy()
        };
        let http = match builder().build() {
            Ok(c) => c,
            // A host without CA certificates (a minimal container): reqwest's TLS set-up
            // refuses to start even for plain HTTP (reqwest#2988). A plain-HTTP server needs
            // none: a client that follows no redirect, so it never speaks TLS at all, and so
            // never needs to verify a certificate.
            Err(_) if base.starts_with("http://") => builder()
                .redirect(reqwest::redirect::Policy::none())
                .tls_danger_accept_invalid_certs(true)
                .build()
                .context("HTTP client")?,
            Err(e) => {
                return Err(anyhow::Error::new(e).context(
                    "HTTP client (for an https:// server, install the CA certificates: apt-get install ca-certificates)",
                ))
            }
        };
        Ok(Client { http, base, key })
    }

    /// A client from the flags: `--server` (or `$HUSK_SERVER`) and the key as documented.
    pub fn from_flags(server: Option<&str>, state_dir: Option<&Path>) -> Result<Client> {
        let url = server_url(server);
        Client::new(&url, api_key(state_dir)?)
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.base))
            .header("X-API-Key", self.key.as_str())
    }

    fn send_error(&self, e: reqwest::Error) -> anyhow::Error {
        if e.is_connect() {
            anyhow!(
                "cannot reach the husk server at {} (--server URL or HUSK_SERVER): {}",
                self.base,
                root_cause(&e)
            )
        } else if e.is_timeout() {
            anyhow!("the husk server at {} did not answer in time", self.base)
        } else {
            anyhow!("request to {} failed: {}", self.base, root_cause(&e))
        }
    }

    /// POSTs `body` and returns the streamed events (an error for any status but 2xx).
    pub async fn post_stream<B: Serialize>(&self, path: &str, body: &B) -> Result<EventStream> {
        let resp = self
            .request(reqwest::Method::POST, path)
            .header("Accept", "application/x-ndjson")
            .json(body)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        let resp = check(resp).await?;
        let id = resp
            .headers()
            .get("x-husk-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok(EventStream {
            resp,
            buf: Vec::new(),
            id,
            done: false,
        })
    }

    /// GETs a JSON list and the `X-Next-Token` of the next page, if any.
    pub async fn get_json_paged(
        &self,
        path: &str,
    ) -> Result<(Vec<serde_json::Value>, Option<String>)> {
        let resp = self.get_ok(path).await?;
        let next = resp
            .headers()
            .get("x-next-token")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Ok((self.json_of(resp, path).await?, next))
    }

    /// A GET answered 2xx (an error with the server's message otherwise).
    async fn get_ok(&self, path: &str) -> Result<reqwest::Response> {
        let resp = self
            .request(reqwest::Method::GET, path)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        check(resp).await
    }

    /// The JSON body of a GET's answer.
    async fn json_of<T: DeserializeOwned>(&self, resp: reqwest::Response, path: &str) -> Result<T> {
        let bytes = resp.bytes().await.map_err(|e| self.send_error(e))?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("unexpected answer from the server to GET {path}"))
    }

    /// GETs a JSON answer.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.get_ok(path).await?;
        self.json_of(resp, path).await
    }

    /// POSTs a JSON body; the answer's status and JSON body (none when empty) for 2xx and
    /// 409, an error with the server's message otherwise.
    pub async fn post_json<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(u16, Option<serde_json::Value>)> {
        let resp = self
            .request(reqwest::Method::POST, path)
            .timeout(REQUEST_TIMEOUT)
            .json(body)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        let status = resp.status().as_u16();
        let resp = if status == 409 {
            resp
        } else {
            check(resp).await?
        };
        let bytes = read_bounded(resp, 1 << 20).await.unwrap_or_default();
        if bytes.is_empty() {
            return Ok((status, None));
        }
        let v = serde_json::from_slice(&bytes)
            .with_context(|| format!("unexpected answer from the server to POST {path}"))?;
        Ok((status, Some(v)))
    }

    /// Sends a DELETE; `Ok(true)` when the server took it (2xx), `Ok(false)` for 409 (already
    /// ended), an error otherwise.
    pub async fn delete(&self, path: &str) -> Result<bool> {
        let resp = self
            .request(reqwest::Method::DELETE, path)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.send_error(e))?;
        if resp.status() == reqwest::StatusCode::CONFLICT {
            return Ok(false);
        }
        check(resp).await?;
        Ok(true)
    }
}

/// The innermost error's text (reqwest's own is a generic "error sending request").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// Turns a non-2xx answer into an error carrying the server's message.
async fn check(resp: reqwest::Response) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    // Bounded: an error body is small; a misbehaving peer's is cut.
    let body = read_bounded(resp, 64 << 10).await.unwrap_or_default();
    bail!("{}", error_message(status.as_u16(), &body))
}

/// What to show for an error answer: the server's `message`, else the status and the text.
pub fn error_message(status: u16, body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct ApiError {
        message: String,
    }
    let text = match serde_json::from_slice::<ApiError>(body) {
        Ok(e) => e.message,
        Err(_) => {
            let t = String::from_utf8_lossy(body).trim().to_owned();
            if t.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {t}")
            }
        }
    };
    let text = match status {
        401 => format!("{text} (check HUSK_API_KEY or E2B_API_KEY)"),
        _ => text,
    };
    crate::units::without_controls(&text)
}

async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    Ok(out)
}

/// Splits complete lines off the front of `buf`; the rest stays. An error when a line grows
/// past [`MAX_LINE`] without ending.
fn take_line(buf: &mut Vec<u8>) -> Result<Option<Vec<u8>>> {
    match buf.iter().position(|b| *b == b'\n') {
        Some(pos) => {
            let mut line: Vec<u8> = buf.drain(..=pos).collect();
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            Ok(Some(line))
        }
        None if buf.len() > MAX_LINE => {
            bail!("the server sent a line longer than {} MiB", MAX_LINE >> 20)
        }
        None => Ok(None),
    }
}

/// A line that is only a keepalive.
fn is_keepalive(line: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Kind<'a> {
        #[serde(rename = "type", borrow)]
        kind: std::borrow::Cow<'a, str>,
    }
    serde_json::from_slice::<Kind>(line).is_ok_and(|k| k.kind == "keepalive")
}

impl EventStream {
    /// The next event (keepalives skipped); `None` at the end of the stream.
    pub async fn next<T: DeserializeOwned>(&mut self) -> Result<Option<T>> {
        loop {
            while let Some(line) = take_line(&mut self.buf)? {
                if line.iter().all(u8::is_ascii_whitespace) || is_keepalive(&line) {
                    continue;
                }
                let ev = serde_json::from_slice(&line).with_context(|| {
                    format!(
                        "unexpected event from the server: {}",
                        crate::units::without_controls(&String::from_utf8_lossy(
                            &line[..line.len().min(200)]
                        ))
                    )
                })?;
                return Ok(Some(ev));
            }
            if self.done {
                if self.buf.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                // A last line without its newline.
                self.buf.push(b'\n');
                continue;
            }
            let chunk = tokio::time::timeout(STREAM_SILENCE, self.resp.chunk())
                .await
                .map_err(|_| anyhow!("the server sent nothing for {} s", STREAM_SILENCE.as_secs()))?
                .map_err(|e| anyhow!("the server's stream broke off: {}", root_cause(&e)))?;
            match chunk {
                Some(bytes) => self.buf.extend_from_slice(&bytes),
                None => self.done = true,
            }
        }
    }
}

/// A stop request from the user (SIGINT, SIGTERM or SIGHUP), as the signal's number.
pub struct StopSignals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Takes over SIGINT, SIGTERM and SIGHUP (inside a runtime).
    pub fn new() -> Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            int: signal(SignalKind::interrupt()).context("signal handler")?,
            term: signal(SignalKind::terminate()).context("signal handler")?,
            hup: signal(SignalKind::hangup()).context("signal handler")?,
        })
    }

    /// Waits for the next one; its number.
    pub async fn recv(&mut self) -> i32 {
        tokio::select! {
            _ = self.int.recv() => husk_runtime::libc::SIGINT,
            _ = self.term.recv() => husk_runtime::libc::SIGTERM,
            _ = self.hup.recv() => husk_runtime::libc::SIGHUP,
        }
    }
}

/// A single-threaded runtime for a client command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("async runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_and_bounded() {
        let mut buf = b"{\"a\":1}\r\n{\"b\"".to_vec();
        assert_eq!(take_line(&mut buf).unwrap().unwrap(), b"{\"a\":1}");
        assert!(take_line(&mut buf).unwrap().is_none());
        assert_eq!(buf, b"{\"b\"");
        let mut big = vec![b'x'; MAX_LINE + 1];
        assert!(take_line(&mut big).is_err());
        assert!(is_keepalive(b"{\"type\":\"keepalive\"}"));
        assert!(!is_keepalive(
            b"{\"type\":\"stdout\",\"data\":\"keepalive\"}"
        ));
    }

    #[test]
    fn error_messages_come_from_the_server() {
        assert_eq!(
            error_message(404, br#"{"code":404,"message":"secret 'X' not found"}"#),
            "secret 'X' not found"
        );
        assert_eq!(error_message(502, b"bad gateway"), "HTTP 502: bad gateway");
        assert_eq!(error_message(500, b""), "HTTP 500");
        assert!(error_message(401, br#"{"message":"invalid key"}"#).contains("HUSK_API_KEY"));
        // A hostile message cannot drive the terminal.
        assert!(!error_message(400, b"{\"message\":\"a\\u001b[2Jb\"}")
            .chars()
            .any(char::is_control));
    }
}
