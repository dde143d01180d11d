//! The query of `GET/POST /files`: `path`, `username`, `signature`, `signature_expiration`.
//!
//! Values are percent-decoded (`+` is a space, as in Go's `url.ParseQuery`, which envd uses),
//! the first of repeated parameters wins, and unknown parameters (the JS SDK may add `source`)
//! are ignored. The decoded `path` is exactly what the SDK signed.

use percent_encoding::percent_decode_str;

use super::error::FilesError;

/// The parameters of a `/files` request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FilesQuery {
    pub path: Option<String>,
    pub username: Option<String>,
    pub signature: Option<String>,
    /// Unix seconds, as sent (parsed when the signature is verified).
    pub signature_expiration: Option<String>,
}

impl FilesQuery {
    /// Parses the raw query string (without the `?`); `None` is an empty query. A value that
    /// is not UTF-8 after decoding is refused (400): paths and user names are UTF-8.
    pub fn parse(raw: Option<&str>) -> Result<FilesQuery, FilesError> {
        let mut query = FilesQuery::default();
        for pair in raw.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let Some(key) = decode(key) else {
                continue;
            };
            let slot = match key.as_str() {
                "path" => &mut query.path,
                "username" => &mut query.username,
                "signature" => &mut query.signature,
                "signature_expiration" => &mut query.signature_expiration,
                _ => continue,
            };
            let value = decode(value).ok_or_else(|| {
                FilesError::bad_request(format!("query parameter {key} is not valid UTF-8"))
            })?;
            if slot.is_none() {
                *slot = Some(value);
            }
        }
        Ok(query)
    }

    /// The user named by `?username=`; an empty value counts as absent.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref().filter(|u| !u.is_empty())
    }
}

/// Decodes one `application/x-www-form-urlencoded` component; `None` if it is not UTF-8.
fn decode(component: &str) -> Option<String> {
    let spaced = component.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sdk_queries() {
        let q = FilesQuery::parse(Some(
            "path=%2Fhome%2Fuser%2Fa%20b.txt&username=root&signature=v1_abc&signature_expiration=1700000000&source=js",
        ))
        .unwrap();
        assert_eq!(q.path.as_deref(), Some("/home/user/a b.txt"));
        assert_eq!(q.username(), Some("root"));
        assert_eq!(q.signature.as_deref(), Some("v1_abc"));
        assert_eq!(q.signature_expiration.as_deref(), Some("1700000000"));
    }

    #[test]
    fn edge_cases() {
        assert_eq!(FilesQuery::parse(None).unwrap(), FilesQuery::default());
        assert_eq!(FilesQuery::parse(Some("")).unwrap(), FilesQuery::default());
        let q = FilesQuery::parse(Some("path=a+b&path=second&username=")).unwrap();
        assert_eq!(q.path.as_deref(), Some("a b"), "first wins, + is a space");
        assert_eq!(q.username(), None);
        let q = FilesQuery::parse(Some("path=%E2%82%AC%2B")).unwrap();
        assert_eq!(q.path.as_deref(), Some("€+"));
        let q = FilesQuery::parse(Some("path=%EF%BF%BD")).unwrap();
        assert_eq!(q.path.as_deref(), Some("\u{FFFD}"));
        assert!(FilesQuery::parse(Some("path=%FF%FE")).is_err());
        assert!(FilesQuery::parse(Some("path=%EF%BF%BD&username=%C3")).is_err());
        let q = FilesQuery::parse(Some("junk=%FF&%FF=1&path=ok&novalue&=x")).unwrap();
        assert_eq!(q.path.as_deref(), Some("ok"));
        let q = FilesQuery::parse(Some("path")).unwrap();
        assert_eq!(q.path.as_deref(), Some(""));
    }
}
