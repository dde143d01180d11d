//! Snapshots and forks, E2B's routes: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//! `POST /sandboxes/{id}/fork` (and `DELETE /templates/{id}` for a snapshot, in
//! `crate::templates`). A team's key sees and uses only the team's snapshots.

#![allow(clippy::result_large_err)]

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use husk_core::manager::{Snapshot, SnapshotFilter, MAX_FORKS};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{answer, ApiError};
use crate::rest::{
    domain, error, page_limit, parse_body, query_value, sandbox_json, timeout_secs, Answer, Who,
};
use crate::AppState;

#[derive(Deserialize, Default)]
#[serde(default)]
struct SnapshotBody {
    name: Option<String>,
    /// `false`: only the file system. Read for its type only (a malformed one is a 400):
    /// husk's snapshots never hold memory, so both are the same.
    #[serde(rename = "memory")]
    _memory: Option<bool>,
}

/// E2B's `SnapshotInfo`.
fn snapshot_json(s: &Snapshot) -> Value {
    json!({"snapshotID": s.snapshot_id(), "names": s.names()})
}

/// `POST /sandboxes/{id}/snapshots`: 201 with the snapshot; 409 for a paused sandbox.
pub async fn create_snapshot(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: SnapshotBody = parse_body(&body)?;
    let name = req.name.as_deref().filter(|n| !n.is_empty());
    let snap = state
        .manager
        .snapshot(&who, &id, name)
        .await
        .map_err(answer)?;
    Ok((StatusCode::CREATED, axum::Json(snapshot_json(&snap))).into_response())
}

/// `GET /snapshots?sandboxID&name&limit&nextToken`: the team's snapshots, newest first; the
/// next page's token in `X-Next-Token`.
pub async fn list_snapshots(
    State(state): State<AppState>,
    Who(who): Who,
    Query(q): Query<Vec<(String, String)>>,
) -> Answer {
    let get = |k: &str| query_value(&q, k).filter(|v| !v.is_empty());
    let limit = page_limit(&q)?;
    let filter = SnapshotFilter {
        sandbox: get("sandboxID").map(str::to_owned),
        name: get("name").map(str::to_owned),
    };
    let mut items = state.manager.list_snapshots(&who.team, &filter);
    // The page token is the position key of the last item returned: (time, id), newest first.
    let key = |s: &Snapshot| format!("{:020}.{}", s.created_at, s.id);
    if let Some(token) = get("nextToken") {
        items.retain(|s| key(s).as_str() < token);
    }
    let page: Vec<&Arc<Snapshot>> = items.iter().take(limit).collect();
    let mut resp =
        axum::Json(page.iter().map(|s| snapshot_json(s)).collect::<Vec<_>>()).into_response();
    if items.len() > limit {
        if let Some(v) = page
            .last()
            .and_then(|l| HeaderValue::from_str(&key(l)).ok())
        {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct ForkBody {
    timeout: Option<i64>,
    count: Option<i64>,
}

/// `POST /sandboxes/{id}/fork`: 201 with one `{"sandbox"}` or `{"error"}` per fork.
pub async fn fork(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: ForkBody = parse_body(&body)?;
    let count = match req.count {
        None => 1,
        Some(n) if (1..=i64::from(MAX_FORKS)).contains(&n) => n as u32,
        Some(n) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("count must be between 1 and {MAX_FORKS} (got {n})"),
            ))
        }
    };
    let timeout = req.timeout.map(|t| timeout_secs(Some(t))).transpose()?;
    let results = state
        .manager
        .fork(&who, &id, count, timeout)
        .await
        .map_err(answer)?;
    let domain = domain(&state);
    let items: Vec<Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(sb) => json!({"sandbox": sandbox_json(&sb, domain.clone())}),
            Err(e) => json!({"error": ApiError::from(e).to_json()}),
        })
        .collect();
    Ok((StatusCode::CREATED, axum::Json(items)).into_response())
}

/// `DELETE /templates/{id}` of one of the team's snapshots: `None` when `id` names none (it
/// may be a template).
pub async fn delete_snapshot(state: &AppState, team: &str, id: &str) -> Option<Response> {
    match state.manager.delete_snapshot(team, id).await {
        Ok(true) => Some(StatusCode::NO_CONTENT.into_response()),
        Ok(false) => None,
        Err(e) => Some(answer(e)),
    }
}
