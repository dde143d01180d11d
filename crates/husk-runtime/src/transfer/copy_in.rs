//! Host → sandbox. The host source is trusted operator input; the sandbox
//! destination is not, so every sandbox lookup refuses symlinks.

use std::ffi::{CStr, CString};
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::ops::{self, io_err, name_path, Ends, BUF_SIZE, MAX_DEPTH, SANDBOX_DIR_MODE};
use super::sys::{self, Kind};
use super::{CopyReport, Side, Skipped, TransferError};

/// Copies host file or directory tree `src` into the sandbox whose root
/// directory is open at `root`, at absolute sandbox path `dest`, creating
/// missing parent directories; every created entry is chowned to `owner`
/// (host uid, host gid).
///
/// A file goes to `dest`, or to `dest/<basename>` if `dest` is an existing
/// directory (like `cp`). A directory's contents are merged into directory
/// `dest`. `src` itself is followed if it is a symlink; symlinks inside the
/// tree are recreated as symlinks, special files are skipped. Sandbox
/// symlinks are never followed; one at `dest` itself is replaced.
pub fn copy_in(
    src: &Path,
    root: BorrowedFd<'_>,
    dest: &Path,
    owner: (u32, u32),
) -> Result<CopyReport, TransferError> {
    let comps = ops::sandbox_components(dest)?;
    let src_file = open_host_src(src)?;
    let mut job = Job {
        owner,
        src,
        report: CopyReport::default(),
        buf: vec![0; BUF_SIZE],
    };
    match src_file.kind {
        Kind::Dir => {
            let target = match comps.split_last() {
                None => ops::open_sandbox_root(root)?,
                Some((name, parents)) => {
                    let parent = ops::walk_sandbox(root, parents, dest, Some(owner))?;
                    job.make_dir(parent.as_fd(), name, dest)?
                }
            };
            job.copy_dir(&src_file.file, &target, dest, Path::new(""), 0)?;
        }
        _ => {
            let base = src.file_name().map(|n| CString::new(n.as_bytes()));
            let Some(Ok(base)) = base else {
                let reason = "has no usable file name";
                return Err(TransferError::InvalidPath {
                    path: src.to_path_buf(),
                    reason,
                });
            };
            let (dir, name, path) = file_target(root, &comps, dest, &base, owner)?;
            job.write_file(src_file, dir.as_fd(), name, &path)?;
        }
    }
    Ok(job.report)
}

/// Where a copied file goes: (sandbox dir fd, name in it, sandbox path).
/// `dest` itself, or `dest/<base>` if `dest` is an existing directory.
fn file_target<'a>(
    root: BorrowedFd<'_>,
    comps: &'a [CString],
    dest: &Path,
    base: &'a CStr,
    owner: (u32, u32),
) -> Result<(OwnedFd, &'a CStr, PathBuf), TransferError> {
    let inside = || dest.join(name_path(base));
    let Some((name, parents)) = comps.split_last() else {
        return Ok((ops::open_sandbox_root(root)?.into(), base, inside()));
    };
    let parent = ops::walk_sandbox(root, parents, dest, Some(owner))?;
    match ops::lookup(parent.as_fd(), name, Side::Sandbox, dest)? {
        Some((Kind::Dir, _)) => {
            let dir = ops::open_dir(parent.as_fd(), name, Side::Sandbox, dest)?;
            Ok((dir.into(), base, inside()))
        }
        // Anything else is replaced or refused by create_file.
        _ => Ok((parent, name, dest.to_path_buf())),
    }
}

/// A host file opened for copying, with what fstat said after the open.
struct HostFile<'a> {
    file: File,
    path: &'a Path,
    kind: Kind,
    mode: u32,
    size: u64,
}

/// Opens the (trusted) top-level host source, following symlinks. Special
/// files are refused before opening: opening a FIFO would block.
fn open_host_src(src: &Path) -> Result<HostFile<'_>, TransferError> {
    let kind = Kind::from_mode(
        std::fs::metadata(src)
            .map_err(io_err("stat", Side::Host, src))?
            .mode(),
    );
    if !matches!(kind, Kind::File | Kind::Dir) {
        let kind = kind.name();
        return Err(TransferError::Unsupported {
            side: Side::Host,
            path: src.to_path_buf(),
            kind,
        });
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(src)
        .map_err(io_err("open", Side::Host, src))?;
    let meta = file.metadata().map_err(io_err("stat", Side::Host, src))?;
    if Kind::from_mode(meta.mode()) != kind {
        return Err(TransferError::Raced {
            side: Side::Host,
            path: src.to_path_buf(),
        });
    }
    Ok(HostFile {
        file,
        path: src,
        kind,
        mode: meta.mode(),
        size: meta.len(),
    })
}

/// State of one `copy_in`.
struct Job<'a> {
    owner: (u32, u32),
    src: &'a Path,
    report: CopyReport,
    buf: Vec<u8>,
}

impl Job<'_> {
    /// Opens or creates directory `name` in sandbox dir `dir`; a created one
    /// is chowned and given [`SANDBOX_DIR_MODE`], an existing one is left alone.
    fn make_dir(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        path: &Path,
    ) -> Result<File, TransferError> {
        let (sub, created) = ops::ensure_dir(dir, name, Side::Sandbox, path)?;
        if created {
            ops::chown(&sub, self.owner, path)?;
            ops::set_mode(&sub, SANDBOX_DIR_MODE, Side::Sandbox, path)?;
        }
        self.report.dirs += 1;
        Ok(sub)
    }

    /// Writes host regular file `src` as `name` in sandbox dir `dir`.
    fn write_file(
        &mut self,
        mut src: HostFile<'_>,
        dir: BorrowedFd<'_>,
        name: &CStr,
        path: &Path,
    ) -> Result<(), TransferError> {
        let mut out = ops::create_file(dir, name, Side::Sandbox, path)?;
        ops::chown(&out, self.owner, path)?;
        let ends = Ends {
            src: (Side::Host, src.path),
            dst: (Side::Sandbox, path),
        };
        let copied = ops::copy_bounded(&mut src.file, &mut out, src.size, &mut self.buf, &ends)?;
        // After chown, which would clear set-id bits anyway; we never copy them.
        ops::set_mode(&out, src.mode, Side::Sandbox, path)?;
        self.report.files += 1;
        self.report.bytes += copied;
        Ok(())
    }

    /// Copies the contents of host dir `host_dir` into sandbox dir `dir`
    /// (sandbox path `base`); `rel` is the position below both roots.
    fn copy_dir(
        &mut self,
        host_dir: &File,
        dir: &File,
        base: &Path,
        rel: &Path,
        depth: usize,
    ) -> Result<(), TransferError> {
        let host_path = self.src.join(rel);
        if depth > MAX_DEPTH {
            return Err(TransferError::TooDeep {
                side: Side::Host,
                path: host_path,
                max: MAX_DEPTH,
            });
        }
        let names = sys::list_dir(host_dir.as_fd(), u64::MAX).map_err(io_err(
            "list",
            Side::Host,
            &host_path,
        ))?;
        for name in &names {
            let rel = rel.join(name_path(name));
            let (host_path, path) = (self.src.join(&rel), base.join(&rel));
            let Some((kind, _)) = ops::lookup(host_dir.as_fd(), name, Side::Host, &host_path)?
            else {
                continue;
            };
            match kind {
                Kind::File => {
                    let (file, kind, mode, size) =
                        ops::open_for_read(host_dir.as_fd(), name, Side::Host, &host_path)?;
                    if kind != Kind::File {
                        let path = host_path;
                        return Err(TransferError::Raced {
                            side: Side::Host,
                            path,
                        });
                    }
                    let src = HostFile {
                        file,
                        path: &host_path,
                        kind,
                        mode,
                        size,
                    };
                    self.write_file(src, dir.as_fd(), name, &path)?;
                }
                Kind::Dir => {
                    let host_sub = ops::open_dir(host_dir.as_fd(), name, Side::Host, &host_path)?;
                    let sub = self.make_dir(dir.as_fd(), name, &path)?;
                    self.copy_dir(&host_sub, &sub, base, &rel, depth + 1)?;
                }
                Kind::Symlink => self.copy_symlink(host_dir, name, dir, &host_path, &path)?,
                Kind::Special(special) => self.report.skipped.push(Skipped {
                    path: rel,
                    kind: special.into(),
                }),
            }
        }
        Ok(())
    }

    /// Recreates host symlink `name` as a symlink in sandbox dir `dir`.
    fn copy_symlink(
        &mut self,
        host_dir: &File,
        name: &CStr,
        dir: &File,
        host_path: &Path,
        path: &Path,
    ) -> Result<(), TransferError> {
        let target = sys::readlink_at(host_dir.as_fd(), name).map_err(io_err(
            "read symlink",
            Side::Host,
            host_path,
        ))?;
        // readlink never returns NUL bytes; the fallback is unreachable.
        let target = CString::new(target).map_err(|_| TransferError::InvalidPath {
            path: host_path.to_path_buf(),
            reason: "symlink target contains a NUL byte",
        })?;
        ops::clear_slot(dir.as_fd(), name, Side::Sandbox, path)?;
        sys::symlink_at(&target, dir.as_fd(), name).map_err(io_err(
            "create symlink",
            Side::Sandbox,
            path,
        ))?;
        sys::lchown_at(dir.as_fd(), name, self.owner).map_err(io_err(
            "chown",
            Side::Sandbox,
            path,
        ))?;
        self.report.files += 1;
        Ok(())
    }
}
