//! File metadata sent with uploads as `X-Metadata-<key>: <value>` headers, stored by the agent
//! as `user.e2b.<key>` extended attributes.
//!
//! The bounds are envd's, and they exist because of xattrs: a name is at most 255 bytes, so a
//! key after the 9-byte `user.e2b.` prefix is at most 246; all keys and values together are
//! at most 4096 bytes (one filesystem block of attributes). Keys and values are printable
//! ASCII. Header names reach us lowercased (HTTP/2 requires it, hyper normalises HTTP/1), so
//! keys are lowercase.

use axum::http::HeaderMap;

use super::error::FilesError;

/// The header prefix, lowercase.
pub const PREFIX: &str = "x-metadata-";
/// Longest key: 255 bytes of xattr name minus `user.e2b.`.
pub const MAX_KEY_LEN: usize = 246;
/// Largest total of key and value bytes.
pub const MAX_TOTAL_LEN: usize = 4096;

/// The metadata of an upload, sorted by key. Errors are 400 with a message naming the key.
pub fn extract_metadata(headers: &HeaderMap) -> Result<Vec<(String, String)>, FilesError> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut total = 0usize;
    for name in headers.keys() {
        let Some(key) = name.as_str().strip_prefix(PREFIX) else {
            continue;
        };
        if key.is_empty() {
            return Err(FilesError::bad_request("metadata header without a key"));
        }
        if key.len() > MAX_KEY_LEN {
            return Err(FilesError::bad_request(format!(
                "metadata key of {} bytes exceeds the limit of {MAX_KEY_LEN}",
                key.len()
            )));
        }
        if !printable(key.as_bytes()) {
            return Err(FilesError::bad_request(format!(
                "metadata key {key:?} is not printable ASCII"
            )));
        }
        let mut values = headers.get_all(name).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(FilesError::bad_request(format!(
                "metadata key {key:?} is given more than once"
            )));
        };
        if !printable(value.as_bytes()) {
            return Err(FilesError::bad_request(format!(
                "metadata value of {key:?} is not printable ASCII"
            )));
        }
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        total += key.len() + value.len();
        if total > MAX_TOTAL_LEN {
            return Err(FilesError::bad_request(format!(
                "metadata exceeds the limit of {MAX_TOTAL_LEN} bytes"
            )));
        }
        out.push((key.to_string(), value));
    }
    out.sort();
    Ok(out)
}

/// Printable ASCII: space through `~`.
fn printable(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| (0x20..=0x7e).contains(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderName, HeaderValue, StatusCode};

    fn headers(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_bytes(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn extracts_sorted_lowercase_keys() {
        let h = headers(&[
            ("X-Metadata-Owner", b"team a"),
            ("content-type", b"application/octet-stream"),
            ("x-metadata-a.b_c", b"1"),
            ("x-metadata-empty", b""),
        ]);
        assert_eq!(
            extract_metadata(&h).unwrap(),
            vec![
                ("a.b_c".to_string(), "1".to_string()),
                ("empty".to_string(), String::new()),
                ("owner".to_string(), "team a".to_string()),
            ]
        );
        assert!(extract_metadata(&HeaderMap::new()).unwrap().is_empty());
    }

    #[test]
    fn refuses_what_xattrs_cannot_hold() {
        let long_key = format!("x-metadata-{}", "k".repeat(MAX_KEY_LEN + 1));
        let ok_key = format!("x-metadata-{}", "k".repeat(MAX_KEY_LEN));
        assert!(extract_metadata(&headers(&[(&ok_key, b"v")])).is_ok());
        let big = vec![b'v'; 2100];
        let cases: Vec<HeaderMap> = vec![
            headers(&[("x-metadata-", b"v")]),
            headers(&[(&long_key, b"v")]),
            headers(&[("x-metadata-k", b"caf\xc3\xa9")]),
            headers(&[("x-metadata-k", b"tab\there")]),
            headers(&[("x-metadata-k", b"1"), ("x-metadata-k", b"2")]),
            headers(&[("x-metadata-a", &big), ("x-metadata-b", &big)]),
        ];
        for h in cases {
            let err = extract_metadata(&h).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST, "{h:?}");
        }
        let exact = vec![b'v'; MAX_TOTAL_LEN - 1];
        assert!(extract_metadata(&headers(&[("x-metadata-a", &exact)])).is_ok());
        let over = vec![b'v'; MAX_TOTAL_LEN];
        assert!(extract_metadata(&headers(&[("x-metadata-a", &over)])).is_err());
    }
}
