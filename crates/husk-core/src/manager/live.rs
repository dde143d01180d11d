//! A running sandbox as the core holds it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use husk_proto::User;
use husk_runtime::cgroup::SandboxCgroup;
use husk_runtime::Limits;
use time::OffsetDateTime;
use tokio::sync::Notify;

use super::{CoreError, WorkspaceMount};
use crate::agent::{AgentClient, CallError, WatchStream};
use crate::calls::{Answer, Call, SandboxPath};

/// A running sandbox.
pub struct LiveSandbox {
    pub(crate) id: String,
    pub(crate) team: String,
    pub(crate) template: String,
    pub(crate) runtime_id: String,
    /// The sandbox's agent: reached only through the doors of the core (its methods here, in
    /// `files`, `process` and `contexts`), never by the adapters.
    pub(crate) agent: AgentClient,
    /// Required as `X-Access-Token` by the in-sandbox API, and the key of signed file URLs.
    pub(crate) access_token: String,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) allow_internet_access: Option<bool>,
    pub(crate) started_at: OffsetDateTime,
    pub(crate) limits: Limits,
    /// The mounted workspaces.
    pub(crate) workspaces: Vec<WorkspaceMount>,
    /// The template's user: whom commands run as unless they say.
    pub(crate) default_user: User,
    /// The template's working directory, if it has one (else the user's home).
    pub(crate) default_workdir: Option<String>,
    /// Its code contexts (Jupyter kernels run by the agent).
    pub(crate) contexts: Arc<crate::contexts::Contexts>,
    /// The sandbox's link out through husk's router (None: loopback only, the server has no
    /// egress). Dropped with the sandbox, which removes the link and its rules.
    pub(super) net: Option<husk_net::helper::Link>,
    /// A credential of the sandbox's creator for its ports, sent as `E2B-Traffic-Access-Token`:
    /// it opens a private sandbox's servers, and the code interpreter (port 49999) of every
    /// sandbox. Every sandbox has one, public or not: the stock code-interpreter SDKs send
    /// nothing else with their `/contexts` calls, and port 49999 runs code as the sandbox's
    /// user, so it never admits a request for merely naming the sandbox.
    pub(crate) traffic_access_token: String,
    /// Whether the sandbox's own servers admit anyone who names the sandbox (E2B's
    /// `allowPublicTraffic`, the default) rather than only its traffic token or team.
    pub(crate) public_traffic: bool,
    /// The `Host` its own servers get (E2B `maskRequestHost`), if not the client's.
    pub(crate) mask_request_host: Option<super::MaskedHost>,
    /// Its header rules as written (placeholders, not secrets); empty: none.
    pub(super) net_rules: Mutex<crate::net_rules::NetRules>,
    /// PID 1 of the sandbox in the host's PID namespace (its root is `/proc/PID/root`).
    pub(super) init_pid: i32,
    /// The sandbox's network namespace, held open from creation: ingress connects to the
    /// sandbox's servers from inside it.
    pub(super) netns: husk_net::netns::NetNs,
    pub(super) end_at: Mutex<OffsetDateTime>,
    pub(super) timeout_changed: Notify,
    pub(super) cgroup: SandboxCgroup,
    /// Its usage samples (see `metrics.rs`).
    pub(super) metrics: Mutex<super::metrics::MetricsLog>,
    /// Secret values to mask in the output of processes that got them, by pid (so that a
    /// client reconnecting to such a process gets its output masked too). Bounded.
    pub(super) redactions: Mutex<HashMap<u32, Vec<zeroize::Zeroizing<Vec<u8>>>>>,
    /// The names of those secrets, by pid (what its record keeps: see `kept.rs`).
    pub(super) redacted_names: Mutex<HashMap<u32, Vec<String>>>,
    /// What its supervisor last told the agent and the store (see `kept.rs`).
    pub(super) kept: Mutex<super::kept::KeptState>,
    /// Notified when something its record keeps changed (contexts, masks, network rules).
    pub(super) changed: Arc<Notify>,
    /// What happens at its timeout, and whether activity resumes it when paused.
    pub(super) lifecycle: super::Lifecycle,
    /// The timeout it was created with (what an auto-resume gives it again).
    pub(super) timeout: std::time::Duration,
    /// Its own saved layer it was booted on (a sandbox resumed from disk), if any: removed
    /// with it, or merged into the next one when it is paused again.
    pub(super) base_layer: Option<String>,
    /// What its template resolved to: its root, the snapshot layers it stands on, defaults.
    pub(super) origin: crate::template::Resolved,
    /// Frozen in place: a pause that keeps its processes and memory.
    pub(super) paused: std::sync::atomic::AtomicBool,
    /// When it was paused in place (for the operator's retention).
    pub(super) paused_at: Mutex<Option<OffsetDateTime>>,
    /// Held while it is being paused or resumed, so that two never cross.
    pub(super) transition: tokio::sync::Mutex<()>,
    /// How long the steps of its create took, when it was made fresh by this server.
    pub(super) phases: std::sync::OnceLock<CreatePhases>,
}

/// How long the steps of a fresh sandbox's create took (the create's `Server-Timing`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatePhases {
    /// The sandbox made by a spawner (waiting for a free one included) and, with egress,
    /// its link to the router.
    pub spawn: std::time::Duration,
    /// Its agent's hello, the template's start command and code contexts.
    pub boot: std::time::Duration,
    /// Its record in the store and its supervision.
    pub register: std::time::Duration,
}

/// Most processes per sandbox whose secrets are remembered for masking on reconnect.
const MAX_REDACTED_PROCESSES: usize = 256;

impl LiveSandbox {
    /// The paused layer it was booted on, if any.
    pub(super) fn base_layer_ref(&self) -> Option<crate::saved_layers::LayerRef> {
        self.base_layer
            .as_ref()
            .map(|l| crate::saved_layers::LayerRef {
                home: crate::saved_layers::Home::Paused,
                owner: self.id.clone(),
                layer: l.clone(),
            })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// How long the steps of its create took; `None` for a sandbox this server did not make
    /// fresh (a warm one claimed, one taken up from an earlier server).
    pub fn create_phases(&self) -> Option<CreatePhases> {
        self.phases.get().copied()
    }

    pub fn team(&self) -> &str {
        &self.team
    }

    pub fn template(&self) -> &str {
        &self.template
    }

    /// The runtime's own id of the sandbox (names its cgroups).
    pub fn runtime_id(&self) -> &str {
        &self.runtime_id
    }

    /// Required as `X-Access-Token` by the in-sandbox API, and the key of signed file URLs.
    pub fn access_token(&self) -> &str {
        &self.access_token
    }

    /// The environment it was created with (secrets as `husk-secret://` references).
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }

    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    pub fn allow_internet_access(&self) -> Option<bool> {
        self.allow_internet_access
    }

    pub fn started_at(&self) -> OffsetDateTime {
        self.started_at
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The mounted workspaces.
    pub fn workspaces(&self) -> &[WorkspaceMount] {
        &self.workspaces
    }

    /// The template's user: whom commands run as unless they say.
    pub fn default_user(&self) -> User {
        self.default_user
    }

    /// The template's working directory, if it has one (else the user's home).
    pub fn default_workdir(&self) -> Option<&str> {
        self.default_workdir.as_deref()
    }

    /// The credential for its ports (see the field).
    pub fn traffic_access_token(&self) -> &str {
        &self.traffic_access_token
    }

    /// Whether its own servers admit anyone who names it.
    pub fn public_traffic(&self) -> bool {
        self.public_traffic
    }

    /// The `Host` its own servers are sent instead of the client's, if one was asked for.
    pub fn mask_request_host(&self) -> Option<&super::MaskedHost> {
        self.mask_request_host.as_ref()
    }

    /// Its header rules as written (with their placeholders); empty: none.
    pub fn net_rules(&self) -> crate::net_rules::NetRules {
        self.net_rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// A call answered at once (see [`Call`]); the agent's reply must be of the call's kind.
    pub async fn call(&self, call: Call) -> Result<Answer, CallError> {
        let (req, answer) = call.into_parts();
        answer(self.agent.call(req).await?).ok_or_else(crate::calls::unexpected_reply)
    }

    /// Watches `path` (and below it, if `recursive`) as `user`; the watch ends when the
    /// stream is dropped.
    pub async fn watch(
        &self,
        path: &SandboxPath,
        recursive: bool,
        user: User,
    ) -> Result<WatchStream, CallError> {
        self.agent
            .watch(path.as_str().to_owned(), recursive, user)
            .await
    }

    /// Whether it is paused in place (frozen, its memory kept).
    pub fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::Acquire)
    }

    /// What happens at its timeout, and whether activity resumes it when paused.
    pub fn lifecycle(&self) -> super::Lifecycle {
        self.lifecycle
    }

    /// Whether the sandbox is gone (its agent connection ended).
    pub fn is_gone(&self) -> bool {
        self.agent.is_closed()
    }

    /// The sandbox's code contexts (Jupyter kernels run by the agent).
    pub fn contexts(&self) -> &Arc<crate::contexts::Contexts> {
        &self.contexts
    }

    /// Remembers the secret values of process `pid` (for [`LiveSandbox::redaction`]), and
    /// the secrets' `names` (for the record: a restarted server opens them again).
    pub fn set_redaction(
        &self,
        pid: u32,
        values: Vec<zeroize::Zeroizing<Vec<u8>>>,
        names: Vec<String>,
    ) {
        {
            let mut map = self.redactions.lock().unwrap_or_else(|p| p.into_inner());
            let mut named = self
                .redacted_names
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if map.len() >= MAX_REDACTED_PROCESSES {
                if let Some(k) = map.keys().min().copied() {
                    map.remove(&k);
                    named.remove(&k);
                }
            }
            map.insert(pid, values);
            named.insert(pid, names);
        }
        self.changed.notify_one();
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
            .map_err(|e| CoreError::internal(format!("freezing sandbox {}", self.id), e))
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
            .map_or(husk_net::NetPolicy::None, |n| n.policy())
    }

    /// The connections its policy refused, oldest first (at most the last
    /// [`husk_net::sandboxes::MAX_DENIALS`]), with what the kernel logged up to now.
    pub async fn denials(self: &Arc<Self>) -> Result<Vec<husk_net::Denial>, CoreError> {
        if self.net.is_none() {
            return Ok(Vec::new());
        }
        let sb = self.clone();
        tokio::task::spawn_blocking(move || match &sb.net {
            Some(n) => n.denials(true),
            None => Ok(Vec::new()),
        })
        .await
        .map_err(|e| CoreError::internal("the denials task", e))?
        .map_err(|e| CoreError::internal("reading the sandbox's denials", e))
    }

    /// The sandbox's network namespace (sockets made in it reach the sandbox's loopback).
    pub fn netns(&self) -> &husk_net::netns::NetNs {
        &self.netns
    }

    pub fn end_at(&self) -> OffsetDateTime {
        *self.end_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn set_end_at(&self, t: OffsetDateTime) {
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

/// `O_PATH | O_DIRECTORY`: opens a directory to resolve paths below it, without reading it.
fn libc_o_path_directory() -> i32 {
    husk_runtime::libc::O_PATH | husk_runtime::libc::O_DIRECTORY
}
