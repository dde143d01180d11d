//! Features of processes: namespaces, pidfds, clone3 into a cgroup, seccomp, Landlock.

use crate::sys::probe as sys;

use super::kernel::{self, since};
use super::mounts::{Outcomes, Step};
use super::{namespace_allowed, Check, NAMESPACES};

/// One check per namespace: the kernel has it and no sysctl forbids it, and (when the mount
/// probe ran) making one worked.
pub(super) fn namespaces(made: Option<&Outcomes>) -> Vec<Check> {
    let mut out = Vec::new();
    for (ns, limit, what, config) in NAMESPACES {
        let name = format!("namespace.{ns}");
        if let Err((why, remedy)) = namespace_allowed(ns, limit, what, config, true) {
            out.push(Check::missing(&name, why, remedy));
            continue;
        }
        // The mount probe's child is made with the mount, IPC and UTS namespaces, makes a
        // user namespace (for its id map), a PID and a cgroup namespace; the network
        // namespace is made by the network probe.
        let step = match *ns {
            "user" => Some(Step::UserNs),
            "cgroup" => Some(Step::CgroupNs),
            "mnt" | "ipc" | "uts" => Some(Step::Namespaces),
            "pid" => Some(Step::PidNs),
            _ => None,
        };
        match (made, step) {
            (Some(o), Some(s)) if o.failed(s).is_some() => out.push(Check::missing(
                &name,
                format!(
                    "{what}: making one failed: {}",
                    o.failed(s).unwrap_or_default()
                ),
                format!("check that {config} is enabled and that no security module forbids it"),
            )),
            (Some(o), Some(s)) if o.worked(s) => out.push(Check::ok(&name, "available")),
            // The network probe (husk-net) makes one for its checks and reports a failure.
            (Some(_), None) => out.push(Check::ok(
                &name,
                "available (the net.* checks below run in a throwaway one)",
            )),
            _ => out.push(Check::ok(&name, "available (not created: needs root)")),
        }
    }
    // Not used by husk yet: told for completeness, never a failure.
    let time = match made {
        Some(o) if o.worked(Step::TimeNs) => {
            Check::ok("namespace.time", "available (husk does not use it yet)")
        }
        Some(o) => Check::warning(
            "namespace.time",
            format!(
                "time namespaces: {} (husk does not use them yet)",
                o.failed(Step::TimeNs).unwrap_or_else(|| "not tried".into())
            ),
            "nothing to do today (CONFIG_TIME_NS, Linux >= 5.6)",
        ),
        None if std::path::Path::new("/proc/self/ns/time").exists() => {
            Check::ok("namespace.time", "available (husk does not use it yet)")
        }
        None => Check::warning(
            "namespace.time",
            "this kernel has no time namespaces (husk does not use them yet)",
            "nothing to do today (CONFIG_TIME_NS, Linux >= 5.6)",
        ),
    };
    out.push(time);
    out
}

pub(super) fn pidfd() -> Check {
    match sys::pidfd_open_self().and_then(|fd| sys::waitid_pidfd_known(&fd)) {
        Ok(()) => Check::ok("pidfd", "pidfd_open and waitid(P_PIDFD)"),
        Err(e) => Check::missing(
            "pidfd",
            format!("no pidfds ({e}): husk tracks every sandbox's PID 1 by pidfd"),
            kernel::boot(since::PIDFD),
        ),
    }
}

pub(super) fn clone_into_cgroup() -> Check {
    match sys::clone_into_cgroup_known() {
        Ok(()) => Check::ok(
            "clone_into_cgroup",
            "clone3 starts sandboxes in their cgroup (CLONE_INTO_CGROUP)",
        ),
        Err(e) => Check::missing(
            "clone_into_cgroup",
            format!("clone3 has no CLONE_INTO_CGROUP ({e})"),
            kernel::boot(since::CLONE_INTO_CGROUP),
        ),
    }
}

pub(super) fn seccomp() -> Check {
    let filter =
        sys::seccomp_mode().and_then(|_| sys::seccomp_action_available(libc::SECCOMP_RET_ERRNO));
    match filter {
        Ok(()) => Check::ok("seccomp", "filter mode (the deny-list of every sandbox)"),
        Err(e) => Check::missing(
            "seccomp",
            format!("no seccomp filters ({e}): husk's syscall deny-list cannot be enforced"),
            "boot a kernel built with CONFIG_SECCOMP_FILTER",
        ),
    }
}

pub(super) fn seccomp_user_notif() -> Check {
    match sys::seccomp_action_available(libc::SECCOMP_RET_USER_NOTIF) {
        Ok(()) => Check::ok(
            "seccomp.user_notif",
            "SECCOMP_RET_USER_NOTIF available (husk does not use it yet)",
        ),
        Err(e) => Check::warning(
            "seccomp.user_notif",
            format!("no SECCOMP_RET_USER_NOTIF ({e}); husk does not use it yet"),
            "nothing to do today (Linux >= 5.0)",
        ),
    }
}

/// What husk's Landlock policy (see [`crate::fences`]) loses below each ABI: it grants
/// everything beneath `/` except making device nodes, allows device ioctls only beneath
/// `/dev`, and scopes signals and abstract unix sockets to the sandbox.
const LANDLOCK_GAPS: &[(i32, &str, kernel::KernelVersion)] = &[
    (
        5,
        "device ioctls outside /dev are not restricted",
        since::LANDLOCK_IOCTL_DEV,
    ),
    (
        6,
        "signals and abstract unix sockets are not scoped to the sandbox (its PID and network \
         namespaces still separate it)",
        since::LANDLOCK_SCOPING,
    ),
];

pub(super) fn landlock(abi: i32) -> Check {
    if abi <= 0 {
        return Check::warning(
            "landlock",
            "Landlock is off: sandboxes have no second fence behind seccomp and the \
             namespaces (making device nodes, device ioctls, signal and socket scoping)",
            format!(
                "{} with CONFIG_SECURITY_LANDLOCK and landlock in its lsm= list",
                kernel::boot(since::LANDLOCK)
            ),
        );
    }
    let gaps: Vec<&(i32, &str, kernel::KernelVersion)> = LANDLOCK_GAPS
        .iter()
        .filter(|(need, _, _)| abi < *need)
        .collect();
    match gaps.last() {
        None => Check::ok(
            "landlock",
            format!("ABI {abi}: every rule of husk's Landlock policy is enforced"),
        ),
        Some((_, _, newest)) => Check::warning(
            "landlock",
            format!(
                "ABI {abi}: not enforced here: {}",
                gaps.iter()
                    .map(|(_, what, _)| *what)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            kernel::boot(*newest),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::Status;

    #[test]
    fn landlock_levels_say_what_is_not_enforced() {
        let c = landlock(7);
        assert_eq!(c.status, Status::Ok, "{c:?}");
        assert_eq!(landlock(6).status, Status::Ok);
        // Debian 12's 6.1 has ABI 2.
        let c = landlock(2);
        assert_eq!(c.status, Status::Warning);
        assert!(c.detail.contains("device ioctls"), "{}", c.detail);
        assert!(c.detail.contains("signals"), "{}", c.detail);
        assert_eq!(c.remedy.as_deref(), Some("boot a kernel >= 6.12"));
        let c = landlock(5);
        assert!(!c.detail.contains("ioctls") && c.detail.contains("signals"));
        let c = landlock(0);
        assert_eq!(c.status, Status::Warning);
        assert!(c.remedy.unwrap().contains("CONFIG_SECURITY_LANDLOCK"));
    }

    #[test]
    fn this_hosts_process_features_are_there() {
        assert_eq!(pidfd().status, Status::Ok);
        assert_eq!(clone_into_cgroup().status, Status::Ok);
        assert_eq!(seccomp().status, Status::Ok);
        assert_eq!(seccomp_user_notif().status, Status::Ok);
    }

    #[test]
    fn namespace_checks_cover_every_namespace_of_a_sandbox() {
        let names: Vec<String> = namespaces(None).into_iter().map(|c| c.name).collect();
        for ns in ["user", "pid", "net", "mnt", "ipc", "uts", "cgroup", "time"] {
            assert!(names.contains(&format!("namespace.{ns}")), "{names:?}");
        }
    }
}
