//! The sudo broker: runs commands as root (or another sandbox user) for husk's `sudo`.
//!
//! `sudo` inside a sandbox is the husk binary (see `husk_runtime::usr_layer`); it connects to
//! the abstract socket `husk_proto::sudo::SOCKET` and sends its request with its stdio attached.
//! The agent starts the command through the same path as every other process (new session,
//! fences, user), so no setuid file and no privilege beyond what the agent already grants
//! through its API is involved: sudo is passwordless in husk sandboxes, as in E2B's.
//!
//! Everything a client sends comes from sandboxed code: connections waiting for their request
//! are bounded, messages are size-checked, fds beyond the three stdio ones are dropped, and only
//! a few signals are forwarded.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use husk_proto::sudo::{SudoReply, SudoRequest, SudoToAgent, MAX_MESSAGE, SOCKET};
use husk_proto::User;
use husk_runtime::agent::AgentContext;
use husk_runtime::exec::{ExecPlan, Stdio, DEFAULT_PATH};
use husk_runtime::sys::{self, ExitStatus};

/// Connections accepted but not yet sent their request; the oldest is dropped beyond this.
const MAX_WAITING: usize = 64;
/// Commands running for sudo at once.
const MAX_RUNNING: usize = 256;
/// Signals a client may forward (what a terminal or a parent sends to `sudo`).
const FORWARDED: &[i32] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGKILL,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// The broker's state.
pub struct Sudo {
    listener: OwnedFd,
    waiting: VecDeque<OwnedFd>,
    /// pid → the client's connection.
    running: HashMap<u32, OwnedFd>,
}

/// What one of the broker's fds is, for the poll loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Listener,
    Waiting(usize),
    Running(u32),
}

fn reply(conn: &OwnedFd, r: &SudoReply) {
    if let Ok(bytes) = postcard::to_stdvec(r) {
        let _ = sys::send_with_fds(conn.as_fd(), &bytes, &[]);
    }
}

impl Sudo {
    pub fn new() -> io::Result<Sudo> {
        Ok(Sudo {
            listener: sys::listen_abstract(SOCKET)?,
            waiting: VecDeque::new(),
            running: HashMap::new(),
        })
    }

    /// The fds to poll for input.
    pub fn poll_set(&self) -> Vec<(Slot, RawFd)> {
        let mut v = vec![(Slot::Listener, self.listener.as_raw_fd())];
        v.extend(
            self.waiting
                .iter()
                .enumerate()
                .map(|(i, c)| (Slot::Waiting(i), c.as_raw_fd())),
        );
        v.extend(
            self.running
                .iter()
                .map(|(p, c)| (Slot::Running(*p), c.as_raw_fd())),
        );
        v
    }

    /// Handles the ready fds (slots from this round's [`Sudo::poll_set`]).
    pub fn ready(&mut self, ctx: &AgentContext<'_>, slots: &[Slot]) {
        let mut done_waiting = Vec::new();
        for slot in slots {
            match *slot {
                Slot::Listener => self.accept_all(),
                Slot::Waiting(i) => done_waiting.push(i),
                Slot::Running(pid) => self.client_message(pid),
            }
        }
        // Remove from the back so earlier indices stay valid.
        done_waiting.sort_unstable();
        for i in done_waiting.into_iter().rev() {
            if let Some(conn) = self.waiting.remove(i) {
                self.request(ctx, conn);
            }
        }
    }

    fn accept_all(&mut self) {
        while let Ok(Some(conn)) = sys::accept(self.listener.as_fd()) {
            if self.waiting.len() >= MAX_WAITING {
                self.waiting.pop_front();
            }
            self.waiting.push_back(conn);
        }
    }

    /// Reads a waiting client's request and starts its command.
    fn request(&mut self, ctx: &AgentContext<'_>, conn: OwnedFd) {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let (n, fds) = match sys::recv_with_fds(conn.as_fd(), &mut buf) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.waiting.push_back(conn);
                return;
            }
            Err(_) => return,
        };
        let req = match postcard::from_bytes::<SudoToAgent>(&buf[..n]) {
            Ok(SudoToAgent::Run(req)) => req,
            _ => return reply(&conn, &SudoReply::Failed("sudo: malformed request".into())),
        };
        let Ok(stdio) = <[OwnedFd; 3]>::try_from(fds) else {
            return reply(
                &conn,
                &SudoReply::Failed("sudo: expected three stdio fds".into()),
            );
        };
        if self.running.len() >= MAX_RUNNING {
            return reply(
                &conn,
                &SudoReply::Failed("sudo: too many commands running".into()),
            );
        }
        match start(ctx, &req, &stdio) {
            Ok(pid) => {
                self.running.insert(pid as u32, conn);
            }
            Err(msg) => reply(&conn, &SudoReply::Failed(msg)),
        }
    }

    /// A running command's client sent a signal to forward, or went away.
    fn client_message(&mut self, pid: u32) {
        let Some(conn) = self.running.get(&pid) else {
            return;
        };
        let mut buf = [0u8; 64];
        match sys::recv_with_fds(conn.as_fd(), &mut buf) {
            Ok((0, _)) | Err(_) => {
                // The client is gone (killed); like sudo's command, this one goes on.
                let _ = sys::recv_with_fds(conn.as_fd(), &mut buf);
                self.running.remove(&pid);
            }
            Ok((n, _)) => {
                if let Ok(SudoToAgent::Signal(sig)) = postcard::from_bytes(&buf[..n]) {
                    if FORWARDED.contains(&sig) {
                        let _ =
                            sys::kill(-(pid as i32), sig).or_else(|_| sys::kill(pid as i32, sig));
                    }
                }
            }
        }
    }

    /// A child exited: if it was a sudo command, its client learns how.
    pub fn exited(&mut self, pid: u32, status: ExitStatus) {
        if let Some(conn) = self.running.remove(&pid) {
            reply(&conn, &SudoReply::Exited(status.code()));
        }
    }
}

/// The command's environment: like sudo's `env_reset`, the target user's login basics, the
/// caller's `TERM`, and `SUDO_*`; with `-E`, the caller's environment as well.
fn environment(req: &SudoRequest, user: User) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = if req.preserve_env {
        req.env.clone()
    } else {
        req.env
            .iter()
            .filter(|(k, _)| k == "TERM" || k == "LANG" || k == "LC_ALL")
            .cloned()
            .collect()
    };
    let set = |env: &mut Vec<(String, String)>, k: &str, v: String| {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), v));
    };
    set(&mut env, "PATH", DEFAULT_PATH.into());
    set(&mut env, "HOME", user.home().into());
    set(&mut env, "USER", user.name().into());
    set(&mut env, "LOGNAME", user.name().into());
    set(&mut env, "SHELL", "/bin/bash".into());
    set(&mut env, "SUDO_USER", "user".into());
    set(&mut env, "SUDO_UID", "1000".into());
    set(&mut env, "SUDO_GID", "1000".into());
    set(&mut env, "SUDO_COMMAND", req.argv.join(" "));
    env
}

fn start(ctx: &AgentContext<'_>, req: &SudoRequest, stdio: &[OwnedFd; 3]) -> Result<i32, String> {
    let user = req.user;
    let argv: Vec<String> = match (req.login || req.shell, req.argv.is_empty()) {
        (false, true) => return Err("usage: sudo [-u user] [-i | -s] [-E] command".into()),
        (false, false) => req.argv.clone(),
        (true, empty) => {
            let mut v = vec!["/bin/bash".to_string()];
            if req.login {
                v.push("-l".into());
            }
            if !empty {
                // sudo -s/-i join the command for the shell as they were given.
                v.push("-c".into());
                v.push(req.argv.join(" "));
            }
            v
        }
    };
    let cwd = if req.login {
        user.home().to_string()
    } else if std::path::Path::new(&req.cwd).is_dir() {
        req.cwd.clone()
    } else {
        "/".to_string()
    };
    let runtime_user = match user {
        User::User => husk_runtime::User::User,
        User::Root => husk_runtime::User::Root,
    };
    let plan = ExecPlan::new(
        &argv,
        &environment(req, user),
        &cwd,
        runtime_user,
        ctx.limits(),
    )
    .map_err(|e| format!("sudo: {}: {e}", req.argv.first().map_or("", String::as_str)))?;
    let fds = [
        stdio[0].as_raw_fd(),
        stdio[1].as_raw_fd(),
        stdio[2].as_raw_fd(),
    ];
    ctx.spawn(&plan, Stdio::Fds(fds)).map_err(|e| {
        format!(
            "sudo: {}: {}",
            argv.first().map_or("", String::as_str),
            if e.raw_os_error() == Some(libc::ENOENT) {
                "command not found".to_string()
            } else {
                e.to_string()
            }
        )
    })
}
