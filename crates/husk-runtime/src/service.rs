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

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::agent::AgentEntry;
use crate::cgroup::{CgroupOptions, SandboxCgroup};
pub use crate::confine::Confinement;
use crate::failure::{Failure, FailureKind};
use crate::spawner::{Sandbox, Spawner};
use crate::spec::SandboxSpec;
use crate::sys;
use std::path::Path;

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
    /// Sets the sandbox's hostname (a warm sandbox given to the create that claimed it).
    Rename {
        id: String,
        hostname: String,
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
                | Request::Rename { .. },
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
        /// [`Spawner::cgroup_summary`].
        cgroups: String,
        /// The kept sandboxes taken up at start ([`Spawner::adopt`]).
        adopted: Vec<Adopted>,
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

/// The server's handle to the spawner process. Requests are served one at a time.
#[derive(Debug)]
pub struct SpawnerService {
    sock: Mutex<OwnedFd>,
    /// The client end of the spawner's root channel, until [`Self::take_root_channel`].
    roots: Mutex<Option<OwnedFd>>,
    /// The client end of the spawner's build channel, until [`Self::take_build_channel`].
    builds: Mutex<Option<OwnedFd>>,
    pid: libc::pid_t,
    /// Sandboxes whose leftovers of an earlier, crashed run were reaped at start.
    reaped: usize,
    /// [`Spawner::cgroup_summary`] of the spawner.
    cgroups: String,
    /// The kept sandboxes it took up at start.
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
    let (ours, theirs) = sys::seqpacket_pair()?;
    let (roots_client, roots_served) = sys::seqpacket_pair()?;
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
        drop(ours);
        drop(roots_client);
        drop(builds_client);
        serve(
            [theirs, roots_served, builds_served],
            parent,
            agent,
            &cgroups,
            confinement.as_ref(),
            owner,
        )
    }
    drop(theirs);
    drop(roots_served);
    drop(builds_served);
    let service = SpawnerService {
        sock: Mutex::new(ours),
        roots: Mutex::new(Some(roots_client)),
        builds: Mutex::new(Some(builds_client)),
        pid,
        reaped: 0,
        cgroups: String::new(),
        adopted: Vec::new(),
    };
    let sock = service.sock.lock().map_err(|_| ServiceError::Gone)?;
    let (reply, _) = recv(sock.as_fd())?;
    drop(sock);
    match reply {
        Reply::Ready {
            reaped,
            cgroups,
            adopted,
        } => Ok(SpawnerService {
            reaped,
            cgroups,
            adopted,
            ..service
        }),
        Reply::Failed(f) => {
            let _ = sys::waitpid(pid, 0);
            Err(ServiceError::Failed(f))
        }
        other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
    }
}

impl SpawnerService {
    /// The spawner process's pid.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
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

    /// The client end of the spawner's root channel, once: for the process that copies
    /// files out of sandboxes ([`RootChannel`]). The server gives it away at start and cannot
    /// ask for roots itself.
    pub fn take_root_channel(&self) -> Option<OwnedFd> {
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
        SpawnerService {
            sock: Mutex::new(sock),
            roots: Mutex::new(None),
            builds: Mutex::new(None),
            pid,
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
        let (reply, fds) = self.call_with(&Request::Create(Box::new(spec.clone())), &fds)?;
        created(reply, fds)
    }

    /// A new connection to kept sandbox `id`'s agent (one the spawner took up at start, or
    /// made): the agent drops the connection it had and serves this one, which starts with a
    /// hello. The sandbox's network namespace and cgroups come with it, as with a create.
    pub fn reconnect(&self, id: &str) -> Result<Created, ServiceError> {
        let (reply, fds) = self.call(&Request::Reconnect(id.into()))?;
        created(reply, fds)
    }
    /// Freezes every process of a sandbox this channel made (a pause that keeps its memory);
    /// returns once the kernel reports it frozen.
    pub fn freeze(&self, id: &str) -> Result<(), ServiceError> {
        self.done(&Request::Freeze(id.into()))
    }

    /// Lets a frozen sandbox run again.
    pub fn thaw(&self, id: &str) -> Result<(), ServiceError> {
        self.done(&Request::Thaw(id.into()))
    }

    /// Sets the sandbox's hostname ([`crate::Sandbox::set_hostname`]).
    pub fn rename(&self, id: &str, hostname: &str) -> Result<(), ServiceError> {
        self.done(&Request::Rename {
            id: id.into(),
            hostname: hostname.into(),
        })
    }

    fn done(&self, req: &Request) -> Result<(), ServiceError> {
        match self.call(req)?.0 {
            Reply::Done => Ok(()),
            Reply::Failed(f) => Err(ServiceError::Failed(f)),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    /// Destroys a sandbox: every process, mount, cgroup and its uid range.
    pub fn destroy(&self, id: &str) -> Result<(), ServiceError> {
        match self.call(&Request::Destroy(id.into()))?.0 {
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

    fn stop(self, keep: bool) -> Result<(), ServiceError> {
        let result = self.call(&Request::Shutdown { keep });
        let _ = sys::waitpid(self.pid, 0);
        match result?.0 {
            Reply::ShutDown => Ok(()),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }

    fn call(&self, req: &Request) -> Result<(Reply, Vec<OwnedFd>), ServiceError> {
        self.call_with(req, &[])
    }

    fn call_with(
        &self,
        req: &Request,
        fds: &[std::os::fd::RawFd],
    ) -> Result<(Reply, Vec<OwnedFd>), ServiceError> {
        let bytes = postcard::to_stdvec(req).map_err(|e| ServiceError::Protocol(e.to_string()))?;
        if bytes.len() > MAX_MESSAGE {
            return Err(ServiceError::TooLarge(bytes.len()));
        }
        let sock = self.sock.lock().map_err(|_| ServiceError::Gone)?;
        sys::send_with_fds(sock.as_fd(), &bytes, fds).map_err(gone)?;
        recv(sock.as_fd())
    }
}

/// The files helper's channel to the spawner ([`SpawnerService::take_root_channel`]): it
/// asks for a sandbox's root by the sandbox's id, so that what it copies out is a sandbox's
/// files, never a directory the server named (which could be the host's own `/`).
#[derive(Debug)]
pub struct RootChannel {
    sock: Mutex<OwnedFd>,
}

impl RootChannel {
    pub fn new(sock: OwnedFd) -> RootChannel {
        RootChannel {
            sock: Mutex::new(sock),
        }
    }

    /// Freezes every process of sandbox `id` and opens its root directory (`O_PATH`): paths
    /// below it must be resolved inside it (`crate::transfer`). The sandbox stays frozen
    /// until it is destroyed.
    pub fn frozen_root(&self, id: &str) -> Result<OwnedFd, ServiceError> {
        let bytes = postcard::to_stdvec(&Request::FrozenRoot(id.into()))
            .map_err(|e| ServiceError::Protocol(e.to_string()))?;
        if bytes.len() > MAX_MESSAGE {
            return Err(ServiceError::TooLarge(bytes.len()));
        }
        let sock = self.sock.lock().map_err(|_| ServiceError::Gone)?;
        sys::send_with_fds(sock.as_fd(), &bytes, &[]).map_err(gone)?;
        let (reply, mut fds) = recv(sock.as_fd())?;
        match reply {
            Reply::Root => match (fds.pop(), fds.is_empty()) {
                (Some(root), true) => Ok(root),
                _ => Err(ServiceError::Protocol(
                    "expected the sandbox's root directory".into(),
                )),
            },
            Reply::Failed(f) => Err(ServiceError::Failed(f)),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
    }
}

impl RootChannel {
    /// Freezes every process of sandbox `id` and opens its writable layer (the overlay's
    /// upper directory: everything below it is the sandbox's and hostile), with the host uid
    /// its root is. The sandbox stays frozen until it is thawed or destroyed.
    pub fn frozen_layer(&self, id: &str) -> Result<(OwnedFd, u32), ServiceError> {
        let bytes = postcard::to_stdvec(&Request::FrozenLayer(id.into()))
            .map_err(|e| ServiceError::Protocol(e.to_string()))?;
        let sock = self.sock.lock().map_err(|_| ServiceError::Gone)?;
        sys::send_with_fds(sock.as_fd(), &bytes, &[]).map_err(gone)?;
        let (reply, mut fds) = recv(sock.as_fd())?;
        match reply {
            Reply::Layer { base } => match (fds.pop(), fds.is_empty()) {
                (Some(upper), true) => Ok((upper, base)),
                _ => Err(ServiceError::Protocol(
                    "expected the sandbox's writable layer".into(),
                )),
            },
            Reply::Failed(f) => Err(ServiceError::Failed(f)),
            other => Err(ServiceError::Protocol(format!("unexpected {other:?}"))),
        }
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
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (n, fds) = sys::recv_with_fds(sock, &mut buf).map_err(gone)?;
    if n == 0 {
        return Err(ServiceError::Gone);
    }
    let reply =
        postcard::from_bytes(&buf[..n]).map_err(|e| ServiceError::Protocol(e.to_string()))?;
    Ok((reply, fds))
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
            super::Request::Rename { hostname, .. } => {
                if crate::spawner::valid_hostname(hostname) {
                    Ok(())
                } else {
                    Err(format!("invalid hostname {hostname:?}"))
                }
            }
        };
        let encoded = postcard::to_stdvec(&req).map_err(|e| e.to_string());
        Some(Read { encoded, verdict })
    }
}

fn send_reply(sock: &OwnedFd, reply: &Reply, fds: &[std::os::fd::RawFd]) -> io::Result<()> {
    let bytes = postcard::to_stdvec(reply).map_err(|e| io::Error::other(e.to_string()))?;
    sys::send_with_fds(sock.as_fd(), &bytes, fds)
}

/// The network namespace of the sandbox whose PID 1 is `pid`.
fn open_netns(pid: libc::pid_t) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/{pid}/ns/net")).map_err(io::Error::other)?;
    sys::open(&path, libc::O_RDONLY | libc::O_CLOEXEC, 0)
}

/// The spawner process's main loop. Never returns.
/// `channels`: the server's, the root channel and the build channel.
fn serve(
    channels: [OwnedFd; 3],
    parent: libc::pid_t,
    agent: AgentEntry,
    cgroups: &CgroupOptions,
    confinement: Option<&Confinement>,
    owner: Option<String>,
) -> ! {
    let [sock, roots, builds] = channels;
    // Out of the server's session: a Ctrl-C at the server's terminal reaches the server, which
    // shuts the spawner down in order. If the server dies, the spawner dies with it.
    let _ = sys::setsid();
    // A stop signal sent to the whole process group or service (Ctrl-C, `pkill husk`, a
    // service manager) must not kill the spawner under the server: the server destroys its
    // sandboxes through it, then stops it.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
        sys::ignore_signal(sig);
    }
    if sys::set_parent_death_signal(libc::SIGKILL).is_err() || sys::getppid() != parent {
        sys::exit_now(1);
    }
    // If the kernel killed the spawner, every sandbox would die with it (their PID 1s have a
    // parent-death signal): it goes after them and with the server (crate::oom). `husk serve`
    // set the same value on itself before forking; this covers other callers. Best effort:
    // where it is refused, so is the server's, which `husk serve` reports.
    let _ = crate::oom::set_own(crate::oom::SERVER);
    let mut spawner =
        match Spawner::with_options(Path::new(crate::spawner::DEFAULT_RUN_DIR), cgroups) {
            Ok(s) => s,
            Err(e) => {
                let _ = send_reply(&sock, &Reply::Failed(Failure::from(&e)), &[]);
                sys::exit_now(1)
            }
        };
    if let Err(e) = spawner.set_agent(agent) {
        let _ = send_reply(&sock, &Reply::Failed(Failure::from(&e)), &[]);
        sys::exit_now(1)
    }
    if let Some(owner) = owner {
        spawner.set_owner(owner);
    }
    // Kept sandboxes of this owner first: the reaper would take them for others'.
    let kept: HashMap<String, (Sandbox, Role)> = spawner
        .adopt()
        .into_iter()
        .map(|sb| (sb.id().to_string(), (sb, Role::Server)))
        .collect();
    let mut adopted: Vec<Adopted> = kept
        .values()
        .map(|(sb, _)| Adopted {
            id: sb.id().to_string(),
            init_pid: sb.init_pid(),
        })
        .collect();
    adopted.sort_by(|a, b| a.id.cmp(&b.id));
    let reaped = spawner.reap_stale();
    // Sandbox processes get /dev/null as stdio, never the server's terminal or log.
    let null = match sys::open(c"/dev/null", libc::O_RDWR | libc::O_CLOEXEC, 0) {
        Ok(fd) => fd,
        Err(e) => {
            let failure = Failure::new(FailureKind::Internal, format!("open /dev/null: {e}"));
            let _ = send_reply(&sock, &Reply::Failed(failure), &[]);
            sys::exit_now(1)
        }
    };
    let cgroups = spawner.cgroup_summary();
    let ready = Reply::Ready {
        reaped,
        cgroups,
        adopted,
    };
    let mut state = State {
        spawner,
        sandboxes: kept,
        null,
        confinement,
    };
    // A reply too large for one message (thousands of kept sandboxes) is a failed start,
    // never a partial list: every one of them stays for a spawner that can say it.
    if send_reply(&sock, &ready, &[]).is_err() {
        state.shutdown(true);
        sys::exit_now(1);
    }
    // The server's channel first: its end is the spawner's end. The root channel may close
    // (its helper gone) without stopping anything else.
    let mut channels: Vec<(OwnedFd, Role)> = vec![
        (sock, Role::Server),
        (roots, Role::Roots),
        (builds, Role::Builder),
    ];
    let mut buf = vec![0u8; MAX_MESSAGE];
    'serve: loop {
        let mut fds: Vec<libc::pollfd> = channels
            .iter()
            .map(|(s, _)| libc::pollfd {
                fd: s.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        match sys::poll(&mut fds, -1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let ready: Vec<usize> = (0..fds.len()).filter(|&i| fds[i].revents != 0).collect();
        let mut closed = Vec::new();
        for i in ready {
            let (sock, role) = (&channels[i].0, channels[i].1);
            let (reply, reply_fds) = match sys::recv_with_fds(sock.as_fd(), &mut buf) {
                Ok((0, _)) => {
                    if role == Role::Server {
                        break 'serve;
                    }
                    closed.push(i);
                    continue;
                }
                Ok((n, fds)) => match decode_request(&buf[..n]) {
                    Ok(req) if !role.allows(&req) => (
                        Reply::Failed(Failure::new(
                            FailureKind::InvalidSpec,
                            "request not allowed on this channel",
                        )),
                        Vec::new(),
                    ),
                    Ok(Request::Shutdown { keep }) => {
                        state.shutdown(keep);
                        let _ = send_reply(sock, &Reply::ShutDown, &[]);
                        sys::exit_now(0)
                    }
                    Ok(req) => state.handle(role, req, fds),
                    Err(e) => (
                        Reply::Failed(Failure::new(
                            FailureKind::InvalidSpec,
                            format!("bad request: {e}"),
                        )),
                        Vec::new(),
                    ),
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    if role == Role::Server {
                        break 'serve;
                    }
                    closed.push(i);
                    continue;
                }
            };
            let raw: Vec<std::os::fd::RawFd> = reply_fds.iter().map(|f| f.as_raw_fd()).collect();
            if send_reply(sock, &reply, &raw).is_err() {
                if role == Role::Server {
                    break 'serve;
                }
                closed.push(i);
            }
        }
        for i in closed.into_iter().rev() {
            channels.remove(i);
        }
    }
    // The server is gone: nothing it created may outlive it, but its kept sandboxes, which
    // the next spawner of its owner takes up.
    state.shutdown(true);
    sys::exit_now(0)
}

/// What the spawner process holds while it serves.
struct State<'a> {
    spawner: Spawner,
    /// Each with the channel that made it: only that one destroys it.
    sandboxes: HashMap<String, (Sandbox, Role)>,
    /// Sandbox processes get it as stdio.
    null: OwnedFd,
    confinement: Option<&'a Confinement>,
}

impl State<'_> {
    /// Answers one request (not the shutdown), with the descriptors that go with the reply.
    fn handle(&mut self, role: Role, req: Request, mut fds: Vec<OwnedFd>) -> (Reply, Vec<OwnedFd>) {
        let failed = |f: Failure| (Reply::Failed(f), Vec::new());
        match req {
            Request::Create(mut spec) => {
                // Only the server's sandboxes are ever kept past the spawner (a build's end
                // with the build).
                if role != Role::Server {
                    spec.die_with_parent = true;
                }
                let stdio = [self.null.as_fd(), self.null.as_fd(), self.null.as_fd()];
                // At most one descriptor comes with a create: the network namespace to join.
                let netns = fds.pop();
                let confined = self.confinement.map_or(Ok(()), |c| c.check(&spec));
                let created = if let Err(e) = confined {
                    Err(crate::spawner::SpawnError::InvalidSpec(e))
                } else if fds.is_empty() {
                    self.spawner.create_in(&spec, Some(stdio), netns)
                } else {
                    Err(crate::spawner::SpawnError::InvalidSpec(
                        "more than one descriptor with a create request".into(),
                    ))
                };
                let mut sb = match created {
                    Ok(sb) => sb,
                    Err(e) => return failed(Failure::from(&e)),
                };
                match (sb.take_agent_conn(), open_netns(sb.init_pid())) {
                    (Some(conn), Ok(netns)) => {
                        let reply = Reply::Created {
                            id: sb.id().to_string(),
                            init_pid: sb.init_pid(),
                            cgroup: sb.cgroup().to_registry(),
                        };
                        self.sandboxes.insert(sb.id().to_string(), (sb, role));
                        (reply, vec![conn, netns])
                    }
                    (Some(_), Err(e)) => {
                        let _ = sb.destroy();
                        failed(Failure::new(
                            FailureKind::Internal,
                            format!("opening the sandbox's network namespace: {e}"),
                        ))
                    }
                    (None, _) => failed(Failure::new(
                        FailureKind::InvalidSpec,
                        "not an agent sandbox (spec.agent is false)",
                    )),
                }
            }
            Request::Destroy(id) => match self.sandboxes.remove(&id) {
                Some((mut sb, owner)) if owner == role => match sb.destroy() {
                    Ok(()) => (Reply::Destroyed, Vec::new()),
                    Err(e) => failed(Failure::from(&e)),
                },
                // Another channel's sandbox is as good as missing.
                Some(other) => {
                    self.sandboxes.insert(id.clone(), other);
                    failed(no_sandbox(&id))
                }
                None => failed(no_sandbox(&id)),
            },
            Request::FrozenRoot(id) => {
                let Some((sb, _)) = self.sandboxes.get(&id) else {
                    return failed(no_sandbox(&id));
                };
                // PID 1 is this process's child until the sandbox is destroyed: its pid
                // cannot have been reused, so its root is the sandbox's.
                match sb.freeze().map_err(|e| Failure::from(&e)).and_then(|()| {
                    sb.root_dir().map_err(|e| {
                        Failure::new(
                            FailureKind::Internal,
                            format!("opening the root of sandbox {id}: {e}"),
                        )
                    })
                }) {
                    Ok(root) => (Reply::Root, vec![root]),
                    Err(f) => failed(f),
                }
            }
            Request::Reconnect(id) => match self.sandboxes.get(&id) {
                Some((sb, owner)) if *owner == role => {
                    match (sb.reconnect(), open_netns(sb.init_pid())) {
                        (Ok(conn), Ok(netns)) => (
                            Reply::Created {
                                id: id.clone(),
                                init_pid: sb.init_pid(),
                                cgroup: sb.cgroup().to_registry(),
                            },
                            vec![conn, netns],
                        ),
                        (Err(e), _) | (_, Err(e)) => failed(Failure::new(
                            FailureKind::Internal,
                            format!("reconnecting to sandbox {id}: {e}"),
                        )),
                    }
                }
                _ => failed(no_sandbox(&id)),
            },
            Request::Rename { id, hostname } => match self.sandboxes.get(&id) {
                Some((sb, owner)) if *owner == role => match sb.set_hostname(&hostname) {
                    Ok(()) => (Reply::Done, Vec::new()),
                    Err(e) => failed(Failure::from(&e)),
                },
                _ => failed(no_sandbox(&id)),
            },
            Request::Freeze(id) => self.set_frozen(role, &id, true),
            Request::Thaw(id) => self.set_frozen(role, &id, false),
            Request::FrozenLayer(id) => {
                let Some((sb, _)) = self.sandboxes.get(&id) else {
                    return failed(no_sandbox(&id));
                };
                let upper = match sb.upper_dir() {
                    Ok(Some(u)) => u,
                    Ok(None) => {
                        return failed(Failure::new(
                            FailureKind::InvalidSpec,
                            format!("sandbox {id} has no writable layer of its own"),
                        ))
                    }
                    Err(e) => {
                        return failed(Failure::new(
                            FailureKind::Internal,
                            format!("the writable layer of sandbox {id}: {e}"),
                        ))
                    }
                };
                match sb.freeze() {
                    Ok(()) => (
                        Reply::Layer {
                            base: sb.host_uid_base(),
                        },
                        vec![upper],
                    ),
                    Err(e) => failed(Failure::from(&e)),
                }
            }
            Request::Shutdown { .. } => failed(Failure::new(
                FailureKind::Internal,
                "the shutdown is answered by the loop",
            )),
        }
    }

    /// Freezes or thaws a sandbox `role`'s channel made.
    fn set_frozen(&self, role: Role, id: &str, frozen: bool) -> (Reply, Vec<OwnedFd>) {
        match self.sandboxes.get(id) {
            Some((sb, owner)) if *owner == role => {
                let done = if frozen { sb.freeze() } else { sb.thaw() };
                match done {
                    Ok(()) => (Reply::Done, Vec::new()),
                    Err(e) => (Reply::Failed(Failure::from(&e)), Vec::new()),
                }
            }
            // Another channel's sandbox is as good as missing.
            _ => (Reply::Failed(no_sandbox(id)), Vec::new()),
        }
    }

    /// Destroys every sandbox, but kept ones when `keep` is set (left for the next spawner
    /// of the owner), and drops the spawner (its image mounts go with the last husk process
    /// using them).
    fn shutdown(mut self, keep: bool) {
        for (_, (mut sb, _)) in self.sandboxes.drain() {
            let _ = if keep { sb.release() } else { sb.destroy() };
        }
        drop(self.spawner);
    }
}

fn no_sandbox(id: &str) -> Failure {
    Failure::new(FailureKind::NotFound, format!("no sandbox {id}"))
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
        let rename = Request::Rename {
            id: "s1".into(),
            hostname: "x".into(),
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
