//! Pure helpers for envd's plain HTTP file endpoints, `GET /files` (download) and
//! `POST /files` (upload).
//!
//! Nothing here touches the sandbox: handlers parse the query ([`query`]), authorize the call
//! ([`auth`]), negotiate the response ([`range`], [`encoding`], [`disposition`]), read uploads
//! ([`multipart`], [`metadata`]) and answer errors as `{"code":N,"message":"..."}`
//! ([`error`]), the shape the SDKs read from these endpoints.

pub mod auth;
pub mod disposition;
pub mod encoding;
pub mod error;
pub mod gzip;
pub mod metadata;
pub mod multipart;
pub mod query;
pub mod range;
pub mod upload;

pub use auth::{authorize, sign, verify_signature, FilesAuthError, Operation};
pub use error::{sandbox_not_found, FilesError};
pub use query::FilesQuery;
