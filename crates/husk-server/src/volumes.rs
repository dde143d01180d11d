//! E2B's volume API: husk's workspaces under the names the stock SDKs use
//! (`Volume.create/list/get_info/destroy` and the volume content API). See
//! `husk_core::volumes` for what a volume is (a workspace with an id and a token).
//!
//! - `POST /volumes` `{"name"}` → 201 `{volumeID, name, token}`; `GET /volumes` →
//!   `[{volumeID, name}]`; `GET|DELETE /volumes/{volumeID}`: with an API key (`X-API-KEY`),
//!   the team's own volumes only (another team's is 404).
//! - `/volumecontent/{volumeID}/...` with `Authorization: Bearer <token>` (no API key: the
//!   token is the authority, and opens that one volume): `GET|PUT file?path=` (raw bytes;
//!   `uid`, `gid`, `mode`, `force` on writes), `GET|POST dir?path=` (list with `depth`; make
//!   with `uid`, `gid`, `mode`, `force` = parents), `GET|DELETE|PATCH path?path=` (stat,
//!   remove, change `{uid, gid, mode}`). Paths are absolute within the volume (`/a/b`).
//!
//! The E2B SDKs reach the content API at `E2B_VOLUME_API_URL` (set it to the server's URL, as
//! `E2B_API_URL`), or at `https://api.<domain>`. Every operation takes a slot of the team's
//! workspace transfers, and bodies are streamed and bounded as in `crate::workspaces`.

// Handlers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use husk_core::store::VolumeRecord;
use husk_core::volumes::{Volume, VolumeError, Volumes};
use husk_core::workspaces::{Attrs, Entry, EntryKind, WorkspaceError, Workspaces, WriteOptions};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::body::read_all;
use crate::error::answer;
use crate::rest::{error, rfc3339, Who};
use crate::upload::drain;
use crate::workspaces::{blocking, file_download, permit, query, with_body};
use crate::AppState;

type Answer = Result<Response, Response>;

/// Largest JSON request body (a create, a metadata change).
const MAX_JSON: usize = 64 << 10;

/// Deepest listing one request may ask for.
const MAX_LIST_DEPTH: usize = 16;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/volumes", get(list).post(create))
        .route("/volumes/{id}", get(info).delete(destroy))
        .route("/volumecontent/{id}/file", get(read_file).put(write_file))
        .route("/volumecontent/{id}/dir", get(list_dir).post(make_dir))
        .route(
            "/volumecontent/{id}/path",
            get(stat).delete(remove).patch(set_attrs),
        )
        .with_state(state)
}

fn service(state: &AppState) -> Result<Arc<Volumes>, Response> {
    state.volumes.clone().ok_or_else(|| {
        let why = if state.cluster.is_some() && state.workspaces.is_none() {
            husk_core::workspaces::NOT_SHARED
        } else {
            "volumes are not enabled on this server (they need workspaces and secrets)"
        };
        error(StatusCode::NOT_IMPLEMENTED, why)
    })
}

fn volume_json(state: &AppState, v: &Volume) -> Value {
    let mut out = json!({
        "volumeID": v.record.id,
        "name": v.record.name,
        "token": v.token,
    });
    if let Some(d) = &state.domain {
        out["domain"] = json!(d.as_str());
    }
    out
}

#[derive(Deserialize)]
struct CreateBody {
    name: String,
}

async fn create(State(state): State<AppState>, Who(who): Who, body: Body) -> Answer {
    let volumes = service(&state)?;
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
    let vol = on_thread(p, move || volumes.create(&who.team, &req.name)).await?;
    Ok((StatusCode::CREATED, axum::Json(volume_json(&state, &vol))).into_response())
}

async fn list(State(state): State<AppState>, Who(who): Who) -> Answer {
    let volumes = service(&state)?;
    let p = permit(&state, &who.team)?;
    let all = on_thread(p, move || volumes.list(&who.team)).await?;
    let items: Vec<Value> = all
        .iter()
        .map(|r| json!({"volumeID": r.id, "name": r.name}))
        .collect();
    Ok(axum::Json(items).into_response())
}

async fn info(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let volumes = service(&state)?;
    let p = permit(&state, &who.team)?;
    let vol = on_thread(p, move || volumes.get(&who.team, &id)).await?;
    Ok(axum::Json(volume_json(&state, &vol)).into_response())
}

async fn destroy(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let volumes = service(&state)?;
    let p = permit(&state, &who.team)?;
    on_thread(p, move || volumes.destroy(&who.team, &id)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Runs a volume call on a thread that holds `permit` (every call reaches the helpers).
async fn on_thread<T: Send + 'static>(
    permit: crate::transfers::Permit,
    call: impl FnOnce() -> Result<T, VolumeError> + Send + 'static,
) -> Result<T, Response> {
    crate::transfers::on_thread(permit, call)
        .await
        .map_err(answer)?
        .map_err(answer)
}

/// The volume the request's bearer token opens (401 without one, or with another volume's).
async fn authorize(
    volumes: &Arc<Volumes>,
    id: &str,
    headers: &HeaderMap,
) -> Result<VolumeRecord, Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .unwrap_or("");
    if token.is_empty() {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "missing volume token: send `Authorization: Bearer <token>` with the token the \
             volume API gave",
        ));
    }
    let (volumes, id, token) = (volumes.clone(), id.to_string(), token.to_string());
    tokio::task::spawn_blocking(move || volumes.authorize(&id, &token))
        .await
        .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "the token check failed"))?
        .map_err(answer)
}

/// A content path: absolute within the volume (`/a/b`; `/` is its root), as the workspace's
/// relative path. A relative path is taken as it is.
fn rel(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// A workspace entry as E2B's `VolumeEntryStat`.
fn entry_json(e: &Entry) -> Value {
    let kind = match e.kind {
        EntryKind::File => "file",
        EntryKind::Dir => "directory",
        EntryKind::Symlink => "symlink",
        EntryKind::Other => "unknown",
    };
    let mut v = json!({
        "name": e.name,
        "type": kind,
        "path": format!("/{}", e.path),
        "size": e.size,
        "mode": e.mode,
        "uid": e.uid,
        "gid": e.gid,
        "atime": rfc3339(e.atime),
        "mtime": rfc3339(e.mtime),
        "ctime": rfc3339(e.ctime),
    });
    if let Some(t) = &e.target {
        v["target"] = json!(t);
    }
    v
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Deserialize)]
struct ListQuery {
    path: String,
    depth: Option<usize>,
}

#[derive(Deserialize)]
struct MakeQuery {
    path: String,
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
    force: Option<bool>,
}

impl MakeQuery {
    fn attrs(&self) -> Attrs {
        Attrs {
            uid: self.uid,
            gid: self.gid,
            mode: self.mode,
        }
    }
}

#[derive(Deserialize, Default)]
struct AttrsBody {
    uid: Option<u32>,
    gid: Option<u32>,
    mode: Option<u32>,
}

/// Runs `call` on the workspace of volume `vol` on a thread that holds a slot of its team's
/// transfers (every content call reaches the files helper).
async fn on_volume<T: Send + 'static>(
    state: &AppState,
    volumes: Arc<Volumes>,
    vol: VolumeRecord,
    call: impl FnOnce(&Workspaces, &str, &str) -> Result<T, WorkspaceError> + Send + 'static,
) -> Result<T, Response> {
    let p = permit(state, &vol.team)?;
    blocking(p, move || call(volumes.workspaces(), &vol.team, &vol.name)).await
}

async fn stat(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> Answer {
    let volumes = service(&state)?;
    let vol = authorize(&volumes, &id, &headers).await?;
    let q = query(q)?;
    let entry = on_volume(&state, volumes, vol, move |ws, team, name| {
        ws.stat(team, name, rel(&q.path))
    })
    .await?;
    Ok(axum::Json(entry_json(&entry)).into_response())
}

async fn list_dir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Answer {
    let volumes = service(&state)?;
    let vol = authorize(&volumes, &id, &headers).await?;
    let q = query(q)?;
    let depth = q.depth.unwrap_or(1).clamp(1, MAX_LIST_DEPTH);
    let listing = on_volume(&state, volumes, vol, move |ws, team, name| {
        let path = rel(&q.path);
        // A listing of a file is the file itself in husk's API; here it is "not a directory".
        let at = ws.stat(team, name, path)?;
        if at.kind != EntryKind::Dir {
            return Err(WorkspaceError::NotADirectory {
                place: format!("volume '{name}'"),
                path: q.path.clone(),
                kind: at.kind.as_str(),
            });
        }
        ws.entries(team, name, path, depth)
    })
    .await?;
    let items: Vec<Value> = listing.entries.iter().map(entry_json).collect();
    Ok(axum::Json(items).into_response())
}

async fn make_dir(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<MakeQuery>, QueryRejection>,
) -> Answer {
    let volumes = service(&state)?;
    let vol = authorize(&volumes, &id, &headers).await?;
    let q = query(q)?;
    let entry = on_volume(&state, volumes, vol, move |ws, team, name| {
        let parents = q.force.unwrap_or(false);
        ws.make_dir(team, name, rel(&q.path), parents, &q.attrs())
    })
    .await?;
    Ok((StatusCode::CREATED, axum::Json(entry_json(&entry))).into_response())
}

async fn set_attrs(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<PathQuery>, QueryRejection>,
    body: Body,
) -> Answer {
    let volumes = service(&state)?;
    let vol = authorize(&volumes, &id, &headers).await?;
    let q = query(q)?;
    let bytes = read_all(body, MAX_JSON)
        .await
        .map_err(|e| error(e.status(), e.to_string()))?;
    let body: AttrsBody = if bytes.is_empty() {
        AttrsBody::default()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                format!("expected a JSON body like {{\"uid\": 1000, \"gid\": 1000, \"mode\": 420}}: {e}"),
            )
        })?
    };
    let attrs = Attrs {
        uid: body.uid,
        gid: body.gid,
        mode: body.mode,
    };
    let entry = on_volume(&state, volumes, vol, move |ws, team, name| {
        ws.set_attrs(team, name, rel(&q.path), &attrs)
    })
    .await?;
    Ok(axum::Json(entry_json(&entry)).into_response())
}

async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> Answer {
    let volumes = service(&state)?;
    let vol = authorize(&volumes, &id, &headers).await?;
    let q = query(q)?;
    on_volume(&state, volumes, vol, move |ws, team, name| {
        ws.remove(team, name, rel(&q.path))
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn read_file(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> Answer {
    let volumes = service(&state)?;
    let vol = authorize(&volumes, &id, &headers).await?;
    let q = query(q)?;
    let p = permit(&state, &vol.team)?;
    file_download(&state, p, move || {
        volumes
            .workspaces()
            .read_file(&vol.team, &vol.name, rel(&q.path))
    })
    .await
}

async fn write_file(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    q: Result<Query<MakeQuery>, QueryRejection>,
    body: Body,
) -> Answer {
    let volumes = service(&state)?;
    let (vol, q) = match authorize(&volumes, &id, &headers)
        .await
        .and_then(|v| Ok((v, query(q)?)))
    {
        Ok(x) => x,
        Err(resp) => {
            drain(&headers, body).await;
            return Err(resp);
        }
    };
    let p = match permit(&state, &vol.team) {
        Ok(p) => p,
        Err(resp) => {
            drain(&headers, body).await;
            return Err(resp);
        }
    };
    let limit = volumes.workspaces().upload_limits().max_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        drain(&headers, body).await;
        return Err(answer(WorkspaceError::TooLarge {
            place: format!("volume '{}'", vol.name),
            limit,
        }));
    }
    let options = WriteOptions {
        replace: q.force.unwrap_or(false),
        attrs: q.attrs(),
    };
    let entry = with_body(p, body, move |reader| {
        let ws = volumes.workspaces();
        let path = rel(&q.path);
        ws.write_file_with(&vol.team, &vol.name, path, reader, limit, &options)?;
        ws.stat(&vol.team, &vol.name, path)
    })
    .await?;
    Ok((StatusCode::CREATED, axum::Json(entry_json(&entry))).into_response())
}
