//! The `host` template: the lower layer every host-template sandbox shares.
//!
//! It holds copies of the few `/etc` entries programs need to work (dynamic linker cache,
//! alternatives, CA certificates, timezone, shell profile, ...). The host's `/usr` is bind-mounted
//! read-only on top at sandbox creation, and `/bin`, `/lib*`, `/sbin` are reproduced as on the
//! host. Nothing else of the host's `/etc` (no `shadow`, no `ssh`, no credentials) is copied.
//!
//! The copy is built once into `<state>/templates/host`, then reused; it is rebuilt when one of
//! the host entries is newer than the copy, so package upgrades on the host show up.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// The `/etc` entries copied from the host (missing ones are skipped). Data, not code: adding a
/// file here is the whole change.
pub const HOST_ETC: &[&str] = &[
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "environment",
    "gai.conf",
    "host.conf",
    "inputrc",
    "issue",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "login.defs",
    "magic",
    "mime.types",
    "nsswitch.conf",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "python3",
    "python3.11",
    "services",
    "ssl",
    "terminfo",
    "timezone",
];

/// Top-level host paths reproduced as on the host: a symlink stays a symlink (usr-merged
/// systems), a real directory is bind-mounted read-only.
pub const HOST_TOP: &[&str] = &["bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// How a top-level entry looks on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopEntry {
    Symlink(PathBuf),
    Dir,
}

/// The shared lower layer for host-template sandboxes, and how `/bin` etc. look on the host.
#[derive(Debug, Clone)]
pub struct HostTemplate {
    pub lower: PathBuf,
    pub top: Vec<(&'static str, TopEntry)>,
}

const STAMP: &str = ".husk-template";

/// Makes sure the host template exists and is current under `state_dir/templates/host`.
pub fn ensure(state_dir: &Path) -> io::Result<HostTemplate> {
    let lower = state_dir.join("templates").join("host");
    let stamp = lower.join(STAMP);
    let built = fs::symlink_metadata(&stamp).and_then(|m| m.modified()).ok();
    let newest = newest_source();
    if built.is_none_or(|b| newest.is_some_and(|n| n > b)) {
        build(state_dir, &lower)?;
    }
    let mut top = Vec::new();
    for name in HOST_TOP {
        let p = Path::new("/").join(name);
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                top.push((*name, TopEntry::Symlink(fs::read_link(&p)?)));
            }
            Ok(m) if m.is_dir() => top.push((*name, TopEntry::Dir)),
            _ => {}
        }
    }
    Ok(HostTemplate { lower, top })
}

fn newest_source() -> Option<SystemTime> {
    HOST_ETC
        .iter()
        .filter_map(|n| fs::symlink_metadata(Path::new("/etc").join(n)).ok())
        .filter_map(|m| m.modified().ok())
        .max()
}

/// Builds into a fresh directory and renames it into place, so concurrent husk processes never
/// see a half-built template.
fn build(state_dir: &Path, lower: &Path) -> io::Result<()> {
    let parent = state_dir.join("templates");
    fs::create_dir_all(&parent)?;
    let tmp = parent.join(format!(
        ".host.{}.{}",
        std::process::id(),
        crate::sys::random_u64()?
    ));
    fs::create_dir(&tmp)?;
    let result = (|| {
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o755))?;
        let etc = tmp.join("etc");
        fs::create_dir(&etc)?;
        fs::set_permissions(&etc, fs::Permissions::from_mode(0o755))?;
        for name in HOST_ETC {
            let src = Path::new("/etc").join(name);
            if fs::symlink_metadata(&src).is_ok() {
                copy_tree(&src, &etc.join(name), 0)?;
            }
        }
        fs::write(tmp.join(STAMP), b"host template\n")?;
        Ok::<(), io::Error>(())
    })();
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    // Swap the new copy in; an old copy still used as a lower layer by running sandboxes stays
    // alive through their mounts even after it is unlinked.
    let old = parent.join(format!(".host.old.{}", crate::sys::random_u64()?));
    let had_old = fs::rename(lower, &old).is_ok();
    fs::rename(&tmp, lower)?;
    if had_old {
        let _ = fs::remove_dir_all(&old);
    }
    Ok(())
}

/// Copies files, directories and symlinks (as symlinks); other file types are skipped.
fn copy_tree(src: &Path, dst: &Path, depth: u32) -> io::Result<()> {
    if depth > 16 {
        return Ok(());
    }
    let meta = fs::symlink_metadata(src)?;
    let ft = meta.file_type();
    if ft.is_symlink() {
        symlink(fs::read_link(src)?, dst)?;
    } else if ft.is_dir() {
        fs::create_dir(dst)?;
        fs::set_permissions(
            dst,
            fs::Permissions::from_mode(meta.permissions().mode() & 0o755),
        )?;
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), depth + 1)?;
        }
    } else if ft.is_file() {
        // Only world-readable files: anything the host protects stays on the host.
        if meta.permissions().mode() & 0o004 != 0 {
            fs::copy(src, dst)?;
            fs::set_permissions(
                dst,
                fs::Permissions::from_mode(meta.permissions().mode() & 0o755),
            )?;
        }
    }
    Ok(())
}
