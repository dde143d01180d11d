//! The layer cache: one overlay-format directory per build step result, under
//! `<state>/templates/layers/<key>`, where the key hashes everything the layer depends on (its
//! parent's key and the step's full description, including the content of copied files). A
//! layer appears under its key only once complete (built in a temporary sibling directory and
//! renamed), so a crash or a failed step never leaves a cache entry behind.

use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Sandbox ids span this many host ids above the base (see the runtime's uid ranges).
const ID_RANGE: u32 = 65536;

/// A cache key under construction: SHA-256 over length-prefixed fields.
pub struct KeyHasher(Sha256);

impl KeyHasher {
    pub fn new(kind: &str) -> KeyHasher {
        let mut k = KeyHasher(Sha256::new());
        k.field(b"husk-layer-v1");
        k.field(kind.as_bytes());
        k
    }

    pub fn field(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.update((bytes.len() as u64).to_le_bytes());
        self.0.update(bytes);
        self
    }

    pub fn str(&mut self, s: &str) -> &mut Self {
        self.field(s.as_bytes())
    }

    /// 32 hex characters (128 bits): short enough for many layers in one mount option page.
    pub fn finish(self) -> String {
        hex::encode(&self.0.finalize()[..16])
    }
}

/// The layer directory of the cache.
#[derive(Debug, Clone)]
pub struct LayerCache {
    pub dir: PathBuf,
}

impl LayerCache {
    pub fn open(dir: &Path) -> io::Result<LayerCache> {
        fs::create_dir_all(dir)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        Ok(LayerCache {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    pub fn exists(&self, key: &str) -> bool {
        fs::symlink_metadata(self.path(key)).is_ok_and(|m| m.is_dir())
    }

    /// A fresh temporary directory in the cache (same file system, so it can be renamed in).
    pub fn temp(&self, key: &str) -> io::Result<TempLayer> {
        let path = self
            .dir
            .join(format!(".tmp-{key}-{}-{:x}", std::process::id(), rand64()));
        fs::create_dir(&path)?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
        Ok(TempLayer { path: Some(path) })
    }

    /// Moves `dir` (a complete layer) into place as `key`, its content written out to disk
    /// first (a machine crash must not leave a cache entry with unwritten files). If another
    /// build made the same layer meanwhile, its copy is kept and `dir` is dropped.
    pub fn commit(&self, dir: &Path, key: &str) -> io::Result<PathBuf> {
        let dest = self.path(key);
        let handle = fs::File::open(dir)?;
        husk_runtime::sys::syncfs(std::os::fd::AsFd::as_fd(&handle))?;
        match fs::rename(dir, &dest) {
            Ok(()) => Ok(dest),
            Err(_) if self.exists(key) => {
                let _ = fs::remove_dir_all(dir);
                Ok(dest)
            }
            Err(e) => Err(e),
        }
    }

    /// Removes `key` from the cache (`--no-cache` rebuilds).
    pub fn remove(&self, key: &str) -> io::Result<()> {
        match fs::remove_dir_all(self.path(key)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Removes temporary directories of builds that are gone (older than a day).
    pub fn remove_stale_temps(&self) {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a.as_secs() > 86_400);
            if old && e.file_name().to_string_lossy().starts_with(".tmp-") {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
}

/// A temporary directory removed on drop unless kept.
pub struct TempLayer {
    path: Option<PathBuf>,
}

impl TempLayer {
    pub fn path(&self) -> &Path {
        self.path.as_deref().unwrap_or(Path::new("/nonexistent"))
    }

    /// Stops the removal (the directory was renamed away).
    pub fn keep(mut self) -> PathBuf {
        self.path.take().unwrap_or_default()
    }
}

impl Drop for TempLayer {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = fs::remove_dir_all(p);
        }
    }
}

/// A random number for temporary names (the runtime's; 0 if the kernel cannot give one,
/// which the pid beside it still keeps apart).
pub fn rand64() -> u64 {
    husk_runtime::sys::random_u64().unwrap_or(0)
}

/// Shifts the owners of everything under `dir` from host ids `base..base+65536` (what a
/// build sandbox's ids are on the host) back to image ids `0..65536`. Entries owned by other
/// ids (overlayfs's own whiteouts are the mounter's, host root) are left as they are. Set-id
/// bits and file capabilities, which the kernel clears on a chown, are restored.
pub fn shift_ids(dir: &Path, base: u32) -> io::Result<u64> {
    let mut count = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p)?;
        let shift = |id: u32| {
            if (base..base + ID_RANGE).contains(&id) {
                Some(id - base)
            } else {
                None
            }
        };
        let (uid, gid) = (shift(m.uid()), shift(m.gid()));
        if uid.is_some() || gid.is_some() {
            let caps = if m.is_file() {
                xattr::get(&p, "security.capability").ok().flatten()
            } else {
                None
            };
            std::os::unix::fs::lchown(&p, uid, gid)?;
            if m.is_file() && m.mode() & 0o6000 != 0 {
                fs::set_permissions(&p, fs::Permissions::from_mode(m.mode() & 0o7777))?;
            }
            if let Some(caps) = caps {
                let _ = xattr::set(&p, "security.capability", &caps);
            }
            count += 1;
        }
        if m.is_dir() {
            for e in fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok(count)
}

/// The file at `rel` (relative, no `..`) as the stack `layers` (top first) shows it: the
/// topmost layer that has it, unless a whiteout or an opaque directory above hides it.
pub fn merged_file(layers: &[PathBuf], rel: &Path) -> Option<PathBuf> {
    for layer in layers {
        let p = layer.join(rel);
        match fs::symlink_metadata(&p) {
            Ok(m) if husk_runtime::layerfs::is_whiteout(&m) => return None,
            Ok(_) => return Some(p),
            Err(_) => {}
        }
        // An opaque ancestor in this layer hides everything below it in lower layers.
        let mut anc = rel.parent();
        while let Some(a) = anc.filter(|a| !a.as_os_str().is_empty()) {
            let d = layer.join(a);
            if xattr::get(&d, husk_runtime::layerfs::OPAQUE_XATTR)
                .ok()
                .flatten()
                .is_some_and(|v| v == b"y")
            {
                return None;
            }
            anc = a.parent();
        }
    }
    None
}

/// Total bytes of regular files and number of entries under `dir` (not following symlinks).
pub fn tree_size(dir: &Path) -> io::Result<(u64, u64)> {
    let (mut bytes, mut entries) = (0, 0);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = fs::symlink_metadata(&p)?;
        entries += 1;
        if m.is_file() {
            bytes += m.len();
        } else if m.is_dir() {
            for e in fs::read_dir(&p)? {
                stack.push(e?.path());
            }
        }
    }
    Ok((bytes, entries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn temp(tag: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "husk-layers-{tag}-{}-{:x}",
            std::process::id(),
            rand64()
        ));
        fs::create_dir_all(&p).unwrap();
        p
    }

    #[test]
    fn owners_are_shifted_back_to_image_ids_keeping_set_id_bits() {
        let dir = temp("shift");
        let base = 0x4001_0000;
        let file = dir.join("su");
        fs::write(&file, "x").unwrap();
        std::os::unix::fs::lchown(&file, Some(base), Some(base + 5)).unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o4755)).unwrap();
        let sub = dir.join("home");
        fs::create_dir(&sub).unwrap();
        std::os::unix::fs::lchown(&sub, Some(base + 1000), Some(base + 1000)).unwrap();
        let link = sub.join("link");
        symlink("/nowhere", &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(base + 1000), Some(base + 1000)).unwrap();
        // Owned by host root (overlayfs's own whiteouts are): left alone.
        let other = dir.join("wh");
        fs::write(&other, "").unwrap();
        std::os::unix::fs::lchown(&dir, Some(base), Some(base)).unwrap();
        let n = shift_ids(&dir, base).unwrap();
        assert_eq!(n, 4);
        let m = |p: &Path| fs::symlink_metadata(p).unwrap();
        assert_eq!((m(&file).uid(), m(&file).gid()), (0, 5));
        assert_eq!(m(&file).mode() & 0o7777, 0o4755, "the setuid bit was lost");
        assert_eq!((m(&sub).uid(), m(&link).uid()), (1000, 1000));
        assert_eq!(fs::read_link(&link).unwrap(), Path::new("/nowhere"));
        assert_eq!((m(&other).uid(), m(&dir).uid()), (0, 0));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn merged_lookup_honours_whiteouts_and_opaque_directories() {
        let root = temp("merged");
        let (top, mid, low) = (root.join("top"), root.join("mid"), root.join("low"));
        for l in [&top, &mid, &low] {
            fs::create_dir_all(l.join("etc")).unwrap();
            fs::create_dir_all(l.join("opt")).unwrap();
        }
        fs::write(low.join("etc/passwd"), "low").unwrap();
        fs::write(mid.join("etc/passwd"), "mid").unwrap();
        fs::write(low.join("etc/gone"), "low").unwrap();
        husk_runtime::layerfs::make_whiteout(&mid.join("etc/gone")).unwrap();
        fs::write(low.join("opt/hidden"), "low").unwrap();
        husk_runtime::layerfs::set_opaque(&mid.join("opt")).unwrap();
        let stack = vec![top.clone(), mid.clone(), low.clone()];
        let read =
            |rel: &str| merged_file(&stack, Path::new(rel)).map(|p| fs::read_to_string(p).unwrap());
        assert_eq!(read("etc/passwd").as_deref(), Some("mid"));
        assert_eq!(merged_file(&stack, Path::new("etc/gone")), None);
        assert_eq!(merged_file(&stack, Path::new("opt/hidden")), None);
        assert_eq!(merged_file(&stack, Path::new("etc/nothing")), None);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn keys_depend_on_every_field_and_its_boundaries() {
        let key = |parts: &[&str]| {
            let mut k = KeyHasher::new("step");
            for p in parts {
                k.str(p);
            }
            k.finish()
        };
        assert_eq!(key(&["a", "b"]), key(&["a", "b"]));
        assert_ne!(key(&["a", "b"]), key(&["ab", ""]));
        assert_ne!(key(&["a", "b"]), key(&["b", "a"]));
        assert_eq!(key(&["x"]).len(), 32);
    }
}
