//! Workspaces over HTTP, under `/husk/v1/workspaces`: a team creates, lists, inspects and
//! deletes its own workspaces and moves files and tar archives in and out of them, with any of
//! its keys. Another team's workspace is answered exactly as a missing one (404).
//!
//! File and archive bodies are streamed in both directions (never held in memory): uploads
//! through a channel to the core on a blocking thread, bounded by the server's per-upload
//! limit (413 beyond it, with nothing left behind); downloads and exports from a blocking
//! thread through a channel into the response body.
//!
//! - `POST /husk/v1/workspaces` `{"name"}` → 201 info; `GET` → `{"workspaces": [...]}`
//! - `GET|DELETE /husk/v1/workspaces/{name}`
//! - `GET /husk/v1/workspaces/{name}/files?path=&depth=` → `{"entries": [...], "truncated"}`
//! - `GET|PUT|DELETE /husk/v1/workspaces/{name}/files/{*path}`: raw bytes
//! - `GET|PUT /husk/v1/workspaces/{name}/tar?path=`: a tar (or, uploaded, tar.gz)

// Handlers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

use std::io::{self, Read, Write};
use std::sync::Arc;

use axum::body::{to_bytes, Body, Bytes};
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

use crate::rest::{error, rfc3339, Who};
use crate::upload::{body_channel, drain, pump};
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
    state.workspaces.clone().ok_or_else(|| {
        error(
            StatusCode::NOT_IMPLEMENTED,
            "workspaces are not enabled on this server",
        )
    })
}

fn answer(e: WorkspaceError) -> Response {
    use WorkspaceError as E;
    let status = match &e {
        E::NotFound(_) | E::PathNotFound { .. } => StatusCode::NOT_FOUND,
        E::AlreadyExists(_) | E::Conflict { .. } => StatusCode::CONFLICT,
        E::InvalidName(_)
        | E::InvalidTeam(_)
        | E::InvalidPath { .. }
        | E::NotAFile { .. }
        | E::NotADirectory { .. }
        | E::BadArchive { .. }
        | E::TooDeep { .. } => StatusCode::BAD_REQUEST,
        E::TooLarge { .. } | E::TooManyEntries { .. } => StatusCode::PAYLOAD_TOO_LARGE,
        E::Io { .. } => {
            tracing::warn!(error = %e, "workspace operation failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    };
    error(status, e.to_string())
}

/// Runs a core call on a blocking thread (every one touches the file system).
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, Response> {
    tokio::task::spawn_blocking(call)
        .await
        .map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("workspace task failed: {e}"),
            )
        })?
        .map_err(answer)
}

/// Runs `consume` on a blocking thread with the request body as its reader, while the body
/// is pumped in (the core bounds what it reads); its result as [`blocking`] gives it.
async fn with_body<T: Send + 'static>(
    body: Body,
    consume: impl FnOnce(crate::upload::BodyReader) -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, Response> {
    let (tx, reader) = body_channel();
    let ((), done) = tokio::join!(
        pump(body, tx, u64::MAX, Arc::default()),
        blocking(move || consume(reader))
    );
    done
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

#[derive(Deserialize)]
struct CreateBody {
    name: String,
}

async fn create(State(state): State<AppState>, Who(who): Who, body: Body) -> Answer {
    let ws = service(&state)?;
    let bytes = to_bytes(body, MAX_JSON).await.map_err(|_| {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than {MAX_JSON} bytes"),
        )
    })?;
    let req: CreateBody = serde_json::from_slice(&bytes).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("expected a JSON body like {{\"name\": \"data\"}}: {e}"),
        )
    })?;
    let info = blocking(move || ws.create(&who.team, &req.name)).await?;
    Ok((StatusCode::CREATED, axum::Json(info_json(&info))).into_response())
}

async fn list(State(state): State<AppState>, Who(who): Who) -> Answer {
    let ws = service(&state)?;
    let all = blocking(move || ws.list(&who.team)).await?;
    let items: Vec<Value> = all.iter().map(info_json).collect();
    Ok(axum::Json(json!({ "workspaces": items })).into_response())
}

async fn info(State(state): State<AppState>, Who(who): Who, Path(name): Path<String>) -> Answer {
    let ws = service(&state)?;
    let info = blocking(move || ws.info(&who.team, &name)).await?;
    Ok(axum::Json(info_json(&info)).into_response())
}

async fn delete(State(state): State<AppState>, Who(who): Who, Path(name): Path<String>) -> Answer {
    let ws = service(&state)?;
    blocking(move || ws.delete(&who.team, &name)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct FilesQuery {
    #[serde(default)]
    path: String,
    depth: Option<usize>,
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, Response> {
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
    let listing =
        blocking(move || ws.entries(&who.team, &name, &q.path, q.depth.unwrap_or(1))).await?;
    let items: Vec<Value> = listing.entries.iter().map(entry_json).collect();
    Ok(axum::Json(json!({ "entries": items, "truncated": listing.truncated })).into_response())
}

async fn download(
    State(state): State<AppState>,
    Who(who): Who,
    Path((name, path)): Path<(String, String)>,
) -> Answer {
    let ws = service(&state)?;
    let (file, size) = blocking(move || {
        let file = ws.read_file(&who.team, &name, &path)?;
        let size = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok((file, size))
    })
    .await?;
    // Exactly `size` bytes: more that the file grew meanwhile are not sent; a file that
    // shrank ends the body with an error rather than a short, seemingly complete download.
    let body = blocking_body(move |out| {
        let copied = io::copy(&mut file.take(size), out)?;
        if copied < size {
            return Err(io::Error::other("the file shrank while being read"));
        }
        Ok(())
    });
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
    let report = with_body(body, move |reader| {
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
    blocking(move || ws.remove(&who.team, &name, &path)).await?;
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
    body: Body,
) -> Answer {
    let ws = service(&state)?;
    let q = query(q)?;
    let limits = ws.upload_limits();
    let report = with_body(body, move |reader| {
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
    let exporter = blocking(move || ws.exporter(&who.team, &name, &q.path)).await?;
    let body =
        blocking_body(move |out| exporter.write_to(out).map(|_| ()).map_err(io::Error::other));
    let mut resp = body.into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    Ok(resp)
}

/// A response body written by `produce` on a blocking thread. An error ends the body with an
/// error (the client sees a broken transfer, never a short one that looks complete); a
/// client that goes away makes the writes fail, which stops `produce`.
fn blocking_body(
    produce: impl FnOnce(&mut ChannelWriter) -> io::Result<()> + Send + 'static,
) -> Body {
    let (tx, mut rx) = mpsc::channel::<io::Result<Bytes>>(CHANNEL_DEPTH);
    tokio::task::spawn_blocking(move || {
        let mut out = ChannelWriter {
            tx,
            buf: Vec::with_capacity(CHUNK),
        };
        let result = produce(&mut out).and_then(|()| out.send());
        if let Err(e) = result {
            let _ = out.tx.blocking_send(Err(e));
        }
    });
    Body::from_stream(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
}

/// The writing end of [`blocking_body`]: buffers [`CHUNK`] bytes per message.
struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: Vec<u8>,
}

impl ChannelWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))
    }
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
