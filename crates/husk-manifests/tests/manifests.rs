//! husk's Kubernetes manifests (`deploy/kubernetes`) and image (`deploy/Dockerfile`), checked
//! against the Kubernetes API types, the real husk binary and each other. See each module of
//! `checks` for what it holds.

mod checks;
mod support;
