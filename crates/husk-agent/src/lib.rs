//! husk's agent: PID 1 of every server sandbox.
//!
//! The runtime builds the sandbox, then hands PID 1 to [`main`] (registered with
//! `husk_runtime::Spawner::set_agent`). From then on this single-threaded loop serves the
//! server's calls (see `husk_proto`) over one stream socket: it starts processes as `user`
//! or `root` inside the sandbox's fences ([`procs`]), relays their output and input, runs
//! file operations ([`fs`]) and inotify watches ([`watch`]), brokers `sudo` ([`sudo`]), runs
//! Jupyter kernels for the code interpreter ([`kernels`]), and reaps every zombie of the
//! sandbox. When the server closes the socket, or the spawner goes away, the agent exits and
//! the kernel ends every process of the sandbox with it.
//!
//! The agent trusts the server (it is the only peer, on a socket created for it) but bounds
//! what it keeps for it: queued output, stdin buffers, handles, watches and processes.
#![forbid(unsafe_code)]

mod assign;
pub mod conn;
pub mod fs;
pub mod kernels;
mod pollset;
pub mod procs;
pub mod sudo;
pub mod watch;

use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

use husk_proto::{AgentError, ErrorKind, FromAgent, Hello, Reply, Request, ToAgent, User, VERSION};
use husk_runtime::agent::AgentContext;
use husk_runtime::sys;
use husk_runtime::sys::FsIds;

use crate::conn::{Conn, HIGH_WATER};
use crate::pollset::{PollSet, Token};
use crate::procs::Procs;
use crate::sudo::Sudo;

/// The agent's entry point (an `husk_runtime::agent::AgentEntry`). Never returns.
pub fn main(mut ctx: AgentContext<'_>) -> ! {
    let code = match run(&mut ctx) {
        Ok(()) => 0,
        Err(_) => 1,
    };
    sys::exit_now(code)
}

struct Agent {
    hello: Hello,
    /// The sandbox's hostname (a warm sandbox's changes when it is claimed).
    hostname: String,
    /// A kept sandbox's backstop ([`Request::Deadline`]): while no server is connected, the
    /// sandbox ends at this time.
    deadline: Option<std::time::SystemTime>,
    procs: Procs,
    files: fs::Files,
    watches: watch::Watches,
    kernels: kernels::Kernels,
}

fn poll_in(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Waits for the server's hello (the first frame).
fn handshake(conn: &mut Conn, ctx: &AgentContext<'_>) -> Result<Hello, String> {
    loop {
        let Some(fd) = conn.fd() else {
            return Err("no connection".into());
        };
        let mut fds = [poll_in(fd.as_raw_fd()), poll_in(ctx.control().as_raw_fd())];
        match sys::poll(&mut fds, -1) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        if fds[1].revents != 0 {
            return Err("spawner gone".into());
        }
        let msgs = conn.receive().map_err(|e| e.to_string())?;
        if let Some(first) = msgs.into_iter().next() {
            return match first {
                ToAgent::Hello(h) if h.version == VERSION => {
                    conn.event(&FromAgent::Hello { version: VERSION });
                    Ok(h)
                }
                ToAgent::Hello(h) => Err(format!("protocol version {} not spoken", h.version)),
                ToAgent::Call { .. } => Err("call before hello".into()),
            };
        }
        if conn.closed {
            return Err("server closed the connection".into());
        }
    }
}

fn run(ctx: &mut AgentContext<'_>) -> Result<(), String> {
    let fd = ctx.take_conn().ok_or("no connection")?;
    let mut conn = Conn::new(fd).map_err(|e| e.to_string())?;
    let sigfd = sys::signalfd(&[libc::SIGCHLD]).map_err(|e| e.to_string())?;
    let hello = handshake(&mut conn, ctx)?;
    // A kept sandbox (see husk_runtime::keep) outlives its server and spawner: a new
    // connection comes through the rendezvous, and until then the agent runs detached.
    let rendezvous = ctx.take_rendezvous();
    // A new connection's first frame must be a hello, as the first connection's was.
    let mut awaiting_hello = false;
    let mut spawner_gone = false;
    let mut agent = Agent {
        deadline: None,
        hello,
        hostname: ctx.hostname().to_owned(),
        procs: Procs::default(),
        files: fs::Files::new(),
        watches: watch::Watches::new().map_err(|e| e.to_string())?,
        kernels: kernels::Kernels::new(),
    };
    // Without its socket (it cannot fail in a fresh network namespace) the sandbox still works,
    // only `sudo` does not.
    let mut sudo = Sudo::new().ok();
    loop {
        let flushed = conn.flush();
        if conn.closed || flushed.is_err() {
            if rendezvous.is_none() {
                return flushed.map_err(|e| e.to_string());
            }
            // The server went away: what it asked for is its own business, and a watch's
            // events have no one to go to.
            conn.detach();
            agent.watches = watch::Watches::new().map_err(|e| e.to_string())?;
        }
        if conn.fd().is_none()
            && agent
                .deadline
                .is_some_and(|d| d <= std::time::SystemTime::now())
        {
            // The backstop: no server came back before the sandbox's timeout.
            return Ok(());
        }
        // Kernel events held back while the server was behind, now that there may be room.
        agent.kernels.pump(&mut conn);
        let mut out_events = libc::POLLIN;
        if conn.queued() > 0 {
            out_events |= libc::POLLOUT;
        }
        // While the server is behind, output stays in the processes' pipes, kernels' sockets
        // and inotify's own bounded queue.
        let room = conn.queued() < HIGH_WATER;
        let mut set = PollSet::default();
        if let Some(fd) = conn.fd() {
            set.add(Token::Conn, fd.as_raw_fd(), out_events);
        }
        if !spawner_gone {
            set.add(Token::Control, ctx.control().as_raw_fd(), libc::POLLIN);
        }
        if let Some(r) = &rendezvous {
            set.add(Token::Rendezvous, r.as_raw_fd(), libc::POLLIN);
        }
        set.add(Token::Signals, sigfd.as_raw_fd(), libc::POLLIN);
        let watch_events = if room { libc::POLLIN } else { 0 };
        set.add(Token::Watches, agent.watches.fd().as_raw_fd(), watch_events);
        for (pid, which, fd, events) in agent.procs.poll_set(room) {
            set.add(Token::Proc(pid, which), fd, events);
        }
        for (slot, fd) in sudo.as_ref().map(Sudo::poll_set).unwrap_or_default() {
            set.add(Token::Sudo(slot), fd, libc::POLLIN);
        }
        for (kernel, fd, events) in agent.kernels.poll_set(room) {
            set.add(Token::Kernel(kernel, fd), fd, events);
        }
        let backstop = agent.deadline.filter(|_| conn.fd().is_none()).map(|d| {
            let left = d
                .duration_since(std::time::SystemTime::now())
                .unwrap_or_default();
            Instant::now() + left
        });
        let deadline = [
            agent.procs.next_deadline(),
            agent.kernels.next_deadline(),
            backstop,
        ]
        .into_iter()
        .flatten()
        .min();
        let timeout = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                left.as_millis().min(i32::MAX as u128) as i32 + 1
            }
            None => -1,
        };
        match set.poll(timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.to_string()),
        }
        let ready = set.ready();
        let is_ready = |token: Token| ready.iter().find(|(t, _)| *t == token).map(|(_, r)| *r);
        if is_ready(Token::Control).is_some() {
            if rendezvous.is_none() {
                // The spawner is gone: the sandbox ends with its PID 1.
                return Ok(());
            }
            // A kept sandbox waits for the next one.
            spawner_gone = true;
        }
        if let (Some(r), Some(_)) = (&rendezvous, is_ready(Token::Rendezvous)) {
            // A message without a descriptor, or one that cannot be read, changes nothing.
            if let Ok(Some(fd)) = husk_runtime::agent::receive_conn(r.as_fd()) {
                if conn.attach(fd).is_ok() {
                    awaiting_hello = true;
                    agent.watches = watch::Watches::new().map_err(|e| e.to_string())?;
                } else {
                    conn.detach();
                }
            }
        }
        if is_ready(Token::Conn)
            .is_some_and(|r| r & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0)
        {
            let received = conn.receive();
            let msgs = match (received, &rendezvous) {
                (Ok(m), _) => m,
                (Err(e), None) => return Err(e.to_string()),
                // A kept sandbox's agent drops a connection that breaks the protocol and
                // waits for the next.
                (Err(_), Some(_)) => {
                    conn.detach();
                    Vec::new()
                }
            };
            for msg in msgs {
                match msg {
                    ToAgent::Hello(h) if awaiting_hello && h.version == VERSION => {
                        // The sandbox keeps what it was made with (its environment, user,
                        // working directory): a new server names the same sandbox.
                        awaiting_hello = false;
                        conn.event(&FromAgent::Hello { version: VERSION });
                    }
                    ToAgent::Call { id, req } if !awaiting_hello => {
                        let result = agent.call(ctx, req);
                        conn.reply(id, result);
                    }
                    _ if rendezvous.is_some() => {
                        conn.detach();
                        break;
                    }
                    ToAgent::Hello(_) => return Err("second hello".into()),
                    ToAgent::Call { .. } => return Err("call before hello".into()),
                }
            }
        }
        for &(token, _) in &ready {
            if let Token::Proc(pid, which) = token {
                agent.procs.ready(pid, which, &mut conn);
            }
        }
        if is_ready(Token::Signals).is_some() {
            while let Ok(Some(_)) = sys::read_signalfd(sigfd.as_fd()) {}
        }
        if let Some(sudo) = &mut sudo {
            let slots: Vec<sudo::Slot> = ready
                .iter()
                .filter_map(|(t, _)| match t {
                    Token::Sudo(slot) => Some(*slot),
                    _ => None,
                })
                .collect();
            sudo.ready(ctx, &slots);
        }
        for &(token, revents) in &ready {
            if let Token::Kernel(kernel, fd) = token {
                agent.kernels.ready(kernel, fd, revents);
            }
        }
        // Reaping every round is cheap (one WNOHANG waitpid) and never misses a coalesced
        // SIGCHLD.
        for (pid, status) in agent.procs.reap(&mut conn) {
            if agent.kernels.exited(pid, status, &mut conn) {
                continue;
            }
            if let Some(sudo) = &mut sudo {
                sudo.exited(pid, status);
            }
        }
        agent.kernels.tick(&mut conn);
        if is_ready(Token::Watches).is_some() {
            for (watch, events) in agent.watches.drain() {
                conn.event(&FromAgent::Watch { watch, events });
            }
        }
        agent.procs.enforce_deadlines(Instant::now());
    }
}

impl Agent {
    fn call(&mut self, ctx: &AgentContext<'_>, req: Request) -> Result<Reply, AgentError> {
        // File operations and watches are checked with the permissions of the user they act
        // for, and what they create is that user's: the agent's fs ids become the user's for
        // the call (handles opened this way keep those rights).
        let _ids = match req.fs_user() {
            Some(User::User) => Some(
                FsIds::enter(User::User.id(), User::User.id())
                    .map_err(|e| AgentError::new(ErrorKind::Internal, e.to_string()))?,
            ),
            _ => None,
        };
        match req {
            Request::Start(p) => {
                if p.cmd.is_empty() {
                    return Err(AgentError::new(ErrorKind::InvalidArgument, "empty command"));
                }
                let env = procs::process_env(p.user, &self.hello.env, &p.envs);
                let workdir = match (&p.cwd, &self.hello.default_workdir) {
                    (Some(cwd), _) => fs::resolve(cwd, p.user)?,
                    (None, Some(wd)) => fs::resolve(wd, p.user)?,
                    (None, None) => p.user.home().into(),
                };
                if p.cwd.is_some() && !workdir.is_dir() {
                    return Err(AgentError::new(
                        ErrorKind::InvalidArgument,
                        format!("cwd '{}' does not exist", workdir.display()),
                    ));
                }
                let workdir = workdir.to_string_lossy().into_owned();
                let pid = self.procs.start(ctx, &p, env, &workdir)?;
                Ok(Reply::Started { pid })
            }
            Request::Find(sel) => Ok(Reply::Started {
                pid: self.procs.lookup(&sel)?,
            }),
            Request::List => Ok(Reply::Processes(self.procs.list())),
            Request::Input { sel, data, pty } => {
                self.procs.input(&sel, &data, pty)?;
                Ok(Reply::Done)
            }
            Request::CloseStdin(sel) => {
                self.procs.close_stdin(&sel)?;
                Ok(Reply::Done)
            }
            Request::Signal { sel, signal } => {
                self.procs.signal(&sel, signal)?;
                Ok(Reply::Done)
            }
            Request::Resize { sel, cols, rows } => {
                self.procs.resize(&sel, cols, rows)?;
                Ok(Reply::Done)
            }
            Request::WatchStart {
                path,
                recursive,
                user,
            } => Ok(Reply::Watch {
                watch: self.watches.start(&path, recursive, user)?,
            }),
            Request::WatchStop { watch } => {
                self.watches.stop(watch)?;
                Ok(Reply::Done)
            }
            Request::Env => Ok(Reply::Env(self.hello.env.clone())),
            Request::Assign { hostname, env } => {
                assign::rename(&self.hostname, &hostname)?;
                self.hostname = hostname;
                self.hello.env = env;
                Ok(Reply::Done)
            }
            Request::KernelSpecs => Ok(Reply::KernelSpecs(self.kernels.specs(&self.hello.env))),
            Request::KernelStart(k) => {
                self.kernels.start(ctx, &self.hello, &k)?;
                Ok(Reply::Done)
            }
            Request::Execute(e) => {
                self.kernels.execute(&e)?;
                Ok(Reply::Done)
            }
            Request::KernelInterrupt { kernel } => {
                self.kernels.interrupt(kernel)?;
                Ok(Reply::Done)
            }
            Request::KernelStop { kernel } => {
                self.kernels.stop(kernel)?;
                Ok(Reply::Done)
            }
            Request::KernelAttach { kernel } => {
                self.kernels.attach(kernel)?;
                Ok(Reply::Done)
            }
            Request::Deadline { unix_ms } => {
                self.deadline =
                    unix_ms.map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
                Ok(Reply::Done)
            }
            other => self.files.handle(&other),
        }
    }
}
