//! Saved layers: what a sandbox changed over its template, kept on the host's disk
//! (overlay-format directories, owned by image ids, see `husk_runtime::layer_capture`), so
//! that it survives the sandbox, the server and a reboot of the host:
//!
//! - a paused sandbox's, under `STATE_DIR/paused/<sandbox id>/<layer>`: a later sandbox with
//!   the same id mounts it under its own writable layer;
//! - a snapshot's, under `STATE_DIR/snapshots/<snapshot id>/<layer>`: sandboxes created from
//!   the snapshot mount it (and the layers of the snapshots it was taken over) read-only.
//!
//! The layer is copied out of the frozen sandbox by the files helper (privileged: the layer's
//! files belong to the sandbox's uids, and the spawner hands it the layer by the sandbox's
//! id); the server, which runs unprivileged, only names sandboxes and layers. [`SavedLayers`]
//! is that seam: the helper in `husk serve`, a fake in the core's tests.

use std::path::{Path, PathBuf};

/// Where paused sandboxes' layers live, below the state directory.
pub const PAUSED_DIR: &str = "paused";

/// Where snapshots' layers live, below the state directory.
pub const SNAPSHOTS_DIR: &str = "snapshots";

/// Which of the two directories a layer lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Home {
    /// `STATE_DIR/paused/<sandbox id>/`.
    Paused,
    /// `STATE_DIR/snapshots/<snapshot id>/`.
    Snapshot,
}

impl Home {
    /// Its directory below the state directory.
    pub fn dir(self) -> &'static str {
        match self {
            Home::Paused => PAUSED_DIR,
            Home::Snapshot => SNAPSHOTS_DIR,
        }
    }
}

/// One saved layer: `STATE_DIR/<home>/<owner>/<layer>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct LayerRef {
    pub home: Home,
    /// The paused sandbox's or the snapshot's id.
    pub owner: String,
    pub layer: String,
}

impl LayerRef {
    /// Its path on the host (names checked: they come from records on disk).
    pub fn path(&self, state_dir: &Path) -> Result<PathBuf, LayerError> {
        check_sandbox(&self.owner)?;
        check_layer(&self.layer)?;
        Ok(state_dir
            .join(self.home.dir())
            .join(&self.owner)
            .join(&self.layer))
    }
}

/// What a capture made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Captured {
    /// The layer's name (below the sandbox's directory).
    pub layer: String,
    /// Bytes of file content copied (files of the layer below are linked, not counted).
    pub bytes: u64,
    /// Entries in the layer.
    pub entries: u64,
}

/// Why a layer could not be saved or dropped.
#[derive(Debug, thiserror::Error)]
pub enum LayerError {
    #[error("invalid {what} name {name:?}")]
    InvalidName { what: &'static str, name: String },
    /// The sandbox's layer could not be had (it is gone, or has none of its own).
    #[error("the sandbox's writable layer: {0}")]
    Sandbox(String),
    /// Copying or removing failed on the host.
    #[error("{0}")]
    Host(String),
    /// This server cannot save layers (no files helper).
    #[error("saving sandboxes' files is not available on this server")]
    Unavailable,
}

/// Copies sandboxes' writable layers to disk and removes them.
pub trait SavedLayers: Send + Sync + 'static {
    /// Freezes the sandbox the spawner knows as `runtime_id` and copies its writable layer
    /// into a new layer of `owner` in `into`, merged with the layer `below` if given (the
    /// paused layer it was started on, which stays). The sandbox stays frozen.
    fn capture(
        &self,
        runtime_id: &str,
        into: Home,
        owner: &str,
        below: Option<&LayerRef>,
    ) -> Result<Captured, LayerError>;

    /// Removes layer `layer` of `owner` in `home`, or (`None`) every layer of it.
    fn drop_layers(&self, home: Home, owner: &str, layer: Option<&str>) -> Result<(), LayerError>;

    /// Removes every saved layer in `home` but the `(owner, layer)` pairs in `keep` (an empty
    /// layer name keeps all of the owner's), and what a copy cut short left: what a server
    /// that stopped without removing its layers left behind. Called when no sandbox runs.
    /// Returns how many were removed.
    fn prune(&self, home: Home, keep: &[(String, String)]) -> Result<u64, LayerError>;
}

/// A sandbox id as a directory name: what ids are (`[a-z0-9]`, at most 64).
pub fn check_sandbox(name: &str) -> Result<(), LayerError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(LayerError::InvalidName {
            what: "sandbox",
            name: name.chars().take(80).collect(),
        })
    }
}

/// A layer's name: 16 lowercase hex digits (made by [`new_layer_name`]).
pub fn check_layer(name: &str) -> Result<(), LayerError> {
    let ok = name.len() == 16
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if ok {
        Ok(())
    } else {
        Err(LayerError::InvalidName {
            what: "layer",
            name: name.chars().take(80).collect(),
        })
    }
}

/// A fresh layer name.
pub fn new_layer_name() -> Result<String, LayerError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| LayerError::Host(format!("random name: {e}")))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The helper's side: copies and removals under `STATE_DIR/paused` and `STATE_DIR/snapshots`,
/// which only it (and the spawner, reading) touches.
pub mod host {
    use std::fs;
    use std::os::fd::AsFd;
    use std::os::unix::fs::DirBuilderExt;
    use std::path::Path;

    use husk_runtime::layer_capture::{capture_layer, CaptureLimits};
    use husk_runtime::service::RootChannel;

    use super::{check_layer, check_sandbox, new_layer_name, Captured, Home, LayerError, LayerRef};

    /// Bounds of one capture: a sandbox's layer is bounded by its disk (a tmpfs) already;
    /// these only stop a runaway.
    const LIMITS: CaptureLimits = CaptureLimits {
        max_bytes: 1 << 40,
        max_entries: 1 << 22,
    };

    /// [`super::SavedLayers::capture`] in the helper, with the spawner's root channel.
    pub fn capture(
        state_dir: &Path,
        roots: &RootChannel,
        runtime_id: &str,
        into: Home,
        owner: &str,
        below: Option<&LayerRef>,
    ) -> Result<Captured, LayerError> {
        check_sandbox(owner)?;
        let below = below.map(|b| b.path(state_dir)).transpose()?;
        let home = state_dir.join(into.dir());
        let dir = home.join(owner);
        for d in [&home, &dir] {
            match fs::DirBuilder::new().mode(0o700).create(d) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(LayerError::Host(format!("{}: {e}", d.display())))
                }
                _ => {}
            }
        }
        if let Some(b) = &below {
            if !fs::symlink_metadata(b).is_ok_and(|m| m.is_dir()) {
                return Err(LayerError::Host(format!(
                    "the layer below, {}, is missing",
                    b.display()
                )));
            }
        }
        let (upper, base) = roots
            .frozen_layer(runtime_id)
            .map_err(|e| LayerError::Sandbox(crate::error_chain(&e)))?;
        let name = new_layer_name()?;
        let tmp = dir.join(format!(".tmp-{name}"));
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&tmp)
            .map_err(|e| LayerError::Host(format!("{}: {e}", tmp.display())))?;
        let result = capture_layer(upper.as_fd(), &tmp, base, below.as_deref(), &LIMITS)
            .map_err(|e| {
                LayerError::Host(format!(
                    "copying the sandbox's files: {}",
                    crate::error_chain(&e)
                ))
            })
            .and_then(|report| {
                // Written out before it is named: a machine crash must not leave a layer with
                // unwritten files under its final name.
                let f = fs::File::open(&tmp)
                    .map_err(|e| LayerError::Host(format!("{}: {e}", tmp.display())))?;
                husk_runtime::sys::syncfs(f.as_fd())
                    .map_err(|e| LayerError::Host(format!("syncfs: {e}")))?;
                fs::rename(&tmp, dir.join(&name))
                    .map_err(|e| LayerError::Host(format!("naming the layer: {e}")))?;
                Ok(report)
            });
        match result {
            Ok(r) => Ok(Captured {
                layer: name,
                bytes: r.bytes,
                entries: r.files + r.dirs + r.symlinks + r.fifos + r.whiteouts + r.hardlinks,
            }),
            Err(e) => {
                let _ = fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    /// [`super::SavedLayers::prune`] in the helper. Only names that are sandbox ids and layer
    /// names (or a copy's temporary name) are removed: nothing else lives here.
    pub fn prune(
        state_dir: &Path,
        home: Home,
        keep: &[(String, String)],
    ) -> Result<u64, LayerError> {
        let paused = state_dir.join(home.dir());
        let entries = match fs::read_dir(&paused) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(LayerError::Host(format!("{}: {e}", paused.display()))),
        };
        let mut removed = 0;
        let remove = |p: &Path| match fs::remove_dir_all(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(LayerError::Host(format!("{}: {e}", p.display())))
            }
            _ => Ok(()),
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if check_sandbox(&name).is_err() {
                continue;
            }
            let kept: Vec<&str> = keep
                .iter()
                .filter(|(s, _)| *s == name)
                .map(|(_, l)| l.as_str())
                .collect();
            if kept.is_empty() {
                remove(&e.path())?;
                removed += 1;
                continue;
            }
            if kept.contains(&"") {
                continue;
            }
            let Ok(layers) = fs::read_dir(e.path()) else {
                continue;
            };
            for l in layers.flatten() {
                let lname = l.file_name().to_string_lossy().into_owned();
                let ours = check_layer(&lname).is_ok()
                    || lname
                        .strip_prefix(".tmp-")
                        .is_some_and(|n| check_layer(n).is_ok());
                if ours && !kept.contains(&lname.as_str()) {
                    remove(&l.path())?;
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// [`super::SavedLayers::drop_layers`] in the helper.
    pub fn drop_layers(
        state_dir: &Path,
        home: Home,
        owner: &str,
        layer: Option<&str>,
    ) -> Result<(), LayerError> {
        check_sandbox(owner)?;
        let dir = state_dir.join(home.dir()).join(owner);
        let target = match layer {
            Some(l) => {
                check_layer(l)?;
                dir.join(l)
            }
            None => dir,
        };
        match fs::remove_dir_all(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(LayerError::Host(format!("{}: {e}", target.display())))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_what_is_named_and_only_removes_its_own_names() {
        let dir = std::env::temp_dir().join(format!(
            "husk-prune-{}-{}",
            std::process::id(),
            new_layer_name().unwrap()
        ));
        let paused = dir.join(PAUSED_DIR);
        let (l1, l2, l3) = (
            new_layer_name().unwrap(),
            new_layer_name().unwrap(),
            new_layer_name().unwrap(),
        );
        for p in [
            format!("keep1/{l1}/home"),
            format!("keep1/{l2}"),
            format!("keep1/.tmp-{l3}"),
            format!("gone1/{l1}"),
            "Not-An-Id/x".to_owned(),
            "keep1/not-a-layer".to_owned(),
        ] {
            std::fs::create_dir_all(paused.join(p)).unwrap();
        }
        let keep = vec![("keep1".to_owned(), l1.clone())];
        let removed = host::prune(&dir, Home::Paused, &keep);
        let left = |p: &str| paused.join(p).exists();
        let state = (
            left(&format!("keep1/{l1}/home")),
            left(&format!("keep1/{l2}")),
            left(&format!("keep1/.tmp-{l3}")),
            left("gone1"),
            left("Not-An-Id/x"),
            left("keep1/not-a-layer"),
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(removed.unwrap(), 3);
        assert_eq!(state, (true, false, false, false, true, true));
        // Nothing there: nothing to do.
        assert_eq!(host::prune(&dir, Home::Paused, &keep).unwrap(), 0);
        // A sandbox kept whole (its record could not be read): none of its layers go.
        std::fs::create_dir_all(paused.join(format!("whole/{l2}"))).unwrap();
        let whole = vec![("whole".to_owned(), String::new())];
        let kept = host::prune(&dir, Home::Paused, &whole)
            .map(|n| (n, paused.join(format!("whole/{l2}")).exists()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(kept.unwrap(), (0, true));
    }

    #[test]
    fn names_are_checked_before_they_become_paths() {
        check_sandbox("abc123").unwrap();
        for bad in ["", "..", "a/b", "A", "a.b", &"a".repeat(65), "a\0"] {
            assert!(check_sandbox(bad).is_err(), "{bad:?}");
        }
        let n = new_layer_name().unwrap();
        check_layer(&n).unwrap();
        assert_ne!(n, new_layer_name().unwrap());
        for bad in [
            "",
            "../../etc/passwd",
            "0123456789abcdeg",
            "0123456789ABCDEF",
            "0",
        ] {
            assert!(check_layer(bad).is_err(), "{bad:?}");
        }
    }
}
