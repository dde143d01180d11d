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
//! The build runs in the build helper (`super::helper`), which owns the context: a client
//! that goes away does not stop it; its events are dropped, the template is registered if it
//! succeeds, and the context is removed either way. The server checks the key and the query,
//! streams the upload to the helper and the helper's events to the client.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;

use super::{require_admin, service, Answer, TemplateService};
use crate::rest::{error, Who};
use crate::upload::{self as body, BodyEnd};
use crate::AppState;
use husk_build::context;
use husk_build::helper::BuildError;
use husk_build::request::parse_query;

/// Chunks of a build's events in flight to a client.
const EVENT_CHUNKS: usize = 64;

/// The build slot of a server; free again when dropped.
pub(super) struct Slot(Arc<TemplateService>);

impl Slot {
    pub(super) fn take(svc: &Arc<TemplateService>) -> Option<Slot> {
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

fn bad(msg: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, msg)
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
        parse_query(&pairs).map_err(bad)?;
        let svc = service(&state)?.clone();
        let slot = Slot::take(&svc)
            .ok_or_else(|| error(StatusCode::CONFLICT, "a template build is already running"))?;
        Ok::<_, Response>((who, pairs, svc, slot))
    })();
    let (who, pairs, svc, slot) = match checked {
        Ok(c) => c,
        Err(resp) => {
            body::drain(&headers, body).await;
            return Err(resp);
        }
    };
    // The context goes to the helper as it arrives; the helper unpacks it and parses the
    // spec before the build starts (a bad one is a status code, not a stream).
    let (tx, reader) = body::body_channel();
    let helper = svc.helper.clone();
    let starting =
        tokio::task::spawn_blocking(move || helper.start_build(&pairs, &who.key_id, reader));
    let (end, started) = tokio::join!(body::pump(body, tx, context::MAX_CONTEXT_BYTES), starting);
    let started = started.map_err(|e| {
        error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("starting the build: {e}"),
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
    let running = started.map_err(refusal)?;
    let (events_tx, mut events_rx) = mpsc::channel::<Bytes>(EVENT_CHUNKS);
    // The helper's events to the client, as they come; a client that goes away stops
    // nothing but this forwarding (the rest is read and dropped). The slot is free once the
    // build is over.
    tokio::task::spawn_blocking(move || {
        let done = running.forward(|chunk| events_tx.blocking_send(Bytes::from(chunk)).is_ok());
        if let Err(e) = done {
            tracing::warn!(error = %e, "the build helper's answer");
        }
        drop(slot);
    });
    let stream = futures_util::stream::poll_fn(move |cx| {
        events_rx
            .poll_recv(cx)
            .map(|c| c.map(Ok::<_, std::convert::Infallible>))
    });
    let mut resp = Body::from_stream(stream).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

/// Runs `call` on the build helper from a blocking thread (every call waits for the helper's
/// answer); a refusal is the client's answer, as [`refusal`] gives it.
pub(super) async fn on_helper<T: Send + 'static>(
    svc: &TemplateService,
    call: impl FnOnce(&husk_build::helper::BuildHelper) -> Result<T, BuildError> + Send + 'static,
) -> Result<T, Response> {
    let helper = svc.helper.clone();
    tokio::task::spawn_blocking(move || call(&helper))
        .await
        .map_err(|e| {
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the build helper's call: {e}"),
            )
        })?
        .map_err(refusal)
}

/// The client's answer to a build the helper did not start.
pub(super) fn refusal(e: BuildError) -> Response {
    match e {
        BuildError::Refused { status, message } => error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            message,
        ),
        BuildError::Helper(h) => {
            let status = match h {
                husk_core::store::HelperError::Gone(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(status, h.to_string())
        }
    }
}
