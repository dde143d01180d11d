//! Templates as sandboxes use them: what a template name means at creation time.
//!
//! `host` is the host template (the host's own `/usr`). Any other name is a built template
//! registered in the store: an erofs image plus a manifest with the sandbox defaults. `base`
//! means the built template of that name once there is one, and the host template until then
//! (so the E2B SDKs' default works on a fresh install).
//!
//! An image is checked before use: its size at every creation (by the runtime), and its
//! content (SHA-256 against the registered digest) once per file identity (device, inode,
//! size, change time): the check is remembered in memory and in a root-only marker in husk's
//! runtime directory, and done again whenever the file changes. A damaged or missing image
//! is a clear error, never a sandbox with half a root file system.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use husk_runtime::RootSource;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::store::{Store, StoreError, TemplateRecord};

/// The template that exists without any build.
pub const HOST_TEMPLATE: &str = "host";

/// The name that falls back to the host template until a template of that name is built.
pub const BASE_TEMPLATE: &str = "base";

/// The template E2B's code-interpreter SDKs ask for by default.
pub const E2B_CODE_INTERPRETER: &str = "code-interpreter-v1";

/// husk's code-interpreter preset (`templates/code-interpreter`), which
/// [`E2B_CODE_INTERPRETER`] means unless a template of that name is built.
pub const CODE_INTERPRETER_TEMPLATE: &str = "code-interpreter";

/// Errors of resolving a template.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("template '{0}' not found")]
    NotFound(String),
    #[error(
        "template '{name}' is damaged: its image {path} does not match its digest \
         (expected {expected}, found {found}); rebuild the template"
    )]
    Corrupt {
        name: String,
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("template '{name}': {source}")]
    Image {
        name: String,
        #[source]
        source: husk_runtime::images::ImageError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("template '{name}': reading {path}: {source}")]
    Io {
        name: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Defaults a template gives its sandboxes (a create request's own values win).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TemplateDefaults {
    /// `user` or `root`.
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub env: Vec<(String, String)>,
    /// Started in the background at creation, before the sandbox is handed out.
    pub start_cmd: Option<String>,
    /// Run until it exits 0 after `start_cmd`; the sandbox is ready then.
    pub ready_cmd: Option<String>,
    pub ready_timeout_secs: Option<u64>,
    /// Languages whose code contexts (Jupyter kernels) start with every sandbox; it is handed
    /// out once they are ready.
    pub contexts: Vec<String>,
}

/// One layer of a built template, as recorded in its manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LayerRecord {
    /// The layer cache key (a directory under `templates/layers`).
    pub key: String,
    /// What made it: `mmdebstrap bookworm`, `RUN ...`, `pull docker.io/...`.
    pub step: String,
    /// Where that was written (`Dockerfile:7`).
    pub origin: String,
}

/// Everything recorded about a built template besides its image.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TemplateManifest {
    pub defaults: TemplateDefaults,
    /// The spec or Dockerfile it was built from.
    pub source: String,
    /// Its base: `debian bookworm (minbase)`, an OCI reference with digest, a template.
    pub base: String,
    pub layers: Vec<LayerRecord>,
    /// Wall time of the build that made it.
    pub build_seconds: f64,
    /// Bytes of the root file system before compression into the image.
    pub rootfs_bytes: u64,
    /// The husk version that built it.
    pub husk_version: String,
}

/// What a template name resolved to.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The template's name as registered (`base` may resolve to the host template).
    pub name: String,
    pub rootfs: RootSource,
    pub defaults: TemplateDefaults,
}

/// Where built templates' files live under the state directory.
pub fn images_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("templates/images")
}

/// Where cached build layers live under the state directory.
pub fn layers_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("templates/layers")
}

/// A built template as JSON: what `husk template list --json` and `inspect` print and what
/// husk's HTTP API returns, so scripts can use either.
pub fn summary_json(t: &TemplateRecord) -> serde_json::Value {
    use time::format_description::well_known::Rfc3339;
    serde_json::json!({
        "name": t.name,
        "digest": t.digest,
        "image": t.image,
        "size": t.size,
        "created_at": t.created_at.format(&Rfc3339).unwrap_or_default(),
        "manifest": t.manifest,
    })
}

/// `sha256:<hex>` of a file's content.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf)? {
            0 => break,
            n => h.update(&buf[..n]),
        }
    }
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// The file identity an image's verification is remembered for: device, inode, size, and the
/// change time, which every write updates and no caller can set back.
type FileId = (u64, u64, u64, i64, i64);

fn file_id(path: &Path) -> std::io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
}

/// Where a successful check of the image with `digest` is recorded for other processes (a
/// one-shot `husk run` should not hash hundreds of megabytes each time). In husk's runtime
/// directory, which only root can write.
fn marker_path(digest: &str) -> Option<PathBuf> {
    let run_dir = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR);
    let mp = husk_runtime::images::mount_point(run_dir, digest).ok()?;
    Some(mp.with_extension("verified"))
}

fn marker_text(id: &FileId, path: &Path, digest: &str) -> String {
    format!("{id:?} {} {digest}\n", path.display())
}

fn marker_matches(id: &FileId, path: &Path, digest: &str) -> bool {
    marker_path(digest)
        .and_then(|m| std::fs::read_to_string(m).ok())
        .is_some_and(|t| t == marker_text(id, path, digest))
}

/// Records a successful check (best effort: without it the next process hashes again).
fn write_marker(id: &FileId, path: &Path, digest: &str) {
    let Some(m) = marker_path(digest) else {
        return;
    };
    let Some(dir) = m.parent() else {
        return;
    };
    let tmp = m.with_extension(format!("verified.{}", std::process::id()));
    let ok = std::fs::create_dir_all(dir).is_ok()
        && std::fs::write(&tmp, marker_text(id, path, digest)).is_ok()
        && std::fs::rename(&tmp, &m).is_ok();
    if !ok {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Resolves template names for new sandboxes.
pub struct Templates {
    store: Arc<Store>,
    /// Images whose content was checked, by path: the file identity and the digest checked.
    verified: Mutex<HashMap<PathBuf, (FileId, String)>>,
}

impl Templates {
    pub fn new(store: Arc<Store>) -> Templates {
        Templates {
            store,
            verified: Mutex::new(HashMap::new()),
        }
    }

    /// What `name` means for a new sandbox. May read a whole image (first use): call from a
    /// blocking context.
    pub fn resolve(&self, name: &str) -> Result<Resolved, TemplateError> {
        let host = || Resolved {
            name: HOST_TEMPLATE.to_string(),
            rootfs: RootSource::Host,
            defaults: TemplateDefaults::default(),
        };
        if name == HOST_TEMPLATE {
            return Ok(host());
        }
        let mut rec = self.store.template(name)?;
        if rec.is_none() && name == E2B_CODE_INTERPRETER {
            rec = self.store.template(CODE_INTERPRETER_TEMPLATE)?;
        }
        let Some(rec) = rec else {
            if name == BASE_TEMPLATE {
                return Ok(host());
            }
            return Err(TemplateError::NotFound(name.to_string()));
        };
        self.verify(&rec)?;
        Ok(Resolved {
            name: rec.name.clone(),
            rootfs: RootSource::Image {
                path: rec.image.clone(),
                size: rec.size,
                digest: rec.digest.clone(),
            },
            defaults: rec.manifest.defaults.clone(),
        })
    }

    /// Checks the image's size and, unless this file was checked before, its content.
    pub fn verify(&self, rec: &TemplateRecord) -> Result<(), TemplateError> {
        husk_runtime::images::check_file(&rec.image, rec.size).map_err(|source| {
            TemplateError::Image {
                name: rec.name.clone(),
                source,
            }
        })?;
        let io = |source| TemplateError::Io {
            name: rec.name.clone(),
            path: rec.image.clone(),
            source,
        };
        let id = file_id(&rec.image).map_err(io)?;
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&rec.image)
            .is_some_and(|(i, d)| *i == id && *d == rec.digest);
        if known || marker_matches(&id, &rec.image, &rec.digest) {
            self.remember(rec, id);
            return Ok(());
        }
        let found = sha256_file(&rec.image).map_err(io)?;
        if found != rec.digest {
            return Err(TemplateError::Corrupt {
                name: rec.name.clone(),
                path: rec.image.clone(),
                expected: rec.digest.clone(),
                found,
            });
        }
        write_marker(&id, &rec.image, &rec.digest);
        self.remember(rec, id);
        Ok(())
    }

    fn remember(&self, rec: &TemplateRecord, id: FileId) {
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(rec.image.clone(), (id, rec.digest.clone()));
    }
}
