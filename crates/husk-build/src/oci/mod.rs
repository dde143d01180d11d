//! OCI images in and out of husk's template builds.
//!
//! - [`pull`] resolves a reference (a multi-arch index to its linux/amd64 manifest), downloads
//!   every layer it has not seen before, verifies its sha256 while streaming, and unpacks it with
//!   [`unpack_layer`] into an overlay-format layer directory `layers_root/<layer_key(digest)>`
//!   (whiteouts as 0/0 character devices, opaque directories marked with the overlay xattr; see
//!   [`husk_runtime::layerfs`]). A stack of those directories is mounted as overlay lower layers.
//! - [`export`] turns a finished root file system back into a one-layer image, written as an OCI
//!   image layout tar or pushed to a registry.
//!
//! Images are hostile input: the unpacker never follows a symlink it did not resolve itself,
//! refuses `..`, keeps every write beneath the destination, drops device nodes and refuses to
//! let an image set `trusted.*` xattrs (which would forge overlayfs metadata).
//!
//! ```no_run
//! # async fn demo() -> Result<(), husk_build::oci::OciError> {
//! use husk_build::oci::{pull, RegistryOptions};
//! let opts = RegistryOptions::from_env();
//! let image = pull("debian:bookworm", "/var/lib/husk/layers".as_ref(), &opts, &|p| {
//!     eprintln!("{p:?}")
//! })
//! .await?;
//! for layer in &image.layers {
//!     println!("{} -> {}", layer.digest, layer.dir.display());
//! }
//! # Ok(()) }
//! ```

mod blobio;
mod config;
mod error;
mod export;
mod layer_tar;
mod pull;
mod registry;
mod unpack;

pub use config::ImageConfig;
pub use error::OciError;
pub use export::{export, ExportSummary, ExportTarget};
pub use pull::{layer_key, pull, PullProgress, PulledImage, PulledLayer};
pub use registry::RegistryOptions;
pub use unpack::{unpack_layer, UnpackStats, MAX_ENTRIES, MAX_PATH_LEN};

/// Layer media types husk unpacks, with the compression each one means.
pub(crate) fn layer_compression(media_type: &str) -> Result<Compression, OciError> {
    // The nondistributable variants are deprecated but still found in old Windows-free images;
    // their blobs are ordinary tars once fetched.
    Ok(match media_type {
        "application/vnd.oci.image.layer.v1.tar"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar"
        | "application/vnd.docker.image.rootfs.diff.tar" => Compression::None,
        "application/vnd.oci.image.layer.v1.tar+gzip"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
        | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Compression::Gzip,
        "application/vnd.oci.image.layer.v1.tar+zstd"
        | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
        | "application/vnd.docker.image.rootfs.diff.tar.zstd" => Compression::Zstd,
        other => {
            return Err(OciError::UnsupportedMediaType {
                media_type: other.to_string(),
            })
        }
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// The media type of the layers [`export`] writes.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
