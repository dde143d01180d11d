//! Building Connect responses as axum [`Response`]s.
//!
//! Unary: `200` + `application/json` with the message, or the code's HTTP status with the
//! error object. Streaming: `200` + `application/connect+json` with one envelope per message and
//! exactly one end-stream envelope at the end, carrying the error if the stream failed: the
//! SDK's reader rejects a stream that ends without it.

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::Stream;
use serde::Serialize;

use super::envelope::{encode_end_stream, encode_envelope};
use super::error::ConnectError;
use super::request::{STREAM_CONTENT_TYPE, UNARY_CONTENT_TYPE};

/// A successful unary response with `msg` as its JSON body.
pub fn unary_ok<T: Serialize + ?Sized>(msg: &T) -> Response {
    match serde_json::to_vec(msg) {
        Ok(json) => json_response(StatusCode::OK, UNARY_CONTENT_TYPE, Body::from(json)),
        Err(err) => unary_err(ConnectError::internal(format!(
            "encoding the response: {err}"
        ))),
    }
}

/// A failed unary response: the code's HTTP status and `{"code":..,"message":..}`.
pub fn unary_err(err: ConnectError) -> Response {
    json_response(
        err.http_status(),
        UNARY_CONTENT_TYPE,
        Body::from(err.to_json()),
    )
}

impl IntoResponse for ConnectError {
    /// The unary error response; streaming handlers use [`stream_error`] instead.
    fn into_response(self) -> Response {
        unary_err(self)
    }
}

/// A streaming response: each `Ok` message becomes an envelope; the first `Err`, or the end of
/// `messages`, becomes the end-stream envelope (or, for an error that breaks off, the end of
/// the connection), after which `messages` is dropped and never polled again. If the client
/// goes away, the body (and with it `messages`) is dropped.
pub fn stream_response<S, T>(messages: S) -> Response
where
    S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
    T: Serialize + 'static,
{
    let body = Body::from_stream(EnvelopeStream::new(messages));
    json_response(StatusCode::OK, STREAM_CONTENT_TYPE, body)
}

/// A streaming call that failed before producing anything (bad request, unknown process): a
/// `200` whose body is only the end-stream envelope with the error, as Connect streams report
/// errors.
pub fn stream_error(err: ConnectError) -> Response {
    let body = Body::from(encode_end_stream(Some(&err)));
    json_response(StatusCode::OK, STREAM_CONTENT_TYPE, body)
}

fn json_response(status: StatusCode, content_type: &'static str, body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// The messages of a streaming response, boxed so [`EnvelopeStream`] is `Unpin`.
type Messages<T> = Pin<Box<dyn Stream<Item = Result<T, ConnectError>> + Send>>;

/// Frames a stream of messages as envelopes and appends the end-stream envelope exactly once.
pub struct EnvelopeStream<T> {
    /// `None` once the end-stream envelope was produced.
    inner: Option<Messages<T>>,
}

impl<T> EnvelopeStream<T> {
    pub fn new<S>(messages: S) -> Self
    where
        S: Stream<Item = Result<T, ConnectError>> + Send + 'static,
    {
        EnvelopeStream {
            inner: Some(Box::pin(messages)),
        }
    }
}

impl<T: Serialize> Stream for EnvelopeStream<T> {
    type Item = Result<Bytes, std::io::Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let end = match inner.as_mut().poll_next(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Some(Ok(msg))) => match serde_json::to_vec(&msg) {
                Ok(json) => return Poll::Ready(Some(Ok(encode_envelope(0, &json)))),
                Err(err) => Some(ConnectError::internal(format!(
                    "encoding a stream message: {err}"
                ))),
            },
            Poll::Ready(Some(Err(err))) if err.break_off => {
                // An error item makes the server abort the response: HTTP/1.1 closes the
                // connection before the body's end, HTTP/2 resets the stream.
                this.inner = None;
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    err.message,
                ))));
            }
            Poll::Ready(Some(Err(err))) => Some(err),
            Poll::Ready(None) => None,
        };
        this.inner = None;
        Poll::Ready(Some(Ok(encode_end_stream(end.as_ref()))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::envelope::EnvelopeDecoder;
    use crate::connect::Code;
    use futures_util::stream;
    use http_body_util::BodyExt;
    use serde_json::{json, Value};

    async fn body_bytes(response: Response) -> Bytes {
        response.into_body().collect().await.unwrap().to_bytes()
    }

    async fn envelopes(response: Response) -> Vec<(u8, Value)> {
        let bytes = body_bytes(response).await;
        let mut dec = EnvelopeDecoder::new();
        dec.feed(&bytes).unwrap();
        dec.finish().unwrap();
        let mut out = Vec::new();
        while let Some(e) = dec.next_envelope() {
            out.push((e.flags, serde_json::from_slice(&e.data).unwrap()));
        }
        out
    }

    #[tokio::test]
    async fn unary_responses() {
        let ok = unary_ok(&json!({"entry":{"name":"a"}}));
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(ok.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(&body_bytes(ok).await[..], br#"{"entry":{"name":"a"}}"#);

        let err = unary_err(ConnectError::not_found("path '/x' does not exist"));
        assert_eq!(err.status(), StatusCode::NOT_FOUND);
        assert_eq!(err.headers()[header::CONTENT_TYPE], "application/json");
        let body: Value = serde_json::from_slice(&body_bytes(err).await).unwrap();
        assert_eq!(
            body,
            json!({"code":"not_found","message":"path '/x' does not exist"})
        );

        let via_trait = ConnectError::unauthenticated("who?").into_response();
        assert_eq!(via_trait.status(), StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn stream_ends_with_empty_end_stream() {
        let messages = stream::iter([Ok(json!({"event":{"start":{"pid":1}}})), Ok(json!({}))]);
        let response = stream_response(messages);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/connect+json"
        );
        let got = envelopes(response).await;
        assert_eq!(
            got,
            vec![
                (0, json!({"event":{"start":{"pid":1}}})),
                (0, json!({})),
                (2, json!({})),
            ]
        );
    }

    #[tokio::test]
    async fn stream_error_ends_once_and_stops_polling() {
        let messages = stream::iter([
            Ok(json!({"n":1})),
            Err(ConnectError::not_found("gone")),
            Ok(json!({"n":2})),
            Err(ConnectError::internal("never seen")),
        ]);
        let got = envelopes(stream_response(messages)).await;
        assert_eq!(
            got,
            vec![
                (0, json!({"n":1})),
                (2, json!({"error":{"code":"not_found","message":"gone"}})),
            ]
        );
    }

    #[tokio::test]
    async fn a_gone_sandbox_breaks_the_stream_off_without_its_end() {
        use futures_util::StreamExt;
        let mut s = EnvelopeStream::new(stream::iter([
            Ok(json!({"n":1})),
            Err(ConnectError::sandbox_gone()),
            Ok(json!({"n":2})),
        ]));
        let first = s.next().await.unwrap().unwrap();
        assert_eq!(first[0], 0, "a message envelope");
        let err = s.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionAborted);
        assert!(
            s.next().await.is_none(),
            "no end-stream envelope, nothing after"
        );
        // Through a response body: the client sees the body fail, never its end.
        let body = stream_response(stream::iter([
            Ok(json!({"n":1})),
            Err(ConnectError::sandbox_gone()),
        ]))
        .into_body();
        assert!(body.collect().await.is_err());
        // As a unary answer it is an ordinary `unavailable`.
        let unary = unary_err(ConnectError::sandbox_gone());
        assert_eq!(unary.status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[tokio::test]
    async fn empty_stream_and_early_error() {
        let got = envelopes(stream_response(
            stream::empty::<Result<Value, ConnectError>>(),
        ))
        .await;
        assert_eq!(got, vec![(2, json!({}))]);

        let response = stream_error(ConnectError::invalid_argument("bad"));
        assert_eq!(response.status(), StatusCode::OK);
        let got = envelopes(response).await;
        assert_eq!(
            got,
            vec![(
                2,
                json!({"error":{"code":"invalid_argument","message":"bad"}})
            )]
        );
    }

    #[tokio::test]
    async fn envelope_stream_yields_none_after_end() {
        use futures_util::StreamExt;
        let mut s = EnvelopeStream::new(stream::iter([Ok::<_, ConnectError>(1u32)]));
        let mut items = Vec::new();
        while let Some(item) = s.next().await {
            items.push(item.unwrap());
        }
        assert_eq!(items.len(), 2);
        assert_eq!(&items[0][..], b"\x00\x00\x00\x00\x011");
        assert_eq!(items[1][0], 2);
        // Polling again after the end stays at the end.
        assert!(s.next().await.is_none());
        assert_eq!(Code::Internal.as_str(), "internal");
    }
}
