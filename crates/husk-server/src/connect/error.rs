//! Connect error codes and the error type every Connect helper returns.
//!
//! A unary call that fails answers with the HTTP status the Connect specification assigns to
//! the code and a JSON body `{"code":"not_found","message":"..."}`; a streaming call carries the
//! same object inside its end-stream envelope (see [`super::envelope::encode_end_stream`]).

use std::fmt;

use axum::http::StatusCode;
use husk_core::calls::{AgentError, ErrorKind};
use serde::{Deserialize, Serialize};

/// The Connect error codes, serialized as their snake_case names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    Canceled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl Code {
    /// Every code, in the order of their gRPC numbers (1..=16).
    pub const ALL: [Code; 16] = [
        Code::Canceled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    /// The wire name, e.g. `not_found`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Canceled => "canceled",
            Code::Unknown => "unknown",
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Aborted => "aborted",
            Code::OutOfRange => "out_of_range",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
        }
    }

    /// Parses a wire name; `None` for anything that is not a Connect code.
    pub fn from_name(name: &str) -> Option<Code> {
        Code::ALL.into_iter().find(|c| c.as_str() == name)
    }

    /// The HTTP status of a unary error response with this code (Connect specification,
    /// "Error Codes"). `canceled` uses nginx's 499 "client closed request", as the spec does.
    pub fn http_status(self) -> StatusCode {
        let status = match self {
            Code::Canceled => 499,
            Code::Unknown => 500,
            Code::InvalidArgument => 400,
            Code::DeadlineExceeded => 504,
            Code::NotFound => 404,
            Code::AlreadyExists => 409,
            Code::PermissionDenied => 403,
            Code::ResourceExhausted => 429,
            Code::FailedPrecondition => 400,
            Code::Aborted => 409,
            Code::OutOfRange => 400,
            Code::Unimplemented => 501,
            Code::Internal => 500,
            Code::Unavailable => 503,
            Code::DataLoss => 500,
            Code::Unauthenticated => 401,
        };
        // Every number above is a valid status code (100..=999), so the fallback is unreachable.
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed Connect call: a code and a human-readable message.
///
/// Serializes to the Connect error object `{"code":"...","message":"..."}` (the message is
/// left out when empty, as the spec allows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ConnectError {
    pub code: Code,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// In a stream: break the response off instead of ending it with this error (see
    /// [`ConnectError::sandbox_gone`]).
    #[serde(skip)]
    pub break_off: bool,
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            break_off: false,
        }
    }

    /// The sandbox went away (killed, timed out) while a stream was open. E2B's clients learn
    /// this from the connection breaking off mid-stream (the sandbox's VM is gone), after which
    /// they probe the sandbox and report it killed; a stream here breaks off the same way. As
    /// a unary answer it is `unavailable`.
    pub fn sandbox_gone() -> Self {
        ConnectError {
            break_off: true,
            ..ConnectError::unavailable("the sandbox was killed")
        }
    }

    pub fn invalid_argument(message: impl Into<String>) -> Self {
        ConnectError::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        ConnectError::new(Code::NotFound, message)
    }

    pub fn unauthenticated(message: impl Into<String>) -> Self {
        ConnectError::new(Code::Unauthenticated, message)
    }

    pub fn unimplemented(message: impl Into<String>) -> Self {
        ConnectError::new(Code::Unimplemented, message)
    }

    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        ConnectError::new(Code::ResourceExhausted, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ConnectError::new(Code::Internal, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        ConnectError::new(Code::Unavailable, message)
    }

    /// The HTTP status of this error as a unary response.
    pub fn http_status(&self) -> StatusCode {
        self.code.http_status()
    }

    /// The JSON error object, as bytes (`{"code":"...","message":"..."}`).
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing a struct of two strings cannot fail; the fallback keeps this total.
        serde_json::to_vec(self).unwrap_or_else(|_| br#"{"code":"internal"}"#.to_vec())
    }
}

/// The agent's error kinds map onto the Connect codes the SDKs act on: `not_found` becomes
/// `FileNotFoundException`/`False`, `already_exists` makes `make_dir()` return `False`.
impl From<AgentError> for ConnectError {
    fn from(err: AgentError) -> Self {
        let code = match err.kind {
            ErrorKind::NotFound => Code::NotFound,
            ErrorKind::AlreadyExists => Code::AlreadyExists,
            ErrorKind::InvalidArgument => Code::InvalidArgument,
            ErrorKind::PermissionDenied => Code::PermissionDenied,
            ErrorKind::NoSpace | ErrorKind::ResourceExhausted => Code::ResourceExhausted,
            ErrorKind::Internal => Code::Internal,
        };
        ConnectError::new(code, err.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_serialize_as_snake_case() {
        for code in Code::ALL {
            assert_eq!(Code::from_name(code.as_str()), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
        assert_eq!(Code::from_name("NOT_FOUND"), None);
        assert_eq!(Code::from_name(""), None);
    }

    #[test]
    fn http_status_follows_the_connect_spec() {
        let expected = [
            (Code::Canceled, 499),
            (Code::Unknown, 500),
            (Code::InvalidArgument, 400),
            (Code::DeadlineExceeded, 504),
            (Code::NotFound, 404),
            (Code::AlreadyExists, 409),
            (Code::PermissionDenied, 403),
            (Code::ResourceExhausted, 429),
            (Code::FailedPrecondition, 400),
            (Code::Aborted, 409),
            (Code::OutOfRange, 400),
            (Code::Unimplemented, 501),
            (Code::Internal, 500),
            (Code::Unavailable, 503),
            (Code::DataLoss, 500),
            (Code::Unauthenticated, 401),
        ];
        for (code, status) in expected {
            assert_eq!(code.http_status().as_u16(), status, "{code}");
        }
    }

    #[test]
    fn error_json_body() {
        let err = ConnectError::not_found("process with pid 7 not found");
        assert_eq!(
            String::from_utf8(err.to_json()).unwrap(),
            r#"{"code":"not_found","message":"process with pid 7 not found"}"#
        );
        let bare = ConnectError::new(Code::Internal, "");
        assert_eq!(
            String::from_utf8(bare.to_json()).unwrap(),
            r#"{"code":"internal"}"#
        );
        let parsed: ConnectError = serde_json::from_str(r#"{"code":"unavailable"}"#).unwrap();
        assert_eq!(parsed, ConnectError::unavailable(""));
        assert_eq!(err.to_string(), "not_found: process with pid 7 not found");
    }

    #[test]
    fn agent_errors_map_to_connect_codes() {
        let cases = [
            (ErrorKind::NotFound, Code::NotFound),
            (ErrorKind::AlreadyExists, Code::AlreadyExists),
            (ErrorKind::InvalidArgument, Code::InvalidArgument),
            (ErrorKind::PermissionDenied, Code::PermissionDenied),
            (ErrorKind::NoSpace, Code::ResourceExhausted),
            (ErrorKind::ResourceExhausted, Code::ResourceExhausted),
            (ErrorKind::Internal, Code::Internal),
        ];
        for (kind, code) in cases {
            let err = ConnectError::from(AgentError::new(kind, "why"));
            assert_eq!(err, ConnectError::new(code, "why"));
        }
    }
}
