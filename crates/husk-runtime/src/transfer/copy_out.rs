//! Sandbox → host. The sandbox side is hostile: only regular files and
//! directories are copied, everything is bounded by [`OutputLimits`].

use std::ffi::CStr;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::ops::{self, io_err, name_path, Ends, BUF_SIZE, MAX_DEPTH};
use super::sys::{self, Kind};
use super::{CopyReport, ManifestEntry, OutputLimits, Side, SkipKind, Skipped, TransferError};

/// Symlink targets in the report are cut to this many bytes.
const MAX_TARGET_BYTES: usize = 256;

/// Copies the regular files and directories under `src` (absolute path
/// inside the sandbox whose root directory is open at `root`) to host
/// directory `dest`, which is created with its parents if missing.
///
/// A regular file `src` is copied to `dest/<basename>`; a directory's
/// contents are copied recursively into `dest`. Symlinks are never followed
/// (a symlink at or inside `src`'s path is an error; inside the tree it is
/// skipped), special files are skipped unopened, modes keep only `0o777`.
/// On error the partial copy is left in `dest` for the caller to remove.
pub fn copy_out(
    root: BorrowedFd<'_>,
    src: &Path,
    dest: &HostDest,
    limits: &OutputLimits,
) -> Result<CopyReport, TransferError> {
    let host = &dest.dir;
    let (owner, manifest) = (dest.owner, dest.manifest);
    let dest = dest.path.as_path();
    let comps = ops::sandbox_components(src)?;
    let mut job = Job {
        limits,
        src,
        dest,
        owner,
        manifest,
        report: CopyReport::default(),
        buf: vec![0; BUF_SIZE],
    };
    // The host side is only touched once the source is known to be copyable.
    let Some((name, parents)) = comps.split_last() else {
        // `src` is "/": copy the whole root's contents.
        let dir = ops::open_sandbox_root(root)?;
        job.copy_dir(&dir, host, Path::new(""), 0)?;
        return Ok(job.report);
    };
    let parent = ops::walk_sandbox(root, parents, src, None)?;
    let path = src.to_path_buf();
    match ops::lookup(parent.as_fd(), name, Side::Sandbox, src)? {
        None => return Err(TransferError::NotFound { path }),
        Some((Kind::Symlink, _)) => return Err(TransferError::Symlink { path }),
        Some((Kind::File, _)) => {
            job.copy_file(parent.as_fd(), name, host, name_path(name))?;
        }
        Some((Kind::Dir, _)) => {
            let dir = ops::open_dir(parent.as_fd(), name, Side::Sandbox, src)?;
            job.copy_dir(&dir, host, Path::new(""), 0)?;
        }
        Some((kind, _)) => {
            let kind = kind.name();
            return Err(TransferError::Unsupported {
                side: Side::Sandbox,
                path,
                kind,
            });
        }
    }
    Ok(job.report)
}

/// Whether `src` (absolute, inside the sandbox whose root is open at `root`) is a directory;
/// an error if it is missing or a symlink (at or above it), which are never followed.
pub fn sandbox_is_dir(root: BorrowedFd<'_>, src: &Path) -> Result<bool, TransferError> {
    let comps = ops::sandbox_components(src)?;
    let Some((name, parents)) = comps.split_last() else {
        return Ok(true);
    };
    let parent = ops::walk_sandbox(root, parents, src, None)?;
    let path = src.to_path_buf();
    match ops::lookup(parent.as_fd(), name, Side::Sandbox, src)? {
        None => Err(TransferError::NotFound { path }),
        Some((Kind::Symlink, _)) => Err(TransferError::Symlink { path }),
        Some((Kind::Dir, _)) => Ok(true),
        Some(_) => Ok(false),
    }
}

/// A host directory outputs are copied into, opened when it is named.
///
/// Open it before the sandbox runs: its path is resolved then, once, so a sandbox that can
/// write somewhere along it (a `:rw` mount) cannot swap a component for a symlink before the
/// copy. Everything below it is reached fd-relative, never through a symlink.
pub struct HostDest {
    dir: File,
    path: PathBuf,
    owner: Option<(u32, u32)>,
    manifest: bool,
}

impl HostDest {
    /// Creates (with parents) and opens `path`; trusted operator input, resolved normally.
    pub fn open(path: &Path) -> Result<HostDest, TransferError> {
        Ok(HostDest {
            dir: open_host_dest(path)?,
            path: path.to_path_buf(),
            owner: None,
            manifest: false,
        })
    }

    /// Gives `path` itself and everything copied into it this host uid/gid (instead of the
    /// caller's): outputs saved in a workspace belong to the id its sandboxes see as `user`.
    pub fn owned_by(mut self, owner: (u32, u32)) -> Result<HostDest, TransferError> {
        ops::chown_on(&self.dir, owner, Side::Host, &self.path)?;
        self.owner = Some(owner);
        Ok(self)
    }

    /// Lists every copied file with its size and SHA-256 in [`CopyReport::manifest`].
    pub fn with_manifest(mut self) -> HostDest {
        self.manifest = true;
        self
    }

    /// Directory `name` inside this one, created (mode 0755, this destination's owner) if
    /// missing, never through a symlink: for destinations inside a tree a sandbox may have
    /// written (a workspace it had mounted read-write may hold `runs -> /etc`).
    pub fn subdir(&self, name: &str) -> Result<HostDest, TransferError> {
        let path = self.path.join(name);
        let cname = std::ffi::CString::new(name).map_err(|_| TransferError::InvalidPath {
            path: path.clone(),
            reason: "NUL byte",
        })?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(TransferError::InvalidPath {
                path,
                reason: "not a single path component",
            });
        }
        let (dir, created) = ops::ensure_dir(self.dir.as_fd(), &cname, Side::Host, &path)?;
        if created {
            if let Some(owner) = self.owner {
                ops::chown_on(&dir, owner, Side::Host, &path)?;
            }
            ops::set_mode(&dir, 0o755, Side::Host, &path)?;
        }
        Ok(HostDest {
            dir,
            path,
            owner: self.owner,
            manifest: self.manifest,
        })
    }

    /// The same directory (a duplicate of its descriptor, not a new lookup of its path).
    pub fn try_clone(&self) -> Result<HostDest, TransferError> {
        Ok(HostDest {
            dir: self
                .dir
                .try_clone()
                .map_err(io_err("duplicate", Side::Host, &self.path))?,
            path: self.path.clone(),
            owner: self.owner,
            manifest: self.manifest,
        })
    }

    /// Creates file `name` in this directory (never through an existing entry; mode `mode`,
    /// this destination's owner) and opens it for writing.
    pub fn create_file(&self, name: &str, mode: u32) -> Result<File, TransferError> {
        let path = self.path.join(name);
        let cname = std::ffi::CString::new(name).map_err(|_| TransferError::InvalidPath {
            path: path.clone(),
            reason: "NUL byte",
        })?;
        let f = ops::create_file(self.dir.as_fd(), &cname, Side::Host, &path)?;
        if let Some(owner) = self.owner {
            ops::chown_on(&f, owner, Side::Host, &path)?;
        }
        ops::set_mode(&f, mode, Side::Host, &path)?;
        Ok(f)
    }

    /// The path it was opened as.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Creates (with parents) and opens the host destination directory.
fn open_host_dest(dest: &Path) -> Result<File, TransferError> {
    let not_dir = || TransferError::NotADirectory {
        side: Side::Host,
        path: dest.to_path_buf(),
    };
    std::fs::create_dir_all(dest).map_err(|e| match dest.exists() && !dest.is_dir() {
        true => not_dir(),
        false => io_err("create directory", Side::Host, dest)(e),
    })?;
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dest)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) => not_dir(),
            _ => io_err("open", Side::Host, dest)(e),
        })
}

/// State of one `copy_out`: paths for messages, counters, the copy buffer.
struct Job<'a> {
    limits: &'a OutputLimits,
    src: &'a Path,
    dest: &'a Path,
    owner: Option<(u32, u32)>,
    manifest: bool,
    report: CopyReport,
    buf: Vec<u8>,
}

impl Job<'_> {
    /// Entries handled so far; all kinds count against `max_files`.
    fn entries(&self) -> u64 {
        self.report.files + self.report.dirs + self.report.skipped.len() as u64
    }

    fn limit(&self, what: &'static str, limit: u64) -> TransferError {
        let (copied_files, copied_bytes) = (self.report.files, self.report.bytes);
        TransferError::LimitExceeded {
            what,
            limit,
            copied_files,
            copied_bytes,
        }
    }

    /// Checks that one more entry carrying `bytes` bytes fits the limits.
    fn admit(&self, bytes: u64) -> Result<(), TransferError> {
        if self.entries() + 1 > self.limits.max_files {
            return Err(self.limit("files", self.limits.max_files));
        }
        if self.report.bytes.saturating_add(bytes) > self.limits.max_bytes {
            return Err(self.limit("bytes", self.limits.max_bytes));
        }
        Ok(())
    }

    fn skip(&mut self, rel: &Path, kind: SkipKind) -> Result<(), TransferError> {
        self.admit(0)?;
        if self.report.skipped.len() < super::MAX_SKIPPED_LISTED {
            self.report.skipped.push(Skipped {
                path: rel.to_path_buf(),
                kind,
            });
        } else {
            self.report.skipped_more += 1;
        }
        Ok(())
    }

    /// Copies regular file `name` in sandbox dir `dir` to `name` in `host_dir`.
    fn copy_file(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        host_dir: &File,
        rel: &Path,
    ) -> Result<(), TransferError> {
        let (src_path, dst_path) = (self.src.join(rel), self.dest.join(rel));
        let (mut file, kind, mode, size) = ops::open_for_read(dir, name, Side::Sandbox, &src_path)?;
        // fstat after open is what counts: the entry may have been swapped.
        match kind {
            Kind::File => {}
            Kind::Special(special) => return self.skip(rel, special.into()),
            Kind::Dir | Kind::Symlink => {
                return Err(TransferError::Raced {
                    side: Side::Sandbox,
                    path: src_path,
                })
            }
        }
        self.admit(size)?;
        let mut out = ops::create_file(host_dir.as_fd(), name, Side::Host, &dst_path)?;
        let ends = Ends {
            src: (Side::Sandbox, &src_path),
            dst: (Side::Host, &dst_path),
        };
        let copied = if self.manifest {
            let mut hashing = Hashing {
                inner: &mut out,
                hasher: Sha256::new(),
            };
            let n = ops::copy_bounded(&mut file, &mut hashing, size, &mut self.buf, &ends)?;
            let sha256 = hex(&hashing.hasher.finalize());
            self.report.manifest.push(ManifestEntry {
                path: rel.to_path_buf(),
                size: n,
                sha256,
            });
            n
        } else {
            ops::copy_bounded(&mut file, &mut out, size, &mut self.buf, &ends)?
        };
        if let Some(owner) = self.owner {
            ops::chown_on(&out, owner, Side::Host, &dst_path)?;
        }
        // No write bits for group and others: a sandbox cannot leave a world-writable file.
        ops::set_mode(&out, mode & HOST_MODE_MASK, Side::Host, &dst_path)?;
        self.report.files += 1;
        self.report.bytes += copied;
        Ok(())
    }

    /// Copies the contents of sandbox dir `dir` into `host_dir`.
    fn copy_dir(
        &mut self,
        dir: &File,
        host_dir: &File,
        rel: &Path,
        depth: usize,
    ) -> Result<(), TransferError> {
        if depth > MAX_DEPTH {
            return Err(TransferError::TooDeep {
                side: Side::Sandbox,
                path: self.src.join(rel),
                max: MAX_DEPTH,
            });
        }
        let budget = self.limits.max_files.saturating_sub(self.entries());
        let names = sys::list_dir(dir.as_fd(), budget).map_err(io_err(
            "list",
            Side::Sandbox,
            &self.src.join(rel),
        ))?;
        if names.len() as u64 > budget {
            return Err(self.limit("files", self.limits.max_files));
        }
        for name in &names {
            let rel = rel.join(name_path(name));
            let src_path = self.src.join(&rel);
            // Vanished since listing: nothing to copy.
            let Some((kind, _)) = ops::lookup(dir.as_fd(), name, Side::Sandbox, &src_path)? else {
                continue;
            };
            match kind {
                Kind::File => self.copy_file(dir.as_fd(), name, host_dir, &rel)?,
                Kind::Dir => self.copy_subdir(dir, name, host_dir, &rel, depth)?,
                Kind::Symlink => {
                    let target = match sys::readlink_at(dir.as_fd(), name) {
                        Ok(bytes) => truncate_lossy(&bytes, MAX_TARGET_BYTES),
                        Err(e) => format!("<unreadable: {e}>"),
                    };
                    self.skip(&rel, SkipKind::Symlink { target })?;
                }
                Kind::Special(special) => self.skip(&rel, special.into())?,
            }
        }
        Ok(())
    }

    fn copy_subdir(
        &mut self,
        dir: &File,
        name: &CStr,
        host_dir: &File,
        rel: &Path,
        depth: usize,
    ) -> Result<(), TransferError> {
        self.admit(0)?;
        let sub = ops::open_dir(dir.as_fd(), name, Side::Sandbox, &self.src.join(rel))?;
        let mode = sub
            .metadata()
            .map_err(io_err("stat", Side::Sandbox, &self.src.join(rel)))?
            .mode();
        let dst_path = self.dest.join(rel);
        let (host_sub, created) = ops::ensure_dir(host_dir.as_fd(), name, Side::Host, &dst_path)?;
        self.report.dirs += 1;
        self.copy_dir(&sub, &host_sub, rel, depth + 1)?;
        // A directory that was already on the host keeps its mode: the sandbox must not open up
        // (or lock) a host directory. New ones get the sandbox's mode, without group/other write,
        // set last so that a read-only directory can still be filled.
        if !created {
            return Ok(());
        }
        if let Some(owner) = self.owner {
            ops::chown_on(&host_sub, owner, Side::Host, &dst_path)?;
        }
        ops::set_mode(
            &host_sub,
            (mode & HOST_MODE_MASK) | 0o700,
            Side::Host,
            &dst_path,
        )
    }
}

/// A writer that hashes what goes through it (a manifest's digests are of the bytes written,
/// so a file changing after the copy cannot make its entry wrong).
struct Hashing<'a, W> {
    inner: &'a mut W,
    hasher: Sha256,
}

impl<W: std::io::Write> std::io::Write for Hashing<'_, W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(64), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Mode bits a copied-out file or new directory may keep on the host.
const HOST_MODE_MASK: u32 = 0o755;

/// Lossy UTF-8 of `bytes`, cut to at most `max` bytes on a char boundary.
fn truncate_lossy(bytes: &[u8], max: usize) -> String {
    let mut text = String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned();
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}
