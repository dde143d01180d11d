//! The control plane: E2B-compatible REST routes under `X-API-KEY`.
//!
//! Handlers parse into the core's typed requests and map [`CoreError`] to the status codes and
//! `{"code", "message"}` bodies the SDKs read. Bodies are parsed by hand (not axum's `Json`
//! extractor) so that a malformed body gets the same JSON error shape as everything else.

// Helpers return the finished error `Response` as their `Err`: that is the point of them, and
// the size of a `Response` does not matter next to a network round trip.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use husk_core::manager::{
    CreateRequest, EnvVars, Lifecycle, ListFilter, LiveSandbox, MaskedHost, OnTimeout, PauseMode,
    Paused, SandboxView, TimeRange, ENVD_VERSION,
};
use husk_core::store::Principal;

use crate::error::{answer, ApiError};
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
        .route("/sandboxes/{id}/pause", post(pause))
        .route("/sandboxes/{id}/resume", post(resume))
        .route("/sandboxes/{id}/fork", post(crate::snapshots::fork))
        .route(
            "/sandboxes/{id}/snapshots",
            post(crate::snapshots::create_snapshot),
        )
        .route("/snapshots", get(crate::snapshots::list_snapshots))
        .route("/sandboxes/{id}/network", put(update_network))
        .route("/sandboxes/{id}/logs", get(logs))
        .route("/husk/v1/sandboxes/{id}/denials", get(denials))
        .fallback(not_found_route)
        .with_state(state)
}

/// An error answer: `{"code": N, "message": "..."}` (see [`crate::error::ApiError`]).
pub fn error(status: StatusCode, message: impl Into<String>) -> Response {
    ApiError::new(status, message).into_response()
}

/// The caller, authenticated by `X-API-KEY` (header names are case-insensitive). As an
/// extractor, a request without a valid key never reaches a handler.
pub struct Who(pub Principal);

impl FromRequestParts<AppState> for Who {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Who, Response> {
        auth(state, &parts.headers).map(Who)
    }
}

fn auth(state: &AppState, headers: &HeaderMap) -> Result<Principal, Response> {
    // A node: the gateway checked the key and says whose it is (the token was checked for
    // every request, see `app::node_admission`).
    if state.cluster.is_some() {
        return crate::cluster::principal(headers).ok_or_else(missing_key);
    }
    let key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if key.is_empty() {
        return Err(missing_key());
    }
    key_checked(state.manager.store().check_key(key))
}

/// The answer to a request without a key.
pub(crate) fn missing_key() -> Response {
    error(
        StatusCode::UNAUTHORIZED,
        "missing API key: set the X-API-KEY header (E2B_API_KEY in the SDKs)",
    )
}

/// The caller, from the outcome of a key check, or the answer refusing it.
pub(crate) fn key_checked(
    checked: Result<Option<Principal>, husk_core::store::StoreError>,
) -> Result<Principal, Response> {
    match checked {
        Ok(Some(who)) => Ok(who),
        Ok(None) => Err(error(StatusCode::UNAUTHORIZED, "Invalid API key")),
        // The key cannot be checked now (the database is unreachable): refused, as a 503 the
        // client may retry, not a 401 that would say its key is bad.
        Err(e) if e.is_unavailable() => {
            Err(crate::error::ApiError::store_unavailable(&e).into_response())
        }
        // Anything else is a fault of this server's (logged): refused, and nothing of it
        // told to a caller not yet known to be anybody.
        Err(e) => {
            tracing::error!(error = %husk_core::error_chain(&e), "cannot check an API key");
            Err(error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "cannot check the API key; see the server's log",
            ))
        }
    }
}

pub(crate) fn parse_body<T: for<'de> Deserialize<'de> + Default>(
    body: &Bytes,
) -> Result<T, Response> {
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

pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
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
    /// With `autoPause`: whether the pause keeps memory (`false`: files only).
    #[serde(rename = "autoPauseMemory")]
    auto_pause_memory: Option<bool>,
    /// E2B volumes are husk's workspaces: `{name, path}`, read-only unless the name ends in
    /// `:rw`.
    #[serde(rename = "volumeMounts")]
    volume_mounts: Option<Vec<VolumeMount>>,
    network: Option<NetworkBody>,
    /// `{"enabled": bool}` (older SDKs: a bare bool).
    #[serde(rename = "autoResume")]
    auto_resume: Option<Value>,
    /// What husk does not do (yet), refused when asked for rather than ignored (see
    /// [`refuse_unsupported`]).
    iam: Option<Value>,
    mcp: Option<Value>,
}

/// Refuses what a create asks for that husk cannot give, with a message saying so: a setting
/// silently dropped would leave the caller believing it holds.
fn refuse_unsupported(req: &NewSandbox) -> Result<(), Response> {
    // Asked for: anything but null, false, or objects and lists of nothing else (an
    // `{"enabled": false}` or an empty token map asks for nothing).
    fn asks(v: &Value) -> bool {
        match v {
            Value::Null | Value::Bool(false) => false,
            Value::Object(o) => o.values().any(asks),
            Value::Array(a) => a.iter().any(asks),
            _ => true,
        }
    }
    let enabled = |v: &Option<Value>| v.as_ref().is_some_and(asks);
    let refusals = [
        (
            enabled(&req.iam),
            "iam (workload identity tokens) is not supported by husk",
        ),
        (
            enabled(&req.mcp),
            "mcp (the MCP gateway) is not supported by husk",
        ),
    ];
    match refusals.iter().find(|(asked, _)| *asked) {
        Some((_, why)) => Err(error(StatusCode::BAD_REQUEST, *why)),
        None => Ok(()),
    }
}

/// E2B's lifecycle fields of a create: what the timeout does, and auto-resume (only with a
/// pause at the timeout, as E2B's API has it).
fn lifecycle(req: &NewSandbox) -> Result<Lifecycle, Response> {
    let auto_resume = match &req.auto_resume {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::Object(o)) => match o.get("enabled") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "autoResume.enabled must be a boolean",
                ))
            }
        },
        Some(_) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "autoResume must be an object {\"enabled\": bool}",
            ))
        }
    };
    let on_timeout = if req.auto_pause == Some(true) {
        OnTimeout::Pause(if req.auto_pause_memory == Some(false) {
            PauseMode::Filesystem
        } else {
            PauseMode::Full
        })
    } else {
        OnTimeout::Kill
    };
    if auto_resume && on_timeout == OnTimeout::Kill {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "autoResume needs autoPause: a sandbox killed at its timeout cannot resume",
        ));
    }
    Ok(Lifecycle {
        on_timeout,
        auto_resume,
    })
}

/// E2B's `network` object of a create. Fields husk does not know are ignored, not rejected
/// (newer SDKs add some).
#[derive(Deserialize, Default)]
#[serde(default)]
struct NetworkBody {
    /// `false`: the sandbox's ports need its traffic token (or a key of its team).
    #[serde(rename = "allowPublicTraffic")]
    allow_public_traffic: Option<bool>,
    /// CIDRs, addresses and domains (`*.example.com`) the sandbox may reach; beats `denyOut`.
    #[serde(rename = "allowOut")]
    allow_out: Option<Vec<String>>,
    /// CIDRs, addresses (and, in husk, domains) it may not.
    #[serde(rename = "denyOut")]
    deny_out: Option<Vec<String>>,
    /// In `PUT /sandboxes/{id}/network` (the create request has it at the top level). The
    /// SDKs send it in snake case, as in a create; the spec spells it in camel case.
    #[serde(rename = "allowInternetAccess", alias = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    /// E2B's SOCKS5 egress proxy: husk has none, and says so rather than ignore a
    /// security-relevant setting.
    #[serde(rename = "egressProxy")]
    egress_proxy: Option<Value>,
    /// Per-host header rules (`crate::net_rules`).
    rules: Option<Value>,
    /// DNS servers the sandbox may reach (IPv4, at most 10): added to the allow list, as
    /// E2B opens its firewall to them. husk's sandboxes resolve names through husk's own
    /// resolver, so none is needed for allowed domains.
    #[serde(rename = "dnsServers")]
    dns_servers: Option<Vec<String>>,
    /// The `Host` the sandbox's servers get (`${PORT}` for the port).
    #[serde(rename = "maskRequestHost")]
    mask_request_host: Option<String>,
    /// Ports whose servers speak TLS themselves: husk's ingress does not (yet) connect to a
    /// sandbox's server over TLS, and says so.
    #[serde(rename = "httpsPorts")]
    https_ports: Option<Vec<u32>>,
}

/// Most `dnsServers` entries, as E2B allows.
const MAX_DNS_SERVERS: usize = 10;

impl NetworkBody {
    /// The header rules this body asks for (`None`: none).
    fn rules(&self) -> Result<Option<husk_core::net_rules::NetRules>, Response> {
        crate::net_rules::parse(self.rules.as_ref()).map_err(|e| error(StatusCode::BAD_REQUEST, e))
    }

    /// The policy this body asks for, given `allow_internet_access`; `None` when it asks for
    /// nothing in particular (the server's default applies). Only `false` or a list is a
    /// request: the SDKs send `allow_internet_access: true` on every create.
    fn policy(
        &self,
        allow_internet_access: Option<bool>,
        update: bool,
    ) -> Result<Option<husk_net::NetPolicy>, Response> {
        if self.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "network.egressProxy is not supported by husk",
            ));
        }
        if self.https_ports.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(error(
                StatusCode::BAD_REQUEST,
                "network.httpsPorts is not supported by husk: its ingress speaks plain HTTP \
                 to a sandbox's servers",
            ));
        }
        let dns = self.dns_servers.clone().unwrap_or_default();
        if dns.len() > MAX_DNS_SERVERS {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("network.dnsServers takes at most {MAX_DNS_SERVERS} addresses"),
            ));
        }
        if let Some(bad) = dns
            .iter()
            .find(|d| d.parse::<std::net::Ipv4Addr>().is_err())
        {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("network.dnsServers: '{bad}' is not an IPv4 address"),
            ));
        }
        let mut allow = self.allow_out.clone().unwrap_or_default();
        let deny = self.deny_out.clone().unwrap_or_default();
        // Only where a list limits the sandbox do the servers change anything.
        if !allow.is_empty() || !deny.is_empty() {
            allow.extend(dns);
        }
        if !update && allow_internet_access != Some(false) && allow.is_empty() && deny.is_empty() {
            return Ok(None);
        }
        husk_net::NetPolicy::from_e2b(
            allow_internet_access,
            &allow,
            &deny,
            &husk_net::NetPolicy::internet(),
        )
        .map(Some)
        .map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string()))
    }
}

#[derive(Deserialize, Default)]
struct VolumeMount {
    name: String,
    path: String,
}

impl VolumeMount {
    fn to_core(&self) -> husk_core::manager::WorkspaceMount {
        let (name, writable) = match self.name.strip_suffix(":rw") {
            Some(n) => (n, true),
            None => (self.name.strip_suffix(":ro").unwrap_or(&self.name), false),
        };
        husk_core::manager::WorkspaceMount {
            name: name.to_owned(),
            path: self.path.clone(),
            writable,
        }
    }
}

/// `volumeMounts` as E2B reports them (the name as given: `:rw` when writable).
fn volume_mounts_json(workspaces: &[husk_core::manager::WorkspaceMount]) -> Value {
    workspaces
        .iter()
        .map(|w| {
            let name = if w.writable {
                format!("{}:rw", w.name)
            } else {
                w.name.clone()
            };
            json!({"name": name, "path": w.path})
        })
        .collect()
}

pub(crate) fn timeout_secs(t: Option<i64>) -> Result<Duration, Response> {
    match t {
        None => Ok(Duration::from_secs(DEFAULT_TIMEOUT_SECS)),
        Some(t) if t < 0 => Err(error(
            StatusCode::BAD_REQUEST,
            format!("timeout must not be negative (got {t})"),
        )),
        Some(t) => Ok(Duration::from_secs(t as u64)),
    }
}

/// A sandbox's `domain`: the server's, when the operator named one.
pub(crate) fn domain(state: &AppState) -> Value {
    state
        .domain
        .as_ref()
        .map_or(Value::Null, |d| json!(d.as_str()))
}

pub(crate) fn sandbox_json(sb: &LiveSandbox, domain: Value) -> Value {
    json!({
        "templateID": sb.template(),
        "sandboxID": sb.id(),
        "clientID": "husk",
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": sb.access_token(),
        "trafficAccessToken": sb.traffic_access_token(),
        "domain": domain,
    })
}

/// `state` and `lifecycle` as E2B writes them.
fn state_json(v: &SandboxView) -> (&'static str, Value) {
    let on_timeout = match v.lifecycle.on_timeout {
        OnTimeout::Kill => "kill",
        OnTimeout::Pause(_) => "pause",
    };
    let state = if v.lost.is_some() {
        "lost"
    } else if v.paused.is_some() {
        "paused"
    } else {
        "running"
    };
    (
        state,
        json!({"autoResume": v.lifecycle.auto_resume, "onTimeout": on_timeout}),
    )
}

/// E2B's `pauseMode` of a paused sandbox (left out while it runs: the SDKs take no null).
fn pause_mode(v: &SandboxView) -> Option<&'static str> {
    match v.paused? {
        PauseMode::Full => Some("full"),
        PauseMode::Filesystem => Some("filesystem"),
    }
}

fn detail_json(v: &SandboxView, domain: Value) -> Value {
    let (internet, allow_out, deny_out) = v.network.to_e2b();
    let (state, lifecycle) = state_json(v);
    let mut detail = json!({
        "templateID": v.template,
        "sandboxID": v.id,
        "clientID": "husk",
        "startedAt": rfc3339(v.started_at),
        "endAt": rfc3339(v.end_at),
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": v.access_token,
        "cpuCount": v.cpu_count,
        "memoryMB": v.memory_mb,
        "diskSizeMB": v.disk_mb,
        "state": state,
        "metadata": v.metadata,
        "allowInternetAccess": internet,
        "volumeMounts": volume_mounts_json(&v.workspaces),
        "trafficAccessToken": v.traffic_access_token,
        "network": {
            "allowPublicTraffic": v.public_traffic,
            "allowOut": allow_out,
            "denyOut": deny_out,
            "maskRequestHost": v.mask_request_host,
            "rules": crate::net_rules::to_json(&v.net_rules),
        },
        "domain": domain,
        "lifecycle": lifecycle,
    });
    if let (Some(mode), Some(o)) = (pause_mode(v), detail.as_object_mut()) {
        o.insert("pauseMode".into(), json!(mode));
    }
    detail
}

fn listed_json(v: &SandboxView) -> Value {
    let (state, _) = state_json(v);
    let mut listed = json!({
        "templateID": v.template,
        "sandboxID": v.id,
        "clientID": "husk",
        "startedAt": rfc3339(v.started_at),
        "endAt": rfc3339(v.end_at),
        "envdVersion": ENVD_VERSION,
        "cpuCount": v.cpu_count,
        "memoryMB": v.memory_mb,
        "diskSizeMB": v.disk_mb,
        "state": state,
        "metadata": v.metadata,
        "volumeMounts": volume_mounts_json(&v.workspaces),
    });
    // A lost sandbox's `endAt` is when it was lost; why, beside it.
    if let (Some(l), Some(o)) = (&v.lost, listed.as_object_mut()) {
        o.insert("lostReason".into(), json!(l.reason));
    }
    listed
}

/// Handlers answer errors as finished responses, so `?` works on every step.
pub(crate) type Answer = Result<Response, Response>;

async fn create(State(state): State<AppState>, Who(who): Who, body: Bytes) -> Answer {
    let req: NewSandbox = parse_body(&body)?;
    refuse_unsupported(&req)?;
    let lifecycle = lifecycle(&req)?;
    let network = req.network.unwrap_or_default();
    let policy = network.policy(req.allow_internet_access, false)?;
    let rules = network.rules()?;
    let mask_request_host = network
        .mask_request_host
        .as_deref()
        .map(MaskedHost::new)
        .transpose()
        .map_err(|e| error(StatusCode::BAD_REQUEST, e))?;
    let create = CreateRequest {
        template: req.template_id.unwrap_or_else(|| "base".into()),
        timeout: timeout_secs(req.timeout)?,
        metadata: req.metadata.unwrap_or_default(),
        env: EnvVars::new(req.env_vars.unwrap_or_default().into_iter().collect())
            .map_err(|e| error(StatusCode::BAD_REQUEST, e.to_string()))?,
        allow_internet_access: req.allow_internet_access,
        workspaces: req
            .volume_mounts
            .unwrap_or_default()
            .iter()
            .map(VolumeMount::to_core)
            .collect(),
        limits: None,
        network: policy,
        allow_public_traffic: network.allow_public_traffic,
        mask_request_host,
        rules,
        lifecycle,
    };
    let started = std::time::Instant::now();
    let sb = state.manager.create(&who, create).await.map_err(answer)?;
    // How long the server took from the request to a ready agent (the benchmark reads it),
    // and its steps for a sandbox made fresh.
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let total = format!("create;dur={:.3}", ms(started.elapsed()));
    let timing = match sb.create_phases() {
        Some(p) => format!(
            "spawn;dur={:.3}, boot;dur={:.3}, register;dur={:.3}, {total}",
            ms(p.spawn),
            ms(p.boot),
            ms(p.register)
        ),
        None => total,
    };
    let mut resp = sandbox_answer(&state, StatusCode::CREATED, &sb);
    if let Ok(v) = HeaderValue::from_str(&timing) {
        resp.headers_mut().insert("server-timing", v);
    }
    Ok(resp)
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct TimeoutBody {
    timeout: Option<i64>,
    /// On connect: `false` resumes a paused sandbox by booting it again on its files (E2B's
    /// `on_resume="reboot"`) rather than restoring its memory.
    memory: Option<bool>,
}

async fn connect(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: TimeoutBody = parse_body(&body)?;
    let reboot = req.memory == Some(false);
    let (sb, resumed) = state
        .manager
        .resume(&who, &id, Some(timeout_secs(req.timeout)?), reboot)
        .await
        .map_err(answer)?;
    // 201 when it was paused and now runs again, as E2B answers.
    let status = if resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(sandbox_answer(&state, status, &sb))
}

/// A `Sandbox` answer (create, connect, resume).
fn sandbox_answer(state: &AppState, status: StatusCode, sb: &LiveSandbox) -> Response {
    (status, axum::Json(sandbox_json(sb, domain(state)))).into_response()
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct PauseBody {
    /// `false`: keep only the files (E2B's `mode="filesystem"`). (`requireHealthyGuest` is
    /// left unread: husk's agent answers while its sandbox runs, and a frozen one is paused.)
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause`: 204, or 409 when it is paused already.
async fn pause(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: PauseBody = parse_body(&body)?;
    let mode = if req.memory == Some(false) {
        PauseMode::Filesystem
    } else {
        PauseMode::Full
    };
    match state.manager.pause(&who, &id, mode).await.map_err(answer)? {
        Paused::Paused => Ok(StatusCode::NO_CONTENT.into_response()),
        Paused::AlreadyPaused => Err(error(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        )),
    }
}

/// The deprecated `POST /sandboxes/{id}/resume`: 201 with the sandbox, 409 when it runs.
async fn resume(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: TimeoutBody = parse_body(&body)?;
    if !state.manager.is_paused(&who, &id).map_err(answer)? {
        return Err(error(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    let (sb, _) = state
        .manager
        .resume(&who, &id, Some(timeout_secs(req.timeout)?), false)
        .await
        .map_err(answer)?;
    Ok(sandbox_answer(&state, StatusCode::CREATED, &sb))
}

async fn set_timeout(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: TimeoutBody = parse_body(&body)?;
    let Some(t) = req.timeout else {
        return Err(error(StatusCode::BAD_REQUEST, "timeout is required"));
    };
    state
        .manager
        .set_timeout(&who, &id, timeout_secs(Some(t))?)
        .map_err(answer)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// E2B's `update_network`: replaces the sandbox's egress rules (omitted fields are cleared).
async fn update_network(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let req: NetworkBody = parse_body(&body)?;
    if req.mask_request_host.is_some() {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "network.maskRequestHost is set when a sandbox is created, not updated",
        ));
    }
    let policy = req
        .policy(req.allow_internet_access, true)?
        .unwrap_or_else(husk_net::NetPolicy::internet);
    let rules = req.rules()?.unwrap_or_default();
    state
        .manager
        .set_network_policy(&who, &id, policy, rules)
        .await
        .map_err(answer)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The sandbox's denied connections, as JSON records (husk's own API).
async fn denials(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let sb = state.manager.get(&who, &id).map_err(answer)?;
    // Read with what the router logged up to now, so that a log read right after a
    // refusal has it.
    let denials = sb.denials().await.map_err(answer)?;
    Ok(axum::Json(json!({
        "sandboxID": sb.id(),
        "policy": sb.network_policy(),
        "denials": denials,
    }))
    .into_response())
}

/// E2B's sandbox logs: husk's are the denied connections, one line each.
async fn logs(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let sb = state.manager.get(&who, &id).map_err(answer)?;
    let entries: Vec<Value> = sb
        .denials()
        .await
        .map_err(answer)?
        .iter()
        .map(|d| {
            let at = time::OffsetDateTime::from_unix_timestamp(d.at as i64)
                .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
            json!({
                "timestamp": rfc3339(at),
                "line": husk_net::sandboxes::describe(d),
                "level": "warn",
                "message": husk_net::sandboxes::describe(d),
                "fields": {"kind": "denied-connection"},
            })
        })
        .collect();
    let logs: Vec<Value> = entries
        .iter()
        .map(|e| json!({"timestamp": e["timestamp"], "line": e["line"]}))
        .collect();
    Ok(axum::Json(json!({"logs": logs, "logEntries": entries})).into_response())
}

async fn info(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    let view = state.manager.view(&who, &id).map_err(answer)?;
    Ok(axum::Json(detail_json(&view, domain(&state))).into_response())
}

async fn kill(State(state): State<AppState>, Who(who): Who, Path(id): Path<String>) -> Answer {
    state.manager.kill(&who, &id).await.map_err(answer)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `start` and `end` of a metrics query: unix seconds, as the SDKs send them.
fn time_range(q: &[(String, String)]) -> Result<TimeRange, Response> {
    let at = |name: &str| -> Result<Option<OffsetDateTime>, Response> {
        let Some((_, v)) = q.iter().rev().find(|(k, _)| k == name) else {
            return Ok(None);
        };
        v.trim()
            .parse::<i64>()
            .ok()
            .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
            .map(Some)
            .ok_or_else(|| {
                error(
                    StatusCode::BAD_REQUEST,
                    format!("{name} must be a time in unix seconds, got '{v}'"),
                )
            })
    };
    Ok(TimeRange {
        start: at("start")?,
        end: at("end")?,
    })
}

async fn metrics(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Answer {
    let range = time_range(&q)?;
    let samples = state
        .manager
        .metrics(&who, &id, range)
        .await
        .map_err(answer)?;
    let json: Vec<Value> = samples
        .iter()
        .map(|m| {
            json!({
                "timestamp": rfc3339(m.timestamp),
                "timestampUnix": m.timestamp.unix_timestamp(),
                "cpuCount": m.cpu_count,
                "cpuUsedPct": m.cpu_used_pct,
                "memUsed": m.mem_used,
                "memTotal": m.mem_total,
                "memCache": m.mem_cache,
                "diskUsed": m.disk_used,
                "diskTotal": m.disk_total,
            })
        })
        .collect();
    Ok(axum::Json(json).into_response())
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

/// The last value of query parameter `k`.
pub(crate) fn query_value<'a>(q: &'a [(String, String)], k: &str) -> Option<&'a str> {
    q.iter()
        .rev()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.as_str())
}

/// A list's page size: `limit` (1-100), 100 when not given.
pub(crate) fn page_limit(q: &[(String, String)]) -> Result<usize, Response> {
    match query_value(q, "limit").map(str::parse::<usize>) {
        None => Ok(100),
        Some(Ok(n)) if (1..=100).contains(&n) => Ok(n),
        Some(_) => Err(error(
            StatusCode::BAD_REQUEST,
            "limit must be between 1 and 100",
        )),
    }
}

async fn list(
    State(state): State<AppState>,
    Who(who): Who,
    Query(q): Query<Vec<(String, String)>>,
) -> Answer {
    let get = |k: &str| query_value(&q, k);
    let mut filter = ListFilter::default();
    for (_, v) in q.iter().filter(|(k, _)| k == "metadata") {
        filter.metadata.extend(parse_metadata_filter(v));
    }
    filter.template = get("template").map(str::to_string);
    if let Some(t) = get("startedAfter") {
        let parsed = OffsetDateTime::parse(t, &Rfc3339).map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                format!("startedAfter must be an RFC 3339 date-time (got '{t}')"),
            )
        })?;
        filter.started_after = Some(parsed);
    }
    let states: Vec<&str> = q
        .iter()
        .filter(|(k, _)| k == "state")
        .flat_map(|(_, v)| v.split(','))
        .filter(|s| !s.is_empty())
        .collect();
    // husk's own: `lost` (never sent by E2B's SDKs, whose lists know two states).
    let mut lost = false;
    for s in &states {
        match *s {
            "running" => filter.running = true,
            "paused" => filter.paused = true,
            "lost" => lost = true,
            _ => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown state '{s}'"),
                ))
            }
        }
    }
    let limit = page_limit(&q)?;
    let desc = match get("order") {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(o) => {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("order must be asc or desc (got '{o}')"),
            ))
        }
    };
    let mut items = if lost && !filter.running && !filter.paused {
        Vec::new()
    } else {
        state.manager.list_views(&who, &filter)
    };
    if lost {
        items.extend(state.manager.lost_views(&who, &filter).map_err(answer)?);
        items.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
    }
    if desc {
        items.reverse();
    }
    // The page token is the position key of the last item returned: (start time, id).
    let key = |v: &SandboxView| format!("{:020}.{}", v.started_at.unix_timestamp_nanos(), v.id);
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
    let page: Vec<&SandboxView> = items.iter().take(limit).collect();
    let mut resp =
        axum::Json(page.iter().map(|sb| listed_json(sb)).collect::<Vec<_>>()).into_response();
    if total > limit {
        if let Some(last) = page.last() {
            if let Ok(v) = HeaderValue::from_str(&key(last)) {
                resp.headers_mut().insert("x-next-token", v);
            }
        }
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_layered_metadata_filter_is_decoded() {
        // What the Python SDK sends for {"a b": "c&d", "k": "v"}, after the framework's own
        // decoding of the query string.
        let once = percent_encoding::percent_decode_str("a%252520b%3Dc%252526d%26k%3Dv")
            .decode_utf8_lossy()
            .into_owned();
        assert_eq!(
            parse_metadata_filter(&once),
            vec![("a b".into(), "c&d".into()), ("k".into(), "v".into())]
        );
        assert_eq!(parse_metadata_filter(""), vec![]);
        assert_eq!(parse_metadata_filter("%3Dv"), vec![]);
    }

    #[test]
    fn network_takes_allow_public_traffic_and_ignores_what_it_does_not_know() {
        let body = br#"{"network":{"allowPublicTraffic":false,"maskRequestHost":"x","new":1}}"#;
        let req: NewSandbox = parse_body(&Bytes::from_static(body)).unwrap();
        assert_eq!(req.network.unwrap().allow_public_traffic, Some(false));
        let req: NewSandbox = parse_body(&Bytes::from_static(br#"{"network":{}}"#)).unwrap();
        assert_eq!(req.network.unwrap().allow_public_traffic, None);
    }

    #[test]
    fn network_updates_take_allow_internet_access_in_either_spelling() {
        for body in [
            &br#"{"allow_internet_access":false}"#[..],
            &br#"{"allowInternetAccess":false}"#[..],
        ] {
            let req: NetworkBody = parse_body(&Bytes::copy_from_slice(body)).unwrap();
            assert_eq!(req.allow_internet_access, Some(false));
            let policy = req.policy(req.allow_internet_access, true).ok().flatten();
            assert_eq!(policy, Some(husk_net::NetPolicy::None));
        }
        // Omitted fields are cleared: an empty update is the internet.
        let req: NetworkBody = parse_body(&Bytes::from_static(b"{}")).unwrap();
        let policy = req.policy(req.allow_internet_access, true).ok().flatten();
        assert_eq!(policy, Some(husk_net::NetPolicy::internet()));
        // The SOCKS proxy is refused, not ignored.
        let req: NetworkBody =
            parse_body(&Bytes::from_static(br#"{"egressProxy":{"address":"x:1"}}"#)).unwrap();
        assert!(req.policy(None, true).is_err());
    }

    #[test]
    fn dns_servers_join_an_allow_list_and_are_checked() {
        let parse =
            |b: &'static str| parse_body::<NetworkBody>(&Bytes::from_static(b.as_bytes())).unwrap();
        let req = parse(r#"{"allowOut":["10.9.9.9"],"dnsServers":["1.1.1.1"]}"#);
        let with = req.policy(None, false).unwrap().unwrap();
        let req = parse(r#"{"allowOut":["10.9.9.9","1.1.1.1"]}"#);
        assert_eq!(with, req.policy(None, false).unwrap().unwrap());
        // Without a list there is nothing to open: the default policy.
        let req = parse(r#"{"dnsServers":["1.1.1.1"]}"#);
        assert_eq!(req.policy(None, false).unwrap(), None);
        for bad in [
            r#"{"dnsServers":["::1"]}"#,
            r#"{"dnsServers":["dns.example"]}"#,
            r#"{"dnsServers":["1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1","1.1.1.1"]}"#,
            r#"{"httpsPorts":[443]}"#,
        ] {
            assert!(parse(bad).policy(None, false).is_err(), "{bad}");
        }
        assert!(parse(r#"{"httpsPorts":[]}"#).policy(None, false).is_ok());
    }

    #[test]
    fn create_bodies_must_be_json_objects() {
        let ok: NewSandbox =
            parse_body(&Bytes::from_static(b" {\"templateID\":\"base\"}")).unwrap();
        assert_eq!(ok.template_id.as_deref(), Some("base"));
        let empty: NewSandbox = parse_body(&Bytes::from_static(b"  ")).unwrap();
        assert!(empty.template_id.is_none());
        for bad in [&b"[]"[..], b"\"x\"", b"{", b"{\"timeout\":\"x\"}"] {
            let r = parse_body::<NewSandbox>(&Bytes::copy_from_slice(bad));
            assert_eq!(r.err().map(|r| r.status()), Some(StatusCode::BAD_REQUEST));
        }
        let big = Bytes::from(vec![b' '; MAX_BODY + 1]);
        let r = parse_body::<NewSandbox>(&big);
        assert_eq!(
            r.err().map(|r| r.status()),
            Some(StatusCode::PAYLOAD_TOO_LARGE)
        );
    }
}
