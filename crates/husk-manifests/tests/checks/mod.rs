//! The checks, by subject. Each collects every problem it finds before failing, so that one
//! run shows them all.

mod flags;
mod kubectl;
mod metrics;
mod network;
mod objects;
mod rollout;
mod security;
mod tls;
mod wiring;
mod workspaces;

/// Fails with every problem in `errors`, one a line, under `what`.
fn assert_none(what: &str, errors: impl IntoIterator<Item = String>) {
    let errors: std::collections::BTreeSet<String> = errors.into_iter().collect();
    assert!(
        errors.is_empty(),
        "{what}:\n  {}",
        errors.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}
