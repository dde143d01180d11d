//! What a node and its gateways share on the wire: the cluster token that is the node API's
//! only credential, and the headers in which a gateway tells the node whom it authenticated.
//!
//! A node that has a token ([`crate::app::AppState::with_cluster`]) accepts on its listener
//! only requests that carry it, `/health` aside (the orchestrator's probes). Its REST API then
//! takes the caller from [`TEAM`], [`KEY_ID`] and [`ADMIN`], which only a holder of the token
//! can send: the gateway checked the API key against the shared database already, and the
//! node does not check it again. The token and these headers are removed before a request
//! goes on to a sandbox (ingress), so that nothing inside ever sees them.

use std::path::Path;

use axum::http::{HeaderMap, HeaderValue};
use husk_core::store::Principal;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// The cluster token.
pub const TOKEN: &str = "x-husk-cluster-token";
/// The caller's team, as the gateway authenticated it.
pub const TEAM: &str = "x-husk-team";
/// The public id of the key the caller used.
pub const KEY_ID: &str = "x-husk-key-id";
/// `1` when the key is an admin key.
pub const ADMIN: &str = "x-husk-admin";

/// Every header of the cluster's: a client's copies are removed by a gateway, and a node's
/// before a request reaches a sandbox.
pub const HEADERS: [&str; 4] = [TOKEN, TEAM, KEY_ID, ADMIN];

/// Shortest token accepted: 32 characters (of a base64 or hex encoding of random bytes).
pub const MIN_TOKEN_LEN: usize = 32;
/// Longest token accepted.
pub const MAX_TOKEN_LEN: usize = 512;

/// Why a token file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("cluster token file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "cluster token file {0}: the token must be {MIN_TOKEN_LEN}-{MAX_TOKEN_LEN} printable \
         characters without spaces (make one with `head -c 32 /dev/urandom | base64`)"
    )]
    Invalid(String),
}

/// The cluster token, kept out of logs and wiped when dropped. Cloned per request on a node:
/// shared, not copied.
#[derive(Clone)]
pub struct ClusterToken(std::sync::Arc<Zeroizing<String>>);

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(***)")
    }
}

impl ClusterToken {
    /// The token in `path` (a mounted Secret; a final newline is ignored).
    pub fn load(path: &Path) -> Result<ClusterToken, TokenError> {
        let text = Zeroizing::new(std::fs::read(path).map_err(|source| TokenError::Read {
            path: path.display().to_string(),
            source,
        })?);
        let trimmed = text.trim_ascii_end();
        ClusterToken::new(trimmed).ok_or_else(|| TokenError::Invalid(path.display().to_string()))
    }

    /// `bytes` as a token, if it is one.
    pub fn new(bytes: &[u8]) -> Option<ClusterToken> {
        let ok = (MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&bytes.len())
            && bytes.iter().all(|b| b.is_ascii_graphic());
        ok.then(|| {
            ClusterToken(std::sync::Arc::new(Zeroizing::new(
                String::from_utf8_lossy(bytes).into_owned(),
            )))
        })
    }

    /// Whether `headers` carry this token (compared in constant time).
    pub fn presented_in(&self, headers: &HeaderMap) -> bool {
        let mut found = false;
        for v in headers.get_all(TOKEN) {
            found |= bool::from(v.as_bytes().ct_eq(self.0.as_bytes()));
        }
        found
    }

    /// The token as a header value, marked sensitive (HTTP/2 never indexes it).
    pub fn header_value(&self) -> HeaderValue {
        let mut v = HeaderValue::from_str(&self.0).unwrap_or(HeaderValue::from_static(""));
        v.set_sensitive(true);
        v
    }
}

/// Removes every cluster header.
pub fn strip(headers: &mut HeaderMap) {
    for h in HEADERS {
        headers.remove(h);
    }
}

/// Writes who the caller is, for the node (after [`strip`]).
pub fn put_principal(headers: &mut HeaderMap, who: &Principal) {
    // Team names and key ids are checked characters (`[a-z0-9_-]`, hex): always valid values.
    if let Ok(team) = HeaderValue::from_str(&who.team) {
        headers.insert(TEAM, team);
    }
    if let Ok(id) = HeaderValue::from_str(&who.key_id) {
        headers.insert(KEY_ID, id);
    }
    headers.insert(
        ADMIN,
        HeaderValue::from_static(if who.admin { "1" } else { "0" }),
    );
}

/// Who the gateway says the caller is (`None` if it said nothing usable).
pub fn principal(headers: &HeaderMap) -> Option<Principal> {
    let get = |h: &str| headers.get(h).and_then(|v| v.to_str().ok());
    let team = get(TEAM)?;
    husk_core::store::validate_team(team).ok()?;
    Some(Principal {
        team: team.to_owned(),
        key_id: get(KEY_ID).unwrap_or("").to_owned(),
        admin: get(ADMIN) == Some("1"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn tokens_are_long_printable_and_compared_whole() {
        assert!(ClusterToken::new(b"short").is_none());
        assert!(ClusterToken::new(format!("{T} x").as_bytes()).is_none());
        assert!(ClusterToken::new(&[b'a'; MAX_TOKEN_LEN + 1]).is_none());
        let token = ClusterToken::new(T.as_bytes()).unwrap();
        assert_eq!(format!("{token:?}"), "ClusterToken(***)");
        let mut h = HeaderMap::new();
        assert!(!token.presented_in(&h));
        h.insert(
            TOKEN,
            HeaderValue::from_static("0123456789abcdef0123456789abcdee"),
        );
        assert!(!token.presented_in(&h));
        h.insert(TOKEN, HeaderValue::from_str(&T[..31]).unwrap());
        assert!(!token.presented_in(&h));
        h.insert(TOKEN, token.header_value());
        assert!(token.presented_in(&h));
    }

    #[test]
    fn a_token_file_may_end_in_a_newline() {
        let dir = std::env::temp_dir().join(format!("husk-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, format!("{T}\n")).unwrap();
        let loaded = ClusterToken::load(&path);
        std::fs::write(&path, "too short\n").unwrap();
        let short = ClusterToken::load(&path);
        let missing = ClusterToken::load(&dir.join("none"));
        std::fs::remove_dir_all(&dir).unwrap();
        let mut h = HeaderMap::new();
        h.insert(TOKEN, HeaderValue::from_static(T));
        assert!(loaded.unwrap().presented_in(&h));
        assert!(matches!(short, Err(TokenError::Invalid(_))));
        assert!(matches!(missing, Err(TokenError::Read { .. })));
    }

    #[test]
    fn the_principal_travels_in_headers_and_a_bad_team_is_nobody() {
        let who = Principal {
            team: "acme".into(),
            key_id: "0a1b2c3d".into(),
            admin: true,
        };
        let mut h = HeaderMap::new();
        h.insert(TEAM, HeaderValue::from_static("evil"));
        strip(&mut h);
        assert!(principal(&h).is_none());
        put_principal(&mut h, &who);
        assert_eq!(principal(&h), Some(who));
        h.insert(TEAM, HeaderValue::from_static("Not A Team"));
        assert_eq!(principal(&h), None);
    }
}
