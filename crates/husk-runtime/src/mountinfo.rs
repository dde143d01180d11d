//! What the kernel says is mounted (`/proc/self/mountinfo`) and which loop devices back which
//! files (`/sys/block/loopN/loop/backing_file`): shared by the cgroup discovery, the workspace
//! file systems of `husk-core`, and the tests that must leave no mount or device behind.

use std::fs;
use std::path::{Path, PathBuf};

use crate::sys;

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            out.push(u8::from_str_radix(&s[i + 1..i + 4], 8).unwrap_or(b'?'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount points in `mountinfo` (field 5 of each line), unescaped.
fn points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape(p)))
        .collect()
}

/// The mount points at or beneath `dir` in this process's mount namespace.
pub fn mounts_beneath(dir: &Path) -> Vec<PathBuf> {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    points(&info)
        .into_iter()
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Detaches every mount at or beneath `dir`, deepest first; lazily, so that a mount still in
/// use cannot keep `dir` from being removed (an auto-clearing loop device under one goes with
/// its last user). Best effort: for clean-up.
pub fn unmount_beneath(dir: &Path) {
    let mut mounts = mounts_beneath(dir);
    mounts.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for mp in mounts {
        if let Ok(c) = sys::cpath(&mp) {
            let _ = sys::umount2(&c, libc::MNT_DETACH);
        }
    }
}

/// The file backing loop device `name` (`loopN`), if it is attached.
pub fn loop_backing_file(name: &str) -> Option<PathBuf> {
    let b = fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    Some(PathBuf::from(b.trim_end()))
}

/// The loop devices (`loopN`) whose backing file satisfies `backed_by`.
pub fn loop_devices(backed_by: impl Fn(&Path) -> bool) -> Vec<String> {
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("loop"))
        .filter(|n| loop_backing_file(n).is_some_and(|b| backed_by(&b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_read_and_unescaped() {
        let info = "22 1 0:21 / / rw - ext4 /dev/vda rw\n\
                    40 22 0:39 / /tmp/a\\040b rw - tmpfs tmpfs rw\n";
        assert_eq!(
            points(info),
            vec![PathBuf::from("/"), PathBuf::from("/tmp/a b")]
        );
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        // This process's own table has its root.
        assert!(mounts_beneath(Path::new("/")).contains(&PathBuf::from("/")));
    }
}
