//! Sandbox networking. A sandbox has its own network namespace; one that may go out gets a link
//! into husk's router namespace, where nftables enforce its egress policy (see
//! `docs/design.md` §11). This crate holds what decides: the policy model ([`policy`]), the
//! ranges no policy can open ([`denied`]) and the nftables rules that enforce both ([`nft`]);
//! and what carries traffic: namespaces ([`netns`]), the per-sandbox state the resolver, the
//! domain proxy and the denial log share ([`sandboxes`]).
//!
//! Its syscalls go through the runtime's safe wrappers (`husk_runtime::sys`): no unsafe here.
#![forbid(unsafe_code)]

pub mod addressing;
pub mod ca;
pub mod cmd;
pub mod denied;
pub mod dns;
pub mod helper;
pub mod host_uplink;
pub mod intercept;
pub mod limit;
pub mod netns;
pub mod nflog;
pub mod nft;
pub mod policy;
pub mod probe;
pub mod proxy;
pub mod router;
pub mod rules;
pub mod sandboxes;
pub mod service;
pub mod sniff;
#[cfg(test)]
mod testutil;

pub use policy::{NetPolicy, PolicyError, Target};
pub use sandboxes::{Denial, SandboxNet, Sandboxes};
