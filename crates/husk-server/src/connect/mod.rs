//! The Connect protocol with the JSON codec, as the E2B SDKs speak it to the in-sandbox API.
//!
//! Only what the SDKs use is implemented: unary calls (`application/json`, unframed bodies),
//! server streaming (`application/connect+json`, one enveloped request message, enveloped
//! responses ending with an end-stream envelope) and client streaming (a stream of enveloped
//! request messages). Compression is never negotiated, so compressed envelopes are refused.
//!
//! Everything here is pure protocol: no routing and no server state. Handlers call
//! [`request`] to decode what the client sent and [`response`] to build what goes back; every
//! failure is a [`ConnectError`], the one error type of this module.

pub mod envelope;
pub mod error;
pub mod request;
pub mod response;

pub use envelope::{encode_end_stream, encode_envelope, Envelope, EnvelopeDecoder};
pub use error::{Code, ConnectError};
pub use request::{parse_stream_request, parse_timeout_ms, parse_unary, read_body, ClientStream};
pub use response::{stream_error, stream_response, unary_err, unary_ok};
