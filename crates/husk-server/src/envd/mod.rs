//! The in-sandbox API's Connect services, `process.Process` and `filesystem.Filesystem`, as
//! proto3-JSON messages, plus their conversions to and from the agent protocol.
//!
//! The message types are husk's own, written from the documented wire facts: field names,
//! numbers and shapes are interface facts the SDKs depend on. [`wire`] holds the proto3-JSON
//! scalar encodings, [`process`] and [`filesystem`] the messages, [`convert`] the validated
//! conversions, and [`auth`] how a call names its user. Errors are
//! [`ConnectError`](crate::connect::ConnectError)s, ready to send.

pub mod auth;
pub mod convert;
pub mod filesystem;
pub mod process;
pub mod wire;

pub use convert::ToCall;
