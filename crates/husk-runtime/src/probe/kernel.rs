//! Kernel versions: parsing `uname -r`, and the releases that brought what husk uses (the
//! remedies name them). Probes decide by trying; versions only explain.

use std::fmt;

/// A kernel release's `major.minor.patch` (distribution suffixes dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub struct KernelVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl KernelVersion {
    pub const fn new(major: u32, minor: u32) -> KernelVersion {
        KernelVersion {
            major,
            minor,
            patch: 0,
        }
    }

    /// Parses releases like `6.1.0-48-amd64`, `5.15.0-91-generic`, `6.18.44-fc-v1045`,
    /// `6.12.9+rpt-rpi-v8`, `6.8`: the leading digits of the first three dot-separated parts;
    /// `None` unless at least major and minor are numbers.
    pub fn parse(release: &str) -> Option<KernelVersion> {
        let mut parts = release.trim().splitn(3, '.');
        let number = |s: Option<&str>| -> Option<u32> {
            let s = s?;
            let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
            s[..end].parse().ok()
        };
        let major = number(parts.next())?;
        let minor = number(parts.next())?;
        let patch = number(parts.next()).unwrap_or(0);
        Some(KernelVersion {
            major,
            minor,
            patch,
        })
    }

    /// Whether this kernel is `since` or newer.
    pub fn at_least(self, since: KernelVersion) -> bool {
        (self.major, self.minor) >= (since.major, since.minor)
    }
}

impl fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.patch == 0 {
            write!(f, "{}.{}", self.major, self.minor)
        } else {
            write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
        }
    }
}

/// The oldest kernel husk is tested on (Debian 12's).
pub const TESTED_SINCE: KernelVersion = KernelVersion::new(6, 1);

/// When features husk uses arrived in Linux.
pub mod since {
    use super::KernelVersion as V;
    /// pidfd_open(2) (5.3) and waitid(P_PIDFD) (5.4).
    pub const PIDFD: V = V::new(5, 4);
    /// clone3(2) with CLONE_INTO_CGROUP.
    pub const CLONE_INTO_CGROUP: V = V::new(5, 7);
    /// overlayfs mounted inside a user namespace.
    pub const OVERLAY_IN_USERNS: V = V::new(5, 11);
    /// mount_setattr(2) and id-mapped mounts (ext4, xfs, fat).
    pub const IDMAPPED_MOUNTS: V = V::new(5, 12);
    /// Landlock ABI 1.
    pub const LANDLOCK: V = V::new(5, 13);
    /// cgroup v2's `cgroup.kill`.
    pub const CGROUP_KILL: V = V::new(5, 14);
    /// btrfs id-mapped mounts.
    pub const IDMAPPED_BTRFS: V = V::new(5, 15);
    /// id-mapped erofs mounts, and overlayfs over id-mapped layers.
    pub const IDMAPPED_EROFS: V = V::new(5, 19);
    pub const OVERLAY_IDMAPPED_LAYERS: V = V::new(5, 19);
    /// id-mapped tmpfs mounts.
    pub const IDMAPPED_TMPFS: V = V::new(6, 3);
    /// Landlock ABI 5: device ioctls.
    pub const LANDLOCK_IOCTL_DEV: V = V::new(6, 10);
    /// erofs mounted from a regular file (no loop device), and Landlock ABI 6 (scoping).
    pub const EROFS_FILE_BACKED: V = V::new(6, 12);
    pub const LANDLOCK_SCOPING: V = V::new(6, 12);
}

/// "boot a kernel ≥ X.Y".
pub fn boot(since: KernelVersion) -> String {
    format!("boot a kernel >= {since}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_of_the_kernels_people_run_parse() {
        let v = |s| KernelVersion::parse(s).map(|v| (v.major, v.minor, v.patch));
        assert_eq!(v("6.1.0-48-amd64"), Some((6, 1, 0)));
        assert_eq!(v("5.15.0-91-generic"), Some((5, 15, 0)));
        assert_eq!(v("6.18.44-fc-v1045"), Some((6, 18, 44)));
        assert_eq!(v("6.12.9+rpt-rpi-v8"), Some((6, 12, 9)));
        assert_eq!(v("5.14.0-427.13.1.el9_4.x86_64"), Some((5, 14, 0)));
        assert_eq!(v("6.8"), Some((6, 8, 0)));
        assert_eq!(v("6.8\n"), Some((6, 8, 0)));
        assert_eq!(v(""), None);
        assert_eq!(v("linux"), None);
        assert_eq!(v("6"), None);
    }

    #[test]
    fn versions_compare_by_major_then_minor() {
        let k = KernelVersion::parse("6.1.0-48-amd64").unwrap();
        assert!(k.at_least(TESTED_SINCE));
        assert!(k.at_least(since::IDMAPPED_EROFS));
        assert!(!k.at_least(since::IDMAPPED_TMPFS));
        assert!(!k.at_least(since::EROFS_FILE_BACKED));
        let old = KernelVersion::parse("5.10.0-30-amd64").unwrap();
        assert!(!old.at_least(since::IDMAPPED_MOUNTS));
        assert!(KernelVersion::parse("7.0.1")
            .unwrap()
            .at_least(since::EROFS_FILE_BACKED));
        assert_eq!(k.to_string(), "6.1");
        assert_eq!(boot(since::IDMAPPED_TMPFS), "boot a kernel >= 6.3");
    }
}
