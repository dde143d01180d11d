//! What the spawner service takes from `husk serve`: host paths only below the roots the
//! server was started with.
//!
//! A sandbox spec names host paths: bind-mount sources, a template's image, a build's layers.
//! From `husk run` they are the operator's and trusted. From the server they come from a
//! process that parses tenants' requests, so the spawner (host root) checks them itself before
//! it mounts anything: each path is resolved on the host (symlinks followed, as the mount
//! would) and must lie strictly below one of its roots, so a bug in the server cannot mount
//! `/`, `/etc` or another team's files into a sandbox. A build's host network comes only with
//! a build's layered root.

use std::path::{Path, PathBuf};

use crate::spec::{MountSpec, NetworkMode, RootSource, SandboxSpec};

/// The roots a server's specs may name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    /// Bind-mount sources must lie below one of these (the workspaces' directory).
    pub mount_roots: Vec<PathBuf>,
    /// Or be exactly one of these files (the host's CA bundle for builds).
    pub mount_files: Vec<PathBuf>,
    /// Template images and build layers (lower, upper, work) must lie below one of these
    /// (the state directory's templates, the run directory's mounted images).
    pub image_roots: Vec<PathBuf>,
    /// Saved layers (paused sandboxes', snapshots') must lie below one of these.
    pub layer_roots: Vec<PathBuf>,
}

/// `path` resolved on the host, and strictly below one of `roots` (also resolved).
fn below(path: &Path, roots: &[PathBuf]) -> Result<(), String> {
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let inside = roots.iter().any(|r| {
        std::fs::canonicalize(r).is_ok_and(|root| real != root && real.starts_with(&root))
    });
    if inside {
        Ok(())
    } else {
        Err(format!(
            "{} is outside what this server may use",
            path.display()
        ))
    }
}

/// An image outside the roots (a state directory copied elsewhere still names its images by
/// their old paths) passes only if it is one husk's builder made: a regular file named for
/// its digest (`<hex>.erofs`), in a directory, both owned by root and writable by nobody else.
/// Neither a sandbox (whose host ids are never 0) nor an unprivileged server can make one.
fn built_image(path: &Path, digest: &str) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let refuse = || format!("{} is outside what this server may use", path.display());
    let real = std::fs::canonicalize(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    let named = real.file_name().and_then(|n| n.to_str()) == Some(&format!("{hex}.erofs"));
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) || !named {
        return Err(refuse());
    }
    let safe = |p: &Path, dir: bool| {
        std::fs::symlink_metadata(p).is_ok_and(|m| {
            m.uid() == 0 && m.mode() & 0o022 == 0 && if dir { m.is_dir() } else { m.is_file() }
        })
    };
    let parent = real.parent().ok_or_else(refuse)?;
    if safe(&real, false) && safe(parent, true) {
        Ok(())
    } else {
        Err(refuse())
    }
}

impl Confinement {
    /// Checks every host path `spec` names, and its network.
    pub fn check(&self, spec: &SandboxSpec) -> Result<(), String> {
        self.check_mounts(&spec.mounts)?;
        let layered = match &spec.rootfs {
            RootSource::Host => false,
            RootSource::Image { path, digest, .. } => {
                if below(path, &self.image_roots).is_err() {
                    built_image(path, digest).map_err(|e| format!("image {e}"))?;
                }
                false
            }
            RootSource::Layers { lower, upper, work } => {
                for p in lower.iter().chain([upper, work]) {
                    below(p, &self.image_roots).map_err(|e| format!("layer {e}"))?;
                }
                true
            }
        };
        for l in &spec.layers {
            below(l, &self.layer_roots).map_err(|e| format!("saved layer {e}"))?;
        }
        if matches!(spec.network, NetworkMode::Host) && !layered {
            return Err("the host's network is only for template builds".into());
        }
        Ok(())
    }

    /// Checks the host paths of `mounts` (a create's, or those given to a claimed sandbox).
    pub fn check_mounts(&self, mounts: &[MountSpec]) -> Result<(), String> {
        for m in mounts {
            let exact = std::fs::canonicalize(&m.host).is_ok_and(|real| {
                self.mount_files
                    .iter()
                    .any(|f| std::fs::canonicalize(f).is_ok_and(|f| f == real))
            });
            if !exact {
                below(&m.host, &self.mount_roots).map_err(|e| format!("mount source {e}"))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::MountSpec;
    use std::os::unix::fs::PermissionsExt;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn mount(host: &Path) -> MountSpec {
        MountSpec {
            host: host.to_path_buf(),
            sandbox: PathBuf::from("/mnt"),
            writable: true,
            ids: Default::default(),
        }
    }

    #[test]
    fn only_paths_below_the_roots_pass() {
        let d = Dir(std::env::temp_dir().join(format!("husk-confine-{}", std::process::id())));
        let ws = d.0.join("workspaces");
        std::fs::create_dir_all(ws.join("team/w")).unwrap();
        std::fs::create_dir_all(d.0.join("templates/images")).unwrap();
        std::fs::write(d.0.join("templates/images/a.erofs"), b"").unwrap();
        std::fs::write(d.0.join("ca.pem"), b"").unwrap();
        // A symlink inside the root that leads out of it.
        std::os::unix::fs::symlink("/etc", ws.join("team/escape")).unwrap();
        let c = Confinement {
            mount_roots: vec![ws.clone()],
            mount_files: vec![d.0.join("ca.pem")],
            image_roots: vec![d.0.join("templates")],
            layer_roots: vec![d.0.join("paused")],
        };
        let mut spec = SandboxSpec::idle();
        spec.mounts = vec![mount(&ws.join("team/w")), mount(&d.0.join("ca.pem"))];
        c.check(&spec).unwrap();
        for bad in [
            PathBuf::from("/"),
            PathBuf::from("/etc"),
            ws.clone(),
            ws.join("team/escape"),
            ws.join("team/w/../../../.."),
            ws.join("missing"),
            d.0.join("templates"),
        ] {
            spec.mounts = vec![mount(&bad)];
            let err = c.check(&spec).unwrap_err();
            assert!(err.starts_with("mount source"), "{}: {err}", bad.display());
        }
        spec.mounts.clear();
        spec.rootfs = RootSource::Image {
            path: d.0.join("templates/images/a.erofs"),
            size: 0,
            digest: String::new(),
        };
        c.check(&spec).unwrap();
        // Saved layers only below their roots (not the templates' nor the workspaces').
        std::fs::create_dir_all(d.0.join("paused/s1/l1")).unwrap();
        spec.layers = vec![d.0.join("paused/s1/l1")];
        c.check(&spec).unwrap();
        for bad in [d.0.join("paused"), ws.join("team/w"), PathBuf::from("/usr")] {
            spec.layers = vec![d.0.join("paused/s1/l1"), bad.clone()];
            let err = c.check(&spec).unwrap_err();
            assert!(err.starts_with("saved layer"), "{}: {err}", bad.display());
        }
        spec.layers.clear();
        spec.rootfs = RootSource::Image {
            path: PathBuf::from("/etc/passwd"),
            size: 0,
            digest: String::new(),
        };
        assert!(c.check(&spec).unwrap_err().starts_with("image"));
        // An image of a state directory copied elsewhere: root's, named for its digest, in a
        // directory only root writes. Anything else outside the roots is refused.
        let hex = "ab".repeat(32);
        let elsewhere = d.0.join("old-state/images");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
        let image = elsewhere.join(format!("{hex}.erofs"));
        std::fs::write(&image, b"").unwrap();
        std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o644)).unwrap();
        let at = |path: &Path, digest: &str| RootSource::Image {
            path: path.to_path_buf(),
            size: 0,
            digest: digest.into(),
        };
        spec.rootfs = at(&image, &format!("sha256:{hex}"));
        // Root's and named right: taken (as root; another user's files are never taken).
        use std::os::unix::fs::MetadataExt;
        if std::fs::metadata(&image).unwrap().uid() == 0 {
            c.check(&spec).unwrap();
        } else {
            assert!(c.check(&spec).unwrap_err().starts_with("image"));
        }
        spec.rootfs = at(&image, &format!("sha256:{}", "cd".repeat(32)));
        assert!(c.check(&spec).unwrap_err().starts_with("image"));
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o777)).unwrap();
        spec.rootfs = at(&image, &format!("sha256:{hex}"));
        assert!(c.check(&spec).unwrap_err().starts_with("image"));
        spec.rootfs = RootSource::Layers {
            lower: vec![PathBuf::from("/")],
            upper: d.0.join("templates/images"),
            work: d.0.join("templates/images"),
        };
        assert!(c.check(&spec).unwrap_err().starts_with("layer"));
        // The host's network only for a build.
        spec.rootfs = RootSource::Host;
        spec.network = NetworkMode::Host;
        assert!(c
            .check(&spec)
            .unwrap_err()
            .contains("only for template builds"));
        spec.rootfs = RootSource::Layers {
            lower: vec![d.0.join("templates/images")],
            upper: d.0.join("templates/images"),
            work: d.0.join("templates/images"),
        };
        c.check(&spec).unwrap();
    }
}
