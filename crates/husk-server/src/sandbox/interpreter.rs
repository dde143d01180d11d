//! E2B's code-interpreter API (port 49999 of a sandbox), served by husk itself on the
//! sandbox's contexts ([`husk_core::contexts`]): `POST /execute` streams NDJSON,
//! `/contexts` creates, lists, removes and restarts contexts, `GET /health`.
//!
//! The wire format is E2B's (see `e2b-protocol.md` §4): snake_case keys, absent fields
//! omitted, errors as plain text (`400 Only one of context_id or language can be provided`,
//! `404 Context X not found`). Unknown query parameters (the JS SDK's `?source=`) are ignored.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use husk_core::contexts::{ContextError, ExecOut, MimeValue};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::Sandbox;
use crate::app::AppState;
use crate::envd::auth::{access_token_ok, ACCESS_TOKEN_HEADER};

/// The port E2B's SDKs send code-interpreter calls to.
pub const PORT: u16 = 49999;

/// Largest request body: code goes to the kernel in one agent frame (about 1 MiB; longer code
/// gets a 400 that says so), and the body is held in memory whole.
const MAX_BODY: usize = 4 << 20;

/// How often an idle stream says it is alive (E2B's server does the same; clients skip it).
const KEEPALIVE: Duration = Duration::from_secs(5);

fn text(status: StatusCode, msg: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg.into(),
    )
        .into_response()
}

fn context_error(e: ContextError) -> Response {
    match e {
        ContextError::NotFound(id) => {
            text(StatusCode::NOT_FOUND, format!("Context {id} not found"))
        }
        ContextError::Invalid(m) => text(StatusCode::BAD_REQUEST, m),
        ContextError::Exhausted(m) => text(StatusCode::TOO_MANY_REQUESTS, m),
        ContextError::Kernel(m) => text(StatusCode::INTERNAL_SERVER_ERROR, m),
        // The SDKs read 502 as "the sandbox is gone / timed out".
        ContextError::Gone => text(StatusCode::BAD_GATEWAY, "the sandbox is gone"),
    }
}

/// Reads a JSON body within the sandbox team's budget of buffered bodies (see
/// [`crate::budget`]); an empty body is the default value.
async fn json_body<T: for<'de> Deserialize<'de> + Default>(
    state: &AppState,
    sb: &Sandbox,
    body: Body,
) -> Result<T, Response> {
    let mut held = state.bodies.reservation(sb.team());
    let bytes = crate::body::read_all_within(body, MAX_BODY, &mut held)
        .await
        .map_err(|e| text(e.status(), e.to_string()))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| text(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

#[derive(Deserialize, Default)]
struct ExecuteBody {
    #[serde(default)]
    code: String,
    context_id: Option<String>,
    language: Option<String>,
    env_vars: Option<Map<String, Value>>,
}

#[derive(Deserialize, Default)]
struct CreateBody {
    language: Option<String>,
    cwd: Option<String>,
}

/// Serves one request.
///
/// Port 49999 runs code as the sandbox's user (with its secrets in the kernels' environment,
/// and `sudo`), so it is not "a sandbox port" that a public sandbox opens to whoever names it:
/// every route but `GET /health` wants a credential of the sandbox's creator, as port 49983
/// does: the sandbox's access token (`X-Access-Token`, which the SDKs send with `/execute`),
/// its traffic token (`E2B-Traffic-Access-Token`, which they send with every call when the
/// create answer had one, and husk's always has) or an API key of its team. A body must be
/// declared `application/json`: a web page can send a cross-origin `text/plain` POST without
/// a CORS preflight, never one with a JSON content type or a credential header.
pub async fn handle(state: &AppState, sb: Sandbox, req: Request<Body>) -> Response {
    let path = req.uri().path().trim_end_matches('/').to_string();
    let method = req.method().clone();
    if method == Method::GET && path == "/health" {
        return axum::Json("OK").into_response();
    }
    if !authorized(state, &sb, req.headers()) {
        return text(StatusCode::UNAUTHORIZED, unauthorized_message(sb.id()));
    }
    if method == Method::POST && !declares_json(req.headers()) {
        return text(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the request body must be sent as Content-Type: application/json",
        );
    }
    let body = req.into_body();
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match (method, segments.as_slice()) {
        (Method::POST, ["execute"]) => execute(state, sb, body).await,
        (Method::POST, ["contexts"]) => {
            let b: CreateBody = match json_body(state, &sb, body).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            match sb
                .contexts()
                .create(b.language.as_deref(), b.cwd.as_deref())
                .await
            {
                Ok(ctx) => axum::Json(context_json(&ctx.info())).into_response(),
                Err(e) => context_error(e),
            }
        }
        (Method::GET, ["contexts"]) => {
            let list: Vec<Value> = sb.contexts().list().iter().map(context_json).collect();
            axum::Json(list).into_response()
        }
        (Method::DELETE, ["contexts", id]) => match sb.contexts().remove(id).await {
            Ok(()) => StatusCode::OK.into_response(),
            Err(e) => context_error(e),
        },
        (Method::POST, ["contexts", id, "restart"]) => match sb.contexts().restart(id).await {
            Ok(()) => StatusCode::OK.into_response(),
            Err(e) => context_error(e),
        },
        (_, ["execute"] | ["contexts"] | ["contexts", _] | ["contexts", _, "restart"]) => {
            text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
        }
        _ => text(StatusCode::NOT_FOUND, format!("no such endpoint: {path}")),
    }
}

/// Whether the request carries the sandbox's access token, its traffic token or a key of its
/// team.
fn authorized(state: &AppState, sb: &Sandbox, headers: &HeaderMap) -> bool {
    (headers.contains_key(ACCESS_TOKEN_HEADER) && access_token_ok(headers, Some(sb.access_token())))
        || super::ingress::team_credential(state, sb, headers)
}

fn unauthorized_message(id: &str) -> String {
    format!(
        "the code interpreter of sandbox {id} needs a credential: its access token \
         (X-Access-Token), its traffic access token (E2B-Traffic-Access-Token) or an API key \
         of its team (X-API-Key)"
    )
}

/// Whether `Content-Type` is `application/json` (any parameters, any case).
fn declares_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

fn context_json(c: &husk_core::contexts::ContextInfo) -> Value {
    json!({"id": c.id, "language": c.language, "cwd": c.cwd})
}

async fn execute(state: &AppState, sb: Sandbox, body: Body) -> Response {
    let b: ExecuteBody = match json_body(state, &sb, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let context_id = b.context_id.filter(|c| !c.is_empty());
    let language = b.language.filter(|l| !l.is_empty());
    if context_id.is_some() && language.is_some() {
        return text(
            StatusCode::BAD_REQUEST,
            "Only one of context_id or language can be provided",
        );
    }
    let mut env_vars = Vec::new();
    for (k, v) in b.env_vars.unwrap_or_default() {
        match v {
            Value::String(s) => env_vars.push((k, s)),
            Value::Null => {}
            other => env_vars.push((k, other.to_string())),
        }
    }
    let ctx = match (context_id, language) {
        (Some(id), _) => sb.contexts().get(&id),
        (None, lang) => {
            sb.contexts()
                .default_for(lang.as_deref().unwrap_or("python"))
                .await
        }
    };
    let ctx = match ctx {
        Ok(c) => c,
        Err(e) => return context_error(e),
    };
    let events = match sb.contexts().execute(ctx, b.code, env_vars).await {
        Ok(rx) => rx,
        Err(e) => return context_error(e),
    };
    let lines = ndjson(events);
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}

/// The execution's events as NDJSON lines, with keepalives while it is quiet. Dropping the
/// stream (the client went away) drops the receiver, which interrupts the execution. If the
/// sandbox goes away meanwhile, the response breaks off (an error item aborts it), as E2B's
/// does when a sandbox's VM goes: the SDKs then find the sandbox gone and raise their "the
/// sandbox was killed while the request was in progress".
fn ndjson(
    events: tokio::sync::mpsc::Receiver<ExecOut>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(Some(events), |state| async move {
        let mut events = state?;
        match tokio::time::timeout(KEEPALIVE, events.recv()).await {
            Err(_) => Some((line(&json!({"type": "keepalive"})), Some(events))),
            // The execution task always sends `End`; without it the server is shutting down.
            Ok(None) => None,
            Ok(Some(ExecOut::End)) => Some((line(&json!({"type": "end_of_execution"})), None)),
            Ok(Some(ExecOut::SandboxGone)) => Some((
                Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "the sandbox was killed",
                )),
                None,
            )),
            Ok(Some(ev)) => Some((line(&event_json(ev)), Some(events))),
        }
    })
}

fn line(v: &Value) -> Result<Bytes, std::io::Error> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Ok(Bytes::from(b))
}

fn event_json(ev: ExecOut) -> Value {
    match ev {
        ExecOut::Count(n) => json!({"type": "number_of_executions", "execution_count": n}),
        ExecOut::Stdout { text, date } => {
            json!({"type": "stdout", "text": text, "timestamp": date})
        }
        ExecOut::Stderr { text, date } => {
            json!({"type": "stderr", "text": text, "timestamp": date})
        }
        ExecOut::Result { is_main, data } => result_json(is_main, data),
        ExecOut::Error {
            name,
            value,
            traceback,
        } => json!({"type": "error", "name": name, "value": value,
                    "traceback": traceback.join("\n")}),
        ExecOut::KernelDied(why) => json!({
            "type": "error",
            "name": "KernelDied",
            "value": format!("the context's kernel died: {why}; restart the context"),
            "traceback": "",
        }),
        // Both end the stream in `ndjson` before they get here.
        ExecOut::End | ExecOut::SandboxGone => json!({"type": "end_of_execution"}),
    }
}

/// A text value: a string, or (nbformat's multi-line form) an array of strings.
fn as_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| p.as_str())
            .collect::<Option<Vec<&str>>>()
            .map(|p| p.concat()),
        _ => None,
    }
}

/// One result in E2B's shape: known MIME types become fields, the rest goes into `extra`.
fn result_json(is_main: bool, data: Vec<MimeValue>) -> Value {
    let mut out = Map::new();
    out.insert("type".into(), json!("result"));
    out.insert("is_main_result".into(), json!(is_main));
    let mut extra = Map::new();
    for MimeValue { mime, value } in data {
        let field = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            "e2b/data" => "data",
            "e2b/chart" => "chart",
            _ => {
                extra.insert(mime, value);
                continue;
            }
        };
        let v = match field {
            // Objects stay objects.
            "json" | "data" | "chart" => value,
            "text" => match as_text(&value) {
                Some(t) => Value::String(strip_quotes(&t).to_owned()),
                None => value,
            },
            _ => match as_text(&value) {
                Some(t) => Value::String(t),
                None => value,
            },
        };
        out.insert(field.into(), v);
    }
    if !extra.is_empty() {
        out.insert("extra".into(), Value::Object(extra));
    }
    Value::Object(out)
}

/// One level of surrounding quotes off a `text/plain` repr (`'hello'` → `hello`), as E2B's
/// server does.
fn strip_quotes(t: &str) -> &str {
    for q in ['\'', '"'] {
        if t.len() >= 2 && t.starts_with(q) && t.ends_with(q) {
            return &t[1..t.len() - 1];
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mv(mime: &str, value: Value) -> MimeValue {
        MimeValue {
            mime: mime.into(),
            value,
        }
    }

    #[test]
    fn results_map_onto_e2b_fields() {
        let v = result_json(
            true,
            vec![
                mv("text/plain", json!("'hi'")),
                mv("text/html", json!(["<b>", "x</b>"])),
                mv("image/png", json!("iVBORw0KGgo=")),
                mv("application/json", json!({"a": 1})),
                mv("e2b/data", json!({"x": [1, 2]})),
                mv("application/vnd.custom", json!("z")),
            ],
        );
        assert_eq!(
            v,
            json!({
                "type": "result", "is_main_result": true, "text": "hi", "html": "<b>x</b>",
                "png": "iVBORw0KGgo=", "json": {"a": 1}, "data": {"x": [1, 2]},
                "extra": {"application/vnd.custom": "z"}
            })
        );
        // Nothing known and nothing extra: only the type and the flag.
        assert_eq!(
            result_json(false, vec![]),
            json!({"type": "result", "is_main_result": false})
        );
    }

    #[test]
    fn only_a_json_content_type_declares_json() {
        let with = |v: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = v {
                h.insert(header::CONTENT_TYPE, v.parse().unwrap());
            }
            declares_json(&h)
        };
        for yes in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            " application/json ;charset=UTF-8",
        ] {
            assert!(with(Some(yes)), "{yes}");
        }
        // What a browser may send cross-origin without a preflight, and near misses.
        for no in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "application/json-seq",
            "text/json",
            "",
        ] {
            assert!(!with(Some(no)), "{no}");
        }
        assert!(!with(None));
    }

    #[test]
    fn quotes_are_stripped_once() {
        assert_eq!(strip_quotes("'a'"), "a");
        assert_eq!(strip_quotes("\"'a'\""), "'a'");
        assert_eq!(strip_quotes("'"), "'");
        assert_eq!(strip_quotes("42"), "42");
    }

    #[test]
    fn events_become_e2b_lines() {
        assert_eq!(
            event_json(ExecOut::Count(3)),
            json!({"type": "number_of_executions", "execution_count": 3})
        );
        assert_eq!(
            event_json(ExecOut::Error {
                name: "E".into(),
                value: "v".into(),
                traceback: vec!["a".into(), "b".into()]
            }),
            json!({"type": "error", "name": "E", "value": "v", "traceback": "a\nb"})
        );
        assert_eq!(
            event_json(ExecOut::Stdout {
                text: "x\n".into(),
                date: "2026-01-01T00:00:00Z".into()
            }),
            json!({"type": "stdout", "text": "x\n", "timestamp": "2026-01-01T00:00:00Z"})
        );
    }
}
