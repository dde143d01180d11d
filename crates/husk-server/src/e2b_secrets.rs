//! E2B's secret API on husk's sealed secrets (`husk_core::secrets`): the stock SDKs'
//! `Secret.create/update/get_info/list/exists/destroy`. One store with husk's own API
//! (`/husk/v1/secrets`): a secret made here is a husk secret (a process names it as
//! `husk-secret://name`), and husk's are listed here.
//!
//! - `POST /secrets` `{"name", "value", "metadata"?}` → 201 `Secret`; the name is lower-cased,
//!   as E2B does, and a name taken is 409.
//! - `GET /secrets?limit=&nextToken=` → `[Secret]` by name, `X-Next-Token` when more follow.
//! - `GET|POST|DELETE /secrets/{secretID}`, by id (`sec_...`) or name: info; a new value (a
//!   new version; the metadata replaced when given); delete (204, 404 when missing).
//!
//! No route ever returns a value. Another team's secret is answered as a missing one.

// Handlers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use husk_core::secrets::{Metadata, SecretInfo, Secrets, MAX_SECRET_BYTES, METADATA_BYTES};
use husk_core::store::PutMode;
use serde::Deserialize;
use serde_json::{json, Value};
use zeroize::Zeroizing;

use crate::error::answer;
use crate::rest::{error, rfc3339, Who};
use crate::AppState;

type Answer = Result<Response, Response>;

/// Largest request body: a value, its metadata, and JSON's escapes around them.
const MAX_BODY: usize = 2 * (MAX_SECRET_BYTES + METADATA_BYTES) + 4096;

/// Secrets in one page when the client names no limit, and the most it may ask for.
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/secrets", get(list).post(create))
        .route("/secrets/{id}", get(info).post(update).delete(destroy))
        .with_state(state)
}

fn service(state: &AppState) -> Result<&Secrets, Response> {
    state.secrets.as_deref().ok_or_else(|| {
        error(
            StatusCode::NOT_IMPLEMENTED,
            "secrets are not enabled on this server",
        )
    })
}

fn secret_json(s: &SecretInfo) -> Value {
    json!({
        "secretID": s.id,
        "name": s.name,
        "currentVersion": s.version,
        "metadata": s.metadata,
        "createdAt": rfc3339(s.created_at),
        "updatedAt": rfc3339(s.updated_at),
    })
}

/// A create's or an update's body. The value is wiped when dropped.
#[derive(Deserialize)]
struct ValueBody {
    name: Option<String>,
    value: Zeroizing<String>,
    metadata: Option<Metadata>,
}

async fn body(body: Body) -> Result<ValueBody, Response> {
    let bytes = crate::body::read_all(body, MAX_BODY)
        .await
        .map_err(|e| error(e.status(), e.to_string()))?;
    let bytes = Zeroizing::new(bytes.to_vec());
    let parsed: ValueBody = serde_json::from_slice(&bytes).map_err(|e| {
        // serde's message names the field and position, never the value.
        error(
            StatusCode::BAD_REQUEST,
            format!("expected a JSON body like {{\"name\": \"openai-api-key\", \"value\": \"...\", \"metadata\": {{}}}}: {e}"),
        )
    })?;
    if parsed.value.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the secret's value is empty",
        ));
    }
    Ok(parsed)
}

async fn create(State(state): State<AppState>, Who(who): Who, b: Body) -> Answer {
    let secrets = service(&state)?;
    let req = body(b).await?;
    let Some(name) = req.name.as_deref() else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the secret's name is missing",
        ));
    };
    // E2B stores names lower-cased and answers with that form.
    let name = name.to_ascii_lowercase();
    secrets
        .write(
            &who.team,
            &name,
            req.value.as_bytes(),
            PutMode::Create,
            Some(&req.metadata.clone().unwrap_or_default()),
        )
        .map_err(answer)?;
    let info = secrets.info(&who.team, &name).map_err(answer)?;
    Ok((StatusCode::CREATED, axum::Json(secret_json(&info))).into_response())
}

async fn update(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    b: Body,
) -> Answer {
    let secrets = service(&state)?;
    let req = body(b).await?;
    let name = secrets.find(&who.team, &id).map_err(answer)?.name;
    secrets
        .write(
            &who.team,
            &name,
            req.value.as_bytes(),
            PutMode::Update,
            req.metadata.as_ref(),
        )
        .map_err(answer)?;
    let info = secrets.info(&who.team, &name).map_err(answer)?;
    Ok(axum::Json(secret_json(&info)).into_response())
}

async fn info(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let info = service(&state)?.find(&who.team, &id).map_err(answer)?;
    Ok(axum::Json(secret_json(&info)).into_response())
}

async fn destroy(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let secrets = service(&state)?;
    let name = secrets.find(&who.team, &id).map_err(answer)?.name;
    secrets.remove(&who.team, &name).map_err(answer)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    #[serde(rename = "nextToken")]
    next_token: Option<String>,
}

async fn list(
    State(state): State<AppState>,
    Who(who): Who,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Answer {
    let secrets = service(&state)?;
    let Query(q) = q.map_err(|e| error(StatusCode::BAD_REQUEST, format!("bad query: {e}")))?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("limit must be 1 to {MAX_PAGE}"),
        ));
    }
    let all = secrets.list(&who.team).map_err(answer)?;
    // The token is the name the next page starts at (names are unique and listed in order).
    let start = q.next_token.as_deref().unwrap_or("");
    let rest: Vec<&SecretInfo> = all.iter().filter(|s| s.name.as_str() >= start).collect();
    let page: Vec<Value> = rest.iter().take(limit).map(|s| secret_json(s)).collect();
    let mut resp = axum::Json(page).into_response();
    if let Some(next) = rest.get(limit) {
        if let Ok(v) = HeaderValue::from_str(&next.name) {
            resp.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(resp)
}
