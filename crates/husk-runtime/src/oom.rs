//! Whom the kernel's OOM killer takes first: a sandbox's processes, then its PID 1 (the agent,
//! or husk's init), then husk itself (`husk serve` and its spawner).
//!
//! The kernel kills the task with the highest badness: about its memory in pages (RSS, swap,
//! page tables) plus `oom_score_adj × totalpages / 1000`, where `totalpages` is the memory of
//! the OOM's scope: the cgroup's limit in a cgroup OOM, RAM plus swap in a host-wide one.
//! -1000 would exempt a task altogether; husk never uses it, so that a husk that leaks stays
//! killable rather than hanging the host.
//!
//! - [`PROCESS`] (0): every process a sandbox's PID 1 starts (commands, PTYs, kernels, `sudo`),
//!   set in the child before `execve` ([`crate::exec`]), since children inherit PID 1's value.
//! - [`SANDBOX_INIT`] (-900): PID 1 of each sandbox, set by the spawner right after `clone3`,
//!   long before the sandbox runs anything. In its cgroup's OOM a process scores its own size,
//!   between 0 and the limit, and PID 1 its size minus 0.9 × the limit: every other process goes
//!   first unless PID 1 itself has grown to 90 % of the limit (it holds a few MiB). When PID 1
//!   dies its sandbox ends, and with the agent a server sandbox's every process and file.
//! - [`SERVER`] (-999): `husk serve` and its spawner. In a host-wide OOM on a host of T bytes a
//!   server of size s scores s − 0.999 T and an agent of size a scores a − 0.9 T, so the server
//!   goes after every agent as long as s < a + 0.099 T: 2.4 GiB on a 24 GiB host, 200 MiB on a
//!   2 GiB one, far above what the server holds. It goes after user processes (0) always.
//!
//! Lowering a value needs `CAP_SYS_RESOURCE` in the host's user namespace, which husk (host
//! root) has and sandboxes never do; raising it is always allowed. The kernel also records the
//! lowest value a privileged writer set (`oom_score_adj_min`, inherited by children): sandbox
//! processes may set themselves back down to [`SANDBOX_INIT`], not below. That protects a process
//! only against its own sandbox's other processes in their cgroup's OOM (where size still ranks
//! it against PID 1), and in a host-wide OOM, which only happens when the operator grants
//! sandboxes more memory than the host has, it ranks it with the agents, still before husk.

use std::io;
use std::path::Path;

use crate::sys;

/// A sandbox's processes: the kernel's default.
pub const PROCESS: i32 = 0;

/// A sandbox's PID 1 (the agent or husk's init).
pub const SANDBOX_INIT: i32 = -900;

/// `husk serve` and its spawner process.
pub const SERVER: i32 = -999;

/// Sets the `oom_score_adj` of the calling process (and of the processes it forks later).
pub fn set_own(adj: i32) -> io::Result<()> {
    sys::write_file(
        Path::new("/proc/self/oom_score_adj"),
        adj.to_string().as_bytes(),
    )
}

/// Sets the `oom_score_adj` of process `pid`.
pub fn set(pid: libc::pid_t, adj: i32) -> io::Result<()> {
    sys::write_file(
        Path::new(&format!("/proc/{pid}/oom_score_adj")),
        adj.to_string().as_bytes(),
    )
}

/// The `oom_score_adj` of process `pid` (`None`: the calling process).
pub fn get(pid: Option<libc::pid_t>) -> io::Result<i32> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/oom_score_adj"),
        None => "/proc/self/oom_score_adj".to_owned(),
    };
    std::fs::read_to_string(path)?
        .trim()
        .parse()
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_is_processes_then_sandbox_init_then_husk() {
        const { assert!(PROCESS > SANDBOX_INIT && SANDBOX_INIT > SERVER) };
        // Never exempt: -1000 would make a leaking husk unkillable.
        const { assert!(SERVER > -1000) };
    }

    #[test]
    fn the_server_goes_after_agents_up_to_a_tenth_of_the_host() {
        // badness ≈ size + adj × total / 1000 (the kernel's oom_badness, in any unit).
        let badness = |size: i64, adj: i32, total: i64| size + i64::from(adj) * total / 1000;
        let gib: i64 = 1 << 30;
        let host = 24 * gib;
        let agent = 2 << 20;
        for server in [64 << 20, 512 << 20, 2 * gib] {
            assert!(
                badness(server, SERVER, host) < badness(agent, SANDBOX_INIT, host),
                "a server of {server} bytes would go before an agent"
            );
        }
        // A sandbox's own OOM: a 1 MiB process goes before a 200 MiB PID 1 under a 512 MiB limit.
        let limit = 512 << 20;
        assert!(badness(1 << 20, PROCESS, limit) > badness(200 << 20, SANDBOX_INIT, limit));
    }

    #[test]
    fn reads_its_own_value() {
        let v = get(None).unwrap();
        assert!((-1000..=1000).contains(&v));
    }
}
