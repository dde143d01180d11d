//! Signed file URLs that name no sandbox.
//!
//! `download_url()` / `upload_url()` build `<E2B_SANDBOX_URL>/files?path=…&signature=…` when
//! the SDK is pointed at husk by `E2B_SANDBOX_URL`: the SDK's own calls add the sandbox's id in
//! a header, but a browser, `curl` or `urllib` opening the URL sends nothing of the kind. The
//! signature is the authority (a SHA-256 over the path, the operation, the user and the
//! sandbox's access token), so the sandbox a URL is for is the one whose token makes its
//! signature: found by trying each live sandbox's token, then checked again by the sandbox's
//! own `/files` handler as any signed request is. A URL no sandbox signed is refused as a bad
//! signature (401), one whose expiration has passed as expired (401), as envd answers.
//!
//! Trying every sandbox costs a hash per live sandbox (about 1.5 ms of CPU with 5,000), and
//! the requests come unauthenticated, so: a URL found once is remembered (bounded), and
//! searches are rationed server-wide ([`SEARCHES_PER_SECOND`]); beyond that the answer is 429
//! with `Retry-After`. Nothing a tenant does can make another tenant's signed URLs resolve
//! anywhere but to that tenant's sandbox.
//!
//! In a cluster, a gateway cannot try the tokens (they stay on the nodes): it asks every node
//! the same question on the node API ([`LOOKUP_PATH`]), and each answers from its own
//! sandboxes with this same search (see `gateway::signed`).

use std::collections::HashMap;
use std::sync::Mutex;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::app::{AppState, SandboxTarget};
use crate::files::{verify_signature, FilesAuthError, FilesError, FilesQuery, Operation};
use crate::ration::Ration;
use husk_core::manager::Manager;

/// Searches through every sandbox allowed per second, server-wide (and as a burst).
pub const SEARCHES_PER_SECOND: f64 = 100.0;
/// Signatures remembered with the sandbox they were found for.
const REMEMBERED: usize = 4096;
/// Where a node answers its gateways which of its sandboxes signed a URL: the URL's query
/// as is, the method it is for in [`LOOKUP_METHOD`].
pub const LOOKUP_PATH: &str = "/husk/v1/cluster/signed-files";
/// The method (`GET`: a download, `POST`: an upload) a looked-up URL is for.
pub const LOOKUP_METHOD: &str = "x-husk-signed-method";

/// Finds the sandbox of signed `/files` URLs that name none.
pub struct SignedRoutes {
    /// URLs found before (checked again on every use).
    found: Remembered,
    ration: Ration,
}

impl Default for SignedRoutes {
    fn default() -> Self {
        SignedRoutes {
            found: Remembered::default(),
            ration: Ration::new(SEARCHES_PER_SECOND),
        }
    }
}

/// Signatures with the sandbox they were found for, at most [`REMEMBERED`].
#[derive(Default)]
pub struct Remembered(Mutex<HashMap<String, String>>);

impl Remembered {
    pub fn get(&self, signature: &str) -> Option<String> {
        lock(&self.0).get(signature).cloned()
    }

    pub fn forget(&self, signature: &str) {
        lock(&self.0).remove(signature);
    }

    pub fn remember(&self, signature: String, id: String) {
        let mut found = lock(&self.0);
        if found.len() >= REMEMBERED {
            // Forget an arbitrary half: cheap, and a forgotten URL is only searched again.
            let drop: Vec<String> = found.keys().take(REMEMBERED / 2).cloned().collect();
            for k in drop {
                found.remove(&k);
            }
        }
        found.insert(signature, id);
    }
}

/// The answer when the ration of searches is spent.
pub fn too_many() -> Response {
    let mut resp = FilesError::new(
        StatusCode::TOO_MANY_REQUESTS,
        "too many signed URLs without a sandbox id at once; retry, or send the \
         E2b-Sandbox-Id header",
    )
    .into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// The signature in a `/files` query (`None` without one).
pub fn signature_of(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "signature")
        .map(|(_, v)| v.into_owned())
}

/// Whether `req` is a `/files` request with a signature (and no sandbox named).
pub fn is_signed_files(req: &Request<Body>) -> bool {
    req.uri().path() == "/files"
        && req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv.starts_with("signature=")))
}

impl SignedRoutes {
    /// The sandbox `req` (a signed `/files` request) is for, or the answer to give instead.
    pub fn target(
        &self,
        manager: &Manager,
        req: &Request<Body>,
    ) -> Result<SandboxTarget, Box<Response>> {
        let answer = |e: FilesError| Box::new(e.into_response());
        let query = FilesQuery::parse(req.uri().query()).map_err(answer)?;
        let op = Operation::for_method(req.method()).ok_or_else(|| {
            answer(FilesError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and POST",
            ))
        })?;
        let signature = query.signature.clone().unwrap_or_default();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        // A genuine signature's sandbox, by the check the handler makes again: found is
        // `Ok` or `Expired` (the signature is its token's), never `Invalid`.
        let signed_by = |token: &str| {
            !matches!(
                verify_signature(&query, op, token, now),
                Err(FilesAuthError::Invalid | FilesAuthError::Missing)
            )
        };
        if let Some(id) = self.found.get(&signature) {
            if manager
                .get_any(&id)
                .is_some_and(|sb| signed_by(sb.access_token()))
            {
                return Ok(SandboxTarget {
                    id,
                    port: super::ENVD_PORT,
                });
            }
            self.found.forget(&signature);
        }
        if !self.ration.take() {
            return Err(Box::new(too_many()));
        }
        let sandbox = manager
            .all_sandboxes()
            .into_iter()
            .find(|sb| !sb.is_gone() && signed_by(sb.access_token()))
            .ok_or_else(|| answer(FilesAuthError::Invalid.into()))?;
        let id = sandbox.id().to_owned();
        self.found.remember(signature, id.clone());
        Ok(SandboxTarget {
            id,
            port: super::ENVD_PORT,
        })
    }
}

/// The node API's lookup ([`LOOKUP_PATH`]): served by a cluster's node only (every request
/// there carries the cluster token).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/husk/v1/cluster/signed-files", get(lookup))
        .with_state(state)
}

/// Which of this node's sandboxes signed the URL whose query this request carries:
/// `{"sandboxID": …}`, or the answer the URL itself would get here (401, 429, 400).
async fn lookup(State(state): State<AppState>, req: Request<Body>) -> Response {
    if state.cluster.is_none() {
        return crate::error::ApiError::new(StatusCode::NOT_FOUND, "no such route").into_response();
    }
    let method = match req.headers().get(LOOKUP_METHOD).map(|v| v.as_bytes()) {
        Some(b"POST") => Method::POST,
        _ => Method::GET,
    };
    let uri = match req.uri().query() {
        Some(q) => format!("/files?{q}"),
        None => "/files".to_owned(),
    };
    let Ok(files) = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
    else {
        return FilesError::new(StatusCode::BAD_REQUEST, "unreadable query").into_response();
    };
    match state.signed.target(&state.manager, &files) {
        Ok(t) => axum::Json(serde_json::json!({ "sandboxID": t.id })).into_response(),
        Err(resp) => *resp,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembered_urls_are_bounded() {
        let r = Remembered::default();
        for i in 0..REMEMBERED + 10 {
            r.remember(format!("s{i}"), format!("id{i}"));
        }
        assert!(lock(&r.0).len() <= REMEMBERED);
        let last = REMEMBERED + 9;
        assert_eq!(r.get(&format!("s{last}")), Some(format!("id{last}")));
        r.forget(&format!("s{last}"));
        assert_eq!(r.get(&format!("s{last}")), None);
    }

    #[test]
    fn the_signature_is_read_from_the_query() {
        assert_eq!(
            signature_of(Some("path=%2Fa&signature=v1_a%2Bb&x=1")).as_deref(),
            Some("v1_a+b")
        );
        assert_eq!(signature_of(Some("path=a")), None);
        assert_eq!(signature_of(None), None);
    }

    #[test]
    fn only_signed_files_requests_are_searched() {
        let req = |uri: &str| Request::builder().uri(uri).body(Body::empty()).unwrap();
        assert!(is_signed_files(&req("/files?path=a&signature=v1_x")));
        assert!(is_signed_files(&req("/files?signature=v1_x&path=a")));
        assert!(!is_signed_files(&req("/files?path=a")));
        assert!(!is_signed_files(&req("/files?path=a&xsignature=1")));
        assert!(!is_signed_files(&req("/sandboxes?signature=v1_x")));
    }
}
