//! What the end-to-end tests share: the pinned venv and a kernel process guard.
#![allow(dead_code)]

use husk_jupyter::connection::ConnectionInfo;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// Runs the venv script and returns the venv's python.
pub fn venv_python() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/jupyter-test-venv");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): the ipykernel end-to-end test needs python3 with venv and pip, and PyPI \
         (ipykernel==7.4.0, jupyter_client==8.10.0); see its stderr above",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8(out.stdout).expect("script prints a path");
    let python = PathBuf::from(
        stdout
            .lines()
            .last()
            .expect("script prints the python path"),
    );
    assert!(python.exists(), "{} does not exist", python.display());
    python
}

/// The kernel process and its scratch directory; killed (SIGKILL, by PID) and removed on drop,
/// so a failing assertion never leaves a kernel behind.
pub struct Kernel {
    pub child: Child,
    pub dir: PathBuf,
}

impl Drop for Kernel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a kernel; `name` keeps the scratch directories of tests in one process apart.
pub fn start_kernel(python: &Path, info: &ConnectionInfo, name: &str) -> Kernel {
    let dir = std::env::temp_dir().join(format!("husk-ipykernel-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("kernel.json");
    info.write_new(&file).unwrap();
    let child = Command::new(python)
        .args(["-m", "ipykernel_launcher", "-f"])
        .arg(&file)
        // Keep IPython's profile and history out of the invoking user's home.
        .env("IPYTHONDIR", dir.join("ipython"))
        .env("JUPYTER_RUNTIME_DIR", dir.join("runtime"))
        .env("JUPYTER_DATA_DIR", dir.join("data"))
        .env("HOME", &dir)
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ipykernel");
    Kernel { child, dir }
}
