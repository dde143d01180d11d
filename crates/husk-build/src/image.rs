//! The template image: the merged layer stack written as one erofs file (lz4hc-compressed,
//! modification times kept, so Python's bytecode caches stay valid), named by its SHA-256 and
//! renamed into place complete. Only then is it registered; an image nobody registers any
//! more is removed (and its shared mount detached) when its template is replaced or removed.

use std::fs;
use std::path::{Path, PathBuf};

use husk_core::store::{Store, TemplateRecord};
use husk_core::template;

use crate::layers::{rand64, LayerCache};

/// A written image.
pub struct Image {
    pub path: PathBuf,
    pub digest: String,
    pub size: u64,
    /// Bytes of regular files in the root file system it holds.
    pub rootfs_bytes: u64,
}

/// mkfs.erofs options: lz4hc compression and per-file modification times.
pub const MKFS_ARGS: &[&str] = &["-zlz4hc", "--quiet", "--preserve-mtime"];

/// The image's build time: fixed, so the same layers make the same image, byte for byte (and a
/// template built on it hits the cache). mkfs.erofs clamps newer modification times to it, so
/// it lies far in the future (2100-01-01) and keeps every file's own time.
const SOURCE_DATE_EPOCH: &str = "4102444800";

/// The image's file-system UUID, derived from the top layer's key (the same layers, the same
/// UUID).
fn uuid_of(key: &str) -> String {
    husk_core::ids::uuid_shaped(key)
}

/// The record of which image a layer stack made: `<images>/by-key/<top key>` holds
/// `<digest> <size> <rootfs bytes>`. Images are reproducible, so a build whose every layer
/// came from the cache reuses the image instead of writing it again.
fn by_key(images: &Path, top_key: &str) -> PathBuf {
    images.join("by-key").join(top_key)
}

/// The image the same stack made before, if its file is still there and intact (its size and
/// its SHA-256: a damaged image is written again, not registered again). The check is the
/// spawners' own ([`husk_runtime::images::Verifier`]): a file already hashed since it last
/// changed is not read again, and one hashed now is recorded for them.
fn made_before(images: &Path, run_dir: &Path, top_key: &str) -> Option<Image> {
    let text = fs::read_to_string(by_key(images, top_key)).ok()?;
    let mut f = text.split_whitespace();
    let (digest, size, rootfs_bytes) =
        (f.next()?, f.next()?.parse().ok()?, f.next()?.parse().ok()?);
    let hex = husk_runtime::images::digest_hex(digest).ok()?;
    let path = images.join(format!("{hex}.erofs"));
    husk_runtime::images::Verifier::default()
        .verify(run_dir, &path, size, digest)
        .ok()?;
    Some(Image {
        path,
        digest: digest.to_string(),
        size,
        rootfs_bytes,
    })
}

/// Writes the image of `lower` (top first, the top layer's cache key `top_key`) into the
/// state directory, or reuses the one the same stack made (unless `fresh`).
pub async fn make(
    state_dir: &Path,
    run_dir: &Path,
    cache: &LayerCache,
    lower: &[PathBuf],
    top_key: &str,
    fresh: bool,
) -> Result<Image, String> {
    let images = template::images_dir(state_dir);
    if !fresh {
        let (dir, run, key) = (images.clone(), run_dir.to_path_buf(), top_key.to_string());
        let before = tokio::task::spawn_blocking(move || made_before(&dir, &run, &key))
            .await
            .ok()
            .flatten();
        if let Some(image) = before {
            return Ok(image);
        }
    }
    let image = write(state_dir, run_dir, cache, lower, top_key).await?;
    let record = by_key(&images, top_key);
    let _ = fs::create_dir_all(record.parent().unwrap_or(&images));
    let _ = fs::write(
        &record,
        format!("{} {} {}\n", image.digest, image.size, image.rootfs_bytes),
    );
    Ok(image)
}

async fn write(
    state_dir: &Path,
    run_dir: &Path,
    cache: &LayerCache,
    lower: &[PathBuf],
    top_key: &str,
) -> Result<Image, String> {
    let mut args: Vec<String> = MKFS_ARGS.iter().map(|a| a.to_string()).collect();
    args.push(format!("-U{}", uuid_of(top_key)));
    let images = template::images_dir(state_dir);
    fs::create_dir_all(&images).map_err(|e| format!("{}: {e}", images.display()))?;
    let tag = format!("{}-{:x}", std::process::id(), rand64());
    let tmp = images.join(format!(".tmp-{tag}.erofs"));
    let mnt = cache.dir.join(format!(".mnt-{tag}"));
    let empty = cache.dir.join(format!(".empty-{tag}"));
    let mut layers: Vec<PathBuf> = lower.to_vec();
    // overlayfs needs two lower layers without an upper one: an empty one does no harm, and
    // a single layer's own whiteouts then still mean "nothing here".
    if layers.len() == 1 {
        layers.push(empty.clone());
    }
    let result = async {
        for d in [&mnt, &empty] {
            fs::create_dir(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let (dir, tmp2, mnt2, layers2) = (cache.dir.clone(), tmp.clone(), mnt.clone(), layers);
        let args = args.clone();
        let out = tokio::task::spawn_blocking(move || {
            husk_runtime::layerfs::mkfs_erofs_merged(
                &layers2,
                &dir,
                &mnt2,
                &tmp2,
                &args,
                &[("SOURCE_DATE_EPOCH", SOURCE_DATE_EPOCH)],
            )
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("running mkfs.erofs (is erofs-utils installed?): {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "mkfs.erofs failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let tmp3 = tmp.clone();
        let digest = tokio::task::spawn_blocking(move || template::sha256_file(&tmp3))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("hashing the image: {e}"))?;
        let hex = husk_runtime::images::digest_hex(&digest).map_err(|e| e.to_string())?;
        let path = images.join(format!("{hex}.erofs"));
        // On disk before it gets its name (and before a template can be registered on it).
        fs::File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("writing the image: {e}"))?;
        let size = fs::metadata(&tmp).map_err(|e| e.to_string())?.len();
        fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok::<_, String>((path, digest, size))
    }
    .await;
    let _ = fs::remove_dir(&mnt);
    let _ = fs::remove_dir(&empty);
    let _ = fs::remove_file(&tmp);
    let (path, digest, size) = result?;
    // Hashed above as it was written: the spawners need not read it all again (best effort).
    let _ = husk_runtime::images::record_verified(run_dir, &path, &digest);
    // Measured through the mounted image (the same mount sandboxes will share).
    let rootfs_bytes = husk_runtime::images::ensure_mounted(run_dir, &path, size, &digest)
        .ok()
        .and_then(|mp| crate::layers::tree_size(mp.path()).ok())
        .map_or(0, |(bytes, _)| bytes);
    Ok(Image {
        path,
        digest,
        size,
        rootfs_bytes,
    })
}

/// After `old` was unregistered or replaced: removes its image file and detaches its mount
/// unless another template still uses the same image.
pub fn release(store: &Store, run_dir: &Path, old: &TemplateRecord) {
    if store.image_in_use(&old.digest).unwrap_or(true) {
        // Rebuilt into the same image: only a mount of the file it replaced goes.
        let _ = husk_runtime::images::unmount_replaced(run_dir, &old.digest, &old.image);
        return;
    }
    let _ = husk_runtime::images::unmount(run_dir, &old.digest, &old.image);
    let _ = fs::remove_file(&old.image);
}
