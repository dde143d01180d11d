//! The `host` template: the lower layer every host-template sandbox shares.
//!
//! It holds copies of the few `/etc` entries programs need to work (dynamic linker cache,
//! alternatives, CA certificates, timezone, shell profile, ...). The host's `/usr` is bind-mounted
//! read-only on top at sandbox creation, and `/bin`, `/lib*`, `/sbin` are reproduced as on the
//! host. Nothing else of the host's `/etc` (no `shadow`, no `ssh`, no credentials) is copied.
//!
//! The copy is built once into `<state>/templates/host-<key>`, where the key hashes the name, size
//! and modification time of every copied entry, then reused. When the host's files change (a
//! package upgrade), the key changes and a new copy is built beside the old one: a copy is never
//! modified or removed while a sandbox may use it as its lower layer (overlayfs forbids changes
//! under a mounted lower layer). Old copies are removed by [`remove_unused`] when no sandbox runs.

use std::fs;
use std::io;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

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

/// Makes sure the host template for the host's current files exists under `state_dir/templates`.
pub fn ensure(state_dir: &Path) -> io::Result<HostTemplate> {
    let lower = state_dir
        .join("templates")
        .join(format!("host-{:016x}", source_key()));
    if fs::symlink_metadata(&lower).is_err() {
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

/// A hash of what the copy is made of (FNV-1a over name, size and mtime of each entry).
fn source_key() -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for name in HOST_ETC {
        eat(name.as_bytes());
        if let Ok(m) = fs::symlink_metadata(Path::new("/etc").join(name)) {
            eat(&m.size().to_le_bytes());
            eat(&m.mtime().to_le_bytes());
            eat(&m.mtime_nsec().to_le_bytes());
        }
    }
    h
}

/// Removes host-template copies other than `current` that are older than a minute. Call only
/// when no sandbox of any husk process exists (a copy in use must stay); the age check covers a
/// husk process that picked an old copy but has not created its sandbox yet.
pub fn remove_unused(state_dir: &Path, current: &HostTemplate) {
    let Ok(rd) = fs::read_dir(state_dir.join("templates")) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let old_enough = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 60);
        let name = e.file_name();
        let ours = name.to_string_lossy().starts_with("host")
            || name.to_string_lossy().starts_with(".building.");
        if ours && p != current.lower && old_enough {
            let _ = fs::remove_dir_all(&p);
        }
    }
}

/// Builds into a fresh directory and renames it into place, so concurrent husk processes never
/// see a half-built template (the loser of a race discards its copy).
fn build(state_dir: &Path, lower: &Path) -> io::Result<()> {
    let parent = state_dir.join("templates");
    fs::create_dir_all(&parent)?;
    let tmp = parent.join(format!(
        ".building.{}.{:x}",
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
        fs::rename(&tmp, lower)
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
        if fs::symlink_metadata(lower).is_ok() {
            return Ok(());
        }
    }
    result
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn copy_is_reused_and_only_unused_old_copies_are_removed() {
        let state = std::env::temp_dir().join(format!(
            "husk-tmpl-{}-{:x}",
            std::process::id(),
            crate::sys::random_u64().unwrap()
        ));
        let t = ensure(&state).unwrap();
        assert!(t.lower.join("etc/ld.so.cache").exists());
        assert!(!t.lower.join("etc/shadow").exists());
        assert_eq!(ensure(&state).unwrap().lower, t.lower);
        let old = state.join("templates/host-0000000000000000");
        let fresh = state.join("templates/host-1111111111111111");
        fs::create_dir_all(old.join("etc")).unwrap();
        fs::create_dir_all(&fresh).unwrap();
        let long_ago = SystemTime::now() - Duration::from_secs(3600);
        fs::File::open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        remove_unused(&state, &t);
        assert!(!old.exists(), "an old unused copy survived");
        assert!(fresh.exists(), "a copy younger than a minute was removed");
        assert!(t.lower.exists(), "the current copy was removed");
        fs::remove_dir_all(&state).unwrap();
    }
}
