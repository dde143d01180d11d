//! The spawner processes' side of [`super`]: the first spawner prepares the host once,
//! forks the others from itself (each a copy that shares nothing mutable with it, see
//! [`Spawner::become_worker`]), and each then serves its own channels.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;

use super::{decode_request, Adopted, Reply, Request, Role, MAX_MESSAGE};
use crate::agent::AgentEntry;
use crate::cgroup::CgroupOptions;
use crate::confine::Confinement;
use crate::failure::{Failure, FailureKind};
use crate::spawner::{worker_of, Sandbox, Spawner};
use crate::sys;

/// The spawner processes' ends of their channels, one server and one root channel per
/// spawner, and the build channel (the first spawner's).
pub(super) struct Served {
    pub(super) server: Vec<OwnedFd>,
    pub(super) roots: Vec<OwnedFd>,
    pub(super) builds: OwnedFd,
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

/// The first spawner process. Never returns.
pub(super) fn serve(
    channels: Served,
    parent: libc::pid_t,
    agent: AgentEntry,
    cgroups: &CgroupOptions,
    confinement: Option<&Confinement>,
    owner: Option<String>,
) -> ! {
    let Served {
        server,
        roots,
        builds,
    } = channels;
    // Out of the server's session: a Ctrl-C at the server's terminal reaches the server, which
    // shuts the spawner down in order. If the server dies, the spawner dies with it.
    let _ = sys::setsid();
    // A stop signal sent to the whole process group or service (Ctrl-C, `pkill husk`, a
    // service manager) must not kill the spawner under the server: the server destroys its
    // sandboxes through it, then stops it. The other spawners inherit this.
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
    let fail_all = |f: Failure, socks: &[OwnedFd]| -> ! {
        for sock in socks {
            let _ = send_reply(sock, &Reply::Failed(f.clone()), &[]);
        }
        sys::exit_now(1)
    };
    let mut spawner =
        match Spawner::with_options(Path::new(crate::spawner::DEFAULT_RUN_DIR), cgroups) {
            Ok(s) => s,
            Err(e) => fail_all(Failure::from(&e), &server),
        };
    if let Err(e) = spawner.set_agent(agent) {
        fail_all(Failure::from(&e), &server)
    }
    if let Some(owner) = owner {
        spawner.set_owner(owner);
    }
    // Sandbox processes get /dev/null as stdio, never the server's terminal or log.
    let null = match sys::open(c"/dev/null", libc::O_RDWR | libc::O_CLOEXEC, 0) {
        Ok(fd) => fd,
        Err(e) => fail_all(
            Failure::new(FailureKind::Internal, format!("open /dev/null: {e}")),
            &server,
        ),
    };
    let workers = server.len();
    // Each spawner's server and root channel; the first's are this process's.
    let mut rest: VecDeque<(OwnedFd, OwnedFd)> = server.into_iter().zip(roots).collect();
    let Some((first, first_roots)) = rest.pop_front() else {
        sys::exit_now(1)
    };
    // The other spawners, each forked from this one once everything is prepared, and each
    // taking up its share of the kept sandboxes before the next starts: the reaper below
    // runs once all are taken.
    let me = sys::getpid();
    let mut forked = Vec::with_capacity(workers - 1);
    for worker in 1..workers {
        let Some((sock, roots)) = rest.pop_front() else {
            sys::exit_now(1)
        };
        let started = sys::pipe().and_then(|(r, w)| {
            // SAFETY: the spawner is single-threaded (started before any thread).
            let pid = unsafe { sys::fork() }?;
            Ok((r, w, pid))
        });
        match started {
            Ok((r, w, 0)) => {
                drop(r);
                drop(first);
                drop(first_roots);
                drop(builds);
                // The later spawners' channels are theirs alone.
                drop(rest);
                if sys::set_parent_death_signal(libc::SIGKILL).is_err() || sys::getppid() != me {
                    sys::exit_now(1);
                }
                if let Err(e) = spawner.become_worker(worker) {
                    let f = Failure::new(
                        FailureKind::Internal,
                        format!("starting spawner {worker}: {e}"),
                    );
                    fail_all(f, &[sock])
                }
                let kept = share(&spawner, worker, workers);
                let _ = sys::write_all(w.as_fd(), b"+");
                drop(w);
                let state = State::new(spawner, kept, null, confinement);
                run(
                    state,
                    0,
                    vec![(sock, Role::Server), (roots, Role::Roots)],
                    Vec::new(),
                )
            }
            Ok((r, w, pid)) => {
                forked.push(pid);
                drop(w);
                drop(sock);
                drop(roots);
                // One byte once it took up its share; nothing if it died (its server channel
                // is then closed, and the server's start fails there).
                let mut byte = [0u8; 1];
                let _ = sys::read(r.as_fd(), &mut byte);
            }
            Err(e) => {
                let f = Failure::new(
                    FailureKind::Internal,
                    format!("starting spawner {worker}: {e}"),
                );
                let mut socks = vec![first, sock];
                socks.extend(rest.into_iter().map(|(s, _)| s));
                fail_all(f, &socks)
            }
        }
    }
    let kept = share(&spawner, 0, workers);
    let reaped = spawner.reap_stale();
    let state = State::new(spawner, kept, null, confinement);
    run(
        state,
        reaped,
        vec![
            (first, Role::Server),
            (first_roots, Role::Roots),
            (builds, Role::Builder),
        ],
        forked,
    )
}

/// The kept sandboxes of the spawner's owner that are spawner `worker`'s of `workers`: those
/// whose id names it (modulo the number of spawners, which may differ from the server that
/// made them).
fn share(spawner: &Spawner, worker: usize, workers: usize) -> HashMap<String, (Sandbox, Role)> {
    spawner
        .adopt_where(|id| worker_of(id) % workers == worker)
        .into_iter()
        .map(|sb| (sb.id().to_string(), (sb, Role::Server)))
        .collect()
}

/// One spawner's loop: says it is ready (with the kept sandboxes it took up and, for the
/// first, how many leftovers it reaped) on its server channel, then serves `channels` (the
/// server's first) until the server stops it or goes away. `workers`: the other spawners,
/// for the first, which waits for them to have stopped before it ends (its end would kill
/// them). Never returns.
fn run(
    state: State<'_>,
    reaped: usize,
    mut channels: Vec<(OwnedFd, Role)>,
    workers: Vec<libc::pid_t>,
) -> ! {
    let end = |state: State<'_>, keep: bool| {
        state.shutdown(keep);
        for pid in &workers {
            let _ = sys::waitpid(*pid, 0);
        }
    };
    let mut adopted: Vec<Adopted> = state
        .sandboxes
        .values()
        .map(|(sb, _)| Adopted {
            id: sb.id().to_string(),
            init_pid: sb.init_pid(),
        })
        .collect();
    adopted.sort_by(|a, b| a.id.cmp(&b.id));
    let ready = Reply::Ready {
        reaped,
        cgroups: state.spawner.cgroup_summary(),
        adopted,
        pid: sys::getpid(),
    };
    // A reply too large for one message (thousands of kept sandboxes) is a failed start,
    // never a partial list: every one of them stays for a spawner that can say it.
    if send_reply(&channels[0].0, &ready, &[]).is_err() {
        end(state, true);
        sys::exit_now(1);
    }
    let mut state = state;
    // The server's channel first: its end is the spawner's end. The root and build channels
    // may close (their helper gone) without stopping anything else.
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
                        end(state, keep);
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
    end(state, true);
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

impl<'a> State<'a> {
    fn new(
        spawner: Spawner,
        sandboxes: HashMap<String, (Sandbox, Role)>,
        null: OwnedFd,
        confinement: Option<&'a Confinement>,
    ) -> State<'a> {
        State {
            spawner,
            sandboxes,
            null,
            confinement,
        }
    }

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
            Request::Assign { id, assignment } => match self.sandboxes.get_mut(&id) {
                Some((sb, owner)) if *owner == role => {
                    let confined = self
                        .confinement
                        .map_or(Ok(()), |c| c.check_mounts(&assignment.mounts))
                        .map_err(crate::spawner::SpawnError::InvalidSpec);
                    match confined.and_then(|()| self.spawner.assign(sb, &assignment)) {
                        Ok(()) => (Reply::Done, Vec::new()),
                        Err(e) => failed(Failure::from(&e)),
                    }
                }
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
