//! `Range` requests on downloads (RFC 9110 §14), for one range at a time.
//!
//! Decisions, following envd (Go's `http.ServeContent`) where RFC 9110 leaves a choice:
//! - no header, several `Range` headers, or a unit other than `bytes`: the whole file (RFC 9110
//!   says to ignore units a server does not understand);
//! - several ranges in one header (`bytes=0-1,5-6`): the whole file. Answering them would need
//!   a `multipart/byteranges` body, which no SDK asks for; ignoring the header is allowed;
//! - a malformed range (`bytes=abc`, `bytes=5-2`, `bytes=-`) or one starting at or beyond the
//!   end of the file (or any range of an empty file, or `bytes=-0`): 416 with
//!   `Content-Range: bytes */<size>`;
//! - an end beyond the file is clamped to its last byte, a suffix longer than the file is the
//!   whole file.

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error::FilesError;

/// What to send for a download of `size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteRange {
    /// `200` with the whole file.
    Full,
    /// `206` with bytes `start..=end`.
    Partial { start: u64, end: u64 },
    /// `416`, see [`unsatisfiable`].
    Unsatisfiable,
}

impl ByteRange {
    /// The `Content-Range` value of a partial response.
    pub fn content_range(start: u64, end: u64, size: u64) -> String {
        format!("bytes {start}-{end}/{size}")
    }
}

/// Decides how to answer the request's `Range` header for a file of `size` bytes.
pub fn parse_range(headers: &HeaderMap, size: u64) -> ByteRange {
    let mut values = headers.get_all(header::RANGE).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return ByteRange::Full;
    };
    let Ok(value) = value.to_str() else {
        return ByteRange::Unsatisfiable;
    };
    parse_range_value(value, size)
}

/// [`parse_range`] on the header's value.
pub fn parse_range_value(value: &str, size: u64) -> ByteRange {
    let Some((unit, set)) = value.trim().split_once('=') else {
        return ByteRange::Unsatisfiable;
    };
    if !unit.trim().eq_ignore_ascii_case("bytes") {
        return ByteRange::Full;
    }
    let mut specs = set.split(',').map(str::trim).filter(|s| !s.is_empty());
    let (Some(spec), None) = (specs.next(), specs.next()) else {
        // No range at all is malformed; several are served as the whole file.
        return if set.split(',').any(|s| !s.trim().is_empty()) {
            ByteRange::Full
        } else {
            ByteRange::Unsatisfiable
        };
    };
    single_range(spec, size).unwrap_or(ByteRange::Unsatisfiable)
}

/// One `first-last`, `first-` or `-suffix`; `None` when malformed or not satisfiable.
fn single_range(spec: &str, size: u64) -> Option<ByteRange> {
    let (first, last) = spec.split_once('-')?;
    let (first, last) = (first.trim(), last.trim());
    if first.is_empty() {
        let suffix = digits(last)?;
        if suffix == 0 || size == 0 {
            return None;
        }
        return Some(ByteRange::Partial {
            start: size - suffix.min(size),
            end: size - 1,
        });
    }
    let start = digits(first)?;
    let end = if last.is_empty() {
        u64::MAX
    } else {
        digits(last)?
    };
    if end < start || start >= size {
        return None;
    }
    Some(ByteRange::Partial {
        start,
        end: end.min(size - 1),
    })
}

/// A non-empty run of ASCII digits that fits a `u64` (no signs, no spaces inside).
fn digits(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// The `416` answer for a file of `size` bytes, with `Content-Range: bytes */<size>`.
pub fn unsatisfiable(size: u64) -> Response {
    let err = FilesError::new(
        StatusCode::RANGE_NOT_SATISFIABLE,
        "invalid range: failed to overlap",
    );
    let mut response = err.into_response();
    if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
        response.headers_mut().insert(header::CONTENT_RANGE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(start: u64, end: u64) -> ByteRange {
        ByteRange::Partial { start, end }
    }

    #[test]
    fn satisfiable_ranges() {
        assert_eq!(parse_range_value("bytes=0-4", 10), p(0, 4));
        assert_eq!(parse_range_value("bytes=2-2", 10), p(2, 2));
        assert_eq!(parse_range_value("bytes=5-", 10), p(5, 9));
        assert_eq!(parse_range_value("bytes=-3", 10), p(7, 9));
        assert_eq!(parse_range_value("bytes=-30", 10), p(0, 9));
        assert_eq!(parse_range_value("bytes=8-100", 10), p(8, 9));
        assert_eq!(parse_range_value("Bytes = 1-2 ", 10), p(1, 2));
        assert_eq!(
            parse_range_value("bytes=0-18446744073709551615", 10),
            p(0, 9)
        );
        assert_eq!(parse_range_value("bytes=1-2,", 10), p(1, 2));
    }

    #[test]
    fn unsatisfiable_and_malformed_ranges() {
        for bad in [
            "bytes=5-2",
            "bytes=abc",
            "bytes=10-",
            "bytes=10-12",
            "bytes=-0",
            "bytes=-",
            "bytes=",
            "bytes=,",
            "bytes=1-2-3",
            "bytes=+1-2",
            "bytes=1--2",
            "bytes=0x1-2",
            "bytes=1 0-20",
            "bytes=18446744073709551616-",
            "bytes",
            "",
        ] {
            assert_eq!(
                parse_range_value(bad, 10),
                ByteRange::Unsatisfiable,
                "{bad:?}"
            );
        }
        assert_eq!(parse_range_value("bytes=0-0", 0), ByteRange::Unsatisfiable);
        assert_eq!(parse_range_value("bytes=-5", 0), ByteRange::Unsatisfiable);
    }

    #[test]
    fn ignored_ranges() {
        assert_eq!(parse_range_value("bytes=0-1,5-6", 10), ByteRange::Full);
        assert_eq!(parse_range_value("bytes=abc,def", 10), ByteRange::Full);
        assert_eq!(parse_range_value("items=0-1", 10), ByteRange::Full);
        assert_eq!(parse_range(&HeaderMap::new(), 10), ByteRange::Full);
        let mut twice = HeaderMap::new();
        twice.append(header::RANGE, HeaderValue::from_static("bytes=0-1"));
        twice.append(header::RANGE, HeaderValue::from_static("bytes=2-3"));
        assert_eq!(parse_range(&twice, 10), ByteRange::Full);
        let mut once = HeaderMap::new();
        once.insert(header::RANGE, HeaderValue::from_static("bytes=2-3"));
        assert_eq!(parse_range(&once, 10), p(2, 3));
        let mut binary = HeaderMap::new();
        binary.insert(
            header::RANGE,
            HeaderValue::from_bytes(b"bytes=\xff").unwrap(),
        );
        assert_eq!(parse_range(&binary, 10), ByteRange::Unsatisfiable);
    }

    #[test]
    fn headers_for_answers() {
        assert_eq!(ByteRange::content_range(7, 9, 10), "bytes 7-9/10");
        let response = unsatisfiable(10);
        assert_eq!(response.status(), StatusCode::RANGE_NOT_SATISFIABLE);
        assert_eq!(response.headers()[header::CONTENT_RANGE], "bytes */10");
    }
}
