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

use std::collections::VecDeque;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use husk_build::build::{BuildOptions, Builder};
use husk_build::oci::PullProgress;
use husk_build::plan::BuildPlan;
use husk_build::{Progress, StepOutcome};
use husk_core::store::Principal;
use husk_core::template::{summary_json, HOST_TEMPLATE};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::context::{self, ContextDir, ContextError};
use super::{require_admin, service, Answer, TemplateService};
use crate::rest::{error, Who};
use crate::AppState;

/// Progress lines buffered for a slow client before build output is dropped.
const EVENT_BUFFER: usize = 1024;

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
            context::drain(&headers, body).await;
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
    let (tx, reader) = context::body_channel();
    let too_large = Arc::new(AtomicBool::new(false));
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
    let (_, unpacked) = tokio::join!(context::pump(body, tx, too_large.clone()), unpacking);
    let unpacked = unpacked.map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unpacking the build context: {e}"),
        )
    })?;
    if too_large.load(Ordering::Relaxed) {
        return Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the build context is larger than {} MiB",
                context::MAX_CONTEXT_BYTES >> 20
            ),
        ));
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

/// The build's progress as NDJSON lines on a bounded channel to the response body.
///
/// `Progress` is called synchronously from inside the build, so it never waits for the client:
/// build output (`log`, `pull`) is dropped when the client falls [`EVENT_BUFFER`] lines behind
/// (a note says how much), while the few structural events (steps, messages) queue behind the
/// channel and are never lost. Once the client is gone everything is dropped.
struct Events {
    tx: mpsc::Sender<Bytes>,
    rx: Mutex<Option<mpsc::Receiver<Bytes>>>,
    backlog: Mutex<Backlog>,
}

#[derive(Default)]
struct Backlog {
    /// Structural events waiting for room, in order.
    queued: VecDeque<Bytes>,
    /// Bytes of output dropped since the last note.
    dropped: u64,
    /// The end of a UTF-8 sequence split between two `log` calls.
    partial: Vec<u8>,
}

fn line(v: &Value) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}

fn dropped_note(n: u64) -> Bytes {
    line(&json!({
        "type": "log",
        "data": format!("\n[husk: {n} bytes of build output dropped: the client reads too slowly]\n"),
    }))
}

impl Events {
    fn new() -> Events {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        Events {
            tx,
            rx: Mutex::new(Some(rx)),
            backlog: Mutex::default(),
        }
    }

    fn take_receiver(&self) -> mpsc::Receiver<Bytes> {
        self.rx
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .expect("the receiver is taken once")
    }

    fn backlog(&self) -> std::sync::MutexGuard<'_, Backlog> {
        self.backlog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends what fits of the backlog; false if some of it still waits.
    fn flush(&self, b: &mut Backlog) -> bool {
        while let Some(front) = b.queued.pop_front() {
            match self.tx.try_send(front) {
                Ok(()) => {}
                Err(TrySendError::Full(front)) => {
                    b.queued.push_front(front);
                    return false;
                }
                Err(TrySendError::Closed(_)) => {
                    b.queued.clear();
                    return true;
                }
            }
        }
        if b.dropped > 0 {
            match self.tx.try_send(dropped_note(b.dropped)) {
                Ok(()) | Err(TrySendError::Closed(_)) => b.dropped = 0,
                Err(TrySendError::Full(_)) => return false,
            }
        }
        true
    }

    /// A structural event: never dropped while the client reads.
    fn must(&self, v: Value) {
        let mut b = self.backlog();
        if b.dropped > 0 {
            let note = dropped_note(std::mem::take(&mut b.dropped));
            b.queued.push_back(note);
        }
        b.queued.push_back(line(&v));
        self.flush(&mut b);
    }

    /// Build output: dropped (and counted) when the client is behind.
    fn may(&self, v: Value, size: u64) {
        let mut b = self.backlog();
        if !self.flush(&mut b) {
            b.dropped += size;
            return;
        }
        if let Err(TrySendError::Full(_)) = self.tx.try_send(line(&v)) {
            b.dropped += size;
        }
    }

    /// The last event, after everything still queued, waiting for the client to take it.
    async fn finish(&self, v: Value) {
        let mut pending: Vec<Bytes> = {
            let mut b = self.backlog();
            let mut p: Vec<Bytes> = b.queued.drain(..).collect();
            if !b.partial.is_empty() {
                let rest = std::mem::take(&mut b.partial);
                p.push(line(
                    &json!({"type": "log", "data": String::from_utf8_lossy(&rest)}),
                ));
            }
            if b.dropped > 0 {
                p.push(dropped_note(std::mem::take(&mut b.dropped)));
            }
            p
        };
        pending.push(line(&v));
        for l in pending {
            if self.tx.send(l).await.is_err() {
                return;
            }
        }
    }
}

impl Progress for Events {
    fn step_start(&self, index: usize, total: usize, display: &str) {
        self.must(json!({"type": "step", "index": index, "total": total, "display": display}));
    }

    fn log(&self, bytes: &[u8]) {
        // Whole UTF-8 characters only: a multi-byte character split between two reads is
        // sent with the next one instead of as two replacement characters.
        let text = {
            let mut b = self.backlog();
            let mut all = std::mem::take(&mut b.partial);
            all.extend_from_slice(bytes);
            let keep = match std::str::from_utf8(&all) {
                Err(e) if e.error_len().is_none() => all.len() - e.valid_up_to(),
                _ => 0,
            };
            b.partial = all.split_off(all.len() - keep);
            String::from_utf8_lossy(&all).into_owned()
        };
        if !text.is_empty() {
            let size = text.len() as u64;
            self.may(json!({"type": "log", "data": text}), size);
        }
    }

    fn step_done(&self, index: usize, outcome: StepOutcome) {
        let (cached, seconds) = match outcome {
            StepOutcome::Cached => (true, 0.0),
            StepOutcome::Built(d) => (false, d.as_secs_f64()),
        };
        self.must(
            json!({"type": "step_done", "index": index, "cached": cached, "seconds": seconds}),
        );
    }

    fn pull(&self, p: &PullProgress) {
        let v = match p {
            PullProgress::Resolved {
                layers,
                bytes_total,
            } => {
                json!({"type": "pull", "event": "resolved", "layers": layers, "bytes_total": bytes_total})
            }
            PullProgress::Layer {
                index,
                digest,
                bytes_done,
                bytes_total,
            } => json!({
                "type": "pull", "event": "layer", "index": index, "digest": digest,
                "bytes_done": bytes_done, "bytes_total": bytes_total,
            }),
            PullProgress::LayerCached { index, digest } => {
                json!({"type": "pull", "event": "layer_cached", "index": index, "digest": digest})
            }
            PullProgress::LayerDone { index } => {
                json!({"type": "pull", "event": "layer_done", "index": index})
            }
        };
        self.may(v, 0);
    }

    fn message(&self, text: &str) {
        self.must(json!({"type": "message", "text": text}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::Receiver<Bytes>) -> Vec<Value> {
        let mut out = Vec::new();
        while let Ok(l) = rx.try_recv() {
            out.push(serde_json::from_slice(&l).unwrap());
        }
        out
    }

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

    #[test]
    fn output_is_dropped_for_a_slow_client_but_steps_are_not() {
        let ev = Events::new();
        let mut rx = ev.take_receiver();
        ev.step_start(1, 2, "RUN x");
        for _ in 0..EVENT_BUFFER + 10 {
            ev.log(b"0123456789");
        }
        ev.step_done(1, StepOutcome::Cached);
        let first = drain(&mut rx);
        assert_eq!(first.len(), EVENT_BUFFER);
        assert_eq!(first[0]["type"], "step");
        // Room again: the queued step_done comes after a note of what was dropped.
        ev.message("hello");
        let next = drain(&mut rx);
        assert_eq!(next[0]["type"], "log");
        assert!(next[0]["data"].as_str().unwrap().contains("110 bytes"));
        assert_eq!(next[1]["type"], "step_done");
        assert_eq!(next[2]["text"], "hello");
    }

    #[test]
    fn utf8_split_between_reads_is_kept_whole() {
        let ev = Events::new();
        let mut rx = ev.take_receiver();
        let s = "h\u{e9}llo".as_bytes();
        ev.log(&s[..2]);
        ev.log(&s[2..]);
        let got: String = drain(&mut rx)
            .iter()
            .map(|v| v["data"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(got, "h\u{e9}llo");
    }
}
