//! What callers ask of a running sandbox, in the core's words.
//!
//! The E2B adapter, husk's runs and the code interpreter name what they want done in a sandbox
//! with these types; only the core turns them into the agent's protocol (`husk_proto`'s
//! requests and replies, which no other crate of the server sees). Values are checked where
//! they are made, once for every caller: a [`SandboxPath`], a [`ProcessSpec`] or a
//! [`TerminalSize`] that exists is one the agent can take. The agent checks them again inside
//! the sandbox, where nothing the server sends is trusted either.
//!
//! What the agent reports back (entries, processes, their events, file-system events) and the
//! two users are the agent's own plain values, re-exported here as the vocabulary of these
//! calls: they carry data, not protocol.

use husk_proto::{Reply, Request, StartProc};

use crate::agent::CallError;
use crate::manager::EnvVars;

pub use husk_proto::{
    AgentError, Entry, ErrorKind, FileType, FsEvent, FsOp, ProcEnd, ProcEvent, ProcInfo, Selector,
    User, CHUNK, PROCESS_TIMED_OUT,
};

/// Longest path a caller may send (Linux's `PATH_MAX`): a longer one could never be opened.
pub const MAX_PATH: usize = 4096;

/// A value a caller sent that no call can carry, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(String);

/// A path inside a sandbox as a caller names it: absolute, relative to the user's home, or
/// `~`-prefixed; the agent resolves it inside the sandbox's root. Holds no NUL byte and at
/// most [`MAX_PATH`] bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxPath(String);

impl SandboxPath {
    /// `path`, checked.
    pub fn new(path: impl Into<String>) -> Result<SandboxPath, InvalidValue> {
        SandboxPath::named("path", path)
    }

    /// `path`, checked; an error calls it `what` ("source", "cwd", ...).
    pub fn named(what: &str, path: impl Into<String>) -> Result<SandboxPath, InvalidValue> {
        let path = path.into();
        if path.contains('\0') {
            return Err(InvalidValue(format!("{what} contains a NUL byte")));
        }
        if path.len() > MAX_PATH {
            return Err(InvalidValue(format!(
                "{what} is longer than {MAX_PATH} bytes"
            )));
        }
        Ok(SandboxPath(path))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A pseudo-terminal's size: both sides at least 1 and at most 65535, as the kernel takes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalSize {
    cols: u16,
    rows: u16,
}

impl TerminalSize {
    pub fn new(cols: u32, rows: u32) -> Result<TerminalSize, InvalidValue> {
        let side = |name: &str, v: u32| {
            u16::try_from(v).ok().filter(|&v| v >= 1).ok_or_else(|| {
                InvalidValue(format!("pty {name} must be between 1 and 65535, got {v}"))
            })
        };
        Ok(TerminalSize {
            cols: side("cols", cols)?,
            rows: side("rows", rows)?,
        })
    }

    pub fn cols(self) -> u16 {
        self.cols
    }

    pub fn rows(self) -> u16 {
        self.rows
    }
}

/// The signals a caller may send a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: asks it to end.
    Terminate,
    /// SIGKILL.
    Kill,
}

impl Signal {
    fn number(self) -> i32 {
        match self {
            Signal::Terminate => 15,
            Signal::Kill => 9,
        }
    }
}

/// A process to start: made by [`ProcessSpec::new`], its options set one by one, each taking
/// only checked values. Its secrets are the core's to add (see
/// [`Manager::start_process`](crate::manager::Manager::start_process)), never a caller's.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessSpec(StartProc);

impl ProcessSpec {
    /// `cmd` with `args`, as the default user, in the user's home, with nothing else (no
    /// environment of its own, no terminal, tag, stdin or timeout). `cmd` must not be empty;
    /// neither may hold a NUL byte, which no argument can carry to the kernel.
    pub fn new(cmd: impl Into<String>, args: Vec<String>) -> Result<ProcessSpec, InvalidValue> {
        let cmd = cmd.into();
        if cmd.is_empty() {
            return Err(InvalidValue("empty command".into()));
        }
        if cmd.contains('\0') {
            return Err(InvalidValue("command contains a NUL byte".into()));
        }
        if args.iter().any(|a| a.contains('\0')) {
            return Err(InvalidValue("argument contains a NUL byte".into()));
        }
        Ok(ProcessSpec(StartProc::new(cmd, args)))
    }

    /// Its own environment, over the sandbox's (values may name secrets as
    /// `husk-secret://NAME`; the core resolves them).
    pub fn env(mut self, envs: EnvVars) -> ProcessSpec {
        self.0.envs = envs.into_vec();
        self
    }

    /// Its working directory (the user's home when unset).
    pub fn cwd(mut self, cwd: SandboxPath) -> ProcessSpec {
        self.0.cwd = Some(cwd.0);
        self
    }

    pub fn user(mut self, user: User) -> ProcessSpec {
        self.0.user = user;
        self
    }

    /// Runs it on a new pseudo-terminal of `size`.
    pub fn pty(mut self, size: TerminalSize) -> ProcessSpec {
        self.0.pty = Some((size.cols, size.rows));
        self
    }

    /// A name to find it by besides its pid; an empty tag is none.
    pub fn tag(mut self, tag: impl Into<String>) -> ProcessSpec {
        let tag = tag.into();
        self.0.tag = (!tag.is_empty()).then_some(tag);
        self
    }

    /// Keeps its stdin open for input (otherwise it reads `/dev/null`).
    pub fn stdin(mut self, open: bool) -> ProcessSpec {
        self.0.stdin = open;
        self
    }

    /// Kills it (its whole process group) after this long.
    pub fn timeout_ms(mut self, ms: Option<u64>) -> ProcessSpec {
        self.0.timeout_ms = ms;
        self
    }

    pub fn command(&self) -> &str {
        &self.0.cmd
    }

    pub fn args(&self) -> &[String] {
        &self.0.args
    }

    pub fn envs(&self) -> &[(String, String)] {
        &self.0.envs
    }

    pub(crate) fn envs_mut(&mut self) -> &mut Vec<(String, String)> {
        &mut self.0.envs
    }

    pub fn working_dir(&self) -> Option<&str> {
        self.0.cwd.as_deref()
    }

    pub fn run_as(&self) -> User {
        self.0.user
    }

    pub fn terminal(&self) -> Option<(u16, u16)> {
        self.0.pty
    }

    pub fn process_tag(&self) -> Option<&str> {
        self.0.tag.as_deref()
    }

    pub fn stdin_open(&self) -> bool {
        self.0.stdin
    }

    pub fn timeout(&self) -> Option<u64> {
        self.0.timeout_ms
    }

    /// The agent's request to start it, with the secrets the core resolved.
    pub(crate) fn into_start(self, secret_envs: Vec<(String, String)>) -> StartProc {
        StartProc {
            secret_envs,
            ..self.0
        }
    }
}

/// A call in a sandbox answered at once: the file system's and the processes' unary calls.
/// What starts something with a stream or a handle of its own has its own door: processes
/// ([`Manager::start_process`](crate::manager::Manager::start_process)), watches
/// ([`LiveSandbox::watch`](crate::manager::LiveSandbox::watch)), file transfers
/// ([`LiveSandbox::read_file`](crate::manager::LiveSandbox::read_file)) and kernels
/// ([`LiveSandbox::contexts`](crate::manager::LiveSandbox::contexts)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    /// → [`Answer::Entry`].
    Stat { path: SandboxPath, user: User },
    /// Creates parents too; `AlreadyExists` if the path exists → [`Answer::Entry`].
    MakeDir { path: SandboxPath, user: User },
    /// → [`Answer::Entry`] (of the destination).
    Move {
        from: SandboxPath,
        to: SandboxPath,
        user: User,
    },
    /// Entries below `path` up to `depth` levels (1 = direct children; 0 counts as 1)
    /// → [`Answer::Entries`].
    ListDir {
        path: SandboxPath,
        depth: u32,
        user: User,
    },
    /// Files and whole trees → [`Answer::Done`].
    Remove { path: SandboxPath, user: User },
    /// → [`Answer::Processes`].
    ListProcesses,
    /// Whether the process is running → [`Answer::Found`] with its pid.
    FindProcess(Selector),
    /// Writes to its stdin (or its terminal when `pty`) → [`Answer::Done`].
    SendInput {
        process: Selector,
        data: Vec<u8>,
        pty: bool,
    },
    /// → [`Answer::Done`].
    CloseStdin(Selector),
    /// → [`Answer::Done`].
    Signal { process: Selector, signal: Signal },
    /// Resizes its terminal → [`Answer::Done`].
    Resize {
        process: Selector,
        size: TerminalSize,
    },
}

/// What a [`Call`] answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Done,
    Found { pid: u32 },
    Entry(Entry),
    Entries(Vec<Entry>),
    Processes(Vec<ProcInfo>),
}

impl Call {
    /// The agent's request for it.
    fn into_request(self) -> Request {
        match self {
            Call::Stat { path, user } => Request::Stat { path: path.0, user },
            Call::MakeDir { path, user } => Request::MakeDir { path: path.0, user },
            Call::Move { from, to, user } => Request::Move {
                from: from.0,
                to: to.0,
                user,
            },
            Call::ListDir { path, depth, user } => Request::ListDir {
                path: path.0,
                depth: depth.max(1),
                user,
            },
            Call::Remove { path, user } => Request::Remove { path: path.0, user },
            Call::ListProcesses => Request::List,
            Call::FindProcess(sel) => Request::Find(sel),
            Call::SendInput { process, data, pty } => Request::Input {
                sel: process,
                data,
                pty,
            },
            Call::CloseStdin(sel) => Request::CloseStdin(sel),
            Call::Signal { process, signal } => Request::Signal {
                sel: process,
                signal: signal.number(),
            },
            Call::Resize { process, size } => Request::Resize {
                sel: process,
                cols: size.cols,
                rows: size.rows,
            },
        }
    }

    /// The agent's request for it, and how to read the agent's reply.
    pub(crate) fn into_parts(self) -> (Request, fn(Reply) -> Option<Answer>) {
        let answer: fn(Reply) -> Option<Answer> = match &self {
            Call::Stat { .. } | Call::MakeDir { .. } | Call::Move { .. } => |r| match r {
                Reply::Entry(e) => Some(Answer::Entry(e)),
                _ => None,
            },
            Call::ListDir { .. } => |r| match r {
                Reply::Entries(e) => Some(Answer::Entries(e)),
                _ => None,
            },
            Call::ListProcesses => |r| match r {
                Reply::Processes(p) => Some(Answer::Processes(p)),
                _ => None,
            },
            Call::FindProcess(_) => |r| match r {
                Reply::Started { pid } => Some(Answer::Found { pid }),
                _ => None,
            },
            Call::Remove { .. }
            | Call::SendInput { .. }
            | Call::CloseStdin(_)
            | Call::Signal { .. }
            | Call::Resize { .. } => |r| matches!(r, Reply::Done).then_some(Answer::Done),
        };
        (self.into_request(), answer)
    }
}

/// The error for a reply of the wrong kind: only a broken (or hostile) agent sends one.
pub(crate) fn unexpected_reply() -> CallError {
    CallError::Agent(AgentError::new(
        ErrorKind::Internal,
        "the sandbox's agent answered with a reply of the wrong kind",
    ))
}

/// For the fuzz targets: the agent request a call becomes.
#[doc(hidden)]
pub mod fuzzing {
    pub fn request(call: super::Call) -> husk_proto::Request {
        call.into_request()
    }

    pub fn start(spec: super::ProcessSpec) -> husk_proto::StartProc {
        spec.into_start(Vec::new())
    }
}

#[cfg(test)]
mod tests;
