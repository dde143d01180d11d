//! Overlay-format layer directories: the whiteouts and opaque markers with which a layer
//! hides what lower layers have, as overlayfs itself writes them (a 0/0 character device for
//! a deleted entry, the `trusted.overlay.opaque` xattr for a directory that replaces, rather
//! than merges with, the one below). Template builds store their layers this way so that a
//! stack of them can be mounted as overlay lower layers directly.

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use crate::sys::{self, cpath};

/// The xattr overlayfs reads to treat a directory as opaque.
pub const OPAQUE_XATTR: &str = "trusted.overlay.opaque";

/// Creates a whiteout at `path` (which must not exist): hides the entry of that name in
/// every lower layer.
pub fn make_whiteout(path: &Path) -> io::Result<()> {
    sys::mknod_char(&cpath(path)?, 0, 0, 0)
}

/// Whether `meta` (from `symlink_metadata`) describes a whiteout.
pub fn is_whiteout(meta: &std::fs::Metadata) -> bool {
    meta.file_type().is_char_device() && meta.rdev() == 0
}

/// Marks directory `dir` opaque: lower layers' entries below it are hidden.
pub fn set_opaque(dir: &Path) -> io::Result<()> {
    sys::lsetxattr(&cpath(dir)?, OPAQUE_XATTR, b"y")
}
