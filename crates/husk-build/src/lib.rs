//! husk's template builds. A template is built from husk's TOML spec ([`spec`]) or a
//! Dockerfile ([`dockerfile`]), both parsed into one [`plan::BuildPlan`]; its base is a Debian
//! suite ([`debian`], mmdebstrap), an OCI image ([`oci`]) or another template; every step runs
//! in a build sandbox ([`sandbox_step`]) and its result is a layer cached by the hash of
//! everything it depends on ([`layers`]); the merged layers become one erofs image
//! ([`image`]) registered in the store ([`build`]).
#![forbid(unsafe_code)]

mod accounts;
pub mod build;
pub mod context;
mod context_hash;
pub mod debian;
pub mod dockerfile;
pub mod e2b;
pub mod e2b_files;
pub mod events;
pub mod finalize;
pub mod helper;
pub mod image;
pub mod image_files;
pub mod layers;
pub mod oci;
pub mod plan;
pub mod request;
pub mod sandbox_step;
pub mod spec;
#[cfg(test)]
mod testutil;

use std::time::Duration;

/// How a step ended (successfully).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepOutcome {
    /// Its layer came from the cache.
    Cached,
    /// It ran, taking this long.
    Built(Duration),
}

/// Where a build reports what it does (the CLI draws it; the HTTP API streams it).
pub trait Progress: Send + Sync {
    /// Step `index` of `total` (1-based) starts.
    fn step_start(&self, index: usize, total: usize, display: &str);
    /// Output of the running step (raw bytes, not split into lines).
    fn log(&self, bytes: &[u8]);
    /// Step `index` is done.
    fn step_done(&self, index: usize, outcome: StepOutcome);
    /// Pulling a base image.
    fn pull(&self, p: &oci::PullProgress);
    /// Anything else worth a line.
    fn message(&self, text: &str);
}
