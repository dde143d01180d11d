//! Code kernels: the messages for the Jupyter kernels the agent runs inside the sandbox.
//!
//! The server names each kernel with an id of its choosing ([`KernelStart::kernel`]); the
//! agent launches the kernel from its Jupyter kernel spec (`kernel.json`, found in the image's
//! Jupyter data directories), speaks the Jupyter messaging protocol with it over the sandbox's
//! loopback, and reports what it does as [`crate::FromAgent::Kernel`] events. The server maps
//! those onto the E2B code-interpreter API; nothing here knows about E2B.
//!
//! Everything a kernel says is hostile: the agent bounds it before it becomes an event (text
//! comes in pieces of at most [`crate::CHUNK`] bytes, result values in [`ExecEvent::ResultPart`]
//! pieces), and the server bounds what it assembles.

use serde::{Deserialize, Serialize};

use crate::User;

/// A kernel spec found in the sandbox's image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSpec {
    /// The spec's directory name (`python3`, `bash`, `javascript`): what [`KernelStart::spec`]
    /// names.
    pub name: String,
    /// The spec's `language`, lower-cased (`python`, `bash`, `javascript`).
    pub language: String,
    pub display_name: String,
}

/// Start a kernel ([`crate::Request::KernelStart`]) → [`crate::Reply::Done`] once its process
/// runs; [`KernelEvent::Ready`] (or [`KernelEvent::Dead`]) follows.
///
/// Its `Debug` shows the names of [`KernelStart::secret_envs`], never their values.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelStart {
    /// The server's id for this kernel; unique among the sandbox's running kernels. Restarting
    /// a kernel is [`crate::Request::KernelStop`] then a start with the same id.
    pub kernel: u32,
    /// Name of the kernel spec to launch ([`KernelSpec::name`]).
    pub spec: String,
    /// Working directory; relative paths and `~` resolve against the user's home.
    pub cwd: Option<String>,
    pub user: User,
    /// Applied over the sandbox's environment (for this kernel's process only).
    pub envs: Vec<(String, String)>,
    /// Resolved secrets, applied last; never stored or reported by the agent.
    pub secret_envs: Vec<(String, String)>,
}

impl std::fmt::Debug for KernelStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secret_names: Vec<&str> = self.secret_envs.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KernelStart")
            .field("kernel", &self.kernel)
            .field("spec", &self.spec)
            .field("cwd", &self.cwd)
            .field("user", &self.user)
            .field("envs", &self.envs)
            .field("secret_envs", &secret_names)
            .finish()
    }
}

/// Run code in a ready kernel ([`crate::Request::Execute`]) → [`crate::Reply::Done`] once the
/// request is sent; its [`ExecEvent`]s follow, ending with [`ExecEvent::Done`] (or the
/// kernel's [`KernelEvent::Dead`]). One execution at a time per kernel: a second one while
/// one runs is refused (`ResourceExhausted`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Execute {
    pub kernel: u32,
    /// The server's id for this execution, carried by its events.
    pub exec: u64,
    pub code: String,
    /// Jupyter's `silent`: no output is broadcast, the execution count does not move (the
    /// server's own set-up code, e.g. per-call environment variables).
    pub silent: bool,
}

/// Unsolicited reports about one kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum KernelEvent {
    /// The kernel answered `kernel_info` and is subscribed: executions may start.
    Ready {
        /// `language_info.name` of the kernel's answer.
        language: String,
        /// `implementation` and its version, e.g. `ipython 9.6.0`.
        implementation: String,
    },
    /// The last event of a kernel: its process ended, it never became ready in time, or it
    /// broke the protocol. A running execution gets no [`ExecEvent::Done`]. `message` says why,
    /// with the end of the kernel's own output when there was any.
    Dead { message: String },
    /// An event of the execution with this id.
    Exec { exec: u64, event: ExecEvent },
}

/// What one execution reports, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ExecEvent {
    /// The kernel's execution count for this request; first, at most once.
    Count(u64),
    /// Output text (a piece of at most [`crate::CHUNK`] bytes). `date` is the Jupyter message
    /// header's (ISO 8601), as the kernel wrote it.
    Stdout {
        text: String,
        date: String,
    },
    Stderr {
        text: String,
        date: String,
    },
    /// A piece of one value of the next [`ExecEvent::Result`]: the MIME type and a part of its
    /// value as JSON text (a JSON string for text and base64 types, an object for JSON types).
    /// Consecutive parts with the same `mime` are one value, concatenated.
    ResultPart {
        mime: String,
        #[serde(with = "serde_bytes")]
        json: Vec<u8>,
    },
    /// Closes the [`ExecEvent::ResultPart`]s sent since the last result: an `execute_result`
    /// (`is_main`) or a `display_data`.
    Result {
        is_main: bool,
        date: String,
    },
    /// The kernel's error (name, value, traceback lines; bounded by the agent).
    Error {
        name: String,
        value: String,
        traceback: Vec<String>,
    },
    /// The last event: the kernel replied and went idle. `status` is the reply's (`ok`,
    /// `error`, `aborted`).
    Done {
        status: String,
    },
}
