//! The per-sandbox API (what E2B's in-sandbox daemon serves on port 49983): process and
//! filesystem services over Connect-JSON, `/files`, `/envs`, `/health`; port 49999 is the
//! code interpreter ([`interpreter`]); every other port goes to the sandbox's own servers
//! ([`ingress`]).
//!
//! Every request is addressed to one sandbox (see [`crate::app::SandboxTarget`]). An unknown or
//! dead sandbox gets the 502 JSON answer the SDKs recognise as "not found"; a sandbox that
//! exists is authenticated by its access token (`X-Access-Token`), except for `/health` and
//! for `/files`, which also accept a signature.

mod files;
mod filesystem;
pub(crate) mod ingress;
pub(crate) mod interpreter;
mod process;
mod rpc;
pub mod signed;
mod watch_buffer;

pub use filesystem::Watchers;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use husk_core::calls::User;
use husk_core::manager::{Credentials, Inactive, LiveSandbox};
use serde_json::json;

use crate::app::{AppState, SandboxTarget};
use crate::connect::unary_err;
use crate::envd::auth::{access_token_ok, rpc_user};
use crate::files::{sandbox_not_found, FilesError};

/// The port of the in-sandbox daemon's API.
pub const ENVD_PORT: u16 = 49983;

pub fn router(state: AppState) -> Router {
    Router::new().fallback(handle).with_state(state)
}

fn no_such_endpoint(path: &str) -> Response {
    FilesError::not_found(format!("no such endpoint: {path}")).into_response()
}

async fn handle(State(state): State<AppState>, req: Request<Body>) -> Response {
    // The app's dispatcher only routes requests here that name a sandbox.
    let Some(SandboxTarget { id, port }) = req.extensions().get::<SandboxTarget>().cloned() else {
        return sandbox_not_found("");
    };
    // A paused sandbox with auto-resume wakes for a request that would be let in once it
    // runs (never for one that would not: naming it must not be enough).
    let presented = Presented::of(req.headers());
    let sb = match state
        .manager
        .active(&id, |c| presented.wakes(port, c))
        .await
    {
        Ok(sb) => sb,
        Err(Inactive::NotFound) => return sandbox_not_found(&id),
        Err(Inactive::Paused) => return sandbox_paused(&id),
        Err(Inactive::ResumeFailed(e)) => {
            tracing::warn!(sandbox = %id, error = %husk_core::error_chain(&e), "auto-resume failed");
            return crate::error::answer(e);
        }
    };
    if sb.is_gone() {
        return sandbox_not_found(&id);
    }
    if port == interpreter::PORT {
        return interpreter::handle(&state, sb, req).await;
    }
    if port != ENVD_PORT {
        return ingress::handle(&state, sb, port, req).await;
    }
    let path = req.uri().path().to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/health") => StatusCode::NO_CONTENT.into_response(),
        // `/files` takes the access token or a signature (files::handle checks both).
        (Method::GET, "/files") | (Method::POST, "/files") => files::handle(sb, req).await,
        _ if !access_token_ok(req.headers(), Some(sb.access_token())) => {
            FilesError::unauthorized_access().into_response()
        }
        (Method::GET, "/envs") => {
            let env: serde_json::Map<String, serde_json::Value> = sb
                .env()
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            axum::Json(env).into_response()
        }
        (Method::POST, p) => {
            let user = match rpc_user(req.headers(), User::User) {
                Ok(u) => u,
                Err(e) => return unary_err(e),
            };
            if let Some(m) = p.strip_prefix("/process.Process/") {
                let (manager, bodies) = (state.manager.clone(), state.bodies.clone());
                process::handle(sb, manager, bodies, m.to_string(), user, req).await
            } else if let Some(m) = p.strip_prefix("/filesystem.Filesystem/") {
                let (w, bodies) = (state.watchers.clone(), state.bodies.clone());
                filesystem::handle(sb, w, bodies, m.to_string(), user, req).await
            } else {
                no_such_endpoint(p)
            }
        }
        (_, p) => no_such_endpoint(p),
    }
}

/// The credentials a request presents, kept apart from it (the request cannot be held across
/// a resume: its body is not `Sync`). Taken for every request to a sandbox: the values are
/// shared with the request's headers, not copied, and nothing is allocated for a request
/// without a traffic token.
struct Presented {
    access: Option<axum::http::HeaderValue>,
    traffic: Vec<axum::http::HeaderValue>,
}

impl Presented {
    fn of(headers: &axum::http::HeaderMap) -> Presented {
        Presented {
            access: headers.get(crate::envd::auth::ACCESS_TOKEN_HEADER).cloned(),
            traffic: headers
                .get_all(ingress::TRAFFIC_TOKEN_HEADER)
                .iter()
                .cloned()
                .collect(),
        }
    }

    /// Whether a request to `port` of a paused sandbox carries what would let it in: the
    /// access token for the in-sandbox API, the access or traffic token for the code
    /// interpreter, and for the sandbox's own servers the traffic token unless they are public.
    fn wakes(&self, port: u16, c: &Credentials<'_>) -> bool {
        use crate::files::auth::constant_time_eq;
        let access = || {
            self.access
                .as_ref()
                .is_some_and(|v| constant_time_eq(v.as_bytes(), c.access_token.as_bytes()))
        };
        let traffic = || {
            (self.traffic.iter())
                .any(|v| constant_time_eq(v.as_bytes(), c.traffic_access_token.as_bytes()))
        };
        match port {
            ENVD_PORT => access(),
            interpreter::PORT => access() || traffic(),
            _ => c.public_traffic || traffic(),
        }
    }
}

/// The answer for a paused sandbox that a request may not wake: a 502 as for a sandbox that
/// does not run (the SDKs then report it not running), saying it is paused.
fn sandbox_paused(id: &str) -> Response {
    let body = json!({
        "sandboxId": id,
        "message": format!(
            "The sandbox {id} is paused: resume it with Sandbox.connect(), or create it with \
             auto-resume"
        ),
        "code": 502,
    });
    (StatusCode::BAD_GATEWAY, axum::Json(body)).into_response()
}

/// Shared by the services: the sandbox as an `Arc`.
pub type Sandbox = Arc<LiveSandbox>;
