//! Sandboxes that outlive their spawner, and the spawner that takes them up again.
//!
//! A server's sandbox is *kept* when its spec is an agent's that does not die with its
//! creator (`agent && !die_with_parent`) and its spawner has an owner (the server's state
//! directory, [`crate::Spawner::set_owner`]). Its PID 1 then has no parent-death signal, and
//! holds, beside its first connection:
//! - a *rendezvous*: a `SOCK_SEQPACKET` pair, both ends PID 1's. A later spawner takes a copy
//!   of the sending end (`pidfd_getfd`, which only the host's root may do to PID 1: the
//!   sandbox's own commands run in Landlock domains that cannot reach it) and sends the agent
//!   a new connection through it, the way the first one came;
//! - a copy of its writable layer, so that a later spawner can still pause or snapshot it.
//!
//! The sandbox's registry entry (`/run/husk/sandboxes/s<slot>`, root's alone) gets one more
//! line once the sandbox is ready: the owner, PID 1's pid and start time (a pid with its
//! start time names one process for good), and those two descriptors' numbers in PID 1. A
//! spawner that starts with the same owner takes up every entry whose PID 1 still runs
//! ([`crate::Spawner::adopt`]); entries of other owners are left alone while their PID 1
//! runs; the rest are leftovers, reaped as before.

use std::io;
use std::os::fd::{AsFd, OwnedFd, RawFd};

use crate::sys;

/// The registry line of a kept sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeepRecord {
    /// Who may take it up: the owner given to the spawner that made it.
    pub owner: String,
    /// The runtime's id of the sandbox.
    pub id: String,
    /// PID 1, in the host's PID namespace.
    pub pid: libc::pid_t,
    /// PID 1's start time ([`sys::process_start_time`]).
    pub start: u64,
    /// The rendezvous' sending end, in PID 1.
    pub send: RawFd,
    /// PID 1's copy of the writable layer, if the sandbox has one.
    pub layer: Option<RawFd>,
}

const TAG: &str = "keep";

impl KeepRecord {
    /// One line (with its newline). The owner is written in hex: it is a path.
    pub fn line(&self) -> String {
        let owner: String = self.owner.bytes().map(|b| format!("{b:02x}")).collect();
        let layer = self.layer.map_or("-".to_string(), |l| l.to_string());
        format!(
            "{TAG} {owner} {} {} {} {} {layer}\n",
            self.id, self.pid, self.start, self.send
        )
    }

    /// Parses [`KeepRecord::line`]; `None` for anything else.
    pub fn parse(line: &str) -> Option<KeepRecord> {
        let mut parts = line.split(' ');
        if parts.next()? != TAG {
            return None;
        }
        let hex = parts.next()?;
        if hex.len() % 2 != 0 || hex.len() > 8192 {
            return None;
        }
        let bytes: Option<Vec<u8>> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
            .collect();
        let owner = String::from_utf8(bytes?).ok()?;
        let id = parts.next()?.to_string();
        let valid_id = !id.is_empty()
            && id.len() <= 64
            && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let pid: libc::pid_t = parts.next()?.parse().ok()?;
        let start: u64 = parts.next()?.parse().ok()?;
        let send: RawFd = parts.next()?.parse().ok()?;
        let layer = match parts.next()? {
            "-" => None,
            n => Some(n.parse().ok()?),
        };
        let fd_ok = |fd: RawFd| fd > 2;
        (valid_id && pid > 1 && fd_ok(send) && layer.is_none_or(fd_ok) && parts.next().is_none())
            .then_some(KeepRecord {
                owner,
                id,
                pid,
                start,
                send,
                layer,
            })
    }

    /// A pidfd of PID 1 if it still runs (the same process: pid and start time).
    pub fn alive(&self) -> Option<OwnedFd> {
        let pidfd = sys::pidfd_open(self.pid).ok()?;
        // Opened first, checked after: if the pid named another process by then, its start
        // time differs.
        if sys::process_start_time(self.pid).ok()? != self.start {
            return None;
        }
        (!sys::pidfd_wait_exit(pidfd.as_fd(), std::time::Duration::ZERO).ok()?).then_some(pidfd)
    }
}

/// A registry entry: the cgroup lines ([`crate::cgroup::SandboxCgroup::to_registry`]) and,
/// for a kept sandbox, its [`KeepRecord`]. A keep line that does not parse (one cut short by
/// a crash) keeps nothing: such a sandbox cannot be taken up, and is reaped as a leftover.
pub(crate) fn split_entry(text: &str) -> (String, Option<KeepRecord>) {
    let mut cgroup = String::new();
    let mut keep = None;
    for line in text.lines() {
        if line.starts_with(TAG) {
            keep = KeepRecord::parse(line);
        } else {
            cgroup.push_str(line);
            cgroup.push('\n');
        }
    }
    (cgroup, keep)
}

/// Sends `conn` through a rendezvous' sending end: the agent takes it as its connection.
pub(crate) fn send_conn(send: std::os::fd::BorrowedFd<'_>, conn: &OwnedFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    sys::send_with_fds(send, b"c", &[conn.as_raw_fd()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> KeepRecord {
        KeepRecord {
            owner: "/var/lib/husk state".into(),
            id: "s12-00ab".into(),
            pid: 4242,
            start: 987654,
            send: 5,
            layer: Some(7),
        }
    }

    #[test]
    fn a_record_reads_back_as_written_and_nothing_else_reads() {
        let r = record();
        assert_eq!(KeepRecord::parse(r.line().trim_end()), Some(r.clone()));
        let none = KeepRecord {
            layer: None,
            ..record()
        };
        assert_eq!(KeepRecord::parse(none.line().trim_end()), Some(none));
        for bad in [
            "",
            "keep",
            "keep 2f s1 1 2 3 4 5",
            "keep 2 s1 42 1 5 -",
            "keep zz s1 42 1 5 -",
            "keep 2f s/1 42 1 5 -",
            "keep 2f s1 1 1 5 -",
            "keep 2f s1 42 1 2 -",
            "keep 2f s1 42 1 5 1",
            "keep 2f s1 -42 1 5 -",
            "other 2f s1 42 1 5 -",
        ] {
            assert_eq!(KeepRecord::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn an_entry_splits_into_its_cgroups_and_its_keep_line() {
        let text = format!("v2 /sys/fs/cgroup/husk/s12\n{}", record().line());
        let (cgroup, keep) = split_entry(&text);
        assert_eq!(cgroup, "v2 /sys/fs/cgroup/husk/s12\n");
        assert_eq!(keep, Some(record()));
        assert_eq!(split_entry("v2 /sys/fs/cgroup/husk/s12\n").1, None);
        // A keep line cut short keeps nothing (the sandbox is reaped as a leftover).
        assert_eq!(
            split_entry("v2 /x\nkeep broken\n"),
            ("v2 /x\n".to_string(), None)
        );
    }

    #[test]
    fn a_process_is_alive_only_with_its_own_start_time() {
        let me = sys::getpid();
        let start = sys::process_start_time(me).unwrap();
        let r = KeepRecord {
            pid: me,
            start,
            ..record()
        };
        assert!(r.alive().is_some());
        let other = KeepRecord {
            start: start + 1,
            ..r
        };
        assert!(other.alive().is_none());
    }
}
