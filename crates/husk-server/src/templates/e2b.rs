//! E2B's template build API, so that templates as code (`Template().from_image(...)
//! .run_cmd(...).copy(...)`, `Template.build(...)`, `Template.build_in_background(...)`,
//! `Template.get_build_status(...)`, `Template.exists(...)`) build unchanged on husk's
//! builder (its layer cache, its erofs images), admin keys only, as husk's own builds:
//!
//! - `POST /v3/templates` `{"name": "my-env", ...}` → 202 `{"templateID", "buildID", ...}`:
//!   a build that waits for its steps. The template's id is its husk name.
//! - `GET /templates/{id}/files/{hash}` → 201 `{"present": bool, "url"}`: whether the server has
//!   the files of a `COPY` step; `url` is where the SDK uploads them (`PUT`, a tar archive),
//!   signed for an hour with a key of this server's run, so any HTTP client can use it
//!   without the API key.
//! - `POST /v2/templates/{id}/builds/{buildID}` (`TemplateBuildStartV2`) → 202: the build
//!   starts (once the server's one build slot is free; `waiting` until then).
//! - `GET /templates/{id}/builds/{buildID}/status?logsOffset=&limit=&level=` → the status
//!   (`waiting`, `building`, `ready`, `error` with its reason and step) and up to 100 log
//!   entries from `logsOffset`, each labelled with the E2B step it belongs to (`base`, the
//!   step's number, `finalize`).
//! - `GET /templates/aliases/{alias}` → 200 when a template of that name exists, else 404.
//! - Tags: a build registered under several names, `name:tag` (`default` is `name` itself):
//!   `POST /v3/templates` with `name:tag` or `tags`; `POST /templates/tags`
//!   `{"target": "name:tag", "tags": [...]}` → 201 (more names for that build's image);
//!   `DELETE /templates/tags` `{"name", "tags"}` → 204; `GET /templates/{id}/tags` → each tag
//!   with its build (the image's digest as a UUID) and when it was assigned.
//!
//! Builds are kept in memory (the last [`MAX_BUILDS`]; a server restart forgets them, and
//! the templates they built stay). Their logs are bounded ([`super::e2b_log::MAX_LOG_BYTES`]).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;
use hmac::{Hmac, Mac};
use husk_build::e2b::{
    step_numbers, tagged, valid_files_hash, valid_tagged_name, E2bStep, E2bTemplate, RegistryLogin,
};
use husk_build::helper::BuildError;
use husk_build::spec::valid_template_name;
use husk_core::store::Principal;
use husk_core::template::HOST_TEMPLATE;
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::Sha256;
use time::OffsetDateTime;

use super::build::{on_helper, refusal, Slot};
use super::e2b_log::{apply, entry_json, Level, Log, Status};
use super::{require_admin, service, Answer, TemplateService};
use crate::rest::{error, Who};
use crate::upload::{self as body, BodyEnd};
use crate::AppState;

/// Builds kept (finished ones are forgotten first, oldest first).
pub const MAX_BUILDS: usize = 32;
/// Largest build request body (the steps: at most 1 MiB of arguments, and JSON around them).
const MAX_BODY: usize = 4 << 20;
/// Log entries in one status answer (E2B's own limit; the SDK asks again for the rest).
const MAX_ENTRIES: usize = 100;
/// How long an upload URL is good for.
const UPLOAD_URL_LIFETIME: Duration = Duration::from_secs(3600);
/// How long a build waits for the server's build slot.
const SLOT_WAIT: Duration = Duration::from_secs(3600);

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v3/templates", post(request_build))
        .route("/templates/{id}/files/{hash}", get(files_link))
        .route("/husk/v1/template-files/{hash}", put(upload))
        .route("/v2/templates/{id}/builds/{build}", post(start))
        .route("/templates/{id}/builds/{build}/status", get(status))
        .route("/templates/aliases/{alias}", get(alias))
        .route("/templates/tags", post(assign_tags).delete(remove_tags))
        .route("/templates/{id}/tags", get(list_tags))
        .with_state(state)
}

/// One build of E2B's API.
struct Build {
    template: String,
    /// What the build registers: the first by building, the rest as tags of it.
    names: Vec<String>,
    id: String,
    created: OffsetDateTime,
    log: Mutex<Log>,
}

impl Build {
    fn log(&self) -> std::sync::MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The builds of E2B's API this server knows, and the key its upload URLs are signed with.
pub struct E2bBuilds {
    builds: Mutex<VecDeque<Arc<Build>>>,
    upload_key: OnceLock<[u8; 32]>,
    /// One upload at a time: each holds one of the build helper's few channels for as long as
    /// it streams, and the others are for builds and their questions.
    uploads: tokio::sync::Semaphore,
}

impl Default for E2bBuilds {
    fn default() -> Self {
        E2bBuilds {
            builds: Mutex::default(),
            upload_key: OnceLock::new(),
            uploads: tokio::sync::Semaphore::new(1),
        }
    }
}

impl E2bBuilds {
    fn key(&self) -> Result<&[u8; 32], Response> {
        if let Some(k) = self.upload_key.get() {
            return Ok(k);
        }
        let mut k = [0u8; 32];
        getrandom::fill(&mut k).map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("random upload key: {e}"),
            )
        })?;
        Ok(self.upload_key.get_or_init(|| k))
    }

    fn find(&self, template: &str, id: &str) -> Result<Arc<Build>, Response> {
        let builds = self.builds.lock().unwrap_or_else(|p| p.into_inner());
        builds
            .iter()
            .find(|b| b.id == id && b.template == template)
            .cloned()
            .ok_or_else(|| {
                error(
                    StatusCode::NOT_FOUND,
                    format!(
                        "build '{id}' of template '{template}' not found (builds are kept in \
                         memory: a restarted server forgets them)"
                    ),
                )
            })
    }

    /// Adds a build, forgetting the oldest finished one (or one never given its steps for an
    /// hour) when [`MAX_BUILDS`] are kept.
    fn add(&self, build: Arc<Build>) -> Result<(), Response> {
        let mut builds = self.builds.lock().unwrap_or_else(|p| p.into_inner());
        if builds.len() >= MAX_BUILDS {
            let now = OffsetDateTime::now_utc();
            let old = builds.iter().position(|b| {
                let log = b.log();
                matches!(log.status, Status::Ready | Status::Error)
                    || (!log.triggered && now - b.created > time::Duration::hours(1))
            });
            match old {
                Some(i) => {
                    builds.remove(i);
                }
                None => {
                    return Err(error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!(
                            "{MAX_BUILDS} template builds are waiting or running; try again \
                             when one has finished"
                        ),
                    ))
                }
            }
        }
        builds.push_back(build);
        Ok(())
    }
}

fn bad(msg: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, msg)
}

fn admin(who: &Principal) -> Result<(), Response> {
    require_admin(who, "building templates")
}

async fn json_body<T: serde::de::DeserializeOwned>(b: Body, example: &str) -> Result<T, Response> {
    let bytes = crate::body::read_all(b, MAX_BODY)
        .await
        .map_err(|e| error(e.status(), e.to_string()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| bad(format!("expected a JSON body like {example}: {e}")))
}

/// A random build id in the UUID shape E2B's have.
fn new_build_id() -> Result<String, Response> {
    husk_core::ids::random_uuid().map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("random build id: {e}"),
        )
    })
}

/// `POST /v3/templates`'s body (`TemplateBuildRequestV3`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RequestBody {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB")]
    memory_mb: Option<u64>,
    #[serde(rename = "minFreeDiskMB")]
    min_free_disk_mb: Option<u64>,
}

/// A build request's template name (`name` or `name:tag`) and tags: the name, the names the
/// build registers (`name` for the `default` tag, `name:tag` for the others; `name` alone
/// when no tag is given) and the tags.
fn template_names(
    raw: &str,
    tags: &[String],
) -> Result<(String, Vec<String>, Vec<String>), Response> {
    let (name, tag) = match raw.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (raw, None),
    };
    if !valid_template_name(name) || name == HOST_TEMPLATE {
        return Err(bad(format!(
            "invalid template name {name:?}: use 1-63 characters of a-z, 0-9, '.', '_' and \
             '-', starting with a letter or digit (and not 'host')"
        )));
    }
    let mut all: Vec<String> = Vec::new();
    for t in tag.into_iter().chain(tags.iter().map(String::as_str)) {
        if !valid_tagged_name(&format!("{name}:{t}")) {
            return Err(bad(format!(
                "invalid tag {t:?}: use 1-63 ASCII letters, digits, '.', '_' and '-', starting \
                 with a letter or digit"
            )));
        }
        if !all.iter().any(|a| a == t) {
            all.push(t.to_string());
        }
    }
    if all.len() > 64 {
        return Err(bad("at most 64 tags"));
    }
    if all.is_empty() {
        all.push("default".into());
    }
    let names = all.iter().map(|t| tagged(name, t)).collect();
    Ok((name.to_string(), names, all))
}

async fn request_build(State(state): State<AppState>, Who(who): Who, b: Body) -> Answer {
    admin(&who)?;
    let svc = service(&state)?;
    let req: RequestBody = json_body(b, r#"{"name": "my-template"}"#).await?;
    let Some(raw) = req.name.as_deref().or(req.alias.as_deref()) else {
        return Err(bad("the template's name is missing"));
    };
    let (name, names, tags) = template_names(raw, req.tags.as_deref().unwrap_or_default())?;
    let build = Arc::new(Build {
        template: name.clone(),
        names,
        id: new_build_id()?,
        created: OffsetDateTime::now_utc(),
        log: Mutex::new(Log::new()),
    });
    {
        let mut log = build.log();
        let size = svc.size;
        let asked = [
            req.cpu_count.map(|c| format!("cpuCount {c}")),
            req.memory_mb.map(|m| format!("memoryMB {m}")),
            req.min_free_disk_mb.map(|d| format!("minFreeDiskMB {d}")),
        ];
        let asked: Vec<String> = asked.into_iter().flatten().collect();
        if !asked.is_empty() {
            log.push(
                Level::Warn,
                format!(
                    "husk: {} not applied: sandboxes' size is the server's, not the template's \
                     ({} CPU, {} MiB of memory, {} MiB of disk)",
                    asked.join(", "),
                    size.cpu_count,
                    size.memory_mb,
                    size.disk_mb
                ),
                false,
            );
        }
    }
    svc.e2b.add(build.clone())?;
    tracing::info!(template = %name, build = %build.id, key = %who.key_id, "E2B template build requested");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({
            "templateID": name,
            "buildID": build.id,
            "public": true,
            "names": [name],
            "aliases": [name],
            "tags": tags,
        })),
    )
        .into_response())
}

fn signature(key: &[u8; 32], hash: &str, expires: i64) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key");
    mac.update(format!("e2b-files:{hash}:{expires}").as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The scheme and authority the client reached this server under, for URLs it is to use.
fn origin(headers: &HeaderMap) -> Result<String, Response> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .ok_or_else(|| bad("the request has no valid Host header to build the upload URL from"))?;
    let https = headers
        .get("x-forwarded-proto")
        .is_some_and(|p| p.as_bytes().eq_ignore_ascii_case(b"https"));
    Ok(format!("{}://{host}", if https { "https" } else { "http" }))
}

async fn files_link(
    State(state): State<AppState>,
    Who(who): Who,
    Path((_template, hash)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    admin(&who)?;
    let svc = service(&state)?.clone();
    if !valid_files_hash(&hash) {
        return Err(bad(format!(
            "invalid files hash {hash:?}: expected 64 lower-case hex digits"
        )));
    }
    let asked = hash.clone();
    let present = on_helper(&svc, move |h| h.has_files(&asked)).await?;
    let expires = OffsetDateTime::now_utc().unix_timestamp() + UPLOAD_URL_LIFETIME.as_secs() as i64;
    let sig = signature(svc.e2b.key()?, &hash, expires);
    let url = format!(
        "{}/husk/v1/template-files/{hash}?expires={expires}&signature={sig}",
        origin(&headers)?
    );
    // 201, as E2B answers (the SDK reads nothing else).
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({"present": present, "url": url})),
    )
        .into_response())
}

/// `PUT` of an upload URL: the signature is the authority (no API key).
async fn upload(
    State(state): State<AppState>,
    Path(hash): Path<String>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    b: Body,
) -> Answer {
    let checked = (|| {
        let svc = service(&state)?.clone();
        let mut expires = None;
        let mut sig = None;
        for (k, v) in form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes()) {
            match &*k {
                "expires" => expires = v.parse::<i64>().ok(),
                "signature" => sig = Some(v.into_owned()),
                _ => {}
            }
        }
        let (Some(expires), Some(sig)) = (expires, sig) else {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "the upload URL has no valid signature",
            ));
        };
        let want = signature(svc.e2b.key()?, &hash, expires);
        if !bool::from(subtle::ConstantTimeEq::ct_eq(
            want.as_bytes(),
            sig.as_bytes(),
        )) {
            return Err(error(
                StatusCode::FORBIDDEN,
                "the upload URL's signature does not match",
            ));
        }
        if OffsetDateTime::now_utc().unix_timestamp() > expires {
            return Err(error(
                StatusCode::UNAUTHORIZED,
                "the upload URL has expired",
            ));
        }
        Ok(svc)
    })();
    let svc = match checked {
        Ok(s) => s,
        Err(resp) => {
            body::drain(&headers, b).await;
            return Err(resp);
        }
    };
    // Waiting here is bounded by the body's own stall limits of the upload ahead.
    let _turn = svc.e2b.uploads.acquire().await.map_err(|_| {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the server is shutting down",
        )
    })?;
    let (tx, reader) = body::body_channel();
    let helper = svc.helper.clone();
    let h = hash.clone();
    let storing = tokio::task::spawn_blocking(move || helper.put_files(&h, reader));
    let (end, stored) = tokio::join!(
        body::pump(b, tx, husk_build::context::MAX_CONTEXT_BYTES),
        storing
    );
    match end {
        BodyEnd::TooLarge => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the files are larger than {} MiB",
                    husk_build::context::MAX_CONTEXT_BYTES >> 20
                ),
            ))
        }
        BodyEnd::Stalled(s) => return Err(error(StatusCode::REQUEST_TIMEOUT, s.to_string())),
        BodyEnd::Complete | BodyEnd::Failed => {}
    }
    stored
        .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(refusal)?;
    tracing::info!(hash = %hash, "E2B template files uploaded");
    Ok(StatusCode::OK.into_response())
}

/// `POST /v2/templates/{id}/builds/{buildID}`'s body (`TemplateBuildStartV2`).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StartBody {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    force: Option<bool>,
    steps: Option<Vec<StepBody>>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StepBody {
    #[serde(rename = "type")]
    kind: String,
    args: Option<Vec<String>>,
    files_hash: Option<String>,
    force: Option<bool>,
    /// The SDK's own business (it uploads again); the server has nothing to do with it.
    #[allow(dead_code)]
    force_upload: Option<bool>,
}

/// The login of E2B's `fromImageRegistry`: `{"type": "registry", "username", "password"}`.
/// AWS's and GCP's (keys traded for a token by their SDKs) are refused.
fn registry_login(v: &Value) -> Result<RegistryLogin, Response> {
    let field = |k: &str| v.get(k).and_then(Value::as_str);
    match field("type") {
        Some("registry") => match (field("username"), field("password")) {
            (Some(u), Some(p)) => Ok(RegistryLogin {
                username: u.to_string(),
                password: p.to_string(),
            }),
            _ => Err(bad(
                "fromImageRegistry of type registry needs a username and a password",
            )),
        },
        Some(other @ ("aws" | "gcp")) => Err(bad(format!(
            "fromImageRegistry of type {other:?} is not supported by husk (it logs in to \
             registries with a username and password: give a registry login, or push the image \
             to a registry husk can pull from)"
        ))),
        _ => Err(bad(
            "fromImageRegistry must be {\"type\": \"registry\", \"username\", \"password\"}",
        )),
    }
}

async fn start(
    State(state): State<AppState>,
    Who(who): Who,
    Path((template, build_id)): Path<(String, String)>,
    b: Body,
) -> Answer {
    admin(&who)?;
    let svc = service(&state)?.clone();
    let build = svc.e2b.find(&template, &build_id)?;
    let req: StartBody = json_body(
        b,
        r#"{"fromImage": "e2bdev/base", "steps": [{"type": "RUN", "args": ["echo hi"]}]}"#,
    )
    .await?;
    let registry_login = match req.from_image_registry {
        None => None,
        Some(v) => Some(registry_login(&v)?),
    };
    let t = E2bTemplate {
        from_image: req.from_image,
        from_template: req.from_template,
        force: req.force.unwrap_or(false),
        steps: req
            .steps
            .unwrap_or_default()
            .into_iter()
            .map(|s| E2bStep {
                kind: s.kind,
                args: s.args.unwrap_or_default(),
                files_hash: s.files_hash,
                force: s.force.unwrap_or(false),
            })
            .collect(),
        start_cmd: req.start_cmd,
        ready_cmd: req.ready_cmd,
        registry_login,
    };
    t.check().map_err(|e| bad(e.to_string()))?;
    if let Some(from) = &t.from_template {
        let store = state.manager.store();
        if store
            .template(from)
            .map_err(crate::error::answer)?
            .is_none()
        {
            return Err(bad(husk_build::e2b::missing_base_template(from)));
        }
    }
    // Files never uploaded are the client's mistake: said now, not in the build's log.
    for hash in t.files_hashes() {
        let asked = hash.clone();
        if !on_helper(&svc, move |h| h.has_files(&asked)).await? {
            return Err(bad(format!(
                "the files of hash {hash} were never uploaded: upload them first \
                 (GET /templates/{template}/files/{hash} gives the URL)"
            )));
        }
    }
    {
        let mut log = build.log();
        if log.triggered {
            return Err(error(
                StatusCode::CONFLICT,
                format!("build '{build_id}' already started"),
            ));
        }
        log.triggered = true;
    }
    let numbers = step_numbers(&t);
    let key = who.key_id.clone();
    tokio::spawn(run(svc, build, t, numbers, key));
    Ok(StatusCode::ACCEPTED.into_response())
}

/// Runs a build once the server's build slot is free, its events into its log.
async fn run(
    svc: Arc<TemplateService>,
    build: Arc<Build>,
    t: E2bTemplate,
    numbers: Vec<usize>,
    key: String,
) {
    let deadline = tokio::time::Instant::now() + SLOT_WAIT;
    let slot = loop {
        if let Some(slot) = Slot::take(&svc) {
            break slot;
        }
        if tokio::time::Instant::now() > deadline {
            let mut log = build.log();
            log.fail(format!(
                "the server's builder was busy with other builds for {} minutes",
                SLOT_WAIT.as_secs() / 60
            ));
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    {
        let mut log = build.log();
        log.status = Status::Building;
        log.step = Some("base".into());
    }
    let helper = svc.helper.clone();
    let name = build.names[0].clone();
    let started =
        tokio::task::spawn_blocking(move || helper.start_e2b_build(&name, &t, &key)).await;
    let running = match started {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            let message = match e {
                BuildError::Refused { message, .. } => message,
                other => other.to_string(),
            };
            build.log().fail(message);
            return;
        }
        Err(e) => {
            build.log().fail(e.to_string());
            return;
        }
    };
    let b = build.clone();
    let helper = svc.helper.clone();
    let forwarded = tokio::task::spawn_blocking(move || {
        let mut pending = Vec::new();
        // The build's last event, held until its tags are registered too (a client that
        // sees `ready` may create from any of them at once).
        let mut done = None;
        let ended = running.forward(|chunk| {
            pending.extend_from_slice(&chunk);
            while let Some(i) = pending.iter().position(|&c| c == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                if let Ok(ev) = serde_json::from_slice::<Value>(&line) {
                    if ev.get("type").and_then(Value::as_str) == Some("done") {
                        done = Some(ev);
                        continue;
                    }
                    let mut log = b.log();
                    apply(&mut log, &ev, &numbers);
                }
            }
            true
        });
        if let Some(ev) = done {
            let tagged = match b.names.split_first() {
                Some((first, rest)) if !rest.is_empty() => helper.tag(first, rest).map(|_| ()),
                _ => Ok(()),
            };
            let mut log = b.log();
            match tagged {
                Ok(()) => apply(&mut log, &ev, &numbers),
                Err(e) => log.fail(format!("registering the build's tags: {e}")),
            }
        }
        drop(slot);
        ended
    })
    .await;
    let mut log = build.log();
    if matches!(log.status, Status::Building | Status::Waiting) {
        let why = match forwarded {
            Ok(Err(e)) => format!("the build helper: {e}"),
            Err(e) => e.to_string(),
            Ok(Ok(())) => "the build ended without a result".into(),
        };
        log.fail(why);
    }
    tracing::info!(template = %build.template, build = %build.id, status = log.status.as_str(), "E2B template build over");
}

async fn status(
    State(state): State<AppState>,
    Who(who): Who,
    Path((template, build_id)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Answer {
    admin(&who)?;
    let svc = service(&state)?;
    let mut offset = 0usize;
    let mut limit = MAX_ENTRIES;
    let mut level = Level::Debug;
    for (k, v) in form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes()) {
        match &*k {
            "logsOffset" => {
                offset = v
                    .parse()
                    .map_err(|_| bad(format!("logsOffset must be a number (got {v:?})")))?
            }
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .map_err(|_| bad(format!("limit must be a number (got {v:?})")))?
                    .min(MAX_ENTRIES)
            }
            "level" => {
                level = Level::parse(&v).ok_or_else(|| {
                    bad(format!(
                        "level must be debug, info, warn or error (got {v:?})"
                    ))
                })?
            }
            other => return Err(bad(format!("unknown query parameter '{other}'"))),
        }
    }
    let build = svc.e2b.find(&template, &build_id)?;
    let log = build.log();
    let entries: Vec<Value> = log
        .entries
        .iter()
        .filter(|e| e.level >= level)
        .skip(offset)
        .take(limit)
        .map(entry_json)
        .collect();
    let mut body = json!({
        "templateID": build.template,
        "buildID": build.id,
        "status": log.status.as_str(),
        "logEntries": entries,
        "logs": [],
    });
    if let Some((message, step)) = &log.reason {
        let mut reason = json!({"message": message});
        if let Some(step) = step {
            reason["step"] = json!(step);
        }
        body["reason"] = reason;
    }
    Ok(axum::Json(body).into_response())
}

async fn alias(State(state): State<AppState>, Who(_): Who, Path(alias): Path<String>) -> Answer {
    let name = alias.strip_suffix(":default").unwrap_or(&alias);
    let exists = name == HOST_TEMPLATE
        || name == husk_core::template::BASE_TEMPLATE
        || state
            .manager
            .store()
            .template(name)
            .map_err(crate::error::answer)?
            .is_some();
    if !exists {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("template '{alias}' not found"),
        ));
    }
    Ok(axum::Json(json!({"templateID": name, "public": true})).into_response())
}

/// The template `raw` (`name` or `name:tag`) names: its name and its registered name.
fn target_of(raw: &str) -> Result<(String, String), Response> {
    let (name, mut names, _) = template_names(raw, &[])?;
    Ok((name, names.remove(0)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignBody {
    target: String,
    tags: Vec<String>,
}

async fn assign_tags(State(state): State<AppState>, Who(who): Who, b: Body) -> Answer {
    admin(&who)?;
    let svc = service(&state)?.clone();
    let req: AssignBody =
        json_body(b, r#"{"target": "my-template:v1", "tags": ["stable"]}"#).await?;
    let (name, source) = target_of(&req.target)?;
    if req.tags.is_empty() {
        return Err(bad("no tags to assign"));
    }
    let (_, names, tags) = template_names(&name, &req.tags)?;
    let rec = on_helper(&svc, move |h| h.tag(&source, &names)).await?;
    tracing::info!(template = %name, ?tags, key = %who.key_id, "template tags assigned");
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({"tags": tags, "buildID": super::build_id(&rec.digest)})),
    )
        .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveBody {
    name: String,
    tags: Vec<String>,
}

async fn remove_tags(State(state): State<AppState>, Who(who): Who, b: Body) -> Answer {
    admin(&who)?;
    let svc = service(&state)?.clone();
    let req: RemoveBody = json_body(b, r#"{"name": "my-template", "tags": ["stable"]}"#).await?;
    let (name, _) = target_of(&req.name)?;
    let (_, names, _) = template_names(&name, &req.tags)?;
    let removed = on_helper(&svc, move |h| {
        let mut removed = 0;
        for n in &names {
            if h.remove(n)?.is_some() {
                removed += 1;
            }
        }
        Ok(removed)
    })
    .await?;
    if removed == 0 {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("template '{name}' has none of the tags {:?}", req.tags),
        ));
    }
    tracing::info!(template = %name, tags = ?req.tags, key = %who.key_id, "template tags removed");
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn list_tags(State(state): State<AppState>, Who(_): Who, Path(id): Path<String>) -> Answer {
    let (name, _) = target_of(&id)?;
    let all = state
        .manager
        .store()
        .templates()
        .map_err(crate::error::answer)?;
    let prefix = format!("{name}:");
    let tags: Vec<Value> = all
        .iter()
        .filter_map(|t| {
            let tag = if t.name == name {
                "default"
            } else {
                t.name.strip_prefix(&prefix)?
            };
            Some(json!({
                "tag": tag,
                "buildID": super::build_id(&t.digest),
                "createdAt": crate::rest::rfc3339(t.created_at),
            }))
        })
        .collect();
    if tags.is_empty() {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("template '{name}' not found"),
        ));
    }
    Ok(axum::Json(tags).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tags_and_upload_signatures() {
        let names = |raw: &str, tags: &[&str]| {
            let tags: Vec<String> = tags.iter().map(|t| t.to_string()).collect();
            template_names(raw, &tags)
        };
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            names("my-env", &[]).ok().unwrap(),
            ("my-env".into(), v(&["my-env"]), v(&["default"]))
        );
        assert_eq!(
            names("my-env:default", &[]).ok().unwrap(),
            ("my-env".into(), v(&["my-env"]), v(&["default"]))
        );
        assert_eq!(
            names("my-env:v1", &["stable", "v1", "default"])
                .ok()
                .unwrap(),
            (
                "my-env".into(),
                v(&["my-env:v1", "my-env:stable", "my-env"]),
                v(&["v1", "stable", "default"])
            )
        );
        for (raw, tags) in [
            ("my-env:", &[][..]),
            ("my-env", &["bad tag"][..]),
            ("my-env:a:b", &[][..]),
            ("My Env", &[][..]),
            ("host", &[][..]),
            ("", &[][..]),
        ] {
            assert!(names(raw, tags).is_err(), "{raw} {tags:?}");
        }
        let k = [7u8; 32];
        let a = signature(&k, "ab", 100);
        assert_eq!(a, signature(&k, "ab", 100));
        assert_ne!(a, signature(&k, "ab", 101));
        assert_ne!(a, signature(&k, "ac", 100));
        assert_ne!(a, signature(&[8u8; 32], "ab", 100));
        let id = new_build_id().unwrap();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "4");
    }
}
