//! Pulling an image: manifest (through a multi-arch index to linux/amd64), config, and every
//! layer not already cached, each streamed from the registry through sha256 verification into
//! [`unpack_layer`] on a blocking thread, in a temporary directory renamed into place only
//! once complete.

use std::io;
use std::path::{Path, PathBuf};

use futures_util::StreamExt;
use oci_client::client::linux_amd64_resolver;
use oci_client::errors::DigestError;
use oci_client::manifest::{OciDescriptor, OciImageManifest, OciManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::blobio::{finish_digest, sha256_hex, unique_suffix, ChannelReader, HashingReader};
use super::config::ImageConfig;
use super::error::{registry_error, OciError, Phase};
use super::layer_compression;
use super::registry::{parse_reference, RegistryOptions};
use super::unpack::unpack_layer;

/// Image configs are small JSON documents; a bigger one is an attack on our memory.
const MAX_CONFIG_BYTES: u64 = 8 << 20;
/// Progress is reported at most once per this many bytes of a layer.
const PROGRESS_STEP: u64 = 1 << 20;

/// A pulled image: its layers, bottom first, as overlay-format directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledImage {
    /// The reference as given.
    pub reference: String,
    /// The digest of the (platform) image manifest the layers came from.
    pub manifest_digest: String,
    pub layers: Vec<PulledLayer>,
    pub config: ImageConfig,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PulledLayer {
    /// The compressed blob's digest, as in the manifest.
    pub digest: String,
    /// [`layer_key`] of `digest`: the directory's name under `layers_root`.
    pub key: String,
    pub dir: PathBuf,
    /// Whether the directory was already there (nothing downloaded).
    pub cached: bool,
}

/// What a pull is doing, for a progress bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PullProgress {
    /// The manifest is in: `layers` layers of `bytes_total` compressed bytes in all.
    Resolved { layers: usize, bytes_total: u64 },
    /// Layer `index` is downloading.
    Layer {
        index: usize,
        digest: String,
        bytes_done: u64,
        bytes_total: u64,
    },
    /// Layer `index` was already unpacked.
    LayerCached { index: usize, digest: String },
    /// Layer `index` is downloaded, verified and unpacked.
    LayerDone { index: usize },
}

/// The cache directory name of the layer with (compressed) digest `digest`.
pub fn layer_key(digest: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"oci-layer\0");
    h.update(digest.as_bytes());
    hex::encode(h.finalize())[..32].to_string()
}

/// Pulls `reference` into `layers_root` (see the [module docs](super)).
pub async fn pull(
    reference: &str,
    layers_root: &Path,
    opts: &RegistryOptions,
    progress: &(dyn Fn(PullProgress) + Send + Sync),
) -> Result<PulledImage, OciError> {
    let r = parse_reference(reference)?;
    let remote = Remote {
        client: opts.client_for(&r)?,
        auth: opts.registry_auth(),
        registry: r.registry().to_string(),
        name: reference.to_string(),
        reference: r,
    };
    let (manifest, manifest_digest) = remote.image_manifest().await?;
    // Refuse what cannot be unpacked before downloading anything.
    for layer in &manifest.layers {
        layer_compression(&layer.media_type)?;
        sha256_hex(&layer.digest)?;
    }
    let config_json = remote.small_blob(&manifest.config).await?;
    let config = ImageConfig::from_json(&config_json).map_err(|e| OciError::BadImage {
        reference: reference.to_string(),
        message: format!("invalid image config: {e}"),
    })?;

    let bytes_total = manifest.layers.iter().map(|l| l.size.max(0) as u64).sum();
    progress(PullProgress::Resolved {
        layers: manifest.layers.len(),
        bytes_total,
    });
    std::fs::create_dir_all(layers_root)
        .map_err(OciError::io(format!("creating {}", layers_root.display())))?;
    let mut layers = Vec::with_capacity(manifest.layers.len());
    for (index, desc) in manifest.layers.iter().enumerate() {
        let key = layer_key(&desc.digest);
        let dir = layers_root.join(&key);
        let cached = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir());
        if cached {
            progress(PullProgress::LayerCached {
                index,
                digest: desc.digest.clone(),
            });
        } else {
            remote
                .layer(desc, index, layers_root, &key, progress)
                .await?;
            progress(PullProgress::LayerDone { index });
        }
        layers.push(PulledLayer {
            digest: desc.digest.clone(),
            key,
            dir,
            cached,
        });
    }
    Ok(PulledImage {
        reference: reference.to_string(),
        manifest_digest,
        layers,
        config,
    })
}

/// One image on one registry, with the client and credentials to reach it.
struct Remote {
    client: Client,
    auth: RegistryAuth,
    /// For messages: the registry as the user wrote it.
    registry: String,
    /// For messages: the reference as the user wrote it.
    name: String,
    reference: Reference,
}

impl Remote {
    fn error(
        &self,
        phase: Phase,
    ) -> impl FnOnce(oci_client::errors::OciDistributionError) -> OciError + '_ {
        move |e| registry_error(e, &self.registry, &self.name, phase)
    }

    /// The image manifest, through an index to its linux/amd64 entry.
    async fn image_manifest(&self) -> Result<(OciImageManifest, String), OciError> {
        let (manifest, digest) = self
            .client
            .pull_manifest(&self.reference, &self.auth)
            .await
            .map_err(self.error(Phase::Manifest))?;
        let index = match manifest {
            OciManifest::Image(m) => return Ok((m, digest)),
            OciManifest::ImageIndex(index) => index,
        };
        let platform =
            linux_amd64_resolver(&index.manifests).ok_or_else(|| OciError::NoLinuxAmd64 {
                reference: self.name.clone(),
            })?;
        // A digest reference makes oci-client verify the manifest against it.
        let by_digest = self.reference.clone_with_digest(platform);
        let (manifest, digest) = self
            .client
            .pull_manifest(&by_digest, &self.auth)
            .await
            .map_err(self.error(Phase::Manifest))?;
        match manifest {
            OciManifest::Image(m) => Ok((m, digest)),
            OciManifest::ImageIndex(_) => Err(OciError::BadImage {
                reference: self.name.clone(),
                message: "its linux/amd64 entry is another index".to_string(),
            }),
        }
    }

    /// A blob small enough for memory (the config), verified.
    async fn small_blob(&self, desc: &OciDescriptor) -> Result<Vec<u8>, OciError> {
        sha256_hex(&desc.digest)?;
        let mut stream = self
            .client
            .pull_blob_stream(&self.reference, desc)
            .await
            .map_err(self.error(Phase::Blob))?;
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| stream_error(e, &desc.digest))?;
            data.extend_from_slice(&chunk);
            if data.len() as u64 > MAX_CONFIG_BYTES {
                return Err(OciError::BadImage {
                    reference: self.name.clone(),
                    message: format!("its config is larger than {MAX_CONFIG_BYTES} bytes"),
                });
            }
        }
        let mut h = Sha256::new();
        h.update(&data);
        check_digest(&desc.digest, finish_digest(h))?;
        Ok(data)
    }

    /// Downloads and unpacks one layer into `layers_root/key`.
    async fn layer(
        &self,
        desc: &OciDescriptor,
        index: usize,
        layers_root: &Path,
        key: &str,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<(), OciError> {
        let tmp = TempDir(layers_root.join(format!(".tmp-{key}-{}", unique_suffix())));
        let mut stream = self
            .client
            .pull_blob_stream(&self.reference, desc)
            .await
            .map_err(self.error(Phase::Blob))?;

        // A small bounded channel: the download never runs more than a few chunks ahead of
        // the unpacker, so memory stays flat however big the layer is.
        let (tx, rx) = mpsc::channel::<io::Result<bytes::Bytes>>(16);
        let media_type = desc.media_type.clone();
        let dest = tmp.0.clone();
        let unpacker = tokio::task::spawn_blocking(move || {
            let mut reader = HashingReader::new(ChannelReader::new(rx));
            unpack_layer(&mut reader, &media_type, &dest)?;
            reader
                .finish()
                .map_err(OciError::io("reading the layer after its tar ended"))
        });

        let bytes_total = desc.size.max(0) as u64;
        let (mut done, mut reported) = (0u64, 0u64);
        let mut unpacker = Some(unpacker);
        // Set when the unpacker failed before the download ended (see below).
        let mut early_failure = None;
        let mut stream_failure = None;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                Err(e) => {
                    stream_failure = Some(stream_error(e, &desc.digest));
                    break;
                }
            };
            done += chunk.len() as u64;
            if bytes_total > 0 && done > bytes_total {
                stream_failure = Some(OciError::BadImage {
                    reference: self.name.clone(),
                    message: format!("layer {} is larger than its manifest says", desc.digest),
                });
                break;
            }
            if early_failure.is_none() && tx.send(Ok(chunk)).await.is_err() {
                // The unpacker stopped. An entry it refused is the image's fault and final;
                // any other failure may be corruption in transit, which only the rest of the
                // download (verified by oci-client at its end) can tell apart.
                let err = match join(unpacker.take()).await {
                    Err(e) => e,
                    Ok(_) => OciError::io("unpacking a layer")(io::Error::other("stopped early")),
                };
                if matches!(
                    err,
                    OciError::Unpack { .. }
                        | OciError::PathTooLong { .. }
                        | OciError::TooManyEntries { .. }
                ) {
                    return Err(err);
                }
                early_failure = Some(err);
            }
            if done - reported >= PROGRESS_STEP || done == bytes_total {
                reported = done;
                progress(PullProgress::Layer {
                    index,
                    digest: desc.digest.clone(),
                    bytes_done: done,
                    bytes_total,
                });
            }
        }
        if stream_failure.is_some() {
            // Make the unpacker fail rather than take a truncated stream for a complete one.
            let _ = tx.send(Err(io::Error::other("download failed"))).await;
        }
        drop(tx);
        let unpacked = match early_failure {
            Some(e) => Err(e),
            None => join(unpacker.take()).await,
        };
        // A download failure explains an unpack failure, not the other way round.
        if let Some(e) = stream_failure {
            return Err(e);
        }
        let (actual, _) = unpacked?;
        check_digest(&desc.digest, actual)?;

        let dir = layers_root.join(key);
        // Written out before it gets its name (a crash must not leave a half-written entry).
        std::fs::File::open(&tmp.0)
            .and_then(|f| husk_runtime::sys::syncfs(std::os::fd::AsFd::as_fd(&f)))
            .map_err(OciError::io(format!(
                "syncing a layer in {}",
                layers_root.display()
            )))?;
        match std::fs::rename(&tmp.0, &dir) {
            Ok(()) => {
                tmp.keep();
                Ok(())
            }
            // Another pull of the same layer won the race; its copy is as good as ours.
            Err(_) if std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) => Ok(()),
            Err(e) => Err(OciError::io(format!(
                "moving a layer into {}",
                dir.display()
            ))(e)),
        }
    }
}

/// The result of the unpacking task (`None`: already joined, which callers rule out).
async fn join<T>(
    handle: Option<tokio::task::JoinHandle<Result<T, OciError>>>,
) -> Result<T, OciError> {
    let failed = |e| OciError::io("unpacking a layer")(io::Error::other(e));
    match handle {
        Some(handle) => handle.await.map_err(|e| failed(e.to_string()))?,
        None => Err(failed("the unpacker was already joined".to_string())),
    }
}

/// A download stream error: oci-client's own digest check reports a mismatch this way.
fn stream_error(e: io::Error, digest: &str) -> OciError {
    if let Some(DigestError::VerificationError { actual, .. }) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<DigestError>())
    {
        return OciError::DigestMismatch {
            expected: digest.to_string(),
            actual: actual.clone(),
        };
    }
    OciError::io(format!("downloading {digest}"))(e)
}

fn check_digest(expected: &str, actual: String) -> Result<(), OciError> {
    if actual == expected {
        Ok(())
    } else {
        Err(OciError::DigestMismatch {
            expected: expected.to_string(),
            actual,
        })
    }
}

/// A half-unpacked layer, removed unless it made it into the cache (also when the pull is
/// cancelled or panics).
struct TempDir(PathBuf);

impl TempDir {
    fn keep(mut self) {
        self.0 = PathBuf::new();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.0.as_os_str().is_empty() {
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!(dir = %self.0.display(), error = %e, "cannot remove a temporary layer");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_keys() {
        let k = layer_key("sha256:abc");
        assert_eq!(k.len(), 32);
        assert!(k.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(k, layer_key("sha256:abd"));
    }
}
