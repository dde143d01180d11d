//! Template images: erofs files, each mounted once on the host and shared read-only by every
//! sandbox of its template.
//!
//! The mount lives at `<run_dir>/images/<hex digest>` in the host's mount namespace (so every
//! husk process and every sandbox created after it shares it) and is made directly from the
//! image file where the kernel can (Linux 6.12+ mounts erofs from a regular file, in about
//! 0.05 ms), else through a read-only, auto-clearing loop device. Sandboxes never see this
//! mount itself: each gets an id-mapped view of it (see [`crate::rootfs`]).
//!
//! The image file is checked at every creation: a missing file or one whose size is not the
//! size recorded when it was built (truncated, replaced) is refused with a clear error. The
//! content digest is checked by the caller when it first uses an image (hashing hundreds of
//! megabytes does not belong in every create).

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::sys::{self, cpath};

/// statfs magic of erofs.
const EROFS_MAGIC: i64 = 0xE0F5_E1E2;

/// Errors of preparing a template image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("template image {0} is missing: rebuild the template")]
    Missing(PathBuf),
    #[error(
        "template image {path} is damaged: {actual} bytes instead of {expected} \
         (truncated or replaced); rebuild the template"
    )]
    SizeMismatch {
        path: PathBuf,
        expected: u64,
        actual: u64,
    },
    #[error("invalid image digest {0:?}")]
    BadDigest(String),
    #[error("template image {path} cannot be mounted (not a valid erofs image?): {source}")]
    Mount {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_ctx(what: impl Into<String>) -> impl FnOnce(io::Error) -> ImageError {
    let what = what.into();
    move |source| ImageError::Io { what, source }
}

/// The hex part of a `sha256:<64 hex>` digest.
pub fn digest_hex(digest: &str) -> Result<&str, ImageError> {
    match digest.strip_prefix("sha256:") {
        Some(h) if h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) => {
            Ok(h)
        }
        _ => Err(ImageError::BadDigest(digest.to_string())),
    }
}

/// Where the image with `digest` is mounted.
pub fn mount_point(run_dir: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    Ok(run_dir.join("images").join(digest_hex(digest)?))
}

/// Checks the image file and makes sure it is mounted; returns the mount point.
pub fn ensure_mounted(
    run_dir: &Path,
    path: &Path,
    size: u64,
    digest: &str,
) -> Result<PathBuf, ImageError> {
    check_file(path, size)?;
    let mp = mount_point(run_dir, digest)?;
    let mp_c = cpath(&mp).map_err(io_ctx("image mount point"))?;
    if sys::statfs_type(&mp_c).ok() == Some(EROFS_MAGIC) {
        return Ok(mp);
    }
    let images = run_dir.join("images");
    fs::create_dir_all(&mp).map_err(io_ctx(format!("create {}", mp.display())))?;
    // Traversable (sandbox set-up opens it as host root, but keep the listing private).
    let _ = fs::set_permissions(&images, fs::Permissions::from_mode(0o711));
    mount(path, &mp_c).map_err(|source| ImageError::Mount {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(mp)
}

/// Refuses a missing image file or one of the wrong size.
pub fn check_file(path: &Path, size: u64) -> Result<(), ImageError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == size => Ok(()),
        Ok(m) if m.is_file() => Err(ImageError::SizeMismatch {
            path: path.to_path_buf(),
            expected: size,
            actual: m.len(),
        }),
        Ok(_) => Err(ImageError::Missing(path.to_path_buf())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(ImageError::Missing(path.to_path_buf()))
        }
        Err(e) => Err(io_ctx(format!("stat {}", path.display()))(e)),
    }
}

/// Mounts the erofs image file `path` read-only on `target`: from the file itself, or from a
/// loop device on kernels without file-backed erofs.
fn mount(path: &Path, target: &CString) -> io::Result<()> {
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    let src = cpath(path)?;
    match sys::mount(Some(&src), target, Some(c"erofs"), flags, None) {
        Ok(()) => Ok(()),
        // ENOTBLK: this kernel wants a block device.
        Err(e) if e.raw_os_error() == Some(libc::ENOTBLK) => {
            let file = fs::File::open(path)?;
            let dev = sys::loop_attach_ro(file.as_fd())?;
            sys::mount(Some(&cpath(&dev)?), target, Some(c"erofs"), flags, None)
        }
        Err(e) => Err(e),
    }
}

/// Detaches the mount of the image with `digest` (after its template was removed). Sandboxes
/// that use it keep their own references; the mount point is removed.
pub fn unmount(run_dir: &Path, digest: &str) -> Result<(), ImageError> {
    let mp = mount_point(run_dir, digest)?;
    let c = cpath(&mp).map_err(io_ctx("image mount point"))?;
    while sys::statfs_type(&c).ok() == Some(EROFS_MAGIC) {
        sys::umount2(&c, libc::MNT_DETACH).map_err(io_ctx(format!("unmount {}", mp.display())))?;
    }
    let _ = fs::remove_dir(&mp);
    Ok(())
}

/// Test-only access to the loop fallback.
#[cfg(test)]
pub(crate) fn mount_via_loop(path: &Path, target: &Path) -> io::Result<()> {
    let file = fs::File::open(path)?;
    let dev = sys::loop_attach_ro(file.as_fd())?;
    sys::mount(
        Some(&cpath(&dev)?),
        &cpath(target)?,
        Some(c"erofs"),
        libc::MS_RDONLY,
        None,
    )
}
