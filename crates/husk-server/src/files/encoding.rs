//! Content codings of `/files`: `Accept-Encoding` negotiation for downloads and the
//! `Content-Encoding` of raw uploads. Only `gzip` and `identity` exist here, as in envd.
//!
//! Negotiation follows RFC 9110 §12.5.3: codings are case-insensitive and weighted by `q`
//! (default 1); `*` stands for every coding not listed; `identity` is acceptable unless given
//! `q=0` (directly, or via `*;q=0` without its own entry). gzip is chosen when it is acceptable
//! and identity is not listed, or listed with no higher weight; nothing acceptable is 406.

use axum::http::{header, HeaderMap};

use super::error::FilesError;

/// A content coding husk can produce or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
}

impl Coding {
    /// The token for `Content-Encoding`.
    pub fn as_str(self) -> &'static str {
        match self {
            Coding::Identity => "identity",
            Coding::Gzip => "gzip",
        }
    }
}

/// Chooses the coding of a download from the request's `Accept-Encoding` headers.
pub fn negotiate_encoding(headers: &HeaderMap) -> Result<Coding, FilesError> {
    let mut values = headers.get_all(header::ACCEPT_ENCODING).iter().peekable();
    if values.peek().is_none() {
        return Ok(Coding::Identity);
    }
    let mut gzip = None;
    let mut identity = None;
    let mut star = None;
    for value in values {
        let Ok(text) = value.to_str() else {
            continue;
        };
        for item in text.split(',') {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
            let mut q = Some(1000);
            for param in parts {
                if let Some((name, value)) = param.split_once('=') {
                    if name.trim().eq_ignore_ascii_case("q") {
                        q = parse_qvalue(value.trim());
                    }
                }
            }
            // An element with a malformed weight is ignored, as if it were not sent.
            let Some(q) = q else {
                continue;
            };
            let slot = match coding.as_str() {
                "gzip" | "x-gzip" => &mut gzip,
                "identity" => &mut identity,
                "*" => &mut star,
                _ => continue,
            };
            // When a coding is listed twice, the higher weight wins.
            *slot = Some(slot.map_or(q, |old: u16| old.max(q)));
        }
    }
    let gzip = gzip.or(star).unwrap_or(0);
    // Unlisted, identity is acceptable but least preferred; `*;q=0` excludes it.
    let identity = identity.or(star.filter(|&q| q == 0));
    match (gzip, identity) {
        (g, None) if g > 0 => Ok(Coding::Gzip),
        (g, Some(i)) if g > 0 && g >= i => Ok(Coding::Gzip),
        (_, None) => Ok(Coding::Identity),
        (_, Some(i)) if i > 0 => Ok(Coding::Identity),
        _ => Err(FilesError::not_acceptable(
            "no acceptable content encoding: this server offers gzip and identity",
        )),
    }
}

/// A `qvalue` (`0`, `0.5`, `1.000`, at most three decimals) in thousandths.
fn parse_qvalue(text: &str) -> Option<u16> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let frac_value = format!("{frac:0<3}").parse::<u16>().ok()?;
    match whole {
        "0" => Some(frac_value),
        "1" if frac_value == 0 => Some(1000),
        _ => None,
    }
}

/// The coding of an upload body from `Content-Encoding`: absent or `identity`, or `gzip`;
/// anything else is 415.
pub fn request_encoding(headers: &HeaderMap) -> Result<Coding, FilesError> {
    let mut values = headers.get_all(header::CONTENT_ENCODING).iter();
    let (value, extra) = (values.next(), values.next());
    let Some(value) = value else {
        return Ok(Coding::Identity);
    };
    let text = value.to_str().unwrap_or("").trim();
    match text.to_ascii_lowercase().as_str() {
        _ if extra.is_some() => Err(FilesError::unsupported_media_type(
            "several Content-Encoding headers: send one of gzip or identity",
        )),
        "" | "identity" => Ok(Coding::Identity),
        "gzip" | "x-gzip" => Ok(Coding::Gzip),
        _ => Err(FilesError::unsupported_media_type(format!(
            "unsupported Content-Encoding {text:?}: send gzip or identity"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderValue, StatusCode};

    fn accept(values: &[&'static str]) -> Result<Coding, FilesError> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(header::ACCEPT_ENCODING, HeaderValue::from_static(v));
        }
        negotiate_encoding(&h)
    }

    #[test]
    fn negotiation() {
        assert_eq!(accept(&[]).unwrap(), Coding::Identity);
        assert_eq!(accept(&[""]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["gzip"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["gzip, deflate, br"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["GZIP;q=0.5"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["x-gzip"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["deflate, br"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["identity"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["gzip;q=0.5, identity"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["gzip;q=0"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["*"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["*;q=0, gzip"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["*;q=0, identity"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["identity;q=0", "gzip"]).unwrap(), Coding::Gzip);
        assert_eq!(accept(&["gzip;q=0, gzip;q=1"]).unwrap(), Coding::Gzip);
        assert_eq!(
            accept(&["gzip;q=1.0, identity;q=0.999"]).unwrap(),
            Coding::Gzip
        );
        // Malformed weights drop the element.
        assert_eq!(accept(&["gzip;q=2"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["gzip;q=0.0001"]).unwrap(), Coding::Identity);
        assert_eq!(accept(&["gzip;q=abc"]).unwrap(), Coding::Identity);
    }

    #[test]
    fn nothing_acceptable_is_406() {
        for values in [
            &["identity;q=0"][..],
            &["*;q=0"],
            &["br, identity;q=0"],
            &["gzip;q=0, identity;q=0"],
            &["deflate", "*;q=0"],
        ] {
            let err = accept(values).unwrap_err();
            assert_eq!(err.status, StatusCode::NOT_ACCEPTABLE, "{values:?}");
        }
    }

    #[test]
    fn upload_encoding() {
        let enc = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(v));
            request_encoding(&h)
        };
        assert_eq!(
            request_encoding(&HeaderMap::new()).unwrap(),
            Coding::Identity
        );
        assert_eq!(enc("gzip").unwrap(), Coding::Gzip);
        assert_eq!(enc("Identity").unwrap(), Coding::Identity);
        assert_eq!(
            enc("br").unwrap_err().status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        assert_eq!(
            enc("gzip, br").unwrap_err().status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
        let mut twice = HeaderMap::new();
        twice.append(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        twice.append(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        assert!(request_encoding(&twice).is_err());
        assert_eq!(Coding::Gzip.as_str(), "gzip");
    }
}
