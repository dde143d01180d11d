//! Who an RPC call acts as, and whether it carries the sandbox's access token.
//!
//! The SDKs name the user with `Authorization: Basic base64("<user>:")` (empty password) and
//! send no header for the sandbox's default user. The access token travels in
//! `X-Access-Token` and is compared in constant time.

use axum::http::{header, HeaderMap};
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use base64::Engine;
use husk_core::calls::User;

use crate::connect::ConnectError;
use crate::files::auth::constant_time_eq;

/// The header carrying the sandbox's access token.
pub const ACCESS_TOKEN_HEADER: &str = "x-access-token";

/// The user a call acts as: from Basic auth when present, else `default`. A malformed header
/// or a user the sandbox does not have is `unauthenticated`.
pub fn rpc_user(headers: &HeaderMap, default: User) -> Result<User, ConnectError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(default);
    };
    let bad = || ConnectError::unauthenticated("malformed Authorization header: expected Basic");
    let text = value.to_str().map_err(|_| bad())?.trim();
    let (scheme, credentials) = text.split_once(' ').ok_or_else(bad)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(bad());
    }
    let credentials = credentials.trim();
    let decoded = STANDARD
        .decode(credentials)
        .or_else(|_| STANDARD_NO_PAD.decode(credentials))
        .map_err(|_| bad())?;
    let decoded = String::from_utf8(decoded).map_err(|_| bad())?;
    let username = decoded.split_once(':').map_or(decoded.as_str(), |(u, _)| u);
    if username.is_empty() {
        return Ok(default);
    }
    User::from_name(username)
        .ok_or_else(|| ConnectError::unauthenticated(format!("invalid username: '{username}'")))
}

/// Whether the request may proceed: always when the sandbox has no access token, otherwise
/// only with an `X-Access-Token` equal to it.
pub fn access_token_ok(headers: &HeaderMap, expected: Option<&str>) -> bool {
    let Some(expected) = expected else {
        return true;
    };
    headers
        .get(ACCESS_TOKEN_HEADER)
        .is_some_and(|v| constant_time_eq(v.as_bytes(), expected.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::Code;
    use axum::http::HeaderValue;

    fn with_auth(value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn basic_auth_names_the_user() {
        assert_eq!(rpc_user(&HeaderMap::new(), User::User).unwrap(), User::User);
        assert_eq!(rpc_user(&HeaderMap::new(), User::Root).unwrap(), User::Root);
        // base64("root:") and base64("user:")
        assert_eq!(
            rpc_user(&with_auth("Basic cm9vdDo="), User::User).unwrap(),
            User::Root
        );
        assert_eq!(
            rpc_user(&with_auth("basic dXNlcjo="), User::Root).unwrap(),
            User::User
        );
        assert_eq!(
            rpc_user(&with_auth("Basic cm9vdDo"), User::User).unwrap(),
            User::Root
        );
        // base64(":") — an empty user name means the default.
        assert_eq!(
            rpc_user(&with_auth("Basic Og=="), User::Root).unwrap(),
            User::Root
        );
    }

    #[test]
    fn bad_basic_auth_is_unauthenticated() {
        // base64("alice:"), then garbage of several kinds.
        for value in [
            "Basic YWxpY2U6",
            "Bearer abc",
            "Basic",
            "Basic !!!",
            "Basic //79",
        ] {
            let err = rpc_user(&with_auth(value), User::User).unwrap_err();
            assert_eq!(err.code, Code::Unauthenticated, "{value}");
        }
        let err = rpc_user(&with_auth("Basic YWxpY2U6"), User::User).unwrap_err();
        assert_eq!(err.message, "invalid username: 'alice'");
    }

    #[test]
    fn access_token() {
        let mut h = HeaderMap::new();
        assert!(access_token_ok(&h, None));
        assert!(!access_token_ok(&h, Some("secret")));
        h.insert(ACCESS_TOKEN_HEADER, HeaderValue::from_static("secret"));
        assert!(access_token_ok(&h, Some("secret")));
        assert!(!access_token_ok(&h, Some("secret2")));
        assert!(!access_token_ok(&h, Some("Secret")));
        assert!(access_token_ok(&h, None));
    }
}
