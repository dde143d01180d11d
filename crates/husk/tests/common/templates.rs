//! Helpers for template tests: a state directory whose templates are removed (images
//! unmounted and deleted) even when the test fails, a layer cache shared by test runs (builds
//! are cached by content, which is what keeps CI fast), a static busybox build context, and a
//! local OCI registry (Debian's docker-registry) on a loopback port the test picks.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{husk, wait_for, TempDir, HUSK};

/// Layers cached between test runs on this machine (keyed by content; the cache itself is
/// what the tests exercise). Entries unused for two weeks are removed.
pub const TEST_LAYER_CACHE: &str = "/var/tmp/husk-test-layers";

/// A state directory for templates; drops every template it registered.
pub struct State {
    pub dir: TempDir,
    /// The layer cache its builds use.
    pub cache: PathBuf,
}

impl State {
    /// Builds share [`TEST_LAYER_CACHE`].
    pub fn new(tag: &str) -> State {
        prune_test_cache();
        State {
            dir: TempDir::new(tag),
            cache: PathBuf::from(TEST_LAYER_CACHE),
        }
    }

    /// Builds use a cache of their own, inside the state directory (to check exactly what a
    /// build leaves in it).
    pub fn with_private_cache(tag: &str) -> State {
        let dir = TempDir::new(tag);
        let cache = dir.path().join("layers");
        State { dir, cache }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `husk template build` with this state dir and the shared cache; (exit code, stdout,
    /// stderr).
    pub fn build(&self, file: &Path, name: &str, extra: &[&str]) -> (i32, String, String) {
        let out = Command::new(HUSK)
            .args(["template", "build"])
            .arg(file)
            .args(["--name", name, "--state-dir"])
            .arg(self.path())
            .arg("--layer-cache")
            .arg(&self.cache)
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Builds and asserts success; returns the progress output (stderr).
    pub fn build_ok(&self, file: &Path, name: &str) -> String {
        let (code, out, err) = self.build(file, name, &[]);
        assert_eq!(code, 0, "build of {name} failed:\n{out}\n{err}");
        assert!(out.contains(&format!("built template {name}")), "{out}");
        err
    }

    /// Names of the registered templates.
    pub fn names(&self) -> Vec<String> {
        let out = husk(&[
            "template",
            "list",
            "--json",
            "--state-dir",
            self.path().to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|v| v["name"].as_str().map(String::from))
            .collect()
    }

    /// The image file of template `name`.
    pub fn image(&self, name: &str) -> PathBuf {
        let out = husk(&[
            "template",
            "inspect",
            name,
            "--state-dir",
            self.path().to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        PathBuf::from(v["image"].as_str().unwrap())
    }

    /// `husk run --template NAME --state-dir DIR <flags> -- cmd`.
    pub fn run(&self, name: &str, flags: &[&str], cmd: &[&str]) -> super::Run {
        let mut all = vec![
            "--template",
            name,
            "--state-dir",
            self.path().to_str().unwrap(),
        ];
        all.extend_from_slice(flags);
        super::husk_run(&all, cmd)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        for name in self.names_quiet() {
            let _ = husk(&[
                "template",
                "rm",
                &name,
                "--state-dir",
                self.path().to_str().unwrap(),
            ]);
        }
    }
}

impl State {
    fn names_quiet(&self) -> Vec<String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.names())).unwrap_or_default()
    }
}

/// Removes cache entries nobody used for two weeks (a test machine's cache stays bounded).
fn prune_test_cache() {
    let Ok(rd) = fs::read_dir(TEST_LAYER_CACHE) else {
        return;
    };
    for e in rd.flatten() {
        let stale = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a > Duration::from_secs(14 * 86_400));
        if stale {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// Temporary directories builds left in `state`'s layer cache or images.
pub fn leftovers(state: &State) -> Vec<String> {
    let mut out = Vec::new();
    for dir in [state.cache.clone(), state.path().join("templates/images")] {
        if let Ok(rd) = fs::read_dir(&dir) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(".tmp-") || n.starts_with(".mnt-") || n.starts_with(".empty-") {
                    out.push(format!("{}/{n}", dir.display()));
                }
            }
        }
    }
    out
}

/// A build context with a static busybox and a Dockerfile starting with `FROM scratch`,
/// busybox as `/bin/sh` and its applets installed; `rest` is appended.
pub fn busybox_context(dir: &Path, rest: &str) -> PathBuf {
    let bb = Path::new("/bin/busybox");
    let meta = fs::metadata(bb)
        .expect("/bin/busybox is missing: run scripts/test (it installs Debian's busybox-static)");
    assert!(meta.len() > 0);
    fs::copy(bb, dir.join("busybox")).unwrap();
    let dockerfile = dir.join("Dockerfile");
    fs::write(
        &dockerfile,
        format!(
            "FROM scratch\nCOPY busybox /bin/busybox\nCOPY busybox /bin/sh\n\
             RUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n{rest}"
        ),
    )
    .unwrap();
    dockerfile
}

/// Debian's docker-registry on 127.0.0.1 (a port picked by binding port 0), killed and its
/// storage removed on drop.
pub struct Registry {
    child: Child,
    pub addr: String,
    _dir: TempDir,
}

impl Registry {
    pub fn start() -> Registry {
        let bin = Path::new("/usr/bin/docker-registry");
        assert!(
            bin.exists(),
            "docker-registry is missing: run scripts/test (it installs Debian's docker-registry)"
        );
        let dir = TempDir::new("registry");
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
                 http:\n  addr: {addr}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let reg = Registry {
            child,
            addr,
            _dir: dir,
        };
        let up = wait_for(Duration::from_secs(20), || {
            std::net::TcpStream::connect(&reg.addr).ok()
        });
        assert!(
            up.is_some(),
            "docker-registry did not start on {}",
            reg.addr
        );
        reg
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
