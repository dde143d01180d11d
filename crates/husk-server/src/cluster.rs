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

/// Largest token file read: a few tokens (during a rotation), with room to spare.
pub const MAX_TOKEN_FILE: usize = husk_core::operator_files::MAX_TOKEN_FILE;
/// How often every process reads its token file again (a rotation takes effect within it).
pub const RELOAD: std::time::Duration = std::time::Duration::from_secs(2);

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
        "cluster token file {0}: one token per line, each {MIN_TOKEN_LEN}-{MAX_TOKEN_LEN} \
         printable characters without spaces (make one with `head -c 32 /dev/urandom | base64`)"
    )]
    Invalid(String),
}

/// A token file read again holds no valid token (the tokens read before stay in use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the cluster token file holds no valid token (one per line, {MIN_TOKEN_LEN}-{MAX_TOKEN_LEN} \
     printable characters)"
)]
pub struct NoToken;

/// The tokens of one reading of the file.
struct Tokens {
    /// Every line's token: all are accepted (more than one while a token is rotated).
    accepted: Vec<Zeroizing<String>>,
    /// A hash of the file as read, to see whether it changed without keeping it.
    read: [u8; 32],
}

/// The cluster token, kept out of logs and wiped when dropped. Cloned per request on a node:
/// shared, not copied.
///
/// The file holds one token per line. The first is the one this process sends; every line's
/// is accepted. Rotating without a restart (every process reads its file again every
/// [`RELOAD`]): add the new token as a second line everywhere, then make it the first line
/// everywhere, then remove the old one.
#[derive(Clone)]
pub struct ClusterToken(std::sync::Arc<std::sync::RwLock<std::sync::Arc<Tokens>>>);

impl std::fmt::Debug for ClusterToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterToken(***)")
    }
}

impl ClusterToken {
    /// The tokens in `path` (a mounted Secret).
    pub fn load(path: &Path) -> Result<ClusterToken, TokenError> {
        let text = read_file(path)?;
        ClusterToken::parse(&text).ok_or_else(|| TokenError::Invalid(path.display().to_string()))
    }

    /// `bytes` as a token, if it is one.
    pub fn new(bytes: &[u8]) -> Option<ClusterToken> {
        if bytes.contains(&b'\n') {
            return None;
        }
        ClusterToken::parse(bytes)
    }

    /// A token file's text: one token per line (blank lines and trailing white space
    /// ignored), at least one.
    pub fn parse(text: &[u8]) -> Option<ClusterToken> {
        tokens(text).map(|t| ClusterToken(std::sync::Arc::new(std::sync::RwLock::new(t.into()))))
    }

    fn now(&self) -> std::sync::Arc<Tokens> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Takes the file's text as read again: `Ok(true)` if the tokens changed, `Ok(false)` if
    /// the file did not, and an error (the tokens kept as they were) if it is not a token
    /// file.
    pub fn reload(&self, text: &[u8]) -> Result<bool, NoToken> {
        if self.now().read == digest(text) {
            return Ok(false);
        }
        let new = tokens(text).ok_or(NoToken)?;
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = new.into();
        Ok(true)
    }

    /// How many tokens are accepted now.
    pub fn accepted(&self) -> usize {
        self.now().accepted.len()
    }

    /// Whether `headers` carry one of the tokens (each compared in constant time).
    pub fn presented_in(&self, headers: &HeaderMap) -> bool {
        let tokens = self.now();
        let mut found = false;
        for v in headers.get_all(TOKEN) {
            for t in &tokens.accepted {
                found |= bool::from(v.as_bytes().ct_eq(t.as_bytes()));
            }
        }
        found
    }

    /// The token this process sends, as a header value marked sensitive (HTTP/2 never
    /// indexes it).
    pub fn header_value(&self) -> HeaderValue {
        let tokens = self.now();
        let first = tokens.accepted.first().map_or("", |t| t.as_str());
        let mut v = HeaderValue::from_str(first).unwrap_or(HeaderValue::from_static(""));
        v.set_sensitive(true);
        v
    }

    /// Reads the token file again every [`RELOAD`] with `read` (blocking; a node asks its
    /// state helper, which may read it), for as long as the runtime runs. A file that
    /// stops being a token file is reported once and changes nothing.
    pub fn spawn_reload<F>(&self, read: F)
    where
        F: Fn() -> Result<Zeroizing<Vec<u8>>, String> + Send + Sync + 'static,
    {
        let token = self.clone();
        let mut reported: Option<[u8; 32]> = None;
        crate::reread::spawn(
            "cluster token file",
            RELOAD,
            read,
            move |text: Zeroizing<Vec<u8>>| match token.reload(&text) {
                Ok(true) => {
                    reported = None;
                    tracing::info!(
                        accepted = token.accepted(),
                        "the cluster token file changed: its tokens are in use"
                    );
                }
                Ok(false) => {}
                Err(e) if reported != Some(digest(&text)) => {
                    reported = Some(digest(&text));
                    tracing::error!("{e}: the tokens read before stay in use");
                }
                Err(_) => {}
            },
        );
    }
}

/// The token file at `path`, read whole (at most [`MAX_TOKEN_FILE`]).
pub fn read_file(path: &Path) -> Result<Zeroizing<Vec<u8>>, TokenError> {
    use husk_core::operator_files::{read, ReadError};
    read(path, MAX_TOKEN_FILE).map_err(|e| match e {
        ReadError::Io(source) => TokenError::Read {
            path: path.display().to_string(),
            source,
        },
        ReadError::TooLarge { .. } => TokenError::Invalid(path.display().to_string()),
    })
}

fn digest(text: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(text).into()
}

fn tokens(text: &[u8]) -> Option<Tokens> {
    let mut accepted = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let line = line.trim_ascii();
        if line.is_empty() {
            continue;
        }
        let ok = (MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&line.len())
            && line.iter().all(|b| b.is_ascii_graphic());
        if !ok {
            return None;
        }
        accepted.push(Zeroizing::new(String::from_utf8_lossy(line).into_owned()));
    }
    (!accepted.is_empty()).then(|| Tokens {
        accepted,
        read: digest(text),
    })
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
    fn a_token_is_rotated_by_editing_the_file() {
        const NEW: &str = "fedcba9876543210fedcba9876543210";
        let with = |t: &str| {
            let mut h = HeaderMap::new();
            h.insert(TOKEN, HeaderValue::from_str(t).unwrap());
            h
        };
        let token = ClusterToken::parse(format!("{T}\n").as_bytes()).unwrap();
        assert!(!token.presented_in(&with(NEW)));
        // Unchanged: nothing to do.
        assert_eq!(token.reload(format!("{T}\n").as_bytes()), Ok(false));
        // 1. The new token as a second line: both accepted, the old one still sent.
        assert_eq!(token.reload(format!("{T}\n{NEW}\n").as_bytes()), Ok(true));
        assert!(token.presented_in(&with(T)) && token.presented_in(&with(NEW)));
        assert_eq!(token.header_value(), T);
        assert_eq!(token.accepted(), 2);
        // 2. The new one first: sent, the old still accepted.
        assert_eq!(
            token.reload(format!("  {NEW}\r\n\n{T}").as_bytes()),
            Ok(true)
        );
        assert_eq!(token.header_value(), NEW);
        assert!(token.presented_in(&with(T)));
        // A file written half-way, or emptied, changes nothing.
        for bad in ["", "\n", "short\n", &format!("{NEW}\nnot a token at all\n")] {
            assert_eq!(token.reload(bad.as_bytes()), Err(NoToken), "{bad:?}");
            assert_eq!(token.header_value(), NEW);
        }
        // 3. The old one removed: refused.
        assert_eq!(token.reload(NEW.as_bytes()), Ok(true));
        assert!(!token.presented_in(&with(T)));
        assert!(token.presented_in(&with(NEW)));
        // A clone (every request's) sees the same tokens.
        assert!(token.clone().presented_in(&with(NEW)));
        // One line only where a single token is asked for.
        assert!(ClusterToken::new(format!("{T}\n{NEW}").as_bytes()).is_none());
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
