//! Template images: erofs files, each mounted once on the host and shared read-only by every
//! sandbox of its template.
//!
//! The mount lives at `<run_dir>/images/<hex digest>` in the host's mount namespace (so every
//! husk process and every sandbox created after it shares it) and is made directly from the
//! image file where the kernel can (Linux 6.12+ mounts erofs from a regular file, in about
//! 0.05 ms), else through a read-only, auto-clearing loop device. Sandboxes never see this
//! mount itself: each gets an id-mapped view of it (see [`crate::rootfs`]).
//!
//! Mounts stay only while a husk process uses them. Every user holds a shared lock on
//! `<run_dir>/images/.lock` ([`Mounted`]; a spawner from its first image sandbox to its end);
//! whoever finds the lock free for the taking ([`release_unused`]: a spawner that used images
//! as it ends, or a server's spawner at start, after a crash) detaches every image mount, so no mount outlives its last user and
//! pins an image file a removed state directory held. Sandboxes keep their own references
//! (their mount namespaces were copied while the mount existed).
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

use crate::modules::{self, Module};
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
    #[error(
        "template image {path} is damaged: its content does not match its digest \
         (expected {expected}, found {found}); rebuild the template"
    )]
    Corrupt {
        path: PathBuf,
        expected: String,
        found: String,
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

/// The directory under which the image with `digest` is mounted: one mount per image file
/// (`<dev>-<inode>`), so an image file replaced by a rebuild is mounted afresh rather than
/// through a mount of the file it replaced.
pub fn mount_point(run_dir: &Path, digest: &str) -> Result<PathBuf, ImageError> {
    Ok(run_dir.join("images").join(digest_hex(digest)?))
}

/// A mounted image, which stays mounted as long as this value lives (it holds a shared lock
/// that [`release_unused`] needs exclusively).
#[derive(Debug)]
pub struct Mounted {
    path: PathBuf,
    lock: fs::File,
}

impl Mounted {
    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The lock alone: keeps every image mount of the run directory in place (a spawner holds
    /// one for its lifetime).
    pub fn into_lock(self) -> InUse {
        InUse(self.lock)
    }
}

/// Keeps every image mount in place while it lives (see [`Mounted::into_lock`]).
#[derive(Debug)]
pub struct InUse(#[allow(dead_code)] fs::File);

impl InUse {
    /// [`ensure_mounted`] for a holder of the lock: no second lock per call (a spawner's
    /// every create of a built template's sandbox).
    pub fn ensure_mounted(
        &self,
        run_dir: &Path,
        path: &Path,
        size: u64,
        digest: &str,
    ) -> Result<PathBuf, ImageError> {
        mount_checked(run_dir, path, size, digest)
    }
}

/// Takes the images lock of `run_dir` shared (waiting while a [`release_unused`] runs) or,
/// with `exclusive`, tries to take it alone (`None` if any user holds it).
fn images_lock(run_dir: &Path, exclusive: bool) -> Result<Option<fs::File>, ImageError> {
    use std::os::fd::AsRawFd;
    let images = run_dir.join("images");
    let path = images.join(".lock");
    let open = || {
        fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
    };
    // The directory exists after the first use: only then is it made (and its mode set).
    let file = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(&images).map_err(io_ctx(format!("create {}", images.display())))?;
            let _ = fs::set_permissions(&images, fs::Permissions::from_mode(0o711));
            open()
        }
        other => other,
    }
    .map_err(io_ctx(format!("open {}", path.display())))?;
    // Open-file-description locks: released when the holder's fd closes, a crash included.
    let kind = if exclusive {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    };
    let mut fl = sys::lock_range(kind, 0, 1);
    let cmd = if exclusive {
        libc::F_OFD_SETLK
    } else {
        libc::F_OFD_SETLKW
    };
    let got = sys::fcntl_lock(file.as_raw_fd(), cmd, &mut fl)
        .map_err(io_ctx(format!("lock {}", path.display())))?;
    Ok(got.then_some(file))
}

/// Detaches every image mount under `run_dir` if no husk process uses images (nobody holds
/// the images lock); returns how many it detached. Sandboxes that use them keep their own
/// references.
pub fn release_unused(run_dir: &Path) -> Result<usize, ImageError> {
    let images = run_dir.join("images");
    if !images.is_dir() {
        return Ok(0);
    }
    let Some(_alone) = images_lock(run_dir, true)? else {
        return Ok(0);
    };
    let mut detached = 0;
    let Ok(rd) = fs::read_dir(&images) else {
        return Ok(0);
    };
    for digest in rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
    {
        // husk before 0.1 mounted an image at the digest's directory itself.
        detached += detach(&digest.path())?;
        if let Ok(mounts) = fs::read_dir(digest.path()) {
            for m in mounts.flatten() {
                detached += detach(&m.path())?;
                let _ = fs::remove_dir(m.path());
            }
        }
        let _ = fs::remove_dir(digest.path());
    }
    Ok(detached)
}

/// Checks the image file and makes sure it is mounted; the mount stays while the returned
/// value lives.
pub fn ensure_mounted(
    run_dir: &Path,
    path: &Path,
    size: u64,
    digest: &str,
) -> Result<Mounted, ImageError> {
    let lock = images_lock(run_dir, false)?
        .ok_or_else(|| io_ctx("lock images")(io::Error::from(io::ErrorKind::WouldBlock)))?;
    let path = mount_checked(run_dir, path, size, digest)?;
    Ok(Mounted { path, lock })
}

/// Checks the image file and mounts it if it is not yet; the caller holds the images lock.
fn mount_checked(
    run_dir: &Path,
    path: &Path,
    size: u64,
    digest: &str,
) -> Result<PathBuf, ImageError> {
    use std::os::unix::fs::MetadataExt;
    let meta = checked_file(path, size)?;
    let dir = mount_point(run_dir, digest)?;
    let mp = dir.join(format!("{}-{}", meta.dev(), meta.ino()));
    let mp_c = cpath(&mp).map_err(io_ctx("image mount point"))?;
    if sys::statfs_type(&mp_c).ok() == Some(EROFS_MAGIC) {
        return Ok(mp);
    }
    let images = run_dir.join("images");
    // husk before 0.1 mounted an image at `dir` itself.
    detach(&dir)?;
    fs::create_dir_all(&mp).map_err(io_ctx(format!("create {}", mp.display())))?;
    // Traversable (sandbox set-up opens it as host root, but keep the listing private).
    for d in [&images, &dir] {
        let _ = fs::set_permissions(d, fs::Permissions::from_mode(0o711));
    }
    mount(path, &mp_c).map_err(|source| ImageError::Mount {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(mp)
}

/// Refuses a missing image file or one of the wrong size.
pub fn check_file(path: &Path, size: u64) -> Result<(), ImageError> {
    checked_file(path, size).map(drop)
}

/// [`check_file`], returning the file's metadata.
fn checked_file(path: &Path, size: u64) -> Result<fs::Metadata, ImageError> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() == size => Ok(m),
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
    // Distribution kernels have erofs and loop as modules (see `crate::modules`).
    let _ = modules::ensure(Module::Erofs);
    match sys::mount(Some(&src), target, Some(c"erofs"), flags, None) {
        Ok(()) => Ok(()),
        // ENOTBLK: this kernel wants a block device.
        Err(e) if e.raw_os_error() == Some(libc::ENOTBLK) => {
            let _ = modules::ensure(Module::Loop);
            let file = fs::File::open(path)?;
            let (dev, _open) = sys::loop_attach_ro(file.as_fd())?;
            sys::mount(Some(&cpath(&dev)?), target, Some(c"erofs"), flags, None)
        }
        Err(e) => Err(e),
    }
}

/// Detaches the mounts of `digest` made from files other than `current` (an image file that a
/// rebuild replaced); sandboxes that use them keep their own references.
pub fn unmount_replaced(run_dir: &Path, digest: &str, current: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::MetadataExt;
    let keep = fs::metadata(current)
        .map(|m| format!("{}-{}", m.dev(), m.ino()))
        .unwrap_or_default();
    let dir = mount_point(run_dir, digest)?;
    let Ok(rd) = fs::read_dir(&dir) else {
        return Ok(());
    };
    for e in rd.flatten() {
        if e.file_name().to_string_lossy() == keep {
            continue;
        }
        detach(&e.path())?;
        let _ = fs::remove_dir(e.path());
    }
    Ok(())
}

/// Detaches every erofs mount stacked on `mp`; returns how many.
fn detach(mp: &Path) -> Result<usize, ImageError> {
    let c = cpath(mp).map_err(io_ctx("image mount point"))?;
    let mut n = 0;
    while sys::statfs_type(&c).ok() == Some(EROFS_MAGIC) {
        sys::umount2(&c, libc::MNT_DETACH).map_err(io_ctx(format!("unmount {}", mp.display())))?;
        n += 1;
    }
    Ok(n)
}

/// Detaches the mount of the image file `file` (after its template was removed; call before
/// deleting the file). Only that file's mount: the same image may be mounted from another
/// state directory's file (images are reproducible, so equal templates have equal digests),
/// and those mounts are not this caller's. Sandboxes that use it keep their own references.
pub fn unmount(run_dir: &Path, digest: &str, file: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::MetadataExt;
    let dir = mount_point(run_dir, digest)?;
    // husk before 0.1 mounted an image at `dir` itself.
    detach(&dir)?;
    if let Ok(m) = fs::metadata(file) {
        let mp = dir.join(format!("{}-{}", m.dev(), m.ino()));
        detach(&mp)?;
        let _ = fs::remove_dir(&mp);
    }
    // Gone only when no other file's mount is left under it.
    if fs::remove_dir(&dir).is_ok() {
        // The record that the image was verified (see husk-core's template module).
        let _ = fs::remove_file(dir.with_extension("verified"));
    }
    Ok(())
}

/// Test-only access to the loop fallback.
#[cfg(test)]
pub(crate) fn mount_via_loop(path: &Path, target: &Path) -> io::Result<()> {
    let file = fs::File::open(path)?;
    let (dev, _open) = sys::loop_attach_ro(file.as_fd())?;
    sys::mount(
        Some(&cpath(&dev)?),
        &cpath(target)?,
        Some(c"erofs"),
        libc::MS_RDONLY,
        None,
    )
}

#[cfg(test)]
mod tests {

    /// A directory with a run directory and an 8-byte "image" in it: (dir, run dir, image).
    fn scratch_image(name: &str) -> (PathBuf, PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!("husk-{name}-{}", std::process::id()));
        let run_dir = dir.join("run");
        fs::create_dir_all(&run_dir).unwrap();
        let image = dir.join("i.erofs");
        fs::write(&image, b"an image").unwrap();
        (dir, run_dir, image)
    }

    /// Writes other bytes of the same size in place, until the file's change time moves (on
    /// coarse clocks two writes can share one).
    fn rewrite(image: &Path) {
        let before = file_id(image).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while file_id(image).unwrap() == before && std::time::Instant::now() < deadline {
            fs::write(image, b"AN IMAGE").unwrap();
        }
    }

    #[test]
    fn the_verifier_takes_only_the_registered_content_and_sees_a_file_change() {
        let (dir, run_dir, image) = scratch_image("verify");
        let digest = sha256_file(&image).unwrap();
        let v = Verifier::default();
        v.verify(&run_dir, &image, 8, &digest).unwrap();
        // The marker lets another process skip the hash.
        assert!(Verifier::default()
            .verify(&run_dir, &image, 8, &digest)
            .is_ok());
        let other = format!("sha256:{}", "0".repeat(64));
        let e = Verifier::default()
            .verify(&run_dir, &image, 8, &other)
            .unwrap_err();
        assert!(matches!(e, ImageError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("rebuild the template"), "{e}");
        // Written in place, same size: hashed again, and refused.
        rewrite(&image);
        let e = v.verify(&run_dir, &image, 8, &digest).unwrap_err();
        assert!(matches!(e, ImageError::Corrupt { .. }), "{e}");
        let e = v.verify(&run_dir, &image, 9, &digest).unwrap_err();
        assert!(matches!(e, ImageError::SizeMismatch { .. }), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    /// What a template build records for the image it has just hashed is what the spawners
    /// go by: the file as it is is not read again; changed since, it is.
    #[test]
    fn a_builds_record_spares_the_spawners_the_hash_until_the_file_changes() {
        let (dir, run_dir, image) = scratch_image("recorded");
        // Recorded with a digest that is not its content's: accepted without a read, which
        // shows the record is what spared the hash.
        let recorded = format!("sha256:{}", "1".repeat(64));
        record_verified(&run_dir, &image, &recorded).unwrap();
        Verifier::default()
            .verify(&run_dir, &image, 8, &recorded)
            .unwrap();
        rewrite(&image);
        let e = Verifier::default()
            .verify(&run_dir, &image, 8, &recorded)
            .unwrap_err();
        assert!(matches!(e, ImageError::Corrupt { .. }), "{e}");
        assert!(record_verified(&run_dir, &image, "sha256:../x").is_err());
        let _ = fs::remove_dir_all(&dir);
    }

    use super::*;

    /// A temporary directory with a small erofs image; removed (and unmounted) on drop.
    struct Fixture {
        dir: PathBuf,
    }

    impl Drop for Fixture {
        fn drop(&mut self) {
            for mp in [self.dir.join("loop"), self.dir.join("run/images")] {
                let _ = sys::umount2(&cpath(&mp).unwrap(), libc::MNT_DETACH);
            }
            if let Ok(rd) = fs::read_dir(self.dir.join("run/images")) {
                for e in rd.flatten() {
                    if let Ok(mounts) = fs::read_dir(e.path()) {
                        for m in mounts.flatten() {
                            let _ = detach(&m.path());
                        }
                    }
                }
            }
            let _ = fs::remove_dir_all(&self.dir);
        }
    }

    fn fixture() -> (Fixture, PathBuf, u64) {
        let dir = std::env::temp_dir().join(format!(
            "husk-images-{}-{:x}",
            std::process::id(),
            sys::random_u64().unwrap()
        ));
        fs::create_dir_all(dir.join("tree/etc")).unwrap();
        fs::write(dir.join("tree/etc/hello"), "from the image\n").unwrap();
        let image = dir.join("t.erofs");
        let out = std::process::Command::new("mkfs.erofs")
            .args(["--quiet", "-zlz4hc"])
            .arg(&image)
            .arg(dir.join("tree"))
            .output()
            .expect("mkfs.erofs (erofs-utils) is installed by scripts/test");
        assert!(out.status.success(), "{out:?}");
        let size = fs::metadata(&image).unwrap().len();
        (Fixture { dir }, image, size)
    }

    const DIGEST: &str = "sha256:00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn an_image_is_mounted_once_and_a_damaged_one_is_refused() {
        let (fx, image, size) = fixture();
        let run = fx.dir.join("run");
        let mp = ensure_mounted(&run, &image, size, DIGEST)
            .unwrap()
            .path()
            .to_path_buf();
        assert_eq!(
            fs::read_to_string(mp.join("etc/hello")).unwrap(),
            "from the image\n"
        );
        // Mounted once: a second call finds the mount.
        assert_eq!(
            ensure_mounted(&run, &image, size, DIGEST)
                .unwrap()
                .path()
                .to_path_buf(),
            mp
        );
        let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert_eq!(mounts.matches(mp.to_str().unwrap()).count(), 1);
        // A file replaced by a rebuild (a new inode) gets a mount of its own, never the
        // replaced file's.
        let copy = fx.dir.join("copy.erofs");
        fs::copy(&image, &copy).unwrap();
        fs::rename(&copy, &image).unwrap();
        let mp2 = ensure_mounted(&run, &image, size, DIGEST)
            .unwrap()
            .path()
            .to_path_buf();
        assert_ne!(mp2, mp);
        assert_eq!(mp2.parent(), mp.parent());
        unmount_replaced(&run, DIGEST, &image).unwrap();
        assert!(
            !mp.exists() && mp2.exists(),
            "the replaced file's mount stayed"
        );
        // A truncated file is refused, even while the old mount exists.
        let f = fs::OpenOptions::new().write(true).open(&image).unwrap();
        f.set_len(size / 2).unwrap();
        let err = ensure_mounted(&run, &image, size, DIGEST).unwrap_err();
        assert!(err.to_string().contains("damaged"), "{err}");
        // Unmounted before its file goes: the mount and the digest's directory are gone.
        unmount(&run, DIGEST, &image).unwrap();
        assert!(!mp.exists() && !mp2.exists(), "a mount point stayed");
        assert!(!mount_point(&run, DIGEST).unwrap().exists());
        fs::remove_file(&image).unwrap();
        let err = ensure_mounted(&run, &image, size, DIGEST).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert!(matches!(
            ensure_mounted(&run, &image, size, "sha256:../../etc"),
            Err(ImageError::BadDigest(_)) | Err(ImageError::Missing(_))
        ));
    }

    #[test]
    fn mounts_stay_while_a_user_holds_them_and_go_with_the_last() {
        let (fx, image, size) = fixture();
        let run = fx.dir.join("run");
        let first = ensure_mounted(&run, &image, size, DIGEST).unwrap();
        let second = ensure_mounted(&run, &image, size, DIGEST).unwrap();
        let mp = first.path().to_path_buf();
        let erofs = |p: &Path| sys::statfs_type(&cpath(p).unwrap()).ok() == Some(EROFS_MAGIC);
        assert!(erofs(&mp));
        // Users left: nothing is detached.
        assert_eq!(release_unused(&run).unwrap(), 0);
        drop(first);
        assert_eq!(release_unused(&run).unwrap(), 0);
        assert!(erofs(&mp));
        // A spawner's lifetime hold works the same.
        let held = second.into_lock();
        // A holder mounts without a lock of its own, and finds the same mount.
        assert_eq!(held.ensure_mounted(&run, &image, size, DIGEST).unwrap(), mp);
        assert_eq!(release_unused(&run).unwrap(), 0);
        drop(held);
        // The last user gone: the mount and its directories go.
        assert_eq!(release_unused(&run).unwrap(), 1);
        assert!(!mp.exists(), "the mount point stayed");
        assert!(!mount_point(&run, DIGEST).unwrap().exists());
        // And the next user mounts it again.
        let again = ensure_mounted(&run, &image, size, DIGEST).unwrap();
        assert!(erofs(again.path()));
        drop(again);
        assert_eq!(release_unused(&run).unwrap(), 1);
    }

    #[test]
    fn unmounting_one_file_leaves_another_files_mount_of_the_same_image() {
        // Two state directories with the same template: two files, one digest.
        let (fx, image, size) = fixture();
        let run = fx.dir.join("run");
        let other = fx.dir.join("other.erofs");
        fs::copy(&image, &other).unwrap();
        let mine = ensure_mounted(&run, &image, size, DIGEST)
            .unwrap()
            .path()
            .to_path_buf();
        let theirs = ensure_mounted(&run, &other, size, DIGEST)
            .unwrap()
            .path()
            .to_path_buf();
        assert_ne!(mine, theirs);
        unmount(&run, DIGEST, &image).unwrap();
        assert!(!mine.exists());
        assert_eq!(
            fs::read_to_string(theirs.join("etc/hello")).unwrap(),
            "from the image\n",
            "the other file's mount was detached"
        );
        unmount(&run, DIGEST, &other).unwrap();
        assert!(!mount_point(&run, DIGEST).unwrap().exists());
    }

    #[test]
    fn the_loop_device_fallback_mounts_the_same_image() {
        let (fx, image, _) = fixture();
        let target = fx.dir.join("loop");
        fs::create_dir(&target).unwrap();
        mount_via_loop(&image, &target).unwrap();
        assert_eq!(
            fs::read_to_string(target.join("etc/hello")).unwrap(),
            "from the image\n"
        );
    }

    #[test]
    fn digests_are_checked_before_they_name_a_path() {
        assert!(digest_hex(DIGEST).is_ok());
        for bad in [
            "sha256:abc",
            "md5:00",
            "sha256:../x",
            &DIGEST.to_uppercase(),
        ] {
            assert!(digest_hex(bad).is_err(), "{bad}");
        }
    }
}

/// The file identity an image's check is remembered for: device, inode, size, and the change
/// time, which every write updates and no caller can set back.
type FileId = (u64, u64, u64, i64, i64);

fn file_id(path: &Path) -> io::Result<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(path)?;
    Ok((m.dev(), m.ino(), m.size(), m.ctime(), m.ctime_nsec()))
}

/// `sha256:<hex>` of a file's content.
pub fn sha256_file(path: &Path) -> io::Result<String> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let mut f = fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(format!("sha256:{}", hex_lower(&h.finalize())))
}

fn hex_lower(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Content checks of template images, before one is mounted for a sandbox: the file must have
/// the size and the SHA-256 its template was registered with. A file is hashed once; its
/// identity (device, inode, size, change time) is remembered, here and in a marker in
/// husk's runtime directory (only root writes there) so that other processes (a one-shot
/// `husk run`) need not hash hundreds of megabytes again. A file written since (its change
/// time moved) is hashed again.
#[derive(Debug, Default)]
pub struct Verifier {
    verified: std::sync::Mutex<std::collections::HashMap<PathBuf, (FileId, String)>>,
}

impl Verifier {
    /// Checks the image at `path` against `size` and `digest`.
    pub fn verify(
        &self,
        run_dir: &Path,
        path: &Path,
        size: u64,
        digest: &str,
    ) -> Result<(), ImageError> {
        check_file(path, size)?;
        digest_hex(digest)?;
        let id = file_id(path).map_err(io_ctx(format!("stat {}", path.display())))?;
        let known = self
            .verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(path)
            .is_some_and(|(i, d)| *i == id && d == digest);
        if known || marker_matches(run_dir, &id, path, digest) {
            self.remember(path, id, digest);
            return Ok(());
        }
        let found = sha256_file(path).map_err(io_ctx(format!("read {}", path.display())))?;
        if found != digest {
            return Err(ImageError::Corrupt {
                path: path.to_path_buf(),
                expected: digest.to_string(),
                found,
            });
        }
        write_marker(run_dir, &id, path, digest);
        self.remember(path, id, digest);
        Ok(())
    }

    fn remember(&self, path: &Path, id: FileId, digest: &str) {
        self.verified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(path.to_path_buf(), (id, digest.to_string()));
    }
}

/// Records that the image at `path` (as it is now: its identity goes into the record) has
/// `digest`, for a process that has just hashed it itself: a template build, which writes
/// the image. The spawners then mount it without hashing it again (see [`Verifier`]), so the
/// first sandbox of a new template does not wait for hundreds of megabytes to be read.
pub fn record_verified(run_dir: &Path, path: &Path, digest: &str) -> io::Result<()> {
    digest_hex(digest).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let id = file_id(path)?;
    write_marker(run_dir, &id, path, digest);
    Ok(())
}

/// Where a successful check of the image with `digest` is recorded for other processes.
fn marker_path(run_dir: &Path, digest: &str) -> Option<PathBuf> {
    let mp = mount_point(run_dir, digest).ok()?;
    Some(mp.with_extension("verified"))
}

fn marker_text(id: &FileId, path: &Path, digest: &str) -> String {
    format!("{id:?} {} {digest}\n", path.display())
}

fn marker_matches(run_dir: &Path, id: &FileId, path: &Path, digest: &str) -> bool {
    marker_path(run_dir, digest)
        .and_then(|m| fs::read_to_string(m).ok())
        .is_some_and(|t| t == marker_text(id, path, digest))
}

/// Records a successful check (best effort: without it the next process hashes again).
fn write_marker(run_dir: &Path, id: &FileId, path: &Path, digest: &str) {
    let Some(m) = marker_path(run_dir, digest) else {
        return;
    };
    let Some(dir) = m.parent() else {
        return;
    };
    let tmp = m.with_extension(format!("verified.{}", std::process::id()));
    let ok = fs::create_dir_all(dir).is_ok()
        && fs::write(&tmp, marker_text(id, path, digest)).is_ok()
        && fs::rename(&tmp, &m).is_ok();
    if !ok {
        let _ = fs::remove_file(&tmp);
    }
}
