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
    let templates = state_dir.join("templates");
    let dirs = read_dir_list(&templates);
    let mut lower = templates.join(format!("host-{:016x}", source_key(&dirs)));
    if fs::symlink_metadata(&lower).is_err() {
        lower = build(state_dir)?;
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

/// The host directories below the top-level entries, as recorded by the last build. Their
/// modification times join the key: replacing a file inside one (by rename, as package managers
/// and update-ca-certificates do) or adding one changes it.
const DIR_LIST: &str = "host.dirs";

fn read_dir_list(templates: &Path) -> Vec<PathBuf> {
    fs::read_to_string(templates.join(DIR_LIST))
        .unwrap_or_default()
        .lines()
        .map(PathBuf::from)
        .filter(|p| p.starts_with("/etc"))
        .collect()
}

/// A hash of what the copy is made of (FNV-1a over name, size and mtime of each top-level
/// entry, and the mtime of every directory below them).
fn source_key(dirs: &[PathBuf]) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    let top = HOST_ETC.iter().map(|n| Path::new("/etc").join(n));
    for path in top.chain(dirs.iter().cloned()) {
        eat(path.as_os_str().as_encoded_bytes());
        if let Ok(m) = fs::symlink_metadata(&path) {
            eat(&m.size().to_le_bytes());
            eat(&m.mtime().to_le_bytes());
            eat(&m.mtime_nsec().to_le_bytes());
        }
    }
    h
}

/// Removes host-template copies other than `current`, and husk's `/usr` layers
/// ([`crate::usr_layer`]) of other binaries than this one (`usr`, when this process has
/// one), that are older than a minute: each upgrade of husk leaves one, a copy of the binary
/// where `/run` is a tmpfs. Call only when no sandbox of any husk process exists (a copy in
/// use must stay); the age check covers a husk process that picked an old copy but has not
/// created its sandbox yet, and a long-running one whose layer went makes it again.
pub fn remove_unused(state_dir: &Path, current: &HostTemplate, usr: Option<&Path>) {
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
        let name = name.to_string_lossy();
        let ours = name == "host"
            || name.starts_with("host-")
            // husk's /usr layer of earlier versions (now `sudo-<key>`, see usr_layer).
            || name.starts_with("usr-")
            || (name.starts_with("sudo-") && usr != Some(p.as_path()))
            || name.starts_with(".building.")
            || name.starts_with(&format!("{DIR_LIST}."));
        if ours && p != current.lower && old_enough {
            let _ = fs::remove_dir_all(&p).or_else(|_| fs::remove_file(&p));
        }
    }
}

/// Builds into a fresh directory and renames it into place, so concurrent husk processes never
/// see a half-built template (the loser of a race discards its copy).
fn build(state_dir: &Path) -> io::Result<PathBuf> {
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
        let mut dirs = Vec::new();
        for name in HOST_ETC {
            let src = Path::new("/etc").join(name);
            if fs::symlink_metadata(&src).is_ok() {
                copy_tree(&src, &etc.join(name), 0, &mut dirs)?;
            }
        }
        // Record the directories first, so the key of this copy is the one the next ensure()
        // computes from the same list.
        let list: String = dirs.iter().map(|d| format!("{}\n", d.display())).collect();
        let list_tmp = parent.join(format!("{DIR_LIST}.{}", std::process::id()));
        fs::write(&list_tmp, list)?;
        fs::rename(&list_tmp, parent.join(DIR_LIST))?;
        let lower = parent.join(format!("host-{:016x}", source_key(&dirs)));
        match fs::rename(&tmp, &lower) {
            // Another husk process built the same copy first.
            Err(_) if fs::symlink_metadata(&lower).is_ok() => {
                let _ = fs::remove_dir_all(&tmp);
                Ok(lower)
            }
            other => other.map(|()| lower),
        }
    })();
    if result.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    result
}

/// Copies files, directories and symlinks (as symlinks); other file types are skipped.
fn copy_tree(src: &Path, dst: &Path, depth: u32, dirs: &mut Vec<PathBuf>) -> io::Result<()> {
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
        if depth > 0 {
            dirs.push(src.to_path_buf());
        }
        for entry in fs::read_dir(src)? {
            let entry = entry?;
            copy_tree(&entry.path(), &dst.join(entry.file_name()), depth + 1, dirs)?;
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
        let sudo_old = state.join("templates/sudo-0000000000000001");
        let sudo_ours = state.join("templates/sudo-0000000000000002");
        for d in [&sudo_old, &sudo_ours] {
            fs::create_dir_all(d.join("usr/local/bin")).unwrap();
            fs::File::open(d).unwrap().set_modified(long_ago).unwrap();
        }
        remove_unused(&state, &t, Some(&sudo_ours));
        assert!(
            !sudo_old.exists(),
            "another binary's old /usr layer survived"
        );
        assert!(sudo_ours.exists(), "this binary's /usr layer was removed");
        assert!(!old.exists(), "an old unused copy survived");
        assert!(fresh.exists(), "a copy younger than a minute was removed");
        assert!(t.lower.exists(), "the current copy was removed");
        assert!(
            state.join("templates").join(DIR_LIST).exists(),
            "the directory list was removed"
        );
        // A change below a top-level entry (a file replaced by rename in a subdirectory, as
        // update-ca-certificates does) is a new key.
        let sub = state.join("certs");
        fs::create_dir(&sub).unwrap();
        let before = source_key(std::slice::from_ref(&sub));
        std::thread::sleep(Duration::from_millis(20));
        fs::write(sub.join("new.tmp"), "x").unwrap();
        fs::rename(sub.join("new.tmp"), sub.join("bundle.crt")).unwrap();
        assert_ne!(before, source_key(std::slice::from_ref(&sub)));
        fs::remove_dir_all(&state).unwrap();
    }
}
