//! Unpacking one hostile layer tar into an overlay-format layer directory.
//!
//! The destination starts empty and only this unpacker writes to it, so "exists in `dest`"
//! means "an earlier entry of this layer made it". The rules that keep an image inside `dest`:
//! every path is relative and free of `..`; parent directories are checked component by
//! component with `symlink_metadata` (a symlink or file where a directory should be is an
//! error, never followed); files and directories are opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)` as a second, kernel-enforced fence; hard links must point at a
//! regular file already unpacked. Device nodes are dropped (sandboxes mount nodev) and only
//! `security.capability` and `user.*` xattrs are applied: `trusted.*` would let an image forge
//! overlayfs's own whiteout and opaque markers.

use std::collections::BTreeMap;
use std::fs::{self, File, FileTimes, Permissions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use husk_runtime::layerfs::{make_whiteout, set_opaque};
use husk_runtime::libc;
use husk_runtime::sys::{cpath, openat2};
use tar::EntryType;
use xattr::FileExt;

use husk_core::tar_ext::{pax_number, ExtError, Extensions};

use super::error::OciError;
use super::{layer_compression, Compression};

/// More entries than this in one layer is refused (a tar bomb of empty files).
pub const MAX_ENTRIES: u64 = 1_000_000;
/// Longer entry paths are refused (PATH_MAX).
pub const MAX_PATH_LEN: usize = 4096;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const BENEATH: u64 = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;

/// What an unpack made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackStats {
    pub entries: u64,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    pub whiteouts: u64,
    pub opaque_dirs: u64,
    /// Character and block devices and FIFOs, which are not unpacked.
    pub skipped_devices: u64,
    /// Bytes of regular-file content written.
    pub bytes: u64,
}

/// Unpacks the layer tar read from `reader` (compressed as `media_type` says) into `dest`,
/// which is created if missing and should be empty.
pub fn unpack_layer(
    reader: impl Read,
    media_type: &str,
    dest: &Path,
) -> Result<UnpackStats, OciError> {
    let compression = layer_compression(media_type)?;
    fs::create_dir_all(dest).map_err(OciError::io(format!("creating {}", dest.display())))?;
    let dest_fd = File::open(dest).map_err(OciError::io(format!("opening {}", dest.display())))?;
    let mut unpacker = Unpacker {
        dest,
        dest_fd: dest_fd.into(),
        dirs: BTreeMap::new(),
        stats: UnpackStats::default(),
        buf: vec![0; 256 * 1024],
    };
    match compression {
        Compression::None => unpacker.run(reader)?,
        Compression::Gzip => unpacker.run(flate2::read::MultiGzDecoder::new(reader))?,
        Compression::Zstd => unpacker.run(
            zstd::stream::read::Decoder::new(reader)
                .map_err(OciError::io("starting the zstd decoder"))?,
        )?,
    }
    unpacker.finish_dirs()?;
    Ok(unpacker.stats)
}

/// A refused or unreadable extension header, named by the entry that carried it.
fn ext_error<R: Read>(e: ExtError, entry: &tar::Entry<'_, R>) -> OciError {
    let entry = display(&entry.header().path_bytes());
    match e {
        ExtError::Read(source) => OciError::UnpackIo { entry, source },
        ExtError::Refused(reason) => OciError::Unpack { entry, reason },
    }
}

/// A directory's attributes, applied after everything inside it is written (creating an entry
/// changes the directory's mtime, and a read-only mode would be in the way).
#[derive(Debug, Clone)]
struct DirMeta {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: Option<SystemTime>,
}

/// Ownership, mode, time and the xattrs husk allows, from the header and its PAX records.
struct Attrs {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime: SystemTime,
    xattrs: Vec<(String, Vec<u8>)>,
}

struct Unpacker<'a> {
    dest: &'a Path,
    dest_fd: OwnedFd,
    /// Keyed by path relative to `dest`; `""` is `dest` itself.
    dirs: BTreeMap<PathBuf, DirMeta>,
    stats: UnpackStats,
    buf: Vec<u8>,
}

impl Unpacker<'_> {
    fn run(&mut self, tar: impl Read) -> Result<(), OciError> {
        let mut archive = tar::Archive::new(tar);
        // Raw: extension headers are read here, bounded (see `husk_core::tar_ext`).
        let entries = archive
            .entries()
            .map_err(OciError::io("reading the layer tar"))?
            .raw(true);
        let mut ext = Extensions::default();
        for entry in entries {
            let mut entry = entry.map_err(OciError::io("reading the layer tar"))?;
            if ext.absorb(&mut entry).map_err(|e| ext_error(e, &entry))? {
                continue;
            }
            let ext = std::mem::take(&mut ext);
            self.stats.entries += 1;
            if self.stats.entries > MAX_ENTRIES {
                return Err(OciError::TooManyEntries { limit: MAX_ENTRIES });
            }
            let raw = ext.path(&entry).into_owned();
            let name = display(&raw);
            if raw.len() > MAX_PATH_LEN {
                return Err(OciError::PathTooLong {
                    entry: name,
                    limit: MAX_PATH_LEN,
                });
            }
            let refuse = |reason: &str| OciError::Unpack {
                entry: name.clone(),
                reason: reason.to_string(),
            };
            let rel = normalize(&raw).map_err(refuse)?;
            let io_err = |source| OciError::UnpackIo {
                entry: name.clone(),
                source,
            };
            self.entry(&mut entry, &ext, &rel, &name)
                .map_err(|e| match e {
                    EntryError::Refused(reason) => refuse(&reason),
                    EntryError::Io(source) => io_err(source),
                })?;
        }
        ext.finish().map_err(|e| OciError::Unpack {
            entry: "(end)".into(),
            reason: e.to_string(),
        })
    }

    fn entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Extensions,
        rel: &Path,
        name: &str,
    ) -> Result<(), EntryError> {
        let file_name = rel.file_name().map(|n| n.as_bytes()).unwrap_or_default();
        if file_name.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            return self.whiteout(rel, file_name);
        }
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                self.stats.skipped_devices += 1;
                return Ok(());
            }
            _ => {}
        }
        if rel.as_os_str().is_empty() {
            // `./` itself: the layer root's own attributes.
            if !kind.is_dir() {
                return Err(EntryError::Refused(
                    "the layer root must be a directory".into(),
                ));
            }
            let attrs = attrs(entry, ext)?;
            self.dirs.insert(PathBuf::new(), attrs.dir_meta());
            return Ok(());
        }
        if let Some(parent) = rel.parent() {
            self.ensure_dirs(parent)?;
        }
        match kind {
            EntryType::Directory => self.directory(entry, ext, rel),
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.regular(entry, ext, rel)
            }
            EntryType::Symlink => self.symlink(entry, ext, rel),
            EntryType::Link => self.hardlink(entry, ext, rel),
            other => {
                tracing::warn!(entry = name, kind = ?other, "skipping layer entry of unknown type");
                Ok(())
            }
        }
    }

    fn whiteout(&mut self, rel: &Path, file_name: &[u8]) -> Result<(), EntryError> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        if file_name == OPAQUE_MARKER.as_bytes() {
            self.ensure_dirs(parent)?;
            set_opaque(&self.dest.join(parent))?;
            self.stats.opaque_dirs += 1;
            return Ok(());
        }
        let hidden = &file_name[WHITEOUT_PREFIX.len()..];
        // Other `.wh..wh.` names are aufs bookkeeping (hard-link dirs and such), not deletions.
        if hidden.starts_with(WHITEOUT_PREFIX.as_bytes()) {
            return Ok(());
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." || hidden.contains(&b'/') {
            return Err(EntryError::Refused("invalid whiteout name".into()));
        }
        self.ensure_dirs(parent)?;
        let target = parent.join(std::ffi::OsStr::from_bytes(hidden));
        self.remove_existing(&target, false)?;
        make_whiteout(&self.dest.join(&target))?;
        self.stats.whiteouts += 1;
        Ok(())
    }

    fn directory<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Extensions,
        rel: &Path,
    ) -> Result<(), EntryError> {
        let attrs = attrs(entry, ext)?;
        let path = self.dest.join(rel);
        // A directory over a directory merges, as in overlayfs.
        if !self.remove_existing(rel, true)? {
            fs::create_dir(&path)?;
        }
        for (name, value) in &attrs.xattrs {
            set_xattr(|| xattr::set(&path, name, value), name)?;
        }
        self.dirs.insert(rel.to_path_buf(), attrs.dir_meta());
        self.stats.dirs += 1;
        Ok(())
    }

    fn regular<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Extensions,
        rel: &Path,
    ) -> Result<(), EntryError> {
        let attrs = attrs(entry, ext)?;
        self.remove_existing(rel, false)?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let fd = openat2(self.dest_fd.as_fd(), &cpath(rel)?, flags, 0o600, BENEATH)?;
        let mut file = File::from(fd);
        loop {
            let n = entry.read(&mut self.buf)?;
            if n == 0 {
                break;
            }
            file.write_all(&self.buf[..n])?;
            self.stats.bytes += n as u64;
        }
        // chown clears set-id bits and file capabilities, so it goes first.
        std::os::unix::fs::fchown(&file, Some(attrs.uid), Some(attrs.gid))?;
        file.set_permissions(Permissions::from_mode(attrs.mode))?;
        for (name, value) in &attrs.xattrs {
            set_xattr(|| file.set_xattr(name, value), name)?;
        }
        file.set_times(FileTimes::new().set_modified(attrs.mtime))?;
        self.stats.files += 1;
        Ok(())
    }

    fn symlink<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Extensions,
        rel: &Path,
    ) -> Result<(), EntryError> {
        let attrs = attrs(entry, ext)?;
        // The target is stored as written: it is only ever resolved inside the sandbox.
        let target = ext
            .link(entry)
            .ok_or_else(|| EntryError::Refused("symlink without a target".into()))?
            .into_owned();
        self.remove_existing(rel, false)?;
        let path = self.dest.join(rel);
        symlink(std::ffi::OsStr::from_bytes(&target), &path)?;
        std::os::unix::fs::lchown(&path, Some(attrs.uid), Some(attrs.gid))?;
        self.stats.symlinks += 1;
        Ok(())
    }

    fn hardlink<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        ext: &Extensions,
        rel: &Path,
    ) -> Result<(), EntryError> {
        let raw = ext
            .link(entry)
            .ok_or_else(|| EntryError::Refused("hard link without a target".into()))?
            .into_owned();
        let target = normalize(&raw).map_err(|r| EntryError::Refused(format!("hard link {r}")))?;
        let refused = || {
            EntryError::Refused(format!(
                "hard link target {} is not a regular file of this layer",
                display(&raw)
            ))
        };
        if target.as_os_str().is_empty() {
            return Err(refused());
        }
        if target == rel {
            return Ok(());
        }
        if let Some(parent) = target.parent() {
            self.check_dirs(parent).map_err(|_| refused())?;
        }
        match fs::symlink_metadata(self.dest.join(&target)) {
            Ok(m) if m.is_file() => {}
            _ => return Err(refused()),
        }
        self.remove_existing(rel, false)?;
        // linkat without AT_SYMLINK_FOLLOW; the target was just checked to be a regular file.
        fs::hard_link(self.dest.join(&target), self.dest.join(rel))?;
        self.stats.hardlinks += 1;
        Ok(())
    }

    /// Makes every component of `rel` a real directory, creating missing ones (root-owned 0755,
    /// as Docker does); a symlink or non-directory on the way is refused, never followed.
    fn ensure_dirs(&mut self, rel: &Path) -> Result<(), EntryError> {
        let mut cur = PathBuf::new();
        for c in rel.components() {
            cur.push(c);
            match fs::symlink_metadata(self.dest.join(&cur)) {
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(EntryError::Refused("parent is not a directory".into())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(self.dest.join(&cur))?;
                    let meta = DirMeta {
                        mode: 0o755,
                        uid: 0,
                        gid: 0,
                        mtime: None,
                    };
                    self.dirs.insert(cur.clone(), meta);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Like [`Self::ensure_dirs`] but creating nothing.
    fn check_dirs(&self, rel: &Path) -> Result<(), EntryError> {
        let mut cur = self.dest.to_path_buf();
        for c in rel.components() {
            cur.push(c);
            if !fs::symlink_metadata(&cur)?.is_dir() {
                return Err(EntryError::Refused("parent is not a directory".into()));
            }
        }
        Ok(())
    }

    /// Removes what an earlier entry put at `rel` (parents already checked). With `keep_dir`, a
    /// directory stays and `true` says so.
    fn remove_existing(&mut self, rel: &Path, keep_dir: bool) -> Result<bool, EntryError> {
        let path = self.dest.join(rel);
        match fs::symlink_metadata(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e.into()),
            Ok(m) if m.is_dir() && keep_dir => Ok(true),
            Ok(m) if m.is_dir() => {
                // remove_dir_all does not follow symlinks inside the tree.
                fs::remove_dir_all(&path)?;
                let gone: Vec<PathBuf> = self
                    .dirs
                    .range(rel.to_path_buf()..)
                    .map(|(k, _)| k)
                    .take_while(|k| k.starts_with(rel))
                    .cloned()
                    .collect();
                for k in gone {
                    self.dirs.remove(&k);
                }
                Ok(false)
            }
            Ok(_) => {
                fs::remove_file(&path)?;
                Ok(false)
            }
        }
    }

    /// Applies the deferred directory attributes, opening each directory beneath `dest`
    /// without following any symlink.
    fn finish_dirs(&mut self) -> Result<(), OciError> {
        for (rel, meta) in std::mem::take(&mut self.dirs) {
            let apply = || -> io::Result<()> {
                let c = if rel.as_os_str().is_empty() {
                    cpath(Path::new("."))?
                } else {
                    cpath(&rel)?
                };
                let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
                let dir = File::from(openat2(self.dest_fd.as_fd(), &c, flags, 0, BENEATH)?);
                std::os::unix::fs::fchown(&dir, Some(meta.uid), Some(meta.gid))?;
                dir.set_permissions(Permissions::from_mode(meta.mode))?;
                if let Some(mtime) = meta.mtime {
                    dir.set_times(FileTimes::new().set_modified(mtime))?;
                }
                Ok(())
            };
            apply().map_err(|source| OciError::UnpackIo {
                entry: rel.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }
}

enum EntryError {
    Refused(String),
    Io(io::Error),
}

impl From<io::Error> for EntryError {
    fn from(e: io::Error) -> Self {
        EntryError::Io(e)
    }
}

impl Attrs {
    fn dir_meta(&self) -> DirMeta {
        DirMeta {
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            mtime: Some(self.mtime),
        }
    }
}

/// An entry's attributes; PAX `uid`/`gid`/`mtime` records override the header's fields.
fn attrs<R: Read>(entry: &tar::Entry<'_, R>, ext: &Extensions) -> Result<Attrs, EntryError> {
    let header = entry.header();
    let mut uid = header.uid()?;
    let mut gid = header.gid()?;
    let mut mtime = header.mtime()?;
    let mode = header.mode()? & 0o7777;
    let mut xattrs = Vec::new();
    for record in ext.records() {
        let (key, value) = record.map_err(|e| EntryError::Refused(e.to_string()))?;
        let Ok(key) = std::str::from_utf8(key) else {
            continue;
        };
        match key {
            "uid" => uid = pax_number(value).unwrap_or(uid),
            "gid" => gid = pax_number(value).unwrap_or(gid),
            // Negative or unparseable times fall back to the header's.
            "mtime" => mtime = pax_number(value).unwrap_or(mtime),
            _ => {
                if let Some(name) = key.strip_prefix("SCHILY.xattr.") {
                    if name == "security.capability" || name.starts_with("user.") {
                        xattrs.push((name.to_string(), value.to_vec()));
                    }
                }
            }
        }
    }
    let id = |v: u64| {
        u32::try_from(v).map_err(|_| EntryError::Refused(format!("owner id {v} out of range")))
    };
    Ok(Attrs {
        mode,
        uid: id(uid)?,
        gid: id(gid)?,
        mtime: UNIX_EPOCH + Duration::from_secs(mtime),
        xattrs,
    })
}

/// Sets one xattr; a file system without xattr support loses `user.*` ones with a warning
/// rather than failing the whole image.
fn set_xattr(set: impl FnOnce() -> io::Result<()>, name: &str) -> Result<(), EntryError> {
    match set() {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) && name.starts_with("user.") => {
            tracing::warn!(
                xattr = name,
                "file system does not support user xattrs; dropped"
            );
            Ok(())
        }
        other => Ok(other?),
    }
}

/// The entry path relative to the layer root: leading `/` and `./` dropped, `..` refused.
fn normalize(raw: &[u8]) -> Result<PathBuf, &'static str> {
    let mut out = PathBuf::new();
    for c in Path::new(std::ffi::OsStr::from_bytes(raw)).components() {
        match c {
            Component::Normal(c) => out.push(c),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir => return Err("path contains `..`"),
            Component::Prefix(_) => return Err("invalid path"),
        }
    }
    Ok(out)
}

/// An entry path for messages: lossy UTF-8, shortened.
fn display(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_paths() {
        assert_eq!(normalize(b"./a/b/").unwrap(), Path::new("a/b"));
        assert_eq!(normalize(b"/etc//passwd").unwrap(), Path::new("etc/passwd"));
        assert_eq!(normalize(b"./").unwrap(), Path::new(""));
        assert!(normalize(b"a/../../b").is_err());
        assert!(normalize(b"..").is_err());
    }
}
