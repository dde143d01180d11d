//! One-shot runs and batches: the task flow of an agent platform. A run is one command (or
//! piece of code) in a fresh sandbox: the sandbox gets the run's files, its workspaces (read-only
//! unless asked otherwise), its secrets as environment of that one process; the command's output
//! streams back as [`RunEvent`]s; when it ends the sandbox is frozen, the declared outputs are
//! copied into a workspace under `runs/<run-id>/` with a manifest, and the sandbox is destroyed,
//! whatever happened (exit, timeout, crash, cancel, a client that went away). The run's record
//! ([`RunRecord`]) stays in the store.
//!
//! A batch ([`batch`]) is one run spec fanned out over many inputs with a bound on how many run
//! at once.

pub mod batch;
mod cancel;
mod exec;
mod kernel;
pub(crate) mod outputs;
pub mod spec;

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::mpsc;

pub use cancel::Cancel;
pub use outputs::{OutputFile, OutputSkipped, OutputsReport};
pub use spec::{InlineFile, OutputLimit, RunLimits, RunSpec, RunWorkspace};

use crate::manager::{CoreError, Manager};
use crate::store::{Principal, RunRow, RunTable, Store};

/// Errors of starting a run (after it started, what goes wrong is in its events and record).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("workspace '{0}' not found")]
    WorkspaceNotFound(String),
    #[error("secret '{0}' not found")]
    SecretNotFound(String),
    #[error("template '{0}' not found")]
    TemplateNotFound(String),
    #[error("run {0} not found")]
    NotFound(String),
    #[error("{0}")]
    Unavailable(String),
    /// The team has as many of these running as it may.
    #[error("{0}")]
    TooMany(String),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Still going.
    Running,
    /// The command exited with 0.
    Succeeded,
    /// The command exited with another code, was killed by a signal or ran out of memory.
    Failed,
    /// The command ran past the run's timeout and was killed.
    TimedOut,
    /// Cancelled by its client (or the client went away) or its batch.
    Cancelled,
    /// husk could not run it (the sandbox could not be made, outputs could not be saved...).
    Error,
}

impl RunStatus {
    pub fn ended(self) -> bool {
        self != RunStatus::Running
    }
}

/// A run as recorded and returned by the API.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunRecord {
    pub id: String,
    pub team: String,
    /// The public id of the key that started it.
    pub key_id: String,
    #[serde(default)]
    pub batch: Option<String>,
    /// The item's index in its batch.
    #[serde(default)]
    pub index: Option<usize>,
    pub template: String,
    pub command: Vec<String>,
    pub status: RunStatus,
    /// The command's exit code (-1 when a signal killed it); none if it never ran to an end.
    pub exit_code: Option<i32>,
    /// `exit status 1`, `signal: killed`, `timeout`, `out of memory`, `cancelled`...
    pub reason: Option<String>,
    /// What went wrong on husk's side, if anything did.
    pub error: Option<String>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub ended_at: Option<OffsetDateTime>,
    pub duration_ms: Option<u64>,
    pub sandbox_id: Option<String>,
    pub workspaces: Vec<RunWorkspace>,
    /// Secrets given to the command, by name (never a value).
    pub secrets: Vec<String>,
    pub outputs: Option<OutputsReport>,
    /// The last bytes of stdout and stderr (masked like the stream), for a summary.
    pub stdout_tail: String,
    pub stderr_tail: String,
    /// `code` runs in a kernel: the main result's text (bounded), if there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

/// What a run streams.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    Started {
        run_id: String,
        sandbox_id: String,
    },
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    Exited {
        exit_code: Option<i32>,
        status: RunStatus,
        reason: String,
        duration_ms: u64,
    },
    Outputs(OutputsReport),
    /// `code` runs in a kernel: a rich result (`is_main`: the last expression's value, else
    /// display data), its MIME bundle as the kernel gave it.
    Result {
        is_main: bool,
        data: serde_json::Map<String, serde_json::Value>,
    },
    /// A problem on husk's side (the record's `error`).
    Error {
        message: String,
    },
    /// The last event: the final record.
    End {
        run: Box<RunRecord>,
    },
}

/// A started run or batch: its id, its events, and the power to cancel it. Dropping the handle
/// cancels the work (its client went away) unless it was [`Handle::detach`]ed.
pub struct Handle<E> {
    pub id: String,
    pub events: mpsc::Receiver<E>,
    cancel: Cancel,
    detached: bool,
}

/// A started run.
pub type RunHandle = Handle<RunEvent>;

impl<E> Handle<E> {
    fn new(id: String, events: mpsc::Receiver<E>, cancel: Cancel) -> Handle<E> {
        Handle {
            id,
            events,
            cancel,
            detached: false,
        }
    }

    /// Lets the work go on without this handle (its record tells how it ended).
    pub fn detach(mut self) {
        self.detached = true;
    }

    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Takes the events out (to stream them) while the handle keeps its cancel-on-drop.
    pub fn take_events(&mut self) -> mpsc::Receiver<E> {
        let (_closed, empty) = mpsc::channel(1);
        std::mem::replace(&mut self.events, empty)
    }
}

impl<E> Drop for Handle<E> {
    fn drop(&mut self) {
        if !self.detached {
            self.cancel.cancel();
        }
    }
}

/// Runs and batches of every team.
pub struct Runs {
    manager: Arc<Manager>,
    store: Arc<Store>,
    /// Cancel tokens of runs and batches in progress, by id.
    active: Mutex<std::collections::HashMap<String, Cancel>>,
    /// Batches running, by team.
    batches: Mutex<std::collections::HashMap<String, usize>>,
    config: RunsConfig,
}

/// Bound of the events waiting for a slow client (output then waits for it).
const EVENT_QUEUE: usize = 64;

/// How many records one list returns at most.
pub const MAX_LIST: u32 = 1000;

/// A new run or batch id: `run_` / `batch_` + 20 characters of `[a-z0-9]`.
fn new_id(prefix: &str) -> Result<String, RunError> {
    let id = crate::manager::new_sandbox_id().map_err(|e| RunError::Unavailable(e.to_string()))?;
    Ok(format!("{prefix}_{id}"))
}

/// What the operator allows runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunsConfig {
    /// The most a run may ask to copy out as outputs (its `output_limit`); runs that say
    /// nothing get the smaller of this and the default.
    pub max_output: husk_runtime::transfer::OutputLimits,
}

impl Default for RunsConfig {
    /// Outputs of at most 4 GiB and 100 000 entries.
    fn default() -> RunsConfig {
        RunsConfig {
            max_output: husk_runtime::transfer::OutputLimits {
                max_bytes: 4 << 30,
                max_files: 100_000,
            },
        }
    }
}

impl Runs {
    /// The run service; records a crashed server left running are marked as ended by it.
    pub fn new(manager: Arc<Manager>) -> Result<Arc<Runs>, RunError> {
        Runs::with_config(manager, RunsConfig::default())
    }

    /// [`Runs::new`] with the operator's `config`.
    pub fn with_config(manager: Arc<Manager>, config: RunsConfig) -> Result<Arc<Runs>, RunError> {
        let store = manager.store_arc();
        // Sandboxes of runs the stop interrupted: they outlived the server, but no one is left
        // to collect their output or save their files.
        let mut orphaned = Vec::new();
        for (table, id, rec) in store.unfinished_runs()? {
            let now = OffsetDateTime::now_utc();
            let fixed = match table {
                RunTable::Runs => serde_json::from_str::<RunRecord>(&rec).ok().map(|mut r| {
                    if let Some(sb) = &r.sandbox_id {
                        orphaned.push((r.team.clone(), sb.clone()));
                    }
                    r.status = RunStatus::Error;
                    r.error = Some("the server stopped during the run".into());
                    r.ended_at = Some(now);
                    (r.team.clone(), r.batch.clone(), r.created_at, json(&r))
                }),
                RunTable::Batches => {
                    serde_json::from_str::<batch::BatchRecord>(&rec)
                        .ok()
                        .map(|mut b| {
                            b.status = batch::BatchStatus::Error;
                            b.ended_at = Some(now);
                            (b.team.clone(), None, b.created_at, json(&b))
                        })
                }
            };
            if let Some((team, batch, created_at, text)) = fixed {
                store.put_run_record(&RunRow {
                    table,
                    id: &id,
                    team: &team,
                    batch: batch.as_deref(),
                    created_at,
                    ended_at: Some(now),
                    record: &text,
                })?;
            }
        }
        if let (false, Ok(rt)) = (orphaned.is_empty(), tokio::runtime::Handle::try_current()) {
            let m = manager.clone();
            rt.spawn(async move {
                for (team, sandbox) in orphaned {
                    let who = Principal {
                        team,
                        key_id: "husk".into(),
                        admin: false,
                    };
                    // Gone already (it ended with a server that destroyed it): nothing to do.
                    let _ = m.kill(&who, &sandbox).await;
                }
            });
        }
        Ok(Arc::new(Runs {
            manager,
            store,
            active: Mutex::new(std::collections::HashMap::new()),
            batches: Mutex::new(std::collections::HashMap::new()),
            config,
        }))
    }

    pub fn manager(&self) -> &Arc<Manager> {
        &self.manager
    }

    /// Validates `spec` against the team's state and starts the run.
    pub async fn start(
        self: &Arc<Self>,
        who: &Principal,
        spec: &RunSpec,
    ) -> Result<RunHandle, RunError> {
        self.start_in(who, spec, None, Cancel::default()).await
    }

    /// Starts a run, as an item of `batch` when given; `cancel` also cancels it.
    pub(crate) async fn start_in(
        self: &Arc<Self>,
        who: &Principal,
        spec: &RunSpec,
        batch: Option<(&str, usize)>,
        cancel: Cancel,
    ) -> Result<RunHandle, RunError> {
        let mut plan = spec.plan(self.manager.max_timeout())?;
        self.check_output_limit(spec, &mut plan)?;
        self.check_team_state(who, &plan)?;
        self.check_sandbox(&plan).await?;
        let id = new_id("run")?;
        let record = RunRecord {
            id: id.clone(),
            team: who.team.clone(),
            key_id: who.key_id.clone(),
            batch: batch.map(|(b, _)| b.to_owned()),
            index: batch.map(|(_, i)| i),
            template: plan.template.clone(),
            command: plan.argv.clone(),
            status: RunStatus::Running,
            exit_code: None,
            reason: None,
            error: None,
            created_at: OffsetDateTime::now_utc(),
            ended_at: None,
            duration_ms: None,
            sandbox_id: None,
            workspaces: plan
                .workspaces
                .iter()
                .map(|w| RunWorkspace {
                    name: w.name.clone(),
                    path: Some(w.path.clone()),
                    mode: Some(if w.writable { "rw" } else { "ro" }.into()),
                })
                .collect(),
            secrets: plan.secrets.clone(),
            outputs: None,
            stdout_tail: String::new(),
            stderr_tail: String::new(),
            result: None,
        };
        self.save_run(&record)?;
        let (tx, rx) = mpsc::channel(EVENT_QUEUE);
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), cancel.clone());
        let this = self.clone();
        let who = who.clone();
        let run_cancel = cancel.clone();
        tokio::spawn(async move {
            let run_id = record.id.clone();
            exec::run(&this, &who, plan, record, tx, run_cancel).await;
            this.active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&run_id);
        });
        Ok(Handle::new(id, rx, cancel))
    }

    /// What the sandbox's creation would refuse (limits over the server's, a missing or
    /// damaged template, a network on a server without egress), refused before the run exists.
    async fn check_sandbox(&self, plan: &spec::Plan) -> Result<(), RunError> {
        self.manager.request_policy(plan.network.as_ref())?;
        if let Some(l) = &plan.limits {
            let full = spec::fill_limits(l, self.manager.limits());
            self.manager.request_limits(Some(&full))?;
        }
        self.manager.resolve_template(&plan.template).await?;
        Ok(())
    }

    /// What can be checked before any sandbox exists: the team's workspaces and secrets.
    /// Refuses an `output_limit` above the server's maximum; brings the default down to it.
    fn check_output_limit(&self, spec: &RunSpec, plan: &mut spec::Plan) -> Result<(), RunError> {
        let max = self.config.max_output;
        let asked = &spec.output_limit;
        if asked.bytes.is_some_and(|b| b > max.max_bytes) {
            return Err(RunError::Invalid(format!(
                "output_limit.bytes is more than this server allows ({} bytes)",
                max.max_bytes
            )));
        }
        if asked.files.is_some_and(|f| f > max.max_files) {
            return Err(RunError::Invalid(format!(
                "output_limit.files is more than this server allows ({})",
                max.max_files
            )));
        }
        let l = &mut plan.output_limits;
        l.max_bytes = l.max_bytes.min(max.max_bytes);
        l.max_files = l.max_files.min(max.max_files);
        Ok(())
    }

    fn check_team_state(&self, who: &Principal, plan: &spec::Plan) -> Result<(), RunError> {
        let names = plan
            .workspaces
            .iter()
            .map(|w| &w.name)
            .chain(plan.output_workspace.as_ref());
        for name in names {
            let Some(ws) = self.manager.workspaces() else {
                return Err(RunError::Invalid(self.manager.workspaces_off().into()));
            };
            ws.dir(&who.team, name).map_err(|e| match e {
                crate::workspaces::WorkspaceError::NotFound(_) => {
                    RunError::WorkspaceNotFound(name.clone())
                }
                other => RunError::Invalid(other.to_string()),
            })?;
        }
        if !plan.secrets.is_empty() {
            let Some(secrets) = self.manager.secrets() else {
                return Err(RunError::Invalid(
                    "secrets are not enabled on this server".into(),
                ));
            };
            secrets
                .check_refs(&who.team, &plan.env)
                .map_err(|e| match e {
                    crate::secrets::SecretError::NotFound(n) => RunError::SecretNotFound(n),
                    crate::secrets::SecretError::Store(e) => RunError::Store(e),
                    other => RunError::Invalid(other.to_string()),
                })?;
        }
        Ok(())
    }

    pub(crate) fn save_run(&self, r: &RunRecord) -> Result<(), RunError> {
        self.store.put_run_record(&RunRow {
            table: RunTable::Runs,
            id: &r.id,
            team: &r.team,
            batch: r.batch.as_deref(),
            created_at: r.created_at,
            ended_at: r.ended_at,
            record: &json(r),
        })?;
        Ok(())
    }

    /// A run of `who`'s team.
    pub fn get(&self, who: &Principal, id: &str) -> Result<RunRecord, RunError> {
        let text = self
            .store
            .run_record(RunTable::Runs, &who.team, id)?
            .ok_or_else(|| RunError::NotFound(id.to_owned()))?;
        serde_json::from_str(&text).map_err(|e| {
            RunError::Store(crate::store::StoreError::Corrupt(format!("run {id}: {e}")))
        })
    }

    /// The team's newest runs, newest first.
    pub fn list(&self, who: &Principal, limit: u32) -> Result<Vec<RunRecord>, RunError> {
        Ok(self
            .store
            .run_records(RunTable::Runs, &who.team, None, limit.min(MAX_LIST))?
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect())
    }

    /// Cancels a run or batch of `who`'s team that is in progress; `false` if it has ended.
    pub fn cancel(&self, who: &Principal, id: &str) -> Result<bool, RunError> {
        let table = if id.starts_with("batch_") {
            RunTable::Batches
        } else {
            RunTable::Runs
        };
        if self.store.run_record(table, &who.team, id)?.is_none() {
            return Err(RunError::NotFound(id.to_owned()));
        }
        let token = self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        match token {
            Some(t) => {
                t.cancel();
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// How many runs and batches are in progress.
    pub fn active(&self) -> usize {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

fn json<T: Serialize>(v: &T) -> String {
    // Records are plain data: serialising cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| "{}".into())
}

impl From<CoreError> for RunError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::TemplateNotFound(t) => RunError::TemplateNotFound(t),
            CoreError::TemplateBroken(m) => RunError::Unavailable(m),
            CoreError::WorkspaceNotFound(w) => RunError::WorkspaceNotFound(w),
            CoreError::InvalidArgument(m) | CoreError::Unsupported(m) => RunError::Invalid(m),
            CoreError::Store(e) => RunError::Store(e),
            other => RunError::Unavailable(husk_runtime::failure::chain(&other)),
        }
    }
}
