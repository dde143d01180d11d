//! `process.Process` over Connect-JSON.
//!
//! Start and Connect stream: `start{pid}` first, then output and keepalives (every
//! `Keepalive-Ping-Interval` seconds), exactly one `end`, then the end-of-stream envelope. If
//! the sandbox goes away mid-stream (killed, timed out), the response breaks off, as E2B's
//! does when a sandbox's VM goes (see [`ConnectError::sandbox_gone`]). A client that
//! disconnects drops its stream only; the process keeps running.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::stream;
use husk_core::agent::ProcStream;
use husk_core::calls::{Answer, Call, ProcEvent, Selector, User, PROCESS_TIMED_OUT};
use husk_core::manager::Manager;
use husk_core::process::ProcessError;
use husk_core::secrets::SecretError;

use super::rpc::{call_error, empty, read_request, unary_call};
use super::Sandbox;
use crate::budget::Budget;
use crate::connect::{
    parse_stream_request, parse_timeout_ms, stream_error, stream_response, unary_err, ClientStream,
    Code, ConnectError,
};
use crate::envd::process::{
    CloseStdinRequest, ConnectRequest, ListRequest, ListResponse, ProcessInfo, SendInputRequest,
    SendSignalRequest, StartRequest, StartResponse, StreamInputEvent, StreamInputRequest,
    UpdateRequest,
};

/// Keepalive interval when the client names none (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s.clamp(1, 3600)))
        .unwrap_or(DEFAULT_KEEPALIVE)
}

pub async fn handle(
    sb: Sandbox,
    manager: Arc<Manager>,
    bodies: Arc<Budget>,
    method: String,
    user: User,
    req: Request<Body>,
) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    if method == "StreamInput" {
        return stream_input(sb, &headers, body).await;
    }
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let mut held = bodies.reservation(sb.team());
    let bytes = match read_request(body, streaming, &mut held).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let (sb, h, b) = (&sb, &headers, &bytes[..]);
    match method.as_str() {
        "Start" => start(&manager, sb, h, b, user).await,
        "Connect" => connect(&manager, sb, h, b).await,
        "List" => {
            unary_call::<ListRequest, _>(sb, h, b, user, |r| match r {
                Answer::Processes(list) => Some(ListResponse {
                    processes: list.into_iter().map(ProcessInfo::from).collect(),
                }),
                _ => None,
            })
            .await
        }
        "SendInput" => unary_call::<SendInputRequest, _>(sb, h, b, user, empty).await,
        "CloseStdin" => unary_call::<CloseStdinRequest, _>(sb, h, b, user, empty).await,
        "SendSignal" => unary_call::<SendSignalRequest, _>(sb, h, b, user, empty).await,
        "Update" => unary_call::<UpdateRequest, _>(sb, h, b, user, empty).await,
        // Like any Connect server: a procedure that does not exist is not found.
        other => unary_err(ConnectError::not_found(format!(
            "no such procedure: process.Process/{other}"
        ))),
    }
}

async fn start(
    manager: &Manager,
    sb: &Sandbox,
    headers: &HeaderMap,
    body: &[u8],
    user: User,
) -> Response {
    let parsed = parse_stream_request::<StartRequest>(headers, body).and_then(|r| {
        let timeout = parse_timeout_ms(headers)?;
        r.into_spec(user, timeout)
    });
    let p = match parsed {
        Ok(p) => p,
        Err(e) => return stream_error(e),
    };
    // The core resolves `husk-secret://NAME` values into this process's environment only,
    // masks them in its output and audits their use.
    match manager.start_process(sb, p).await {
        Ok((pid, events)) => event_stream(pid, events, keepalive_interval(headers)),
        Err(e) => stream_error(process_error(e)),
    }
}

/// The Connect error for a process that could not be started or attached to.
fn process_error(e: ProcessError) -> ConnectError {
    match e {
        ProcessError::SecretsDisabled => ConnectError::invalid_argument(e.to_string()),
        ProcessError::Secret(SecretError::NotFound(name)) => {
            ConnectError::not_found(format!("secret '{name}' not found"))
        }
        ProcessError::Secret(e) => ConnectError::invalid_argument(husk_core::error_chain(&e)),
        ProcessError::Agent(e) => call_error(e),
    }
}

async fn connect(manager: &Manager, sb: &Sandbox, headers: &HeaderMap, body: &[u8]) -> Response {
    let sel = match parse_stream_request::<ConnectRequest>(headers, body).and_then(|r| r.selector())
    {
        Ok(sel) => sel,
        Err(e) => return stream_error(e),
    };
    match manager.attach_process(sb, sel).await {
        Ok((pid, events)) => event_stream(pid, events, keepalive_interval(headers)),
        Err(e) => stream_error(process_error(e)),
    }
}

enum Phase {
    Start,
    Running,
    Done,
}

/// `start{pid}`, then the process's events with keepalives, ending after `end`.
fn event_stream(pid: u32, events: ProcStream, keepalive: Duration) -> Response {
    let state = (Phase::Start, events);
    let s = stream::unfold(state, move |(phase, mut events)| async move {
        match phase {
            Phase::Done => None,
            Phase::Start => Some((Ok(StartResponse::start(pid)), (Phase::Running, events))),
            Phase::Running => {
                tokio::select! {
                    ev = events.next() => match ev {
                        // The agent ended it at the call's deadline: the call timed out (the
                        // SDKs raise their timeout error for this code).
                        Some(ProcEvent::End(end)) if end.error.as_deref() == Some(PROCESS_TIMED_OUT) => {
                            Some((
                                Err(ConnectError::new(
                                    Code::DeadlineExceeded,
                                    "the process exceeded the call's deadline and was killed",
                                )),
                                (Phase::Done, events),
                            ))
                        }
                        Some(ev @ ProcEvent::End(_)) => {
                            Some((Ok(StartResponse::from(ev)), (Phase::Done, events)))
                        }
                        Some(ev) => Some((Ok(StartResponse::from(ev)), (Phase::Running, events))),
                        None => Some((Err(ConnectError::sandbox_gone()), (Phase::Done, events))),
                    },
                    _ = tokio::time::sleep(keepalive) => {
                        Some((Ok(StartResponse::keepalive()), (Phase::Running, events)))
                    }
                }
            }
        }
    });
    stream_response(s)
}

/// Client streaming: `start{process}`, then data chunks to write, keepalives ignored.
async fn stream_input(sb: Sandbox, headers: &HeaderMap, body: Body) -> Response {
    let result = async {
        let mut input = ClientStream::<StreamInputRequest>::new(headers, body)?;
        let mut sel: Option<Selector> = None;
        while let Some(msg) = input.next().await? {
            match msg.event {
                Some(StreamInputEvent::Start(start)) => {
                    let s = start.selector()?;
                    sb.call(Call::FindProcess(s.clone()))
                        .await
                        .map_err(call_error)?;
                    sel = Some(s);
                }
                Some(StreamInputEvent::Data(data)) => {
                    let s = sel.clone().ok_or_else(|| {
                        ConnectError::invalid_argument("data before the stream's start event")
                    })?;
                    sb.call(data.into_call(s)?).await.map_err(call_error)?;
                }
                Some(StreamInputEvent::Keepalive) | None => {}
            }
        }
        Ok::<(), ConnectError>(())
    }
    .await;
    match result {
        Ok(()) => stream_response(stream::iter([Ok::<_, ConnectError>(serde_json::json!({}))])),
        Err(e) => stream_error(e),
    }
}
