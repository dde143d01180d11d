//! One-shot runs and batches over HTTP, under `/husk/v1/runs` and `/husk/v1/batches`.
//!
//! `POST` starts one and streams its events as NDJSON (one JSON object per line), or as
//! server-sent events when the client accepts `text/event-stream`; a keepalive goes out every
//! [`KEEPALIVE`] of silence. The stream owns the run: a client that goes away cancels it and its
//! sandbox is destroyed. With `?detach=true` the answer is `202 {"id": ...}` at once and the run
//! goes on alone; its record is at `GET .../{id}`. `DELETE .../{id}` cancels.

// Handlers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use husk_core::runs::batch::BatchSpec;
use husk_core::runs::{Handle, RunSpec, Runs};
use serde::Serialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::body::{read_all_within, ReadError};
use crate::budget::Reservation;
use crate::error::answer;
use crate::rest::{error, Who};
use crate::AppState;

type Answer = Result<Response, Response>;

/// Largest request body: a spec with its inline files (8 MiB, base64-encoded) and room. It is
/// held in memory whole; large inputs belong in a workspace.
const MAX_BODY: usize = 16 << 20;

/// Silence after which a keepalive is sent (proxies close idle streams).
const KEEPALIVE: Duration = Duration::from_secs(15);

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/husk/v1/runs", get(list_runs).post(start_run))
        .route("/husk/v1/runs/{id}", get(get_run).delete(cancel))
        .route("/husk/v1/batches", get(list_batches).post(start_batch))
        .route("/husk/v1/batches/{id}", get(get_batch).delete(cancel))
        .route("/husk/v1/batches/{id}/runs", get(batch_runs))
        .with_state(state)
}

fn service(state: &AppState) -> Result<&std::sync::Arc<Runs>, Response> {
    state.runs.as_ref().ok_or_else(|| {
        error(
            StatusCode::NOT_IMPLEMENTED,
            "runs are not enabled on this server",
        )
    })
}

#[derive(serde::Deserialize, Default)]
struct StartQuery {
    #[serde(default)]
    detach: Option<bool>,
}

#[derive(serde::Deserialize, Default)]
struct ListQuery {
    #[serde(default)]
    limit: Option<u32>,
}

/// Reads the JSON request of `team`, whose buffered bodies the server bounds (see
/// [`crate::budget`]); keep the reservation while the request's data lives.
async fn read_json<T: serde::de::DeserializeOwned>(
    state: &AppState,
    team: &str,
    body: Body,
) -> Result<(T, Reservation), Response> {
    let mut held = state.bodies.reservation(team);
    let bytes = read_all_within(body, MAX_BODY, &mut held)
        .await
        .map_err(|e| match e {
            ReadError::TooLarge(_) => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the request is larger than {} MiB; put large inputs in a workspace",
                    MAX_BODY >> 20
                ),
            ),
            e => error(e.status(), e.to_string()),
        })?;
    let parsed = serde_json::from_slice(&bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid request: {e}")))?;
    Ok((parsed, held))
}

/// Whether the client asked for server-sent events.
fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// The events of `rx` as a streamed body; `owner` (the run's or batch's handle) lives as long
/// as the body does, so a client that goes away drops it and cancels the work.
fn event_body<E, H>(rx: mpsc::Receiver<E>, owner: H, sse: bool, id: &str) -> Response
where
    E: Serialize + Send + 'static,
    H: Send + 'static,
{
    let state = (rx, owner, false);
    let stream = futures_util::stream::unfold(state, move |(mut rx, owner, done)| async move {
        if done {
            return None;
        }
        let line = tokio::select! {
            ev = rx.recv() => match ev {
                Some(ev) => frame(&ev, sse),
                None => return None,
            },
            _ = tokio::time::sleep(KEEPALIVE) => {
                if sse {
                    b": keepalive\n\n".to_vec()
                } else {
                    b"{\"type\":\"keepalive\"}\n".to_vec()
                }
            }
        };
        Some((Ok::<_, std::io::Error>(line), (rx, owner, false)))
    });
    let mut resp = Body::from_stream(stream).into_response();
    let ctype = if sse {
        "text/event-stream"
    } else {
        "application/x-ndjson"
    };
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ctype));
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(id) {
        resp.headers_mut().insert("x-husk-id", v);
    }
    resp
}

fn frame<E: Serialize>(ev: &E, sse: bool) -> Vec<u8> {
    let text = serde_json::to_string(ev).unwrap_or_else(|_| "{}".into());
    if sse {
        // The event's type doubles as the SSE event name.
        let kind = serde_json::to_value(ev)
            .ok()
            .and_then(|v| v.get("type").and_then(|t| t.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "message".into());
        format!("event: {kind}\ndata: {text}\n\n").into_bytes()
    } else {
        format!("{text}\n").into_bytes()
    }
}

async fn start_run(
    State(state): State<AppState>,
    Who(who): Who,
    Query(q): Query<StartQuery>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let runs = service(&state)?.clone();
    let (spec, _held): (RunSpec, _) = read_json(&state, &who.team, body).await?;
    let handle = runs.start(&who, &spec).await.map_err(answer)?;
    Ok(started(handle, q.detach == Some(true), &headers))
}

async fn start_batch(
    State(state): State<AppState>,
    Who(who): Who,
    Query(q): Query<StartQuery>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let runs = service(&state)?.clone();
    let (spec, _held): (BatchSpec, _) = read_json(&state, &who.team, body).await?;
    let handle = runs.start_batch(&who, &spec).await.map_err(answer)?;
    Ok(started(handle, q.detach == Some(true), &headers))
}

/// The answer to a started run or batch: `202 {"id"}` when detached, else its event stream
/// (which owns the handle: a client that goes away cancels the work).
fn started<E: Serialize + Send + 'static>(
    mut handle: Handle<E>,
    detach: bool,
    headers: &HeaderMap,
) -> Response {
    let id = handle.id.clone();
    if detach {
        handle.detach();
        return (StatusCode::ACCEPTED, axum::Json(json!({"id": id}))).into_response();
    }
    let events = handle.take_events();
    event_body(events, handle, wants_sse(headers), &id)
}

async fn list_runs(
    State(state): State<AppState>,
    Who(who): Who,
    Query(q): Query<ListQuery>,
) -> Answer {
    let runs = service(&state)?;
    let list = runs.list(&who, q.limit.unwrap_or(100)).map_err(answer)?;
    Ok(axum::Json(json!({ "runs": list })).into_response())
}

async fn get_run(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let rec = service(&state)?.get(&who, &id).map_err(answer)?;
    Ok(axum::Json(rec).into_response())
}

async fn list_batches(
    State(state): State<AppState>,
    Who(who): Who,
    Query(q): Query<ListQuery>,
) -> Answer {
    let runs = service(&state)?;
    let list = runs
        .list_batches(&who, q.limit.unwrap_or(100))
        .map_err(answer)?;
    Ok(axum::Json(json!({ "batches": list })).into_response())
}

async fn get_batch(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let rec = service(&state)?.get_batch(&who, &id).map_err(answer)?;
    Ok(axum::Json(rec).into_response())
}

async fn batch_runs(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
) -> Answer {
    let runs = service(&state)?;
    runs.get_batch(&who, &id).map_err(answer)?;
    let list = runs.batch_runs(&who, &id).map_err(answer)?;
    Ok(axum::Json(json!({ "runs": list })).into_response())
}

/// Cancels a run or batch in progress: 202 when it was, 409 when it had already ended.
async fn cancel(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    match service(&state)?.cancel(&who, &id).map_err(answer)? {
        true => Ok((
            StatusCode::ACCEPTED,
            axum::Json(json!({"id": id, "cancelled": true})),
        )
            .into_response()),
        false => Err(error(
            StatusCode::CONFLICT,
            format!("{id} has already ended"),
        )),
    }
}
