//! Writing a root file system as one gzip layer tar: deterministic (sorted names, numeric
//! owners, no user names), never following a symlink, hard links kept as links, and hashed on
//! the way out (the compressed digest names the blob, the uncompressed one is the diff_id).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use flate2::write::GzEncoder;
use husk_runtime::libc;
use tar::{EntryType, Header};

use super::blobio::HashingWriter;
use super::error::OciError;

/// The layer blob written by [`write_layer`].
#[derive(Debug, Clone)]
pub(crate) struct LayerBlob {
    /// sha256 of the compressed blob.
    pub digest: String,
    /// sha256 of the uncompressed tar.
    pub diff_id: String,
    pub size: u64,
}

type Sink = HashingWriter<GzEncoder<HashingWriter<BufWriter<File>>>>;

/// Writes `rootfs` as a gzip tar layer to `out` (created; must not exist).
pub(crate) fn write_layer(rootfs: &Path, out: &Path) -> Result<LayerBlob, OciError> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(out)
        .map_err(OciError::io(format!("creating {}", out.display())))?;
    let gz = GzEncoder::new(
        HashingWriter::new(BufWriter::with_capacity(1 << 20, file)),
        flate2::Compression::default(),
    );
    let mut writer = LayerWriter {
        root: rootfs.to_path_buf(),
        builder: tar::Builder::new(HashingWriter::new(gz)),
        links: HashMap::new(),
    };
    writer.walk(Path::new(""))?;
    let finish = |w: LayerWriter| -> io::Result<LayerBlob> {
        let (gz, diff_id, _) = w.builder.into_inner()?.into_parts();
        let (file, digest, size) = gz.finish()?.into_parts();
        file.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        Ok(LayerBlob {
            digest,
            diff_id,
            size,
        })
    };
    finish(writer).map_err(OciError::io(format!("writing {}", out.display())))
}

struct LayerWriter {
    root: PathBuf,
    builder: tar::Builder<Sink>,
    /// First path seen of each multiply-linked inode, by (dev, ino).
    links: HashMap<(u64, u64), PathBuf>,
}

impl LayerWriter {
    /// Appends everything below `rel` (a directory relative to the root), sorted by name.
    fn walk(&mut self, rel: &Path) -> Result<(), OciError> {
        let dir = self.root.join(rel);
        let context = || format!("reading {}", dir.display());
        let mut names = fs::read_dir(&dir)
            .and_then(|entries| {
                entries
                    .map(|e| e.map(|e| e.file_name()))
                    .collect::<io::Result<Vec<OsString>>>()
            })
            .map_err(OciError::io(context()))?;
        names.sort();
        for name in names {
            let child = rel.join(&name);
            let path = self.root.join(&child);
            let meta = fs::symlink_metadata(&path)
                .map_err(OciError::io(format!("reading {}", path.display())))?;
            let appended = self
                .append(&child, &path, &meta)
                .map_err(OciError::io(format!(
                    "adding {} to the layer",
                    path.display()
                )))?;
            if appended && meta.is_dir() {
                self.walk(&child)?;
            }
        }
        Ok(())
    }

    /// Appends one entry; `false` for what a layer does not carry (sockets, devices, FIFOs and
    /// overlay whiteouts, which a merged root should not have anyway).
    fn append(&mut self, rel: &Path, path: &Path, meta: &fs::Metadata) -> io::Result<bool> {
        let ft = meta.file_type();
        let mut header = Header::new_gnu();
        header.set_uid(u64::from(meta.uid()));
        header.set_gid(u64::from(meta.gid()));
        header.set_mode(meta.mode() & 0o7777);
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_size(0);
        if ft.is_symlink() {
            header.set_entry_type(EntryType::Symlink);
            let target = fs::read_link(path)?;
            self.builder.append_link(&mut header, rel, target)?;
            return Ok(true);
        }
        if !ft.is_dir() && !ft.is_file() {
            return Ok(false);
        }
        // lgetxattr: `path` is not a symlink (checked above), and nothing else is copied.
        if let Some(cap) = xattr::get(path, "security.capability")? {
            self.builder
                .append_pax_extensions([("SCHILY.xattr.security.capability", cap.as_slice())])?;
        }
        if ft.is_dir() {
            header.set_entry_type(EntryType::Directory);
            self.builder.append_data(&mut header, rel, io::empty())?;
            return Ok(true);
        }
        if meta.nlink() > 1 {
            if let Some(first) = self.links.get(&(meta.dev(), meta.ino())) {
                header.set_entry_type(EntryType::Link);
                self.builder.append_link(&mut header, rel, first)?;
                return Ok(true);
            }
            self.links
                .insert((meta.dev(), meta.ino()), rel.to_path_buf());
        }
        header.set_entry_type(EntryType::Regular);
        header.set_size(meta.len());
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        let exact = Exact {
            inner: file,
            remaining: meta.len(),
        };
        self.builder.append_data(&mut header, rel, exact)?;
        Ok(true)
    }
}

/// Reads exactly `remaining` bytes, failing if the file shrank (a tar entry's size is in its
/// header, so a short read would corrupt every entry after it).
struct Exact<R> {
    inner: R,
    remaining: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let max = buf
            .len()
            .min(self.remaining.min(usize::MAX as u64) as usize);
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while being exported",
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}
