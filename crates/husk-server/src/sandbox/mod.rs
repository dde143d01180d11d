//! The per-sandbox API (what E2B's in-sandbox daemon serves on port 49983): process and
//! filesystem services over Connect-JSON, `/files`, `/envs`, `/health`.
//!
//! Every request is addressed to one sandbox (see [`crate::app::sandbox_target`]). An unknown or
//! dead sandbox gets the 502 JSON answer the SDKs recognise as "not found"; a sandbox that
//! exists is authenticated by its access token (`X-Access-Token`), except for `/health` and
//! for `/files`, which also accept a signature.

mod files;
mod filesystem;
mod process;

pub use filesystem::Watchers;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use husk_core::manager::LiveSandbox;
use husk_proto::User;
use serde_json::json;

use crate::app::{sandbox_target, AppState};
use crate::connect::unary_err;

/// The port of the in-sandbox daemon's API.
pub const ENVD_PORT: u16 = 49983;

pub fn router(state: AppState) -> Router {
    Router::new().fallback(handle).with_state(state)
}

/// The answer for a sandbox that does not exist (or not for this caller).
pub fn sandbox_not_found(id: &str) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(json!({"sandboxId": id, "message": "The sandbox was not found", "code": 502})),
    )
        .into_response()
}

fn port_not_open(id: &str, port: u16) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(json!({
            "sandboxId": id,
            "message": format!("The sandbox is running but port is not open: {port}"),
            "port": port,
            "code": 502,
        })),
    )
        .into_response()
}

/// A plain `{"code", "message"}` error (the envd HTTP endpoints' shape).
pub fn plain_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(json!({"code": status.as_u16(), "message": message.into()})),
    )
        .into_response()
}

fn unauthorized() -> Response {
    plain_error(
        StatusCode::UNAUTHORIZED,
        "unauthorized access, please provide a valid access token or method signing if supported",
    )
}

fn token_ok(sb: &LiveSandbox, req: &Request<Body>) -> bool {
    crate::envd::auth::access_token_ok(req.headers(), Some(&sb.access_token))
}

async fn handle(State(state): State<AppState>, req: Request<Body>) -> Response {
    let Some((id, port)) = sandbox_target(&req) else {
        return sandbox_not_found("");
    };
    let Some(sb) = state.manager.get_any(&id) else {
        return sandbox_not_found(&id);
    };
    if sb.agent.is_closed() {
        return sandbox_not_found(&id);
    }
    if port != ENVD_PORT {
        return port_not_open(&id, port);
    }
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        (Method::GET, "/files") | (Method::POST, "/files") => {
            let token = token_ok(&sb, &req);
            files::handle(sb, req, token).await
        }
        _ if !token_ok(&sb, &req) => unauthorized(),
        (Method::GET, "/envs") => {
            let env: serde_json::Map<String, serde_json::Value> =
                sb.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            axum::Json(env).into_response()
        }
        (Method::POST, p) => {
            let user = match crate::envd::auth::rpc_user(req.headers(), User::User) {
                Ok(u) => u,
                Err(e) => return unary_err(e),
            };
            if let Some(m) = p.strip_prefix("/process.Process/") {
                process::handle(sb, m.to_string(), user, req).await
            } else if let Some(m) = p.strip_prefix("/filesystem.Filesystem/") {
                filesystem::handle(sb, state.watchers.clone(), m.to_string(), user, req).await
            } else {
                plain_error(StatusCode::NOT_FOUND, format!("no such endpoint: {p}"))
            }
        }
        (_, p) => plain_error(StatusCode::NOT_FOUND, format!("no such endpoint: {p}")),
    }
}

/// Shared by the services: the sandbox as an `Arc`.
pub type Sandbox = Arc<LiveSandbox>;
