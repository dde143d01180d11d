//! Tests of husk's Kubernetes manifests (`deploy/kubernetes`) and image (`deploy/Dockerfile`).
//!
//! This crate has no code of its own: `tests/manifests.rs` reads every manifest into its
//! Kubernetes API type (k8s-openapi) and checks it against the real `husk` binary (the flags and
//! `HUSK_*` variables each container passes must be in `husk <subcommand> --help`) and against
//! the other manifests (selectors, Secrets, probes, ports, privileges, network policies), and,
//! where `kubectl` is installed, its model of kustomize against `kubectl kustomize`, object by
//! object and field by field. It needs the binary built first: `HUSK_BIN`, else
//! `$CARGO_TARGET_DIR`'s `x86_64-unknown-linux-gnu/debug/husk`, else `target/`'s.
#![forbid(unsafe_code)]
