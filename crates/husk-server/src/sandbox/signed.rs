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

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::app::SandboxTarget;
use crate::files::{verify_signature, FilesAuthError, FilesError, FilesQuery, Operation};
use husk_core::manager::Manager;

/// Searches through every sandbox allowed per second, server-wide (and as a burst).
pub const SEARCHES_PER_SECOND: f64 = 100.0;
/// Signatures remembered with the sandbox they were found for.
const REMEMBERED: usize = 4096;

/// Finds the sandbox of signed `/files` URLs that name none.
pub struct SignedRoutes {
    /// signature → sandbox id, for URLs found before (checked again on every use).
    found: Mutex<HashMap<String, String>>,
    /// (tokens, last refill) of the search ration.
    ration: Mutex<(f64, Instant)>,
}

impl Default for SignedRoutes {
    fn default() -> Self {
        SignedRoutes {
            found: Mutex::new(HashMap::new()),
            ration: Mutex::new((SEARCHES_PER_SECOND, Instant::now())),
        }
    }
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
        let remembered = lock(&self.found).get(&signature).cloned();
        if let Some(id) = remembered {
            if manager
                .get_any(&id)
                .is_some_and(|sb| signed_by(sb.access_token()))
            {
                return Ok(SandboxTarget {
                    id,
                    port: super::ENVD_PORT,
                });
            }
            lock(&self.found).remove(&signature);
        }
        if !self.take_search() {
            let mut resp = FilesError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too many signed URLs without a sandbox id at once; retry, or send the \
                 E2b-Sandbox-Id header",
            )
            .into_response();
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return Err(Box::new(resp));
        }
        let sandbox = manager
            .all_sandboxes()
            .into_iter()
            .find(|sb| !sb.is_gone() && signed_by(sb.access_token()))
            .ok_or_else(|| answer(FilesAuthError::Invalid.into()))?;
        let id = sandbox.id().to_owned();
        let mut found = lock(&self.found);
        if found.len() >= REMEMBERED {
            // Forget an arbitrary half: cheap, and a forgotten URL is only searched again.
            let drop: Vec<String> = found.keys().take(REMEMBERED / 2).cloned().collect();
            for k in drop {
                found.remove(&k);
            }
        }
        found.insert(signature, id.clone());
        Ok(SandboxTarget {
            id,
            port: super::ENVD_PORT,
        })
    }

    /// Takes one search from the ration (a token bucket).
    fn take_search(&self) -> bool {
        let mut ration = lock(&self.ration);
        let now = Instant::now();
        let (tokens, last) = *ration;
        let tokens = (tokens + now.duration_since(last).as_secs_f64() * SEARCHES_PER_SECOND)
            .min(SEARCHES_PER_SECOND);
        if tokens < 1.0 {
            *ration = (tokens, now);
            return false;
        }
        *ration = (tokens - 1.0, now);
        true
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searches_are_rationed_and_come_back_with_time() {
        let routes = SignedRoutes::default();
        let burst = (0..1000).take_while(|_| routes.take_search()).count();
        assert_eq!(burst, SEARCHES_PER_SECOND as usize);
        assert!(!routes.take_search());
        // A second later the ration is whole again.
        lock(&routes.ration).1 -= std::time::Duration::from_secs(1);
        assert!(routes.take_search());
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
