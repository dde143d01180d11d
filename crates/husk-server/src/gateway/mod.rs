//! `husk gateway`: the cluster's E2B endpoint. Stateless; any number run behind one address.
//!
//! It authenticates each REST request's API key against the shared database and passes the
//! caller on to a node as the node API's headers (`crate::cluster`), with the cluster token.
//! A create claims a place in the team's quota across the cluster (one statement, see
//! `store/postgres/cluster.rs`), goes to a node chosen by load (`nodes.rs`), and gives the
//! place back once the node answers (its sandbox counts by then). Everything about one
//! sandbox, the REST calls and the in-sandbox API, ingress and the code interpreter alike,
//! goes to the node whose code begins the sandbox's id, found in memory: no database read on
//! that path, which keeps working while the database is away. Listing asks every node and
//! merges. The gateway also sweeps the nodes (one gateway at a time, under a lock in the
//! database): a node silent for [`LOST_AFTER`] is lost, its sandboxes with it.

mod db;
mod fair;
mod list;
mod nodes;
pub mod proxy;
pub mod routes;
mod signed;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use husk_core::manager::CoreError;
use husk_core::store::{Principal, Store};
use tokio::net::TcpListener;

pub use db::Db;
pub use nodes::Nodes;

use crate::cluster::ClusterToken;
use crate::error::ApiError;
use proxy::{Client, ProxyError};
use routes::Route;

/// How often the gateway reads the nodes from the database.
pub const REFRESH: Duration = Duration::from_millis(500);
/// How often a gateway sweeps for silent nodes.
pub const SWEEP: Duration = Duration::from_secs(1);
/// A node silent this long is lost (it beats every second).
pub const LOST_AFTER: Duration = Duration::from_secs(10);
/// A node that stopped cleanly (draining: a restart, an upgrade) is lost only after this
/// long: its sandboxes keep running for the next process on its machine meanwhile.
pub const DRAINING_LOST_AFTER: Duration = Duration::from_secs(300);
/// How long a create's place in its team's quota is held at most: a gateway that dies
/// mid-create frees it then. Longer than any create (a template's start command included).
pub const CLAIM_TTL: Duration = Duration::from_secs(120);
/// Largest create request read (its body is kept to try another node).
pub const MAX_CREATE_BODY: usize = 1 << 20;
/// How many nodes a create tries when they cannot be reached.
const CREATE_ATTEMPTS: usize = 3;

/// What a gateway is told at start.
pub struct GatewayConfig {
    pub token: ClusterToken,
    /// A team's quota when the database has none for it (`husk serve --max-sandboxes`).
    pub default_quota: u32,
    /// How fast clients must send the bodies the gateway reads (creates).
    pub body_policy: crate::body::BodyPolicy,
    /// Bytes of create bodies one team's requests may hold in the gateway at once
    /// (`app::TEAM_BODY_BYTES`, as on a node).
    pub team_body_bytes: u64,
    /// How nodes at `https://` URLs are verified.
    pub node_tls: crate::tls::ClientTls,
}

/// One gateway.
pub struct Gateway {
    db: Db,
    nodes: Nodes,
    /// Templates' image digests by name, read with the nodes (placement prefers holders).
    digests: std::sync::RwLock<std::collections::HashMap<String, String>>,
    client: Client,
    config: GatewayConfig,
    /// Signed file URLs found on the nodes.
    signed: signed::SignedSearch,
    /// Each API key's share of the database calls.
    fair: Arc<fair::Fair>,
    /// Each team's bytes of create bodies held here.
    bodies: Arc<crate::budget::Budget>,
}

impl Gateway {
    /// A gateway on `store` (PostgreSQL), serving calls on as many threads as the store has
    /// connections.
    pub fn new(store: Arc<Store>, config: GatewayConfig) -> std::io::Result<Arc<Gateway>> {
        let threads = husk_core::store::postgres::POOL_SIZE as usize;
        Ok(Arc::new(Gateway {
            db: Db::start(store, threads)?,
            nodes: Nodes::default(),
            digests: Default::default(),
            client: proxy::client(&config.node_tls),
            signed: Default::default(),
            fair: fair::Fair::new(fair::PER_KEY),
            bodies: crate::budget::Budget::new("request bodies", config.team_body_bytes),
            config,
        }))
    }

    /// Reads the nodes now (at start, before serving).
    pub async fn refresh(&self) -> Result<usize, husk_core::store::StoreError> {
        let (rows, templates) = self.db.call(|s| Ok((s.nodes()?, s.templates()?))).await?;
        let n = rows.len();
        self.nodes.refresh(rows);
        *self.digests.write().unwrap_or_else(|p| p.into_inner()) =
            templates.into_iter().map(|t| (t.name, t.digest)).collect();
        Ok(n)
    }

    /// The image digest of the template a create names (`None`: the host template, a
    /// snapshot, or one not known yet).
    fn digest_of(&self, template: &str) -> Option<String> {
        use husk_core::template::{CODE_INTERPRETER_TEMPLATE, E2B_CODE_INTERPRETER};
        let name = template.strip_suffix(":default").unwrap_or(template);
        let digests = self.digests.read().unwrap_or_else(|p| p.into_inner());
        digests.get(name).cloned().or_else(|| {
            (name == E2B_CODE_INTERPRETER)
                .then(|| digests.get(CODE_INTERPRETER_TEMPLATE).cloned())
                .flatten()
        })
    }

    /// Keeps the picture of the nodes fresh and sweeps for lost ones, until the runtime ends.
    pub fn spawn_background(self: &Arc<Self>) {
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REFRESH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = this.refresh().await {
                    // The last picture stays: routing goes on, creates fail on the database.
                    tracing::debug!(error = %husk_core::error_chain(&e), "reading the nodes failed");
                }
            }
        });
        let this = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SWEEP);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Nodes beat through the same database: after this gateway could not reach it,
            // they may not have either, so none is judged until it has been reachable for
            // LOST_AFTER (a database restart loses no node).
            let mut reachable_since = tokio::time::Instant::now();
            loop {
                tick.tick().await;
                if reachable_since.elapsed() < LOST_AFTER {
                    if let Err(e) = this.db.call(|s| s.nodes().map(drop)).await {
                        tracing::debug!(error = %husk_core::error_chain(&e), "the database is away");
                        reachable_since = tokio::time::Instant::now();
                    }
                    continue;
                }
                match this
                    .db
                    .call(|s| s.reap_nodes(LOST_AFTER, DRAINING_LOST_AFTER))
                    .await
                {
                    Ok(reaped) => {
                        for r in reaped {
                            tracing::warn!(
                                node = %r.node,
                                sandboxes = r.sandboxes,
                                "node silent for {}s: declared lost with its sandboxes",
                                LOST_AFTER.as_secs()
                            );
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %husk_core::error_chain(&e), "sweeping the nodes failed");
                        reachable_since = tokio::time::Instant::now();
                    }
                }
            }
        });
    }

    /// The caller of a REST request: `None` when it sent no key (the node then answers as
    /// for a request without one, or by the request's own credential: a volume's token).
    async fn caller(&self, headers: &axum::http::HeaderMap) -> Result<Option<Principal>, Response> {
        let Some(key) = api_key(headers) else {
            return Ok(None);
        };
        let Some(_place) = self.fair.enter(key).await else {
            return Err(too_busy());
        };
        let key = key.to_owned();
        let checked = self.db.call(move |s| s.check_key(&key)).await;
        crate::rest::key_checked(checked).map(Some)
    }

    async fn handle(self: Arc<Self>, mut req: Request<Body>) -> Response {
        // Nothing a client sends may pass for the gateway's word.
        crate::cluster::strip(req.headers_mut());
        if let Some(target) = crate::app::sandbox_target(&req) {
            return self.to_sandbox(&target.id, req, None).await;
        }
        if crate::sandbox::signed::is_signed_files(&req) {
            return self.signed_files(req).await;
        }
        let path = req.uri().path().to_owned();
        if path == "/health" {
            return StatusCode::NO_CONTENT.into_response();
        }
        let route = routes::route(req.method(), &path);
        // A create checks its key as it claims its place: one statement (`create`).
        let who = match route {
            Route::Create => None,
            _ => match self.caller(req.headers()).await {
                Ok(who) => who,
                Err(refused) => return refused,
            },
        };
        if path == "/husk/v1/cluster/nodes" {
            return self.list_nodes(who.as_ref()).await;
        }
        // The nodes' own API among themselves (template images): never a client's, whatever
        // its key.
        if path.starts_with("/husk/v1/cluster/") {
            return ApiError::new(StatusCode::NOT_FOUND, "no such route").into_response();
        }
        match route {
            Route::Create => self.create(req).await,
            Route::List { paged } => match who {
                Some(who) => list::fan_out(&self, &who, req, paged).await,
                None => crate::rest::missing_key(),
            },
            Route::Sandbox(id) => self.to_sandbox(&id, req, who.as_ref()).await,
            // Every template request goes to one node (builds happen there; see design §19).
            Route::Template(_) => {
                let node = self.nodes.for_key("templates");
                self.to_any(node, req, who.as_ref()).await
            }
            Route::Any => {
                let key = getrandom::u64().unwrap_or(0).to_string();
                let node = self.nodes.for_key(&key);
                self.to_any(node, req, who.as_ref()).await
            }
        }
    }

    /// A request about sandbox `id`: to its node. A REST read whose node does not answer
    /// goes to another, which answers from the shared records (a lost sandbox's).
    async fn to_sandbox(&self, id: &str, req: Request<Body>, who: Option<&Principal>) -> Response {
        let node = routes::code_of(id).and_then(|c| self.nodes.by_code(c));
        let Some(node) = node else {
            return not_found(id);
        };
        let retry = (who.is_some() && req.method() == Method::GET)
            .then(|| clone_bodiless(&req))
            .flatten();
        match proxy::send(&self.client, &self.config.token, &node.row.url, req, who).await {
            Ok(resp) => resp,
            Err(ProxyError::Connect(e)) => {
                tracing::debug!(node = %node.row.name, error = %e, "node not answering");
                match self.elsewhere(&node, retry, who).await {
                    Some(Ok(resp)) => resp,
                    Some(Err((other, e))) => unreachable_node(&other, id, &e),
                    None => unreachable_node(&node.row.name, id, &ProxyError::Connect(e)),
                }
            }
            Err(e) => unreachable_node(&node.row.name, id, &e),
        }
    }

    /// A request any node answers (one that may be tried again elsewhere if it could not
    /// connect, when it has no body).
    async fn to_any(
        &self,
        node: Option<Arc<nodes::Node>>,
        req: Request<Body>,
        who: Option<&Principal>,
    ) -> Response {
        let Some(node) = node else {
            return no_nodes();
        };
        let retry = clone_bodiless(&req);
        match proxy::send(&self.client, &self.config.token, &node.row.url, req, who).await {
            Ok(resp) => resp,
            Err(ProxyError::Connect(_)) if retry.is_some() => {
                match self.elsewhere(&node, retry, who).await {
                    Some(Ok(resp)) => resp,
                    Some(Err((other, e))) => node_failed(&other, &e),
                    None => no_nodes(),
                }
            }
            Err(e) => node_failed(&node.row.name, &e),
        }
    }

    /// `retry` (a copy of a request without a body) sent to a serving node other than
    /// `failed`, which could not be reached: its answer, or the other node's name and why
    /// it failed too; `None` when there is no copy or no other node.
    async fn elsewhere(
        &self,
        failed: &nodes::Node,
        retry: Option<Request<Body>>,
        who: Option<&Principal>,
    ) -> Option<Result<Response, (String, ProxyError)>> {
        let req = retry?;
        let other = self
            .nodes
            .serving()
            .into_iter()
            .find(|n| n.row.code != failed.row.code)?;
        Some(
            proxy::send(&self.client, &self.config.token, &other.row.url, req, who)
                .await
                .map_err(|e| (other.row.name.clone(), e)),
        )
    }

    /// A create: its key checked and a place in the team's quota across the cluster claimed
    /// (one statement), then its body read and a node found.
    async fn create(&self, req: Request<Body>) -> Response {
        let Some(key) = api_key(req.headers()) else {
            return crate::rest::missing_key();
        };
        let Some(place) = self.fair.enter(key).await else {
            return too_busy();
        };
        let (key, default) = (key.to_owned(), self.config.default_quota);
        let checked = self
            .db
            .call(move |s| s.check_key_and_claim(&key, default, CLAIM_TTL))
            .await;
        drop(place);
        let (who, claimed) = match checked {
            Ok(Some(found)) => found,
            // Refused as any request's key is (401, or 503 while the database is away).
            other => match crate::rest::key_checked(other.map(|_| None)) {
                Err(refused) => return refused,
                Ok(_) => return crate::rest::missing_key(),
            },
        };
        let Some(claim) = claimed.claim else {
            return ApiError::from(CoreError::QuotaExceeded {
                team: who.team,
                limit: claimed.quota,
            })
            .into_response();
        };
        // Given back however the create ends, the client gone included. The sandbox is
        // recorded by then (or the create failed); if giving it back fails, the place
        // expires with its claim.
        let _claim = Claim {
            db: self.db.clone(),
            id: claim,
        };
        let (parts, body) = req.into_parts();
        // Read whole (it may be sent to more than one node), under the body rate rule that
        // nodes hold bodies to: a client trickling it is cut off (408), not waited for.
        // Charged to the team's budget of bodies held (as on a node) until the create ends.
        let guarded = Body::new(crate::body::Guarded::new(body, self.config.body_policy));
        let mut held = self.bodies.reservation(&who.team);
        let body = match crate::body::read_all_within(guarded, MAX_CREATE_BODY, &mut held).await {
            Ok(b) => b,
            Err(e) => return ApiError::new(e.status(), e.to_string()).into_response(),
        };
        // A sandbox from a snapshot starts where the snapshot's files are: the node whose
        // code begins the snapshot's id.
        let template = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v.get("templateID")?.as_str().map(str::to_owned))
            .unwrap_or_else(|| husk_core::template::BASE_TEMPLATE.to_owned());
        let pinned = routes::code_of(&template).and_then(|c| self.nodes.by_code(c));
        let digest = self.digest_of(&template);
        let mut tried: Vec<String> = Vec::new();
        // The create as received, for each node it is sent to.
        let request = || {
            let mut req = Request::from_parts(clone_parts(&parts), Body::from(body.clone()));
            *req.extensions_mut() = parts.extensions.clone();
            req
        };
        let resp = if let Some(node) = pinned {
            let req = request();
            proxy::send(
                &self.client,
                &self.config.token,
                &node.row.url,
                req,
                Some(&who),
            )
            .await
            .unwrap_or_else(|e| node_failed(&node.row.name, &e))
        } else {
            loop {
                let random = || getrandom::u64().unwrap_or(0);
                let Some(placed) = self.nodes.place(&tried, digest.as_deref(), random) else {
                    break no_capacity();
                };
                let req = request();
                let url = placed.node.row.url.clone();
                match proxy::send(&self.client, &self.config.token, &url, req, Some(&who)).await {
                    Ok(resp) => break resp,
                    Err(ProxyError::Connect(e)) if tried.len() + 1 < CREATE_ATTEMPTS => {
                        tracing::warn!(node = %placed.node.row.name, error = %e, "node not answering; placing the create elsewhere");
                        tried.push(placed.node.row.code.clone());
                    }
                    Err(e) => break node_failed(&placed.node.row.name, &e),
                }
            }
        };
        resp
    }

    /// The nodes as this gateway sees them (admin keys only).
    async fn list_nodes(&self, who: Option<&Principal>) -> Response {
        match who {
            None => return crate::rest::missing_key(),
            Some(w) if !w.admin => {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "listing the nodes needs an admin key",
                )
                .into_response()
            }
            Some(_) => {}
        }
        let rows = match self.db.call(|s| s.nodes()).await {
            Ok(rows) => rows,
            Err(e) => return ApiError::from(e).into_response(),
        };
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|n| {
                serde_json::json!({
                    "name": n.name,
                    "code": n.code,
                    "url": n.url,
                    "state": n.state.as_str(),
                    "capacity": n.capacity,
                    "live": n.load.live,
                    "templates": n.load.templates,
                    "silentForMs": n.silent_for.as_millis() as u64,
                    "held": n.held,
                })
            })
            .collect();
        axum::Json(list).into_response()
    }
}

/// The API key a request carries, if any.
fn api_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
}

/// A create's place in its team's quota, given back when dropped.
struct Claim {
    db: Db,
    id: i64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        let (db, id) = (self.db.clone(), self.id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = db.call(move |s| s.release_quota(id)).await {
                    tracing::debug!(error = %husk_core::error_chain(&e), "giving back a quota place failed");
                }
            });
        }
    }
}

fn clone_parts(parts: &axum::http::request::Parts) -> axum::http::request::Parts {
    let mut b = Request::builder()
        .method(parts.method.clone())
        .uri(parts.uri.clone())
        .version(parts.version);
    if let Some(h) = b.headers_mut() {
        *h = parts.headers.clone();
    }
    b.body(())
        .map(|r| r.into_parts().0)
        .unwrap_or_else(|_| Request::new(()).into_parts().0)
}

/// A copy of a request without a body (to send again elsewhere), `None` if it has one.
fn clone_bodiless(req: &Request<Body>) -> Option<Request<Body>> {
    http_body::Body::is_end_stream(req.body()).then(|| bodiless_copy(req))
}

/// `req`'s method, URI, version and headers, with no body (a list's question to each node).
pub(super) fn bodiless_copy(req: &Request<Body>) -> Request<Body> {
    let mut b = Request::builder()
        .method(req.method().clone())
        .uri(req.uri().clone())
        .version(req.version());
    if let Some(h) = b.headers_mut() {
        *h = req.headers().clone();
    }
    b.body(Body::empty())
        .unwrap_or_else(|_| Request::new(Body::empty()))
}

/// A key with [`fair::PER_KEY`] database calls under way for [`fair::WAIT`].
fn too_busy() -> Response {
    ApiError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too many requests with this API key at once; retry shortly",
    )
    .retry_after(1)
    .into_response()
}

fn not_found(id: &str) -> Response {
    ApiError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")).into_response()
}

fn no_nodes() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no node of the cluster is answering; retry shortly",
    )
    .retry_after(1)
    .into_response()
}

fn no_capacity() -> Response {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "no node of the cluster can take a sandbox now (all are full, draining or not \
         answering); retry shortly",
    )
    .retry_after(1)
    .into_response()
}

fn unreachable_node(node: &str, id: &str, e: &ProxyError) -> Response {
    tracing::warn!(node, sandbox = id, error = %e, "node not answering");
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        format!("the node holding sandbox {id} is not answering; retry shortly"),
    )
    .retry_after(1)
    .into_response()
}

fn node_failed(node: &str, e: &ProxyError) -> Response {
    tracing::warn!(node, error = %e, "request to a node failed");
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "the node serving this request failed to answer; retry shortly",
    )
    .retry_after(1)
    .into_response()
}

/// The gateway's HTTP service.
pub fn service(
    gateway: Arc<Gateway>,
) -> impl tower::Service<
    Request<Body>,
    Response = Response,
    Error = Infallible,
    Future = impl Future<Output = Result<Response, Infallible>> + Send,
> + Clone
       + Send {
    tower::service_fn(move |req: Request<Body>| {
        let gateway = gateway.clone();
        async move {
            let mut resp = gateway.handle(req).await;
            resp.headers_mut()
                .entry(header::SERVER)
                .or_insert(HeaderValue::from_static("husk"));
            Ok(resp)
        }
    })
}

/// Serves until `shutdown` resolves, under `limits` (see [`crate::listener`]).
pub async fn serve(
    listener: TcpListener,
    gateway: Arc<Gateway>,
    limits: crate::listener::ConnLimits,
    tls: Option<&crate::tls::ServerTls>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    crate::listener::serve(listener, service(gateway), limits, tls, shutdown).await
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::gateway) fn gateway() -> (Arc<Gateway>, String) {
        gateway_with(3 << 20)
    }

    /// A gateway on a fresh database of the test PostgreSQL (a cluster's), with no node.
    fn gateway_with(team_body_bytes: u64) -> (Arc<Gateway>, String) {
        let url = husk_core::store::test_postgres::TestPostgres::shared().fresh_database();
        let store = Arc::new(Store::open_postgres(&url, "gateway", None).unwrap());
        let (_, key) = store.create_key("acme", false, None).unwrap();
        let token = ClusterToken::new(&[b't'; 32]).unwrap();
        let config = GatewayConfig {
            token,
            default_quota: 10,
            body_policy: crate::body::BodyPolicy::default(),
            team_body_bytes,
            node_tls: crate::tls::ClientTls::for_nodes(None, None).unwrap(),
        };
        (Gateway::new(store, config).unwrap(), key)
    }

    #[tokio::test]
    async fn a_creates_place_is_given_back_however_it_ends() {
        let (gw, key) = gateway_with(3 << 20);
        // The team's quota is 10: twelve creates refused for their bodies each claimed a
        // place and gave it back.
        for _ in 0..12 {
            let huge = Body::from(vec![b' '; MAX_CREATE_BODY + 1]);
            let resp = gw.clone().handle(create(&key, huge)).await;
            assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let resp = gw.clone().handle(create(&key, Body::from("{}"))).await;
            // Past the quota check: no node to place it on.
            if resp.status() == StatusCode::SERVICE_UNAVAILABLE {
                break;
            }
            assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
            assert!(
                tokio::time::Instant::now() < deadline,
                "the places were never given back"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A key that is nobody's claims nothing and learns nothing.
        let resp = gw.handle(create("husk_nobody", Body::from("{}"))).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn create_bodies_are_charged_to_their_teams_budget() {
        let (gw, key) = gateway_with(100);
        let body = format!(
            "{{\"templateID\":\"base\",\"metadata\":{{\"a\":\"{}\"}}}}",
            "x".repeat(200)
        );
        let resp = gw.clone().handle(create(&key, Body::from(body))).await;
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        let text = axum::body::to_bytes(resp.into_body(), 4096).await.unwrap();
        assert!(
            String::from_utf8_lossy(&text).contains("request bodies"),
            "{text:?}"
        );
        assert_eq!(gw.bodies.held("acme"), 0, "nothing stays held");
        // A body within the budget gets to placement (no node here: 503).
        let resp = gw.handle(create(&key, Body::from("{}"))).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    fn create(key: &str, body: Body) -> Request<Body> {
        Request::post("/v2/sandboxes")
            .header("x-api-key", key)
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn a_create_body_that_stalls_is_cut_off_and_one_too_large_refused() {
        let (gw, key) = gateway();
        let stalled = Body::from_stream(futures_util::stream::pending::<
            Result<bytes::Bytes, std::io::Error>,
        >());
        let resp = gw.clone().handle(create(&key, stalled)).await;
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        let huge = Body::from(vec![b' '; MAX_CREATE_BODY + 1]);
        let resp = gw.clone().handle(create(&key, huge)).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }

    #[tokio::test]
    async fn nobody_and_forged_cluster_headers_get_nothing() {
        let (gw, key) = gateway();
        // No key: a create, a list and the nodes are refused before anything else.
        for (method, path) in [
            (Method::POST, "/v2/sandboxes"),
            (Method::GET, "/v2/sandboxes"),
            (Method::GET, "/husk/v1/cluster/nodes"),
        ] {
            let req = Request::builder()
                .method(method)
                .uri(path)
                .header(crate::cluster::TEAM, "acme")
                .header(crate::cluster::ADMIN, "1")
                .body(Body::empty())
                .unwrap();
            let resp = gw.clone().handle(req).await;
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{path}");
        }
        // A key of another kind of user: not an admin.
        let req = Request::get("/husk/v1/cluster/nodes")
            .header("x-api-key", &key)
            .body(Body::empty())
            .unwrap();
        assert_eq!(gw.clone().handle(req).await.status(), StatusCode::FORBIDDEN);
        // The nodes' own routes are never served to a client.
        let req = Request::get(format!("/husk/v1/cluster/images/sha256:{}", "0".repeat(64)))
            .header("x-api-key", &key)
            .body(Body::empty())
            .unwrap();
        assert_eq!(gw.clone().handle(req).await.status(), StatusCode::NOT_FOUND);
        // A sandbox id that names no node.
        let req = Request::get("/sandboxes/zzzzaaaaaaaaaaaaaaaa")
            .header("x-api-key", &key)
            .body(Body::empty())
            .unwrap();
        assert_eq!(gw.handle(req).await.status(), StatusCode::NOT_FOUND);
    }
}
