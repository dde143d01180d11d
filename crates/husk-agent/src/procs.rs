//! The processes the agent started: their pipes or terminal, stdin, deadlines and exits.
//!
//! A process's output is read only while the connection's queue is below its high-water mark
//! (see [`crate::conn`]). Its `End` is sent once it has exited and everything it wrote before
//! exiting has been read (drained without blocking), so a client always gets all output
//! before the end, even when a background child keeps the pipe open.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Instant;

use husk_proto::{
    AgentError, ErrorKind, FromAgent, ProcEnd, ProcEvent, ProcInfo, Selector, StartProc, User,
};
use husk_runtime::agent::AgentContext;
use husk_runtime::exec::{ExecPlan, Stdio};
use husk_runtime::sys::{self, ExitStatus};

use crate::conn::Conn;

/// At most this many processes run at once (the pids cgroup bounds the sandbox as a whole;
/// this bounds the agent's table).
pub const MAX_PROCS: usize = 1024;
/// One read of process output (a pipe holds 64 KiB by default).
const READ_SIZE: usize = 64 << 10;
/// Stdin bytes the agent holds for a process that does not read them.
const MAX_STDIN_BUFFER: usize = 4 << 20;

/// Which of a process's outputs an fd is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    Pty,
}

struct Proc {
    info: ProcInfo,
    /// Output fds; `None` once at end of file.
    outputs: Vec<(Stream, Option<OwnedFd>)>,
    /// The terminal's master end (PTY processes): input and resize go here.
    pty: Option<OwnedFd>,
    /// Write end of the stdin pipe, while open.
    stdin: Option<OwnedFd>,
    stdin_buf: VecDeque<u8>,
    close_stdin_after_flush: bool,
    deadline: Option<Instant>,
    exit: Option<ExitStatus>,
    error: Option<String>,
}

/// The process table.
#[derive(Default)]
pub struct Procs {
    table: HashMap<u32, Proc>,
}

fn err(kind: ErrorKind, msg: impl Into<String>) -> AgentError {
    AgentError::new(kind, msg)
}

fn os_err(what: &str, e: io::Error) -> AgentError {
    err(ErrorKind::Internal, format!("{what}: {e}"))
}

/// Go's `ProcessState.String()`, which clients of E2B's daemon know.
pub fn status_text(st: ExitStatus) -> String {
    match st {
        ExitStatus::Exited(c) => format!("exit status {c}"),
        ExitStatus::Signaled(s) => {
            let name = match s {
                libc::SIGHUP => "hangup",
                libc::SIGINT => "interrupt",
                libc::SIGQUIT => "quit",
                libc::SIGILL => "illegal instruction",
                libc::SIGTRAP => "trace/breakpoint trap",
                libc::SIGABRT => "aborted",
                libc::SIGBUS => "bus error",
                libc::SIGFPE => "floating point exception",
                libc::SIGKILL => "killed",
                libc::SIGUSR1 => "user defined signal 1",
                libc::SIGSEGV => "segmentation fault",
                libc::SIGUSR2 => "user defined signal 2",
                libc::SIGPIPE => "broken pipe",
                libc::SIGALRM => "alarm clock",
                libc::SIGTERM => "terminated",
                libc::SIGXCPU => "CPU time limit exceeded",
                libc::SIGXFSZ => "file size limit exceeded",
                _ => return format!("signal: signal {s}"),
            };
            format!("signal: {name}")
        }
    }
}

/// The environment of a started process: login basics, the sandbox's variables, the request's.
pub fn process_env(
    user: User,
    sandbox_env: &[(String, String)],
    request_env: &[(String, String)],
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), husk_runtime::exec::DEFAULT_PATH.into()),
        ("HOME".into(), user.home().into()),
        ("USER".into(), user.name().into()),
        ("LOGNAME".into(), user.name().into()),
    ];
    for (k, v) in sandbox_env.iter().chain(request_env) {
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    env
}

pub(crate) fn runtime_user(u: User) -> husk_runtime::User {
    match u {
        User::User => husk_runtime::User::User,
        User::Root => husk_runtime::User::Root,
    }
}

impl Procs {
    fn find(&self, sel: &Selector) -> Result<u32, AgentError> {
        let found = match sel {
            Selector::Pid(pid) => self
                .table
                .get(pid)
                .filter(|p| p.exit.is_none())
                .map(|_| *pid),
            Selector::Tag(tag) => self
                .table
                .iter()
                .find(|(_, p)| p.exit.is_none() && p.info.tag.as_deref() == Some(tag.as_str()))
                .map(|(pid, _)| *pid),
        };
        found.ok_or_else(|| match sel {
            Selector::Pid(pid) => err(
                ErrorKind::NotFound,
                format!("process with pid {pid} not found"),
            ),
            Selector::Tag(tag) => err(
                ErrorKind::NotFound,
                format!("process with tag {tag} not found"),
            ),
        })
    }

    /// Finds a running process for re-attaching.
    pub fn lookup(&self, sel: &Selector) -> Result<u32, AgentError> {
        self.find(sel)
    }

    /// Starts a process with the environment `env` ([`process_env`]) and, over it, last,
    /// `p.secret_envs`. The secrets go into the process's environment only: the table keeps
    /// `p.envs` (what `List` reports), which names a secret by its `husk-secret://` reference.
    ///
    /// The process gets its own Landlock domain (see [`husk_runtime::exec::spawn`]), so other
    /// commands of the sandbox cannot read its `/proc/PID/environ`.
    pub fn start(
        &mut self,
        ctx: &AgentContext<'_>,
        p: &StartProc,
        mut env: Vec<(String, String)>,
        workdir: &str,
    ) -> Result<u32, AgentError> {
        if self.table.len() >= MAX_PROCS {
            return Err(err(ErrorKind::ResourceExhausted, "too many processes"));
        }
        if let Some(tag) = &p.tag {
            if self.find(&Selector::Tag(tag.clone())).is_ok() {
                return Err(err(
                    ErrorKind::AlreadyExists,
                    format!("a process with tag {tag} is running"),
                ));
            }
        }
        for (k, v) in &p.secret_envs {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let mut argv = Vec::with_capacity(p.args.len() + 1);
        argv.push(p.cmd.clone());
        argv.extend(p.args.iter().cloned());
        let plan = ExecPlan::new(&argv, &env, workdir, runtime_user(p.user), ctx.limits())
            .map_err(|e| err(ErrorKind::InvalidArgument, format!("invalid command: {e}")))?;
        let mut outputs = Vec::new();
        let (mut pty, mut stdin) = (None, None);
        let pid = if let Some((cols, rows)) = p.pty {
            let (master, slave) = husk_runtime::pty::open_pair().map_err(|e| os_err("pty", e))?;
            husk_runtime::pty::set_window_size(master.as_fd(), rows.max(1), cols.max(1))
                .map_err(|e| os_err("pty size", e))?;
            let pid = ctx.spawn(&plan, Stdio::Tty(slave.as_raw_fd()));
            drop(slave);
            sys::set_nonblocking(master.as_fd(), true).map_err(|e| os_err("pty", e))?;
            outputs.push((
                Stream::Pty,
                Some(master.try_clone().map_err(|e| os_err("pty", e))?),
            ));
            pty = Some(master);
            pid
        } else {
            let (out_r, out_w) = sys::pipe().map_err(|e| os_err("pipe", e))?;
            let (err_r, err_w) = sys::pipe().map_err(|e| os_err("pipe", e))?;
            let (in_r, in_w) = if p.stdin {
                let (r, w) = sys::pipe().map_err(|e| os_err("pipe", e))?;
                (r, Some(w))
            } else {
                let null = sys::open(c"/dev/null", libc::O_RDONLY | libc::O_CLOEXEC, 0)
                    .map_err(|e| os_err("/dev/null", e))?;
                (null, None)
            };
            let fds = [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()];
            let pid = ctx.spawn(&plan, Stdio::Fds(fds));
            drop((in_r, out_w, err_w));
            for fd in [&out_r, &err_r] {
                sys::set_nonblocking(fd.as_fd(), true).map_err(|e| os_err("pipe", e))?;
            }
            if let Some(w) = &in_w {
                sys::set_nonblocking(w.as_fd(), true).map_err(|e| os_err("pipe", e))?;
            }
            outputs.push((Stream::Stdout, Some(out_r)));
            outputs.push((Stream::Stderr, Some(err_r)));
            stdin = in_w;
            pid
        };
        let pid = pid.map_err(|e| {
            let kind = match e.raw_os_error() {
                Some(libc::ENOENT) | Some(libc::EACCES) | Some(libc::ENOEXEC) => {
                    ErrorKind::InvalidArgument
                }
                _ => ErrorKind::Internal,
            };
            err(kind, format!("failed to start {}: {e}", p.cmd))
        })? as u32;
        let deadline = p
            .timeout_ms
            .map(|ms| Instant::now() + std::time::Duration::from_millis(ms));
        self.table.insert(
            pid,
            Proc {
                info: ProcInfo {
                    pid,
                    tag: p.tag.clone(),
                    cmd: p.cmd.clone(),
                    args: p.args.clone(),
                    // Never `env` or `p.secret_envs`: List must not return a secret.
                    envs: p.envs.clone(),
                    cwd: p.cwd.clone(),
                },
                outputs,
                pty,
                stdin,
                stdin_buf: VecDeque::new(),
                close_stdin_after_flush: false,
                deadline,
                exit: None,
                error: None,
            },
        );
        Ok(pid)
    }

    /// Running processes.
    pub fn list(&self) -> Vec<ProcInfo> {
        let mut v: Vec<ProcInfo> = self
            .table
            .values()
            .filter(|p| p.exit.is_none())
            .map(|p| p.info.clone())
            .collect();
        v.sort_by_key(|p| p.pid);
        v
    }

    /// Queues input for a process's stdin or terminal.
    pub fn input(&mut self, sel: &Selector, data: &[u8], pty: bool) -> Result<(), AgentError> {
        let pid = self.find(sel)?;
        let Some(p) = self.table.get_mut(&pid) else {
            return Err(err(ErrorKind::NotFound, "process not found"));
        };
        if pty {
            let Some(master) = &p.pty else {
                return Err(err(ErrorKind::InvalidArgument, "process has no terminal"));
            };
            // Terminal input is small (keystrokes); a full terminal buffer means the program
            // does not read, and dropping is what a real terminal would do.
            return sys::write_all(master.as_fd(), data)
                .or_else(|e| match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(()),
                    _ => Err(e),
                })
                .map_err(|e| os_err("write to terminal", e));
        }
        if p.stdin.is_none() || p.close_stdin_after_flush {
            return Err(err(
                ErrorKind::InvalidArgument,
                "stdin of this process is closed (start it with stdin enabled)",
            ));
        }
        if p.stdin_buf.len() + data.len() > MAX_STDIN_BUFFER {
            return Err(err(
                ErrorKind::ResourceExhausted,
                "the process is not reading its stdin",
            ));
        }
        p.stdin_buf.extend(data);
        flush_stdin(p);
        Ok(())
    }

    /// Closes a process's stdin once what was sent before is written.
    pub fn close_stdin(&mut self, sel: &Selector) -> Result<(), AgentError> {
        let pid = self.find(sel)?;
        if let Some(p) = self.table.get_mut(&pid) {
            if p.pty.is_some() {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    "a terminal has no stdin to close (send Ctrl-D instead)",
                ));
            }
            p.close_stdin_after_flush = true;
            flush_stdin(p);
        }
        Ok(())
    }

    /// Sends a signal to a process's whole process group (it is a session leader).
    pub fn signal(&mut self, sel: &Selector, sig: i32) -> Result<(), AgentError> {
        if !matches!(
            sig,
            libc::SIGKILL | libc::SIGTERM | libc::SIGINT | libc::SIGHUP
        ) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!("signal {sig} not supported"),
            ));
        }
        let pid = self.find(sel)? as i32;
        sys::kill(-pid, sig)
            .or_else(|_| sys::kill(pid, sig))
            .map_err(|e| os_err("kill", e))
    }

    /// Resizes a process's terminal.
    pub fn resize(&mut self, sel: &Selector, cols: u16, rows: u16) -> Result<(), AgentError> {
        let pid = self.find(sel)?;
        let master = self
            .table
            .get(&pid)
            .and_then(|p| p.pty.as_ref())
            .ok_or_else(|| err(ErrorKind::InvalidArgument, "process has no terminal"))?;
        husk_runtime::pty::set_window_size(master.as_fd(), rows.max(1), cols.max(1))
            .map_err(|e| os_err("resize", e))
    }

    /// The fds to poll: (pid, index into outputs or usize::MAX for stdin, fd, events).
    pub fn poll_set(&self, read_output: bool) -> Vec<(u32, usize, i32, i16)> {
        let mut v = Vec::new();
        for (pid, p) in &self.table {
            if read_output {
                for (i, (_, fd)) in p.outputs.iter().enumerate() {
                    if let Some(fd) = fd {
                        v.push((*pid, i, fd.as_raw_fd(), libc::POLLIN));
                    }
                }
            }
            if let (Some(w), false) = (&p.stdin, p.stdin_buf.is_empty()) {
                v.push((*pid, usize::MAX, w.as_raw_fd(), libc::POLLOUT));
            }
        }
        v
    }

    /// Handles readiness of one polled fd.
    pub fn ready(&mut self, pid: u32, which: usize, conn: &mut Conn) {
        let Some(p) = self.table.get_mut(&pid) else {
            return;
        };
        if which == usize::MAX {
            flush_stdin(p);
            return;
        }
        if read_output(pid, p, which, conn, true) {
            if let Some(o) = p.outputs.get_mut(which) {
                o.1 = None;
            }
        }
    }

    /// The earliest process deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.table
            .values()
            .filter(|p| p.exit.is_none())
            .filter_map(|p| p.deadline)
            .min()
    }

    /// Kills processes whose deadline passed.
    pub fn enforce_deadlines(&mut self, now: Instant) {
        for (pid, p) in self.table.iter_mut() {
            if p.exit.is_none() && p.deadline.is_some_and(|d| d <= now) {
                p.deadline = None;
                p.error = Some(husk_proto::PROCESS_TIMED_OUT.into());
                let _ = sys::kill(-(*pid as i32), libc::SIGKILL);
                let _ = sys::kill(*pid as i32, libc::SIGKILL);
            }
        }
    }

    /// Reaps every exited child (orphans included: the agent is PID 1) and sends the `End` of
    /// each of its own processes, after draining what they wrote.
    /// Returns the exits of children that are not in the table (sudo's commands, orphans).
    pub fn reap(&mut self, conn: &mut Conn) -> Vec<(u32, ExitStatus)> {
        let mut others = Vec::new();
        while let Ok(Some((pid, status))) = sys::waitpid(-1, libc::WNOHANG) {
            match self.table.get_mut(&(pid as u32)) {
                Some(p) => p.exit = Some(status),
                None => others.push((pid as u32, status)),
            }
        }
        let done: Vec<u32> = self
            .table
            .iter()
            .filter(|(_, p)| p.exit.is_some())
            .map(|(pid, _)| *pid)
            .collect();
        for pid in done {
            let Some(mut p) = self.table.remove(&pid) else {
                continue;
            };
            // Whatever it wrote before exiting is in the pipe or terminal buffer now; read it
            // to the point where a read would block (a background child may still hold the
            // pipe; its later output is not this process's).
            for i in 0..p.outputs.len() {
                read_output(pid, &mut p, i, conn, false);
            }
            let status = p.exit.unwrap_or(ExitStatus::Exited(0));
            let (exit_code, exited) = match status {
                ExitStatus::Exited(c) => (c, true),
                ExitStatus::Signaled(_) => (-1, false),
            };
            conn.event(&FromAgent::Proc {
                pid,
                event: ProcEvent::End(ProcEnd {
                    exit_code,
                    exited,
                    status: status_text(status),
                    error: p.error.take(),
                }),
            });
        }
        others
    }
}

/// Writes as much pending stdin as the pipe takes; closes it when asked and flushed.
fn flush_stdin(p: &mut Proc) {
    let Some(w) = &p.stdin else {
        p.stdin_buf.clear();
        return;
    };
    while !p.stdin_buf.is_empty() {
        let (a, _) = p.stdin_buf.as_slices();
        match sys::write_some(w.as_fd(), a) {
            Ok(n) => {
                p.stdin_buf.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(_) => {
                // The process closed its stdin: drop what it will never read.
                p.stdin_buf.clear();
                p.stdin = None;
                return;
            }
        }
    }
    if p.close_stdin_after_flush {
        p.stdin = None;
    }
}

/// Reads output and forwards it, until it would block or (when `bounded`) the connection's
/// queue is full. Returns true at end of file (or error), when the fd should be dropped.
fn read_output(pid: u32, p: &mut Proc, which: usize, conn: &mut Conn, bounded: bool) -> bool {
    let Some((stream, Some(fd))) = p.outputs.get(which) else {
        return true;
    };
    let mut buf = [0u8; READ_SIZE];
    loop {
        match sys::read(fd.as_fd(), &mut buf) {
            Ok(0) => return true,
            Ok(n) => {
                let data = buf[..n].to_vec();
                let event = match stream {
                    Stream::Stdout => ProcEvent::Stdout(data),
                    Stream::Stderr => ProcEvent::Stderr(data),
                    Stream::Pty => ProcEvent::Pty(data),
                };
                conn.event(&FromAgent::Proc { pid, event });
                if bounded && conn.queued() > crate::conn::HIGH_WATER {
                    return false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EIO on a terminal master: every slave end is closed.
            Err(_) => return true,
        }
    }
}
