//! The sandbox manager: creation, lookup under tenancy, timeouts, kill, usage figures.
//!
//! Tenancy is enforced here, not in the HTTP layer: every lookup takes the caller's team, and a
//! sandbox of another team is indistinguishable from one that does not exist
//! ([`CoreError::NotFound`]). Timeouts are enforced by one task per sandbox, which also notices
//! a sandbox whose agent died, and destroys it exactly like a kill.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use husk_proto::{Hello, Reply, Request, User, VERSION};
use husk_runtime::cgroup::SandboxCgroup;
use husk_runtime::service::SpawnerService;
use husk_runtime::{Limits, SandboxSpec};
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::agent::{AgentClient, CallError};
use crate::store::{Principal, SandboxRecord, Store};
use crate::template::{Resolved, TemplateError, Templates};

/// The envd API version whose features husk implements (the SDKs gate features on it).
pub const ENVD_VERSION: &str = "0.6.4";

/// Errors of the core, each mapped to one HTTP answer by the adapters.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// No such sandbox for this team (whether it exists for another team is not said).
    #[error("sandbox {0} not found")]
    NotFound(String),
    #[error("template '{0}' not found{hint}", hint = template_hint(.0))]
    TemplateNotFound(String),
    #[error("workspace '{0}' not found")]
    WorkspaceNotFound(String),
    /// The template exists but cannot be used (damaged image, failing ready check).
    #[error("{0}")]
    TemplateBroken(String),
    #[error("team {team} has reached its limit of {limit} concurrent sandboxes; kill one first")]
    QuotaExceeded { team: String, limit: u32 },
    #[error("{0}")]
    InvalidArgument(String),
    /// A feature husk does not offer (pause, snapshots, fork...).
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox could not be created.
    #[error("creating the sandbox failed: {0}")]
    Spawn(String),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// The host's available memory is below the server's reserve: no new sandbox until some
    /// is freed (the reserve keeps the server and the sandboxes it has out of a host-wide OOM).
    #[error(
        "the host has {available} MiB of memory available, below this server's reserve of \
         {reserve} MiB: no new sandbox until some is freed",
        available = .available >> 20,
        reserve = .reserve >> 20
    )]
    HostMemoryLow { available: u64, reserve: u64 },
}

/// What to do about a missing template the SDKs ask for by default.
fn template_hint(name: &str) -> &'static str {
    if name == crate::template::E2B_CODE_INTERPRETER {
        " (E2B's code-interpreter template is husk's 'code-interpreter' preset: build it with \
         scripts/build-templates)"
    } else {
        ""
    }
}

/// Server-wide settings of the manager.
#[derive(Debug, Clone)]
pub struct Config {
    /// Concurrent sandboxes per team unless the team has its own quota.
    pub default_quota: u32,
    /// Longest timeout a client may ask for.
    pub max_timeout: Duration,
    /// Resources of every sandbox.
    pub limits: Limits,
    /// Memory the host must have available (`MemAvailable`) for a new sandbox to be created:
    /// what the server and the sandboxes it has keep for themselves. 0: no reserve.
    pub memory_reserve: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_quota: 100,
            max_timeout: Duration::from_secs(24 * 3600),
            limits: Limits::default(),
            memory_reserve: DEFAULT_MEMORY_RESERVE,
        }
    }
}

/// The default [`Config::memory_reserve`].
pub const DEFAULT_MEMORY_RESERVE: u64 = 256 << 20;

/// The host's `MemAvailable` (what can be allocated without swapping), in bytes; `None` when
/// `/proc/meminfo` does not say.
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// What a client asks for when creating a sandbox.
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub template: String,
    pub timeout: Duration,
    pub metadata: BTreeMap<String, String>,
    pub env: Vec<(String, String)>,
    pub allow_internet_access: Option<bool>,
    /// The team's workspaces to mount (E2B `volumeMounts`, runs).
    pub workspaces: Vec<WorkspaceMount>,
    /// Resources of this sandbox, when not the server's (each at most the server's).
    pub limits: Option<Limits>,
    /// Egress policy; `None`: the server's default.
    pub network: Option<husk_net::NetPolicy>,
    /// E2B `network.allowPublicTraffic`: `Some(false)` makes the sandbox's ports private (they
    /// need its traffic token or a key of its team); unset is public, as on E2B.
    pub allow_public_traffic: Option<bool>,
}

/// A team's workspace mounted into a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceMount {
    /// The workspace's name.
    pub name: String,
    /// Absolute path inside the sandbox.
    pub path: String,
    /// Read-only unless asked for.
    pub writable: bool,
}

/// Sandbox paths a workspace may not be mounted on (or under): the sandbox's own kernel
/// interfaces and device nodes, which husk mounts itself.
const RESERVED_MOUNT_PATHS: &[&str] = &["/proc", "/dev", "/sys"];

/// Most workspaces one sandbox may mount.
pub const MAX_WORKSPACE_MOUNTS: usize = 16;

/// A workspace mount path: absolute, normalised (no `.`/`..`/empty components), not `/` and not
/// under a [`RESERVED_MOUNT_PATHS`] entry.
pub fn check_mount_path(path: &str) -> Result<(), String> {
    if !path.starts_with('/') {
        return Err(format!("mount path '{path}' must be absolute"));
    }
    let comps: Vec<&str> = path.split('/').skip(1).filter(|c| !c.is_empty()).collect();
    if comps.is_empty() {
        return Err("a workspace cannot be mounted on '/'".into());
    }
    if comps.iter().any(|c| *c == "." || *c == "..") || path.len() > 1024 || path.contains('\0') {
        return Err(format!("invalid mount path '{path}'"));
    }
    let norm = format!("/{}", comps.join("/"));
    if let Some(r) = RESERVED_MOUNT_PATHS
        .iter()
        .find(|r| norm == **r || norm.starts_with(&format!("{r}/")))
    {
        return Err(format!(
            "a workspace cannot be mounted on {r} (husk mounts it itself)"
        ));
    }
    Ok(())
}

/// A running sandbox.
pub struct LiveSandbox {
    pub id: String,
    pub team: String,
    pub template: String,
    pub runtime_id: String,
    pub agent: AgentClient,
    /// Required as `X-Access-Token` by the in-sandbox API, and the key of signed file URLs.
    pub access_token: String,
    pub env: Vec<(String, String)>,
    pub metadata: BTreeMap<String, String>,
    pub allow_internet_access: Option<bool>,
    pub started_at: OffsetDateTime,
    pub limits: Limits,
    /// The mounted workspaces.
    pub workspaces: Vec<WorkspaceMount>,
    /// The template's user: whom commands run as unless they say.
    pub default_user: User,
    /// The template's working directory, if it has one (else the user's home).
    pub default_workdir: Option<String>,
    /// Its code contexts (Jupyter kernels run by the agent).
    pub contexts: Arc<crate::contexts::Contexts>,
    /// The sandbox's link out through husk's router (None: loopback only, the server has no
    /// egress). Dropped with the sandbox, which removes the link and its rules.
    net: Option<husk_net::router::Attachment>,
    /// A credential of the sandbox's creator for its ports, sent as `E2B-Traffic-Access-Token`:
    /// it opens a private sandbox's servers, and the code interpreter (port 49999) of every
    /// sandbox. Every sandbox has one, public or not: the stock code-interpreter SDKs send
    /// nothing else with their `/contexts` calls, and port 49999 runs code as the sandbox's
    /// user, so it never admits a request for merely naming the sandbox.
    pub traffic_access_token: String,
    /// Whether the sandbox's own servers admit anyone who names the sandbox (E2B's
    /// `allowPublicTraffic`, the default) rather than only its traffic token or team.
    pub public_traffic: bool,
    /// PID 1 of the sandbox in the host's PID namespace (its root is `/proc/PID/root`).
    init_pid: i32,
    /// The sandbox's network namespace, held open from creation: ingress connects to the
    /// sandbox's servers from inside it.
    netns: husk_net::netns::NetNs,
    end_at: Mutex<OffsetDateTime>,
    timeout_changed: Notify,
    cgroup: SandboxCgroup,
    /// (when, cpu ns) of the previous metrics sample, for the CPU percentage.
    cpu_sample: Mutex<(Instant, u64)>,
    /// Secret values to mask in the output of processes that got them, by pid (so that a
    /// client reconnecting to such a process gets its output masked too). Bounded.
    redactions: Mutex<HashMap<u32, Vec<zeroize::Zeroizing<Vec<u8>>>>>,
}

/// Most processes per sandbox whose secrets are remembered for masking on reconnect.
const MAX_REDACTED_PROCESSES: usize = 256;

impl LiveSandbox {
    /// Remembers the secret values of process `pid` (for [`LiveSandbox::redaction`]).
    pub fn set_redaction(&self, pid: u32, values: Vec<zeroize::Zeroizing<Vec<u8>>>) {
        let mut map = self.redactions.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_REDACTED_PROCESSES {
            if let Some(k) = map.keys().min().copied() {
                map.remove(&k);
            }
        }
        map.insert(pid, values);
    }

    /// The secret values to mask in process `pid`'s output.
    pub fn redaction(&self, pid: u32) -> Vec<zeroize::Zeroizing<Vec<u8>>> {
        self.redactions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&pid)
            .cloned()
            .unwrap_or_default()
    }

    /// Freezes every process of the sandbox (before outputs are copied out of it).
    pub fn freeze(&self) -> Result<(), CoreError> {
        self.cgroup
            .freeze()
            .map_err(|e| CoreError::Spawn(format!("freeze sandbox {}: {e}", self.id)))
    }

    /// How many processes of the sandbox the kernel killed for want of memory.
    pub fn oom_kills(&self) -> u64 {
        self.cgroup.oom_kills()
    }

    /// The sandbox's root directory, opened from the host (`O_PATH`): paths below it must be
    /// resolved inside it (see `husk_runtime::transfer`), never by path on the host.
    pub fn root_dir(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_o_path_directory())
            .open(format!("/proc/{}/root", self.init_pid))?;
        Ok(f.into())
    }

    /// The sandbox's egress policy (`None` when it has no link out).
    pub fn network_policy(&self) -> husk_net::NetPolicy {
        self.net
            .as_ref()
            .map_or(husk_net::NetPolicy::None, |n| n.net.policy())
    }

    /// The connections its policy refused, oldest first (at most the last
    /// [`husk_net::sandboxes::MAX_DENIALS`]).
    pub fn denials(&self) -> Vec<husk_net::Denial> {
        self.net.as_ref().map_or_else(Vec::new, |n| n.net.denials())
    }

    /// The sandbox's network namespace (sockets made in it reach the sandbox's loopback).
    pub fn netns(&self) -> &husk_net::netns::NetNs {
        &self.netns
    }

    pub fn end_at(&self) -> OffsetDateTime {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_end_at(&self, t: OffsetDateTime) {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner()) = t;
        self.timeout_changed.notify_one();
    }

    /// CPUs of the sandbox's quota, rounded up.
    pub fn cpu_count(&self) -> u32 {
        self.limits.cpu_millis.div_ceil(1000).max(1) as u32
    }

    pub fn memory_mb(&self) -> u64 {
        self.limits.memory_bytes >> 20
    }

    pub fn disk_mb(&self) -> u64 {
        self.limits.disk_bytes >> 20
    }
}

/// One usage sample.
#[derive(Debug, Clone, Copy)]
pub struct Metrics {
    pub timestamp: OffsetDateTime,
    pub cpu_count: u32,
    pub cpu_used_pct: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// Filters of a list call.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub metadata: Vec<(String, String)>,
    pub template: Option<String>,
    pub started_after: Option<OffsetDateTime>,
}

/// A place in a team's quota held while one of its sandboxes is being created.
struct Reservation {
    manager: Arc<Manager>,
    team: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut creating = self
            .manager
            .creating
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = creating.get_mut(&self.team) {
            *n = n.saturating_sub(1);
        }
    }
}

/// The manager.
pub struct Manager {
    store: Arc<Store>,
    spawner: Arc<SpawnerService>,
    config: Config,
    sandboxes: RwLock<HashMap<String, Arc<LiveSandbox>>>,
    /// Sandboxes being created, per team (they count against the quota).
    creating: Mutex<HashMap<String, u32>>,
    templates: Arc<Templates>,
    /// Teams' secrets, once the server has loaded its master key.
    secrets: std::sync::OnceLock<Arc<crate::secrets::Secrets>>,
    /// Teams' workspaces, once the server has opened them.
    workspaces: std::sync::OnceLock<Arc<crate::workspaces::Workspaces>>,
    /// Sandbox egress, once the server has started its router (else loopback only).
    network: std::sync::OnceLock<Network>,
}

/// The server's sandbox networking and its default policy.
#[derive(Debug)]
pub struct Network {
    pub service: Arc<husk_net::service::NetService>,
    pub default: husk_net::NetPolicy,
}

/// `O_PATH | O_DIRECTORY`: opens a directory to resolve paths below it, without reading it.
fn libc_o_path_directory() -> i32 {
    husk_runtime::libc::O_PATH | husk_runtime::libc::O_DIRECTORY
}

fn random_string(alphabet: &[u8], len: usize) -> Result<String, CoreError> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes)
        .map_err(|e| CoreError::Spawn(format!("kernel random number generator: {e}")))?;
    Ok(bytes
        .iter()
        .map(|b| alphabet[*b as usize % alphabet.len()] as char)
        .collect())
}

/// A new sandbox id: 20 characters of `[a-z0-9]` (what clients' routing expects).
pub fn new_sandbox_id() -> Result<String, CoreError> {
    random_string(b"abcdefghijklmnopqrstuvwxyz0123456789", 20)
}

/// Largest total size of a sandbox's environment variables (names and values): they travel
/// to the agent in one frame and into every process's environment.
pub const MAX_ENV_BYTES: usize = 256 << 10;

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl Manager {
    /// A manager over a started spawner. Forgets records of sandboxes a crashed earlier run
    /// left (the spawner has already reaped what they left on the host).
    pub fn new(
        store: Arc<Store>,
        spawner: Arc<SpawnerService>,
        config: Config,
    ) -> Result<Arc<Manager>, CoreError> {
        let stale = store.clear_sandboxes()?;
        if stale > 0 {
            tracing::info!(count = stale, "forgot sandboxes of an earlier run");
        }
        Ok(Arc::new(Manager {
            templates: Arc::new(Templates::new(store.clone())),
            secrets: std::sync::OnceLock::new(),
            workspaces: std::sync::OnceLock::new(),
            network: std::sync::OnceLock::new(),
            store,
            spawner,
            config,
            sandboxes: RwLock::new(HashMap::new()),
            creating: Mutex::new(HashMap::new()),
        }))
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Enables `husk-secret://` references in sandboxes' environments.
    pub fn set_secrets(&self, secrets: Arc<crate::secrets::Secrets>) {
        let _ = self.secrets.set(secrets);
    }

    /// Teams' secrets, if enabled.
    pub fn secrets(&self) -> Option<&Arc<crate::secrets::Secrets>> {
        self.secrets.get()
    }

    /// Enables workspace mounts.
    pub fn set_workspaces(&self, workspaces: Arc<crate::workspaces::Workspaces>) {
        let _ = self.workspaces.set(workspaces);
    }

    /// Gives sandboxes links out through `service`, under `default` unless they ask.
    pub fn set_network(
        &self,
        service: Arc<husk_net::service::NetService>,
        default: husk_net::NetPolicy,
    ) {
        let _ = self.network.set(Network { service, default });
    }

    /// Sandbox networking, if enabled.
    pub fn network(&self) -> Option<&Network> {
        self.network.get()
    }

    /// The policy a create request gets: its own or the server's default; with no egress on
    /// this server, asking for any is an error (a sandbox never silently gets less isolation
    /// or less network than it asked for), and the default is no network.
    pub fn request_policy(
        &self,
        asked: Option<&husk_net::NetPolicy>,
    ) -> Result<husk_net::NetPolicy, CoreError> {
        match (self.network.get(), asked) {
            (Some(_), Some(p)) => Ok(p.clone()),
            (Some(n), None) => Ok(n.default.clone()),
            (None, None) | (None, Some(husk_net::NetPolicy::None)) => Ok(husk_net::NetPolicy::None),
            (None, Some(_)) => Err(CoreError::Unsupported(
                "this server gives sandboxes no network (start husk serve with --egress host or \
                 --egress netns:...); ask for no network or leave it out"
                    .into(),
            )),
        }
    }

    /// Changes a running sandbox's egress policy.
    pub async fn set_network_policy(
        &self,
        who: &Principal,
        id: &str,
        policy: husk_net::NetPolicy,
    ) -> Result<(), CoreError> {
        let sb = self.get(who, id)?;
        if sb.net.is_none() {
            if policy == husk_net::NetPolicy::None {
                return Ok(());
            }
            return Err(CoreError::Unsupported(
                "this server gives sandboxes no network (start husk serve with --egress)".into(),
            ));
        }
        tokio::task::spawn_blocking(move || match &sb.net {
            Some(net) => net.set_policy(policy),
            None => Ok(()),
        })
        .await
        .map_err(|e| CoreError::Spawn(e.to_string()))?
        .map_err(|e| CoreError::Spawn(e.to_string()))
    }

    /// Teams' workspaces, if enabled.
    pub fn workspaces(&self) -> Option<&Arc<crate::workspaces::Workspaces>> {
        self.workspaces.get()
    }

    /// The longest timeout a client may ask for.
    pub fn max_timeout(&self) -> Duration {
        self.config.max_timeout
    }

    /// The server's resources for each sandbox (the most a request may ask for).
    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// Resolves workspace mounts of `team` to host bind mounts (id-mapped, so the workspace's
    /// files are the sandbox user's); every error names the workspace or path.
    fn workspace_mounts(
        &self,
        team: &str,
        mounts: &[WorkspaceMount],
    ) -> Result<Vec<husk_runtime::MountSpec>, CoreError> {
        if mounts.is_empty() {
            return Ok(Vec::new());
        }
        if mounts.len() > MAX_WORKSPACE_MOUNTS {
            return Err(CoreError::InvalidArgument(format!(
                "at most {MAX_WORKSPACE_MOUNTS} workspaces per sandbox"
            )));
        }
        let Some(ws) = self.workspaces() else {
            return Err(CoreError::InvalidArgument(
                "workspaces are not enabled on this server".into(),
            ));
        };
        let mut out: Vec<husk_runtime::MountSpec> = Vec::new();
        for m in mounts {
            check_mount_path(&m.path).map_err(CoreError::InvalidArgument)?;
            let sandbox = std::path::PathBuf::from(&m.path);
            if out.iter().any(|o| o.sandbox == sandbox) {
                return Err(CoreError::InvalidArgument(format!(
                    "two workspaces are mounted on {}",
                    m.path
                )));
            }
            let host = ws.dir(team, &m.name).map_err(|e| match e {
                crate::workspaces::WorkspaceError::NotFound(_) => {
                    CoreError::WorkspaceNotFound(m.name.clone())
                }
                other => CoreError::InvalidArgument(other.to_string()),
            })?;
            out.push(husk_runtime::MountSpec {
                host,
                sandbox,
                writable: m.writable,
                ids: husk_runtime::MountIds::Shared,
            });
        }
        Ok(out)
    }

    /// `req` within the server's limits (each resource at most the server's).
    pub fn request_limits(&self, req: Option<&Limits>) -> Result<Limits, CoreError> {
        let max = &self.config.limits;
        let Some(l) = req else {
            return Ok(max.clone());
        };
        let over = |what: &str, got: u64, max: u64| {
            Err(CoreError::InvalidArgument(format!(
                "{what} {got} is more than this server allows ({max})"
            )))
        };
        if l.memory_bytes > max.memory_bytes {
            return over("memory (bytes)", l.memory_bytes, max.memory_bytes);
        }
        if l.cpu_millis > max.cpu_millis {
            return over("cpu (millicpus)", l.cpu_millis, max.cpu_millis);
        }
        if l.disk_bytes > max.disk_bytes {
            return over("disk (bytes)", l.disk_bytes, max.disk_bytes);
        }
        if l.pids > max.pids {
            return over("pids", l.pids, max.pids);
        }
        Ok(l.clone())
    }

    /// The template `name`, checked (its image is hashed the first time this process uses
    /// it, off the async threads).
    pub async fn resolve_template(&self, name: &str) -> Result<Resolved, CoreError> {
        let templates = self.templates.clone();
        let name = name.to_owned();
        tokio::task::spawn_blocking(move || templates.resolve(&name))
            .await
            .map_err(|e| CoreError::Spawn(e.to_string()))?
            .map_err(|e| match e {
                TemplateError::NotFound(n) => CoreError::TemplateNotFound(n),
                TemplateError::Store(e) => CoreError::Store(e),
                other => CoreError::TemplateBroken(other.to_string()),
            })
    }

    /// The store, shared (for the services beside the manager: secrets).
    pub fn store_arc(&self) -> Arc<Store> {
        self.store.clone()
    }

    fn quota(&self, team: &str) -> u32 {
        self.store
            .team_quota(team)
            .ok()
            .flatten()
            .unwrap_or(self.config.default_quota)
    }

    /// Clamps a requested timeout to (0, max].
    fn clamp_timeout(&self, t: Duration) -> Duration {
        t.clamp(Duration::from_secs(1), self.config.max_timeout)
    }

    /// Creates a sandbox for `who`'s team.
    pub async fn create(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let mut env_bytes = 0;
        for (k, v) in &req.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(CoreError::InvalidArgument(format!(
                    "invalid environment variable name '{k}'"
                )));
            }
            if v.contains('\0') {
                return Err(CoreError::InvalidArgument(format!(
                    "environment variable '{k}' contains a NUL byte"
                )));
            }
            env_bytes += k.len() + v.len() + 2;
        }
        if env_bytes > MAX_ENV_BYTES {
            return Err(CoreError::InvalidArgument(format!(
                "environment variables take {env_bytes} bytes, more than the limit of {MAX_ENV_BYTES}"
            )));
        }
        // `husk-secret://NAME` values must name secrets of the team (resolved per process).
        if req
            .env
            .iter()
            .any(|(_, v)| v.starts_with(crate::secrets::SECRET_PREFIX))
        {
            let Some(secrets) = self.secrets() else {
                return Err(CoreError::InvalidArgument(
                    "secrets are not enabled on this server".into(),
                ));
            };
            secrets
                .check_refs(&who.team, &req.env)
                .map_err(|e| match e {
                    crate::secrets::SecretError::Store(e) => CoreError::Store(e),
                    other => CoreError::InvalidArgument(other.to_string()),
                })?;
        }
        let mounts = self.workspace_mounts(&who.team, &req.workspaces)?;
        let limits = self.request_limits(req.limits.as_ref())?;
        self.check_memory_reserve()?;
        // May hash the image the first time this process uses it.
        let template = self.resolve_template(&req.template).await?;
        // Reserve a place in the team's quota for the time of the creation.
        {
            let limit = self.quota(&who.team);
            let live = read(&self.sandboxes)
                .values()
                .filter(|s| s.team == who.team)
                .count() as u32;
            let mut creating = self.creating.lock().unwrap_or_else(|p| p.into_inner());
            let pending = creating.entry(who.team.clone()).or_default();
            if live + *pending >= limit {
                return Err(CoreError::QuotaExceeded {
                    team: who.team.clone(),
                    limit,
                });
            }
            *pending += 1;
        }
        let reservation = Reservation {
            manager: self.clone(),
            team: who.team.clone(),
        };
        // In a task of its own: a client that goes away mid-create must not abandon a
        // half-made sandbox (it is finished, registered and later ends at its timeout).
        let this = self.clone();
        let who = who.clone();
        tokio::spawn(async move {
            let result = this
                .create_reserved(&who, req, template, mounts, limits)
                .await;
            drop(reservation);
            result
        })
        .await
        .map_err(|e| CoreError::Spawn(e.to_string()))?
    }

    /// Refuses a create while the host has less memory available than the reserve.
    fn check_memory_reserve(&self) -> Result<(), CoreError> {
        let reserve = self.config.memory_reserve;
        if reserve == 0 {
            return Ok(());
        }
        match host_memory_available() {
            Some(available) if available < reserve => {
                Err(CoreError::HostMemoryLow { available, reserve })
            }
            _ => Ok(()),
        }
    }

    async fn create_reserved(
        self: &Arc<Self>,
        who: &Principal,
        req: CreateRequest,
        template: Resolved,
        mounts: Vec<husk_runtime::MountSpec>,
        limits: Limits,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let id = new_sandbox_id()?;
        let mut spec = SandboxSpec::idle();
        spec.agent = true;
        spec.hostname = id.clone();
        spec.limits = limits.clone();
        spec.mounts = mounts;
        spec.rootfs = template.rootfs.clone();
        let defaults = &template.defaults;
        let policy = self.request_policy(req.network.as_ref())?;
        let spawner = self.spawner.clone();
        let service = self.network.get().map(|n| n.service.clone());
        let (created, net) = tokio::task::spawn_blocking(move || {
            // A link out from the router's pool, joined by the sandbox (with the router's
            // resolver as its name server).
            let net = match service {
                Some(s) => Some(
                    s.attach(policy)
                        .map_err(|e| CoreError::Spawn(e.to_string()))?,
                ),
                None => None,
            };
            if let Some(n) = &net {
                spec.network = husk_runtime::NetworkMode::Joined {
                    nameserver: n.gateway(),
                };
            }
            let created = spawner
                .create_in(&spec, net.as_ref().map(|n| n.netns.fd()))
                .map_err(|e| CoreError::Spawn(e.to_string()))?;
            Ok::<_, CoreError>((created, net))
        })
        .await
        .map_err(|e| CoreError::Spawn(e.to_string()))??;
        let runtime_id = created.id.clone();
        let init_pid = created.init_pid;
        // The joined namespace, or the sandbox's own, opened now while PID 1 is certainly the
        // sandbox's (the spawner reaps it only on destroy), and kept: ingress never resolves
        // the namespace by pid again.
        let opened = match &net {
            Some(n) => Ok(n.netns.clone()),
            None => husk_net::netns::NetNs::open(std::path::Path::new(&format!(
                "/proc/{init_pid}/ns/net"
            ))),
        };
        let netns = match opened {
            Ok(ns) => ns,
            Err(e) => {
                self.destroy_runtime(runtime_id).await;
                return Err(CoreError::Spawn(format!("sandbox network namespace: {e}")));
            }
        };
        // The template's environment, then the request's (which wins).
        let mut env: Vec<(String, String)> = defaults
            .env
            .iter()
            .filter(|(k, _)| !req.env.iter().any(|(rk, _)| rk == k))
            .cloned()
            .collect();
        env.extend(req.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let default_user = match defaults.user.as_deref() {
            Some("root") => User::Root,
            _ => User::User,
        };
        let hello = Hello {
            version: VERSION,
            env,
            default_user,
            default_workdir: defaults.workdir.clone(),
        };
        let agent = match AgentClient::connect(created.agent, hello).await {
            Ok(a) => a,
            Err(e) => {
                self.destroy_runtime(runtime_id).await;
                return Err(CoreError::Spawn(format!("agent did not start: {e}")));
            }
        };
        if let Err(e) = crate::start_cmd::run(&agent, &template, default_user).await {
            agent.close().await;
            self.destroy_runtime(runtime_id).await;
            return Err(CoreError::TemplateBroken(e));
        }
        let contexts = match self
            .start_contexts(&agent, &who.team, &req.env, &template, default_user)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                agent.close().await;
                self.destroy_runtime(runtime_id).await;
                return Err(e);
            }
        };
        let now = OffsetDateTime::now_utc();
        let timeout = self.clamp_timeout(req.timeout);
        let sb = Arc::new(LiveSandbox {
            id: id.clone(),
            team: who.team.clone(),
            template: req.template,
            runtime_id,
            agent,
            access_token: random_string(b"0123456789abcdef", 40)?,
            traffic_access_token: random_string(b"0123456789abcdef", 40)?,
            public_traffic: req.allow_public_traffic != Some(false),
            env: req.env,
            metadata: req.metadata,
            allow_internet_access: req.allow_internet_access,
            started_at: now,
            limits,
            workspaces: req.workspaces,
            default_user,
            default_workdir: defaults.workdir.clone(),
            contexts,
            init_pid,
            netns,
            net,
            end_at: Mutex::new(now + timeout),
            timeout_changed: Notify::new(),
            cgroup: created.cgroup,
            cpu_sample: Mutex::new((Instant::now(), 0)),
            redactions: Mutex::new(HashMap::new()),
        });
        let record = SandboxRecord {
            id: id.clone(),
            team: sb.team.clone(),
            template: sb.template.clone(),
            runtime_id: sb.runtime_id.clone(),
            created_at: now,
            end_at: sb.end_at(),
            metadata: sb.metadata.clone(),
        };
        if let Err(e) = self.store.insert_sandbox(&record) {
            tracing::warn!(sandbox = %id, error = %e, "could not record sandbox");
        }
        write(&self.sandboxes).insert(id.clone(), sb.clone());
        tokio::spawn(self.clone().supervise(sb.clone()));
        Ok(sb)
    }

    /// The sandbox's code contexts, with the template's default ones started and ready.
    async fn start_contexts(
        &self,
        agent: &AgentClient,
        team: &str,
        req_env: &[(String, String)],
        template: &Resolved,
        user: User,
    ) -> Result<Arc<crate::contexts::Contexts>, CoreError> {
        let defaults = &template.defaults;
        // Kernels get the sandbox's secrets in their process environment, as commands do.
        let mut secret_envs = Vec::new();
        if req_env
            .iter()
            .any(|(_, v)| v.starts_with(crate::secrets::SECRET_PREFIX))
        {
            if let Some(secrets) = self.secrets() {
                let mut none = Vec::new();
                let inj = secrets
                    .inject(team, req_env, &mut none)
                    .map_err(|e| CoreError::InvalidArgument(e.to_string()))?;
                secret_envs = inj.env;
            }
        }
        let cwd = defaults
            .workdir
            .clone()
            .unwrap_or_else(|| user.home().to_owned());
        let contexts = Arc::new(crate::contexts::Contexts::new(
            agent.clone(),
            crate::contexts::KernelEnv { user, secret_envs },
            cwd,
        ));
        for lang in &defaults.contexts {
            contexts.default_for(lang).await.map_err(|e| {
                CoreError::TemplateBroken(format!(
                    "template '{}': its {lang} context did not start: {e}",
                    template.name
                ))
            })?;
        }
        Ok(contexts)
    }

    /// Ends the sandbox at its timeout, or when its agent dies.
    async fn supervise(self: Arc<Self>, sb: Arc<LiveSandbox>) {
        loop {
            let left = sb.end_at() - OffsetDateTime::now_utc();
            if left <= time::Duration::ZERO {
                tracing::info!(sandbox = %sb.id, "timeout: destroying sandbox");
                break;
            }
            let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
            tokio::select! {
                _ = tokio::time::sleep(left) => {}
                _ = sb.timeout_changed.notified() => {}
                _ = sb.agent.closed() => {
                    tracing::info!(sandbox = %sb.id, "agent gone: destroying sandbox");
                    break;
                }
            }
        }
        self.remove(&sb.id).await;
    }

    async fn destroy_runtime(&self, runtime_id: String) {
        let spawner = self.spawner.clone();
        let res = tokio::task::spawn_blocking(move || spawner.destroy(&runtime_id)).await;
        if let Ok(Err(e)) = res {
            tracing::warn!(error = %e, "destroying sandbox failed");
        }
    }

    /// Removes and destroys a sandbox (no tenancy check). Idempotent.
    async fn remove(&self, id: &str) -> bool {
        let Some(sb) = write(&self.sandboxes).remove(id) else {
            return false;
        };
        sb.agent.close().await;
        self.destroy_runtime(sb.runtime_id.clone()).await;
        let _ = self.store.delete_sandbox(id);
        true
    }

    /// A live sandbox of `who`'s team.
    pub fn get(&self, who: &Principal, id: &str) -> Result<Arc<LiveSandbox>, CoreError> {
        read(&self.sandboxes)
            .get(id)
            .filter(|s| s.team == who.team)
            .cloned()
            .ok_or_else(|| CoreError::NotFound(id.to_string()))
    }

    /// A live sandbox by id alone (the in-sandbox API authenticates by the sandbox's access
    /// token instead of an API key).
    pub fn get_any(&self, id: &str) -> Option<Arc<LiveSandbox>> {
        read(&self.sandboxes).get(id).cloned()
    }

    /// The team's sandboxes matching `filter`, oldest first.
    pub fn list(&self, who: &Principal, filter: &ListFilter) -> Vec<Arc<LiveSandbox>> {
        let mut v: Vec<Arc<LiveSandbox>> = read(&self.sandboxes)
            .values()
            .filter(|s| s.team == who.team)
            .filter(|s| {
                filter
                    .metadata
                    .iter()
                    .all(|(k, v)| s.metadata.get(k) == Some(v))
            })
            .filter(|s| filter.template.as_ref().is_none_or(|t| &s.template == t))
            .filter(|s| filter.started_after.is_none_or(|t| s.started_at > t))
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.started_at, &a.id).cmp(&(b.started_at, &b.id)));
        v
    }

    /// Kills a sandbox of `who`'s team.
    pub async fn kill(&self, who: &Principal, id: &str) -> Result<(), CoreError> {
        self.get(who, id)?;
        if self.remove(id).await {
            Ok(())
        } else {
            Err(CoreError::NotFound(id.to_string()))
        }
    }

    /// Sets the sandbox to end `timeout` from now (may shorten).
    pub fn set_timeout(
        &self,
        who: &Principal,
        id: &str,
        timeout: Duration,
    ) -> Result<(), CoreError> {
        let sb = self.get(who, id)?;
        let end = OffsetDateTime::now_utc() + self.clamp_timeout(timeout);
        sb.set_end_at(end);
        let _ = self.store.update_sandbox_end(id, end);
        Ok(())
    }

    /// Connecting extends the timeout to `timeout` from now, never shortens it.
    pub fn connect(
        &self,
        who: &Principal,
        id: &str,
        timeout: Duration,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let sb = self.get(who, id)?;
        let end = OffsetDateTime::now_utc() + self.clamp_timeout(timeout);
        if end > sb.end_at() {
            sb.set_end_at(end);
            let _ = self.store.update_sandbox_end(id, end);
        }
        Ok(sb)
    }

    /// A usage sample: memory and CPU from the cgroups, disk from the agent.
    pub async fn metrics(&self, who: &Principal, id: &str) -> Result<Metrics, CoreError> {
        let sb = self.get(who, id)?;
        let st = sb.cgroup.stats();
        let now = Instant::now();
        let cpu_used_pct = {
            let mut prev = sb.cpu_sample.lock().unwrap_or_else(|p| p.into_inner());
            let wall = now.duration_since(prev.0).as_nanos().max(1) as f64;
            let used = st.cpu_usage_ns.saturating_sub(prev.1) as f64;
            *prev = (now, st.cpu_usage_ns);
            (used / wall / sb.cpu_count() as f64 * 100.0).clamp(0.0, 100.0)
        };
        let (disk_used, disk_total) = match sb.agent.call(Request::Disk).await {
            Ok(Reply::Disk { used, total }) => (used, total),
            Ok(_) | Err(CallError::Agent(_)) => (0, sb.limits.disk_bytes),
            Err(CallError::Gone) => return Err(CoreError::NotFound(id.to_string())),
        };
        Ok(Metrics {
            timestamp: OffsetDateTime::now_utc(),
            cpu_count: sb.cpu_count(),
            cpu_used_pct,
            mem_used: st.memory_bytes,
            mem_total: sb.limits.memory_bytes,
            mem_cache: st.memory_cache,
            disk_used,
            disk_total,
        })
    }

    /// How many sandboxes are alive.
    pub fn count(&self) -> usize {
        read(&self.sandboxes).len()
    }

    /// Destroys every sandbox (server shutdown).
    pub async fn shutdown(&self) {
        let ids: Vec<String> = read(&self.sandboxes).keys().cloned().collect();
        for id in ids {
            self.remove(&id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_from_meminfo() {
        let meminfo = "MemTotal:       24536320 kB\nMemFree:        1 kB\n\
                       MemAvailable:   23000000 kB\nBuffers: 5 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(23_000_000 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        // This host's own, in a sane range.
        let here = host_memory_available().unwrap();
        assert!(here > 0 && here < 1 << 50);
    }
}
