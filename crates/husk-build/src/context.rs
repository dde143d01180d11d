//! A build context uploaded as a tar archive (gzip-compressed or not), unpacked into a fresh
//! directory under the state directory.
//!
//! The archive is hostile input, and what it unpacks to is read by the build as root (COPY
//! follows a symlink named as its source). So: no absolute paths and no `..`; nothing is
//! written through a symlink; a symlink must stay inside the context (its target relative, not
//! climbing out, and, once everything is unpacked, resolving inside); a hard link must name a
//! regular file unpacked before it; no device files or FIFOs; permission bits only (no setuid,
//! no owners); at most [`MAX_CONTEXT_BYTES`] (both as sent and unpacked) and
//! [`MAX_CONTEXT_ENTRIES`] entries.

use std::ffi::OsStr;
use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use husk_core::tar_ext::{ExtError, Extensions};

/// Largest build context, compressed as sent and unpacked.
pub const MAX_CONTEXT_BYTES: u64 = 2 << 30;
/// Most entries a context archive may have.
pub const MAX_CONTEXT_ENTRIES: u64 = 100_000;

/// Where uploaded contexts are unpacked while their build runs.
pub fn contexts_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("templates/contexts")
}

/// Errors of unpacking a context.
#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    /// The archive holds something husk refuses, or is not a tar archive.
    #[error("{0}")]
    Refused(String),
    /// Past [`MAX_CONTEXT_BYTES`] or [`MAX_CONTEXT_ENTRIES`].
    #[error("{0}")]
    TooLarge(String),
    /// A failure on the server's side.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn refused(msg: impl Into<String>) -> ContextError {
    ContextError::Refused(msg.into())
}

fn io_err(what: &Path) -> impl FnOnce(io::Error) -> ContextError + '_ {
    move |source| ContextError::Io {
        what: what.display().to_string(),
        source,
    }
}

/// A fresh context directory, removed (with everything in it) on drop.
pub struct ContextDir(PathBuf);

impl ContextDir {
    pub fn create(state_dir: &Path) -> io::Result<ContextDir> {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let parent = contexts_dir(state_dir);
        fs::create_dir_all(&parent)?;
        fs::set_permissions(&parent, fs::Permissions::from_mode(0o700))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!("{}-{seq}-{nanos:08x}", std::process::id()));
        // `create_dir`, not `create_dir_all`: the name must be new.
        fs::DirBuilder::new().mode(0o700).create(&dir)?;
        Ok(ContextDir(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ContextDir {
    fn drop(&mut self) {
        // Does not follow symlinks.
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn too_large_bytes() -> ContextError {
    ContextError::TooLarge(format!(
        "the build context is larger than {} MiB",
        MAX_CONTEXT_BYTES >> 20
    ))
}

/// Unpacks the archive `input` into `root` (an empty directory).
pub fn unpack(input: impl Read, root: &Path) -> Result<(), ContextError> {
    let bad_archive = |e: io::Error| refused(format!("invalid tar archive: {e}"));
    let mut buffered = BufReader::with_capacity(64 << 10, input);
    let gzip = buffered
        .fill_buf()
        .map_err(bad_archive)?
        .starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(flate2::bufread::MultiGzDecoder::new(buffered))
    } else {
        Box::new(buffered)
    };
    let mut archive = tar::Archive::new(reader);
    let mut entries = 0u64;
    let mut bytes = 0u64;
    // Raw: extension headers are read here, bounded (see `husk_core::tar_ext`).
    let mut ext = Extensions::default();
    for entry in archive.entries().map_err(bad_archive)?.raw(true) {
        let mut entry = entry.map_err(bad_archive)?;
        if ext.absorb(&mut entry).map_err(bad_ext)? {
            continue;
        }
        let ext = std::mem::take(&mut ext);
        entries += 1;
        if entries > MAX_CONTEXT_ENTRIES {
            return Err(ContextError::TooLarge(format!(
                "the build context has more than {MAX_CONTEXT_ENTRIES} entries"
            )));
        }
        let raw = PathBuf::from(OsStr::from_bytes(&ext.path(&entry)));
        let link = ext
            .link(&entry)
            .map(|l| PathBuf::from(OsStr::from_bytes(&l)))
            .unwrap_or_default();
        let Some(rel) = relative(&raw)? else {
            continue; // `./`
        };
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        use tar::EntryType as T;
        match entry.header().entry_type() {
            T::Regular | T::Continuous => {
                let dest = prepare(root, &rel)?;
                let mut f = fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&dest)
                    .map_err(io_err(&dest))?;
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = entry.read(&mut buf).map_err(bad_archive)?;
                    if n == 0 {
                        break;
                    }
                    bytes += n as u64;
                    if bytes > MAX_CONTEXT_BYTES {
                        return Err(too_large_bytes());
                    }
                    f.write_all(&buf[..n]).map_err(io_err(&dest))?;
                }
                f.set_permissions(fs::Permissions::from_mode(mode))
                    .map_err(io_err(&dest))?;
            }
            T::Directory => {
                let dest = prepare(root, &rel)?;
                match fs::symlink_metadata(&dest) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(refused(format!("{}: not a directory", rel.display()))),
                    Err(_) => fs::create_dir(&dest).map_err(io_err(&dest))?,
                }
                fs::set_permissions(&dest, fs::Permissions::from_mode(mode | 0o700))
                    .map_err(io_err(&dest))?;
            }
            T::Symlink => {
                let target = link;
                if target.as_os_str().is_empty() || !link_stays_inside(&rel, &target) {
                    return Err(refused(format!(
                        "{}: a symlink pointing outside the build context ({}) is not allowed",
                        rel.display(),
                        target.display()
                    )));
                }
                let dest = prepare(root, &rel)?;
                std::os::unix::fs::symlink(&target, &dest).map_err(io_err(&dest))?;
            }
            T::Link => {
                let target = link;
                let src = match relative(&target)? {
                    Some(t) => existing_file(root, &t)?,
                    None => None,
                };
                let Some(src) = src else {
                    return Err(refused(format!(
                        "{}: a hard link must name a regular file earlier in the archive (not {})",
                        rel.display(),
                        target.display()
                    )));
                };
                let dest = prepare(root, &rel)?;
                fs::hard_link(&src, &dest).map_err(io_err(&dest))?;
            }
            T::Char | T::Block | T::Fifo => {
                return Err(refused(format!(
                    "{}: device files and FIFOs are not allowed in a build context",
                    rel.display()
                )))
            }
            other => {
                return Err(refused(format!(
                    "{}: unsupported tar entry type {other:?}",
                    rel.display()
                )))
            }
        }
    }
    ext.finish().map_err(bad_ext)?;
    check_symlinks(root)
}

fn bad_ext(e: ExtError) -> ContextError {
    refused(format!("invalid tar archive: {e}"))
}

/// The entry path `raw` as a relative path of normal components; `None` for the archive's
/// root (`./`).
fn relative(raw: &Path) -> Result<Option<PathBuf>, ContextError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(refused(format!(
                    "archive entry {}: '..' is not allowed",
                    raw.display()
                )))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused(format!(
                    "archive entry {}: absolute paths are not allowed",
                    raw.display()
                )))
            }
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Makes the parent directories of `rel` (refusing to pass through a symlink or a file) and
/// removes a file or symlink already at `rel` (the later entry wins, as with `tar -x`);
/// returns the path to create.
fn prepare(root: &Path, rel: &Path) -> Result<PathBuf, ContextError> {
    let mut cur = root.to_path_buf();
    if let Some(parent) = rel.parent() {
        for c in parent.components() {
            cur.push(c);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refused(format!(
                        "{}: writing through a symlink is not allowed",
                        rel.display()
                    )))
                }
                Ok(_) => {
                    return Err(refused(format!(
                        "{}: a parent is not a directory",
                        rel.display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::DirBuilder::new()
                        .mode(0o755)
                        .create(&cur)
                        .map_err(io_err(&cur))?;
                }
                Err(e) => return Err(io_err(&cur)(e)),
            }
        }
    }
    let dest = root.join(rel);
    if let Ok(m) = fs::symlink_metadata(&dest) {
        if !m.is_dir() {
            fs::remove_file(&dest).map_err(io_err(&dest))?;
        }
    }
    Ok(dest)
}

/// The regular file at `rel`, reached without passing through a symlink.
fn existing_file(root: &Path, rel: &Path) -> Result<Option<PathBuf>, ContextError> {
    let mut cur = root.to_path_buf();
    for c in rel.components() {
        cur.push(c);
        match fs::symlink_metadata(&cur) {
            Ok(m) if m.is_dir() || m.is_file() => {}
            _ => return Ok(None),
        }
    }
    Ok(fs::symlink_metadata(&cur)
        .is_ok_and(|m| m.is_file())
        .then_some(cur))
}

/// Whether a symlink at `rel` with relative `target` stays inside the context, read lexically.
fn link_stays_inside(rel: &Path, target: &Path) -> bool {
    let mut depth = rel.components().count() as i64 - 1;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Every symlink that resolves must resolve inside `root`: chains of links can climb out
/// where each link alone reads as inside (`a/up -> ..`, then `x -> a/up/..`). A dangling link
/// stays (each one was checked lexically; COPY of it fails).
fn check_symlinks(root: &Path) -> Result<(), ContextError> {
    let real_root = fs::canonicalize(root).map_err(io_err(root))?;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let e = e.map_err(io_err(&dir))?;
            let path = e.path();
            let ft = e.file_type().map_err(io_err(&path))?;
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_symlink() {
                if let Ok(real) = fs::canonicalize(&path) {
                    if !real.starts_with(&real_root) {
                        let rel = path.strip_prefix(root).unwrap_or(&path);
                        return Err(refused(format!(
                            "{}: a symlink pointing outside the build context is not allowed",
                            rel.display()
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::Scratch;

    /// A raw archive entry: name, type, link target, content.
    type Entry<'a> = (&'a str, tar::EntryType, &'a str, &'a [u8]);

    /// A tar archive of raw entries; names are written into the header as they are, `..` and
    /// `/` included.
    fn archive(entries: &[Entry]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, link, data) in entries {
            let mut h = tar::Header::new_old();
            h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
            h.set_entry_type(*kind);
            h.set_mode(0o755);
            h.set_size(data.len() as u64);
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn unpack_into(data: &[u8]) -> (Scratch, Result<(), ContextError>) {
        let s = Scratch::new();
        let ctx = s.0.join("ctx");
        fs::create_dir(&ctx).unwrap();
        let r = unpack(data, &ctx);
        (s, r)
    }

    use tar::EntryType as T;

    #[test]
    fn files_dirs_and_inside_links_unpack() {
        let data = archive(&[
            ("./", T::Directory, "", b""),
            ("sub/", T::Directory, "", b""),
            ("sub/Dockerfile", T::Regular, "", b"FROM scratch\n"),
            ("link", T::Symlink, "sub/Dockerfile", b""),
            ("sub/up", T::Symlink, "../link", b""),
            ("hard", T::Link, "sub/Dockerfile", b""),
        ]);
        let (s, r) = unpack_into(&data);
        r.unwrap();
        let ctx = s.0.join("ctx");
        assert_eq!(fs::read(ctx.join("link")).unwrap(), b"FROM scratch\n");
        assert_eq!(fs::read(ctx.join("hard")).unwrap(), b"FROM scratch\n");
        assert_eq!(fs::read(ctx.join("sub/up")).unwrap(), b"FROM scratch\n");
        let mode = fs::metadata(ctx.join("sub/Dockerfile"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
    }

    #[test]
    fn gzip_is_detected() {
        let data = archive(&[("Dockerfile", T::Regular, "", b"FROM scratch\n")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&data).unwrap();
        let (s, r) = unpack_into(&gz.finish().unwrap());
        r.unwrap();
        assert!(s.0.join("ctx/Dockerfile").is_file());
    }

    #[test]
    fn hostile_entries_are_refused() {
        let cases: &[(&[Entry], &str)] = &[
            (&[("../evil", T::Regular, "", b"x")], "'..' is not allowed"),
            (&[("a/../../evil", T::Regular, "", b"x")], "'..'"),
            (&[("/etc/evil", T::Regular, "", b"x")], "absolute paths"),
            (&[("l", T::Symlink, "/etc/shadow", b"")], "outside"),
            (&[("l", T::Symlink, "../x", b"")], "outside"),
            (&[("a/l", T::Symlink, "../../x", b"")], "outside"),
            (
                &[
                    ("a/", T::Directory, "", b""),
                    ("a/up", T::Symlink, "..", b""),
                    ("x", T::Symlink, "a/up/..", b""),
                ],
                "outside",
            ),
            (
                &[("d", T::Symlink, ".", b""), ("d/f", T::Regular, "", b"x")],
                "through a symlink",
            ),
            (&[("h", T::Link, "/etc/passwd", b"")], "absolute"),
            (&[("h", T::Link, "missing", b"")], "hard link"),
            (
                &[("l", T::Symlink, "f", b""), ("h", T::Link, "l", b"")],
                "hard link",
            ),
            (&[("dev", T::Char, "", b"")], "device files"),
            (&[("fifo", T::Fifo, "", b"")], "FIFOs"),
        ];
        for (entries, want) in cases {
            let (s, r) = unpack_into(&archive(entries));
            match r {
                Err(ContextError::Refused(m)) => assert!(m.contains(want), "{m} (want {want})"),
                other => panic!("{entries:?}: {other:?}"),
            }
            assert!(!s.0.join("evil").exists());
        }
    }

    #[test]
    fn garbage_is_not_an_archive() {
        let (_s, r) = unpack_into(&[7u8; 1024]);
        assert!(matches!(r, Err(ContextError::Refused(_))), "{r:?}");
    }

    /// A PAX header claiming 64 MiB (all of it zeros, a few hundred KiB gzipped) is refused on
    /// its size, unread; long names and PAX paths still name their entries.
    #[test]
    fn extension_headers_are_bounded_and_applied() {
        let bomb = husk_core::tar_ext::fixtures::huge_pax_header_gzip(64 << 20);
        let (_s, r) = unpack_into(&bomb);
        match r {
            Err(ContextError::Refused(m)) => assert!(m.contains("larger than 65536"), "{m}"),
            other => panic!("{other:?}"),
        }

        let long = format!("{}/{}", "d".repeat(150), "f".repeat(150));
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_entry_type(T::Directory);
        h.set_size(0);
        b.append_data(&mut h.clone(), "d".repeat(150), &b""[..])
            .unwrap();
        h.set_entry_type(T::Regular);
        h.set_size(2);
        b.append_data(&mut h.clone(), &long, &b"ok"[..]).unwrap();
        b.append_pax_extensions([("path", &b"from-pax"[..])])
            .unwrap();
        h.set_size(1);
        b.append_data(&mut h, "header-name", &b"p"[..]).unwrap();
        let (s, r) = unpack_into(&b.into_inner().unwrap());
        r.unwrap();
        let ctx = s.0.join("ctx");
        assert_eq!(fs::read(ctx.join(&long)).unwrap(), b"ok");
        assert_eq!(fs::read(ctx.join("from-pax")).unwrap(), b"p");
        assert!(!ctx.join("header-name").exists());
    }
}
