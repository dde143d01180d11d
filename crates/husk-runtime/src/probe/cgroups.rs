//! The cgroups husk can get: [`CgroupLayout::diagnose`], what the spawner's
//! [`CgroupLayout::acquire`] would do from this process (which controllers, and how: cgroup
//! v1, a delegated unit, a systemd scope, the container's own cgroup), without doing it.

use crate::cgroup::CgroupLayout;

use super::Check;

pub(super) fn check() -> Check {
    match CgroupLayout::diagnose() {
        Ok(detail) => Check::ok("cgroup.controllers", detail),
        Err(e) => Check::missing(
            "cgroup.controllers",
            e.to_string(),
            "give husk a cgroup with memory, pids and cpu (under systemd: the shipped unit \
             dist/husk.service, Delegate=yes), or accept running without some: \
             --unenforced-limits",
        ),
    }
}
