//! husk's HTTP adapters: the E2B-compatible control plane ([`rest`]), templates ([`templates`]:
//! husk's operator API and E2B's template list) and the per-sandbox API ([`sandbox`]:
//! Connect-JSON process and filesystem services, `/files`), on one listener ([`app`], whose connections [`listener`] bounds).
//! Handlers parse requests into the core's typed calls; they hold no state of their own.
#![forbid(unsafe_code)]
pub mod app;
pub mod body;
pub mod budget;
pub mod cluster;
pub mod domain;
pub mod e2b_secrets;
pub mod listener;
pub mod net_rules;
pub mod node_images;
pub mod openapi;
pub mod pools;
pub mod prometheus;
pub mod ration;
pub mod reread;
pub(crate) mod rest;
pub mod runs;
pub mod sandbox;
pub mod secrets;
pub mod snapshots;
pub mod templates;
pub mod tls;
pub mod transfers;
mod upload;
pub mod volumes;
pub mod workspaces;

pub use app::{serve, AppState};
pub use listener::ConnLimits;
pub mod connect;
pub mod envd;
pub mod error;
pub mod files;
pub mod gateway;
