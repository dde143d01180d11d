//! The sandbox manager: creation, lookup under tenancy, timeouts, kill, usage figures.
//!
//! Tenancy is enforced here, not in the HTTP layer: every lookup takes the caller's team, and a
//! sandbox of another team is indistinguishable from one that does not exist
//! ([`CoreError::NotFound`]). Timeouts are enforced by one task per sandbox, which also notices
//! a sandbox whose agent died, and destroys it exactly like a kill.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use husk_runtime::failure::FailureKind;
use husk_runtime::service::ServiceError;
use husk_runtime::Limits;

use crate::host::SandboxHost;
use crate::store::Store;
use crate::template::{Resolved, TemplateError, Templates};

mod create;
mod kept;
#[cfg(test)]
mod kept_tests;
mod limits;
mod live;
mod lookup;
mod metrics;
mod pause;
#[cfg(test)]
mod pause_tests;
mod pool;
#[cfg(test)]
mod pool_tests;
mod request;
mod saved;
mod server_stats;
mod snapshot;
#[cfg(test)]
mod snapshot_tests;
mod supervise;
#[cfg(test)]
mod tests;

pub use create::new_sandbox_id;
use create::Identity;
pub use kept::{Running, TakenUp, RUNNING_VERSION};
pub use limits::{host_memory_available, host_memory_total};
pub use live::{CreatePhases, LiveSandbox, Metrics};
pub use lookup::{ListFilter, LostInfo, SandboxView};
pub use metrics::{TimeRange, DISK_EVERY, SAMPLES_KEPT, SAMPLE_EVERY};
pub use pause::{Credentials, Dormant, Inactive, Paused};
pub use pool::{MemoryProbe, PoolStats, WarmTarget, MAX_WARM};
pub use request::{
    check_mount_path, CreateRequest, EnvVars, Lifecycle, MaskedHost, OnTimeout, PauseMode,
    WorkspaceMount, MAX_ENV_BYTES, MAX_WORKSPACE_MOUNTS,
};
pub use saved::{Description, DESCRIPTION_VERSION};
pub use server_stats::{
    CreateFailure, CreateFigures, CreateSource, DurationFigures, EndReason, ServerStats,
    CREATE_BUCKETS,
};
pub use snapshot::{
    canonical_name, Snapshot, SnapshotFilter, SnapshotState, DEFAULT_SNAPSHOT_QUOTA, MAX_FORKS,
};

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
    #[error("team {team} has reached its limit of {limit} paused sandboxes; kill one first")]
    PausedQuotaExceeded { team: String, limit: u32 },
    /// The sandbox is paused and the call needs it running.
    #[error("team {team} has reached its limit of {limit} snapshots; delete one first")]
    SnapshotQuotaExceeded { team: String, limit: u32 },
    #[error("sandbox {id} was lost at {at}: {reason}")]
    Lost {
        id: String,
        at: String,
        reason: String,
    },
    #[error("sandbox {0} is paused; resume it with Sandbox.connect()")]
    Paused(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// A feature husk does not offer (pause, snapshots, fork...).
    #[error("{0}")]
    Unsupported(String),
    /// The runtime could not create the sandbox (the spawner's failure, typed by kind).
    #[error("the sandbox runtime failed")]
    Runtime(#[source] ServiceError),
    /// The host ran out of something sandboxes need (uid ranges, memory, processes): the same
    /// request may succeed later.
    #[error("the host cannot take another sandbox now")]
    HostExhausted(#[source] ServiceError),
    /// Something of the server's own failed (a task, the network service, a sandbox's agent).
    #[error("{what}")]
    Internal {
        what: String,
        #[source]
        source: BoxError,
    },
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

/// Any error, as the cause of [`CoreError::Internal`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl CoreError {
    /// [`CoreError::Internal`]: `what` failed, because of `source`.
    pub fn internal(what: impl Into<String>, source: impl Into<BoxError>) -> CoreError {
        CoreError::Internal {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// A spawner's failure as the core reports it: by its kind, so that a bad request, a broken
/// template and a full host each get their own answer.
impl From<ServiceError> for CoreError {
    fn from(e: ServiceError) -> CoreError {
        match &e {
            ServiceError::Failed(f) => match f.kind {
                FailureKind::InvalidSpec => CoreError::InvalidArgument(f.message.clone()),
                FailureKind::Template => CoreError::TemplateBroken(f.message.clone()),
                FailureKind::Exhausted => CoreError::HostExhausted(e),
                FailureKind::Host | FailureKind::NotFound | FailureKind::Internal => {
                    CoreError::Runtime(e)
                }
            },
            ServiceError::TooLarge(_) => CoreError::InvalidArgument(e.to_string()),
            ServiceError::OutOfDescriptors => CoreError::HostExhausted(e),
            ServiceError::Gone | ServiceError::Protocol(_) | ServiceError::Io(_) => {
                CoreError::Runtime(e)
            }
        }
    }
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
    /// Paused sandboxes per team (in place and on disk together).
    pub paused_quota: u32,
    /// How long a sandbox may stay paused before it is killed; `None`: until killed.
    pub paused_retention: Option<Duration>,
    /// Snapshots per team (those listed; retired ones are kept only while used).
    pub snapshot_quota: u32,
    /// Whether running sandboxes outlive the server (a crash, an upgrade) for the next one
    /// to take up (`kept.rs`); `false` (`husk serve --destroy-on-exit`): they end with it.
    pub keep: bool,
    /// Warm pools: per template, sandboxes made ahead of demand (`pool.rs`).
    pub warm: Vec<WarmTarget>,
    /// Below this much available host memory the pools stop filling and give their warm
    /// sandboxes back (0: never).
    pub warm_memory_floor: u64,
    /// The first characters of every sandbox id this server makes: a cluster node's code,
    /// by which gateways route (empty on a server of its own).
    pub id_prefix: String,
    /// A cluster's node: its images directory, where every template's image is found by
    /// digest (see [`crate::template::Templates::with_local_images`]).
    pub local_images: Option<std::path::PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_quota: 100,
            max_timeout: Duration::from_secs(24 * 3600),
            limits: Limits::default(),
            memory_reserve: DEFAULT_MEMORY_RESERVE,
            paused_quota: DEFAULT_PAUSED_QUOTA,
            paused_retention: None,
            snapshot_quota: DEFAULT_SNAPSHOT_QUOTA,
            keep: true,
            warm: Vec::new(),
            warm_memory_floor: 2 * DEFAULT_MEMORY_RESERVE,
            id_prefix: String::new(),
            local_images: None,
        }
    }
}

/// How long a lost sandbox stays known (its team is told what became of it).
pub const LOST_KEPT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why a sandbox an earlier server left running is lost when the next one starts without it:
/// it did not outlive that server.
const LOST_IN_A_CRASH: &str = "it ended while no husk server ran (the host restarted, its \
    processes were killed, or the server ran with --destroy-on-exit and did not stop in \
    order); its processes and files are gone";

/// Why running sandboxes are lost at an orderly stop.
pub(crate) const LOST_AT_STOP: &str = "the server that ran it was stopped with \
    --destroy-on-exit, which ends running sandboxes (without it they keep running for the \
    next server)";

/// The default [`Config::paused_quota`].
pub const DEFAULT_PAUSED_QUOTA: u32 = 1000;

/// The default [`Config::memory_reserve`].
pub const DEFAULT_MEMORY_RESERVE: u64 = 256 << 20;

/// The manager.
pub struct Manager {
    store: Arc<Store>,
    host: Arc<dyn SandboxHost>,
    config: Config,
    sandboxes: RwLock<HashMap<String, Arc<LiveSandbox>>>,
    /// Sandboxes being created, per team (they count against the quota).
    creating: Mutex<HashMap<String, u32>>,
    templates: Arc<Templates>,
    /// A cluster's node: where images of templates built on other nodes come from.
    image_source: std::sync::OnceLock<Arc<dyn crate::template::ImageSource>>,
    /// Teams' secrets, once the server has loaded its master key.
    secrets: std::sync::OnceLock<Arc<crate::secrets::Secrets>>,
    /// Teams' workspaces, once the server has opened them.
    workspaces: std::sync::OnceLock<Arc<crate::workspaces::Workspaces>>,
    /// Sandbox egress, once the server has started its router (else loopback only).
    network: std::sync::OnceLock<Network>,
    /// Sandboxes paused to disk, by id.
    dormant: RwLock<pause::DormantMap>,
    /// Where paused sandboxes' files are saved, once the server has its files helper.
    layer_store: std::sync::OnceLock<pause::LayerStore>,
    /// Teams' snapshots, and what stands on them.
    snapshots: Mutex<snapshot::SnapshotTable>,
    /// Held while snapshots nothing stands on are removed (`collect_snapshots`).
    collecting: tokio::sync::Mutex<()>,
    /// Per team, the places among layer copies under way (`Manager::capture_slot`).
    capture_slots: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// Warm pools (`pool.rs`).
    pools: pool::Pools,
    /// How creates and sandboxes ended, for the operator's metrics (`server_stats.rs`).
    counters: server_stats::Counters,
}

/// The server's sandbox networking (the network helper) and its default policy.
#[derive(Debug)]
pub struct Network {
    pub helper: Arc<husk_net::helper::NetHelper>,
    pub default: husk_net::NetPolicy,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

impl Manager {
    /// A manager over a started spawner (or another [`SandboxHost`]). Forgets records of
    /// sandboxes a crashed earlier run left as lost (the spawner has already reaped what they
    /// left on the host), and forgets those lost longer than [`LOST_KEPT`] ago.
    pub fn new(
        store: Arc<Store>,
        host: Arc<dyn SandboxHost>,
        config: Config,
    ) -> Result<Arc<Manager>, CoreError> {
        let now = time::OffsetDateTime::now_utc();
        // What the spawner took up is taken up by `take_up`; the rest of the records are of
        // sandboxes that did not outlive the earlier server.
        let adopted: std::collections::HashSet<String> = host.adopted().into_iter().collect();
        let (mut stale, mut over) = (0, 0);
        for rec in store.list_sandboxes()? {
            if adopted.contains(&rec.runtime_id) {
                continue;
            }
            match kept::lost_reason(&rec, now) {
                Some(reason) => {
                    store.mark_sandbox_lost(&rec.id, reason, now)?;
                    stale += 1;
                }
                None => {
                    store.delete_sandbox(&rec.id)?;
                    over += 1;
                }
            }
        }
        if stale > 0 {
            tracing::warn!(
                count = stale,
                "sandboxes of an earlier run did not outlive it; they are listed as lost \
                 (husk sandbox list --state lost)"
            );
        }
        if over > 0 {
            tracing::info!(
                count = over,
                "sandboxes of an earlier run reached their timeout meanwhile"
            );
        }
        let pruned = store.prune_lost_sandboxes(now - LOST_KEPT)?;
        if pruned > 0 {
            tracing::info!(count = pruned, "forgot sandboxes lost more than a week ago");
        }
        Ok(Arc::new(Manager {
            templates: Arc::new(
                Templates::new(store.clone()).with_local_images(config.local_images.clone()),
            ),
            image_source: std::sync::OnceLock::new(),
            secrets: std::sync::OnceLock::new(),
            workspaces: std::sync::OnceLock::new(),
            network: std::sync::OnceLock::new(),
            dormant: RwLock::new(HashMap::new()),
            layer_store: std::sync::OnceLock::new(),
            snapshots: Mutex::new(snapshot::SnapshotTable::default()),
            collecting: tokio::sync::Mutex::new(()),
            capture_slots: Mutex::new(HashMap::new()),
            pools: pool::Pools::default(),
            counters: server_stats::Counters::default(),
            store,
            host,
            config,
            sandboxes: RwLock::new(HashMap::new()),
            creating: Mutex::new(HashMap::new()),
        }))
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A cluster's node: fetches the images of templates built elsewhere before use.
    pub fn set_image_source(&self, source: Arc<dyn crate::template::ImageSource>) {
        let _ = self.image_source.set(source);
    }

    /// Enables `husk-secret://` references in sandboxes' environments.
    pub fn set_secrets(&self, secrets: Arc<crate::secrets::Secrets>) {
        let _ = self.secrets.set(secrets);
    }

    /// Teams' secrets, if enabled.
    pub fn secrets(&self) -> Option<&Arc<crate::secrets::Secrets>> {
        self.secrets.get()
    }

    /// Why workspaces are off, for the answers that need them (`None`: not enabled).
    pub fn workspaces_off(&self) -> &'static str {
        if self.config.id_prefix.is_empty() {
            "workspaces are not enabled on this server"
        } else {
            crate::workspaces::NOT_SHARED
        }
    }

    /// Enables workspace mounts.
    pub fn set_workspaces(&self, workspaces: Arc<crate::workspaces::Workspaces>) {
        let _ = self.workspaces.set(workspaces);
    }

    /// Gives sandboxes links out through the network `helper` (if its egress is on), under
    /// `default` unless they ask, and ingress sockets made by it.
    pub fn set_network(
        &self,
        helper: Arc<husk_net::helper::NetHelper>,
        default: husk_net::NetPolicy,
    ) {
        let _ = self.network.set(Network { helper, default });
    }

    /// Sandbox networking, if enabled.
    pub fn network(&self) -> Option<&Network> {
        self.network.get()
    }

    /// The network helper when sandboxes get links out through it.
    fn egress(&self) -> Option<&Network> {
        self.network.get().filter(|n| n.helper.egress())
    }

    /// A TCP connection from inside `ns` (a sandbox's namespace) to `addr`: through a socket
    /// the network helper makes there, or, in a server without one (tests), made here.
    pub async fn connect_in(
        &self,
        ns: &husk_net::netns::NetNs,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<tokio::net::TcpStream> {
        match self.network.get() {
            Some(n) => n.helper.tcp_connect(ns, addr).await,
            None => husk_net::netns::tcp_connect(Some(ns), addr).await,
        }
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

    /// The template `name`, checked (its image is hashed the first time this process uses
    /// it, off the async threads).
    pub async fn resolve_template(&self, name: &str) -> Result<Resolved, CoreError> {
        let templates = self.templates.clone();
        let name = name.to_owned();
        let resolved = tokio::task::spawn_blocking(move || templates.resolve(&name))
            .await
            .map_err(|e| CoreError::internal("resolving the template", e))?
            .map_err(|e| match e {
                TemplateError::NotFound(n) => CoreError::TemplateNotFound(n),
                TemplateError::Store(e) => CoreError::Store(e),
                other => CoreError::TemplateBroken(other.to_string()),
            })?;
        if let (Some(source), husk_runtime::RootSource::Image { digest, size, .. }) =
            (self.image_source.get(), &resolved.rootfs)
        {
            source.ensure(digest, *size).await.map_err(|e| {
                CoreError::TemplateBroken(format!(
                    "template {}: its image is not on this node and could not be fetched: {e}",
                    resolved.name
                ))
            })?;
        }
        Ok(resolved)
    }

    /// The store, shared (for the services beside the manager: secrets).
    pub fn store_arc(&self) -> Arc<Store> {
        self.store.clone()
    }
}
