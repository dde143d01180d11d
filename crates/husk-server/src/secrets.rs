//! Secrets over HTTP, under `/husk/v1/secrets`: a team stores, lists and removes its own
//! secrets with any of its keys. No endpoint ever returns a value; a team never sees another
//! team's names. Values are bounded ([`MAX_SECRET_BYTES`]) and read as raw bytes.

// Handlers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Router;
use husk_core::secrets::MAX_SECRET_BYTES;
use serde_json::json;

use crate::error::answer;
use crate::rest::{error, rfc3339, Who};
use crate::AppState;

type Answer = Result<Response, Response>;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/husk/v1/secrets", get(list))
        .route("/husk/v1/secrets/{name}", put(set).delete(remove))
        .with_state(state)
}

fn service(state: &AppState) -> Result<&husk_core::secrets::Secrets, Response> {
    state.secrets.as_deref().ok_or_else(|| {
        error(
            StatusCode::NOT_IMPLEMENTED,
            "secrets are not enabled on this server",
        )
    })
}

async fn list(State(state): State<AppState>, Who(who): Who) -> Answer {
    let all = service(&state)?.list(&who.team).map_err(answer)?;
    let items: Vec<_> = all
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "created_at": rfc3339(s.created_at),
                "updated_at": rfc3339(s.updated_at),
            })
        })
        .collect();
    Ok(axum::Json(json!({ "secrets": items })).into_response())
}

async fn set(
    State(state): State<AppState>,
    Who(who): Who,
    Path(name): Path<String>,
    body: Body,
) -> Answer {
    let secrets = service(&state)?;
    husk_core::secrets::validate_name(&name).map_err(answer)?;
    let value = crate::body::read_all(body, MAX_SECRET_BYTES)
        .await
        .map_err(|e| match e {
            crate::body::ReadError::TooLarge(_) => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("secret '{name}' is too large (at most {MAX_SECRET_BYTES} bytes)"),
            ),
            e => error(e.status(), e.to_string()),
        })?;
    let value = zeroize::Zeroizing::new(value.to_vec());
    if value.is_empty() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            format!("secret '{name}': the value (the request body) is empty"),
        ));
    }
    secrets.set(&who.team, &name, &value).map_err(answer)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn remove(State(state): State<AppState>, Who(who): Who, Path(name): Path<String>) -> Answer {
    service(&state)?.remove(&who.team, &name).map_err(answer)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
