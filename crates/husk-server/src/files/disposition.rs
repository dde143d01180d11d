//! `Content-Disposition: inline; filename=...` for downloads, encoded so that any file name
//! (quotes, control characters, non-ASCII) yields a valid header and cannot inject another.
//!
//! As Go's `mime.FormatMediaType` (which envd uses) does: a token is sent bare, other printable
//! ASCII is quoted with `"` and `\` escaped, and anything else uses the RFC 8187 form
//! `filename*=utf-8''<percent-encoded>`.

use axum::http::HeaderValue;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

/// RFC 8187 `attr-char`: alphanumerics and `!#$&+-.^_`|~` stay, everything else is encoded.
const ATTR_CHAR: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'!')
    .remove(b'#')
    .remove(b'$')
    .remove(b'&')
    .remove(b'+')
    .remove(b'-')
    .remove(b'.')
    .remove(b'^')
    .remove(b'_')
    .remove(b'`')
    .remove(b'|')
    .remove(b'~');

/// The header value for a download of `path` (its last component names the file).
pub fn content_disposition(path: &str) -> HeaderValue {
    let name = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("download");
    let value = if name.bytes().all(is_token_char) {
        format!("inline; filename={name}")
    } else if name.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        let escaped = name.replace('\\', "\\\\").replace('"', "\\\"");
        format!("inline; filename=\"{escaped}\"")
    } else {
        format!(
            "inline; filename*=utf-8''{}",
            utf8_percent_encode(name, ATTR_CHAR)
        )
    };
    // Every branch above produces visible ASCII only, which is always a valid header value.
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("inline"))
}

/// RFC 9110 `tchar`.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_safely() {
        assert_eq!(
            content_disposition("/home/user/a.txt"),
            "inline; filename=a.txt"
        );
        assert_eq!(
            content_disposition("a b.txt"),
            "inline; filename=\"a b.txt\""
        );
        assert_eq!(
            content_disposition("/x/q\"uo\\te"),
            "inline; filename=\"q\\\"uo\\\\te\""
        );
        assert_eq!(
            content_disposition("/x/caf\u{e9}.txt"),
            "inline; filename*=utf-8''caf%C3%A9.txt"
        );
        assert_eq!(
            content_disposition("evil\r\nSet-Cookie: x"),
            "inline; filename*=utf-8''evil%0D%0ASet-Cookie%3A%20x"
        );
        assert_eq!(content_disposition("/"), "inline; filename=download");
        assert_eq!(content_disposition("dir/"), "inline; filename=dir");
    }
}
