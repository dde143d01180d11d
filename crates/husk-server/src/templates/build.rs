//! `POST /husk/v1/templates?name=NAME[&file=PATH][&no_cache=true][&build_arg=K=V...]`: a build
//! from an uploaded context (a tar archive, see [`super::context`]), its progress streamed as
//! NDJSON, one event a line:
//!
//! ```text
//! {"type":"step","index":2,"total":5,"display":"RUN make"}
//! {"type":"log","data":"..."}
//! {"type":"step_done","index":2,"cached":false,"seconds":1.5}
//! {"type":"pull","event":"layer","index":0,...}
//! {"type":"message","text":"writing the image"}
//! {"type":"done","template":{...}}        or        {"type":"error","message":"..."}
//! ```
//!
//! Everything up to a parsed plan is answered with a status code (400 for a bad archive or
//! spec); once the build starts the answer is 200 and its outcome is the last line.
//!
//! One build at a time per server (409 for a second one): builds are heavy (a build sandbox
//! per step, the whole image written at the end) and the layer cache is shared, so running
//! them one after another costs little and keeps the host predictable.
//!
//! The build runs in a task of its own that owns the context directory: a client that goes
//! away does not stop it; its events are dropped, the template is registered if it succeeds,
//! and the context is removed either way.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use husk_build::build::{BuildOptions, Builder};
use husk_build::plan::BuildPlan;
use husk_core::store::Principal;
use husk_core::template::{summary_json, HOST_TEMPLATE};
use serde_json::json;

use super::context::{self, ContextDir, ContextError};
use super::events::Events;
use super::{require_admin, service, Answer, TemplateService};
use crate::rest::{error, Who};
use crate::upload::{self as body, BodyEnd};
use crate::AppState;

/// The build slot of a server; free again when dropped.
struct Slot(Arc<TemplateService>);

impl Slot {
    fn take(svc: &Arc<TemplateService>) -> Option<Slot> {
        svc.building
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
            .then(|| Slot(svc.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.building.store(false, Ordering::Release);
    }
}

/// A build request's query, checked.
struct BuildQuery {
    name: String,
    /// The spec inside the archive, relative; `None`: look for the usual names at its top.
    file: Option<PathBuf>,
    no_cache: bool,
    build_args: Vec<(String, String)>,
}

fn bad(msg: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, msg)
}

fn parse_query(q: &[(String, String)]) -> Result<BuildQuery, Response> {
    let mut out = BuildQuery {
        name: String::new(),
        file: None,
        no_cache: false,
        build_args: Vec::new(),
    };
    for (k, v) in q {
        match k.as_str() {
            "name" => out.name = v.clone(),
            "file" => {
                let p = Path::new(v);
                let plain =
                    !v.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)));
                if !plain {
                    return Err(bad(format!(
                        "file must be a relative path inside the archive without '..' (got {v:?})"
                    )));
                }
                out.file = Some(p.to_path_buf());
            }
            "no_cache" => {
                out.no_cache = match v.as_str() {
                    "true" | "1" | "" => true,
                    "false" | "0" => false,
                    _ => return Err(bad(format!("no_cache must be true or false (got {v:?})"))),
                }
            }
            "build_arg" => match v.split_once('=') {
                Some((k, v)) if !k.is_empty() => out.build_args.push((k.into(), v.into())),
                _ => return Err(bad(format!("invalid build_arg {v:?}: expected KEY=VALUE"))),
            },
            other => return Err(bad(format!("unknown query parameter '{other}'"))),
        }
    }
    if out.name.is_empty() {
        return Err(bad("name is required: POST /husk/v1/templates?name=NAME"));
    }
    if !husk_build::spec::valid_template_name(&out.name) {
        return Err(bad(format!(
            "invalid template name {:?}: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
            out.name
        )));
    }
    if out.name == HOST_TEMPLATE {
        return Err(bad("the name `host` is reserved for the host template"));
    }
    Ok(out)
}

pub async fn create(
    State(state): State<AppState>,
    who: Result<Who, Response>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let checked = (|| {
        let Who(who) = who?;
        require_admin(&who, "building templates")?;
        let pairs: Vec<(String, String)> =
            form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
                .into_owned()
                .collect();
        let query = parse_query(&pairs)?;
        let svc = service(&state)?.clone();
        let slot = Slot::take(&svc)
            .ok_or_else(|| error(StatusCode::CONFLICT, "a template build is already running"))?;
        Ok::<_, Response>((who, query, svc, slot))
    })();
    let (who, query, svc, slot) = match checked {
        Ok(c) => c,
        Err(resp) => {
            body::drain(&headers, body).await;
            return Err(resp);
        }
    };
    let (ctx, plan) = receive(&svc, body, &query).await?;
    let events = Arc::new(Events::new());
    let rx = events.take_receiver();
    tokio::spawn(run(svc, slot, ctx, plan, query, who, events));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|line| (Ok::<_, std::convert::Infallible>(line), rx))
    });
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

/// Unpacks the uploaded context and parses its spec. The context directory is owned by the
/// blocking task until it returns it, so it is removed however the request ends.
async fn receive(
    svc: &TemplateService,
    body: Body,
    query: &BuildQuery,
) -> Result<(ContextDir, (BuildPlan, PathBuf)), Response> {
    let (tx, reader) = body::body_channel();
    let state_dir = svc.proto.opts.state_dir.clone();
    let (file, build_args) = (query.file.clone(), query.build_args.clone());
    let unpacking = tokio::task::spawn_blocking(move || {
        let ctx = ContextDir::create(&state_dir).map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("creating a build context directory: {e}"),
            )
        })?;
        context::unpack(reader, ctx.path()).map_err(|e| match e {
            ContextError::Refused(m) => bad(m),
            ContextError::TooLarge(m) => error(StatusCode::PAYLOAD_TOO_LARGE, m),
            e @ ContextError::Io { .. } => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("unpacking the build context: {e}"),
            ),
        })?;
        let plan = load(&ctx, file.as_deref(), &build_args)?;
        Ok::<_, Response>((ctx, plan))
    });
    let (end, unpacked) = tokio::join!(body::pump(body, tx, context::MAX_CONTEXT_BYTES), unpacking);
    let unpacked = unpacked.map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unpacking the build context: {e}"),
        )
    })?;
    match end {
        BodyEnd::TooLarge => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "the build context is larger than {} MiB",
                    context::MAX_CONTEXT_BYTES >> 20
                ),
            ))
        }
        BodyEnd::Stalled(s) => return Err(error(StatusCode::REQUEST_TIMEOUT, s.to_string())),
        BodyEnd::Complete | BodyEnd::Failed => {}
    }
    unpacked
}

/// The plan of the spec in `ctx` and its path in the archive: at `file`, else the first of
/// `husk.toml`, `e2b.Dockerfile` and `Dockerfile` at the archive's top.
fn load(
    ctx: &ContextDir,
    file: Option<&Path>,
    build_args: &[(String, String)],
) -> Result<(BuildPlan, PathBuf), Response> {
    let rel = match file {
        Some(f) => f.to_path_buf(),
        None => ["husk.toml", "e2b.Dockerfile", "Dockerfile"]
            .iter()
            .map(PathBuf::from)
            .find(|n| ctx.path().join(n).is_file())
            .ok_or_else(|| {
                bad("the archive has no husk.toml, e2b.Dockerfile or Dockerfile at its top (name the spec with file=PATH)")
            })?,
    };
    let path = ctx.path().join(&rel);
    if !path.is_file() {
        return Err(bad(format!("the archive has no file {}", rel.display())));
    }
    let plan = husk_build::spec::load(&path, build_args).map_err(|e| bad(e.to_string()))?;
    Ok((plan, rel))
}

async fn run(
    svc: Arc<TemplateService>,
    slot: Slot,
    ctx: ContextDir,
    (plan, spec): (BuildPlan, PathBuf),
    query: BuildQuery,
    who: Principal,
    events: Arc<Events>,
) {
    let builder = Builder {
        spawner: svc.proto.spawner.clone(),
        store: svc.proto.store.clone(),
        opts: BuildOptions {
            no_cache: query.no_cache,
            ..svc.proto.opts.clone()
        },
    };
    let source = format!("upload:{}", spec.display());
    tracing::info!(template = %query.name, key = %who.key_id, %source, "template build started");
    let last = match builder.build(&plan, &query.name, &source, &*events).await {
        Ok(rec) => {
            tracing::info!(template = %rec.name, digest = %rec.digest, "template built");
            json!({"type": "done", "template": summary_json(&rec)})
        }
        Err(e) => {
            tracing::info!(template = %query.name, error = %e, "template build failed");
            json!({"type": "error", "message": e.to_string()})
        }
    };
    events.finish(last).await;
    // The context may be large: removed off the async threads.
    let _ = tokio::task::spawn_blocking(move || drop(ctx)).await;
    drop(slot);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_checked() {
        let q = |s: &[(&str, &str)]| {
            parse_query(
                &s.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<Vec<_>>(),
            )
        };
        let ok = q(&[
            ("name", "py"),
            ("file", "sub/Dockerfile"),
            ("build_arg", "A=1=2"),
            ("no_cache", "true"),
        ])
        .ok()
        .unwrap();
        assert_eq!(ok.build_args, vec![("A".into(), "1=2".into())]);
        assert!(ok.no_cache);
        for bad in [
            &[("file", "x")][..],
            &[("name", "host")],
            &[("name", "Bad")],
            &[("name", "a"), ("file", "../x")],
            &[("name", "a"), ("file", "/x")],
            &[("name", "a"), ("build_arg", "=x")],
            &[("name", "a"), ("no_cache", "maybe")],
            &[("name", "a"), ("nme", "b")],
        ] {
            let r = q(bad);
            assert_eq!(
                r.err().map(|r| r.status()),
                Some(StatusCode::BAD_REQUEST),
                "{bad:?}"
            );
        }
    }
}
