//! Decoding Connect requests: header checks, bounded bodies, and the three call shapes the SDKs
//! use (unary, server streaming, client streaming).
//!
//! Every check answers with a [`ConnectError`] the handler can send back as is. A request with
//! the wrong content type gets `invalid_argument` with a message naming the expected type (the
//! Connect spec's bare 415 would leave the SDK with nothing to show).

use std::marker::PhantomData;

use axum::body::{Body, BodyDataStream};
use axum::http::HeaderMap;
use bytes::Bytes;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use super::envelope::{EnvelopeDecoder, DEFAULT_MAX_ENVELOPE, HEADER_LEN};
use super::error::ConnectError;

/// Content type of unary requests and responses.
pub const UNARY_CONTENT_TYPE: &str = "application/json";
/// Content type of streaming requests and responses.
pub const STREAM_CONTENT_TYPE: &str = "application/connect+json";
/// Largest unary request body husk reads (the SDKs' unary messages are tiny).
pub const MAX_UNARY_BODY: usize = 1 << 20;
/// Largest server-streaming request body: one envelope of at most [`DEFAULT_MAX_ENVELOPE`].
pub const MAX_STREAM_REQUEST_BODY: usize = HEADER_LEN + DEFAULT_MAX_ENVELOPE;

const TIMEOUT_HEADER: &str = "connect-timeout-ms";
const PROTOCOL_VERSION_HEADER: &str = "connect-protocol-version";
const CONNECT_CONTENT_ENCODING: &str = "connect-content-encoding";
/// The spec bounds `Connect-Timeout-Ms` to 10 digits.
const MAX_TIMEOUT_DIGITS: usize = 10;

/// Reads a whole request body, refusing more than `limit` bytes, or more than the team's
/// budget of buffered bodies that `held` reserves from (both `resource_exhausted`).
pub async fn read_body(
    body: Body,
    limit: usize,
    held: &mut crate::budget::Reservation,
) -> Result<Bytes, ConnectError> {
    use crate::body::{read_all_within, ReadError};
    match read_all_within(body, limit, held).await {
        Ok(b) => Ok(b),
        Err(ReadError::TooLarge(_)) => Err(ConnectError::resource_exhausted(format!(
            "request body exceeds the limit of {limit} bytes"
        ))),
        Err(e @ ReadError::Spent(_)) => Err(ConnectError::resource_exhausted(e.to_string())),
        Err(e @ ReadError::Stalled(_)) => Err(ConnectError::new(crate::connect::Code::DeadlineExceeded, e.to_string())),
        Err(e @ ReadError::Failed(_)) => Err(ConnectError::invalid_argument(e.to_string())),
    }
}

/// Checks a unary request's headers and decodes its body (at most [`MAX_UNARY_BODY`] bytes).
pub fn parse_unary<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ConnectError> {
    check_content_type(headers, UNARY_CONTENT_TYPE)?;
    check_protocol_version(headers)?;
    check_identity(headers, "content-encoding")?;
    if body.len() > MAX_UNARY_BODY {
        return Err(ConnectError::resource_exhausted(format!(
            "request body of {} bytes exceeds the limit of {MAX_UNARY_BODY} bytes",
            body.len()
        )));
    }
    decode_message(body)
}

/// Checks a server-streaming request's headers and decodes its body, which must be exactly one
/// message envelope.
pub fn parse_stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, ConnectError> {
    check_stream_headers(headers)?;
    let mut decoder = EnvelopeDecoder::new();
    decoder.feed(body)?;
    decoder.finish()?;
    let envelope = decoder
        .next_envelope()
        .ok_or_else(|| ConnectError::invalid_argument("request body holds no message envelope"))?;
    if envelope.is_end_stream() {
        return Err(ConnectError::invalid_argument(
            "a request must not carry an end-stream envelope",
        ));
    }
    if decoder.next_envelope().is_some() {
        return Err(ConnectError::invalid_argument(
            "a server-streaming request holds exactly one message envelope",
        ));
    }
    decode_message(&envelope.data)
}

/// Decodes one JSON message. An empty payload is the empty message `{}`; unknown fields are
/// ignored by the message types themselves.
pub fn decode_message<T: DeserializeOwned>(json: &[u8]) -> Result<T, ConnectError> {
    let json = if json.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        json
    };
    serde_json::from_slice(json)
        .map_err(|err| ConnectError::invalid_argument(format!("invalid request message: {err}")))
}

/// Checks the headers of a streaming request (server or client streaming).
pub fn check_stream_headers(headers: &HeaderMap) -> Result<(), ConnectError> {
    check_content_type(headers, STREAM_CONTENT_TYPE)?;
    check_protocol_version(headers)?;
    check_identity(headers, CONNECT_CONTENT_ENCODING)
}

/// The messages of a client-streaming request (`Process/StreamInput`), decoded as they arrive.
pub struct ClientStream<T> {
    body: BodyDataStream,
    decoder: EnvelopeDecoder,
    ended: bool,
    _message: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> ClientStream<T> {
    /// Checks the request headers and wraps the body.
    pub fn new(headers: &HeaderMap, body: Body) -> Result<Self, ConnectError> {
        check_stream_headers(headers)?;
        Ok(ClientStream {
            body: body.into_data_stream(),
            decoder: EnvelopeDecoder::new(),
            ended: false,
            _message: PhantomData,
        })
    }

    /// The next message; `Ok(None)` once the body ended cleanly. Errors (a broken body, a
    /// truncated or refused envelope, an end-stream envelope from the client, bad JSON) are
    /// final: the caller answers with them.
    pub async fn next(&mut self) -> Result<Option<T>, ConnectError> {
        loop {
            if let Some(envelope) = self.decoder.next_envelope() {
                if envelope.is_end_stream() {
                    return Err(ConnectError::invalid_argument(
                        "a request must not carry an end-stream envelope",
                    ));
                }
                return decode_message(&envelope.data).map(Some);
            }
            if self.ended {
                return Ok(None);
            }
            match self.body.next().await {
                Some(Ok(chunk)) => self.decoder.feed(&chunk)?,
                Some(Err(err)) => {
                    return Err(ConnectError::invalid_argument(format!(
                        "reading the request body: {err}"
                    )))
                }
                None => {
                    self.ended = true;
                    self.decoder.finish()?;
                }
            }
        }
    }
}

/// The call's deadline from `Connect-Timeout-Ms`: `None` when absent; `invalid_argument` unless
/// it is 1 to 10 ASCII digits (the spec's bound, so the value always fits in a `u64`).
pub fn parse_timeout_ms(headers: &HeaderMap) -> Result<Option<u64>, ConnectError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else {
        return Ok(None);
    };
    let bad = || {
        ConnectError::invalid_argument(format!(
            "invalid Connect-Timeout-Ms {:?}: expected 1 to {MAX_TIMEOUT_DIGITS} digits",
            String::from_utf8_lossy(value.as_bytes())
        ))
    };
    let digits = value.as_bytes();
    if digits.is_empty()
        || digits.len() > MAX_TIMEOUT_DIGITS
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return Err(bad());
    }
    let text = std::str::from_utf8(digits).map_err(|_| bad())?;
    text.parse::<u64>().map(Some).map_err(|_| bad())
}

/// Accepts an absent `Connect-Protocol-Version` (older clients) or `1`; anything else is a
/// protocol this server does not speak.
pub fn check_protocol_version(headers: &HeaderMap) -> Result<(), ConnectError> {
    match headers.get(PROTOCOL_VERSION_HEADER) {
        None => Ok(()),
        Some(v) if v.as_bytes().trim_ascii() == b"1" => Ok(()),
        Some(v) => Err(ConnectError::invalid_argument(format!(
            "unsupported Connect-Protocol-Version {:?}: husk speaks version 1",
            String::from_utf8_lossy(v.as_bytes())
        ))),
    }
}

/// Checks that the media type of `Content-Type` is `expected` (case-insensitive), tolerating
/// parameters such as `; charset=utf-8`; a charset other than UTF-8 is refused.
pub fn check_content_type(headers: &HeaderMap, expected: &str) -> Result<(), ConnectError> {
    let raw = headers
        .get(axum::http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let wrong = || {
        ConnectError::invalid_argument(format!(
            "unsupported Content-Type {:?}: expected {expected}",
            raw.as_deref().unwrap_or("")
        ))
    };
    let value = raw.as_deref().ok_or_else(wrong)?;
    let mut parts = value.split(';');
    let media = parts.next().unwrap_or("").trim();
    if !media.eq_ignore_ascii_case(expected) {
        return Err(wrong());
    }
    for param in parts {
        let Some((name, val)) = param.split_once('=') else {
            continue;
        };
        if name.trim().eq_ignore_ascii_case("charset") {
            let charset = val.trim().trim_matches('"');
            if !charset.eq_ignore_ascii_case("utf-8") && !charset.eq_ignore_ascii_case("utf8") {
                return Err(ConnectError::invalid_argument(format!(
                    "unsupported charset {charset:?}: JSON messages are UTF-8"
                )));
            }
        }
    }
    Ok(())
}

/// Refuses a body compressed with anything but `identity` (compression is never negotiated).
fn check_identity(headers: &HeaderMap, header: &str) -> Result<(), ConnectError> {
    match headers.get(header) {
        None => Ok(()),
        Some(v) if v.as_bytes().trim_ascii().eq_ignore_ascii_case(b"identity") => Ok(()),
        Some(v) => Err(ConnectError::unimplemented(format!(
            "unsupported {header} {:?}: husk only accepts identity",
            String::from_utf8_lossy(v.as_bytes())
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::envelope::{encode_end_stream, encode_envelope, FLAG_COMPRESSED};
    use crate::connect::Code;
    use axum::http::HeaderValue;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(default)]
    struct Msg {
        path: String,
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn unary_headers() -> HeaderMap {
        headers(&[
            ("content-type", "application/json"),
            ("connect-protocol-version", "1"),
        ])
    }

    fn stream_headers() -> HeaderMap {
        headers(&[
            ("content-type", "application/connect+json"),
            ("connect-protocol-version", "1"),
            ("connect-content-encoding", "identity"),
        ])
    }

    #[test]
    fn unary_parses_with_and_without_charset() {
        let msg: Msg = parse_unary(&unary_headers(), br#"{"path":"/tmp","extra":1}"#).unwrap();
        assert_eq!(msg.path, "/tmp");
        let h = headers(&[("content-type", "Application/JSON; charset=UTF-8")]);
        let msg: Msg = parse_unary(&h, br#"{"path":"x"}"#).unwrap();
        assert_eq!(msg.path, "x");
        let h = headers(&[("content-type", "application/json;charset=\"utf-8\"")]);
        assert!(parse_unary::<Msg>(&h, b"{}").is_ok());
        // An empty body is the empty message.
        assert_eq!(
            parse_unary::<Msg>(&unary_headers(), b"").unwrap(),
            Msg::default()
        );
    }

    #[test]
    fn unary_refuses_wrong_content_types() {
        for ct in [
            "application/connect+json",
            "text/plain",
            "application/jsonx",
            "application/proto",
        ] {
            let h = headers(&[("content-type", ct)]);
            let err = parse_unary::<Msg>(&h, b"{}").unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{ct}");
            assert!(err.message.contains("application/json"), "{err}");
        }
        let err = parse_unary::<Msg>(&HeaderMap::new(), b"{}").unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        let h = headers(&[("content-type", "application/json; charset=latin1")]);
        assert!(parse_unary::<Msg>(&h, b"{}")
            .unwrap_err()
            .message
            .contains("charset"));
    }

    #[test]
    fn unary_refuses_bad_bodies() {
        for body in [
            &b"not json"[..],
            b"[1,2]",
            b"{\"path\":3}",
            b"{\"path\":",
            b"\xff\xfe",
        ] {
            let err = parse_unary::<Msg>(&unary_headers(), body).unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{body:?}");
        }
        let big = vec![b' '; MAX_UNARY_BODY + 1];
        let err = parse_unary::<Msg>(&unary_headers(), &big).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
    }

    #[test]
    fn protocol_version_and_encoding() {
        let mut h = unary_headers();
        h.insert("connect-protocol-version", HeaderValue::from_static("2"));
        assert_eq!(
            parse_unary::<Msg>(&h, b"{}").unwrap_err().code,
            Code::InvalidArgument
        );
        h.remove("connect-protocol-version");
        assert!(parse_unary::<Msg>(&h, b"{}").is_ok());
        h.insert("content-encoding", HeaderValue::from_static("gzip"));
        assert_eq!(
            parse_unary::<Msg>(&h, b"{}").unwrap_err().code,
            Code::Unimplemented
        );
        h.insert("content-encoding", HeaderValue::from_static("identity"));
        assert!(parse_unary::<Msg>(&h, b"{}").is_ok());
    }

    #[test]
    fn server_stream_request_is_exactly_one_envelope() {
        let body = encode_envelope(0, br#"{"path":"/a"}"#);
        let msg: Msg = parse_stream_request(&stream_headers(), &body).unwrap();
        assert_eq!(msg.path, "/a");

        let err = parse_stream_request::<Msg>(&unary_headers(), &body).unwrap_err();
        assert!(err.message.contains("application/connect+json"), "{err}");

        let err = parse_stream_request::<Msg>(&stream_headers(), b"").unwrap_err();
        assert!(err.message.contains("no message"), "{err}");

        let mut two = body.to_vec();
        two.extend_from_slice(&body);
        let err = parse_stream_request::<Msg>(&stream_headers(), &two).unwrap_err();
        assert!(err.message.contains("exactly one"), "{err}");

        let err = parse_stream_request::<Msg>(&stream_headers(), &body[..body.len() - 1]);
        assert!(err.unwrap_err().message.contains("truncated"));

        let err = parse_stream_request::<Msg>(&stream_headers(), &encode_end_stream(None));
        assert!(err.unwrap_err().message.contains("end-stream"));

        let err = parse_stream_request::<Msg>(
            &stream_headers(),
            &encode_envelope(FLAG_COMPRESSED, b"{}"),
        );
        assert_eq!(err.unwrap_err().code, Code::Unimplemented);

        let err = parse_stream_request::<Msg>(&stream_headers(), &encode_envelope(0, b"nope"));
        assert_eq!(err.unwrap_err().code, Code::InvalidArgument);

        let err = parse_stream_request::<Msg>(&stream_headers(), &[0, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(err.unwrap_err().code, Code::ResourceExhausted);

        let mut gz = stream_headers();
        gz.insert("connect-content-encoding", HeaderValue::from_static("gzip"));
        let err = parse_stream_request::<Msg>(&gz, &body).unwrap_err();
        assert_eq!(err.code, Code::Unimplemented);
    }

    #[test]
    fn timeout_header() {
        assert_eq!(parse_timeout_ms(&HeaderMap::new()).unwrap(), None);
        let t = |v: &'static str| parse_timeout_ms(&headers(&[("connect-timeout-ms", v)]));
        assert_eq!(t("60000").unwrap(), Some(60_000));
        assert_eq!(t("0").unwrap(), Some(0));
        assert_eq!(t("9999999999").unwrap(), Some(9_999_999_999));
        for bad in [
            "",
            "12345678901",
            "99999999999999999999999",
            "-1",
            "1.5",
            "1e3",
            " 5",
            "abc",
            "+5",
        ] {
            let err = t(bad).unwrap_err();
            assert_eq!(err.code, Code::InvalidArgument, "{bad:?}");
            assert!(err.message.contains("Connect-Timeout-Ms"));
        }
    }

    fn chunked_body(chunks: Vec<Vec<u8>>) -> Body {
        let stream = futures_util::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c))),
        );
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn client_stream_yields_messages_across_chunk_boundaries() {
        let mut all = Vec::new();
        for p in ["/a", "/b", "/c"] {
            all.extend_from_slice(&encode_envelope(
                0,
                format!(r#"{{"path":"{p}"}}"#).as_bytes(),
            ));
        }
        let chunks: Vec<Vec<u8>> = all.chunks(3).map(<[u8]>::to_vec).collect();
        let mut stream = ClientStream::<Msg>::new(&stream_headers(), chunked_body(chunks)).unwrap();
        let mut seen = Vec::new();
        while let Some(m) = stream.next().await.unwrap() {
            seen.push(m.path);
        }
        assert_eq!(seen, ["/a", "/b", "/c"]);
        assert!(stream.next().await.unwrap().is_none());
    }

    #[tokio::test]
    async fn client_stream_errors() {
        assert!(ClientStream::<Msg>::new(&unary_headers(), Body::empty()).is_err());

        let mut truncated = encode_envelope(0, b"{}").to_vec();
        truncated.extend_from_slice(&[0, 0, 0, 0, 9, b'{']);
        let mut s =
            ClientStream::<Msg>::new(&stream_headers(), chunked_body(vec![truncated])).unwrap();
        assert!(s.next().await.unwrap().is_some());
        assert!(s.next().await.unwrap_err().message.contains("truncated"));

        let body = chunked_body(vec![encode_end_stream(None).to_vec()]);
        let mut s = ClientStream::<Msg>::new(&stream_headers(), body).unwrap();
        assert!(s.next().await.unwrap_err().message.contains("end-stream"));

        let body = chunked_body(vec![encode_envelope(0, b"{oops").to_vec()]);
        let mut s = ClientStream::<Msg>::new(&stream_headers(), body).unwrap();
        assert_eq!(s.next().await.unwrap_err().code, Code::InvalidArgument);
    }

    #[tokio::test]
    async fn read_body_is_bounded() {
        let budget = crate::budget::Budget::new("request bodies", 25);
        let mut held = budget.reservation("t");
        let body = chunked_body(vec![vec![b'a'; 10], vec![b'b'; 10]]);
        assert_eq!(read_body(body, 20, &mut held).await.unwrap().len(), 20);
        drop(held);
        let mut held = budget.reservation("t");
        let body = chunked_body(vec![vec![b'a'; 10], vec![b'b'; 11]]);
        assert_eq!(
            read_body(body, 20, &mut held).await.unwrap_err().code,
            Code::ResourceExhausted
        );
        drop(held);
        // The team's budget: 20 bytes held, 10 more do not fit in 25.
        let mut held = budget.reservation("t");
        let body = chunked_body(vec![vec![b'a'; 20]]);
        read_body(body, 20, &mut held).await.unwrap();
        let mut more = budget.reservation("t");
        let err = read_body(chunked_body(vec![vec![b'c'; 10]]), 20, &mut more)
            .await
            .unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(err.message.contains("request bodies"), "{err}");
        let failing = Body::from_stream(futures_util::stream::iter([
            Ok(Bytes::from_static(b"x")),
            Err(std::io::Error::other("connection reset")),
        ]));
        let mut held = budget.reservation("u");
        let err = read_body(failing, 20, &mut held).await.unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(err.message.contains("connection reset"), "{err}");
    }
}
