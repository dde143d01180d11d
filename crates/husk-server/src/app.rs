//! The one listener: HTTP/1.1 (chunked request bodies included) and h2c, carrying the control
//! plane and the per-sandbox APIs.
//!
//! A request goes to the sandbox router when it names a sandbox: by the `E2b-Sandbox-Id` and
//! `E2b-Sandbox-Port` headers (what the SDKs send when `E2B_SANDBOX_URL` points here), or by a
//! `Host` of the form `<port>-<sandboxID>.<domain>`. Everything else is the REST API.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;
use axum::Router;
use husk_core::manager::Manager;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    pub manager: Arc<Manager>,
    /// Polling file watchers (the synchronous SDK's `watch_dir`).
    pub watchers: Arc<crate::sandbox::Watchers>,
}

impl AppState {
    pub fn new(manager: Arc<Manager>) -> AppState {
        AppState {
            manager,
            watchers: Arc::default(),
        }
    }
}

/// The sandbox a request is addressed to: (id, port).
pub fn sandbox_target(req: &Request<Body>) -> Option<(String, u16)> {
    let h = req.headers();
    if let Some(id) = h.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()) {
        let port = h
            .get("e2b-sandbox-port")
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.parse().ok())
            .unwrap_or(crate::sandbox::ENVD_PORT);
        return Some((id.to_string(), port));
    }
    let host = h
        .get(axum::http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host())?;
    let first = host.split('.').next()?;
    if !host.contains('.') {
        return None;
    }
    let (port, id) = first.split_once('-')?;
    let port = port.parse().ok()?;
    if id.is_empty()
        || !id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return None;
    }
    Some((id.to_string(), port))
}

/// The whole HTTP service.
pub fn service(
    state: AppState,
) -> impl tower::Service<
    Request<Body>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send,
> + Clone
       + Send {
    let rest: Router = crate::rest::router(state.clone());
    let sandbox: Router = crate::sandbox::router(state);
    tower::service_fn(move |req: Request<Body>| {
        let (rest, sandbox) = (rest.clone(), sandbox.clone());
        async move {
            let mut resp = match sandbox_target(&req) {
                Some(_) => sandbox.oneshot(req).await,
                None => rest.oneshot(req).await,
            }?;
            resp.headers_mut()
                .insert("server", HeaderValue::from_static("husk"));
            Ok(resp)
        }
    })
}

/// Serves until `shutdown` resolves, then stops accepting and lets open requests finish.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let svc = service(state);
    let make = axum::ServiceExt::<Request<Body>>::into_make_service(svc);
    axum::serve(listener, make)
        .with_graceful_shutdown(shutdown)
        .await
}
