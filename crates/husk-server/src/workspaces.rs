//! Workspaces over HTTP, under `/husk/v1/workspaces`: a team creates, lists, inspects and
//! deletes its own workspaces and moves files and tar archives in and out of them, with any of
//! its keys. Another team's workspace is answered exactly as a missing one (404).
//!
//! File and archive bodies are streamed in both directions (never held in memory): uploads
//! through a channel to the core on a thread of the operation's own, bounded by the server's
//! per-upload limit (413 beyond it, with nothing left behind); downloads and exports from such
//! a thread through a channel into the response body. Every operation first takes a slot of
//! its team's ([`crate::transfers`]: 429 when the team or the server has too many running),
//! and a client that stops sending or reading is cut by the body rate rule ([`crate::body`]).
//!
//! - `POST /husk/v1/workspaces` `{"name"}` → 201 info; `GET` → `{"workspaces": [...]}`, with
//!   `quota_bytes` and `used_bytes` when the team's workspaces are under a quota
//! - `GET|DELETE /husk/v1/workspaces/{name}`
//! - `GET /husk/v1/workspaces/{name}/files?path=&depth=` → `{"entries": [...], "truncated"}`
//! - `GET|PUT|DELETE /husk/v1/workspaces/{name}/files/{*path}`: raw bytes
//! - `GET|PUT /husk/v1/workspaces/{name}/tar?path=`: a tar (or, uploaded, tar.gz)
//!
//! A write that finds the team's quota used up is 507 Insufficient Storage.

// Handlers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

use std::io::{self, Read, Write};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use husk_core::workspaces::{Entry, WorkspaceError, WorkspaceInfo, Workspaces};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::body::{read_all, RateMeter};
use crate::error::answer;
use crate::rest::{error, rfc3339, Who};
use crate::transfers::{on_thread, spawn, Busy, Permit};
use crate::upload::{body_channel, drain, pump, BodyEnd};
use crate::AppState;

type Answer = Result<Response, Response>;

/// Largest JSON request body (a create).
const MAX_JSON: usize = 64 << 10;

/// Chunks of a streamed download or export.
const CHUNK: usize = 128 << 10;

/// Chunks in flight between a blocking thread and the network.
const CHANNEL_DEPTH: usize = 8;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/husk/v1/workspaces", get(list).post(create))
        .route("/husk/v1/workspaces/{name}", get(info).delete(delete))
        .route("/husk/v1/workspaces/{name}/files", get(entries))
        .route(
            "/husk/v1/workspaces/{name}/files/{*path}",
            get(download).put(upload).delete(remove),
        )
        .route("/husk/v1/workspaces/{name}/tar", get(export).put(import))
        .with_state(state)
}

fn service(state: &AppState) -> Result<Arc<Workspaces>, Response> {
    state
        .workspaces
        .clone()
        .ok_or_else(|| error(StatusCode::NOT_IMPLEMENTED, state.manager.workspaces_off()))
}

/// A slot for one operation of `team` (429 with `Retry-After` when its team or the server has
/// too many running).
pub(crate) fn permit(state: &AppState, team: &str) -> Result<Permit, Response> {
    state.transfers.try_acquire(team).map_err(answer)
}

/// Runs a core call (every one touches the file system) on a thread that holds `permit`.
pub(crate) async fn blocking<T: Send + 'static>(
    permit: Permit,
    call: impl FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, Response> {
    on_thread(permit, call)
        .await
        .map_err(answer)?
        .map_err(answer)
}

/// Runs `consume` on a thread that holds `permit`, with the request body as its reader, while
/// the body is pumped in (the core bounds what it reads; the body's rate rule bounds how long
/// it waits); its result as [`blocking`] gives it.
pub(crate) async fn with_body<T: Send + 'static>(
    permit: Permit,
    body: Body,
    consume: impl FnOnce(crate::upload::BodyReader) -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, Response> {
    let (tx, reader) = body_channel();
    let (end, done) = tokio::join!(
        pump(body, tx, u64::MAX),
        on_thread(permit, move || consume(reader))
    );
    match end {
        // Whatever the core made of the broken reader (nothing is left of the upload), the
        // client is why: no server error, no warning in the log.
        BodyEnd::Stalled(s) => Err(error(StatusCode::REQUEST_TIMEOUT, s.to_string())),
        BodyEnd::Failed => Err(error(
            StatusCode::BAD_REQUEST,
            "the request body broke off; nothing was written",
        )),
        BodyEnd::Complete | BodyEnd::TooLarge => done.map_err(answer)?.map_err(answer),
    }
}

fn info_json(i: &WorkspaceInfo) -> Value {
    json!({
        "name": i.name,
        "created_at": rfc3339(i.created_at),
        "size_bytes": i.size_bytes,
        "files": i.files,
    })
}

fn entry_json(e: &Entry) -> Value {
    let mut v = json!({
        "name": e.name,
        "path": e.path,
        "kind": e.kind.as_str(),
        "size": e.size,
        "mode": e.mode,
        "mtime": rfc3339(e.mtime),
    });
    if let Some(target) = &e.target {
        v["target"] = json!(target);
    }
    v
}

/// A workspace made or deleted here is a new volume, or none: the id (and token) E2B's volume
/// API knew it by is forgotten. Failing that only leaves a record the volume API finds stale.
fn forget_volume(volumes: Option<&husk_core::volumes::Volumes>, team: &str, name: &str) {
    if let Some(Err(e)) = volumes.map(|v| v.forget(team, name)) {
        tracing::warn!(team, workspace = name, error = %husk_core::error_chain(&e), "forgetting a volume id");
    }
}

#[derive(Deserialize)]
struct CreateBody {
    name: String,
}

async fn create(State(state): State<AppState>, Who(who): Who, body: Body) -> Answer {
    let ws = service(&state)?;
    let bytes = read_all(body, MAX_JSON)
        .await
        .map_err(|e| error(e.status(), e.to_string()))?;
    let req: CreateBody = serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("expected a JSON body like {{\"name\": \"data\"}}: {e}"),
        )
    })?;
    let p = permit(&state, &who.team)?;
    let volumes = state.volumes.clone();
    let info = blocking(p, move || {
        let info = ws.create(&who.team, &req.name)?;
        forget_volume(volumes.as_deref(), &who.team, &req.name);
        Ok(info)
    })
    .await?;
    Ok((StatusCode::CREATED, axum::Json(info_json(&info))).into_response())
}

async fn list(State(state): State<AppState>, Who(who): Who) -> Answer {
    let ws = service(&state)?;
    let p = permit(&state, &who.team)?;
    let (all, usage) = blocking(p, move || Ok((ws.list(&who.team)?, ws.usage(&who.team)?))).await?;
    let items: Vec<Value> = all.iter().map(info_json).collect();
    let mut v = json!({ "workspaces": items });
    if let Some(u) = usage {
        v["quota_bytes"] = json!(u.quota_bytes);
        v["used_bytes"] = json!(u.used_bytes);
    }
    Ok(axum::Json(v).into_response())
}

async fn info(State(state): State<AppState>, Who(who): Who, Path(name): Path<String>) -> Answer {
    let ws = service(&state)?;
    let p = permit(&state, &who.team)?;
    let info = blocking(p, move || ws.info(&who.team, &name)).await?;
    Ok(axum::Json(info_json(&info)).into_response())
}

async fn delete(State(state): State<AppState>, Who(who): Who, Path(name): Path<String>) -> Answer {
    let ws = service(&state)?;
    let p = permit(&state, &who.team)?;
    let volumes = state.volumes.clone();
    blocking(p, move || {
        ws.delete(&who.team, &name)?;
        forget_volume(volumes.as_deref(), &who.team, &name);
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct FilesQuery {
    #[serde(default)]
    path: String,
    depth: Option<usize>,
}

pub(crate) fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Response> {
    q.map(|Query(q)| q)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("bad query: {e}")))
}

async fn entries(
    State(state): State<AppState>,
    Who(who): Who,
    Path(name): Path<String>,
    q: Result<Query<FilesQuery>, QueryRejection>,
) -> Answer {
    let ws = service(&state)?;
    let q = query(q)?;
    let p = permit(&state, &who.team)?;
    let listing = blocking(p, move || {
        ws.entries(&who.team, &name, &q.path, q.depth.unwrap_or(1))
    })
    .await?;
    let items: Vec<Value> = listing.entries.iter().map(entry_json).collect();
    Ok(axum::Json(json!({ "entries": items, "truncated": listing.truncated })).into_response())
}

async fn download(
    State(state): State<AppState>,
    Who(who): Who,
    Path((name, path)): Path<(String, String)>,
) -> Answer {
    let ws = service(&state)?;
    let p = permit(&state, &who.team)?;
    file_download(&state, p, move || ws.read_file(&who.team, &name, &path)).await
}

/// A download of the regular file `open` opens (on a thread that holds `permit`), streamed
/// as `application/octet-stream` with its length: exactly that many bytes (more that the file
/// grew meanwhile are not sent; a file that shrank ends the body with an error rather than a
/// short, seemingly complete download).
pub(crate) async fn file_download(
    state: &AppState,
    permit: Permit,
    open: impl FnOnce() -> Result<std::fs::File, WorkspaceError> + Send + 'static,
) -> Answer {
    let (size, body) = streamed(
        state,
        permit,
        move || {
            let file = open()?;
            let size = file.metadata().map(|m| m.len()).unwrap_or(0);
            Ok((size, (file, size)))
        },
        |(file, size), out| {
            let copied = io::copy(&mut file.take(size), out)?;
            if copied < size {
                return Err(io::Error::other("the file shrank while being read"));
            }
            Ok(())
        },
    )
    .await?;
    let mut resp = body.into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(size));
    Ok(resp)
}

async fn upload(
    State(state): State<AppState>,
    Who(who): Who,
    Path((name, path)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let ws = service(&state)?;
    let p = match permit(&state, &who.team) {
        Ok(p) => p,
        Err(resp) => {
            drain(&headers, body).await;
            return Err(resp);
        }
    };
    let limit = ws.upload_limits().max_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        drain(&headers, body).await;
        return Err(answer(WorkspaceError::TooLarge {
            place: format!("workspace '{name}'"),
            limit,
        }));
    }
    let report = with_body(p, body, move |reader| {
        ws.write_file(&who.team, &name, &path, reader, limit)
    })
    .await?;
    Ok(if report.created {
        StatusCode::CREATED
    } else {
        StatusCode::NO_CONTENT
    }
    .into_response())
}

async fn remove(
    State(state): State<AppState>,
    Who(who): Who,
    Path((name, path)): Path<(String, String)>,
) -> Answer {
    let ws = service(&state)?;
    let p = permit(&state, &who.team)?;
    blocking(p, move || ws.remove(&who.team, &name, &path)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct TarQuery {
    #[serde(default)]
    path: String,
}

async fn import(
    State(state): State<AppState>,
    Who(who): Who,
    Path(name): Path<String>,
    q: Result<Query<TarQuery>, QueryRejection>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let ws = service(&state)?;
    let q = query(q)?;
    let p = match permit(&state, &who.team) {
        Ok(p) => p,
        Err(resp) => {
            drain(&headers, body).await;
            return Err(resp);
        }
    };
    let limits = ws.upload_limits();
    let report = with_body(p, body, move |reader| {
        ws.import_tar(&who.team, &name, &q.path, reader, limits)
    })
    .await?;
    Ok(axum::Json(json!({
        "files": report.files,
        "dirs": report.dirs,
        "symlinks": report.symlinks,
        "bytes": report.bytes,
        "skipped": report.skipped,
    }))
    .into_response())
}

async fn export(
    State(state): State<AppState>,
    Who(who): Who,
    Path(name): Path<String>,
    q: Result<Query<TarQuery>, QueryRejection>,
) -> Answer {
    let ws = service(&state)?;
    let q = query(q)?;
    // Found first, so that a missing workspace or path is a proper error answer; then
    // written as the body goes out.
    let p = permit(&state, &who.team)?;
    let ((), body) = streamed(
        &state,
        p,
        move || Ok(((), ws.exporter(&who.team, &name, &q.path)?)),
        |exporter, out| exporter.write_to(out).map(|_| ()).map_err(io::Error::other),
    )
    .await?;
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(resp)
}

/// A response whose body `produce` writes on a thread that holds `permit` from start to end:
/// first `open` runs there (its error is the answer, before any byte of the body; what it
/// gives the handler, e.g. a size for `Content-Length`, comes back with the body), then
/// `produce` writes what it opened. One slot for the whole transfer: another request of the
/// team cannot take it between the two. An error while writing ends the body with an error
/// (the client sees a broken transfer, never a short one that looks complete); a client that
/// goes away, or reads slower than the body rate rule allows, makes the writes fail, which
/// stops `produce` and frees the thread.
async fn streamed<M: Send + 'static, S: 'static>(
    state: &AppState,
    permit: Permit,
    open: impl FnOnce() -> Result<(M, S), WorkspaceError> + Send + 'static,
    produce: impl FnOnce(S, &mut ChannelWriter) -> io::Result<()> + Send + 'static,
) -> Result<(M, Body), Response> {
    let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
    let (opened_tx, opened_rx) = tokio::sync::oneshot::channel();
    let mut out = ChannelWriter {
        tx,
        buf: Vec::with_capacity(CHUNK),
        runtime: tokio::runtime::Handle::current(),
        meter: RateMeter::new(state.body_policy),
    };
    spawn(permit, move |_permit| {
        let opened = match open() {
            Ok((meta, source)) => {
                let _ = opened_tx.send(Ok(meta));
                source
            }
            Err(e) => {
                let _ = opened_tx.send(Err(e));
                return;
            }
        };
        let result = produce(opened, &mut out).and_then(|()| out.send());
        if let Err(e) = result {
            // The client may be the one that stopped reading: no waiting for it here.
            let _ = out.tx.try_send(Err(e));
        }
    })
    .map_err(answer)?;
    let meta = opened_rx
        .await
        .map_err(|_| answer(Busy::Lost))?
        .map_err(answer)?;
    let body = Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    Ok((meta, body))
}

/// The writing end of [`streamed`]: buffers [`CHUNK`] bytes per message, and waits for the
/// client to take each one no longer than the body rate rule allows.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
    runtime: tokio::runtime::Handle,
    meter: RateMeter,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        loop {
            let (wait, started) = (self.meter.remaining(), std::time::Instant::now());
            let tx = &self.tx;
            // A slot in the channel means the client took an earlier chunk.
            let reserved = self
                .runtime
                .block_on(async { tokio::time::timeout(wait, tx.reserve()).await });
            match reserved {
                Ok(Ok(slot)) => {
                    slot.send(Ok(chunk.clone()));
                    self.meter.progress(chunk.len());
                    return self.meter.waited(started.elapsed()).map_err(too_slow);
                }
                Ok(Err(_)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "the client went away",
                    ))
                }
                // The window ended with the client reading nothing: judge it, then wait on.
                Err(_) => self.meter.waited(started.elapsed()).map_err(too_slow)?,
            }
        }
    }
}

fn too_slow(e: crate::body::Stalled) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, e)
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
