//! Template images as files a cluster's nodes hand each other by digest: which this machine
//! holds, one opened for a peer to read, and one received from a peer, checked against its
//! digest before it takes its name. Every image is `<state>/templates/images/<hex>.erofs`, so
//! a digest names the same file on every node.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use husk_core::template;

/// The largest image received (a template's root file system, compressed).
pub const MAX_IMAGE_BYTES: u64 = 64 << 30;

/// Why an image was not stored.
#[derive(Debug, thiserror::Error)]
pub enum ImageFileError {
    #[error("not an image digest: {0:?}")]
    BadDigest(String),
    #[error("the image is {got} bytes, not the {want} announced")]
    WrongSize { got: u64, want: u64 },
    #[error("the image received hashes to {got}, not {want}")]
    WrongDigest { got: String, want: String },
    #[error("receiving the image: {0}")]
    Broken(io::Error),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn path_of(state_dir: &Path, digest: &str) -> Result<PathBuf, ImageFileError> {
    let hex = husk_runtime::images::digest_hex(digest)
        .map_err(|_| ImageFileError::BadDigest(digest.to_owned()))?;
    Ok(template::images_dir(state_dir).join(format!("{hex}.erofs")))
}

/// The digests (`sha256:<hex>`) of the images this state directory holds, at most `max`.
pub fn list(state_dir: &Path, max: usize) -> Vec<String> {
    let Ok(entries) = fs::read_dir(template::images_dir(state_dir)) else {
        return Vec::new();
    };
    let mut out: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let hex = name.strip_suffix(".erofs")?;
            let digest = format!("sha256:{hex}");
            husk_runtime::images::digest_hex(&digest).ok()?;
            Some(digest)
        })
        .collect();
    out.sort();
    out.truncate(max);
    out
}

/// The image with `digest`, opened for reading (`None`: not here). Never follows a link.
pub fn open(state_dir: &Path, digest: &str) -> Result<Option<File>, ImageFileError> {
    let path = path_of(state_dir, digest)?;
    match fs::OpenOptions::new()
        .read(true)
        .custom_flags(husk_runtime::libc::O_NOFOLLOW)
        .open(&path)
    {
        Ok(f) if f.metadata().is_ok_and(|m| m.is_file()) => Ok(Some(f)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ImageFileError::Io {
            what: path.display().to_string(),
            source,
        }),
    }
}

/// Stores the `size` bytes `input` gives as the image with `digest`: written aside, hashed as
/// it comes, and named only once its size and hash are right (a peer that lies or breaks
/// off leaves nothing). An image already here is kept as it is.
pub fn put(
    state_dir: &Path,
    run_dir: &Path,
    digest: &str,
    size: u64,
    input: impl Read,
) -> Result<(), ImageFileError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dest = path_of(state_dir, digest)?;
    if size == 0 || size > MAX_IMAGE_BYTES {
        return Err(ImageFileError::WrongSize {
            got: size,
            want: MAX_IMAGE_BYTES,
        });
    }
    let dir = template::images_dir(state_dir);
    let io_err = |what: &str| {
        let what = what.to_owned();
        move |source| ImageFileError::Io { what, source }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_err("the images directory"))?;
    let tmp = dir.join(format!(
        ".recv-{}-{}.erofs",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let result = (|| {
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("a received image's file"))?;
        let mut hasher = Sha256::new();
        let mut limited = input.take(size + 1);
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0u64;
        loop {
            let n = limited.read(&mut buf).map_err(ImageFileError::Broken)?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .map_err(io_err("a received image's file"))?;
            got += n as u64;
        }
        if got != size {
            return Err(ImageFileError::WrongSize { got, want: size });
        }
        let got = format!("sha256:{}", hex::encode(hasher.finalize()));
        if got != digest {
            return Err(ImageFileError::WrongDigest {
                got,
                want: digest.to_owned(),
            });
        }
        out.sync_all().map_err(io_err("a received image's file"))?;
        if dest.exists() {
            return Ok(());
        }
        fs::rename(&tmp, &dest).map_err(io_err("a received image's file"))?;
        // Hashed as it came: the spawners need not read it all again.
        let _ = husk_runtime::images::record_verified(run_dir, &dest, digest);
        Ok(())
    })();
    let _ = fs::remove_file(&tmp);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    fn digest_of(bytes: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
    }

    #[test]
    fn an_image_is_stored_only_whole_and_true_to_its_digest() {
        let dir = crate::testutil::Scratch::new();
        let run = crate::testutil::Scratch::new();
        let data = b"an erofs image, or so it says".repeat(1000);
        let digest = digest_of(&data);
        // A short stream, a long one, another's bytes: nothing stored.
        let short = put(
            dir.path(),
            run.path(),
            &digest,
            data.len() as u64,
            &data[..10],
        );
        assert!(
            matches!(short, Err(ImageFileError::WrongSize { .. })),
            "{short:?}"
        );
        let mut long = data.clone();
        long.push(0);
        let long = put(
            dir.path(),
            run.path(),
            &digest,
            data.len() as u64,
            &long[..],
        );
        assert!(
            matches!(long, Err(ImageFileError::WrongSize { .. })),
            "{long:?}"
        );
        let mut other = data.clone();
        other[0] ^= 1;
        let lie = put(
            dir.path(),
            run.path(),
            &digest,
            data.len() as u64,
            &other[..],
        );
        assert!(
            matches!(lie, Err(ImageFileError::WrongDigest { .. })),
            "{lie:?}"
        );
        assert!(list(dir.path(), 10).is_empty());
        assert!(open(dir.path(), &digest).unwrap().is_none());
        // Nothing half-written is left beside the images.
        let leftovers = fs::read_dir(template::images_dir(dir.path()))
            .unwrap()
            .count();
        assert_eq!(leftovers, 0);

        put(
            dir.path(),
            run.path(),
            &digest,
            data.len() as u64,
            &data[..],
        )
        .unwrap();
        assert_eq!(list(dir.path(), 10), std::slice::from_ref(&digest));
        let mut read = Vec::new();
        open(dir.path(), &digest)
            .unwrap()
            .unwrap()
            .read_to_end(&mut read)
            .unwrap();
        assert_eq!(read, data);
        // Again: kept as it is.
        put(
            dir.path(),
            run.path(),
            &digest,
            data.len() as u64,
            &data[..],
        )
        .unwrap();
        assert!(matches!(
            open(dir.path(), "sha256:../../etc/passwd"),
            Err(ImageFileError::BadDigest(_))
        ));
    }

    #[test]
    fn a_link_in_place_of_an_image_is_not_followed() {
        let dir = crate::testutil::Scratch::new();
        let digest = digest_of(b"x");
        let images = template::images_dir(dir.path());
        fs::create_dir_all(&images).unwrap();
        let hex = husk_runtime::images::digest_hex(&digest).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", images.join(format!("{hex}.erofs"))).unwrap();
        assert!(open(dir.path(), &digest).is_err());
        assert!(list(dir.path(), 10).is_empty());
    }
}
