//! Exporting a root file system as a one-layer OCI image: an image layout tar on disk, or a
//! push to a registry. The layer is written once to a temporary file (hashing as it goes) and
//! streamed from there, so its size does not matter.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{
    OciDescriptor, OciImageManifest, IMAGE_CONFIG_MEDIA_TYPE, OCI_IMAGE_INDEX_MEDIA_TYPE,
    OCI_IMAGE_MEDIA_TYPE,
};
use oci_client::RegistryOperation;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::blobio::{finish_digest, sha256_hex, unique_suffix};
use super::config::ImageConfig;
use super::error::{registry_error, OciError, Phase};
use super::layer_tar::{write_layer, LayerBlob};
use super::registry::{parse_reference, RegistryOptions};
use super::LAYER_MEDIA_TYPE;

/// Where [`export`] puts the image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportTarget {
    /// An OCI image layout, as a tar file at this path (`docker load`/`podman load` and
    /// `skopeo copy oci-archive:` read it); its one manifest is tagged `latest`.
    Layout(PathBuf),
    /// A registry reference to push to.
    Push(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSummary {
    pub manifest_digest: String,
    /// Compressed size of the layer.
    pub layer_bytes: u64,
    pub layer_digest: String,
}

/// Exports `rootfs` (read, never changed) with `config` and manifest `annotations`.
///
/// The temporary layer file goes next to a layout target, or into `$TMPDIR` for a push.
pub async fn export(
    rootfs: &Path,
    config: &ImageConfig,
    annotations: &BTreeMap<String, String>,
    target: &ExportTarget,
    opts: &RegistryOptions,
) -> Result<ExportSummary, OciError> {
    let scratch = match target {
        ExportTarget::Layout(path) => match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
        ExportTarget::Push(_) => std::env::temp_dir(),
    };
    let layer_file = TempFile(scratch.join(format!(".husk-layer-{}.tar.gz", unique_suffix())));
    let (root, out) = (rootfs.to_path_buf(), layer_file.0.clone());
    let layer = blocking(move || write_layer(&root, &out)).await?;

    let config_json = config.to_json(&layer.diff_id);
    let config_desc = OciDescriptor {
        media_type: IMAGE_CONFIG_MEDIA_TYPE.to_string(),
        digest: digest_of(&config_json),
        size: config_json.len() as i64,
        ..OciDescriptor::default()
    };
    let manifest = OciImageManifest {
        schema_version: 2,
        media_type: Some(OCI_IMAGE_MEDIA_TYPE.to_string()),
        config: config_desc,
        layers: vec![OciDescriptor {
            media_type: LAYER_MEDIA_TYPE.to_string(),
            digest: layer.digest.clone(),
            size: layer.size as i64,
            ..OciDescriptor::default()
        }],
        annotations: (!annotations.is_empty()).then(|| annotations.clone()),
        ..OciImageManifest::default()
    };
    let blobs = Blobs {
        layer_path: layer_file.0.clone(),
        layer: layer.clone(),
        manifest_json: serde_json::to_vec(&manifest).map_err(|e| OciError::Io {
            context: "serializing the manifest".to_string(),
            source: io::Error::other(e),
        })?,
        config_json,
        config_digest: manifest.config.digest.clone(),
    };
    let manifest_digest = digest_of(&blobs.manifest_json);
    match target {
        ExportTarget::Layout(path) => {
            let (path, digest) = (path.clone(), manifest_digest.clone());
            blocking(move || write_layout(&path, &blobs, &digest)).await?;
        }
        ExportTarget::Push(reference) => push(reference, &blobs, opts).await?,
    }
    Ok(ExportSummary {
        manifest_digest,
        layer_bytes: layer.size,
        layer_digest: layer.digest,
    })
}

/// Everything an image consists of, ready to write or push.
struct Blobs {
    layer_path: PathBuf,
    layer: LayerBlob,
    config_json: Vec<u8>,
    config_digest: String,
    manifest_json: Vec<u8>,
}

fn digest_of(data: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(data);
    finish_digest(h)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, OciError> + Send + 'static,
) -> Result<T, OciError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| OciError::io("exporting an image")(io::Error::other(e)))?
}

/// Writes an OCI image layout tar to `path`, atomically (a temporary file renamed into place).
fn write_layout(path: &Path, blobs: &Blobs, manifest_digest: &str) -> Result<(), OciError> {
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": OCI_IMAGE_INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": OCI_IMAGE_MEDIA_TYPE,
            "digest": manifest_digest,
            "size": blobs.manifest_json.len(),
            "annotations": { "org.opencontainers.image.ref.name": "latest" },
        }],
    });
    let index = index.to_string().into_bytes();
    let layer_name = blob_name(&blobs.layer.digest)?;
    let config_name = blob_name(&blobs.config_digest)?;
    let manifest_name = blob_name(manifest_digest)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = TempFile(path.with_file_name(format!(".{name}.tmp-{}", unique_suffix())));
    let write = || -> io::Result<()> {
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp.0)?;
        let mut tar = tar::Builder::new(BufWriter::with_capacity(1 << 20, file));
        let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
        append(&mut tar, "oci-layout", layout.len() as u64, &layout[..])?;
        append(&mut tar, "index.json", index.len() as u64, &index[..])?;
        append(&mut tar, "blobs/", 0, io::empty())?;
        append(&mut tar, "blobs/sha256/", 0, io::empty())?;
        let layer = File::open(&blobs.layer_path)?;
        append(&mut tar, &layer_name, blobs.layer.size, layer)?;
        let config = &blobs.config_json;
        append(&mut tar, &config_name, config.len() as u64, &config[..])?;
        let manifest = &blobs.manifest_json;
        append(
            &mut tar,
            &manifest_name,
            manifest.len() as u64,
            &manifest[..],
        )?;
        tar.into_inner()?
            .into_inner()
            .map_err(|e| e.into_error())?
            .sync_all()
    };
    write().map_err(OciError::io(format!("writing {}", path.display())))?;
    fs::rename(&tmp.0, path).map_err(OciError::io(format!("writing {}", path.display())))?;
    tmp.keep();
    Ok(())
}

/// One layout entry: a directory when `name` ends in `/`. Owners and times stay 0, so the
/// same image always gives the same layout bytes.
fn append(
    tar: &mut tar::Builder<impl Write>,
    name: &str,
    size: u64,
    data: impl Read,
) -> io::Result<()> {
    let mut h = tar::Header::new_gnu();
    let dir = name.ends_with('/');
    h.set_entry_type(if dir {
        tar::EntryType::Directory
    } else {
        tar::EntryType::Regular
    });
    h.set_mode(if dir { 0o755 } else { 0o644 });
    h.set_size(size);
    tar.append_data(&mut h, name, data)
}

/// Pushes the image to `reference`, skipping blobs the registry already has.
async fn push(reference: &str, blobs: &Blobs, opts: &RegistryOptions) -> Result<(), OciError> {
    let r = parse_reference(reference)?;
    let client = opts.client_for(&r)?;
    let auth = opts.registry_auth();
    let registry = r.registry().to_string();
    let err = |e: OciDistributionError| registry_error(e, &registry, reference, Phase::Push);
    // Fetches a push-scoped token now, so bad credentials fail here with a clear error.
    client
        .auth(&r, &auth, RegistryOperation::Push)
        .await
        .map_err(err)?;

    if !client
        .blob_exists(&r, &blobs.layer.digest)
        .await
        .unwrap_or(false)
    {
        let (tx, rx) = mpsc::channel(4);
        let path = blobs.layer_path.clone();
        let reader = tokio::task::spawn_blocking(move || stream_file(&path, tx));
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        });
        let pushed = client
            .push_blob_stream(&r, stream, &blobs.layer.digest, Some(blobs.layer.size))
            .await;
        // The reader ends on its own once the stream (and with it the receiver) is dropped.
        let _ = reader.await;
        pushed.map_err(err)?;
    }
    if !client
        .blob_exists(&r, &blobs.config_digest)
        .await
        .unwrap_or(false)
    {
        client
            .push_blob(&r, blobs.config_json.clone(), &blobs.config_digest)
            .await
            .map_err(err)?;
    }
    // Pushed as the exact bytes whose digest the summary reports.
    let content_type = OCI_IMAGE_MEDIA_TYPE.parse().map_err(|e| OciError::Io {
        context: "building the manifest request".to_string(),
        source: io::Error::other(format!("{e}")),
    })?;
    client
        .push_manifest_raw(&r, blobs.manifest_json.clone(), content_type)
        .await
        .map_err(err)?;
    Ok(())
}

/// Sends `path` in 4 MiB chunks (oci-client's PATCH size) down `tx`.
fn stream_file(path: &Path, tx: mpsc::Sender<Result<Bytes, OciDistributionError>>) {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) => {
            let _ = tx.blocking_send(Err(e.into()));
            return;
        }
    };
    loop {
        let mut buf = vec![0; 4 << 20];
        let n = match read_full(&mut file, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                let _ = tx.blocking_send(Err(e.into()));
                return;
            }
        };
        if n == 0 {
            return;
        }
        buf.truncate(n);
        if tx.blocking_send(Ok(Bytes::from(buf))).is_err() {
            return;
        }
    }
}

/// Fills `buf` unless the file ends first; returns how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// A temporary file removed when dropped unless kept.
struct TempFile(PathBuf);

impl TempFile {
    fn keep(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.0);
        }
    }
}

/// Checks that `digest` is a sha256 digest and returns the blob path inside a layout.
fn blob_name(digest: &str) -> Result<String, OciError> {
    Ok(format!("blobs/sha256/{}", sha256_hex(digest)?))
}
