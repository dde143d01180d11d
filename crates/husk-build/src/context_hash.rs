//! The content of a build context's files as part of a layer's cache key: names, types,
//! modes, sizes, contents and symlink targets, in sorted order, so that the key changes when
//! (and only when) what a COPY copies changes.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::layers::KeyHasher;

/// Hashes the file or tree at `path` into `k`. Symlinks are hashed as links, not followed
/// (except `path` itself, which COPY follows).
pub fn hash_into(path: &Path, k: &mut KeyHasher) -> io::Result<()> {
    let meta = fs::metadata(path)?;
    walk(path, &meta, Path::new(""), k, 0)
}

fn walk(
    path: &Path,
    meta: &fs::Metadata,
    rel: &Path,
    k: &mut KeyHasher,
    depth: u32,
) -> io::Result<()> {
    if depth > 128 {
        return Err(io::Error::other("directory tree too deep"));
    }
    k.field(rel.as_os_str().as_encoded_bytes());
    k.field(&meta.mode().to_le_bytes());
    let ft = meta.file_type();
    if ft.is_symlink() {
        k.str("link")
            .field(fs::read_link(path)?.as_os_str().as_encoded_bytes());
    } else if ft.is_dir() {
        k.str("dir");
        let mut names: Vec<_> = fs::read_dir(path)?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()?;
        names.sort();
        for n in names {
            let p = path.join(&n);
            let m = fs::symlink_metadata(&p)?;
            walk(&p, &m, &rel.join(&n), k, depth + 1)?;
        }
    } else if ft.is_file() {
        k.str("file").field(&meta.len().to_le_bytes());
        let mut f = fs::File::open(path)?;
        let mut buf = vec![0u8; 1 << 16];
        let mut h = sha2::Sha256::new();
        use sha2::Digest;
        loop {
            match f.read(&mut buf)? {
                0 => break,
                n => h.update(&buf[..n]),
            }
        }
        k.field(&h.finalize());
    } else {
        k.str("special");
    }
    Ok(())
}
