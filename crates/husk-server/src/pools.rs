//! `GET /husk/v1/pools`: the warm pools' figures (what `husk serve --warm` keeps), for an
//! operator's admin key. Other keys get 403: how often a pool is claimed tells of other
//! teams' activity.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use crate::rest::{error, Who};
use crate::AppState;

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/husk/v1/pools", get(list))
        .with_state(state)
}

async fn list(State(state): State<AppState>, Who(who): Who) -> Response {
    if !who.admin {
        return error(
            StatusCode::FORBIDDEN,
            format!(
                "the pools' figures need an admin key (key {} of team '{}' is not one)",
                who.key_id, who.team
            ),
        );
    }
    axum::Json(json!({ "pools": state.manager.pool_stats() })).into_response()
}
