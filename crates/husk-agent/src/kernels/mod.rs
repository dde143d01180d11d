//! Code kernels: Jupyter kernels the agent launches from the image's kernel specs ([`spec`]),
//! supervises as their parent, and talks to over the sandbox's loopback with
//! [`husk_jupyter::client::KernelClient`], reporting what they do as
//! [`FromAgent::Kernel`] events ([`convert`]).
//!
//! A kernel's life: `KernelStart` writes a connection file (as the kernel's user, create-new,
//! 0600) and spawns the spec's `argv` as a session leader with its output going into a pipe
//! whose end is kept (for the `Dead` message). The agent then tries to connect every
//! [`CONNECT_RETRY`] until the kernel has bound its ports, asks for `kernel_info` every
//! [`KERNEL_INFO_RETRY`] until the client says `Ready`, and gives up after [`READY_TIMEOUT`].
//! The connection file is removed once the kernel is ready or gone.
//!
//! A kernel ends only with its process: however it goes (it exits, `KernelStop` kills it, it
//! never became ready, it broke the protocol, its sockets closed), the agent kills its process
//! group, waits for the exit to be reaped, and then sends `Dead` — exactly once — and forgets
//! the id, which can then be started again. The processes are not in [`crate::procs`]' table:
//! a kernel is not a command (`List` does not show it), but the agent reaps it all the same.
//!
//! Back-pressure: converted events wait in a per-kernel outbox and are queued on the
//! connection only while it is below [`HIGH_WATER`]; the client's sockets are read only then
//! too, so a kernel that prints faster than the server reads fills its own buffers, not the
//! agent's memory.

mod convert;
pub mod spec;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use husk_jupyter::client::{ClientError, DeadReason, ExecId, KernelClient, KernelEvent as Client};
use husk_jupyter::connection::ConnectionInfo;
use husk_jupyter::wire::ExecuteRequest;
use husk_proto::{
    AgentError, ErrorKind, Execute, FromAgent, Hello, KernelEvent, KernelSpec, KernelStart, User,
};
use husk_runtime::agent::AgentContext;
use husk_runtime::exec::{ExecPlan, Stdio};
use husk_runtime::sys::{self, ExitStatus, FsIds};

use crate::conn::{Conn, HIGH_WATER};
use crate::procs::{process_env, runtime_user, status_text};
use spec::InterruptMode;

/// At most this many kernels run at once.
pub const MAX_KERNELS: usize = 16;
/// How often a kernel that has not bound its ports yet is tried.
const CONNECT_RETRY: Duration = Duration::from_millis(25);
/// How often `kernel_info` is asked again until the kernel is ready (kernels without
/// `iopub_welcome` are known to be subscribed only once they publish a status).
const KERNEL_INFO_RETRY: Duration = Duration::from_secs(1);
/// How long a kernel has from its start to being ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a kernel whose sockets closed may take to exit by itself before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How much of a kernel's own output (its stdout and stderr) is kept for the `Dead` message.
const TAIL: usize = 8 << 10;
/// Longest reason of a protocol failure put into a `Dead` message.
const MAX_REASON: usize = 4 << 10;
/// `Dead` message of a kernel ended by `KernelStop`.
pub const STOPPED: &str = "stopped";

fn err(kind: ErrorKind, msg: impl Into<String>) -> AgentError {
    AgentError::new(kind, msg)
}

fn internal(what: &str, e: impl std::fmt::Display) -> AgentError {
    err(ErrorKind::Internal, format!("{what}: {e}"))
}

/// Where a kernel is on its way to ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Its ports are not bound yet: try to connect at `next_try`.
    Connecting {
        next_try: Instant,
    },
    /// Connected; ask `kernel_info` again at `next_info`.
    Starting {
        next_info: Instant,
    },
    Ready,
}

/// Why the agent killed a kernel (for its `Dead` message).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    Timeout,
    Protocol(String),
}

struct Kernel {
    pid: u32,
    interrupt_mode: InterruptMode,
    /// The spec's settle time, given to the client ([`spec::Spec::settle`]).
    settle: Duration,
    info: ConnectionInfo,
    /// The connection file, until the kernel is ready or gone.
    conn_file: Option<PathBuf>,
    client: Option<KernelClient>,
    phase: Phase,
    ready_by: Instant,
    /// Read end of the kernel's stdout and stderr, until end of file.
    output: Option<OwnedFd>,
    tail: VecDeque<u8>,
    /// The server's execution id of each of the client's.
    execs: HashMap<ExecId, u64>,
    /// Converted events waiting for room on the connection.
    outbox: VecDeque<KernelEvent>,
    cause: Option<Cause>,
    stopping: bool,
    /// When to kill a kernel whose sockets closed but which has not exited.
    kill_at: Option<Instant>,
}

impl Kernel {
    fn kill(&self) {
        // Its process group (it is a session leader), then itself in case it left the group.
        let _ = sys::kill(-(self.pid as i32), libc::SIGKILL);
        let _ = sys::kill(self.pid as i32, libc::SIGKILL);
    }

    fn remove_conn_file(&mut self) {
        if let Some(path) = self.conn_file.take() {
            // Unlinks whatever is at the path now (a link is not followed).
            let _ = std::fs::remove_file(path);
        }
    }

    /// Reads what the kernel wrote to its stdout and stderr, keeping the last [`TAIL`] bytes.
    fn read_output(&mut self) {
        let Some(fd) = &self.output else {
            return;
        };
        let mut buf = [0u8; 16 << 10];
        loop {
            match sys::read(fd.as_fd(), &mut buf) {
                Ok(0) => {
                    self.output = None;
                    return;
                }
                Ok(n) => {
                    self.tail.extend(&buf[..n]);
                    let excess = self.tail.len().saturating_sub(TAIL);
                    self.tail.drain(..excess);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    self.output = None;
                    return;
                }
            }
        }
    }

    /// Handles one event of the client: converted into the outbox, or a change of state.
    fn handle(&mut self, event: Client, now: Instant) {
        match event {
            Client::Ready(info) => {
                self.phase = Phase::Ready;
                self.remove_conn_file();
                self.outbox.push_back(convert::ready(&info));
            }
            Client::Exec { id, event } => {
                let done = matches!(event, husk_jupyter::client::ExecEvent::Done { .. });
                let exec = if done {
                    self.execs.remove(&id)
                } else {
                    self.execs.get(&id).copied()
                };
                if let Some(exec) = exec {
                    self.outbox.extend(
                        convert::exec_events(event)
                            .into_iter()
                            .map(|event| KernelEvent::Exec { exec, event }),
                    );
                }
            }
            Client::InterruptReply { .. } | Client::ShutdownReply { .. } => {}
            Client::Dead(reason) => {
                self.client = None;
                match reason {
                    // The kernel is going away (or went): let it exit by itself first, so its
                    // own exit status is what the server hears.
                    DeadReason::Closed(_) | DeadReason::Io(..) => {
                        self.kill_at = Some(now + EXIT_GRACE);
                    }
                    other => {
                        let reason = spec::truncate(&other.to_string(), MAX_REASON);
                        self.cause.get_or_insert(Cause::Protocol(reason));
                        self.kill();
                    }
                }
            }
        }
    }

    /// Moves events to the connection: from the outbox, then from the client, while the
    /// connection is below its high-water mark (or all of them, when not `bounded`).
    fn pump(&mut self, kernel: u32, conn: &mut Conn, bounded: bool, now: Instant) {
        loop {
            while !bounded || conn.queued() < HIGH_WATER {
                let Some(event) = self.outbox.pop_front() else {
                    break;
                };
                conn.event(&FromAgent::Kernel { kernel, event });
            }
            if !self.outbox.is_empty() {
                return;
            }
            let Some(event) = self.client.as_mut().and_then(KernelClient::next_event) else {
                return;
            };
            self.handle(event, now);
        }
    }

    /// Runs what is due at `now`: connecting, asking `kernel_info`, giving up, killing.
    fn tick(&mut self, now: Instant) {
        let dying = self.stopping || self.cause.is_some();
        match self.phase {
            Phase::Connecting { next_try } if !dying && now >= next_try => {
                match KernelClient::connect(&self.info) {
                    Ok(mut client) => {
                        client.set_settle(self.settle);
                        self.client = Some(client);
                        self.phase = Phase::Starting {
                            next_info: now + KERNEL_INFO_RETRY,
                        };
                    }
                    // Not listening yet (refused), or listening on some sockets only.
                    Err(ClientError::Connect(..)) => {
                        self.phase = Phase::Connecting {
                            next_try: now + CONNECT_RETRY,
                        };
                    }
                    Err(e) => {
                        let reason = spec::truncate(&e.to_string(), MAX_REASON);
                        self.cause = Some(Cause::Protocol(reason));
                        self.kill();
                    }
                }
            }
            Phase::Starting { next_info } if !dying && now >= next_info => {
                if let Some(client) = &mut self.client {
                    // A failure here shows as the client's Dead event.
                    let _ = client.kernel_info();
                }
                self.phase = Phase::Starting {
                    next_info: now + KERNEL_INFO_RETRY,
                };
            }
            _ => {}
        }
        if self.phase != Phase::Ready && !dying && now >= self.ready_by {
            self.cause = Some(Cause::Timeout);
            self.kill();
        }
        if self.kill_at.is_some_and(|t| now >= t) {
            self.kill_at = None;
            self.kill();
        }
        if let Some(client) = &mut self.client {
            client.tick(now);
        }
    }

    /// The next time [`Self::tick`] has something to do.
    fn next_deadline(&self) -> Option<Instant> {
        let dying = self.stopping || self.cause.is_some();
        let phase = match self.phase {
            _ if dying => None,
            Phase::Connecting { next_try } => Some(next_try.min(self.ready_by)),
            Phase::Starting { next_info } => Some(next_info.min(self.ready_by)),
            Phase::Ready => None,
        };
        let settle = self.client.as_ref().and_then(KernelClient::deadline);
        [phase, self.kill_at, settle].into_iter().flatten().min()
    }

    /// The `Dead` message of a kernel whose process ended with `status`.
    fn dead_message(&self, status: ExitStatus) -> String {
        if self.stopping {
            return STOPPED.into();
        }
        let what = match &self.cause {
            Some(Cause::Timeout) => format!(
                "the kernel did not become ready within {} s",
                READY_TIMEOUT.as_secs()
            ),
            Some(Cause::Protocol(reason)) => {
                format!("the kernel broke the protocol and was killed ({reason})")
            }
            None => format!("the kernel exited ({})", status_text(status)),
        };
        let (a, b) = self.tail.as_slices();
        let tail = String::from_utf8_lossy(&[a, b].concat()).trim().to_owned();
        if tail.is_empty() {
            what
        } else {
            format!("{what}: {tail}")
        }
    }
}

/// The kernels of the sandbox, by the server's ids.
#[derive(Default)]
pub struct Kernels {
    table: HashMap<u32, Kernel>,
}

impl Kernels {
    pub fn new() -> Kernels {
        Kernels::default()
    }

    /// The usable kernel specs for the sandbox's environment `env`.
    pub fn specs(&self, env: &[(String, String)]) -> Vec<KernelSpec> {
        spec::discover(&spec::data_path(env, User::User))
            .iter()
            .map(spec::Spec::info)
            .collect()
    }

    /// Starts the kernel `k` asks for (see the module documentation); its events follow.
    pub fn start(
        &mut self,
        ctx: &AgentContext<'_>,
        hello: &Hello,
        k: &KernelStart,
    ) -> Result<(), AgentError> {
        if self.table.contains_key(&k.kernel) {
            return Err(err(
                ErrorKind::AlreadyExists,
                format!("kernel {} is running", k.kernel),
            ));
        }
        if self.table.len() >= MAX_KERNELS {
            return Err(err(
                ErrorKind::ResourceExhausted,
                format!("at most {MAX_KERNELS} kernels run at once"),
            ));
        }
        let specs = spec::discover(&spec::data_path(&hello.env, User::User));
        let Some(spec) = specs.iter().find(|s| s.name == k.spec) else {
            let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
            return Err(err(
                ErrorKind::NotFound,
                format!(
                    "no kernel spec named '{}' (available: {})",
                    spec::truncate(&k.spec, 256),
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        };
        let workdir = match (&k.cwd, &hello.default_workdir) {
            (Some(cwd), _) => crate::fs::resolve(cwd, k.user)?,
            (None, Some(wd)) => crate::fs::resolve(wd, k.user)?,
            (None, None) => k.user.home().into(),
        };
        if k.cwd.is_some() && !workdir.is_dir() {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("cwd '{}' is not a directory", workdir.display()),
            ));
        }
        let workdir = workdir.to_string_lossy().into_owned();

        let info = ConnectionInfo::localhost(&spec.name).map_err(|e| internal("ports", e))?;
        let nonce = sys::random_u64().map_err(|e| internal("random", e))?;
        let path = PathBuf::from(format!("/tmp/.husk-kernel-{}-{nonce:016x}.json", k.kernel));
        {
            // The kernel's user owns its connection file (it must read it); create-new never
            // follows or reuses whatever is planted at the path.
            let _ids = match k.user {
                User::User => Some(
                    FsIds::enter(User::User.id(), User::User.id())
                        .map_err(|e| internal("fs ids", e))?,
                ),
                User::Root => None,
            };
            info.write_new(&path)
                .map_err(|e| internal("connection file", e))?;
        }
        let spawned = spawn(ctx, hello, k, spec, &path, &workdir);
        let (pid, output) = match spawned {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let now = Instant::now();
        self.table.insert(
            k.kernel,
            Kernel {
                pid,
                interrupt_mode: spec.interrupt_mode,
                settle: spec.settle,
                info,
                conn_file: Some(path),
                client: None,
                phase: Phase::Connecting { next_try: now },
                ready_by: now + READY_TIMEOUT,
                output: Some(output),
                tail: VecDeque::new(),
                execs: HashMap::new(),
                outbox: VecDeque::new(),
                cause: None,
                stopping: false,
                kill_at: None,
            },
        );
        Ok(())
    }

    fn live(&mut self, kernel: u32) -> Result<&mut Kernel, AgentError> {
        self.table
            .get_mut(&kernel)
            .ok_or_else(|| err(ErrorKind::NotFound, format!("kernel {kernel} not found")))
    }

    /// Sends `e`'s code to its kernel; its events follow.
    pub fn execute(&mut self, e: &Execute) -> Result<(), AgentError> {
        let k = self.live(e.kernel)?;
        if k.stopping || k.cause.is_some() {
            return Err(err(ErrorKind::InvalidArgument, "the kernel is stopping"));
        }
        let client = match (&k.phase, &mut k.client) {
            (Phase::Ready, Some(client)) => client,
            _ => return Err(err(ErrorKind::InvalidArgument, "kernel is not ready")),
        };
        let mut request = ExecuteRequest::new(&e.code);
        request.silent = e.silent;
        request.store_history = !e.silent;
        match client.execute_request(&request) {
            Ok(id) => {
                k.execs.insert(id, e.exec);
                Ok(())
            }
            Err(ClientError::Busy(_)) => Err(err(
                ErrorKind::ResourceExhausted,
                "the kernel is running another execution",
            )),
            Err(e @ (ClientError::NotReady | ClientError::Dead)) => {
                Err(err(ErrorKind::InvalidArgument, e.to_string()))
            }
            Err(e) => Err(internal("execute", e)),
        }
    }

    /// Whether `kernel` runs and is ready (for a server that takes the sandbox up again: its
    /// events go to whichever connection the agent has).
    pub fn attach(&mut self, kernel: u32) -> Result<(), AgentError> {
        let k = self.live(kernel)?;
        if k.phase != Phase::Ready || k.stopping || k.cause.is_some() {
            return Err(err(
                ErrorKind::NotFound,
                format!("kernel {kernel} is not running"),
            ));
        }
        Ok(())
    }

    /// Interrupts the kernel's running execution as its spec says.
    pub fn interrupt(&mut self, kernel: u32) -> Result<(), AgentError> {
        let k = self.live(kernel)?;
        // A SIGINT before the kernel has set up its handler would kill it.
        if k.phase != Phase::Ready || k.stopping || k.cause.is_some() {
            return Err(err(ErrorKind::InvalidArgument, "kernel is not ready"));
        }
        match k.interrupt_mode {
            // jupyter_client signals the whole process group too.
            InterruptMode::Signal => sys::kill(-(k.pid as i32), libc::SIGINT)
                .or_else(|_| sys::kill(k.pid as i32, libc::SIGINT))
                .map_err(|e| internal("interrupt", e)),
            InterruptMode::Message => match &mut k.client {
                Some(client) => client.interrupt().map_err(|e| internal("interrupt", e)),
                None => Err(err(ErrorKind::InvalidArgument, "kernel is not ready")),
            },
        }
    }

    /// Kills the kernel's process group; its `Dead` follows once the process is reaped.
    pub fn stop(&mut self, kernel: u32) -> Result<(), AgentError> {
        let k = self.live(kernel)?;
        k.stopping = true;
        k.kill();
        Ok(())
    }

    /// The fds to poll: (kernel, fd, events). Kernel sockets are read only when `read`.
    pub fn poll_set(&self, read: bool) -> Vec<(u32, RawFd, i16)> {
        let mut v = Vec::new();
        for (&id, k) in &self.table {
            if let Some(fd) = &k.output {
                v.push((id, fd.as_raw_fd(), libc::POLLIN));
            }
            for kf in k.client.iter().flat_map(KernelClient::fds) {
                let mut events = 0;
                if read && kf.read {
                    events |= libc::POLLIN;
                }
                if kf.write {
                    events |= libc::POLLOUT;
                }
                if events != 0 {
                    v.push((id, kf.fd, events));
                }
            }
        }
        v
    }

    /// Handles the readiness `revents` of one fd of [`Self::poll_set`].
    pub fn ready(&mut self, kernel: u32, fd: RawFd, revents: i16) {
        let Some(k) = self.table.get_mut(&kernel) else {
            return;
        };
        if k.output.as_ref().is_some_and(|o| o.as_raw_fd() == fd) {
            k.read_output();
        } else if let Some(client) = &mut k.client {
            let readable = revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
            client.on_ready(fd, readable, revents & libc::POLLOUT != 0);
        }
    }

    /// Queues the kernels' pending events while the connection has room.
    pub fn pump(&mut self, conn: &mut Conn) {
        let now = Instant::now();
        for (&id, k) in &mut self.table {
            k.pump(id, conn, true, now);
        }
    }

    /// Runs the kernels' timers, then [`Self::pump`].
    pub fn tick(&mut self, conn: &mut Conn) {
        let now = Instant::now();
        for k in self.table.values_mut() {
            k.tick(now);
        }
        self.pump(conn);
    }

    /// When [`Self::tick`] has something to do next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.table.values().filter_map(Kernel::next_deadline).min()
    }

    /// Takes the exit of `pid` if it is a kernel's: sends what the kernel had said, then its
    /// `Dead`, and forgets it. Returns whether `pid` was a kernel.
    pub fn exited(&mut self, pid: u32, status: ExitStatus, conn: &mut Conn) -> bool {
        let Some(id) = self
            .table
            .iter()
            .find(|(_, k)| k.pid == pid)
            .map(|(id, _)| *id)
        else {
            return false;
        };
        let Some(mut k) = self.table.remove(&id) else {
            return false;
        };
        k.read_output();
        k.pump(id, conn, false, Instant::now());
        // Whatever it left behind in its process group goes with it.
        k.kill();
        k.remove_conn_file();
        let message = k.dead_message(status);
        conn.event(&FromAgent::Kernel {
            kernel: id,
            event: KernelEvent::Dead { message },
        });
        true
    }
}

/// Spawns the kernel's process: (pid, read end of its stdout and stderr).
fn spawn(
    ctx: &AgentContext<'_>,
    hello: &Hello,
    k: &KernelStart,
    spec: &spec::Spec,
    conn_file: &std::path::Path,
    workdir: &str,
) -> Result<(u32, OwnedFd), AgentError> {
    let mut env = process_env(k.user, &hello.env, &k.envs);
    for (key, value) in spec.env.iter().chain(&k.secret_envs) {
        env.retain(|(ek, _)| ek != key);
        env.push((key.clone(), value.clone()));
    }
    let argv = spec.argv_for(&conn_file.to_string_lossy());
    let plan =
        ExecPlan::new(&argv, &env, workdir, runtime_user(k.user), ctx.limits()).map_err(|e| {
            err(
                ErrorKind::InvalidArgument,
                format!("invalid kernel argv: {e}"),
            )
        })?;
    let (out_r, out_w) = sys::pipe().map_err(|e| internal("pipe", e))?;
    let null = sys::open(c"/dev/null", libc::O_RDONLY | libc::O_CLOEXEC, 0)
        .map_err(|e| internal("/dev/null", e))?;
    let fds = [null.as_raw_fd(), out_w.as_raw_fd(), out_w.as_raw_fd()];
    let pid = ctx.spawn(&plan, Stdio::Fds(fds));
    drop((null, out_w));
    let pid = pid.map_err(|e| {
        let kind = match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::EACCES) | Some(libc::ENOEXEC) => {
                ErrorKind::InvalidArgument
            }
            _ => ErrorKind::Internal,
        };
        err(
            kind,
            format!("failed to start kernel '{}' ({}): {e}", spec.name, argv[0]),
        )
    })?;
    sys::set_nonblocking(out_r.as_fd(), true).map_err(|e| internal("pipe", e))?;
    Ok((pid as u32, out_r))
}
