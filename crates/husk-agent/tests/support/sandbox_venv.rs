//! The venv that end-to-end tests run a real ipykernel from inside host-template sandboxes.
//! Shared by husk-agent's and husk's tests (included with `#[path]`).
//!
//! Made by `scripts/jupyter-test-venv` with the host's `/usr/bin/python3`, not whatever
//! `python3` comes first on `PATH`: the venv's `bin/python` links to its interpreter, which
//! must be under `/usr`, the part of the host the host template shows. Tests mount it read-only
//! into their sandboxes at the same path.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Where the venv lives, on the host and in the sandboxes (apart from husk-jupyter's own
/// venv, which may use another python).
pub const VENV: &str = "/var/tmp/husk-ipykernel-sandbox-venv";

/// The venv's root (runs the venv script, which reuses a good venv). Panics with the reason
/// when it cannot be made: the tests that need it fail, never skip.
pub fn venv() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/jupyter-test-venv");
    let out = Command::new(&script)
        .arg(VENV)
        .env("PYTHON", "/usr/bin/python3")
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed: this test needs python3 with venv and pip, and PyPI",
        script.display()
    );
    let stdout = String::from_utf8(out.stdout).expect("a path");
    let python = PathBuf::from(stdout.lines().last().expect("the python path"));
    let real = std::fs::canonicalize(&python).expect("the venv's python");
    assert!(
        real.starts_with("/usr/"),
        "{} is {}, which the host template does not show; remove {VENV} to rebuild it",
        python.display(),
        real.display()
    );
    python
        .parent()
        .and_then(Path::parent)
        .expect("VENV/bin/python")
        .to_owned()
}
