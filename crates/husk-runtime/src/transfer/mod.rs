//! Copying files out of and into a sandbox.
//!
//! Threat model: everything inside the sandbox (names, symlinks, sizes, file
//! types) is hostile and may change while we copy. Every sandbox lookup goes
//! through `openat2` relative to the sandbox root fd, refusing symlinks and
//! magic links; every host write goes `openat2`-beneath the destination fd.
//! Special files are never opened and every count, size and depth is bounded.

mod copy_in;
mod copy_out;
mod mount_point;
mod ops;
mod sys;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_in;

use std::fmt;
use std::io;
use std::path::PathBuf;

pub use copy_in::copy_in;
pub use copy_out::{copy_out, sandbox_is_dir, HostDest};
pub use mount_point::mount_point;

/// Upper bounds for one [`copy_out`], so a sandbox cannot fill the host disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutputLimits {
    /// Maximum total bytes of regular-file content copied.
    pub max_bytes: u64,
    /// Maximum number of entries handled: regular files, directories and
    /// skipped entries all count, so no kind of entry is unbounded.
    pub max_files: u64,
}

impl Default for OutputLimits {
    /// 1 GiB and 10 000 entries.
    fn default() -> Self {
        Self {
            max_bytes: 1 << 30,
            max_files: 10_000,
        }
    }
}

/// Why an entry was not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipKind {
    /// A symlink, never followed; `target` is lossy UTF-8, at most 256 bytes.
    Symlink {
        /// The link's target text, for the report only.
        target: String,
    },
    /// A character or block device (or an unknown file type).
    Device,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
}

/// One entry that was not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// Path relative to the copied root.
    pub path: PathBuf,
    /// What the entry was.
    pub kind: SkipKind,
}

/// What a copy did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CopyReport {
    /// Regular files copied (for [`copy_in`], symlinks recreated count too).
    pub files: u64,
    /// Directories copied from the source tree (missing parents excluded).
    pub dirs: u64,
    /// Bytes of file content copied.
    pub bytes: u64,
    /// Entries that were not copied: the first [`MAX_SKIPPED_LISTED`] of them...
    pub skipped: Vec<Skipped>,
    /// ...and how many more there were (a sandbox can make any number of symlinks, and the
    /// report must not grow with them).
    pub skipped_more: u64,
    /// Every copied file with its size and digest, when the destination asked for a manifest
    /// ([`HostDest::with_manifest`]); bounded by the limits' file count.
    pub manifest: Vec<ManifestEntry>,
}

/// One copied file of a [`CopyReport::manifest`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    /// Path relative to the destination directory.
    pub path: PathBuf,
    /// Bytes copied.
    pub size: u64,
    /// SHA-256 of the bytes copied (computed while copying, not re-read), lowercase hex.
    pub sha256: String,
}

/// How many skipped entries a [`CopyReport`] lists by name.
pub const MAX_SKIPPED_LISTED: usize = 100;

/// Which side of the sandbox boundary a path in an error lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// A path on the host.
    Host,
    /// An absolute path inside the sandbox.
    Sandbox,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Host => "host path",
            Side::Sandbox => "sandbox path",
        })
    }
}

/// Everything that can go wrong while copying into or out of a sandbox.
#[derive(thiserror::Error, Debug)]
pub enum TransferError {
    /// A sandbox path argument was not absolute, or held `..` or a NUL byte.
    #[error("invalid sandbox path {}: {reason}", .path.display())]
    InvalidPath {
        /// The offending path.
        path: PathBuf,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The source does not exist in the sandbox.
    #[error("not found in sandbox: {}", .path.display())]
    NotFound {
        /// The sandbox path that was asked for.
        path: PathBuf,
    },
    /// A sandbox symlink stood where a path had to be resolved through it.
    #[error("refusing to follow symlink at sandbox path {}", .path.display())]
    Symlink {
        /// The sandbox path of the symlink.
        path: PathBuf,
    },
    /// A non-directory stood where a directory is needed.
    #[error("{side} {} is not a directory", .path.display())]
    NotADirectory {
        /// Host or sandbox.
        side: Side,
        /// The offending path.
        path: PathBuf,
    },
    /// An entry that we will not replace stood where a file must be created.
    #[error("refusing to replace existing {kind} at {side} {}", .path.display())]
    Exists {
        /// Host or sandbox.
        side: Side,
        /// The path we wanted to create.
        path: PathBuf,
        /// What is there ("directory", "symlink", "fifo", ...).
        kind: &'static str,
    },
    /// The top-level source is neither a regular file nor a directory.
    #[error("{side} {} is a {kind}, not a regular file or directory", .path.display())]
    Unsupported {
        /// Host or sandbox.
        side: Side,
        /// The source path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// An entry changed type between inspection and open (a likely attack).
    #[error("{side} {} changed type while being copied", .path.display())]
    Raced {
        /// Host or sandbox.
        side: Side,
        /// The entry's path.
        path: PathBuf,
    },
    /// The source tree nests deeper than we are willing to recurse.
    #[error("directory nesting deeper than {max} levels at {side} {}", .path.display())]
    TooDeep {
        /// Host or sandbox.
        side: Side,
        /// The first directory past the limit.
        path: PathBuf,
        /// The depth limit.
        max: usize,
    },
    /// [`OutputLimits`] would be exceeded by the next entry.
    #[error("output limit exceeded: more than {}", limit_text(.what, *.limit))]
    LimitExceeded {
        /// `"files"` or `"bytes"`.
        what: &'static str,
        /// The limit that would be exceeded.
        limit: u64,
        /// Regular files copied before stopping.
        copied_files: u64,
        /// Bytes copied before stopping.
        copied_bytes: u64,
    },
    /// A system call failed.
    #[error("cannot {op} {side} {}", .path.display())]
    Io {
        /// What we were doing ("open", "read", "create", ...).
        op: &'static str,
        /// Host or sandbox.
        side: Side,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Renders a limit for humans: "10000 files", "1.0 GiB".
fn limit_text(what: &str, limit: u64) -> String {
    if what != "bytes" {
        return format!("{limit} {what}");
    }
    const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
    match UNITS.iter().find(|(size, _)| limit >= *size) {
        Some((size, unit)) => format!("{:.1} {unit}", limit as f64 / *size as f64),
        None => format!("{limit} bytes"),
    }
}
