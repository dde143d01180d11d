//! What the Connect services share: reading a request body within its bound, and the unary
//! call that is one call of the core.

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::Response;
use husk_core::agent::CallError;
use husk_core::calls::{Answer, User};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::Sandbox;
use crate::budget::Reservation;
use crate::connect::request::{MAX_STREAM_REQUEST_BODY, MAX_UNARY_BODY};
use crate::connect::{parse_unary, read_body, stream_error, unary_err, unary_ok, ConnectError};
use crate::envd::process::Empty;
use crate::envd::ToCall;

/// The Connect error for a failed agent call.
pub fn call_error(e: CallError) -> ConnectError {
    match e {
        CallError::Agent(a) => a.into(),
        CallError::Gone => ConnectError::unavailable("the sandbox was killed"),
    }
}

/// Reads a request body within the bound of its kind of call (one envelope for a
/// server-streaming call); a failure is answered the way that kind of call reports errors.
/// The bytes are reserved from the sandbox team's budget of buffered bodies (see
/// [`crate::budget`]) in `held`, to keep while they live.
pub async fn read_request(
    body: Body,
    streaming: bool,
    held: &mut Reservation,
) -> Result<Bytes, Response> {
    let limit = if streaming {
        MAX_STREAM_REQUEST_BODY
    } else {
        MAX_UNARY_BODY
    };
    read_body(body, limit, held).await.map_err(|e| {
        if streaming {
            stream_error(e)
        } else {
            unary_err(e)
        }
    })
}

/// A unary call: parse `T`, convert it to its call on behalf of `user`, call, and turn the
/// answer into the response message (the core has checked that the answer is of the call's
/// kind; `None` only if a handler pairs a call with the wrong conversion).
pub async fn unary_call<T, R>(
    sb: &Sandbox,
    headers: &HeaderMap,
    body: &[u8],
    user: User,
    answer: fn(Answer) -> Option<R>,
) -> Response
where
    T: DeserializeOwned + ToCall,
    R: Serialize,
{
    let call = match parse_unary::<T>(headers, body).and_then(|r| r.into_call(user)) {
        Ok(c) => c,
        Err(e) => return unary_err(e),
    };
    match sb.call(call).await {
        Ok(a) => match answer(a) {
            Some(msg) => unary_ok(&msg),
            None => unary_err(ConnectError::internal("unexpected answer to the call")),
        },
        Err(e) => unary_err(call_error(e)),
    }
}

/// For calls answered by `Done` (or, for an update without a terminal, by finding the
/// process): the empty message.
pub fn empty(_: Answer) -> Option<Empty> {
    Some(Empty {})
}
