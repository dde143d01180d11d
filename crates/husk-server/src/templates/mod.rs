//! Templates over HTTP: husk's operator API under `/husk/v1/templates` (list, inspect, remove,
//! and build from an uploaded context: [`build`]) and E2B's `GET /templates`, which the E2B CLI
//! and SDKs use to list what a sandbox can be created from.
//!
//! Listing needs any valid key (template names are not secret: every team can create from
//! every template); changing templates needs an admin key, since a template is shared by all
//! teams and a build runs code on the host's build sandboxes.

// Helpers return the finished error `Response` as their `Err` (as in `rest`).
#![allow(clippy::result_large_err)]

mod build;
pub mod e2b;
mod e2b_log;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use husk_core::manager::ENVD_VERSION;
use husk_core::store::{Principal, Store, TemplateRecord};
use husk_core::template::{summary_json, BASE_TEMPLATE, HOST_TEMPLATE};
use serde_json::{json, Value};
use time::OffsetDateTime;

use crate::error::answer;
use crate::rest::{error, Who};
use crate::AppState;

pub use husk_build::context::{MAX_CONTEXT_BYTES, MAX_CONTEXT_ENTRIES};

type Answer = Result<Response, Response>;

/// The size of every sandbox, as E2B's template list reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxSize {
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

impl Default for SandboxSize {
    fn default() -> Self {
        SandboxSize {
            cpu_count: 1,
            memory_mb: 512,
            disk_mb: 1024,
        }
    }
}

/// What template management needs beyond the manager: the build helper (builds and
/// removals) and the sandboxes' size.
pub struct TemplateService {
    helper: Arc<husk_build::helper::BuildHelper>,
    size: SandboxSize,
    /// Set while a build runs: one at a time per server (see [`build`]).
    building: AtomicBool,
    /// When this server started: the host template's creation time.
    started_at: OffsetDateTime,
    /// Builds of E2B's template API.
    e2b: e2b::E2bBuilds,
}

impl TemplateService {
    /// The build helper (images are its files).
    pub fn helper(&self) -> &Arc<husk_build::helper::BuildHelper> {
        &self.helper
    }

    pub fn new(helper: Arc<husk_build::helper::BuildHelper>, size: SandboxSize) -> TemplateService {
        TemplateService {
            helper,
            size,
            building: AtomicBool::new(false),
            started_at: OffsetDateTime::now_utc(),
            e2b: e2b::E2bBuilds::default(),
        }
    }
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/husk/v1/templates",
            // The context archive is streamed to disk (no body limit applies to a `Body`),
            // bounded by `MAX_CONTEXT_BYTES`.
            get(list).post(build::create),
        )
        .route("/husk/v1/templates/{name}", get(inspect).delete(remove))
        .route("/templates", get(e2b_list))
        .route("/templates/{id}", get(e2b_get).delete(e2b_delete))
        .with_state(state.clone())
        .merge(e2b::router(state))
}

fn not_found(name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("template '{name}' not found"),
    )
}

/// Refuses a key that is not an admin key; `what` completes "… needs an admin key".
fn require_admin(who: &Principal, what: &str) -> Result<(), Response> {
    if who.admin {
        return Ok(());
    }
    Err(error(
        StatusCode::FORBIDDEN,
        format!(
            "{what} needs an admin key (key {} of team '{}' is not one)",
            who.key_id, who.team
        ),
    ))
}

fn service(state: &AppState) -> Result<&Arc<TemplateService>, Response> {
    state.templates.as_ref().ok_or_else(|| {
        error(
            StatusCode::NOT_IMPLEMENTED,
            "template management is not enabled on this server",
        )
    })
}

fn built(store: &Store) -> Result<Vec<TemplateRecord>, Response> {
    store.templates().map_err(answer)
}

/// The host template (the host's own `/usr`) in the shape of [`summary_json`].
fn host_json(base_built: bool) -> Value {
    let aliases: &[&str] = if base_built { &[] } else { &[BASE_TEMPLATE] };
    json!({
        "name": HOST_TEMPLATE,
        "builtin": true,
        "aliases": aliases,
        "digest": null,
        "image": null,
        "size": null,
        "created_at": null,
        "manifest": null,
    })
}

fn listed_json(t: &TemplateRecord) -> Value {
    let mut v = summary_json(t);
    v["builtin"] = Value::Bool(false);
    v
}

async fn list(State(state): State<AppState>, Who(who): Who) -> Answer {
    let templates = built(state.manager.store())?;
    let base_built = templates.iter().any(|t| t.name == BASE_TEMPLATE);
    let mut all = vec![host_json(base_built)];
    all.extend(templates.iter().map(listed_json));
    // The caller's team's snapshots, templates of its own (another team's are not shown).
    let snapshots = (state.manager).list_snapshots(&who.team, &Default::default());
    all.extend(snapshots.iter().map(|s| {
        let mut v = s.summary_json();
        v["builtin"] = Value::Bool(false);
        v
    }));
    Ok(axum::Json(json!({ "templates": all })).into_response())
}

async fn inspect(State(state): State<AppState>, Who(_): Who, Path(name): Path<String>) -> Answer {
    let store = state.manager.store();
    if name == HOST_TEMPLATE {
        let base_built = store.template(BASE_TEMPLATE).map_err(answer)?.is_some();
        return Ok(axum::Json(host_json(base_built)).into_response());
    }
    match store.template(&name).map_err(answer)? {
        Some(t) => Ok(axum::Json(listed_json(&t)).into_response()),
        None => Err(not_found(&name)),
    }
}

/// Refuses a removal by a key that is not an admin's, or of the built-in host template.
fn removable(who: &Principal, name: &str) -> Result<(), Response> {
    require_admin(who, "removing templates")?;
    if name == HOST_TEMPLATE {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "the host template is built in and cannot be removed",
        ));
    }
    Ok(())
}

/// Unregisters a template and releases its image as `husk template rm` does (sandboxes
/// running from it keep their mount).
async fn remove(State(state): State<AppState>, Who(who): Who, Path(name): Path<String>) -> Answer {
    removable(&who, &name)?;
    let removing = name.clone();
    let removed = build::on_helper(service(&state)?, move |h| h.remove(&removing)).await?;
    match removed {
        Some(_) => {
            tracing::info!(template = %name, key = %who.key_id, "template removed");
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        None => Err(not_found(&name)),
    }
}

/// A digest's first 128 bits in the UUID shape E2B's build ids have.
fn build_id(digest: &str) -> String {
    husk_core::ids::uuid_shaped(digest.strip_prefix("sha256:").unwrap_or(digest))
}

fn e2b_json(
    name: &str,
    build: &str,
    at: OffsetDateTime,
    aliases: &[&str],
    size: SandboxSize,
) -> Value {
    let at = crate::rest::rfc3339(at);
    json!({
        "templateID": name,
        "buildID": build_id(build),
        "cpuCount": size.cpu_count,
        "memoryMB": size.memory_mb,
        "diskSizeMB": size.disk_mb,
        "public": true,
        "aliases": aliases,
        "names": aliases,
        "createdAt": at,
        "updatedAt": at,
        "createdBy": null,
        "lastSpawnedAt": null,
        "spawnCount": 0,
        "buildCount": 1,
        "buildStatus": "ready",
        "envdVersion": ENVD_VERSION,
    })
}

/// E2B's template list: every name a create request accepts — the host template, `base`
/// while no template of that name is built (it means the host template then), and every
/// built template.
async fn e2b_list(State(state): State<AppState>, Who(_): Who) -> Answer {
    let templates = built(state.manager.store())?;
    let (size, started) = match &state.templates {
        Some(s) => (s.size, s.started_at),
        None => (SandboxSize::default(), OffsetDateTime::now_utc()),
    };
    let mut all = vec![e2b_json(HOST_TEMPLATE, "", started, &[HOST_TEMPLATE], size)];
    if !templates.iter().any(|t| t.name == BASE_TEMPLATE) {
        all.push(e2b_json(BASE_TEMPLATE, "", started, &[BASE_TEMPLATE], size));
    }
    for t in &templates {
        all.push(e2b_json(
            &t.name,
            &t.digest,
            t.created_at,
            &[t.name.as_str()],
            size,
        ));
    }
    Ok(axum::Json(all).into_response())
}

/// The records of template `id`: `id` itself and its tags (`id:tag`), or only the one named
/// when `id` has a tag.
fn family<'a>(templates: &'a [TemplateRecord], id: &str) -> Vec<&'a TemplateRecord> {
    let id = id.strip_suffix(":default").unwrap_or(id);
    let prefix = format!("{id}:");
    templates
        .iter()
        .filter(|t| t.name == id || (!id.contains(':') && t.name.starts_with(&prefix)))
        .collect()
}

/// E2B's `GET /templates/{id}`: the template and its builds (one per image its name and tags
/// name).
async fn e2b_get(State(state): State<AppState>, Who(_): Who, Path(id): Path<String>) -> Answer {
    let templates = built(state.manager.store())?;
    let (size, started) = match &state.templates {
        Some(s) => (s.size, s.started_at),
        None => (SandboxSize::default(), OffsetDateTime::now_utc()),
    };
    let builtin = id == HOST_TEMPLATE
        || (id == BASE_TEMPLATE && !templates.iter().any(|t| t.name == BASE_TEMPLATE));
    if builtin {
        let mut v = e2b_json(&id, "", started, &[id.as_str()], size);
        v["builds"] = json!([]);
        return Ok(axum::Json(v).into_response());
    }
    let mine = family(&templates, &id);
    let Some(newest) = mine.iter().max_by_key(|t| t.created_at) else {
        return Err(not_found(&id));
    };
    let mut seen = std::collections::BTreeSet::new();
    let builds: Vec<Value> = mine
        .iter()
        .filter(|t| seen.insert(t.digest.clone()))
        .map(|t| {
            let at = crate::rest::rfc3339(t.created_at);
            json!({
                "buildID": build_id(&t.digest),
                "status": "ready",
                "createdAt": at,
                "updatedAt": at,
                "finishedAt": at,
                "cpuCount": size.cpu_count,
                "memoryMB": size.memory_mb,
                "diskSizeMB": size.disk_mb,
                "envdVersion": ENVD_VERSION,
            })
        })
        .collect();
    let name = id.strip_suffix(":default").unwrap_or(&id);
    let mut v = e2b_json(name, &newest.digest, newest.created_at, &[name], size);
    v["buildCount"] = json!(builds.len());
    v["builds"] = Value::Array(builds);
    Ok(axum::Json(v).into_response())
}

/// E2B's `DELETE /templates/{id}` (`e2b template delete`): the template and all its tags, or
/// only the tag named (admin, as `husk template rm`).
async fn e2b_delete(
    State(state): State<AppState>,
    Who(who): Who,
    Path(id): Path<String>,
) -> Answer {
    // One of the team's snapshots (E2B's `delete_snapshot`), which any key of the team may
    // delete; else a template, which takes an admin key.
    if let Some(done) = crate::snapshots::delete_snapshot(&state, &who.team, &id).await {
        return Ok(done);
    }
    let templates = built(state.manager.store())?;
    let names: Vec<String> = family(&templates, &id)
        .iter()
        .map(|t| t.name.clone())
        .collect();
    if names.is_empty() && !who.admin {
        return Err(not_found(&id));
    }
    removable(&who, &id)?;
    let svc = service(&state)?;
    if names.is_empty() {
        return Err(not_found(&id));
    }
    build::on_helper(svc, move |h| {
        for n in &names {
            h.remove(n)?;
        }
        Ok(())
    })
    .await?;
    tracing::info!(template = %id, key = %who.key_id, "template removed (E2B API)");
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_ids_are_uuid_shaped() {
        let d = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef";
        assert_eq!(build_id(d), "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(build_id(""), "00000000-0000-0000-0000-000000000000");
    }
}
