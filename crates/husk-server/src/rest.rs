//! The control plane: E2B-compatible REST routes under `X-API-KEY`.
//!
//! Handlers parse into the core's typed requests and map [`CoreError`] to the status codes and
//! `{"code", "message"}` bodies the SDKs read. Bodies are parsed by hand (not axum's `Json`
//! extractor) so that a malformed body gets the same JSON error shape as everything else.

// Helpers return the finished error `Response` as their `Err`: that is the point of them, and
// the size of a `Response` does not matter next to a network round trip.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::Router;
use husk_core::manager::{
    CoreError, CreateRequest, ListFilter, LiveSandbox, Manager, ENVD_VERSION,
};
use husk_core::store::Principal;
use serde::Deserialize;
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::AppState;

/// Largest control-plane request body.
const MAX_BODY: usize = 1 << 20;
/// Default sandbox timeout when a request names none (what the SDKs send anyway).
const DEFAULT_TIMEOUT_SECS: u64 = 300;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/sandboxes", post(create).get(list))
        .route("/v2/sandboxes", post(create).get(list))
        .route("/sandboxes/{id}", get(info).delete(kill))
        .route("/sandboxes/{id}/connect", post(connect))
        .route("/v2/sandboxes/{id}/connect", post(connect))
        .route("/sandboxes/{id}/timeout", post(set_timeout))
        .route("/sandboxes/{id}/metrics", get(metrics))
        .route("/sandboxes/{id}/pause", post(unsupported_pause))
        .route("/sandboxes/{id}/resume", post(unsupported_pause))
        .route("/sandboxes/{id}/fork", post(unsupported_fork))
        .route("/sandboxes/{id}/snapshots", post(unsupported_snapshot))
        .route("/snapshots", get(unsupported_snapshot))
        .route("/sandboxes/{id}/network", put(unsupported_network))
        .route("/templates/{id}", delete(unsupported_snapshot))
        .fallback(not_found_route)
        .with_state(state)
}

/// An error answer: `{"code": N, "message": "..."}`, with `Should-Retry: false` on 5xx so the
/// SDKs do not repeat a request that will fail the same way.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let mut resp = (
        status,
        axum::Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response();
    if status.is_server_error() {
        resp.headers_mut()
            .insert("should-retry", HeaderValue::from_static("false"));
    }
    resp
}

fn core_error(e: CoreError) -> Response {
    let status = match &e {
        CoreError::NotFound(_) => StatusCode::NOT_FOUND,
        CoreError::TemplateNotFound(_) => StatusCode::NOT_FOUND,
        CoreError::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
        CoreError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        CoreError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        CoreError::Spawn(_) | CoreError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    let mut resp = error(status, e.to_string());
    if status == StatusCode::TOO_MANY_REQUESTS {
        // A quota is not a transient condition: retrying at once would not help.
        resp.headers_mut()
            .insert("should-retry", HeaderValue::from_static("false"));
    }
    resp
}

/// Authenticates `X-API-KEY` (header names are case-insensitive).
fn auth(state: &AppState, headers: &HeaderMap) -> Result<Principal, Response> {
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if key.is_empty() {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "missing API key: set the X-API-KEY header (E2B_API_KEY in the SDKs)",
        ));
    }
    state
        .manager
        .store()
        .authenticate(key)
        .ok_or_else(|| error(StatusCode::UNAUTHORIZED, "Invalid API key"))
}

fn parse_body<T: for<'de> Deserialize<'de> + Default>(body: &Bytes) -> Result<T, Response> {
    if body.len() > MAX_BODY {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request body too large",
        ));
    }
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => return Ok(T::default()),
        Some(b'{') => {}
        Some(_) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid request body: expected a JSON object",
            ))
        }
    }
    serde_json::from_slice(body).map_err(|e| {
        error(
            StatusCode::BAD_REQUEST,
            format!("invalid request body: {e}"),
        )
    })
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

async fn not_found_route() -> Response {
    error(StatusCode::NOT_FOUND, "no such route")
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: Option<String>,
    timeout: Option<i64>,
    metadata: Option<BTreeMap<String, String>>,
    #[serde(rename = "envVars")]
    env_vars: Option<BTreeMap<String, String>>,
    allow_internet_access: Option<bool>,
    #[serde(rename = "autoPause")]
    auto_pause: Option<bool>,
}

fn timeout_secs(t: Option<i64>) -> Result<Duration, Response> {
    match t {
        None => Ok(Duration::from_secs(DEFAULT_TIMEOUT_SECS)),
        Some(t) if t < 0 => Err(error(
            StatusCode::BAD_REQUEST,
            format!("timeout must not be negative (got {t})"),
        )),
        Some(t) => Ok(Duration::from_secs(t as u64)),
    }
}

fn sandbox_json(sb: &LiveSandbox) -> Value {
    json!({
        "templateID": sb.template,
        "sandboxID": sb.id,
        "clientID": "husk",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.access_token,
        "trafficAccessToken": null,
        "domain": null,
    })
}

fn detail_json(sb: &LiveSandbox) -> Value {
    json!({
        "templateID": sb.template,
        "sandboxID": sb.id,
        "clientID": "husk",
        "startedAt": rfc3339(sb.started_at),
        "endAt": rfc3339(sb.end_at()),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.access_token,
        "cpuCount": sb.cpu_count(),
        "memoryMB": sb.memory_mb(),
        "diskSizeMB": sb.disk_mb(),
        "state": "running",
        "metadata": sb.metadata,
        "allowInternetAccess": sb.allow_internet_access,
        "domain": null,
        "lifecycle": {"autoResume": false, "onTimeout": "kill"},
    })
}

fn listed_json(sb: &LiveSandbox) -> Value {
    json!({
        "templateID": sb.template,
        "sandboxID": sb.id,
        "clientID": "husk",
        "startedAt": rfc3339(sb.started_at),
        "endAt": rfc3339(sb.end_at()),
        "envdVersion": ENVD_VERSION,
        "cpuCount": sb.cpu_count(),
        "memoryMB": sb.memory_mb(),
        "diskSizeMB": sb.disk_mb(),
        "state": "running",
        "metadata": sb.metadata,
    })
}

async fn create(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let req: NewSandbox = match parse_body(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    if req.auto_pause == Some(true) {
        return error(
            StatusCode::BAD_REQUEST,
            "autoPause is not supported by husk: sandboxes are killed at their timeout",
        );
    }
    let timeout = match timeout_secs(req.timeout) {
        Ok(t) => t,
        Err(r) => return r,
    };
    let create = CreateRequest {
        template: req.template_id.unwrap_or_else(|| "base".into()),
        timeout,
        metadata: req.metadata.unwrap_or_default(),
        env: req.env_vars.unwrap_or_default().into_iter().collect(),
        allow_internet_access: req.allow_internet_access,
    };
    match state.manager.create(&who, create).await {
        Ok(sb) => (StatusCode::CREATED, axum::Json(sandbox_json(&sb))).into_response(),
        Err(e) => core_error(e),
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TimeoutBody {
    timeout: Option<i64>,
}

async fn connect(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let req: TimeoutBody = match parse_body(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let timeout = match timeout_secs(req.timeout) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match state.manager.connect(&who, &id, timeout) {
        Ok(sb) => (StatusCode::OK, axum::Json(sandbox_json(&sb))).into_response(),
        Err(e) => core_error(e),
    }
}

async fn set_timeout(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let req: TimeoutBody = match parse_body(&body) {
        Ok(r) => r,
        Err(r) => return r,
    };
    let Some(t) = req.timeout else {
        return error(StatusCode::BAD_REQUEST, "timeout is required");
    };
    let timeout = match timeout_secs(Some(t)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match state.manager.set_timeout(&who, &id, timeout) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => core_error(e),
    }
}

async fn info(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    match state.manager.get(&who, &id) {
        Ok(sb) => axum::Json(detail_json(&sb)).into_response(),
        Err(e) => core_error(e),
    }
}

async fn kill(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    match state.manager.kill(&who, &id).await {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(e) => core_error(e),
    }
}

async fn metrics(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    match state.manager.metrics(&who, &id).await {
        Ok(m) => axum::Json(json!([{
            "timestamp": rfc3339(m.timestamp),
            "timestampUnix": m.timestamp.unix_timestamp(),
            "cpuCount": m.cpu_count,
            "cpuUsedPct": m.cpu_used_pct,
            "memUsed": m.mem_used,
            "memTotal": m.mem_total,
            "memCache": m.mem_cache,
            "diskUsed": m.disk_used,
            "diskTotal": m.disk_total,
        }]))
        .into_response(),
        Err(e) => core_error(e),
    }
}

/// Decodes the SDKs' layered metadata filter: the framework-decoded value is itself a
/// query string whose keys and values are percent-encoded once more.
pub fn parse_metadata_filter(raw: &str) -> Vec<(String, String)> {
    let once = percent_encoding::percent_decode_str(raw).decode_utf8_lossy();
    form_urlencoded::parse(once.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

async fn list(
    State(state): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let who = match auth(&state, &headers) {
        Ok(w) => w,
        Err(r) => return r,
    };
    let get = |k: &str| {
        q.iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    let mut filter = ListFilter::default();
    for (k, v) in q.iter().filter(|(k, _)| k == "metadata" || k == "query") {
        let _ = k;
        filter.metadata.extend(parse_metadata_filter(v));
    }
    filter.template = get("template").map(str::to_string);
    if let Some(t) = get("startedAfter") {
        match OffsetDateTime::parse(t, &Rfc3339) {
            Ok(t) => filter.started_after = Some(t),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("startedAfter must be an RFC 3339 date-time (got '{t}')"),
                )
            }
        }
    }
    let states: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "state")
        .flat_map(|(_, v)| v.split(','))
        .filter(|s| !s.is_empty())
        .collect();
    for s in &states {
        if *s != "running" && *s != "paused" {
            return error(StatusCode::BAD_REQUEST, format!("unknown state '{s}'"));
        }
    }
    let limit = match get("limit").map(str::parse::<usize>) {
        None => 100,
        Some(Ok(n)) if (1..=100).contains(&n) => n,
        Some(_) => return error(StatusCode::BAD_REQUEST, "limit must be between 1 and 100"),
    };
    let desc = match get("order") {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(o) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("order must be asc or desc (got '{o}')"),
            )
        }
    };
    // Only running sandboxes exist in husk.
    let mut items = if states.is_empty() || states.contains(&"running") {
        state.manager.list(&who, &filter)
    } else {
        Vec::new()
    };
    if desc {
        items.reverse();
    }
    // The page token is the position key of the last item returned: (start time, id).
    let key = |sb: &LiveSandbox| format!("{:020}.{}", sb.started_at.unix_timestamp_nanos(), sb.id);
    if let Some(token) = get("nextToken") {
        items.retain(|sb| {
            let k = key(sb);
            if desc {
                k.as_str() < token
            } else {
                k.as_str() > token
            }
        });
    }
    let total = items.len();
    let page: Vec<&Arc<LiveSandbox>> = items.iter().take(limit).collect();
    let mut resp =
        axum::Json(page.iter().map(|sb| listed_json(sb)).collect::<Vec<_>>()).into_response();
    if total > limit {
        if let Some(last) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&key(last)) {
                resp.headers_mut().insert("x-next-token", v);
            }
        }
    }
    resp
}

fn unsupported(what: &str) -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        format!("{what} is not supported by husk"),
    )
}

async fn unsupported_pause(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match auth(&state, &headers) {
        Ok(_) => unsupported("pausing and resuming sandboxes"),
        Err(r) => r,
    }
}

async fn unsupported_fork(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match auth(&state, &headers) {
        Ok(_) => unsupported("forking sandboxes"),
        Err(r) => r,
    }
}

async fn unsupported_snapshot(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match auth(&state, &headers) {
        Ok(_) => unsupported("snapshots"),
        Err(r) => r,
    }
}

async fn unsupported_network(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match auth(&state, &headers) {
        Ok(_) => unsupported("changing a sandbox's network policy"),
        Err(r) => r,
    }
}

/// The team's live sandbox, for handlers of other modules.
pub fn manager(state: &AppState) -> &Arc<Manager> {
    &state.manager
}
