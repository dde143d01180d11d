//! The host around the kernel: its version, who runs husk, systemd, the cgroup mode, the state
//! directory and memory.

use std::fs;
use std::path::{Path, PathBuf};

use super::kernel::{self, since, KernelVersion, TESTED_SINCE};
use super::Check;

pub(super) fn kernel(release: &str, version: Option<KernelVersion>) -> Check {
    match version {
        Some(v) if v.at_least(TESTED_SINCE) => Check::ok("kernel", format!("Linux {release}")),
        Some(_) => Check::warning(
            "kernel",
            format!(
                "Linux {release}: older than {TESTED_SINCE}, the oldest kernel husk is tested on"
            ),
            kernel::boot(TESTED_SINCE),
        ),
        None => Check::warning(
            "kernel",
            format!("cannot read the kernel's version ({release:?})"),
            "the checks below still try each feature",
        ),
    }
}

pub(super) fn root(root: bool) -> Check {
    if root {
        Check::ok("root", "running as root")
    } else {
        Check::missing(
            "root",
            "not root: husk needs root (it creates namespaces, cgroups and mounts); \
             checks that need root are skipped",
            "run as root: sudo husk ...",
        )
    }
}

pub(super) fn systemd() -> Check {
    if Path::new("/run/systemd/system").exists() {
        Check::ok("systemd", "systemd is PID 1")
    } else {
        Check::ok(
            "systemd",
            "no systemd (husk uses the cgroup tree it is given)",
        )
    }
}

/// The cgroup hierarchies mounted, from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct CgroupMode {
    /// Where cgroup v2 is mounted, if it is.
    pub v2: Option<PathBuf>,
    /// The v1 controllers mounted.
    pub v1: Vec<String>,
}

impl CgroupMode {
    /// Parses mountinfo text.
    pub fn parse(mountinfo: &str) -> CgroupMode {
        let mut mode = CgroupMode {
            v2: None,
            v1: Vec::new(),
        };
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mut r = right.split(' ');
            let (fstype, _source, options) = (r.next(), r.next(), r.next().unwrap_or(""));
            let point = left.split(' ').nth(4).map(crate::mountinfo::unescape);
            match fstype {
                Some("cgroup2") if mode.v2.is_none() => mode.v2 = point.map(PathBuf::from),
                Some("cgroup") => mode.v1.extend(
                    options
                        .split(',')
                        .filter(|o| !matches!(*o, "rw" | "ro") && !o.contains('='))
                        .filter(|o| {
                            !matches!(
                                *o,
                                "relatime"
                                    | "xattr"
                                    | "clone_children"
                                    | "cpuset_v2_mode"
                                    | "favordynmods"
                            ) && !o.starts_with("no")
                        })
                        .map(str::to_owned),
                ),
                _ => {}
            }
        }
        mode
    }

    /// The mode's name: `v2`, `hybrid`, `v1` or `none`.
    pub fn name(&self) -> &'static str {
        match (&self.v2, self.v1.is_empty()) {
            (Some(_), true) => "v2",
            (Some(_), false) => "hybrid",
            (None, false) => "v1",
            (None, true) => "none",
        }
    }

    pub fn check(&self) -> Check {
        let v2 = self
            .v2
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        match self.name() {
            "v2" => Check::ok("cgroup.mode", format!("v2 (unified) at {v2}")),
            "hybrid" => Check::ok(
                "cgroup.mode",
                format!("hybrid: v1 controllers {}, v2 at {v2}", self.v1.join(",")),
            ),
            "v1" => Check::ok(
                "cgroup.mode",
                format!("v1 only: controllers {}", self.v1.join(",")),
            ),
            _ => Check::missing(
                "cgroup.mode",
                "no cgroup file system is mounted",
                "mount cgroup v2: mount -t cgroup2 none /sys/fs/cgroup",
            ),
        }
    }
}

pub(super) fn cgroup_mode() -> CgroupMode {
    CgroupMode::parse(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// This process's cgroup v2 directory, from `/proc/self/cgroup` (`0::/path`).
fn own_v2_cgroup(mount: &Path) -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(mount.join(rel.trim_start_matches('/')))
}

/// `cgroup.kill` exists only below the root cgroup: in this process's own cgroup, in any child
/// of the root, or (as root, when the process sits in the root cgroup and it has no child) in a
/// child made for the look and removed at once.
pub(super) fn cgroup_kill(mode: &CgroupMode, version: Option<KernelVersion>, root: bool) -> Check {
    let has_kill = |d: &Path| d.join("cgroup.kill").exists();
    let found = mode.v2.as_ref().is_some_and(|m| {
        own_v2_cgroup(m).is_some_and(|d| d != *m && has_kill(&d))
            || fs::read_dir(m).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| e.path().is_dir() && has_kill(&e.path()))
            })
            || (root && {
                let probe = m.join(format!("husk-probe-{}", std::process::id()));
                let made = fs::create_dir(&probe).is_ok();
                let found = made && has_kill(&probe);
                if made {
                    let _ = fs::remove_dir(&probe);
                }
                found
            })
    });
    if found {
        return Check::ok("cgroup.kill", "sandboxes are killed at once (cgroup.kill)");
    }
    let why = match (&mode.v2, version) {
        (None, _) => "no cgroup v2 mounted".to_owned(),
        (Some(_), Some(v)) if !v.at_least(since::CGROUP_KILL) => {
            format!("cgroup.kill needs Linux >= {}", since::CGROUP_KILL)
        }
        _ => "no cgroup.kill file found".to_owned(),
    };
    Check::warning(
        "cgroup.kill",
        format!("{why}: husk kills sandboxes with the freezer and SIGKILL instead (slower)"),
        format!(
            "{} with cgroup v2 mounted",
            kernel::boot(since::CGROUP_KILL)
        ),
    )
}

/// The state directory: there or creatable, and the space free on its file system.
pub(super) fn state_dir(dir: &Path, root: bool) -> Check {
    const NAME: &str = "state_dir";
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    if !existing.is_dir() {
        return Check::missing(
            NAME,
            format!("{} is not a directory", existing.display()),
            "choose another state directory (--state-dir)",
        );
    }
    let how = if existing == dir {
        "exists".to_owned()
    } else if root {
        format!("will be created (under {})", existing.display())
    } else {
        format!("does not exist yet (under {})", existing.display())
    };
    let space = crate::sys::cpath(existing).and_then(|c| crate::sys::statvfs(&c));
    let fstype = super::mounts::fs_type_name(existing);
    match space {
        Ok(s) if s.available < 1 << 30 => Check::warning(
            NAME,
            format!(
                "{} {how}; only {} free on its {fstype} file system",
                dir.display(),
                human(s.available)
            ),
            "free disk space (templates and workspaces live there), or use another --state-dir",
        ),
        Ok(s) => Check::ok(
            NAME,
            format!(
                "{} {how}; {} free on its {fstype} file system",
                dir.display(),
                human(s.available)
            ),
        ),
        Err(e) => Check::warning(
            NAME,
            format!("{} {how}; free space unknown: {e}", dir.display()),
            "check the state directory's file system",
        ),
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub(super) fn memory() -> Check {
    let avail = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_available(&m));
    match avail {
        Some(b) if b < 1 << 30 => Check::warning(
            "memory",
            format!("{} available", human(b)),
            "each sandbox may use its memory limit (512 MiB by default): free memory or \
             lower --memory",
        ),
        Some(b) => Check::ok("memory", format!("{} available", human(b))),
        None => Check::warning(
            "memory",
            "cannot read MemAvailable from /proc/meminfo",
            "check /proc is mounted",
        ),
    }
}

/// Bytes for people: `1.5 GiB`, `300 MiB`.
pub(super) fn human(b: u64) -> String {
    if b >= 1 << 30 {
        format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", b >> 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::Status;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate
";
    const V2: &str = "\
25 30 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";
    const V1: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
34 31 0:31 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
";

    #[test]
    fn cgroup_modes_are_told_apart_from_mountinfo() {
        let h = CgroupMode::parse(HYBRID);
        assert_eq!(h.name(), "hybrid");
        assert_eq!(h.v2.as_deref(), Some(Path::new("/sys/fs/cgroup/unified")));
        assert_eq!(h.v1, ["cpu", "memory"]);
        let v2 = CgroupMode::parse(V2);
        assert_eq!(v2.name(), "v2");
        assert_eq!(v2.v2.as_deref(), Some(Path::new("/sys/fs/cgroup")));
        let v1 = CgroupMode::parse(V1);
        assert_eq!(v1.name(), "v1");
        assert_eq!(v1.v1, ["cpu", "cpuacct", "pids"]);
        assert_eq!(CgroupMode::parse("").check().status, Status::Missing);
        assert_eq!(v2.check().status, Status::Ok);
    }

    #[test]
    fn old_kernels_get_a_warning_naming_the_tested_one() {
        let c = kernel("5.10.0-30-amd64", KernelVersion::parse("5.10.0-30-amd64"));
        assert_eq!(c.status, Status::Warning);
        assert_eq!(c.remedy.as_deref(), Some("boot a kernel >= 6.1"));
        let c = kernel("6.1.0-48-amd64", KernelVersion::parse("6.1.0-48-amd64"));
        assert_eq!(c.status, Status::Ok);
    }

    #[test]
    fn a_missing_cgroup_kill_falls_back_with_a_warning() {
        let mode = CgroupMode::parse(V1);
        let c = cgroup_kill(&mode, KernelVersion::parse("6.1.0"), false);
        assert_eq!(c.status, Status::Warning);
        assert!(c.detail.contains("no cgroup v2"), "{}", c.detail);
        assert!(c.remedy.unwrap().contains(">= 5.14"));
    }

    #[test]
    fn not_root_is_missing_and_says_so() {
        let c = root(false);
        assert_eq!(c.status, Status::Missing);
        assert!(c.detail.starts_with("not root: husk needs root"));
    }

    #[test]
    fn memory_is_read_from_meminfo() {
        let m = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2097152 kB\n";
        assert_eq!(mem_available(m), Some(2 << 30));
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(300 << 20), "300 MiB");
    }
}
