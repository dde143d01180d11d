//! The cgroups husk can get. For now the verdict of [`CgroupLayout::discover`], the same
//! discovery the spawner makes at start; kept in this one function so a richer report (which
//! controllers, and how they were got: delegation, a systemd scope) can replace it.

use crate::cgroup::CgroupLayout;

use super::Check;

pub(super) fn check() -> Check {
    match CgroupLayout::discover() {
        Ok(layout) => {
            let parents: Vec<String> = layout
                .parents()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            Check::ok(
                "cgroup.controllers",
                format!(
                    "memory, pids, cpu: sandboxes' cgroups go under {}",
                    parents.join(", ")
                ),
            )
        }
        Err(e) => Check::missing(
            "cgroup.controllers",
            e.to_string(),
            "give husk a cgroup with memory, pids and cpu (under systemd: run it as a service \
             with Delegate=yes)",
        ),
    }
}
