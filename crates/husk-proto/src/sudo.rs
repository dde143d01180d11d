//! The sandbox-internal sudo protocol: husk's `sudo` (the husk binary run under that name inside
//! a sandbox) asks the agent to run a command as another user.
//!
//! One SOCK_SEQPACKET connection per command, to the abstract socket [`SOCKET`] of the
//! sandbox's network namespace. The client sends one [`SudoRequest`] datagram with its stdin,
//! stdout and stderr attached (SCM_RIGHTS), then [`SudoToAgent::Signal`]s it wants forwarded;
//! the agent answers with one [`SudoReply`] when the command ends. Everything the client sends
//! comes from sandboxed code: the agent bounds and validates it.

use serde::{Deserialize, Serialize};

use crate::User;

/// The abstract socket name the agent listens on.
pub const SOCKET: &[u8] = b"husk-sudo";

/// Largest datagram either side sends.
pub const MAX_MESSAGE: usize = 64 << 10;

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SudoRequest {
    /// The command and its arguments (empty with `shell`: an interactive shell).
    pub argv: Vec<String>,
    pub user: User,
    /// The caller's environment (kept with `preserve_env`; otherwise only `TERM` of it).
    pub env: Vec<(String, String)>,
    pub preserve_env: bool,
    /// The caller's working directory.
    pub cwd: String,
    /// `-i`: a login shell in the target user's home.
    pub login: bool,
    /// `-s`: run through the shell.
    pub shell: bool,
}

/// Client → agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SudoToAgent {
    /// The first message (the three stdio fds attached).
    Run(SudoRequest),
    /// Forward this signal to the command.
    Signal(i32),
}

/// Agent → client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SudoReply {
    /// The command ended: its exit code, or 128 + the signal that killed it.
    Exited(i32),
    /// It could not be started.
    Failed(String),
}
