//! husk's own layer over the sandbox's `/usr` (agent sandboxes): `/usr/local/bin/sudo`, which is
//! husk's binary itself. Run as `sudo`, it asks the agent to run the command as root, so
//! `sudo` works without a password and without a setuid file (every sandbox mount is nosuid and
//! no_new_privs is set on every process).
//!
//! The layer is built once per husk binary under `<run_dir>/templates/sudo-<key>`, the key made
//! of the binary's size and modification time, into a fresh directory renamed into place (a
//! concurrent husk never sees it half-built), and shared read-only by every sandbox: its `usr`
//! is the top lower layer of an overlay over the host's `/usr` (host template), or the layer
//! itself is the top lower layer of the root overlay (built templates).

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Where the sandbox finds sudo, relative to `/`: on both Debian's user and root `PATH`.
pub const SUDO_PATH: &str = "usr/local/bin/sudo";

/// Makes sure the layer for the running binary exists; returns its directory.
pub fn ensure(run_dir: &Path) -> io::Result<PathBuf> {
    // Through /proc, which still opens the binary after an upgrade replaced its file.
    let exe = Path::new("/proc/self/exe");
    let meta = fs::metadata(exe)?;
    let key = meta.len() ^ (meta.mtime() as u64).rotate_left(20) ^ meta.mtime_nsec() as u64;
    let parent = run_dir.join("templates");
    let dir = parent.join(format!("sudo-{key:016x}"));
    if fs::symlink_metadata(dir.join(SUDO_PATH)).is_ok() {
        return Ok(dir);
    }
    fs::create_dir_all(&parent)?;
    let tmp = parent.join(format!(
        ".building.usr.{}.{:x}",
        std::process::id(),
        crate::sys::random_u64()?
    ));
    let result = (|| {
        let bin = tmp.join(SUDO_PATH);
        let bin_dir = bin.parent().unwrap_or(&tmp);
        fs::create_dir_all(bin_dir)?;
        for d in [
            &tmp,
            &tmp.join("usr"),
            &tmp.join("usr/local"),
            &bin_dir.to_path_buf(),
        ] {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        }
        // A hard link where the binary is on the same file system (a rebuilt binary is a new
        // inode, so the link keeps the old one), else a copy.
        let linked = fs::canonicalize(exe).and_then(|path| fs::hard_link(path, &bin));
        if linked.is_err() {
            fs::copy(exe, &bin)?;
        }
        fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;
        fs::rename(&tmp, &dir)
    })();
    match result {
        Ok(()) => Ok(dir),
        // Another husk process won the race: use its copy.
        Err(_) if fs::symlink_metadata(dir.join(SUDO_PATH)).is_ok() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(dir)
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}
