//! What a sandbox is made of: the validated description the spawner builds from.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which user the command runs as inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum User {
    /// uid/gid 1000, home `/home/user`, no capabilities at all (the default).
    User,
    /// uid/gid 0 of the sandbox's user namespace: a bounded capability set, still an
    /// unprivileged uid on the host.
    Root,
}

impl User {
    /// The uid (and gid) inside the sandbox.
    pub fn id(self) -> u32 {
        match self {
            User::User => 1000,
            User::Root => 0,
        }
    }

    /// The user's home directory inside the sandbox.
    pub fn home(self) -> &'static str {
        match self {
            User::User => "/home/user",
            User::Root => "/root",
        }
    }

    /// The login name.
    pub fn name(self) -> &'static str {
        match self {
            User::User => "user",
            User::Root => "root",
        }
    }
}

/// Resource limits enforced by the sandbox's cgroups and rlimits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory (and memory+swap: no swap) limit in bytes.
    pub memory_bytes: u64,
    /// CPU quota in millicpus (1000 = one full CPU).
    pub cpu_millis: u64,
    /// Maximum number of tasks (processes and threads).
    pub pids: u64,
    /// Size of the writable layer (tmpfs) in bytes.
    pub disk_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 512 << 20,
            cpu_millis: 1000,
            pids: 256,
            disk_bytes: 1 << 30,
        }
    }
}

/// A host path bind-mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    /// Absolute host path (file or directory); the operator's input, trusted.
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub sandbox: PathBuf,
    /// Writable only when asked for; always nosuid and nodev.
    pub writable: bool,
}

/// Everything the spawner needs to create one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The command and its arguments; `None` leaves PID 1 idle until the sandbox is destroyed.
    pub command: Option<Vec<String>>,
    /// Environment of the command (`KEY=VALUE` pairs); PATH, HOME, USER, etc. get defaults.
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox; defaults to the user's home.
    pub workdir: Option<PathBuf>,
    pub user: User,
    pub hostname: String,
    pub limits: Limits,
    pub mounts: Vec<MountSpec>,
    /// Give the command a pseudo-terminal; the master end is handed to the caller.
    pub tty: bool,
    /// Initial terminal size (rows, cols) when `tty` is set.
    pub tty_size: Option<(u16, u16)>,
    /// Kill the sandbox if the process that created it dies (right for one-shot runs).
    pub die_with_parent: bool,
    /// How long the command may run. The creator enforces it; PID 1 enforces it too, a moment
    /// later, so the sandbox ends on time even if its creator is stopped or stuck.
    pub timeout: Option<std::time::Duration>,
    /// Start the command as soon as the sandbox is ready, without waiting for
    /// [`crate::Sandbox::start`] (saves a round trip when nothing is copied in first).
    pub autostart: bool,
    /// PID 1 becomes the agent registered with [`crate::Spawner::set_agent`] (server
    /// sandboxes): it gets a stream socket to the creator instead of running `command`.
    pub agent: bool,
}

impl SandboxSpec {
    /// A spec with defaults for everything but the command.
    pub fn new(command: Vec<String>) -> Self {
        SandboxSpec {
            command: Some(command),
            env: Vec::new(),
            workdir: None,
            user: User::User,
            hostname: "husk".into(),
            limits: Limits::default(),
            mounts: Vec::new(),
            tty: false,
            tty_size: None,
            die_with_parent: true,
            autostart: false,
            timeout: None,
            agent: false,
        }
    }

    /// A spec whose PID 1 idles (the shape of a server-side sandbox before its first command).
    pub fn idle() -> Self {
        let mut spec = SandboxSpec::new(Vec::new());
        spec.command = None;
        spec
    }
}
