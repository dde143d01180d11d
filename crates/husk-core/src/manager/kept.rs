//! Running sandboxes that outlive the server, and the server that takes them up again.
//!
//! A sandbox's processes, files and network namespace belong to the spawner's side
//! (`husk_runtime::keep`: they outlive the spawner), its link to the network helper's
//! (`husk_net::router`: recorded, linked again by the next helper). What only the server
//! knew (who the sandbox is, its credentials, what it was created with, its contexts'
//! kernels, which processes' output is masked, its deadline) is kept in its record in the
//! store as a [`Running`] description, written when it is created and again whenever one of
//! those changes (by its supervisor, off the request's path). The agent holds a backstop of
//! the deadline, for while no server runs.
//!
//! At the next start the spawner takes up the kept sandboxes still running; the manager
//! ([`Manager::take_up`]) reconnects to each one that has a record it can read, links it to
//! the router again, subscribes to its kernels and supervises it as before. What it cannot
//! take up is destroyed and reported lost; a record whose sandbox did not survive (the host
//! restarted, its PID 1 was killed) is reported lost; one that simply reached its timeout
//! meanwhile is forgotten.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use husk_proto::{Hello, User, VERSION};
use husk_runtime::Limits;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::Notify;

use super::saved::read_versioned;
use super::{write, CoreError, Lifecycle, LiveSandbox, Manager, MaskedHost, OnTimeout};
use super::{WorkspaceMount, LOST_IN_A_CRASH};
use crate::agent::AgentClient;
use crate::contexts::KeptContext;
use crate::net_rules::NetRules;
use crate::store::SandboxRecord;
use crate::template::Resolved;

/// The description's format; bump on a change old readers cannot take (and read the old one).
pub const RUNNING_VERSION: u32 = 1;

/// How long the agent has to take a new backstop.
const BACKSTOP_CALL: Duration = Duration::from_secs(2);

/// Most processes per sandbox whose masking is kept (as [`LiveSandbox`] keeps).
const MAX_KEPT_REDACTIONS: usize = 256;

/// Why a running sandbox a restarted server could not take up is lost.
const NOT_TAKEN_UP: &str = "the server that ran it restarted, and the sandbox could not be \
    taken up again";

/// A running sandbox as its record keeps it (see the module's documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub version: u32,
    pub id: String,
    pub team: String,
    pub template: String,
    /// The runtime's id (the spawner takes the sandbox up by it).
    pub runtime_id: String,
    /// Unix nanoseconds.
    pub started_at: i128,
    /// Unix nanoseconds.
    pub end_at: i128,
    /// The timeout it was created with, in seconds.
    pub timeout_secs: u64,
    pub metadata: BTreeMap<String, String>,
    /// As created (secrets as `husk-secret://` references, never their values).
    pub env: Vec<(String, String)>,
    pub limits: Limits,
    pub workspaces: Vec<WorkspaceMount>,
    /// Header rules as written (placeholders, not secrets).
    pub rules: NetRules,
    pub allow_internet_access: Option<bool>,
    pub public_traffic: bool,
    pub mask_request_host: Option<String>,
    pub access_token: String,
    pub traffic_access_token: String,
    pub lifecycle: Lifecycle,
    /// Its own paused layer it was booted on, if any.
    pub base_layer: Option<String>,
    /// What its template resolved to.
    pub origin: Resolved,
    pub default_user: User,
    pub default_workdir: Option<String>,
    /// Its link out: the router's index of it and the policy in force.
    pub link: Option<KeptLink>,
    pub contexts: Vec<KeptContext>,
    pub next_kernel: u32,
    /// Unix nanoseconds: when it was paused in place (frozen), if it is.
    pub paused_at: Option<i128>,
    /// Processes whose output is masked, with the names of the secrets they got (their
    /// values are opened again, never written here).
    pub redacted: Vec<(u32, Vec<String>)>,
}

/// A sandbox's link out, as kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptLink {
    pub index: u32,
    pub policy: husk_net::NetPolicy,
}

fn nanos(t: OffsetDateTime) -> i128 {
    t.unix_timestamp_nanos()
}

fn time_of(n: i128) -> Result<OffsetDateTime, String> {
    OffsetDateTime::from_unix_timestamp_nanos(n).map_err(|e| e.to_string())
}

impl Running {
    /// `sb` as it is now.
    pub fn of(sb: &LiveSandbox) -> Running {
        let (contexts, next_kernel) = sb.contexts.kept();
        let mut redacted: Vec<(u32, Vec<String>)> = sb
            .redacted_names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(pid, names)| (*pid, names.clone()))
            .collect();
        redacted.sort();
        Running {
            version: RUNNING_VERSION,
            id: sb.id.clone(),
            team: sb.team.clone(),
            template: sb.template.clone(),
            runtime_id: sb.runtime_id.clone(),
            started_at: nanos(sb.started_at),
            end_at: nanos(sb.end_at()),
            timeout_secs: sb.timeout.as_secs(),
            metadata: sb.metadata.clone(),
            env: sb.env.clone(),
            limits: sb.limits.clone(),
            workspaces: sb.workspaces.clone(),
            rules: sb.net_rules(),
            allow_internet_access: sb.allow_internet_access,
            public_traffic: sb.public_traffic,
            mask_request_host: sb.mask_request_host.as_ref().map(|m| m.as_str().to_owned()),
            access_token: sb.access_token.clone(),
            traffic_access_token: sb.traffic_access_token.clone(),
            lifecycle: sb.lifecycle,
            base_layer: sb.base_layer.clone(),
            origin: sb.origin.clone(),
            default_user: sb.default_user,
            default_workdir: sb.default_workdir.clone(),
            link: sb.net.as_ref().map(|n| KeptLink {
                index: n.index(),
                policy: n.policy(),
            }),
            contexts,
            next_kernel,
            paused_at: sb
                .paused_at
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .filter(|_| sb.is_paused())
                .map(nanos),
            redacted,
        }
    }

    /// As JSON, for the record.
    pub fn to_json(&self) -> Result<String, CoreError> {
        serde_json::to_string(self).map_err(|e| CoreError::internal("describing the sandbox", e))
    }

    /// A record's description, checked against the record itself and for what a server
    /// would act on (names of layers, sizes).
    pub fn from_record(r: &SandboxRecord) -> Result<Running, String> {
        let Some(json) = &r.description else {
            return Err("its record has no description (written by an older husk)".into());
        };
        let d: Running = read_versioned(json, RUNNING_VERSION, "description")?;
        if d.id != r.id || d.team != r.team || d.runtime_id != r.runtime_id {
            return Err("its description names another sandbox".into());
        }
        crate::saved_layers::check_sandbox(&d.id).map_err(|e| e.to_string())?;
        if let Some(l) = &d.base_layer {
            crate::saved_layers::check_layer(l).map_err(|e| e.to_string())?;
        }
        if d.redacted.len() > MAX_KEPT_REDACTIONS {
            return Err("its description masks too many processes".into());
        }
        time_of(d.started_at)?;
        time_of(d.end_at)?;
        if let Some(p) = d.paused_at {
            time_of(p)?;
        }
        Ok(d)
    }

    fn end_at(&self) -> OffsetDateTime {
        time_of(self.end_at).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }
}

/// What the supervisor last told the agent and the store (so it tells only changes).
#[derive(Debug, Default)]
pub(super) struct KeptState {
    /// The backstop last sent (`None`: none yet).
    deadline: Option<Option<SystemTime>>,
    /// The description last written.
    saved: String,
}

impl LiveSandbox {
    /// Its description as written with its record (at create, or as read back at take-up).
    pub(super) fn kept_as_saved(&self, json: String) {
        self.kept.lock().unwrap_or_else(|p| p.into_inner()).saved = json;
    }
}

/// The backstop `sb`'s agent should hold: its deadline when it is killed at its timeout and
/// not paused; none otherwise (a paused sandbox, or one paused at its timeout, waits for a
/// server).
fn backstop_of(sb: &LiveSandbox) -> Option<SystemTime> {
    match (sb.is_paused(), sb.lifecycle.on_timeout) {
        (false, OnTimeout::Kill) => Some(SystemTime::from(sb.end_at())),
        _ => None,
    }
}

/// What [`Manager::take_up`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TakenUp {
    /// Sandboxes running again under this server.
    pub running: usize,
    /// Records whose sandbox could not be taken up (reported lost).
    pub lost: usize,
    /// Sandboxes the spawner took up that no record names (destroyed).
    pub strays: usize,
}

impl Manager {
    /// Tells the agent and the store what changed about `sb` since last time: its backstop
    /// (its deadline when it is killed at its timeout and not paused; none otherwise: a
    /// paused sandbox, or one paused at its timeout, waits for a server), and its
    /// description. Called by its supervisor.
    pub(super) async fn sync_kept(&self, sb: &LiveSandbox) {
        let backstop = backstop_of(sb);
        let send = {
            let st = sb.kept.lock().unwrap_or_else(|p| p.into_inner());
            st.deadline != Some(backstop)
        };
        // Never to a frozen agent, which cannot answer (a pause tells it first: see
        // `clear_backstop`).
        if send && !sb.is_paused() {
            self.send_backstop(sb, backstop, || ()).await;
        }
        let Ok(json) = Running::of(sb).to_json() else {
            return;
        };
        if sb.kept.lock().unwrap_or_else(|p| p.into_inner()).saved == json {
            return;
        }
        match self
            .store
            .update_sandbox_description(&sb.id, sb.end_at(), &json)
        {
            Ok(_) => sb.kept.lock().unwrap_or_else(|p| p.into_inner()).saved = json,
            Err(e) => tracing::warn!(sandbox = %sb.id, error = %e, "could not record the sandbox"),
        }
    }

    /// A new sandbox's backstop, sent before its create answers rather than left to its
    /// supervisor: a server killed the moment after must still leave a sandbox that ends at
    /// its timeout. `meanwhile` runs while the agent takes it (the create writes its record
    /// there), so the two waits overlap.
    pub(super) async fn arm_backstop<T>(
        &self,
        sb: &LiveSandbox,
        meanwhile: impl FnOnce() -> T,
    ) -> T {
        self.send_backstop(sb, backstop_of(sb), meanwhile).await
    }

    /// Before `sb` is frozen: no backstop while it is paused (it waits for a server).
    pub(super) async fn clear_backstop(&self, sb: &LiveSandbox) {
        self.send_backstop(sb, None, || ()).await;
    }

    /// Sends `backstop` to `sb`'s agent, runs `meanwhile` while the agent takes it, and notes
    /// it as sent once the agent has it. The whole call waits at most [`BACKSTOP_CALL`] for the
    /// agent; one that did not answer in time is not noted, so the supervisor sends it again.
    async fn send_backstop<T>(
        &self,
        sb: &LiveSandbox,
        backstop: Option<SystemTime>,
        meanwhile: impl FnOnce() -> T,
    ) -> T {
        let started = tokio::time::Instant::now();
        let submitted =
            tokio::time::timeout(BACKSTOP_CALL, sb.agent.submit_deadline(backstop)).await;
        let out = meanwhile();
        if let Ok(Ok(reply)) = submitted {
            let left = BACKSTOP_CALL.saturating_sub(started.elapsed());
            let taken =
                tokio::time::timeout(left, async { crate::agent::deadline_taken(reply.await) })
                    .await;
            if matches!(taken, Ok(Ok(()))) {
                sb.kept.lock().unwrap_or_else(|p| p.into_inner()).deadline = Some(backstop);
            }
        }
        out
    }

    /// Server stop, keeping its sandboxes: each one's description is written as it is now,
    /// its link left to the next network helper and its agent connection closed (the agent
    /// waits for the next server); none is destroyed. Sandboxes paused to disk stay as they
    /// are.
    pub async fn stop_keeping(self: &Arc<Self>) -> usize {
        self.drain_pools().await;
        let all: Vec<Arc<LiveSandbox>> = write(&self.sandboxes).drain().map(|(_, s)| s).collect();
        for sb in &all {
            // Out of the map first: its supervisor sees the agent go and finds nothing to end.
            if let Ok(json) = Running::of(sb).to_json() {
                if let Err(e) = self
                    .store
                    .update_sandbox_description(&sb.id, sb.end_at(), &json)
                {
                    tracing::warn!(sandbox = %sb.id, error = %e, "could not record the sandbox");
                }
            }
            if let Some(n) = &sb.net {
                n.keep();
            }
            sb.agent.close().await;
        }
        all.len()
    }

    /// Server start: takes up the sandboxes an earlier server left running (those the
    /// spawner took up, [`crate::host::SandboxHost::adopted`]), in parallel; reports lost
    /// what it cannot take up, destroys what no record names, then gives the network helper's
    /// unclaimed links back.
    pub async fn take_up(self: &Arc<Self>) -> Result<TakenUp, CoreError> {
        let adopted: HashSet<String> = self.host.adopted().into_iter().collect();
        let mut out = TakenUp::default();
        let mut claimed = HashSet::new();
        let mut tasks = tokio::task::JoinSet::new();
        for rec in self.store.list_sandboxes()? {
            if !adopted.contains(&rec.runtime_id) {
                continue;
            }
            claimed.insert(rec.runtime_id.clone());
            let this = self.clone();
            tasks.spawn(async move {
                let id = rec.id.clone();
                let rid = rec.runtime_id.clone();
                let taken = match Running::from_record(&rec) {
                    Ok(d) => this.take_up_one(d).await,
                    Err(e) => Err(CoreError::internal("its record", e)),
                };
                (id, rid, taken)
            });
        }
        while let Some(joined) = tasks.join_next().await {
            let Ok((id, rid, taken)) = joined else {
                continue;
            };
            match taken {
                Ok(()) => out.running += 1,
                Err(e) => {
                    let why = crate::error_chain(&e);
                    tracing::warn!(sandbox = %id, error = %why, "could not take the sandbox up");
                    self.destroy_runtime(rid).await;
                    let reason = format!("{NOT_TAKEN_UP} ({why})");
                    let _ = self
                        .store
                        .mark_sandbox_lost(&id, &reason, OffsetDateTime::now_utc());
                    out.lost += 1;
                }
            }
        }
        for rid in adopted.difference(&claimed) {
            self.destroy_runtime(rid.clone()).await;
            out.strays += 1;
        }
        if let Some(n) = self.egress() {
            let helper = n.helper.clone();
            let pruned = tokio::task::spawn_blocking(move || helper.prune_links()).await;
            if let Ok(Err(e)) = pruned {
                tracing::warn!(error = %e, "giving back unclaimed sandbox links");
            }
        }
        Ok(out)
    }

    /// Takes up one sandbox the spawner kept: a new agent connection, its link, kernels and
    /// masks again, then supervision. On failure the caller destroys it.
    async fn take_up_one(self: &Arc<Self>, d: Running) -> Result<(), CoreError> {
        let rid = d.runtime_id.clone();
        let paused = d.paused_at.is_some();
        let host = self.host.clone();
        let rid2 = rid.clone();
        // A frozen agent cannot say hello: thawed for that moment, frozen again below.
        let created = tokio::task::spawn_blocking(move || {
            if paused {
                host.thaw(&rid2)?;
            }
            host.reconnect(&rid2)
        })
        .await
        .map_err(|e| CoreError::internal("the take-up task", e))?
        .map_err(|e| CoreError::internal("reconnecting to the sandbox", e))?;
        let netns = husk_net::netns::NetNs::from_fd(created.netns)
            .map_err(|e| CoreError::internal("the sandbox's network namespace", e))?;
        // The agent keeps what it was made with; the hello names the same sandbox.
        let hello = Hello {
            version: VERSION,
            env: d.env.clone(),
            default_user: d.default_user,
            default_workdir: d.default_workdir.clone(),
        };
        let agent = AgentClient::connect(created.agent, hello)
            .await
            .map_err(|e| {
                CoreError::internal(
                    "the sandbox's agent did not answer a hello of this husk's protocol version",
                    e,
                )
            })?;
        let undo_agent = agent.clone();
        let result = self
            .finish_take_up(d, agent, netns, created.cgroup, created.init_pid)
            .await;
        match result {
            Ok(sb) => {
                if paused {
                    let host = self.host.clone();
                    let rid = rid.clone();
                    let frozen = tokio::task::spawn_blocking(move || host.freeze(&rid))
                        .await
                        .map_err(|e| CoreError::internal("the take-up task", e))?;
                    if let Err(e) = frozen {
                        write(&self.sandboxes).remove(&sb.id);
                        return Err(CoreError::internal("freezing the sandbox again", e));
                    }
                }
                tokio::spawn(self.clone().supervise(sb));
                Ok(())
            }
            Err(e) => {
                undo_agent.close().await;
                Err(e)
            }
        }
    }

    async fn finish_take_up(
        self: &Arc<Self>,
        d: Running,
        agent: AgentClient,
        netns: husk_net::netns::NetNs,
        cgroup: husk_runtime::cgroup::SandboxCgroup,
        init_pid: i32,
    ) -> Result<Arc<LiveSandbox>, CoreError> {
        let net = match (&d.link, self.egress()) {
            (Some(link), Some(n)) => {
                let rules = if d.rules.is_empty() {
                    None
                } else {
                    Some(self.resolve_rules(&d.team, &d.rules)?)
                };
                let (helper, ns, index, policy) = (
                    n.helper.clone(),
                    netns.clone(),
                    link.index,
                    link.policy.clone(),
                );
                let linked =
                    tokio::task::spawn_blocking(move || helper.reattach(ns, index, policy, rules))
                        .await
                        .map_err(|e| CoreError::internal("the take-up task", e))?
                        .map_err(|e| {
                            CoreError::internal("linking the sandbox to the router again", e)
                        })?;
                Some(linked)
            }
            (Some(_), None) => {
                tracing::warn!(
                    sandbox = %d.id,
                    "this server has no sandbox egress: the sandbox keeps loopback only"
                );
                None
            }
            (None, _) => None,
        };
        // Kernels get the sandbox's secrets in their environment (for restarts), as at create.
        let secrets = self
            .resolve_secrets(&d.team, &d.env, &mut Vec::new())
            .map_err(|e| CoreError::InvalidArgument(crate::error_chain(&e)))?;
        let cwd = d
            .default_workdir
            .clone()
            .unwrap_or_else(|| d.default_user.home().to_owned());
        let (contexts, gone) = crate::contexts::Contexts::restore(
            agent.clone(),
            crate::contexts::KernelEnv {
                user: d.default_user,
                secret_envs: secrets.env,
                redact: Arc::new(secrets.redact),
            },
            cwd,
            d.contexts.clone(),
            d.next_kernel,
        )
        .await;
        if !gone.is_empty() {
            tracing::warn!(sandbox = %d.id, contexts = ?gone, "kernels that ended while no server ran");
        }
        let contexts = Arc::new(contexts);
        // Masks: the secrets' values opened again by name.
        let mut redactions = HashMap::new();
        let mut redacted_names = HashMap::new();
        for (pid, names) in &d.redacted {
            let mut envs: Vec<(String, String)> = names
                .iter()
                .map(|n| (n.clone(), format!("{}{n}", crate::secrets::SECRET_PREFIX)))
                .collect();
            match self.resolve_secrets(&d.team, &[], &mut envs) {
                Ok(s) => {
                    redactions.insert(*pid, s.redact);
                    redacted_names.insert(*pid, names.clone());
                }
                Err(e) => tracing::warn!(
                    sandbox = %d.id,
                    pid,
                    error = %crate::error_chain(&e),
                    "a process's secrets could not be opened again: its output is no longer masked"
                ),
            }
        }
        let paused_at = d.paused_at.map(time_of).transpose().ok().flatten();
        let changed = contexts.changed();
        let sb = Arc::new(LiveSandbox {
            end_at: Mutex::new(d.end_at()),
            id: d.id.clone(),
            team: d.team.clone(),
            template: d.template.clone(),
            runtime_id: d.runtime_id.clone(),
            agent,
            access_token: d.access_token.clone(),
            traffic_access_token: d.traffic_access_token.clone(),
            env: d.env.clone(),
            metadata: d.metadata.clone(),
            allow_internet_access: d.allow_internet_access,
            started_at: time_of(d.started_at).unwrap_or(OffsetDateTime::UNIX_EPOCH),
            limits: d.limits.clone(),
            workspaces: d.workspaces.clone(),
            default_user: d.default_user,
            default_workdir: d.default_workdir.clone(),
            contexts,
            net,
            public_traffic: d.public_traffic,
            mask_request_host: d
                .mask_request_host
                .as_deref()
                .map(MaskedHost::new)
                .transpose()
                .map_err(|e| CoreError::internal("the sandbox's masked host", e))?,
            net_rules: Mutex::new(d.rules.clone()),
            init_pid,
            netns,
            timeout_changed: Notify::new(),
            cgroup,
            metrics: Mutex::new(super::metrics::MetricsLog::new()),
            redactions: Mutex::new(redactions),
            redacted_names: Mutex::new(redacted_names),
            lifecycle: d.lifecycle,
            timeout: Duration::from_secs(d.timeout_secs),
            base_layer: d.base_layer.clone(),
            origin: d.origin.clone(),
            paused: std::sync::atomic::AtomicBool::new(paused_at.is_some()),
            paused_at: Mutex::new(paused_at),
            transition: tokio::sync::Mutex::new(()),
            phases: std::sync::OnceLock::new(),
            kept: Mutex::new(KeptState::default()),
            changed,
        });
        write(&self.sandboxes).insert(sb.id.clone(), sb.clone());
        Ok(sb)
    }

    /// Whether `runtime_id` names a sandbox this server runs (for tests).
    #[cfg(test)]
    pub(super) fn runs_runtime(&self, runtime_id: &str) -> bool {
        super::read(&self.sandboxes)
            .values()
            .any(|s| s.runtime_id == runtime_id)
    }
}

/// Why a record without a running sandbox is reported lost at start, or `None` when it is
/// not lost but simply over: it reached its timeout meanwhile (and would have been killed).
pub(super) fn lost_reason(rec: &SandboxRecord, now: OffsetDateTime) -> Option<&'static str> {
    let killed_at_timeout = Running::from_record(rec)
        .ok()
        .is_some_and(|d| d.lifecycle.on_timeout == OnTimeout::Kill && d.paused_at.is_none());
    if killed_at_timeout && rec.end_at <= now {
        None
    } else {
        Some(LOST_IN_A_CRASH)
    }
}
