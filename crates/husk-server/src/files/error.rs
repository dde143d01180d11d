//! The error of the plain HTTP endpoints: a status and a message, answered as
//! `{"code":<status>,"message":"..."}` (envd's shape; the SDKs show `message`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The message envd answers when a request lacks a valid access token.
pub const UNAUTHORIZED_ACCESS: &str =
    "unauthorized access, please provide a valid access token or method signing if supported";

/// A failed request to a plain HTTP endpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct FilesError {
    pub status: StatusCode,
    pub message: String,
}

impl FilesError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        FilesError {
            status,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn unauthorized(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::UNAUTHORIZED, message)
    }

    /// A request without a valid access token (or signature, where one is accepted).
    pub fn unauthorized_access() -> Self {
        FilesError::unauthorized(UNAUTHORIZED_ACCESS)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::NOT_FOUND, message)
    }

    pub fn not_acceptable(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::NOT_ACCEPTABLE, message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// The sandbox's disk is full (envd answers 507).
    pub fn insufficient_storage(message: impl Into<String>) -> Self {
        FilesError::new(StatusCode::INSUFFICIENT_STORAGE, message)
    }

    /// The JSON body, `{"code":N,"message":"..."}`.
    pub fn body(&self) -> Vec<u8> {
        error_body(self.status, &self.message)
    }
}

impl IntoResponse for FilesError {
    fn into_response(self) -> Response {
        let body = self.body();
        json_response(self.status, body)
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    code: u16,
    message: &'a str,
}

/// `{"code":N,"message":"..."}` for `status`.
pub fn error_body(status: StatusCode, message: &str) -> Vec<u8> {
    let body = ErrorBody {
        code: status.as_u16(),
        message,
    };
    // A number and a string always serialize; the fallback keeps this total.
    serde_json::to_vec(&body).unwrap_or_else(|_| br#"{"code":500}"#.to_vec())
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SandboxNotFound<'a> {
    sandbox_id: &'a str,
    message: &'a str,
    code: u16,
}

/// The `502` for a sandbox that does not exist (or no longer does). The SDK recognises it by
/// the status and `"was not found"` in the message, e.g. to report a killed sandbox.
pub fn sandbox_not_found(sandbox_id: &str) -> Response {
    let body = SandboxNotFound {
        sandbox_id,
        message: "The sandbox was not found",
        code: 502,
    };
    let json = serde_json::to_vec(&body).unwrap_or_else(|_| br#"{"code":502}"#.to_vec());
    json_response(StatusCode::BAD_GATEWAY, json)
}

fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    let mut response = Response::new(axum::body::Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    async fn body(response: Response) -> String {
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn error_response_shape() {
        let err = FilesError::not_found("path '/nope' does not exist");
        assert_eq!(
            err.to_string(),
            "404 Not Found: path '/nope' does not exist"
        );
        let response = err.into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        assert_eq!(
            body(response).await,
            r#"{"code":404,"message":"path '/nope' does not exist"}"#
        );
        let quoted = FilesError::bad_request("bad \"path\"\n");
        assert_eq!(
            String::from_utf8(quoted.body()).unwrap(),
            r#"{"code":400,"message":"bad \"path\"\n"}"#
        );
        assert_eq!(
            String::from_utf8(FilesError::unauthorized_access().body()).unwrap(),
            format!(r#"{{"code":401,"message":"{UNAUTHORIZED_ACCESS}"}}"#)
        );
        assert_eq!(
            FilesError::insufficient_storage("full").status.as_u16(),
            507
        );
    }

    #[tokio::test]
    async fn sandbox_not_found_body() {
        let response = sandbox_not_found("abc123");
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(
            body(response).await,
            r#"{"sandboxId":"abc123","message":"The sandbox was not found","code":502}"#
        );
    }
}
