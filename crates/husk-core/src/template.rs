//! Templates as sandboxes use them: what a template name means at creation time.
//!
//! `host` is the host template (the host's own `/usr`). Any other name is a built template
//! registered in the store: an erofs image plus a manifest with the sandbox defaults. `base`
//! means the built template of that name once there is one, and the host template until then
//! (so the E2B SDKs' default works on a fresh install).
//!
//! An image is checked before use by the spawner that mounts it
//! (`husk_runtime::images::Verifier`): its size at every creation, and its content (SHA-256
//! against the registered digest) once per file identity (device, inode, size, change time):
//! the check is remembered in memory and in a root-only marker in husk's runtime directory,
//! and done again whenever the file changes. A damaged or missing image is a clear error,
//! never a sandbox with half a root file system.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use husk_runtime::RootSource;
use serde::{Deserialize, Serialize};

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
    #[error("template '{name}': {source}")]
    Image {
        name: String,
        #[source]
        source: husk_runtime::images::ImageError,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
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
    /// Warm sandboxes a server keeps of it (spec `sandbox.warm`; `husk serve --warm`
    /// overrides it).
    #[serde(default)]
    pub warm: Option<u32>,
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Resolved {
    /// The template's name as registered (`base` may resolve to the host template).
    pub name: String,
    pub rootfs: RootSource,
    pub defaults: TemplateDefaults,
    /// A snapshot's layers over the root (top first); empty for a template.
    pub layers: Vec<crate::saved_layers::LayerRef>,
    /// The snapshot it is, if it is one.
    pub snapshot: Option<String>,
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
    husk_runtime::images::sha256_file(path)
}

/// Resolves template names for new sandboxes. Their images' content is checked by the
/// spawner that mounts them (`husk_runtime::images::Verifier`), not here: the process that
/// resolves names (a server) need not be able to read them.
pub struct Templates {
    store: Arc<Store>,
    /// For [`Self::verify`].
    verifier: husk_runtime::images::Verifier,
    /// A cluster's node: images are this machine's own files by digest (the record names
    /// where the machine that built it keeps it), fetched from a peer when missing.
    local_images: Option<PathBuf>,
}

/// Where a cluster's node gets the images of templates built elsewhere.
pub trait ImageSource: Send + Sync {
    /// Makes the image with `digest` (`size` bytes) present in this machine's images
    /// directory, fetching it from a node that has it if need be.
    fn ensure<'a>(
        &'a self,
        digest: &'a str,
        size: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>>;
}

impl Templates {
    pub fn new(store: Arc<Store>) -> Templates {
        Templates {
            store,
            verifier: husk_runtime::images::Verifier::default(),
            local_images: None,
        }
    }

    /// Images from `dir` by digest, whatever machine the record names (a cluster's node).
    pub fn with_local_images(mut self, dir: Option<PathBuf>) -> Templates {
        self.local_images = dir;
        self
    }

    /// What `name` means for a new sandbox (a store lookup: call from a blocking context).
    pub fn resolve(&self, name: &str) -> Result<Resolved, TemplateError> {
        let host = || Resolved {
            name: HOST_TEMPLATE.to_string(),
            ..Resolved::default()
        };
        // E2B's `name:default` is the template registered as `name` (other tags are names of
        // their own: `name:tag`).
        let name = name.strip_suffix(":default").unwrap_or(name);
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
        let path = match (
            &self.local_images,
            husk_runtime::images::digest_hex(&rec.digest),
        ) {
            (Some(dir), Ok(hex)) => dir.join(format!("{hex}.erofs")),
            _ => rec.image.clone(),
        };
        Ok(Resolved {
            name: rec.name.clone(),
            rootfs: RootSource::Image {
                path,
                size: rec.size,
                digest: rec.digest.clone(),
            },
            defaults: rec.manifest.defaults.clone(),
            ..Resolved::default()
        })
    }

    /// Checks the image's size and, unless this file was checked before, its content (what
    /// the spawner checks before it mounts one; for commands that read an image themselves).
    pub fn verify(&self, rec: &TemplateRecord) -> Result<(), TemplateError> {
        let run_dir = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR);
        self.verifier
            .verify(run_dir, &rec.image, rec.size, &rec.digest)
            .map_err(|source| TemplateError::Image {
                name: rec.name.clone(),
                source,
            })
    }
}
