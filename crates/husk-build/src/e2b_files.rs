//! The archives E2B's SDKs upload for templates' `COPY` steps, kept by their files hash under
//! `STATE_DIR/templates/e2b-files/<hash>` (as sent: a tar archive, gzip-compressed or not).
//! The SDK asks whether the server has a hash before it uploads it, so a second build of the
//! same files sends nothing. An archive is stored whole or not at all (written under a
//! temporary name, renamed into place once complete), is at most
//! [`MAX_CONTEXT_BYTES`](crate::context::MAX_CONTEXT_BYTES), and is unpacked only into a
//! build's context, with the context's checks ([`crate::context::unpack`]). Archives no build
//! used for [`KEEP`] are removed when another is stored.
//!
//! The hash is the client's name for the files, not checked against them: only admin keys
//! build templates, and an admin can build anything anyway.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use crate::context::{self, ContextError, MAX_CONTEXT_BYTES};
use crate::e2b::valid_files_hash;

/// How long an archive no build used is kept.
pub const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);

pub fn files_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("templates/e2b-files")
}

fn path_of(state_dir: &Path, hash: &str) -> Result<PathBuf, ContextError> {
    if !valid_files_hash(hash) {
        return Err(ContextError::Refused(format!(
            "invalid files hash {hash:?}: expected 64 lower-case hex digits"
        )));
    }
    Ok(files_dir(state_dir).join(hash))
}

/// Whether the archive of `hash` is stored.
pub fn has(state_dir: &Path, hash: &str) -> Result<bool, ContextError> {
    Ok(path_of(state_dir, hash)?.is_file())
}

/// Stores the archive `input` gives as the files of `hash`, replacing one stored before; at
/// most [`MAX_CONTEXT_BYTES`]. A failed or cut-off upload leaves nothing.
pub fn put(state_dir: &Path, hash: &str, mut input: impl Read) -> Result<u64, ContextError> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dest = path_of(state_dir, hash)?;
    let dir = files_dir(state_dir);
    let io_err = |what: &str| {
        let what = what.to_string();
        move |source| ContextError::Io { what, source }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_err("the files directory"))?;
    prune(&dir, KEEP);
    let tmp = dir.join(format!(
        ".{hash}.{}.{}.part",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err("an upload's file"))?;
        let mut limited = input.by_ref().take(MAX_CONTEXT_BYTES + 1);
        let n = io::copy(&mut limited, &mut out)
            .map_err(|e| ContextError::Refused(format!("the upload broke off: {e}")))?;
        if n > MAX_CONTEXT_BYTES {
            return Err(ContextError::TooLarge(format!(
                "the files are larger than {} MiB",
                MAX_CONTEXT_BYTES >> 20
            )));
        }
        out.flush().map_err(io_err("an upload's file"))?;
        fs::rename(&tmp, &dest).map_err(io_err("an upload's file"))?;
        Ok(n)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// Unpacks the archive of `hash` into `dir` (a new directory is made there), marking it used.
pub fn unpack(state_dir: &Path, hash: &str, dir: &Path) -> Result<(), ContextError> {
    let src = path_of(state_dir, hash)?;
    let file = fs::File::open(&src).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => ContextError::Refused(format!(
            "the files of hash {hash} were never uploaded (GET /templates/{{id}}/files/{hash})"
        )),
        _ => ContextError::Io {
            what: src.display().to_string(),
            source: e,
        },
    })?;
    let _ = file.set_modified(SystemTime::now());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| ContextError::Io {
            what: dir.display().to_string(),
            source,
        })?;
    context::unpack(file, dir)
}

/// Removes archives (and upload leftovers) not used for `keep`.
fn prune(dir: &Path, keep: Duration) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).is_ok_and(|age| age > keep));
        if old {
            let _ = fs::remove_file(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Scratch;

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            // The name written raw: the tar crate refuses to write `..` itself.
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn archives_are_stored_whole_by_hash_and_unpacked_with_the_contexts_checks() {
        let state = Scratch::new();
        let h = "ab".repeat(32);
        assert!(!has(state.path(), &h).unwrap());
        let n = put(
            state.path(),
            &h,
            &tar_of(&[("app/main.py", b"print(1)\n")])[..],
        )
        .unwrap();
        assert!(n > 0);
        assert!(has(state.path(), &h).unwrap());
        let ctx = state.path().join("ctx");
        unpack(state.path(), &h, &ctx.join(&h)).unwrap();
        assert_eq!(
            fs::read(ctx.join(&h).join("app/main.py")).unwrap(),
            b"print(1)\n"
        );
        // Hostile archives are refused when unpacked.
        let bad = "cd".repeat(32);
        put(state.path(), &bad, &tar_of(&[("../escape", b"x")])[..]).unwrap();
        assert!(matches!(
            unpack(state.path(), &bad, &ctx.join(&bad)),
            Err(ContextError::Refused(_))
        ));
        assert!(!state.path().join("escape").exists());
        // Never uploaded, or not a hash at all.
        let missing = "ef".repeat(32);
        let e = unpack(state.path(), &missing, &ctx.join(&missing)).unwrap_err();
        assert!(e.to_string().contains("never uploaded"), "{e}");
        for h in ["../x", "AB", &"g".repeat(64), ""] {
            assert!(has(state.path(), h).is_err(), "{h}");
            assert!(put(state.path(), h, &b""[..]).is_err(), "{h}");
        }
    }

    #[test]
    fn a_broken_upload_leaves_nothing() {
        struct Broken(usize);
        impl Read for Broken {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.0 == 0 {
                    return Err(io::Error::other("cut off"));
                }
                self.0 -= 1;
                buf[0] = 1;
                Ok(1)
            }
        }
        let state = Scratch::new();
        let h = "01".repeat(32);
        assert!(put(state.path(), &h, Broken(10)).is_err());
        assert!(!has(state.path(), &h).unwrap());
        assert_eq!(fs::read_dir(files_dir(state.path())).unwrap().count(), 0);
    }

    #[test]
    fn old_archives_are_pruned() {
        let dir = Scratch::new();
        let old = dir.path().join("old");
        fs::write(&old, b"x").unwrap();
        let f = fs::File::options().write(true).open(&old).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
        fs::write(dir.path().join("new"), b"y").unwrap();
        prune(dir.path(), Duration::from_secs(60));
        assert!(!old.exists());
        assert!(dir.path().join("new").exists());
    }
}
