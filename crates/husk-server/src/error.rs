//! The one error answer of husk's REST API and E2B's control plane: each error kind of the core
//! maps to its status here (and nowhere else), the message is the error's whole chain of
//! causes, and transient conditions say when to retry.
//!
//! The in-sandbox API answers in its own formats (Connect errors, `/files`' JSON): see
//! `crate::connect` and `crate::files`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use husk_core::manager::CoreError;
use husk_core::runs::RunError;
use husk_core::secrets::SecretError;
use husk_core::store::StoreError;
use husk_core::volumes::VolumeError;
use husk_core::workspaces::WorkspaceError;
use serde_json::json;

use crate::transfers::Busy;

/// An error answer: `{"code": N, "message": "..."}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// Seconds after which the same request may succeed (`Retry-After`, and SDKs may retry).
    retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            retry_after: None,
        }
    }

    /// `status` for `e`, with `e`'s whole chain of causes as the message.
    fn of(status: StatusCode, e: &(dyn std::error::Error + 'static)) -> ApiError {
        ApiError::new(status, husk_core::error_chain(e))
    }

    pub(crate) fn retry_after(mut self, seconds: u32) -> ApiError {
        self.retry_after = Some(seconds);
        self
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// As an item of a list answer (E2B's per-fork `error`): `{"code", "message"}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({"code": self.status.as_u16(), "message": self.message})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (
            self.status,
            axum::Json(json!({"code": self.status.as_u16(), "message": self.message})),
        )
            .into_response();
        let headers = resp.headers_mut();
        match self.retry_after {
            Some(seconds) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
                // The SDKs retry a 5xx only when told to.
                if self.status.is_server_error() {
                    headers.insert("should-retry", HeaderValue::from_static("true"));
                }
            }
            // Without a time to retry after, the same request fails the same way: the SDKs
            // must not repeat it (a quota, a broken template, a bug).
            None if self.status.is_server_error()
                || self.status == StatusCode::TOO_MANY_REQUESTS =>
            {
                headers.insert("should-retry", HeaderValue::from_static("false"));
            }
            None => {}
        }
        resp
    }
}

/// A handler's error answer, from any error the API knows (`.map_err(answer)?`).
pub fn answer(e: impl Into<ApiError>) -> Response {
    e.into().into_response()
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> ApiError {
        if let CoreError::Store(s) = &e {
            if s.is_unavailable() {
                return ApiError::store_unavailable(s);
            }
        }
        let status = match &e {
            CoreError::NotFound(_)
            | CoreError::Lost { .. }
            | CoreError::TemplateNotFound(_)
            | CoreError::WorkspaceNotFound(_) => StatusCode::NOT_FOUND,
            CoreError::QuotaExceeded { .. }
            | CoreError::PausedQuotaExceeded { .. }
            | CoreError::SnapshotQuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            CoreError::Paused(_) => StatusCode::CONFLICT,
            CoreError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
            CoreError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
            CoreError::Runtime(_)
            | CoreError::Internal { .. }
            | CoreError::Store(_)
            | CoreError::TemplateBroken(_) => StatusCode::INTERNAL_SERVER_ERROR,
            CoreError::HostMemoryLow { .. } | CoreError::HostExhausted(_) => {
                return ApiError::of(StatusCode::SERVICE_UNAVAILABLE, &e).retry_after(5);
            }
        };
        ApiError::of(status, &e)
    }
}

impl From<RunError> for ApiError {
    fn from(e: RunError) -> ApiError {
        if let RunError::Store(s) = &e {
            if s.is_unavailable() {
                return ApiError::store_unavailable(s);
            }
        }
        let status = match &e {
            RunError::Invalid(_) => StatusCode::BAD_REQUEST,
            RunError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            RunError::WorkspaceNotFound(_)
            | RunError::SecretNotFound(_)
            | RunError::TemplateNotFound(_)
            | RunError::NotFound(_) => StatusCode::NOT_FOUND,
            RunError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            RunError::TooMany(_) => StatusCode::TOO_MANY_REQUESTS,
            RunError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::of(status, &e)
    }
}

impl From<SecretError> for ApiError {
    fn from(e: SecretError) -> ApiError {
        if let SecretError::Store(s) = &e {
            if s.is_unavailable() {
                return ApiError::store_unavailable(s);
            }
        }
        let status = match &e {
            SecretError::NotFound(_) => StatusCode::NOT_FOUND,
            SecretError::Exists(_) => StatusCode::CONFLICT,
            SecretError::InvalidName(_) | SecretError::Nul(_) | SecretError::BadMetadata { .. } => {
                StatusCode::BAD_REQUEST
            }
            SecretError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            SecretError::Store(StoreError::InvalidTeam(_)) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::of(status, &e)
    }
}

impl From<WorkspaceError> for ApiError {
    fn from(e: WorkspaceError) -> ApiError {
        use WorkspaceError as E;
        let status = match &e {
            E::NotFound(_) | E::PathNotFound { .. } => StatusCode::NOT_FOUND,
            E::AlreadyExists(_) | E::Conflict { .. } => StatusCode::CONFLICT,
            E::InvalidName(_)
            | E::InvalidTeam(_)
            | E::InvalidPath { .. }
            | E::NotAFile { .. }
            | E::NotADirectory { .. }
            | E::BadArchive { .. }
            | E::TooDeep { .. } => StatusCode::BAD_REQUEST,
            E::TooLarge { .. } | E::TooManyEntries { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            E::QuotaExceeded { .. } => StatusCode::INSUFFICIENT_STORAGE,
            // The files helper is gone: nothing this server can do answers until it is back.
            E::Helper(husk_core::workspaces::HelperError::Gone(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            E::TeamUnavailable { .. } | E::Io { .. } | E::Helper(_) => {
                tracing::warn!(error = %husk_core::error_chain(&e), "workspace operation failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        ApiError::of(status, &e)
    }
}

impl From<VolumeError> for ApiError {
    fn from(e: VolumeError) -> ApiError {
        match e {
            VolumeError::NotFound(_) => ApiError::of(StatusCode::NOT_FOUND, &e),
            VolumeError::BadToken => ApiError::of(StatusCode::UNAUTHORIZED, &e),
            VolumeError::Workspace(w) => w.into(),
            VolumeError::Store(s) => s.into(),
            VolumeError::Secret(s) => s.into(),
            VolumeError::Id(_) => ApiError::of(StatusCode::SERVICE_UNAVAILABLE, &e).retry_after(1),
        }
    }
}

/// What a client is told when the database cannot be reached: that, and when to retry; never
/// where the database is or why it failed (the log says, for the operator).
pub const STORE_UNAVAILABLE: &str = "the database is unavailable; retry shortly";

impl ApiError {
    /// A 503 for a store that cannot answer now (see [`STORE_UNAVAILABLE`]); logs why.
    pub fn store_unavailable(e: &StoreError) -> ApiError {
        tracing::warn!(error = %husk_core::error_chain(e), "the store is unavailable");
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, STORE_UNAVAILABLE).retry_after(1)
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> ApiError {
        // The state helper is gone, or the database cannot be reached: nothing this server
        // can do answers until it is back, and a retry later may succeed.
        if e.is_unavailable() {
            return ApiError::store_unavailable(&e);
        }
        let status = match &e {
            StoreError::InvalidTeam(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError::of(status, &e)
    }
}

/// The server (or the team) has as many transfers running as it may: retry in a second.
impl From<Busy> for ApiError {
    fn from(e: Busy) -> ApiError {
        let status = match e {
            Busy::Team { .. } | Busy::Server { .. } => StatusCode::TOO_MANY_REQUESTS,
            Busy::Thread(_) | Busy::Lost => StatusCode::SERVICE_UNAVAILABLE,
        };
        // The whole chain: the OS's reason a thread could not start is the operator's clue.
        ApiError::of(status, &e).retry_after(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(e: impl Into<ApiError>) -> (StatusCode, Option<String>, Option<String>) {
        let resp = answer(e);
        let h = |n: &str| {
            resp.headers()
                .get(n)
                .map(|v| v.to_str().unwrap().to_owned())
        };
        (resp.status(), h("retry-after"), h("should-retry"))
    }

    #[test]
    fn transient_conditions_say_when_to_retry_and_others_say_never() {
        let low = CoreError::HostMemoryLow {
            available: 1,
            reserve: 2,
        };
        assert_eq!(
            headers(low),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("5".into()),
                Some("true".into())
            )
        );
        let quota = CoreError::QuotaExceeded {
            team: "t".into(),
            limit: 1,
        };
        assert_eq!(
            headers(quota),
            (StatusCode::TOO_MANY_REQUESTS, None, Some("false".into()))
        );
        let broken = CoreError::TemplateBroken("damaged".into());
        assert_eq!(
            headers(broken),
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                None,
                Some("false".into())
            )
        );
        assert_eq!(
            headers(CoreError::NotFound("x".into())),
            (StatusCode::NOT_FOUND, None, None)
        );
    }

    /// An unreachable database is a 503 to retry, from whichever error carries it, and says
    /// nothing of where the database is (the log does).
    #[tokio::test]
    async fn an_unavailable_store_is_a_503_that_names_nothing_inside() {
        let down =
            || StoreError::Unavailable("postgres://husk@db.internal:5432/husk: refused".into());
        let answers: Vec<ApiError> = vec![
            down().into(),
            CoreError::Store(down()).into(),
            RunError::Store(down()).into(),
            SecretError::Store(down()).into(),
        ];
        for e in answers {
            let resp = e.into_response();
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(resp.headers()["retry-after"], "1");
            let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
                .await
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["message"], STORE_UNAVAILABLE);
        }
        // Any other store failure stays a 500.
        assert_eq!(
            headers(StoreError::Corrupt("x".into())).0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[tokio::test]
    async fn the_message_is_the_whole_chain() {
        let e = CoreError::internal(
            "opening the sandbox's network namespace",
            // ENOENT (2 on Linux): the OS's own words end the chain.
            std::io::Error::from_raw_os_error(2),
        );
        let resp = answer(e);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["code"], 500);
        let msg = v["message"].as_str().unwrap();
        assert!(
            msg.starts_with("opening the sandbox's network namespace: ")
                && msg.contains("No such file"),
            "{msg}"
        );
    }
}
