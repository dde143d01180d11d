//! Authorization of `/files`: the access token, or a signed URL, and the acting user.
//!
//! A signed URL carries `signature = "v1_" + base64_nopad(sha256(material))` where material is
//! `"<path>:<read|write>:<username or empty>:<accessToken>"`, followed by `":<expiration>"`
//! (unix seconds) when the URL expires. `path` and `username` are the query values as sent
//! (decoded, before any path resolution), which is what the SDK hashed.
//!
//! The signature is checked before the expiration, so a forger cannot learn anything about
//! expirations; only a genuine but stale URL gets the "already expired" answer, whose exact
//! body the SDK's tests assert.

use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD_NO_PAD;
use base64::Engine;
use husk_core::calls::User;
use sha2::{Digest, Sha256};

use super::error::FilesError;
use super::query::FilesQuery;
use crate::envd::auth::ACCESS_TOKEN_HEADER;

/// What a signature permits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `GET /files`.
    Read,
    /// `POST /files`.
    Write,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Read => "read",
            Operation::Write => "write",
        }
    }

    /// The operation of a `/files` request method; `None` for other methods.
    pub fn for_method(method: &Method) -> Option<Operation> {
        match *method {
            Method::GET | Method::HEAD => Some(Operation::Read),
            Method::POST => Some(Operation::Write),
            _ => None,
        }
    }
}

/// Why a `/files` request is not authorized. Every variant answers 401.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FilesAuthError {
    /// A genuine signature whose expiration has passed.
    #[error("signature is already expired")]
    Expired,
    /// A wrong access token, a wrong signature, or a malformed expiration.
    #[error("invalid signature")]
    Invalid,
    /// Neither an access token nor a signature.
    #[error("{}", super::error::UNAUTHORIZED_ACCESS)]
    Missing,
}

impl From<FilesAuthError> for FilesError {
    fn from(err: FilesAuthError) -> Self {
        FilesError::new(StatusCode::UNAUTHORIZED, err.to_string())
    }
}

impl IntoResponse for FilesAuthError {
    fn into_response(self) -> Response {
        FilesError::from(self).into_response()
    }
}

/// The signature the SDK computes for `path`, `operation`, `username` and `expiration`.
pub fn sign(
    path: &str,
    operation: Operation,
    username: Option<&str>,
    access_token: &str,
    expiration: Option<i64>,
) -> String {
    let mut material = format!(
        "{path}:{}:{}:{access_token}",
        operation.as_str(),
        username.unwrap_or("")
    );
    if let Some(expiration) = expiration {
        material.push(':');
        material.push_str(&expiration.to_string());
    }
    let digest = Sha256::digest(material.as_bytes());
    format!("v1_{}", STANDARD_NO_PAD.encode(digest))
}

/// Verifies the signature of a `/files` request whose query is `query`, at `now_unix`.
pub fn verify_signature(
    query: &FilesQuery,
    operation: Operation,
    access_token: &str,
    now_unix: i64,
) -> Result<(), FilesAuthError> {
    let presented = query.signature.as_deref().ok_or(FilesAuthError::Missing)?;
    let expiration = match query.signature_expiration.as_deref() {
        None => None,
        Some(text) => Some(parse_expiration(text).ok_or(FilesAuthError::Invalid)?),
    };
    let expected = sign(
        query.path.as_deref().unwrap_or(""),
        operation,
        query.username.as_deref(),
        access_token,
        expiration,
    );
    if !constant_time_eq(presented.as_bytes(), expected.as_bytes()) {
        return Err(FilesAuthError::Invalid);
    }
    match expiration {
        Some(exp) if exp < now_unix => Err(FilesAuthError::Expired),
        _ => Ok(()),
    }
}

/// Authorizes a `/files` request: always when the sandbox has no access token; otherwise an
/// `X-Access-Token` header, when present, must equal it, and without one the URL must be
/// signed.
pub fn authorize(
    headers: &HeaderMap,
    query: &FilesQuery,
    operation: Operation,
    access_token: Option<&str>,
    now_unix: i64,
) -> Result<(), FilesAuthError> {
    let Some(access_token) = access_token else {
        return Ok(());
    };
    if let Some(presented) = headers.get(ACCESS_TOKEN_HEADER) {
        return if constant_time_eq(presented.as_bytes(), access_token.as_bytes()) {
            Ok(())
        } else {
            Err(FilesAuthError::Invalid)
        };
    }
    verify_signature(query, operation, access_token, now_unix)
}

/// Unix seconds as decimal digits with an optional leading `-` (the SDK signs a negative
/// offset as a past time); anything else is malformed.
fn parse_expiration(text: &str) -> Option<i64> {
    let digits = text.strip_prefix('-').unwrap_or(text);
    if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// Compares two secrets in time independent of where they differ and of their lengths:
/// both are hashed with SHA-256 first (fixed-length digests), which `subtle` then compares
/// in constant time (as the key store compares key hashes).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    Sha256::digest(a).ct_eq(&Sha256::digest(b)).into()
}

/// The user a `/files` request acts as: `?username=` when given and not empty, else
/// `default`; a user the sandbox does not have is 401 (as envd answers).
pub fn resolve_user(query: &FilesQuery, default: User) -> Result<User, FilesError> {
    match query.username() {
        None => Ok(default),
        Some(name) => User::from_name(name)
            .ok_or_else(|| FilesError::unauthorized(format!("invalid username: '{name}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use http_body_util::BodyExt;

    const TOKEN: &str = "tok_123";
    const NOW: i64 = 1_800_000_000;

    fn query(path: &str, user: Option<&str>, sig: Option<String>, exp: Option<&str>) -> FilesQuery {
        FilesQuery {
            path: Some(path.to_string()),
            username: user.map(str::to_string),
            signature: sig,
            signature_expiration: exp.map(str::to_string),
        }
    }

    #[test]
    fn signature_matches_the_sdk_algorithm() {
        // Python: "v1_" + b64encode(sha256(b"/home/user/a.txt:read::tok_123").digest()).rstrip(b"=")
        let material = "/home/user/a.txt:read::tok_123";
        let digest = Sha256::digest(material.as_bytes());
        let padded = base64::engine::general_purpose::STANDARD.encode(digest);
        let expected = format!("v1_{}", padded.trim_end_matches('='));
        assert_eq!(
            sign("/home/user/a.txt", Operation::Read, None, TOKEN, None),
            expected
        );
        assert_eq!(expected.len(), 3 + 43);

        let with_exp = sign(
            "a.txt",
            Operation::Write,
            Some("root"),
            TOKEN,
            Some(1_700_000_000),
        );
        let digest = Sha256::digest(b"a.txt:write:root:tok_123:1700000000");
        assert_eq!(with_exp, format!("v1_{}", STANDARD_NO_PAD.encode(digest)));
    }

    #[test]
    fn valid_signatures_pass() {
        let sig = sign("a.txt", Operation::Read, None, TOKEN, None);
        verify_signature(
            &query("a.txt", None, Some(sig), None),
            Operation::Read,
            TOKEN,
            NOW,
        )
        .unwrap();
        let sig = sign(
            "a.txt",
            Operation::Read,
            Some("root"),
            TOKEN,
            Some(NOW + 60),
        );
        let q = query("a.txt", Some("root"), Some(sig), Some("1800000060"));
        verify_signature(&q, Operation::Read, TOKEN, NOW).unwrap();
        // An expiration equal to now is still valid (envd refuses only exp < now).
        let sig = sign("a.txt", Operation::Read, None, TOKEN, Some(NOW));
        let q = query("a.txt", None, Some(sig), Some("1800000000"));
        verify_signature(&q, Operation::Read, TOKEN, NOW).unwrap();
    }

    #[test]
    fn wrong_material_is_invalid() {
        let exp = NOW + 60;
        let good = sign("a.txt", Operation::Read, Some("user"), TOKEN, Some(exp));
        let exp_text = exp.to_string();
        let cases = [
            // wrong path, user, operation, token, expiry
            (
                query("b.txt", Some("user"), Some(good.clone()), Some(&exp_text)),
                Operation::Read,
                TOKEN,
            ),
            (
                query("a.txt", Some("root"), Some(good.clone()), Some(&exp_text)),
                Operation::Read,
                TOKEN,
            ),
            (
                query("a.txt", None, Some(good.clone()), Some(&exp_text)),
                Operation::Read,
                TOKEN,
            ),
            (
                query("a.txt", Some("user"), Some(good.clone()), Some(&exp_text)),
                Operation::Write,
                TOKEN,
            ),
            (
                query("a.txt", Some("user"), Some(good.clone()), Some(&exp_text)),
                Operation::Read,
                "other",
            ),
            (
                query(
                    "a.txt",
                    Some("user"),
                    Some(good.clone()),
                    Some("1800000061"),
                ),
                Operation::Read,
                TOKEN,
            ),
            (
                query("a.txt", Some("user"), Some(good.clone()), None),
                Operation::Read,
                TOKEN,
            ),
            (
                query(
                    "a.txt",
                    Some("user"),
                    Some(good.to_uppercase()),
                    Some(&exp_text),
                ),
                Operation::Read,
                TOKEN,
            ),
            (
                query("a.txt", Some("user"), Some(String::new()), Some(&exp_text)),
                Operation::Read,
                TOKEN,
            ),
            (
                query(
                    "a.txt",
                    Some("user"),
                    Some(format!("{good}=")),
                    Some(&exp_text),
                ),
                Operation::Read,
                TOKEN,
            ),
        ];
        for (q, op, token) in cases {
            assert_eq!(
                verify_signature(&q, op, token, NOW),
                Err(FilesAuthError::Invalid),
                "{q:?}"
            );
        }
        for bad_exp in ["", "soon", "1e9", "+5", " 5", "99999999999999999999"] {
            let q = query("a.txt", Some("user"), Some(good.clone()), Some(bad_exp));
            assert_eq!(
                verify_signature(&q, Operation::Read, TOKEN, NOW),
                Err(FilesAuthError::Invalid)
            );
        }
        let q = query("a.txt", None, None, None);
        assert_eq!(
            verify_signature(&q, Operation::Read, TOKEN, NOW),
            Err(FilesAuthError::Missing)
        );
    }

    #[test]
    fn expired_only_for_genuine_signatures() {
        let past = NOW - 10;
        let sig = sign("a.txt", Operation::Read, None, TOKEN, Some(past));
        let q = query("a.txt", None, Some(sig), Some(&past.to_string()));
        assert_eq!(
            verify_signature(&q, Operation::Read, TOKEN, NOW),
            Err(FilesAuthError::Expired)
        );
        // Negative expirations (far past) still verify, then expire.
        let sig = sign("a.txt", Operation::Read, None, TOKEN, Some(-5));
        let q = query("a.txt", None, Some(sig), Some("-5"));
        assert_eq!(
            verify_signature(&q, Operation::Read, TOKEN, NOW),
            Err(FilesAuthError::Expired)
        );
        // A forged signature with a past expiration is merely invalid.
        let q = query(
            "a.txt",
            None,
            Some("v1_forged".into()),
            Some(&past.to_string()),
        );
        assert_eq!(
            verify_signature(&q, Operation::Read, TOKEN, NOW),
            Err(FilesAuthError::Invalid)
        );
    }

    #[tokio::test]
    async fn expired_body_is_exact() {
        let response = FilesAuthError::Expired.into_response();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            &bytes[..],
            br#"{"code":401,"message":"signature is already expired"}"#
        );
        assert_eq!(
            FilesError::from(FilesAuthError::Missing),
            FilesError::unauthorized_access()
        );
    }

    #[test]
    fn authorize_with_header_or_signature() {
        let no_sig = query("a.txt", None, None, None);
        let mut headers = HeaderMap::new();
        assert_eq!(
            authorize(&headers, &no_sig, Operation::Read, None, NOW),
            Ok(())
        );
        assert_eq!(
            authorize(&headers, &no_sig, Operation::Read, Some(TOKEN), NOW),
            Err(FilesAuthError::Missing)
        );
        let sig = sign("a.txt", Operation::Write, None, TOKEN, None);
        let signed = query("a.txt", None, Some(sig), None);
        assert_eq!(
            authorize(&headers, &signed, Operation::Write, Some(TOKEN), NOW),
            Ok(())
        );
        assert_eq!(
            authorize(&headers, &signed, Operation::Read, Some(TOKEN), NOW),
            Err(FilesAuthError::Invalid)
        );
        headers.insert(ACCESS_TOKEN_HEADER, HeaderValue::from_static(TOKEN));
        assert_eq!(
            authorize(&headers, &no_sig, Operation::Read, Some(TOKEN), NOW),
            Ok(())
        );
        headers.insert(ACCESS_TOKEN_HEADER, HeaderValue::from_static("wrong"));
        // A wrong header token fails even with a valid signature (as envd does).
        assert_eq!(
            authorize(&headers, &signed, Operation::Write, Some(TOKEN), NOW),
            Err(FilesAuthError::Invalid)
        );
    }

    #[test]
    fn constant_time_compare() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn users() {
        let q = |u: Option<&str>| query("p", u, None, None);
        assert_eq!(resolve_user(&q(None), User::User).unwrap(), User::User);
        assert_eq!(resolve_user(&q(Some("")), User::Root).unwrap(), User::Root);
        assert_eq!(
            resolve_user(&q(Some("root")), User::User).unwrap(),
            User::Root
        );
        let err = resolve_user(&q(Some("bob")), User::User).unwrap_err();
        assert_eq!(err.status, StatusCode::UNAUTHORIZED);
        assert_eq!(Operation::for_method(&Method::GET), Some(Operation::Read));
        assert_eq!(Operation::for_method(&Method::POST), Some(Operation::Write));
        assert_eq!(Operation::for_method(&Method::DELETE), None);
    }
}
