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

    /// The control socket to the spawner: readable at end of file when the spawner is gone,
    /// which must end the sandbox.
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
