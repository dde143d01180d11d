//! Jupyter kernel specs: `kernels/<name>/kernel.json` in Jupyter's data directories, found the
//! way `jupyter kernelspec list` finds them.
//!
//! The files come from the image and from the sandbox's users, so they are hostile: each is
//! read only if it is a regular file (a symlink to a FIFO or a device is opened without
//! blocking and refused), at most [`MAX_SPEC_FILE`] bytes, and at most [`MAX_SPECS`] specs are
//! kept. A spec that cannot be used is skipped, as Jupyter skips it.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use husk_proto::User;
use husk_runtime::sys;
use serde::Deserialize;

/// Largest `kernel.json` read.
pub const MAX_SPEC_FILE: usize = 64 << 10;
/// Most specs reported (and searched).
pub const MAX_SPECS: usize = 64;
/// Most directory entries looked at in one `kernels` directory.
const MAX_DIR_ENTRIES: usize = 1024;
/// Longest `display_name` and `language` kept (they go into replies and messages).
const MAX_LABEL: usize = 256;

/// How the kernel is interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptMode {
    /// SIGINT to the kernel's process group (Jupyter's default).
    Signal,
    /// An `interrupt_request` on the control channel.
    Message,
}

/// A usable kernel spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub name: String,
    /// The directory holding `kernel.json` (`{resource_dir}`).
    pub dir: PathBuf,
    /// Contains `{connection_file}` somewhere.
    pub argv: Vec<String>,
    pub display_name: String,
    /// Lower-cased.
    pub language: String,
    pub env: Vec<(String, String)>,
    pub interrupt_mode: InterruptMode,
    /// How long an execution without a result waits after its reply and idle, for a kernel
    /// that publishes results after its idle status (`metadata.husk_settle_ms`, at most
    /// [`MAX_SETTLE_MS`]; see `husk_jupyter::client::KernelClient::set_settle`).
    pub settle: std::time::Duration,
}

/// Longest settle time a spec may ask for.
pub const MAX_SETTLE_MS: u64 = 1000;

/// Why one `kernel.json` was skipped.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("not a regular file")]
    NotRegular,
    #[error("larger than {MAX_SPEC_FILE} bytes")]
    TooLarge,
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("argv does not pass {{connection_file}} to the kernel")]
    NoConnectionFile,
    #[error("unknown interrupt_mode {0:?}")]
    InterruptMode(String),
}

impl Spec {
    /// The spec as the protocol reports it.
    pub fn info(&self) -> husk_proto::KernelSpec {
        husk_proto::KernelSpec {
            name: self.name.clone(),
            language: self.language.clone(),
            display_name: self.display_name.clone(),
        }
    }

    /// `argv` with `{connection_file}` and `{resource_dir}` substituted, as jupyter_client does.
    pub fn argv_for(&self, connection_file: &str) -> Vec<String> {
        let dir = self.dir.to_string_lossy();
        self.argv
            .iter()
            .map(|a| {
                a.replace("{connection_file}", connection_file)
                    .replace("{resource_dir}", &dir)
            })
            .collect()
    }
}

/// Parses one `kernel.json` of the spec directory `dir` named `name`.
pub fn parse(name: &str, dir: &Path, json: &[u8]) -> Result<Spec, SpecError> {
    #[derive(Deserialize)]
    struct Raw {
        argv: Vec<String>,
        display_name: String,
        #[serde(default)]
        language: String,
        #[serde(default)]
        env: BTreeMap<String, String>,
        #[serde(default)]
        interrupt_mode: Option<String>,
        #[serde(default)]
        metadata: Option<serde_json::Value>,
    }
    let raw: Raw = serde_json::from_slice(json)?;
    if !raw.argv.iter().any(|a| a.contains("{connection_file}")) {
        return Err(SpecError::NoConnectionFile);
    }
    let interrupt_mode = match raw.interrupt_mode.as_deref() {
        None | Some("signal") => InterruptMode::Signal,
        Some("message") => InterruptMode::Message,
        Some(other) => return Err(SpecError::InterruptMode(truncate(other, 64))),
    };
    let settle_ms = raw
        .metadata
        .as_ref()
        .and_then(|m| m.get("husk_settle_ms"))
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
        .min(MAX_SETTLE_MS);
    Ok(Spec {
        name: name.to_owned(),
        dir: dir.to_owned(),
        argv: raw.argv,
        display_name: truncate(&raw.display_name, MAX_LABEL),
        language: truncate(&raw.language, MAX_LABEL).to_lowercase(),
        env: raw.env.into_iter().collect(),
        interrupt_mode,
        settle: std::time::Duration::from_millis(settle_ms),
    })
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub fn truncate(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Jupyter's data path for the sandbox's environment `env`: `$JUPYTER_PATH`, the user data
/// directory (`$JUPYTER_DATA_DIR`, else `~/.local/share/jupyter` of `user`), then the
/// system directories.
pub fn data_path(env: &[(String, String)], user: User) -> Vec<PathBuf> {
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut dirs: Vec<PathBuf> = var("JUPYTER_PATH")
        .unwrap_or("")
        .split(':')
        .filter(|d| d.starts_with('/'))
        .map(PathBuf::from)
        .collect();
    match var("JUPYTER_DATA_DIR").filter(|d| d.starts_with('/')) {
        Some(d) => dirs.push(d.into()),
        None => dirs.push(Path::new(user.home()).join(".local/share/jupyter")),
    }
    dirs.push("/usr/local/share/jupyter".into());
    dirs.push("/usr/share/jupyter".into());
    dirs
}

/// The usable specs below `dirs` (each a Jupyter data directory), sorted by name; the first
/// directory that has a name wins, even when its spec is unusable (as Jupyter's does).
pub fn discover(dirs: &[PathBuf]) -> Vec<Spec> {
    let mut seen: BTreeMap<String, Option<Spec>> = BTreeMap::new();
    for dir in dirs {
        let kernels = dir.join("kernels");
        let Ok(entries) = std::fs::read_dir(&kernels) else {
            continue;
        };
        for entry in entries.take(MAX_DIR_ENTRIES).flatten() {
            if seen.len() >= MAX_SPECS {
                break;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !valid_name(&name) || seen.contains_key(&name) {
                continue;
            }
            let spec_dir = kernels.join(&name);
            let spec = read_bounded(&spec_dir.join("kernel.json"))
                .and_then(|json| parse(&name, &spec_dir, &json));
            match spec {
                Ok(spec) => {
                    seen.insert(name, Some(spec));
                }
                // Not a spec directory at all: a later directory may still have this name.
                Err(SpecError::Io(e)) if e.kind() == io::ErrorKind::NotFound => {}
                Err(_) => {
                    seen.insert(name, None);
                }
            }
        }
    }
    seen.into_values().flatten().collect()
}

/// Jupyter's rule for kernel names (case-insensitive ASCII letters, digits, `.`, `_`, `-`).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Reads a regular file of at most [`MAX_SPEC_FILE`] bytes without ever blocking on it.
pub fn read_bounded(path: &Path) -> Result<Vec<u8>, SpecError> {
    let cpath = sys::cpath(path)?;
    let fd = sys::open(
        &cpath,
        libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        0,
    )?;
    if !sys::is_regular_file(fd.as_fd()) {
        return Err(SpecError::NotRegular);
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = sys::read(fd.as_fd(), &mut buf)?;
        if n == 0 {
            return Ok(out);
        }
        if out.len() + n > MAX_SPEC_FILE {
            return Err(SpecError::TooLarge);
        }
        out.extend_from_slice(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory, removed on drop (also when a test fails).
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let n = sys::random_u64().unwrap();
            let p = std::env::temp_dir().join(format!("husk-spec-{tag}-{n:x}"));
            std::fs::create_dir_all(&p).unwrap();
            Scratch(p)
        }

        /// Writes `<data dir>/kernels/<name>/kernel.json`.
        fn spec(&self, data: &str, name: &str, json: &[u8]) -> PathBuf {
            let dir = self.0.join(data).join("kernels").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("kernel.json"), json).unwrap();
            dir.join("kernel.json")
        }

        fn data(&self, data: &str) -> PathBuf {
            self.0.join(data)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    const PYTHON: &str = r#"{"argv": ["python", "-m", "ipykernel_launcher", "-f",
        "{connection_file}"], "display_name": "Python 3 (ipykernel)", "language": "Python",
        "metadata": {"debugger": true}, "kernel_protocol_version": "5.5"}"#;

    #[test]
    fn a_good_spec_parses() {
        let s = parse("python3", Path::new("/k/python3"), PYTHON.as_bytes()).unwrap();
        assert_eq!(s.argv.len(), 5);
        assert_eq!(s.language, "python");
        assert_eq!(s.display_name, "Python 3 (ipykernel)");
        assert_eq!(s.interrupt_mode, InterruptMode::Signal);
        assert!(s.env.is_empty());
        assert_eq!(
            s.argv_for("/tmp/c.json")[3..],
            ["-f".to_owned(), "/tmp/c.json".to_owned()]
        );
        let json = br#"{"argv": ["k", "--f={connection_file}", "{resource_dir}/x"],
            "display_name": "K", "language": "R", "env": {"A": "1", "B": "2"},
            "interrupt_mode": "message"}"#;
        let s = parse("k", Path::new("/d/k"), json).unwrap();
        assert_eq!(s.interrupt_mode, InterruptMode::Message);
        assert_eq!(s.settle, std::time::Duration::ZERO);
        assert_eq!(s.env, [("A".into(), "1".into()), ("B".into(), "2".into())]);
        assert_eq!(s.argv_for("/c"), ["k", "--f=/c", "/d/k/x"]);
    }

    #[test]
    fn a_settle_time_is_read_from_the_metadata_and_bounded() {
        let settled = br#"{"argv": ["k", "{connection_file}"], "display_name": "d",
            "metadata": {"husk_settle_ms": 50}}"#;
        let s = parse("d", Path::new("/k/d"), settled).unwrap();
        assert_eq!(s.settle, std::time::Duration::from_millis(50));
        let greedy = br#"{"argv": ["k", "{connection_file}"], "display_name": "d",
            "metadata": {"husk_settle_ms": 3600000}}"#;
        let s = parse("d", Path::new("/k/d"), greedy).unwrap();
        assert_eq!(s.settle, std::time::Duration::from_millis(MAX_SETTLE_MS));
        let odd = br#"{"argv": ["k", "{connection_file}"], "display_name": "d",
            "metadata": {"husk_settle_ms": "soon"}}"#;
        let s = parse("d", Path::new("/k/d"), odd).unwrap();
        assert_eq!(s.settle, std::time::Duration::ZERO);
    }

    #[test]
    fn bad_specs_are_refused() {
        let dir = Path::new("/k");
        let no_file = br#"{"argv": ["python", "-m", "ipykernel_launcher"], "display_name": "x"}"#;
        assert!(matches!(
            parse("x", dir, no_file),
            Err(SpecError::NoConnectionFile)
        ));
        assert!(matches!(
            parse("x", dir, b"{\"argv\": [\"a\""),
            Err(SpecError::Json(_))
        ));
        // Not strings, missing display_name, unknown interrupt mode.
        let bad = [
            &br#"{"argv": [1], "display_name": "x"}"#[..],
            br#"{"argv": ["{connection_file}"]}"#,
            br#"{"argv": ["{connection_file}"], "display_name": "x", "env": {"A": 1}}"#,
        ];
        for json in bad {
            assert!(matches!(parse("x", dir, json), Err(SpecError::Json(_))));
        }
        let mode =
            br#"{"argv": ["{connection_file}"], "display_name": "x", "interrupt_mode": "x"}"#;
        assert!(matches!(
            parse("x", dir, mode),
            Err(SpecError::InterruptMode(_))
        ));
    }

    #[test]
    fn files_are_read_bounded_and_only_when_regular() {
        let s = Scratch::new("read");
        let big = s.spec("d", "big", &vec![b' '; MAX_SPEC_FILE + 1]);
        assert!(matches!(read_bounded(&big), Err(SpecError::TooLarge)));
        let exact = s.spec("d", "exact", &vec![b' '; MAX_SPEC_FILE]);
        assert_eq!(read_bounded(&exact).unwrap().len(), MAX_SPEC_FILE);
        // A FIFO (even behind a symlink) would block a reader forever: refused at once.
        let fifo = s.0.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        let link = s.0.join("link.json");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(matches!(read_bounded(&link), Err(SpecError::NotRegular)));
        assert!(matches!(
            read_bounded(Path::new("/dev/zero")),
            Err(SpecError::NotRegular)
        ));
        assert!(matches!(
            read_bounded(&s.0.join("missing")),
            Err(SpecError::Io(e)) if e.kind() == io::ErrorKind::NotFound
        ));
    }

    #[test]
    fn the_first_directory_wins_and_bad_specs_are_skipped() {
        let s = Scratch::new("discover");
        let spec = |lang: &str| {
            format!(
                r#"{{"argv": ["{{connection_file}}"], "display_name": "D", "language": "{lang}"}}"#
            )
        };
        s.spec("first", "py", spec("first").as_bytes());
        s.spec("second", "py", spec("second").as_bytes());
        s.spec("second", "bash", spec("Bash").as_bytes());
        // An unusable spec hides the same name further down, as in Jupyter.
        s.spec("first", "broken", b"not json");
        s.spec("second", "broken", spec("x").as_bytes());
        // A directory without kernel.json does not.
        std::fs::create_dir_all(s.data("first").join("kernels/empty")).unwrap();
        s.spec("second", "empty", spec("found").as_bytes());
        // Names Jupyter would not accept.
        s.spec("second", "bad name", spec("x").as_bytes());
        let dirs = [s.data("missing"), s.data("first"), s.data("second")];
        let found: Vec<(String, String)> = discover(&dirs)
            .into_iter()
            .map(|s| (s.name, s.language))
            .collect();
        assert_eq!(
            found,
            [
                ("bash".to_owned(), "bash".to_owned()),
                ("empty".to_owned(), "found".to_owned()),
                ("py".to_owned(), "first".to_owned()),
            ]
        );
    }

    #[test]
    fn the_number_of_specs_is_bounded() {
        let s = Scratch::new("many");
        let json = br#"{"argv": ["{connection_file}"], "display_name": "D"}"#;
        for i in 0..MAX_SPECS + 10 {
            s.spec("d", &format!("k{i}"), json);
        }
        assert_eq!(discover(&[s.data("d")]).len(), MAX_SPECS);
    }

    #[test]
    fn the_data_path_follows_jupyter() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        assert_eq!(
            data_path(&env(&[("JUPYTER_PATH", "/a:relative::/b")]), User::User),
            [
                "/a",
                "/b",
                "/home/user/.local/share/jupyter",
                "/usr/local/share/jupyter",
                "/usr/share/jupyter"
            ]
            .map(PathBuf::from)
        );
        assert_eq!(
            data_path(&env(&[("JUPYTER_DATA_DIR", "/data")]), User::Root)[0],
            PathBuf::from("/data")
        );
        assert_eq!(
            data_path(&[], User::Root)[0],
            PathBuf::from("/root/.local/share/jupyter")
        );
    }
}
