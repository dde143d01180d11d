//! Open files: the reads and writes behind `/files` downloads and uploads.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use husk_proto::{AgentError, ErrorKind, Reply, User, CHUNK};
use xattr::FileExt as _;

use super::entry::{entry_of_file, XATTR_PREFIX};
use super::error::{invalid, io_error};

/// Most handles open at once: uploads and downloads are short-lived and the server keeps few
/// in flight, so more than this means handles are leaking.
pub(crate) const MAX_HANDLES: usize = 64;
/// Longest metadata key: 255 (the kernel's xattr name limit) minus the `user.e2b.` prefix.
const MAX_KEY: usize = 255 - XATTR_PREFIX.len();
/// Most bytes of metadata (keys and values) one file may carry, as envd allows.
const MAX_METADATA: usize = 4096;

/// Open flags besides the access mode. `O_NONBLOCK`: opening a FIFO must never block the
/// single-threaded agent (the type is checked before and after opening; for regular files the
/// flag changes nothing). `O_NOCTTY`: a terminal must never become the agent's.
const OPEN_FLAGS: i32 = libc::O_NONBLOCK | libc::O_NOCTTY;

enum Access {
    Read,
    Write,
}

struct Handle {
    file: File,
    /// The resolved path it was opened by, for the entry `Close` returns.
    path: PathBuf,
    access: Access,
}

/// The table of open handles.
#[derive(Default)]
pub(crate) struct Handles {
    open: HashMap<u32, Handle>,
    last: u32,
}

impl Handles {
    /// Opens a regular file for reading → `Opened` with its entry (for the size).
    pub(crate) fn open_read(&mut self, path: &Path) -> Result<Reply, AgentError> {
        self.ensure_room()?;
        let meta = std::fs::metadata(path).map_err(|e| io_error("open", path, &e))?;
        check_regular(path, &meta)?;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(OPEN_FLAGS)
            .open(path)
            .map_err(|e| io_error("open", path, &e))?;
        // The path may have been swapped for something else between the checks.
        let meta = file.metadata().map_err(|e| io_error("stat", path, &e))?;
        check_regular(path, &meta)?;
        let entry = entry_of_file(path, &file).map_err(|e| io_error("stat", path, &e))?;
        let handle = self.insert(Handle {
            file,
            path: path.to_owned(),
            access: Access::Read,
        });
        Ok(Reply::Opened { handle, entry })
    }

    /// Creates or truncates a regular file for writing (parents created for `user`),
    /// replaces its client metadata → `Opened`. A file this creates for `user` is owned by
    /// uid/gid 1000; an existing file keeps its owner.
    pub(crate) fn open_write(
        &mut self,
        path: &Path,
        user: User,
        metadata: &[(String, String)],
    ) -> Result<Reply, AgentError> {
        validate_metadata(metadata)?;
        self.ensure_room()?;
        if let Some(parent) = path.parent() {
            super::make_dirs(parent, user)?;
        }
        // Refuse what is not a regular file before opening it: opening a device can have
        // side effects even without reading. A missing path (or a dangling symlink, whose
        // target the open creates) means the file is new.
        let created = match std::fs::metadata(path) {
            Ok(meta) => {
                check_regular(path, &meta)?;
                false
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => true,
            Err(e) => return Err(io_error("open", path, &e)),
        };
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(OPEN_FLAGS)
            .open(path)
            .map_err(|e| io_error("open", path, &e))?;
        let meta = file.metadata().map_err(|e| io_error("stat", path, &e))?;
        check_regular(path, &meta)?;
        if created && user != User::Root {
            std::os::unix::fs::fchown(&file, Some(user.id()), Some(user.id()))
                .map_err(|e| io_error("chown", path, &e))?;
        }
        set_metadata(&file, path, metadata)?;
        let entry = entry_of_file(path, &file).map_err(|e| io_error("stat", path, &e))?;
        let handle = self.insert(Handle {
            file,
            path: path.to_owned(),
            access: Access::Write,
        });
        Ok(Reply::Opened { handle, entry })
    }

    /// Reads up to `min(len, CHUNK)` bytes at `offset` → `Data`, empty at end of file.
    pub(crate) fn read(&mut self, handle: u32, offset: u64, len: u32) -> Result<Reply, AgentError> {
        let h = self.get(handle)?;
        if !matches!(h.access, Access::Read) {
            return Err(invalid(format!("handle {handle} is not open for reading")));
        }
        let want = usize::try_from(len).unwrap_or(CHUNK).min(CHUNK);
        let mut buf = vec![0u8; want];
        let mut filled = 0;
        while filled < want {
            let at = offset.saturating_add(filled as u64);
            match h.file.read_at(&mut buf[filled..], at) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_error("read", &h.path, &e)),
            }
        }
        buf.truncate(filled);
        Ok(Reply::Data(buf))
    }

    /// Appends `data` at the handle's offset → `Done`.
    pub(crate) fn write(&mut self, handle: u32, data: &[u8]) -> Result<Reply, AgentError> {
        let h = self.get(handle)?;
        if !matches!(h.access, Access::Write) {
            return Err(invalid(format!("handle {handle} is not open for writing")));
        }
        (&h.file)
            .write_all(data)
            .map_err(|e| io_error("write", &h.path, &e))?;
        Ok(Reply::Done)
    }

    /// Closes a handle → `Entry` of the file as it is now (from the open fd, so a file
    /// renamed meanwhile is still described, under the path it was opened by).
    pub(crate) fn close(&mut self, handle: u32) -> Result<Reply, AgentError> {
        let h = self.open.remove(&handle).ok_or_else(|| unknown(handle))?;
        let entry = entry_of_file(&h.path, &h.file).map_err(|e| io_error("stat", &h.path, &e))?;
        Ok(Reply::Entry(entry))
    }

    fn get(&self, handle: u32) -> Result<&Handle, AgentError> {
        self.open.get(&handle).ok_or_else(|| unknown(handle))
    }

    /// Checked before opening, so a refused open never touches the file.
    fn ensure_room(&self) -> Result<(), AgentError> {
        if self.open.len() >= MAX_HANDLES {
            return Err(AgentError::new(
                ErrorKind::ResourceExhausted,
                format!("too many open files (at most {MAX_HANDLES})"),
            ));
        }
        Ok(())
    }

    /// Stores `h` under a fresh id (never 0; ids are reused only after wrapping around, and
    /// never while open).
    fn insert(&mut self, h: Handle) -> u32 {
        loop {
            self.last = self.last.wrapping_add(1).max(1);
            if !self.open.contains_key(&self.last) {
                break;
            }
        }
        self.open.insert(self.last, h);
        self.last
    }
}

fn unknown(handle: u32) -> AgentError {
    AgentError::new(ErrorKind::NotFound, format!("handle {handle} is not open"))
}

/// Refuses anything but a regular file.
fn check_regular(path: &Path, meta: &std::fs::Metadata) -> Result<(), AgentError> {
    if meta.is_dir() {
        Err(invalid(format!("path '{}' is a directory", path.display())))
    } else if !meta.is_file() {
        Err(invalid(format!(
            "path '{}' is not a regular file",
            path.display()
        )))
    } else {
        Ok(())
    }
}

/// Checks client metadata as envd does for `X-Metadata-*` headers: keys of printable ASCII
/// (no space) that fit an xattr name, at most [`MAX_METADATA`] bytes in all.
pub(crate) fn validate_metadata(metadata: &[(String, String)]) -> Result<(), AgentError> {
    let mut total = 0usize;
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_KEY || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(format!(
                "invalid metadata key '{}': 1 to {MAX_KEY} printable ASCII characters",
                key.escape_default()
            )));
        }
        total += key.len() + value.len();
    }
    if total > MAX_METADATA {
        return Err(invalid(format!(
            "metadata of {total} bytes exceeds the limit of {MAX_METADATA}"
        )));
    }
    Ok(())
}

/// Replaces the file's `user.e2b.*` attributes with `metadata`. A file system without user
/// xattrs is fine as long as there is nothing to store.
fn set_metadata(file: &File, path: &Path, metadata: &[(String, String)]) -> Result<(), AgentError> {
    let unsupported = |e: &io::Error| e.raw_os_error() == Some(libc::EOPNOTSUPP);
    let no_support = || {
        invalid(format!(
            "the file system of '{}' does not support metadata",
            path.display()
        ))
    };
    // The kernel bounds the list (64 KiB of names), so removing all of them is bounded too.
    let old: Vec<OsString> = match file.list_xattr() {
        Ok(names) => names
            .filter(|n| n.as_bytes().starts_with(XATTR_PREFIX.as_bytes()))
            .collect(),
        Err(e) if unsupported(&e) && metadata.is_empty() => return Ok(()),
        Err(e) if unsupported(&e) => return Err(no_support()),
        Err(e) => return Err(io_error("list attributes of", path, &e)),
    };
    for name in old {
        match file.remove_xattr(&name) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(io_error("remove attributes of", path, &e)),
        }
    }
    for (key, value) in metadata {
        match file.set_xattr(format!("{XATTR_PREFIX}{key}"), value.as_bytes()) {
            Ok(()) => {}
            Err(e) if unsupported(&e) => return Err(no_support()),
            Err(e) => return Err(io_error("set attributes of", path, &e)),
        }
    }
    Ok(())
}
