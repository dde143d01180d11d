//! Where a bind mount lands inside a sandbox root, found and created without following any of
//! the root's symlinks (a template's `/data -> /etc` must not turn a mount point into a
//! directory created on the host).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use super::ops::{self, chown, create_file, ensure_dir, lookup, set_mode, walk_sandbox};
use super::sys::{self, Kind};
use super::{Side, TransferError};

/// Makes sure absolute sandbox path `target` exists inside `root` as a directory (`dir`) or a
/// regular file, creating it and its missing parents owned by `owner` (host uid, gid); returns
/// an `O_PATH` fd of it to mount onto (through `/proc/self/fd/N`). Symlinks anywhere on the way
/// are refused, and the target must not be the root itself.
pub fn mount_point(
    root: BorrowedFd<'_>,
    target: &Path,
    dir: bool,
    owner: (u32, u32),
) -> Result<OwnedFd, TransferError> {
    let comps = ops::sandbox_components(target)?;
    let Some((last, parents)) = comps.split_last() else {
        return Err(TransferError::InvalidPath {
            path: target.to_path_buf(),
            reason: "cannot mount over the sandbox root",
        });
    };
    let parent = walk_sandbox(root, parents, target, Some(owner))?;
    let side = Side::Sandbox;
    match lookup(parent.as_fd(), last, side, target)? {
        Some((Kind::Dir, _)) if dir => {}
        Some((Kind::File, _)) if !dir => {}
        Some((Kind::Symlink, _)) => {
            return Err(TransferError::Symlink {
                path: target.to_path_buf(),
            })
        }
        Some((kind, _)) => {
            return Err(TransferError::Exists {
                side,
                path: target.to_path_buf(),
                kind: kind.name(),
            })
        }
        None if dir => {
            let (d, _) = ensure_dir(parent.as_fd(), last, side, target)?;
            chown(&d, owner, target)?;
            set_mode(&d, 0o755, side, target)?;
        }
        None => {
            let f = create_file(parent.as_fd(), last, side, target)?;
            chown(&f, owner, target)?;
            set_mode(&f, 0o644, side, target)?;
        }
    }
    sys::open_at(
        parent.as_fd(),
        last,
        libc::O_PATH | libc::O_NOFOLLOW,
        0,
        side,
    )
    .map_err(ops::io_err("open", side, target))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{symlink, MetadataExt};

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn root() -> (Dir, OwnedFd) {
        let p = std::env::temp_dir().join(format!(
            "husk-mp-{}-{:x}",
            std::process::id(),
            crate::sys::random_u64().unwrap()
        ));
        fs::create_dir(&p).unwrap();
        let fd = fs::File::open(&p).unwrap().into();
        (Dir(p), fd)
    }

    #[test]
    fn creates_dirs_and_files_owned_by_the_sandbox() {
        let (dir, fd) = root();
        mount_point(fd.as_fd(), Path::new("/a/b/data"), true, (1234, 1234)).unwrap();
        mount_point(fd.as_fd(), Path::new("/a/file.txt"), false, (1234, 1234)).unwrap();
        let m = fs::metadata(dir.0.join("a/b/data")).unwrap();
        assert!(m.is_dir());
        assert_eq!((m.uid(), m.gid()), (1234, 1234));
        let f = fs::metadata(dir.0.join("a/file.txt")).unwrap();
        assert!(f.is_file());
        assert_eq!(f.uid(), 1234);
        // An existing directory is reused.
        mount_point(fd.as_fd(), Path::new("/a/b/data"), true, (1, 1)).unwrap();
    }

    #[test]
    fn refuses_symlinks_and_never_creates_outside_the_root() {
        let (dir, fd) = root();
        let outside = std::env::temp_dir().join(format!(
            "husk-mp-outside-{:x}",
            crate::sys::random_u64().unwrap()
        ));
        fs::create_dir(&outside).unwrap();
        let _cleanup = Dir(outside.clone());
        symlink(&outside, dir.0.join("data")).unwrap();
        symlink("/", dir.0.join("top")).unwrap();
        for target in ["/data/x", "/data", "/top/tmp/y"] {
            let err = mount_point(fd.as_fd(), Path::new(target), true, (0, 0)).unwrap_err();
            assert!(
                matches!(err, TransferError::Symlink { .. }),
                "{target}: {err}"
            );
        }
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
        assert!(mount_point(fd.as_fd(), Path::new("/"), true, (0, 0)).is_err());
        assert!(mount_point(fd.as_fd(), Path::new("/a/../b"), true, (0, 0)).is_err());
    }
}
