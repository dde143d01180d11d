//! What this host's kernel has of what husk uses, probed once: the report behind `husk doctor`
//! and the start-up check of the [`crate::Spawner`].
//!
//! [`run`] tries every feature for real where that is cheap and leaves nothing behind: the
//! mounts happen in a child process's own mount namespace (they vanish with it, whatever
//! happens), namespaces are created and dropped, syscalls are asked in ways that cannot create
//! anything. Each [`Check`] says what was found and, when something is missing or weaker than
//! husk wants, the kernel version that has it and what the user can do.
//!
//! [`startup`] is the small subset the spawner needs before its first sandbox, made of file
//! reads only (microseconds), so every `husk run` can afford it.

mod cgroups;
mod host;
pub mod kernel;
mod mounts;
mod process;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::Serialize;

pub use kernel::KernelVersion;

/// How a feature fares on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// There and working.
    Ok,
    /// Missing or weaker, but husk works without it (slower, less protected, a feature off).
    Warning,
    /// husk cannot work (or cannot offer something central) without it.
    Missing,
    /// Not probed (it needs root, or a caller with one thread).
    Skipped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warning => "warning",
            Status::Missing => "missing",
            Status::Skipped => "skipped",
        }
    }
}

/// One feature's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// A stable, dotted name (`namespace.user`, `fs.erofs`, `idmap.tmpfs`, ...).
    pub name: String,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// What the user can do, for warnings and missing features.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

impl Check {
    pub fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check::new(name, Status::Ok, detail, None)
    }

    pub fn warning(name: &str, detail: impl Into<String>, remedy: impl Into<String>) -> Check {
        Check::new(name, Status::Warning, detail, Some(remedy.into()))
    }

    pub fn missing(name: &str, detail: impl Into<String>, remedy: impl Into<String>) -> Check {
        Check::new(name, Status::Missing, detail, Some(remedy.into()))
    }

    pub fn skipped(name: &str, why: impl Into<String>) -> Check {
        Check::new(name, Status::Skipped, why, None)
    }

    fn new(name: &str, status: Status, detail: impl Into<String>, remedy: Option<String>) -> Check {
        Check {
            name: name.to_owned(),
            status,
            detail: detail.into(),
            remedy,
        }
    }
}

/// Every check, in the order `husk doctor` prints them.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The kernel release (`uname -r`).
    pub kernel: String,
    pub checks: Vec<Check>,
    /// How long probing took, in milliseconds.
    pub elapsed_ms: f64,
}

impl Report {
    /// Whether husk can run here: nothing required is missing (warnings do not count).
    pub fn usable(&self) -> bool {
        !self.checks.iter().any(|c| c.status == Status::Missing)
    }

    /// How many checks have `status`.
    pub fn count(&self, status: Status) -> usize {
        self.checks.iter().filter(|c| c.status == status).count()
    }

    /// The check called `name`.
    pub fn get(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }
}

/// What to probe beyond the kernel.
#[derive(Clone, Debug)]
pub struct Options {
    /// The state directory husk would use (built templates, workspaces).
    pub state_dir: PathBuf,
}

/// Probes everything (see the module doc). The mount probes fork, so they run only when the
/// calling process has one thread (else they are reported as skipped); call this before
/// starting threads.
pub fn run(opts: &Options) -> Report {
    let start = Instant::now();
    let release = crate::sys::kernel_release();
    let version = KernelVersion::parse(&release);
    let root = crate::sys::probe::uids().1 == 0;
    let mut checks = vec![host::kernel(&release, version), host::root(root)];
    checks.push(host::systemd());
    let mode = host::cgroup_mode();
    checks.push(mode.check());
    checks.push(cgroups::check());
    checks.push(host::cgroup_kill(&mode, version, root));
    checks.push(process::clone_into_cgroup());
    let fs = if root {
        mounts::probe(&opts.state_dir)
    } else {
        Err("needs root".to_owned())
    };
    checks.extend(process::namespaces(fs.as_ref().ok()));
    checks.extend(mounts::checks(fs, &opts.state_dir));
    checks.push(process::pidfd());
    checks.push(process::seccomp());
    checks.push(process::seccomp_user_notif());
    checks.push(process::landlock(crate::fences::landlock_abi()));
    checks.push(host::state_dir(&opts.state_dir, root));
    checks.push(host::memory());
    Report {
        kernel: release,
        checks,
        elapsed_ms: start.elapsed().as_secs_f64() * 1000.0,
    }
}

/// The namespaces husk puts every sandbox in: (name in /proc/self/ns, sysctl limit, what it
/// is, kernel option).
const NAMESPACES: &[(&str, &str, &str, &str)] = &[
    (
        "user",
        "max_user_namespaces",
        "user namespaces",
        "CONFIG_USER_NS",
    ),
    (
        "pid",
        "max_pid_namespaces",
        "PID namespaces",
        "CONFIG_PID_NS",
    ),
    (
        "net",
        "max_net_namespaces",
        "network namespaces",
        "CONFIG_NET_NS",
    ),
    (
        "mnt",
        "max_mnt_namespaces",
        "mount namespaces",
        "CONFIG_NAMESPACES",
    ),
    (
        "ipc",
        "max_ipc_namespaces",
        "IPC namespaces",
        "CONFIG_IPC_NS",
    ),
    (
        "uts",
        "max_uts_namespaces",
        "UTS namespaces",
        "CONFIG_UTS_NS",
    ),
    (
        "cgroup",
        "max_cgroup_namespaces",
        "cgroup namespaces",
        "CONFIG_CGROUPS",
    ),
];

/// Whether namespace `ns` can be made: `Err((what is wrong, remedy))` when the kernel lacks
/// it or (with `sysctl`) a sysctl forbids it.
fn namespace_allowed(
    ns: &str,
    limit: &str,
    what: &str,
    config: &str,
    sysctl: bool,
) -> Result<(), (String, String)> {
    if std::fs::symlink_metadata(format!("/proc/self/ns/{ns}")).is_err() {
        return Err((
            format!("{what}: this kernel has none"),
            format!("boot a kernel built with {config}"),
        ));
    }
    if !sysctl {
        return Ok(());
    }
    let max = std::fs::read_to_string(Path::new("/proc/sys/user").join(limit));
    if max.is_ok_and(|m| m.trim() == "0") {
        return Err((
            format!("{what}: disabled by sysctl user.{limit}=0"),
            format!("allow them: sysctl -w user.{limit}=10000"),
        ));
    }
    Ok(())
}

/// The features the spawner cannot start without, from a few file reads (about 30 µs): the
/// namespaces of every sandbox (and the sysctl hardening guides set to forbid user
/// namespaces), and tmpfs and overlayfs for its root (loading the overlay module if it is not
/// there yet). `Err` names the feature and what to do.
pub fn startup() -> Result<(), String> {
    for (ns, limit, what, config) in NAMESPACES {
        namespace_allowed(ns, limit, what, config, *ns == "user")
            .map_err(|(why, remedy)| format!("{why} ({remedy})"))?;
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !crate::modules::filesystems_list(&filesystems, "tmpfs") {
        return Err("tmpfs: this kernel has none (build it with CONFIG_TMPFS)".into());
    }
    if crate::modules::filesystems_list(&filesystems, "overlay") {
        return Ok(());
    }
    match crate::modules::ensure(crate::modules::Module::Overlay) {
        crate::modules::Loaded::Missing(why) => Err(format!(
            "overlayfs ({why}): load the module: modprobe overlay (CONFIG_OVERLAY_FS)"
        )),
        _ => Ok(()),
    }
}

/// What this host's kernel does not enforce of husk's fences, one line each, for `husk serve`
/// to say at start (cheap: one Landlock syscall). Empty on a kernel that enforces everything.
pub fn unenforced() -> Vec<String> {
    let check = process::landlock(crate::fences::landlock_abi());
    match check.status {
        Status::Ok => Vec::new(),
        _ => vec![format!(
            "{} ({})",
            check.detail,
            check.remedy.unwrap_or_default()
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serve_names_what_landlock_does_not_enforce_here() {
        let abi = crate::fences::landlock_abi();
        let gaps = unenforced();
        if abi >= 6 {
            assert!(gaps.is_empty(), "ABI {abi}: {gaps:?}");
        } else {
            assert_eq!(gaps.len(), 1, "ABI {abi}: {gaps:?}");
            assert!(
                gaps[0].contains("not enforced") || gaps[0].contains("off"),
                "{gaps:?}"
            );
        }
    }

    #[test]
    fn the_json_shape_is_stable() {
        let report = Report {
            kernel: "6.1.0-48-amd64".into(),
            checks: vec![
                Check::ok("namespace.user", "available"),
                Check::missing("fs.erofs", "no erofs", "load the module: modprobe erofs"),
            ],
            elapsed_ms: 12.5,
        };
        let v = serde_json::to_value(&report).unwrap();
        assert_eq!(v["kernel"], "6.1.0-48-amd64");
        assert_eq!(v["checks"][0]["name"], "namespace.user");
        assert_eq!(v["checks"][0]["status"], "ok");
        assert!(v["checks"][0].get("remedy").is_none(), "{v}");
        assert_eq!(v["checks"][1]["status"], "missing");
        assert_eq!(v["checks"][1]["remedy"], "load the module: modprobe erofs");
        assert!(!report.usable());
        assert_eq!(report.count(Status::Ok), 1);
    }

    #[test]
    fn warnings_and_skips_do_not_make_a_host_unusable() {
        let report = Report {
            kernel: String::new(),
            checks: vec![
                Check::warning("landlock", "ABI 2", "boot a kernel >= 6.12"),
                Check::skipped("fs.overlay", "needs root"),
            ],
            elapsed_ms: 0.0,
        };
        assert!(report.usable());
    }

    #[test]
    fn this_host_passes_the_start_up_check() {
        startup().unwrap();
    }
}
