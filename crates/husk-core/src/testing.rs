//! Fakes for unit tests of the core without root: a [`SandboxHost`] that makes no namespaces,
//! and an agent that speaks the real protocol over a socket pair.
//!
//! Each fake sandbox's agent is a thread reading frames from its end of the pair; destroying
//! the sandbox (or [`FakeHost::kill_agent`]) shuts the socket down, which the core sees
//! exactly as it sees a real agent die.

use std::collections::BTreeMap;
use std::net::Shutdown;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use husk_proto::{
    AgentError, ErrorKind, FromAgent, ProcEnd, ProcEvent, Reply, Request, Selector, StartProc,
    ToAgent, VERSION,
};
use husk_runtime::cgroup::SandboxCgroup;
use husk_runtime::failure::Failure;
use husk_runtime::service::{Created, ServiceError};
use husk_runtime::SandboxSpec;

use crate::host::SandboxHost;

/// How a fake sandbox's agent behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentMode {
    /// Answers the hello, then every call: disk usage with [`FAKE_DISK`]; a started process
    /// prints `NAME=value` for each variable it got (its secrets first) and ends; attaching to
    /// it prints that again, listing lists it, signalling it succeeds; files live in memory
    /// (open, read, write, close, stat, remove); stat of [`WRONG_KIND`] answers `Done`; other
    /// calls get an error.
    Serve,
    /// Hangs up at the hello (a sandbox whose agent did not start).
    HangUp,
    /// As `Serve`, but never answers a disk-usage call (a slow or hostile agent).
    NoDisk,
    /// As `Serve`, but takes [`SLOW_DEADLINE`] to take a backstop (a busy agent: whoever
    /// asked has it only once the reply came).
    SlowDeadline,
}

/// How long an agent in [`AgentMode::SlowDeadline`] takes to take a backstop.
pub const SLOW_DEADLINE: std::time::Duration = std::time::Duration::from_millis(300);

/// A path the fake agent stats with a reply of the wrong kind, as a broken agent could.
pub const WRONG_KIND: &str = "/wrong-kind";

/// (used, total) disk bytes the fake agent reports.
pub const FAKE_DISK: (u64, u64) = (4096, 1 << 30);

#[derive(Default)]
struct State {
    next: u64,
    /// Live sandboxes: runtime id → a handle on the agent's socket (to kill it).
    live: BTreeMap<String, UnixStream>,
    /// What each create was asked (hostname = sandbox id), in order.
    specs: Vec<SandboxSpec>,
    destroyed: Vec<String>,
    /// Failures the next creates return, in order.
    failures: Vec<Failure>,
    mode: Option<AgentMode>,
    /// Every process the fake agents were asked to start, as they got it.
    started: Arc<Mutex<Vec<StartProc>>>,
    /// Each sandbox's in-memory files, by runtime id.
    files: BTreeMap<String, Arc<Mutex<FakeFiles>>>,
    /// Frozen sandboxes, by runtime id.
    frozen: std::collections::BTreeSet<String>,
    /// Each sandbox's processes (pid → what it printed), by runtime id: they outlive an agent
    /// connection.
    procs: BTreeMap<String, Procs>,
    /// Sandboxes taken up at the host's last [`FakeHost::restart`].
    adopted: Vec<String>,
    /// The last backstop each sandbox's agent was given (milliseconds since the epoch).
    deadlines: Deadlines,
    /// What each sandbox's agent was assigned (a warm sandbox claimed), by runtime id.
    assigned: Assigned,
    /// Hostnames set after creation ([`SandboxHost::rename`]), by runtime id.
    given: BTreeMap<String, husk_runtime::Assignment>,
}

/// Hostname and environment an agent was assigned, by runtime id.
type Assigned = Arc<Mutex<BTreeMap<String, (String, Vec<(String, String)>)>>>;

/// Backstops given to the agents, by runtime id.
type Deadlines = Arc<Mutex<BTreeMap<String, Option<u64>>>>;

/// What one fake agent serves.
struct FakeAgent {
    id: String,
    mode: AgentMode,
    started: Arc<Mutex<Vec<StartProc>>>,
    files: Arc<Mutex<FakeFiles>>,
    procs: Procs,
    deadlines: Deadlines,
    assigned: Assigned,
}

/// A fake sandbox's processes: pid → what it printed (replayed to whoever attaches).
type Procs = Arc<Mutex<BTreeMap<u32, Vec<u8>>>>;

/// A [`SandboxHost`] that records what it is asked and fails on demand.
#[derive(Default)]
pub struct FakeHost {
    state: Mutex<State>,
}

impl FakeHost {
    pub fn new() -> Arc<FakeHost> {
        Arc::new(FakeHost::default())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next create or assign fails with `failure` (calls queue up).
    pub fn fail_next(&self, failure: Failure) {
        self.state().failures.push(failure);
    }

    /// How agents of sandboxes created from now on behave.
    pub fn set_agent_mode(&self, mode: AgentMode) {
        self.state().mode = Some(mode);
    }

    /// Runtime ids of the sandboxes alive on the host.
    pub fn live(&self) -> Vec<String> {
        self.state().live.keys().cloned().collect()
    }

    /// Runtime ids destroyed, in order.
    pub fn destroyed(&self) -> Vec<String> {
        self.state().destroyed.clone()
    }

    /// Every spec a create was asked for, in order.
    pub fn specs(&self) -> Vec<SandboxSpec> {
        self.state().specs.clone()
    }

    /// Every process the agents were asked to start, as they got it (secrets included).
    pub fn started(&self) -> Vec<StartProc> {
        let started = self.state().started.clone();
        let list = started.lock().unwrap_or_else(|p| p.into_inner()).clone();
        list
    }

    /// How many file handles the agent of `runtime_id` has open.
    pub fn open_handles(&self, runtime_id: &str) -> usize {
        self.state().files.get(runtime_id).map_or(0, |f| {
            f.lock().unwrap_or_else(|p| p.into_inner()).handles.len()
        })
    }

    /// What a restart of the spawner does: every live sandbox is taken up (and its agent
    /// waits for a new connection).
    pub fn restart(&self) {
        let mut st = self.state();
        st.adopted = st.live.keys().cloned().collect();
    }

    /// A sandbox that ended while no server ran (its PID 1 killed, the host rebooted): gone
    /// without a destroy.
    pub fn lose(&self, runtime_id: &str) {
        let mut st = self.state();
        if let Some(sock) = st.live.remove(runtime_id) {
            let _ = sock.shutdown(Shutdown::Both);
        }
        st.adopted.retain(|r| r != runtime_id);
    }

    /// The last backstop the agent of `runtime_id` was given (`None`: none ever;
    /// `Some(None)`: cleared).
    pub fn deadline(&self, runtime_id: &str) -> Option<Option<u64>> {
        let deadlines = self.state().deadlines.clone();
        let got = deadlines
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(runtime_id)
            .copied();
        got
    }

    /// What `runtime_id` was last given by [`SandboxHost::assign`].
    pub fn given(&self, runtime_id: &str) -> Option<husk_runtime::Assignment> {
        self.state().given.get(runtime_id).cloned()
    }

    /// The hostname and environment the agent of `runtime_id` was last assigned.
    pub fn assigned(&self, runtime_id: &str) -> Option<(String, Vec<(String, String)>)> {
        let assigned = self.state().assigned.clone();
        let got = assigned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(runtime_id)
            .cloned();
        got
    }

    /// Ends the agent of a live sandbox, as if it had crashed.
    pub fn kill_agent(&self, runtime_id: &str) -> bool {
        match self.state().live.get(runtime_id) {
            Some(sock) => sock.shutdown(Shutdown::Both).is_ok(),
            None => false,
        }
    }

    /// Polls until `check` holds, for at most `deadline`.
    pub async fn until(&self, deadline: Duration, check: impl Fn(&FakeHost) -> bool) -> bool {
        let end = Instant::now() + deadline;
        while Instant::now() < end {
            if check(self) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        check(self)
    }
}

impl SandboxHost for FakeHost {
    fn create(
        &self,
        spec: &SandboxSpec,
        _netns: Option<BorrowedFd<'_>>,
    ) -> Result<Created, ServiceError> {
        let mut st = self.state();
        st.specs.push(spec.clone());
        if !st.failures.is_empty() {
            return Err(ServiceError::Failed(st.failures.remove(0)));
        }
        st.next += 1;
        let id = format!("fake-{}", st.next);
        let (ours, theirs) = UnixStream::pair()?;
        let handle = theirs.try_clone()?;
        let mode = st.mode.unwrap_or(AgentMode::Serve);
        let files = Arc::new(Mutex::new(FakeFiles::default()));
        st.files.insert(id.clone(), files);
        st.procs.insert(id.clone(), Procs::default());
        drop(st);
        self.spawn_agent(&id, theirs, mode)?;
        let mut st = self.state();
        st.live.insert(id.clone(), handle);
        Ok(Created {
            id,
            // This process: its network namespace and root are what the core opens by pid.
            init_pid: std::process::id() as i32,
            agent: OwnedFd::from(ours),
            netns: std::fs::File::open("/proc/self/ns/net")?.into(),
            cgroup: SandboxCgroup::from_registry("").expect("an empty cgroup description"),
        })
    }

    fn destroy(&self, runtime_id: &str) -> Result<(), ServiceError> {
        let mut st = self.state();
        st.destroyed.push(runtime_id.to_owned());
        match st.live.remove(runtime_id) {
            Some(sock) => {
                let _ = sock.shutdown(Shutdown::Both);
                Ok(())
            }
            None => Err(ServiceError::Failed(Failure::new(
                husk_runtime::failure::FailureKind::NotFound,
                format!("no sandbox {runtime_id}"),
            ))),
        }
    }

    fn freeze(&self, runtime_id: &str) -> Result<(), ServiceError> {
        self.set_frozen(runtime_id, true)
    }

    fn thaw(&self, runtime_id: &str) -> Result<(), ServiceError> {
        self.set_frozen(runtime_id, false)
    }

    fn assign(
        &self,
        runtime_id: &str,
        assignment: &husk_runtime::Assignment,
    ) -> Result<(), ServiceError> {
        let mut st = self.state();
        if !st.live.contains_key(runtime_id) {
            return Err(ServiceError::Failed(Failure::new(
                husk_runtime::failure::FailureKind::NotFound,
                format!("no sandbox {runtime_id}"),
            )));
        }
        if !st.failures.is_empty() {
            return Err(ServiceError::Failed(st.failures.remove(0)));
        }
        st.given.insert(runtime_id.to_owned(), assignment.clone());
        Ok(())
    }

    fn adopted(&self) -> Vec<String> {
        self.state().adopted.clone()
    }

    fn reconnect(&self, runtime_id: &str) -> Result<Created, ServiceError> {
        let handle = {
            let mut st = self.state();
            let Some(old) = st.live.remove(runtime_id) else {
                return Err(ServiceError::Failed(Failure::new(
                    husk_runtime::failure::FailureKind::NotFound,
                    format!("no sandbox {runtime_id}"),
                )));
            };
            // The agent drops the connection it had.
            let _ = old.shutdown(Shutdown::Both);
            st.mode.unwrap_or(AgentMode::Serve)
        };
        let (ours, theirs) = UnixStream::pair()?;
        let keep = theirs.try_clone()?;
        self.spawn_agent(runtime_id, theirs, handle)?;
        self.state().live.insert(runtime_id.to_owned(), keep);
        Ok(Created {
            id: runtime_id.to_owned(),
            init_pid: std::process::id() as i32,
            agent: OwnedFd::from(ours),
            netns: std::fs::File::open("/proc/self/ns/net")?.into(),
            cgroup: SandboxCgroup::from_registry("").expect("an empty cgroup description"),
        })
    }
}

impl FakeHost {
    /// Starts the agent of sandbox `id` on `sock` (its files and processes are the
    /// sandbox's, whichever connection serves them).
    fn spawn_agent(&self, id: &str, sock: UnixStream, mode: AgentMode) -> std::io::Result<()> {
        let st = self.state();
        let agent = FakeAgent {
            id: id.to_owned(),
            mode,
            started: st.started.clone(),
            files: st.files.get(id).cloned().unwrap_or_default(),
            procs: st.procs.get(id).cloned().unwrap_or_default(),
            deadlines: st.deadlines.clone(),
            assigned: st.assigned.clone(),
        };
        drop(st);
        std::thread::Builder::new()
            .name(format!("fake-agent-{id}"))
            .spawn(move || fake_agent(sock, agent))?;
        Ok(())
    }
}

impl FakeHost {
    fn set_frozen(&self, runtime_id: &str, frozen: bool) -> Result<(), ServiceError> {
        let mut st = self.state();
        if !st.live.contains_key(runtime_id) {
            return Err(ServiceError::Failed(Failure::new(
                husk_runtime::failure::FailureKind::NotFound,
                format!("no sandbox {runtime_id}"),
            )));
        }
        if frozen {
            st.frozen.insert(runtime_id.to_owned());
        } else {
            st.frozen.remove(runtime_id);
        }
        Ok(())
    }

    /// Whether the sandbox `runtime_id` is frozen (paused with its memory).
    pub fn is_frozen(&self, runtime_id: &str) -> bool {
        self.state().frozen.contains(runtime_id)
    }
}

/// [`crate::saved_layers::SavedLayers`] in memory: a capture records a layer (and freezes the
/// sandbox on `host`, if set, as the files helper does), a drop forgets it.
#[derive(Default)]
pub struct FakeLayers {
    /// The host whose sandboxes a capture freezes.
    pub host: std::sync::OnceLock<Arc<FakeHost>>,
    /// Layers that exist.
    pub layers: Mutex<Vec<crate::saved_layers::LayerRef>>,
    /// Captures asked: (runtime id, into, owner, below).
    #[allow(clippy::type_complexity)]
    pub captures: Mutex<
        Vec<(
            String,
            crate::saved_layers::Home,
            String,
            Option<crate::saved_layers::LayerRef>,
        )>,
    >,
}

impl FakeLayers {
    /// Makes layer `layer` of `owner` in `home` exist (what an earlier server, or a copy cut
    /// short, left on disk).
    pub fn put(&self, home: crate::saved_layers::Home, owner: &str, layer: &str) {
        self.layers
            .lock()
            .unwrap()
            .push(crate::saved_layers::LayerRef {
                home,
                owner: owner.into(),
                layer: layer.into(),
            });
    }

    /// The (owner, layer) pairs that exist in `home`.
    pub fn in_home(&self, home: crate::saved_layers::Home) -> Vec<(String, String)> {
        let layers = self.layers.lock().unwrap();
        (layers.iter())
            .filter(|l| l.home == home)
            .map(|l| (l.owner.clone(), l.layer.clone()))
            .collect()
    }
}

impl crate::saved_layers::SavedLayers for FakeLayers {
    fn capture(
        &self,
        runtime_id: &str,
        into: crate::saved_layers::Home,
        owner: &str,
        below: Option<&crate::saved_layers::LayerRef>,
    ) -> Result<crate::saved_layers::Captured, crate::saved_layers::LayerError> {
        let layer = crate::saved_layers::new_layer_name()?;
        if let Some(h) = self.host.get() {
            h.set_frozen(runtime_id, true)
                .map_err(|e| crate::saved_layers::LayerError::Sandbox(e.to_string()))?;
        }
        self.captures
            .lock()
            .unwrap()
            .push((runtime_id.into(), into, owner.into(), below.cloned()));
        self.layers
            .lock()
            .unwrap()
            .push(crate::saved_layers::LayerRef {
                home: into,
                owner: owner.into(),
                layer: layer.clone(),
            });
        Ok(crate::saved_layers::Captured {
            layer,
            bytes: 0,
            entries: 0,
        })
    }

    fn drop_layers(
        &self,
        home: crate::saved_layers::Home,
        owner: &str,
        layer: Option<&str>,
    ) -> Result<(), crate::saved_layers::LayerError> {
        self.layers.lock().unwrap().retain(|l| {
            !(l.home == home && l.owner == owner && layer.is_none_or(|x| x == l.layer))
        });
        Ok(())
    }

    fn prune(
        &self,
        home: crate::saved_layers::Home,
        keep: &[(String, String)],
    ) -> Result<u64, crate::saved_layers::LayerError> {
        let mut layers = self.layers.lock().unwrap();
        let before = layers.len();
        // An empty layer name keeps all of the owner's.
        layers.retain(|l| {
            l.home != home
                || keep
                    .iter()
                    .any(|(ko, kl)| *ko == l.owner && (*kl == l.layer || kl.is_empty()))
        });
        Ok((before - layers.len()) as u64)
    }
}

/// The agent's side of the protocol, as much of it as the core's own logic uses.
fn fake_agent(mut sock: UnixStream, agent: FakeAgent) {
    serve(&mut sock, &agent);
    // The host keeps a handle on the socket: hang up explicitly, as a dead agent's does.
    let _ = sock.shutdown(Shutdown::Both);
}

fn serve(sock: &mut UnixStream, agent: &FakeAgent) {
    let (mode, started, files) = (agent.mode, &*agent.started, &*agent.files);
    while let Ok(Some(frame)) = husk_proto::read_frame(sock) {
        // pid → what the process printed (replayed to whoever attaches).
        let mut outputs = agent.procs.lock().unwrap_or_else(|p| p.into_inner());
        let Ok(msg) = husk_proto::decode::<ToAgent>(&frame) else {
            return;
        };
        let (id, req) = match (msg, mode) {
            (ToAgent::Hello(_), AgentMode::HangUp) => return,
            (ToAgent::Hello(_), AgentMode::Serve | AgentMode::NoDisk | AgentMode::SlowDeadline) => {
                if husk_proto::write_msg(sock, &FromAgent::Hello { version: VERSION }).is_err() {
                    return;
                }
                continue;
            }
            (ToAgent::Call { id, req }, _) => (id, req),
        };
        let mut after = Vec::new();
        let result = match req {
            Request::Disk if mode == AgentMode::NoDisk => continue,
            Request::Disk => Ok(Reply::Disk {
                used: FAKE_DISK.0,
                total: FAKE_DISK.1,
            }),
            Request::Start(p) => {
                let pid = 100 + outputs.len() as u32;
                let printed: Vec<u8> = p
                    .secret_envs
                    .iter()
                    .chain(p.envs.iter())
                    .flat_map(|(k, v)| format!("{k}={v}\n").into_bytes())
                    .collect();
                started.lock().unwrap_or_else(|e| e.into_inner()).push(p);
                outputs.insert(pid, printed.clone());
                after = proc_output(pid, printed);
                Ok(Reply::Started { pid })
            }
            Request::Find(Selector::Pid(pid)) if outputs.contains_key(&pid) => {
                after = proc_output(pid, outputs[&pid].clone());
                Ok(Reply::Started { pid })
            }
            Request::List => Ok(Reply::Processes(
                outputs
                    .keys()
                    .map(|&pid| husk_proto::ProcInfo {
                        pid,
                        tag: None,
                        cmd: "/bin/bash".into(),
                        args: Vec::new(),
                        envs: Vec::new(),
                        cwd: None,
                    })
                    .collect(),
            )),
            Request::Signal {
                sel: Selector::Pid(pid),
                ..
            } if outputs.contains_key(&pid) => Ok(Reply::Done),
            Request::Assign { hostname, env } => {
                agent
                    .assigned
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(agent.id.clone(), (hostname, env));
                Ok(Reply::Done)
            }
            Request::Deadline { unix_ms } => {
                if mode == AgentMode::SlowDeadline {
                    std::thread::sleep(SLOW_DEADLINE);
                }
                agent
                    .deadlines
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(agent.id.clone(), unix_ms);
                Ok(Reply::Done)
            }
            // A broken agent: a reply of the wrong kind.
            Request::Stat { path, .. } if path == WRONG_KIND => Ok(Reply::Done),
            req @ (Request::OpenRead { .. }
            | Request::OpenWrite { .. }
            | Request::Read { .. }
            | Request::Write { .. }
            | Request::Close { .. }
            | Request::Stat { .. }
            | Request::Remove { .. }) => files.lock().unwrap_or_else(|p| p.into_inner()).serve(req),
            other => Err(AgentError::new(
                ErrorKind::Internal,
                format!("the fake agent does not serve {other:?}"),
            )),
        };
        let reply = FromAgent::Reply { id, result };
        for msg in std::iter::once(reply).chain(after) {
            if husk_proto::write_msg(sock, &msg).is_err() {
                return;
            }
        }
    }
}

/// A process's output, then its end.
fn proc_output(pid: u32, printed: Vec<u8>) -> Vec<FromAgent> {
    let end = ProcEnd {
        exit_code: 0,
        exited: true,
        status: "exit status 0".into(),
        error: None,
    };
    vec![
        FromAgent::Proc {
            pid,
            event: ProcEvent::Stdout(printed),
        },
        FromAgent::Proc {
            pid,
            event: ProcEvent::End(end),
        },
    ]
}

/// The fake agent's files: paths to contents, and open handles.
#[derive(Default)]
pub struct FakeFiles {
    files: BTreeMap<String, Vec<u8>>,
    /// handle → (path, open for writing).
    handles: BTreeMap<u32, (String, bool)>,
    next: u32,
}

impl FakeFiles {
    fn entry(&self, path: &str) -> Option<husk_proto::Entry> {
        let data = self.files.get(path)?;
        Some(husk_proto::Entry {
            name: path.rsplit('/').next().unwrap_or(path).to_owned(),
            path: path.to_owned(),
            file_type: husk_proto::FileType::File,
            size: data.len() as u64,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "user".into(),
            group: "user".into(),
            mtime_secs: 0,
            mtime_nanos: 0,
            symlink_target: None,
            metadata: Vec::new(),
        })
    }

    fn serve(&mut self, req: Request) -> Result<Reply, AgentError> {
        let missing = |p: &str| AgentError::new(ErrorKind::NotFound, format!("{p}: no such file"));
        let bad = || AgentError::new(ErrorKind::InvalidArgument, "no such handle");
        match req {
            Request::OpenRead { path, .. } => {
                let entry = self.entry(&path).ok_or_else(|| missing(&path))?;
                self.next += 1;
                self.handles.insert(self.next, (path, false));
                Ok(Reply::Opened {
                    handle: self.next,
                    entry,
                })
            }
            Request::OpenWrite { path, .. } => {
                self.files.insert(path.clone(), Vec::new());
                let entry = self.entry(&path).ok_or_else(|| missing(&path))?;
                self.next += 1;
                self.handles.insert(self.next, (path, true));
                Ok(Reply::Opened {
                    handle: self.next,
                    entry,
                })
            }
            Request::Read {
                handle,
                offset,
                len,
            } => {
                let (path, _) = self.handles.get(&handle).ok_or_else(bad)?;
                let data = &self.files[path];
                let start = (offset as usize).min(data.len());
                let end = (start + len as usize).min(data.len());
                Ok(Reply::Data(data[start..end].to_vec()))
            }
            Request::Write { handle, data } => {
                let (path, true) = self.handles.get(&handle).ok_or_else(bad)? else {
                    return Err(bad());
                };
                let path = path.clone();
                // A disk that fills up: files under /full take 1 MiB at most.
                let held = self.files.get(&path).map_or(0, Vec::len);
                if path.starts_with("/full/") && held + data.len() > 1 << 20 {
                    return Err(AgentError::new(ErrorKind::NoSpace, "not enough disk space"));
                }
                self.files.entry(path).or_default().extend(data);
                Ok(Reply::Done)
            }
            Request::Close { handle } => {
                let (path, _) = self.handles.remove(&handle).ok_or_else(bad)?;
                Ok(Reply::Entry(
                    self.entry(&path).ok_or_else(|| missing(&path))?,
                ))
            }
            Request::Stat { path, .. } => Ok(Reply::Entry(
                self.entry(&path).ok_or_else(|| missing(&path))?,
            )),
            Request::Remove { path, .. } => {
                self.files.remove(&path).ok_or_else(|| missing(&path))?;
                Ok(Reply::Done)
            }
            _ => Err(bad()),
        }
    }
}

/// Everything process `events` printed on stdout, up to its end (within 10 s).
pub async fn stdout_of(mut events: crate::agent::ProcStream) -> String {
    let mut out = Vec::new();
    let collect = async {
        while let Some(ev) = events.next().await {
            match ev {
                ProcEvent::Stdout(d) => out.extend(d),
                ProcEvent::End(_) => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), collect)
        .await
        .expect("the process's output ends");
    String::from_utf8(out).expect("UTF-8 output")
}
