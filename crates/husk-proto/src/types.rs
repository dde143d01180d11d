//! The messages of the agent protocol.

use serde::{Deserialize, Serialize};

/// The two users every sandbox has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum User {
    /// uid/gid 1000, home `/home/user` (the default).
    #[default]
    User,
    /// uid/gid 0 of the sandbox's user namespace.
    Root,
}

impl User {
    /// Parses a user name as clients send it; `None` for any other user.
    pub fn from_name(name: &str) -> Option<User> {
        match name {
            "user" => Some(User::User),
            "root" => Some(User::Root),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            User::User => "user",
            User::Root => "root",
        }
    }

    pub fn home(self) -> &'static str {
        match self {
            User::User => "/home/user",
            User::Root => "/root",
        }
    }

    pub fn id(self) -> u32 {
        match self {
            User::User => 1000,
            User::Root => 0,
        }
    }
}

/// Sent once, first, by the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub version: u16,
    /// The sandbox's environment variables: every process started in it gets them.
    pub env: Vec<(String, String)>,
    /// Used when a call names no user.
    pub default_user: User,
    /// Working directory of processes that name none (`None`: the user's home).
    pub default_workdir: Option<String>,
}

/// Which process a call is about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Selector {
    Pid(u32),
    Tag(String),
}

/// What to start.
///
/// Its `Debug` shows the names of [`StartProc::secret_envs`], never their values.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct StartProc {
    pub cmd: String,
    pub args: Vec<String>,
    /// The request's own environment, applied over the sandbox's (for this process only).
    /// Reported back as is by `List` ([`ProcInfo::envs`]), so it never holds a secret's value:
    /// a secret stays a `husk-secret://NAME` reference here.
    pub envs: Vec<(String, String)>,
    /// Working directory; relative paths and `~` resolve against the user's home.
    pub cwd: Option<String>,
    pub user: User,
    /// Run on a new pseudo-terminal of this size (cols, rows).
    pub pty: Option<(u16, u16)>,
    pub tag: Option<String>,
    /// Keep stdin open for `Input` (otherwise it is /dev/null).
    pub stdin: bool,
    /// Kill the process (its whole process group) after this long.
    pub timeout_ms: Option<u64>,
    /// Resolved secrets, applied over `envs` (and the sandbox's environment) in the process's
    /// environment, last. The agent never stores or reports them (not in [`ProcInfo`]).
    ///
    /// Added to the protocol without a [`crate::VERSION`] bump, like earlier fields: the agent
    /// is the server's own binary, so both ends always agree on the layout. (postcard is not
    /// self-describing, so `#[serde(default)]` only helps self-describing encodings.)
    #[serde(default)]
    pub secret_envs: Vec<(String, String)>,
}

impl StartProc {
    /// `cmd` with `args`, as `user`, with nothing else (no environment of its own, the user's
    /// home as cwd, no PTY, tag, stdin, timeout or secrets).
    pub fn new(cmd: impl Into<String>, args: Vec<String>) -> StartProc {
        StartProc {
            cmd: cmd.into(),
            args,
            envs: Vec::new(),
            cwd: None,
            user: User::User,
            pty: None,
            tag: None,
            stdin: false,
            timeout_ms: None,
            secret_envs: Vec::new(),
        }
    }
}

impl std::fmt::Debug for StartProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret_names: Vec<&str> = self.secret_envs.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("StartProc")
            .field("cmd", &self.cmd)
            .field("args", &self.args)
            .field("envs", &self.envs)
            .field("cwd", &self.cwd)
            .field("user", &self.user)
            .field("pty", &self.pty)
            .field("tag", &self.tag)
            .field("stdin", &self.stdin)
            .field("timeout_ms", &self.timeout_ms)
            .field("secret_envs", &secret_names)
            .finish()
    }
}

/// A running process, as `List` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcInfo {
    pub pid: u32,
    pub tag: Option<String>,
    pub cmd: String,
    pub args: Vec<String>,
    pub envs: Vec<(String, String)>,
    pub cwd: Option<String>,
}

/// Output and exit of a process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ProcEvent {
    Stdout(#[serde(with = "serde_bytes")] Vec<u8>),
    Stderr(#[serde(with = "serde_bytes")] Vec<u8>),
    Pty(#[serde(with = "serde_bytes")] Vec<u8>),
    /// The last event of a process; sent once all of its output was sent.
    End(ProcEnd),
}

/// [`ProcEnd::error`] of a process the agent killed because its `timeout_ms` passed.
pub const PROCESS_TIMED_OUT: &str = "process timed out";

/// How a process ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcEnd {
    /// Exit code, or -1 when it was killed by a signal.
    pub exit_code: i32,
    /// Whether it exited by itself (false: killed by a signal).
    pub exited: bool,
    /// Like Go's `ProcessState.String()`: `exit status 1`, `signal: killed`.
    pub status: String,
    /// Set when the agent, not the process, ended it (e.g. its timeout).
    pub error: Option<String>,
}

/// Kinds of file-system entries. A symlink has the kind of what it leads to (and its target
/// in [`Entry::symlink_target`]), as envd reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileType {
    File,
    Dir,
    /// Anything else (FIFO, socket, device, a symlink that leads nowhere).
    Other,
}

/// One file-system entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    pub file_type: FileType,
    pub size: u64,
    /// `st_mode & 0o7777`.
    pub mode: u32,
    /// `ls -l` style, e.g. `-rw-r--r--`.
    pub permissions: String,
    pub owner: String,
    pub group: String,
    /// Modification time: seconds and nanoseconds since the epoch.
    pub mtime_secs: i64,
    pub mtime_nanos: u32,
    /// For a symlink: the absolute path it finally leads to inside the sandbox (all links
    /// followed, inside the sandbox's root), or its own path when it leads nowhere. `None` for
    /// anything else.
    pub symlink_target: Option<String>,
    /// `user.e2b.*` extended attributes, prefix stripped.
    pub metadata: Vec<(String, String)>,
}

/// What happened to a watched path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsOp {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One watch event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEvent {
    /// Path relative to the watched directory.
    pub name: String,
    pub op: FsOp,
}

/// Server → agent requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// Start a process → [`Reply::Started`]; its output and end follow as [`crate::FromAgent::Proc`].
    Start(StartProc),
    /// Find a running process (to re-attach to its output) → [`Reply::Started`].
    Find(Selector),
    /// → [`Reply::Processes`].
    List,
    /// Write to a process's stdin (or its terminal when `pty`) → [`Reply::Done`].
    Input {
        sel: Selector,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        pty: bool,
    },
    /// → [`Reply::Done`].
    CloseStdin(Selector),
    /// → [`Reply::Done`].
    Signal { sel: Selector, signal: i32 },
    /// Resize a process's terminal → [`Reply::Done`].
    Resize { sel: Selector, cols: u16, rows: u16 },

    /// → [`Reply::Entry`].
    Stat { path: String, user: User },
    /// Creates parents too; `AlreadyExists` if the path exists → [`Reply::Entry`].
    MakeDir { path: String, user: User },
    /// → [`Reply::Entry`] (of the destination).
    Move {
        from: String,
        to: String,
        user: User,
    },
    /// Entries below `path` up to `depth` levels (1 = direct children) → [`Reply::Entries`].
    ListDir {
        path: String,
        depth: u32,
        user: User,
    },
    /// Files and whole trees → [`Reply::Done`].
    Remove { path: String, user: User },
    /// Start watching a directory → [`Reply::Watch`]; events follow as [`crate::FromAgent::Watch`].
    WatchStart {
        path: String,
        recursive: bool,
        user: User,
    },
    /// → [`Reply::Done`].
    WatchStop { watch: u32 },

    /// Open a regular file for reading → [`Reply::Opened`] (with its entry, for the size).
    OpenRead { path: String, user: User },
    /// Create or truncate a file for writing; parent directories are created, owned by `user`;
    /// `metadata` replaces the file's `user.e2b.*` attributes → [`Reply::Opened`].
    OpenWrite {
        path: String,
        user: User,
        metadata: Vec<(String, String)>,
    },
    /// Read up to `len` (≤ [`crate::CHUNK`]) bytes at `offset` → [`Reply::Data`] (empty at EOF).
    Read { handle: u32, offset: u64, len: u32 },
    /// Append to a file opened for writing → [`Reply::Done`].
    Write {
        handle: u32,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Close a handle → [`Reply::Entry`] (the file's entry after writing).
    Close { handle: u32 },

    /// The sandbox's environment variables → [`Reply::Env`].
    Env,
    /// Disk usage of the sandbox's writable layer → [`Reply::Disk`].
    Disk,

    /// The Jupyter kernel specs the image has → [`Reply::KernelSpecs`].
    KernelSpecs,
    /// See [`crate::KernelStart`] → [`Reply::Done`].
    KernelStart(crate::KernelStart),
    /// See [`crate::Execute`] → [`Reply::Done`].
    Execute(crate::Execute),
    /// Interrupt the kernel's running execution (as its spec says: SIGINT to its process
    /// group, or an `interrupt_request`) → [`Reply::Done`]. The execution then ends as usual.
    KernelInterrupt { kernel: u32 },
    /// Kill the kernel's process group → [`Reply::Done`]; its [`crate::KernelEvent::Dead`]
    /// follows (as the last event of that kernel id).
    KernelStop { kernel: u32 },
    /// When a kept sandbox ends if no server is connected to its agent then (milliseconds
    /// since the Unix epoch; `None`: it waits for a server, however long) → [`Reply::Done`].
    /// The server that is connected enforces the sandbox's timeout itself; this is the
    /// backstop for while none is (the server restarting, or gone).
    Deadline { unix_ms: Option<u64> },
    /// Subscribes a new connection to a running kernel's events (a server that took the
    /// sandbox up again) → [`Reply::Done`] if it runs and is ready, `NotFound` otherwise.
    KernelAttach { kernel: u32 },
    /// Makes a sandbox made ahead of demand (a warm pool's) the one a create asked for
    /// → [`Reply::Done`]: its name in `/etc/hostname` and `/etc/hosts` becomes `hostname`
    /// (the kernel's hostname the spawner sets), and `env` replaces the environment of the
    /// hello for every process started from now on.
    Assign {
        hostname: String,
        env: Vec<(String, String)>,
    },
}

impl Request {
    /// The user a file-system request acts for (its permissions and ownership), if it is one.
    pub fn fs_user(&self) -> Option<User> {
        match self {
            Request::Stat { user, .. }
            | Request::MakeDir { user, .. }
            | Request::Move { user, .. }
            | Request::ListDir { user, .. }
            | Request::Remove { user, .. }
            | Request::WatchStart { user, .. }
            | Request::OpenRead { user, .. }
            | Request::OpenWrite { user, .. } => Some(*user),
            _ => None,
        }
    }
}

/// Successful answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Started { pid: u32 },
    Processes(Vec<ProcInfo>),
    Entry(Entry),
    Entries(Vec<Entry>),
    Watch { watch: u32 },
    Opened { handle: u32, entry: Entry },
    Data(#[serde(with = "serde_bytes")] Vec<u8>),
    Env(Vec<(String, String)>),
    Disk { used: u64, total: u64 },
    KernelSpecs(Vec<crate::KernelSpec>),
}

/// Why a call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidArgument,
    PermissionDenied,
    /// The sandbox's disk (writable layer) is full.
    NoSpace,
    /// The agent's own bounds (too many processes, watches, handles).
    ResourceExhausted,
    Internal,
}

/// A failed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AgentError {
    pub kind: ErrorKind,
    pub message: String,
}

impl AgentError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        AgentError {
            kind,
            message: message.into(),
        }
    }
}
