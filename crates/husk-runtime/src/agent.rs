//! The hand-over from sandbox set-up to the agent (PID 1 of server sandboxes).
//!
//! The runtime builds the sandbox; what PID 1 then does is not the runtime's business. A server
//! registers an [`AgentEntry`] with [`crate::Spawner::set_agent`]; for a spec with
//! `agent: true`, PID 1 calls it once the sandbox is ready, with an [`AgentContext`]: the
//! stream socket to the sandbox's creator and the means to start processes inside the fences.
//! The entry never returns; when it exits, the sandbox ends.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::exec::{self, ExecPlan, Stdio};
use crate::fences::Fences;
use crate::spec::Limits;

/// The agent's entry point. Runs as sandbox root (uid 0 of the sandbox's user namespace, a
/// bounded capability set, seccomp and Landlock applied) in a single-threaded process.
pub type AgentEntry = fn(AgentContext<'_>) -> !;

/// What the agent gets from the runtime.
pub struct AgentContext<'a> {
    pub(crate) conn: Option<OwnedFd>,
    /// A kept sandbox's rendezvous (see [`crate::keep`]): where a later spawner sends a new
    /// connection.
    pub(crate) rendezvous: Option<OwnedFd>,
    /// What PID 1 of a kept sandbox holds for a later spawner, never used here.
    pub(crate) _kept: Vec<OwnedFd>,
    pub(crate) control: OwnedFd,
    pub(crate) fences: &'a Fences,
    pub(crate) limits: Limits,
    pub(crate) hostname: String,
}

impl AgentContext<'_> {
    /// The stream socket to the sandbox's creator (taken once).
    pub fn take_conn(&mut self) -> Option<OwnedFd> {
        self.conn.take()
    }

    /// Where a kept sandbox gets new connections (taken once): readable when a spawner sent
    /// one ([`receive_conn`]). `None`: the sandbox ends with its spawner and first connection.
    pub fn take_rendezvous(&mut self) -> Option<OwnedFd> {
        self.rendezvous.take()
    }

    /// The control socket to the spawner: readable at end of file when the spawner is gone,
    /// which must end the sandbox unless it is kept.
    pub fn control(&self) -> BorrowedFd<'_> {
        self.control.as_fd()
    }

    /// The sandbox's limits (for the rlimits of processes the agent starts).
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The sandbox's hostname.
    pub fn hostname(&self) -> &str {
        &self.hostname
    }

    /// Starts a process inside the sandbox's fences; see [`exec::spawn`].
    pub fn spawn(&self, plan: &ExecPlan, stdio: Stdio) -> io::Result<libc::pid_t> {
        exec::spawn(self.fences, plan, stdio)
    }
}

/// Receives the connection a spawner sent through a kept sandbox's rendezvous: `Ok(None)` when
/// the message carried none (nothing to do).
pub fn receive_conn(rendezvous: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    let mut buf = [0u8; 8];
    let (_, mut fds) = crate::sys::recv_with_fds(rendezvous, &mut buf)?;
    // One descriptor is expected; anything more is dropped (closed) here.
    let conn = fds.pop();
    Ok(conn.filter(|_| fds.is_empty()))
}
