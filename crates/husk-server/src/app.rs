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
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
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
    /// Template builds and removal (`None`: templates can only be listed).
    pub templates: Option<Arc<crate::templates::TemplateService>>,
    /// Teams' secrets (`None`: the secrets API answers 501).
    pub secrets: Option<Arc<husk_core::secrets::Secrets>>,
    /// Teams' workspaces (`None`: the workspaces API answers 501).
    pub workspaces: Option<Arc<husk_core::workspaces::Workspaces>>,
    /// E2B's volumes: the workspaces with ids and tokens (`None` without secrets or
    /// workspaces: the volume API answers 501).
    pub volumes: Option<Arc<husk_core::volumes::Volumes>>,
    /// One-shot runs and batches (`None`: their API answers 501).
    pub runs: Option<Arc<husk_core::runs::Runs>>,
    /// How fast clients must send request bodies and read streamed transfers.
    pub body_policy: crate::body::BodyPolicy,
    /// Workspace operations in progress, a few per team.
    pub transfers: Arc<crate::transfers::Transfers>,
    /// Request bodies read whole (runs, code, Connect calls), per team.
    pub bodies: Arc<crate::budget::Budget>,
    /// The domain sandboxes are reachable under (`None`: the SDKs get `domain: null`).
    pub domain: Option<crate::domain::Domain>,
    /// Signed file URLs that name no sandbox, and the sandboxes they were found for.
    pub signed: Arc<crate::sandbox::signed::SignedRoutes>,
    /// A cluster's node: the token every request must carry, the gateway's word for who the
    /// caller is (see [`crate::cluster`]). `None`: a server of its own (`husk serve`).
    pub cluster: Option<crate::cluster::ClusterToken>,
}

/// Bytes of request bodies that one team's requests may hold in the server at once.
pub const TEAM_BODY_BYTES: u64 = 64 << 20;

impl AppState {
    pub fn new(manager: Arc<Manager>) -> AppState {
        AppState {
            manager,
            watchers: Arc::default(),
            templates: None,
            secrets: None,
            workspaces: None,
            volumes: None,
            runs: None,
            body_policy: crate::body::BodyPolicy::default(),
            transfers: Arc::new(crate::transfers::Transfers::new(Default::default())),
            bodies: crate::budget::Budget::new("request bodies", TEAM_BODY_BYTES),
            domain: None,
            signed: Arc::default(),
            cluster: None,
        }
    }

    /// A cluster's node: only holders of `token` (the gateways) are served.
    pub fn with_cluster(mut self, token: crate::cluster::ClusterToken) -> AppState {
        self.cluster = Some(token);
        self
    }

    /// The domain given to the SDKs as each sandbox's `domain`.
    pub fn with_domain(mut self, domain: Option<crate::domain::Domain>) -> AppState {
        self.domain = domain;
        self
    }

    /// How fast clients must send request bodies (and read transfers).
    pub fn with_body_policy(mut self, policy: crate::body::BodyPolicy) -> AppState {
        self.body_policy = policy;
        self
    }

    /// How many workspace operations may run at once, per team and in all.
    pub fn with_transfer_limits(mut self, limits: crate::transfers::TransferLimits) -> AppState {
        self.transfers = Arc::new(crate::transfers::Transfers::new(limits));
        self
    }

    pub fn with_runs(mut self, runs: Arc<husk_core::runs::Runs>) -> AppState {
        self.runs = Some(runs);
        self
    }

    pub fn with_secrets(mut self, secrets: Arc<husk_core::secrets::Secrets>) -> AppState {
        self.secrets = Some(secrets);
        self.link_volumes()
    }

    pub fn with_workspaces(
        mut self,
        workspaces: Arc<husk_core::workspaces::Workspaces>,
    ) -> AppState {
        self.workspaces = Some(workspaces);
        self.link_volumes()
    }

    /// Volumes once both of what they are made of are there: workspaces (the files) and
    /// secrets (the key their tokens are derived under).
    fn link_volumes(mut self) -> AppState {
        if let (Some(secrets), Some(workspaces)) = (&self.secrets, &self.workspaces) {
            self.volumes = Some(Arc::new(husk_core::volumes::Volumes::new(
                self.manager.store_arc(),
                secrets.clone(),
                workspaces.clone(),
            )));
        }
        self
    }

    pub fn with_templates(mut self, templates: crate::templates::TemplateService) -> AppState {
        self.templates = Some(Arc::new(templates));
        self
    }
}

/// The sandbox a request is addressed to. Found once by the dispatcher and handed to the
/// sandbox router as a request extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxTarget {
    pub id: String,
    pub port: u16,
}

/// The sandbox a request names, by header or by Host; `None` for the REST API.
pub fn sandbox_target(req: &Request<Body>) -> Option<SandboxTarget> {
    let h = req.headers();
    if let Some(id) = h.get("e2b-sandbox-id").and_then(|v| v.to_str().ok()) {
        let port = h
            .get("e2b-sandbox-port")
            .and_then(|v| v.to_str().ok())
            .and_then(|p| p.parse().ok())
            .unwrap_or(crate::sandbox::ENVD_PORT);
        return Some(SandboxTarget {
            id: id.to_string(),
            port,
        });
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
    Some(SandboxTarget {
        id: id.to_string(),
        port,
    })
}

/// Whether a request's body is held to the body rate rule ([`crate::body`]): every body husk
/// reads itself, but a sandbox server's (ingress relays what its client sends, as slowly as
/// the two of them like) and the one Connect client stream, `StreamInput` (a command's stdin
/// may rightly pause).
fn guards_body(target: Option<&SandboxTarget>, req: &Request<Body>) -> bool {
    match target.map(|t| t.port) {
        None | Some(crate::sandbox::interpreter::PORT) => true,
        Some(crate::sandbox::ENVD_PORT) => req.uri().path() != "/process.Process/StreamInput",
        Some(_) => false,
    }
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
    let rest: Router = crate::rest::router(state.clone())
        .merge(crate::openapi::router(state.clone()))
        .merge(crate::templates::router(state.clone()))
        .merge(crate::secrets::router(state.clone()))
        .merge(crate::pools::router(state.clone()))
        .merge(crate::e2b_secrets::router(state.clone()))
        .merge(crate::workspaces::router(state.clone()))
        .merge(crate::volumes::router(state.clone()))
        .merge(crate::runs::router(state.clone()))
        .merge(crate::node_images::router(state.clone()))
        .merge(crate::sandbox::signed::router(state.clone()));
    let policy = state.body_policy;
    let cluster = state.cluster.clone();
    let (manager, signed) = (state.manager.clone(), state.signed.clone());
    let sandbox: Router = crate::sandbox::router(state);
    tower::service_fn(move |mut req: Request<Body>| {
        let (rest, sandbox) = (rest.clone(), sandbox.clone());
        let (manager, signed) = (manager.clone(), signed.clone());
        let cluster = cluster.clone();
        async move {
            let mut target = sandbox_target(&req);
            // A node serves its gateways only (the orchestrator's health probe aside); what
            // goes on to a sandbox never carries the cluster's headers.
            if let Some(token) = &cluster {
                if let Some(refused) = node_admission(token, target.is_some(), &mut req) {
                    return Ok(refused);
                }
            }
            // A signed file URL opened by a client that names no sandbox (a browser, curl):
            // its signature says which sandbox it is for (see `sandbox::signed`).
            if target.is_none() && crate::sandbox::signed::is_signed_files(&req) {
                match signed.target(&manager, &req) {
                    Ok(t) => target = Some(t),
                    Err(resp) => {
                        let mut resp = *resp;
                        // An upload's body stays unread: its connection cannot carry more.
                        if req.method() == axum::http::Method::POST {
                            resp.headers_mut()
                                .insert(header::CONNECTION, HeaderValue::from_static("close"));
                        }
                        return Ok(resp);
                    }
                }
            }
            // A request without a body (most GETs) has nothing to guard: no timer for it.
            if !http_body::Body::is_end_stream(req.body()) && guards_body(target.as_ref(), &req) {
                req = req.map(|b| Body::new(crate::body::Guarded::new(b, policy)));
            }
            let mut resp = match target {
                Some(target) => {
                    req.extensions_mut().insert(target);
                    sandbox.oneshot(req).await
                }
                None => rest.oneshot(req).await,
            }?;
            // A sandbox's own server may have named itself (ingress); husk names the rest.
            resp.headers_mut()
                .entry("server")
                .or_insert(HeaderValue::from_static("husk"));
            Ok(resp)
        }
    })
}

/// A node's check of a request: `None` to serve it. The token must be there, except on the
/// health endpoint; it is then removed, and so are the caller's headers from a request for a
/// sandbox (the node authenticates those by their own credentials, as a server of its own
/// does), so that a sandbox's server never sees them.
fn node_admission(
    token: &crate::cluster::ClusterToken,
    for_sandbox: bool,
    req: &mut Request<Body>,
) -> Option<Response> {
    if !for_sandbox && req.uri().path() == "/health" {
        return None;
    }
    if !token.presented_in(req.headers()) {
        return Some(
            crate::error::ApiError::new(
                axum::http::StatusCode::UNAUTHORIZED,
                "this is a husk node: it serves the cluster's gateways only; send requests to \
                 a gateway",
            )
            .into_response(),
        );
    }
    req.headers_mut().remove(crate::cluster::TOKEN);
    if for_sandbox {
        crate::cluster::strip(req.headers_mut());
    }
    None
}

/// Serves until `shutdown` resolves, then stops accepting and lets open requests finish, under
/// `limits` (see [`crate::listener`]).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    limits: crate::listener::ConnLimits,
    tls: Option<&crate::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    crate::listener::serve(listener, service(state), limits, tls, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(headers: &[(&str, &str)]) -> Option<SandboxTarget> {
        let mut b = Request::builder().uri("/files");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        sandbox_target(&b.body(Body::empty()).unwrap())
    }

    fn t(id: &str, port: u16) -> Option<SandboxTarget> {
        Some(SandboxTarget {
            id: id.into(),
            port,
        })
    }

    #[test]
    fn bodies_husk_reads_are_guarded_and_relayed_ones_are_not() {
        let guarded = |path: &str, headers: &[(&str, &str)]| {
            let mut b = Request::builder().method("POST").uri(path);
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            let req = b.body(Body::empty()).unwrap();
            guards_body(sandbox_target(&req).as_ref(), &req)
        };
        let sb = |port: &'static str| [("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", port)];
        assert!(guarded("/husk/v1/runs", &[]));
        assert!(guarded("/files", &sb("49983")));
        assert!(guarded("/process.Process/Start", &sb("49983")));
        assert!(guarded("/execute", &sb("49999")));
        // A command's stdin may pause; a sandbox server's body is its client's business.
        assert!(!guarded("/process.Process/StreamInput", &sb("49983")));
        assert!(!guarded("/upload", &sb("8000")));
        assert!(!guarded("/upload", &[("host", "8000-abc.husk.example")]));
    }

    #[test]
    fn headers_name_the_sandbox_and_port() {
        assert_eq!(target(&[("E2b-Sandbox-Id", "abc123")]), t("abc123", 49983));
        let h = [("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "49999")];
        assert_eq!(target(&h), t("abc", 49999));
        // A port that is not a number falls back to the daemon's.
        let h = [("e2b-sandbox-id", "abc"), ("e2b-sandbox-port", "x")];
        assert_eq!(target(&h), t("abc", 49983));
    }

    #[test]
    fn a_host_of_port_dash_id_names_the_sandbox() {
        assert_eq!(
            target(&[("host", "49983-abc123.husk.example")]),
            t("abc123", 49983)
        );
        assert_eq!(
            target(&[("host", "8000-abc.localhost:3000")]),
            t("abc", 8000)
        );
    }

    #[test]
    fn other_hosts_are_the_rest_api() {
        for host in [
            "127.0.0.1:3000",
            "localhost:3000",
            "api.husk.example",
            "foo-bar.husk.example",
            "99999999-abc.husk.example",
            "49983-ABC.husk.example",
            "49983-a_b.husk.example",
            "49983-.husk.example",
        ] {
            assert_eq!(target(&[("host", host)]), None, "{host}");
        }
        assert_eq!(target(&[]), None);
    }
}
