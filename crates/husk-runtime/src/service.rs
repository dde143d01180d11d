//! The spawner as a separate process, for multithreaded callers (`husk serve`).
//!
//! Forking a multithreaded process is unsafe, so a server cannot create sandboxes itself.
//! [`start`] forks a small single-threaded spawner process while the caller is still
//! single-threaded (before any async runtime starts); the server then sends it typed requests
//! over a SOCK_SEQPACKET socket and gets back, for each sandbox, its id, its cgroups and the
//! stream socket to its agent (passed with SCM_RIGHTS).
//!
//! The spawner serves three channels, each with what it may ask ([`Role`]): the server's
//! (creates without a build's layered root or the host's network, destroys, the shutdown),
//! the root channel the files helper gets ([`RootChannel`]: a frozen sandbox's root, by id)
//! and the build channel the build helper gets (build sandboxes). Each channel destroys only
//! the sandboxes it made.
//!
//! The spawner protects itself from the OOM killer as the server does (see [`crate::oom`]).
//!
//! Lifetimes are chained so nothing outlives its owner: the spawner gets SIGKILL when the
//! server dies (parent-death signal), every sandbox's PID 1 gets SIGKILL when the spawner dies,
//! and what a killed spawner leaves on the host (cgroups, registry entries) is reaped by the
//! next one. An orderly [`SpawnerService::shutdown`] destroys every sandbox first.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::agent::AgentEntry;
use crate::cgroup::{CgroupOptions, SandboxCgroup};
pub use crate::confine::Confinement;
use crate::failure::{Failure, FailureKind};
use crate::spec::SandboxSpec;
use crate::sys;

mod process;

/// Largest request or reply datagram.
const MAX_MESSAGE: usize = 128 << 10;

/// Errors of talking to the spawner process.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The spawner could not start, or refused or failed a request: what kind of failure,
    /// and why.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// The request is larger than the service accepts.
    #[error("sandbox description too large ({0} bytes, at most {MAX_MESSAGE})")]
    TooLarge(usize),
    /// The spawner process is gone.
    #[error("the spawner process is gone")]
    Gone,
    /// A reply's descriptors could not be received: this process is at its file descriptor
    /// limit. A sandbox the reply reported made is destroyed again.
    #[error("out of file descriptors: the server could not receive a sandbox's descriptors (raise its RLIMIT_NOFILE: the shipped unit sets LimitNOFILE=1048576; each sandbox holds a few)")]
    OutOfDescriptors,
    #[error("spawner protocol: {0}")]
    Protocol(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

#[derive(Debug, Serialize, Deserialize)]
enum Request {
    Create(Box<SandboxSpec>),
    Destroy(String),
    /// Stops the spawner: every sandbox is destroyed, but kept ones when `keep` is set (they
    /// stay for the next spawner of the same owner, see [`crate::keep`]).
    Shutdown {
        keep: bool,
    },
    /// Freeze the sandbox and pass its root directory: asked on the root channel only.
    FrozenRoot(String),
    /// Freeze every process of the sandbox (a pause that keeps its memory).
    Freeze(String),
    /// Let a frozen sandbox run again.
    Thaw(String),
    /// Freeze the sandbox and pass its writable layer with the host uid its root maps to:
    /// asked on the root channel only.
    FrozenLayer(String),
    /// A new connection to a kept sandbox's agent (the agent socket and the sandbox's network
    /// namespace come with [`Reply::Created`]): how a restarted server reaches the sandboxes
    /// its spawner took up.
    Reconnect(String),
    /// Gives a sandbox its hostname, lower limits and mounts (a warm sandbox given to the
    /// create that claimed it): [`crate::Spawner::assign`].
    Assign {
        id: String,
        assignment: Box<crate::spec::Assignment>,
    },
}

/// Which channel a request came on, and so what it may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The server's: creates, destroys, the shutdown.
    Server,
    /// The files helper's ([`RootChannel`]): frozen roots of sandboxes, by id, and nothing
    /// else. A root is never handed to the server, which could not be trusted to name one.
    Roots,
    /// The build helper's: creates (build steps: a layered root, the host's network) and
    /// destroys of its own sandboxes.
    Builder,
}

impl Role {
    fn allows(self, req: &Request) -> bool {
        match (self, req) {
            // The server's sandboxes never get a build's layered root or the host's network.
            (Role::Server, Request::Create(spec)) => {
                !matches!(spec.rootfs, crate::spec::RootSource::Layers { .. })
                    && !matches!(spec.network, crate::spec::NetworkMode::Host)
            }
            (
                Role::Server,
                Request::Destroy(_)
                | Request::Shutdown { .. }
                | Request::Freeze(_)
                | Request::Thaw(_)
                | Request::Reconnect(_)
                | Request::Assign { .. },
            ) => true,
            (Role::Roots, Request::FrozenRoot(_) | Request::FrozenLayer(_)) => true,
            (Role::Builder, Request::Create(_) | Request::Destroy(_)) => true,
            _ => false,
        }
    }
}

#[derive(Debug, Serialize, Deserialize)]
enum Reply {
    Ready {
        reaped: usize,
        /// [`crate::Spawner::cgroup_summary`].
        cgroups: String,
        /// The kept sandboxes this spawner took up at start ([`crate::Spawner::adopt`]).
        adopted: Vec<Adopted>,
        /// The spawner process's pid.
        pid: libc::pid_t,
    },
    /// The agent socket is attached.
    Created {
        id: String,
        init_pid: i32,
        cgroup: String,
    },
    Destroyed,
    /// The sandbox is frozen; its root directory (`O_PATH`) comes with this reply.
    Root,
    /// The sandbox is frozen; its writable layer's directory comes with this reply. `base`:
    /// the host uid (and gid) its root is.
    Layer {
        base: u32,
    },
    /// Frozen or thawed, as asked.
    Done,
    Failed(Failure),
    ShutDown,
}

/// A kept sandbox the spawner took up at start: the server reconnects to it
/// ([`SpawnerService::reconnect`]) or destroys it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Adopted {
    /// The runtime's id of the sandbox.
    pub id: String,
    /// PID 1, in the host's PID namespace.
    pub init_pid: i32,
}

/// A sandbox created by the service.
#[derive(Debug)]
pub struct Created {
    /// The runtime's id of the sandbox (names its cgroups).
    pub id: String,
    /// PID 1 of the sandbox, in the host's PID namespace.
    pub init_pid: i32,
    /// The server's end of the stream socket to the sandbox's agent.
    pub agent: OwnedFd,
    /// The sandbox's network namespace (its own, or the one it joined), opened by the
    /// spawner while PID 1 is certainly the sandbox's: the server needs no access to other
    /// users' processes to hold it, and never resolves it by pid again.
    pub netns: OwnedFd,
    /// The sandbox's cgroups, for reading its usage.
    pub cgroup: SandboxCgroup,
}

/// Most spawner processes a server runs.
pub const MAX_SPAWNERS: usize = 64;

/// One spawner process, as the server sees it.
#[derive(Debug)]
struct Worker {
    sock: Mutex<OwnedFd>,
    /// Requests sent to it and not answered yet: a create goes to the least busy spawner.
    busy: AtomicUsize,
    pid: libc::pid_t,
}

impl Worker {
    fn new(sock: OwnedFd, pid: libc::pid_t) -> Worker {
        Worker {
            sock: Mutex::new(sock),
            busy: AtomicUsize::new(0),
            pid,
        }
    }
}

/// The server's handle to its spawner processes. Each serves one request at a time; a create
/// goes to the least busy one, and every later request about a sandbox to the one that made
/// it (its id says which, [`crate::spawner::worker_of`]).
#[derive(Debug)]
pub struct SpawnerService {
    workers: Vec<Worker>,
    /// Where the search for the least busy spawner starts (turns, so that ties spread).
    next: AtomicUsize,
    /// The client ends of the spawners' root channels, until [`Self::take_root_channel`].
    roots: Mutex<Option<RootChannel>>,
    /// The client end of the first spawner's build channel, until
    /// [`Self::take_build_channel`].
    builds: Mutex<Option<OwnedFd>>,
    /// Sandboxes whose leftovers of an earlier, crashed run were reaped at start.
    reaped: usize,
    /// [`crate::Spawner::cgroup_summary`] of the spawner.
    cgroups: String,
    /// The kept sandboxes the spawners took up at start.
    adopted: Vec<Adopted>,
}

/// Forks the spawner process. Must be called while the process is single-threaded.
pub fn start(agent: AgentEntry) -> Result<SpawnerService, ServiceError> {
    start_with(agent, CgroupOptions::default())
}

/// [`start`], with what the operator allowed husk to do without (`--unenforced-limits`).
pub fn start_with(
    agent: AgentEntry,
    cgroups: CgroupOptions,
) -> Result<SpawnerService, ServiceError> {
    start_confined(agent, cgroups, None)
}

/// [`start_with`] for a server: every spec's host paths are checked against `confinement`
/// in the spawner before anything is mounted ([`crate::confine`]).
pub fn start_confined(
    agent: AgentEntry,
    cgroups: CgroupOptions,
    confinement: Option<Confinement>,
) -> Result<SpawnerService, ServiceError> {
    start_owned(agent, cgroups, confinement, None)
}

/// [`start_confined`] with an owner (a server's state directory): the server's agent
/// sandboxes that do not die with their creator outlive the spawner, and this spawner takes
/// up those of the same owner that still run ([`SpawnerService::adopted`]). See
/// [`crate::keep`].
pub fn start_owned(
    agent: AgentEntry,
    cgroups: CgroupOptions,
    confinement: Option<Confinement>,
    owner: Option<String>,
) -> Result<SpawnerService, ServiceError> {
    start_spawners(agent, cgroups, confinement, owner, 1)
}

/// [`start_owned`] with `spawners` spawner processes (1 to [`MAX_SPAWNERS`]) serving creates
/// side by side. The first prepares the host and forks the others from itself; each takes up
/// its share of the kept sandboxes, then the first reaps what crashed husk processes left.
pub fn start_spawners(
    agent: AgentEntry,
    cgroups: CgroupOptions,
    confinement: Option<Confinement>,
    owner: Option<String>,
    spawners: usize,
) -> Result<SpawnerService, ServiceError> {
    let n = spawners.clamp(1, MAX_SPAWNERS);
    let (mut clients, mut server) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut root_clients, mut roots) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        let (ours, theirs) = sys::seqpacket_pair()?;
        clients.push(ours);
        server.push(theirs);
        let (ours, theirs) = sys::seqpacket_pair()?;
        root_clients.push(ours);
        roots.push(theirs);
    }
    let (builds_client, builds_served) = sys::seqpacket_pair()?;
    match sys::settled_thread_count()? {
        1 => {}
        n => {
            return Err(ServiceError::Failed(Failure::new(
                FailureKind::Internal,
                format!("the spawner must be started before any thread (this process has {n})"),
            )))
        }
    }
    let parent = sys::getpid();
    // SAFETY: the process is single-threaded (checked just above).
    let pid = unsafe { sys::fork() }?;
    if pid == 0 {
        drop(clients);
        drop(root_clients);
        drop(builds_client);
        let served = process::Served {
            server,
            roots,
            builds: builds_served,
        };
        process::serve(served, parent, agent, &cgroups, confinement.as_ref(), owner)
    }
    drop(server);
    drop(roots);
    drop(builds_served);
    // Each spawner says it is ready on its own channel, the first last (it reaps once the
    // others took up their kept sandboxes).
    let mut ready = Vec::with_capacity(n);
    let mut failure = None;
    for sock in &clients {
        match recv(sock.as_fd()) {
            Ok((reply, _)) => ready.push(reply),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let mut service = SpawnerService::with(
        Vec::with_capacity(n),
        Some(RootChannel::new(root_clients)),
        Some(builds_client),
    );
    for (sock, reply) in clients.into_iter().zip(ready) {
        match reply {
            Reply::Ready {
                reaped,
                cgroups,
                adopted,
                pid,
            } if failure.is_none() => {
                service.reaped += reaped;
                if service.workers.is_empty() {
                    service.cgroups = cgroups;
                }
                service.adopted.extend(adopted);
                service.workers.push(Worker::new(sock, pid));
            }
            Reply::Failed(f) => {
                failure.get_or_insert(ServiceError::Failed(f));
            }
            other => {
                failure.get_or_insert(ServiceError::Protocol(format!("unexpected {other:?}")));
            }
        }
    }
    if let Some(e) = failure {
        // Every channel closed: the first spawner stops (keeping what it took up), and the
        // others with it.
        drop(service);
        let _ = sys::waitpid(pid, 0);
        return Err(e);
    }
    service.adopted.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(service)
}

impl SpawnerService {
    /// The first spawner process's pid (the server's child; the others are its children).
    pub fn pid(&self) -> libc::pid_t {
        self.workers.first().map_or(0, |w| w.pid)
    }

    /// Every spawner process's pid, the first first.
    pub fn pids(&self) -> Vec<libc::pid_t> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    /// How many sandboxes of an earlier, crashed husk were cleaned up at start.
    pub fn reaped_at_start(&self) -> usize {
        self.reaped
    }

    /// The kept sandboxes of this spawner's owner it took up at start (see [`crate::keep`]):
    /// each to be reconnected to or destroyed.
    pub fn adopted(&self) -> &[Adopted] {
        &self.adopted
    }

    /// Where sandboxes' cgroups go and how the spawner got them (one line, for the log).
    pub fn cgroup_summary(&self) -> &str {
        &self.cgroups
    }

    /// The client ends of the spawners' root channels, once: for the process that copies
    /// files out of sandboxes ([`RootChannel`]). The server gives them away at start and
    /// cannot ask for roots itself.
    pub fn take_root_channel(&self) -> Option<RootChannel> {
        self.roots.lock().ok()?.take()
    }

    /// The client end of the spawner's build channel, once: for the process that builds
    /// templates, whose sandboxes (and only theirs) get a layered root and may get the host's
    /// network. Wrapped there with [`SpawnerService::client`].
    pub fn take_build_channel(&self) -> Option<OwnedFd> {
        self.builds.lock().ok()?.take()
    }

    /// A handle on a channel taken from the service in another process (the build helper):
    /// creates and destroys as [`Self::create`] and [`Self::destroy`], with what that channel
    /// allows. It cannot shut the spawner down.
    pub fn client(sock: OwnedFd, pid: libc::pid_t) -> SpawnerService {
        SpawnerService::with(vec![Worker::new(sock, pid)], None, None)
    }

    /// A service of `workers`, with what it has to give away; nothing reaped or taken up.
    fn with(
        workers: Vec<Worker>,
        roots: Option<RootChannel>,
        builds: Option<OwnedFd>,
    ) -> SpawnerService {
        SpawnerService {
            workers,
            next: AtomicUsize::new(0),
            roots: Mutex::new(roots),
            builds: Mutex::new(builds),
            reaped: 0,
            cgroups: String::new(),
            adopted: Vec::new(),
        }
    }

    /// Creates a sandbox (`spec.agent` must be set). Blocks for the few milliseconds that takes.
    pub fn create(&self, spec: &SandboxSpec) -> Result<Created, ServiceError> {
        self.create_in(spec, None)
    }

    /// [`SpawnerService::create`] for a sandbox that joins the network namespace `netns`
    /// (with `spec.network` [`crate::NetworkMode::Joined`]).
    pub fn create_in(
        &self,
        spec: &SandboxSpec,
        netns: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Created, ServiceError> {
        let fds: Vec<std::os::fd::RawFd> = netns.iter().map(|f| f.as_raw_fd()).collect();
        let worker = self.least_busy();
        let (reply, fds) = self.call_on(worker, &Request::Create(Box::new(spec.clone())), &fds)?;
        created(reply, fds)
    }

    /// A new connection to kept sandbox `id`'s agent (one the spawner took up at start, or
    /// made): the agent drops the connection it had and serves this one, which starts with a
    /// hello. The sandbox's network namespace and cgroups come with it, as with a create.
    pub fn reconnect(&self, id: &str) -> Result<Created, ServiceError> {
        let (reply, fds) = self.call(id, &Request::Reconnect(id.into()))?;
        created(reply, fds)
    }
    /// Freezes every process of a sandbox this channel made (a pause that keeps its memory);
    /// returns once the kernel reports it frozen.
    pub fn freeze(&self, id: &str) -> Result<(), ServiceError> {
        self.done(id, &Request::Freeze(id.into()))
    }

    /// Lets a frozen sandbox run again.
    pub fn thaw(&self, id: &str) -> Result<(), ServiceError> {
        self.done(id, &Request::Thaw(id.into()))
    }

    /// Gives a sandbox this channel made its hostname, lower limits and mounts
    /// ([`crate::Spawner::assign`]).
    pub fn assign(
        &self,
        id: &str,
        assignment: &crate::spec::Assignment,
    ) -> Result<(), ServiceError> {
        self.done(
            id,
            &Request::Assign {
                id: id.into(),
                assignment: Box::new(assignment.clone()),
            },
        )
    }

    fn done(&self, id: &str, req: &Request) -> Result<(), ServiceError> {
        match self.call(id, req)?.0 {
            Reply::Done => Ok(()),
            Reply::Failed(f) => Err(ServiceError::Failed(f)),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// Destroys a sandbox: every process, mount, cgroup and its uid range.
    pub fn destroy(&self, id: &str) -> Result<(), ServiceError> {
        match self.call(id, &Request::Destroy(id.into()))?.0 {
            Reply::Destroyed => Ok(()),
            Reply::Failed(f) => Err(ServiceError::Failed(f)),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// Destroys every sandbox, stops the spawner and waits for it to exit.
    pub fn shutdown(self) -> Result<(), ServiceError> {
        self.stop(false)
    }

    /// Stops the spawner and waits for it to exit, leaving its kept sandboxes running for
    /// the next spawner of its owner; every other sandbox is destroyed.
    pub fn shutdown_keeping(self) -> Result<(), ServiceError> {
        self.stop(true)
    }

    /// The other spawners first, side by side (each destroys its own sandboxes), then the
    /// first: they are its children and end with it.
    fn stop(self, keep: bool) -> Result<(), ServiceError> {
        let pid = self.pid();
        let bytes = postcard::to_stdvec(&Request::Shutdown { keep })
            .map_err(|e| ServiceError::Protocol(e.to_string()))?;
        let mut result = Ok(());
        let (first, others) = match self.workers.split_first() {
            Some((f, o)) => (Some(f), o),
            None => (None, &[][..]),
        };
        let ask = |w: &Worker| -> Result<OwnedFd, ServiceError> {
            let sock = w.sock.lock().map_err(|_| ServiceError::Gone)?;
            let sock = sock.try_clone()?;
            sys::send_with_fds(sock.as_fd(), &bytes, &[]).map_err(gone)?;
            Ok(sock)
        };
        let answer = |sock: Result<OwnedFd, ServiceError>| match recv(sock?.as_fd())?.0 {
            Reply::ShutDown => Ok(()),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        };
        let asked: Vec<_> = others.iter().map(ask).collect();
        for sock in asked {
            result = result.and(answer(sock));
        }
        if let Some(first) = first {
            result = result.and(answer(ask(first)));
        }
        let _ = sys::waitpid(pid, 0);
        result
    }

    /// The spawner of the sandbox `id` (which made it, or took it up).
    fn route(&self, id: &str) -> usize {
        crate::spawner::worker_of(id) % self.workers.len().max(1)
    }

    /// The least busy spawner, searching from a turning start so that ties spread.
    fn least_busy(&self) -> usize {
        let n = self.workers.len().max(1);
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        (0..n)
            .map(|i| (start + i) % n)
            .min_by_key(|&i| {
                self.workers
                    .get(i)
                    .map_or(usize::MAX, |w| w.busy.load(Ordering::Relaxed))
            })
            .unwrap_or(0)
    }

    fn call(&self, id: &str, req: &Request) -> Result<(Reply, Vec<OwnedFd>), ServiceError> {
        self.call_on(self.route(id), req, &[])
    }

    fn call_on(
        &self,
        worker: usize,
        req: &Request,
        fds: &[std::os::fd::RawFd],
    ) -> Result<(Reply, Vec<OwnedFd>), ServiceError> {
        let bytes = postcard::to_stdvec(req).map_err(|e| ServiceError::Protocol(e.to_string()))?;
        if bytes.len() > MAX_MESSAGE {
            return Err(ServiceError::TooLarge(bytes.len()));
        }
        let w = self.workers.get(worker).ok_or(ServiceError::Gone)?;
        w.busy.fetch_add(1, Ordering::Relaxed);
        let answered = (|| {
            let sock = w.sock.lock().map_err(|_| ServiceError::Gone)?;
            sys::send_with_fds(sock.as_fd(), &bytes, fds).map_err(gone)?;
            let (reply, fds, lost) = recv_lossy(sock.as_fd())?;
            if !lost {
                return Ok((reply, fds));
            }
            // A sandbox made whose agent socket never arrived is of no use to anyone:
            // destroyed again, on the same channel, before the caller hears of it. (A kept
            // sandbox whose reconnect lost them stays, for a later reconnect.)
            if let (Reply::Created { id, .. }, Request::Create(_)) = (&reply, req) {
                let destroy = postcard::to_stdvec(&Request::Destroy(id.clone()))
                    .map_err(|e| ServiceError::Protocol(e.to_string()))?;
                sys::send_with_fds(sock.as_fd(), &destroy, &[]).map_err(gone)?;
                let _ = recv_lossy(sock.as_fd())?;
            }
            Err(ServiceError::OutOfDescriptors)
        })();
        w.busy.fetch_sub(1, Ordering::Relaxed);
        answered
    }
}

/// The files helper's channels to the spawners ([`SpawnerService::take_root_channel`]): it
/// asks for a sandbox's root by the sandbox's id (of the spawner that made it), so that what
/// it copies out is a sandbox's files, never a directory the server named (which could be
/// the host's own `/`).
#[derive(Debug)]
pub struct RootChannel {
    socks: Vec<Mutex<OwnedFd>>,
}

impl RootChannel {
    /// One channel per spawner, the first first.
    pub fn new(socks: Vec<OwnedFd>) -> RootChannel {
        RootChannel {
            socks: socks.into_iter().map(Mutex::new).collect(),
        }
    }

    /// The channels' descriptors (for a fork that keeps them).
    pub fn raw_fds(&self) -> Vec<std::os::fd::RawFd> {
        self.socks
            .iter()
            .filter_map(|s| s.lock().ok().map(|s| s.as_raw_fd()))
            .collect()
    }

    /// Freezes every process of sandbox `id` and opens its root directory (`O_PATH`): paths
    /// below it must be resolved inside it (`crate::transfer`). The sandbox stays frozen
    /// until it is destroyed.
    pub fn frozen_root(&self, id: &str) -> Result<OwnedFd, ServiceError> {
        match self.call(id, &Request::FrozenRoot(id.into()))? {
            (Reply::Root, mut fds) => match (fds.pop(), fds.is_empty()) {
                (Some(root), true) => Ok(root),
                _ => Err(ServiceError::Protocol(
                    "expected the sandbox's root directory".into(),
                )),
            },
            (Reply::Failed(f), _) => Err(ServiceError::Failed(f)),
            (other, _) => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// Freezes every process of sandbox `id` and opens its writable layer (the overlay's
    /// upper directory: everything below it is the sandbox's and hostile), with the host uid
    /// its root is. The sandbox stays frozen until it is thawed or destroyed.
    pub fn frozen_layer(&self, id: &str) -> Result<(OwnedFd, u32), ServiceError> {
        match self.call(id, &Request::FrozenLayer(id.into()))? {
            (Reply::Layer { base }, mut fds) => match (fds.pop(), fds.is_empty()) {
                (Some(upper), true) => Ok((upper, base)),
                _ => Err(ServiceError::Protocol(
                    "expected the sandbox's writable layer".into(),
                )),
            },
            (Reply::Failed(f), _) => Err(ServiceError::Failed(f)),
            (other, _) => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// One request to the spawner of sandbox `id`.
    fn call(&self, id: &str, req: &Request) -> Result<(Reply, Vec<OwnedFd>), ServiceError> {
        let bytes = postcard::to_stdvec(req).map_err(|e| ServiceError::Protocol(e.to_string()))?;
        if bytes.len() > MAX_MESSAGE {
            return Err(ServiceError::TooLarge(bytes.len()));
        }
        let n = self.socks.len().max(1);
        let sock = self
            .socks
            .get(crate::spawner::worker_of(id) % n)
            .ok_or(ServiceError::Gone)?;
        let sock = sock.lock().map_err(|_| ServiceError::Gone)?;
        sys::send_with_fds(sock.as_fd(), &bytes, &[]).map_err(gone)?;
        recv(sock.as_fd())
    }
}

/// A [`Reply::Created`] and its descriptors (agent socket, network namespace) read.
fn created(reply: Reply, mut fds: Vec<OwnedFd>) -> Result<Created, ServiceError> {
    match reply {
        Reply::Created {
            id,
            init_pid,
            cgroup,
        } => {
            // [agent, netns], in that order.
            let (netns, agent) = match (fds.pop(), fds.pop(), fds.is_empty()) {
                (Some(netns), Some(agent), true) => (netns, agent),
                _ => {
                    return Err(ServiceError::Protocol(
                        "expected the agent socket and the network namespace".into(),
                    ))
                }
            };
            let cgroup = SandboxCgroup::from_registry(&cgroup)
                .ok_or_else(|| ServiceError::Protocol("bad cgroup description".into()))?;
            Ok(Created {
                id,
                init_pid,
                agent,
                netns,
                cgroup,
            })
        }
        Reply::Failed(f) => Err(ServiceError::Failed(f)),
        other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
    }
}

fn gone(e: io::Error) -> ServiceError {
    match e.raw_os_error() {
        Some(libc::EPIPE) | Some(libc::ECONNRESET) => ServiceError::Gone,
        _ => ServiceError::Io(e),
    }
}

fn recv(sock: std::os::fd::BorrowedFd<'_>) -> Result<(Reply, Vec<OwnedFd>), ServiceError> {
    match recv_lossy(sock)? {
        (reply, fds, false) => Ok((reply, fds)),
        (_, _, true) => Err(ServiceError::OutOfDescriptors),
    }
}

/// A reply, its descriptors, and whether descriptors sent with it were lost (this process is
/// at its `RLIMIT_NOFILE`).
fn recv_lossy(
    sock: std::os::fd::BorrowedFd<'_>,
) -> Result<(Reply, Vec<OwnedFd>, bool), ServiceError> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, fds, lost) = sys::recv_with_fds_lossy(sock, &mut buf).map_err(gone)?;
    if n == 0 {
        return Err(ServiceError::Gone);
    }
    let reply =
        postcard::from_bytes(&buf[..n]).map_err(|e| ServiceError::Protocol(e.to_string()))?;
    Ok((reply, fds, lost))
}

/// A request datagram as the spawner reads it.
fn decode_request(datagram: &[u8]) -> Result<Request, postcard::Error> {
    postcard::from_bytes(datagram)
}

/// The spawner's reading of one request datagram, for husk's fuzz targets (`fuzz/`): what the
/// server sends the spawner is to be treated as hostile once the server runs unprivileged.
/// Not an API.
#[doc(hidden)]
pub mod fuzzing {
    /// A request as the spawner read it.
    pub struct Read {
        /// The request encoded again (for a round-trip check).
        pub encoded: Result<Vec<u8>, String>,
        /// The spawner's check of a create's spec (`Ok` for the other requests).
        pub verdict: Result<(), String>,
    }

    /// Decodes `datagram` as the spawner's loop does and, for a create, checks the spec as
    /// [`Spawner::create_in`](crate::Spawner::create_in) first does. `None` when it is not a
    /// request.
    pub fn request(datagram: &[u8]) -> Option<Read> {
        let req = super::decode_request(datagram).ok()?;
        let verdict = match &req {
            super::Request::Create(spec) => {
                crate::spawner::validate(spec).map_err(|e| e.to_string())
            }
            super::Request::Destroy(_)
            | super::Request::Reconnect(_)
            | super::Request::Shutdown { .. }
            | super::Request::FrozenRoot(_)
            | super::Request::FrozenLayer(_)
            | super::Request::Freeze(_)
            | super::Request::Thaw(_) => Ok(()),
            super::Request::Assign { assignment, .. } => {
                crate::spawner::validate_assignment(assignment).map_err(|e| e.to_string())
            }
        };
        let encoded = postcard::to_stdvec(&req).map_err(|e| e.to_string());
        Some(Read { encoded, verdict })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_channel_asks_only_what_its_role_allows() {
        let spec = Box::new(SandboxSpec::new(vec!["/bin/true".into()]));
        let mut layered = spec.clone();
        layered.rootfs = crate::spec::RootSource::Layers {
            lower: vec!["/l".into()],
            upper: "/u".into(),
            work: "/w".into(),
        };
        let mut host_net = spec.clone();
        host_net.network = crate::spec::NetworkMode::Host;
        // The server makes and destroys sandboxes, never with a build's root or the host's
        // network, and never gets a root.
        assert!(Role::Server.allows(&Request::Create(spec.clone())));
        assert!(!Role::Server.allows(&Request::Create(layered.clone())));
        assert!(!Role::Server.allows(&Request::Create(host_net.clone())));
        assert!(Role::Server.allows(&Request::Destroy("s1".into())));
        assert!(Role::Server.allows(&Request::Shutdown { keep: true }));
        assert!(Role::Server.allows(&Request::Reconnect("s1".into())));
        assert!(!Role::Roots.allows(&Request::Reconnect("s1".into())));
        assert!(!Role::Builder.allows(&Request::Reconnect("s1".into())));
        assert!(!Role::Server.allows(&Request::FrozenRoot("s1".into())));
        assert!(!Role::Server.allows(&Request::FrozenLayer("s1".into())));
        // It pauses and resumes (its own; checked by owner when served).
        assert!(Role::Server.allows(&Request::Freeze("s1".into())));
        assert!(Role::Server.allows(&Request::Thaw("s1".into())));
        let rename = Request::Assign {
            id: "s1".into(),
            assignment: Box::new(crate::spec::Assignment {
                hostname: "x".into(),
                limits: None,
                mounts: Vec::new(),
            }),
        };
        assert!(Role::Server.allows(&rename));
        assert!(!Role::Roots.allows(&rename));
        assert!(!Role::Builder.allows(&rename));
        // The files helper gets roots and layers, and nothing else.
        assert!(Role::Roots.allows(&Request::FrozenRoot("s1".into())));
        assert!(Role::Roots.allows(&Request::FrozenLayer("s1".into())));
        assert!(!Role::Roots.allows(&Request::Thaw("s1".into())));
        assert!(!Role::Roots.allows(&Request::Freeze("s1".into())));
        assert!(!Role::Roots.allows(&Request::Create(spec)));
        assert!(!Role::Roots.allows(&Request::Destroy("s1".into())));
        assert!(!Role::Roots.allows(&Request::Shutdown { keep: false }));
        // The builder makes build sandboxes, and cannot stop the spawner or take roots.
        assert!(Role::Builder.allows(&Request::Create(layered)));
        assert!(Role::Builder.allows(&Request::Create(host_net)));
        assert!(Role::Builder.allows(&Request::Destroy("s1".into())));
        assert!(!Role::Builder.allows(&Request::Shutdown { keep: false }));
        assert!(!Role::Builder.allows(&Request::FrozenRoot("s1".into())));
        assert!(!Role::Builder.allows(&Request::FrozenLayer("s1".into())));
        assert!(!Role::Builder.allows(&Request::Freeze("s1".into())));
    }
}
