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

/// Runs `mkfs.erofs` (with `args` before the output file) on the merged view of overlay-format
/// `layers` (top first): the layers are mounted read-only as one overlay in a private mount
/// namespace of the child process, so nothing is mounted on the host and the mount vanishes
/// with the child whatever happens. Relative layer paths are resolved in `cwd` (short paths
/// keep many layers within the mount options' one-page limit). `envs` are set for mkfs (e.g.
/// `SOURCE_DATE_EPOCH`). Returns mkfs's output.
pub fn mkfs_erofs_merged(
    layers: &[std::path::PathBuf],
    cwd: &Path,
    mountpoint: &Path,
    out: &Path,
    args: &[String],
    envs: &[(&str, &str)],
) -> io::Result<std::process::Output> {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("mkfs.erofs");
    cmd.args(args).arg(out).current_dir(cwd);
    cmd.envs(envs.iter().copied());
    match layers {
        [] => return Err(io::Error::other("an image needs at least one layer")),
        // overlayfs needs two lower layers when it has no upper one; one layer is its own view.
        [only] => {
            cmd.arg(cwd.join(only));
        }
        _ => {
            let lowers: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
            let opts = std::ffi::CString::new(format!("lowerdir={}", lowers.join(":")))?;
            let target = cpath(mountpoint)?;
            cmd.arg(mountpoint);
            // SAFETY: the closure runs in the forked child before exec and only makes raw
            // syscalls on data prepared before the fork (no allocation, no locks).
            unsafe {
                cmd.pre_exec(move || {
                    sys::unshare(libc::CLONE_NEWNS)?;
                    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
                    sys::mount(
                        Some(c"overlay"),
                        &target,
                        Some(c"overlay"),
                        libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                        Some(&opts),
                    )
                });
            }
        }
    }
    cmd.stdin(std::process::Stdio::null()).output()
}
