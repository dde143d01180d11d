//! `process.Process` over Connect-JSON.
//!
//! Start and Connect stream: `start{pid}` first, then output and keepalives (every
//! `Keepalive-Ping-Interval` seconds), exactly one `end`, then the end-of-stream envelope. If
//! the sandbox goes away mid-stream (killed, timed out), the stream ends with an `unavailable`
//! error. A client that disconnects drops its stream only; the process keeps running.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderMap;
use axum::response::Response;
use futures_util::stream;
use husk_core::agent::{CallError, ProcStream};
use husk_proto::{ProcEvent, Reply, Selector, User};

use super::Sandbox;
use crate::connect::{
    parse_stream_request, parse_timeout_ms, parse_unary, read_body, stream_error, stream_response,
    unary_err, unary_ok, ClientStream, Code, ConnectError,
};
use crate::envd::process::{
    CloseStdinRequest, ConnectRequest, ListRequest, ListResponse, ProcessInfo, SendInputRequest,
    SendSignalRequest, StartRequest, StartResponse, StreamInputEvent, StreamInputRequest,
    UpdateRequest,
};
use crate::envd::ToAgentRequest;

/// The `error` of an `End` the agent sends for a process it killed at its deadline.
const TIMED_OUT: &str = husk_proto::PROCESS_TIMED_OUT;

/// Keepalive interval when the client names none (envd's default).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(90);

pub fn call_error(e: CallError) -> ConnectError {
    match e {
        CallError::Agent(a) => a.into(),
        CallError::Gone => ConnectError::unavailable("the sandbox was killed"),
    }
}

fn keepalive_interval(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|s| Duration::from_secs(s.clamp(1, 3600)))
        .unwrap_or(DEFAULT_KEEPALIVE)
}

pub async fn handle(sb: Sandbox, method: String, user: User, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    if method == "StreamInput" {
        return stream_input(sb, &headers, body).await;
    }
    let streaming = matches!(method.as_str(), "Start" | "Connect");
    let limit = if streaming {
        crate::connect::request::MAX_STREAM_REQUEST_BODY
    } else {
        crate::connect::request::MAX_UNARY_BODY
    };
    let bytes = match read_body(body, limit).await {
        Ok(b) => b,
        Err(e) if streaming => return stream_error(e),
        Err(e) => return unary_err(e),
    };
    match method.as_str() {
        "Start" => start(sb, &headers, &bytes, user).await,
        "Connect" => connect(sb, &headers, &bytes).await,
        "List" => list(sb, &headers, &bytes).await,
        "SendInput" => unary::<SendInputRequest>(sb, &headers, &bytes, user).await,
        "CloseStdin" => unary::<CloseStdinRequest>(sb, &headers, &bytes, user).await,
        "SendSignal" => unary::<SendSignalRequest>(sb, &headers, &bytes, user).await,
        "Update" => unary::<UpdateRequest>(sb, &headers, &bytes, user).await,
        // Like any Connect server: a procedure that does not exist is not found.
        other => unary_err(ConnectError::not_found(format!(
            "no such procedure: process.Process/{other}"
        ))),
    }
}

/// A unary call that maps onto one agent request answered by `Done`; replies `{}`.
async fn unary<T>(sb: Sandbox, headers: &HeaderMap, body: &[u8], user: User) -> Response
where
    T: serde::de::DeserializeOwned + ToAgentRequest,
{
    let req = match parse_unary::<T>(headers, body).and_then(|r| r.into_request(user)) {
        Ok(r) => r,
        Err(e) => return unary_err(e),
    };
    match sb.agent.call(req).await {
        Ok(_) => unary_ok(&serde_json::json!({})),
        Err(e) => unary_err(call_error(e)),
    }
}

async fn list(sb: Sandbox, headers: &HeaderMap, body: &[u8]) -> Response {
    if let Err(e) = parse_unary::<ListRequest>(headers, body) {
        return unary_err(e);
    }
    match sb.agent.call(husk_proto::Request::List).await {
        Ok(Reply::Processes(list)) => unary_ok(&ListResponse {
            processes: list.into_iter().map(ProcessInfo::from).collect(),
        }),
        Ok(_) => unary_err(ConnectError::internal("unexpected reply")),
        Err(e) => unary_err(call_error(e)),
    }
}

async fn start(sb: Sandbox, headers: &HeaderMap, body: &[u8], user: User) -> Response {
    let parsed = parse_stream_request::<StartRequest>(headers, body).and_then(|r| {
        let timeout = parse_timeout_ms(headers)?;
        r.into_start_proc(user, timeout)
    });
    let p = match parsed {
        Ok(p) => p,
        Err(e) => return stream_error(e),
    };
    match sb.agent.start(p).await {
        Ok((pid, events)) => event_stream(pid, events, keepalive_interval(headers)),
        Err(e) => stream_error(call_error(e)),
    }
}

async fn connect(sb: Sandbox, headers: &HeaderMap, body: &[u8]) -> Response {
    let sel = parse_stream_request::<ConnectRequest>(headers, body)
        .and_then(|r| r.into_request(User::User));
    let sel = match sel {
        Ok(husk_proto::Request::Find(sel)) => sel,
        Ok(_) => return stream_error(ConnectError::internal("unexpected request")),
        Err(e) => return stream_error(e),
    };
    match sb.agent.attach(sel).await {
        Ok((pid, events)) => event_stream(pid, events, keepalive_interval(headers)),
        Err(e) => stream_error(call_error(e)),
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
                        Some(ProcEvent::End(end)) if end.error.as_deref() == Some(TIMED_OUT) => {
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
                        None => Some((
                            Err(ConnectError::unavailable("the sandbox was killed")),
                            (Phase::Done, events),
                        )),
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
                    sb.agent
                        .call(husk_proto::Request::Find(s.clone()))
                        .await
                        .map_err(call_error)?;
                    sel = Some(s);
                }
                Some(StreamInputEvent::Data(data)) => {
                    let s = sel.clone().ok_or_else(|| {
                        ConnectError::invalid_argument("data before the stream's start event")
                    })?;
                    sb.agent
                        .call(data.into_request(s)?)
                        .await
                        .map_err(call_error)?;
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
