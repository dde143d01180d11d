//! Batches: one run spec fanned out over many inputs, at most `parallel` sandboxes at a time.
//! Each item is a run of its own (own sandbox, own record, own `runs/<run-id>/` outputs); one
//! item failing does not stop the others; cancelling the batch cancels every item (each run
//! destroys its sandbox) and starts no more.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::sync::{mpsc, Semaphore};

use super::spec::InlineFile;
use super::{
    json, new_id, Cancel, Handle, RunError, RunEvent, RunRecord, RunSpec, RunStatus, Runs,
};
use crate::store::{Principal, RunRow, RunTable};

/// Most items of one batch.
pub const MAX_ITEMS: usize = 10_000;
/// Most bytes of a batch's items, each with its own copy of the run's files, command and
/// environment: what a running batch holds in the server's memory.
pub const MAX_BATCH_BYTES: usize = 32 << 20;
/// Most batches one team may have running at once (with [`MAX_BATCH_BYTES`], what a team's
/// batches can hold in the server's memory).
pub const MAX_BATCHES_PER_TEAM: usize = 4;
/// Most sandboxes one batch runs at once.
pub const MAX_PARALLEL: usize = 64;

/// A batch as the client sends it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// The run every item makes; `{}` in its command, shell line or env values is the item's
    /// arguments.
    pub run: RunSpec,
    pub items: Vec<BatchItem>,
    /// How many items run at once [default: the number of CPUs].
    #[serde(default)]
    pub parallel: Option<usize>,
}

/// One input of a batch.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// What `{}` stands for: a standalone `{}` argument becomes these arguments; a `{}` inside
    /// a longer argument, env value or shell line becomes them joined by spaces (shell-quoted
    /// in a shell line).
    #[serde(default)]
    pub args: Vec<String>,
    /// Files of this item only (its input data, typically), added to the run's.
    #[serde(default)]
    pub files: Vec<InlineFile>,
    /// Environment of this item only, over the run's.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchStatus {
    Running,
    /// Every item ran (whatever each one's outcome).
    Completed,
    Cancelled,
    /// The server stopped during the batch.
    Error,
}

/// One item in a batch's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ItemSummary {
    pub index: usize,
    pub args: Vec<String>,
    pub run_id: Option<String>,
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub reason: Option<String>,
    pub error: Option<String>,
    pub duration_ms: Option<u64>,
}

/// A batch as recorded and returned by the API: the summary and every item's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchRecord {
    pub id: String,
    pub team: String,
    pub key_id: String,
    pub status: BatchStatus,
    pub parallel: usize,
    pub total: usize,
    pub succeeded: usize,
    pub failed: usize,
    pub timed_out: usize,
    pub cancelled: usize,
    pub errors: usize,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    pub ended_at: Option<OffsetDateTime>,
    pub duration_ms: Option<u64>,
    pub items: Vec<ItemSummary>,
}

/// What a batch streams.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BatchEvent {
    BatchStarted {
        batch_id: String,
        total: usize,
        parallel: usize,
    },
    ItemStarted {
        index: usize,
        run_id: String,
        sandbox_id: String,
    },
    /// An item ended (in whatever way); `run` is its record.
    ItemFinished { index: usize, run: Box<RunRecord> },
    /// An item that could not start (or was never started: the batch was cancelled).
    ItemFailed {
        index: usize,
        status: RunStatus,
        error: String,
    },
    /// The last event.
    BatchFinished { batch: Box<BatchRecord> },
}

/// A started batch; dropping it cancels the batch unless detached.
pub type BatchHandle = Handle<BatchEvent>;

/// POSIX shell quoting of one word.
fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b))
    {
        return s.to_owned();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

impl BatchSpec {
    /// The run spec of each item, `{}` substituted.
    fn item_specs(&self) -> Result<Vec<RunSpec>, RunError> {
        if self.items.is_empty() {
            return Err(RunError::Invalid("a batch needs at least one item".into()));
        }
        if self.items.len() > MAX_ITEMS {
            return Err(RunError::Invalid(format!(
                "a batch has at most {MAX_ITEMS} items"
            )));
        }
        // Every item gets its own copy of the run's files, command and environment: bounded
        // before anything is copied (a 60 MiB file times 10 000 items must not be attempted),
        // and again as each item is made (a long command line, `{}` in it, times the items).
        let size = |files: &[InlineFile]| -> usize {
            files.iter().map(|f| f.content.len() + f.path.len()).sum()
        };
        let too_large = || {
            RunError::TooLarge(format!(
                "the batch's items take more than {} MiB once each has its own copy of the \
                 run's files, command and environment; put shared inputs in a workspace",
                MAX_BATCH_BYTES >> 20
            ))
        };
        let copies = size(&self.run.files).saturating_mul(self.items.len());
        let own: usize = self.items.iter().map(|i| size(&i.files)).sum();
        if copies.saturating_add(own) > MAX_BATCH_BYTES {
            return Err(too_large());
        }
        let mut total = 0usize;
        let mut out = Vec::with_capacity(self.items.len());
        for item in &self.items {
            let joined = item.args.join(" ");
            let mut spec = self.run.clone();
            if let Some(argv) = &self.run.command {
                let mut v = Vec::new();
                for a in argv {
                    if a == "{}" {
                        v.extend(item.args.iter().cloned());
                    } else {
                        v.push(a.replace("{}", &joined));
                    }
                }
                spec.command = Some(v);
            }
            if let Some(line) = &self.run.shell {
                let quoted: Vec<String> = item.args.iter().map(|a| shell_quote(a)).collect();
                spec.shell = Some(line.replace("{}", &quoted.join(" ")));
            }
            for v in spec.env.values_mut() {
                *v = v.replace("{}", &joined);
            }
            for (k, v) in &item.env {
                spec.env.insert(k.clone(), v.clone());
            }
            spec.files.extend(item.files.iter().cloned());
            total = total.saturating_add(spec.approx_bytes());
            if total > MAX_BATCH_BYTES {
                return Err(too_large());
            }
            out.push(spec);
        }
        Ok(out)
    }
}

impl Runs {
    /// Validates every item and starts the batch.
    pub async fn start_batch(
        self: &Arc<Self>,
        who: &Principal,
        spec: &BatchSpec,
    ) -> Result<BatchHandle, RunError> {
        let slot = self.batch_slot(&who.team)?;
        let specs = spec.item_specs()?;
        for (i, s) in specs.iter().enumerate() {
            let mut plan = s
                .plan(self.manager.max_timeout())
                .map_err(|e| prefix(i, e))?;
            self.check_output_limit(s, &mut plan)
                .map_err(|e| prefix(i, e))?;
            self.check_team_state(who, &plan)
                .map_err(|e| prefix(i, e))?;
            // Items differ only in their command, env and files: one check of the sandbox
            // they all get is enough.
            if i == 0 {
                self.check_sandbox(&plan).await?;
            }
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let parallel = spec.parallel.unwrap_or(cpus);
        if parallel == 0 || parallel > MAX_PARALLEL {
            return Err(RunError::Invalid(format!(
                "parallel must be 1 to {MAX_PARALLEL}"
            )));
        }
        let id = new_id("batch")?;
        let record = BatchRecord {
            id: id.clone(),
            team: who.team.clone(),
            key_id: who.key_id.clone(),
            status: BatchStatus::Running,
            parallel,
            total: specs.len(),
            succeeded: 0,
            failed: 0,
            timed_out: 0,
            cancelled: 0,
            errors: 0,
            created_at: OffsetDateTime::now_utc(),
            ended_at: None,
            duration_ms: None,
            items: spec
                .items
                .iter()
                .enumerate()
                .map(|(index, it)| ItemSummary {
                    index,
                    args: it.args.clone(),
                    run_id: None,
                    status: RunStatus::Running,
                    exit_code: None,
                    reason: None,
                    error: None,
                    duration_ms: None,
                })
                .collect(),
        };
        self.save_batch(&record)?;
        let cancel = Cancel::default();
        self.active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id.clone(), cancel.clone());
        let (tx, rx) = mpsc::channel(64);
        let this = self.clone();
        let who = who.clone();
        let batch_cancel = cancel.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let bid = record.id.clone();
            this.run_batch(&who, specs, record, tx, batch_cancel).await;
            this.active
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&bid);
        });
        Ok(Handle::new(id, rx, cancel))
    }

    /// One of `team`'s [`MAX_BATCHES_PER_TEAM`] running batches, until dropped.
    fn batch_slot(self: &Arc<Self>, team: &str) -> Result<BatchSlot, RunError> {
        let mut running = self.batches.lock().unwrap_or_else(|p| p.into_inner());
        let n = running.entry(team.to_owned()).or_default();
        if *n >= MAX_BATCHES_PER_TEAM {
            return Err(RunError::TooMany(format!(
                "team '{team}' has {MAX_BATCHES_PER_TEAM} batches running, its limit; \
                 start this one when one has ended"
            )));
        }
        *n += 1;
        Ok(BatchSlot {
            runs: self.clone(),
            team: team.to_owned(),
        })
    }

    fn save_batch(&self, b: &BatchRecord) -> Result<(), RunError> {
        self.store.put_run_record(&RunRow {
            table: RunTable::Batches,
            id: &b.id,
            team: &b.team,
            batch: None,
            created_at: b.created_at,
            ended_at: b.ended_at,
            record: &json(b),
        })?;
        Ok(())
    }

    async fn run_batch(
        self: &Arc<Self>,
        who: &Principal,
        specs: Vec<RunSpec>,
        mut record: BatchRecord,
        tx: mpsc::Sender<BatchEvent>,
        cancel: Cancel,
    ) {
        let started = Instant::now();
        let _ = tx
            .send(BatchEvent::BatchStarted {
                batch_id: record.id.clone(),
                total: record.total,
                parallel: record.parallel,
            })
            .await;
        let slots = Arc::new(Semaphore::new(record.parallel));
        let mut tasks = tokio::task::JoinSet::new();
        let mut next = 0;
        for (index, spec) in specs.into_iter().enumerate() {
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => p,
                _ = cancel.cancelled() => break,
            };
            let Ok(permit) = permit else { break };
            if cancel.is_cancelled() {
                break;
            }
            next = index + 1;
            let (this, who, tx, cancel) = (self.clone(), who.clone(), tx.clone(), cancel.clone());
            let bid = record.id.clone();
            tasks.spawn(async move {
                let out = this.run_item(&who, &bid, index, &spec, &tx, &cancel).await;
                drop(permit);
                (index, out)
            });
        }
        while let Some(done) = tasks.join_next().await {
            if let Ok((index, summary)) = done {
                record.items[index] = ItemSummary {
                    args: std::mem::take(&mut record.items[index].args),
                    ..summary
                };
            }
        }
        // Items never started: the batch was cancelled first.
        for item in record.items.iter_mut().skip(next) {
            item.status = RunStatus::Cancelled;
            item.error = Some("the batch was cancelled before this item started".into());
            let _ = tx
                .send(BatchEvent::ItemFailed {
                    index: item.index,
                    status: RunStatus::Cancelled,
                    error: "not started: the batch was cancelled".into(),
                })
                .await;
        }
        for item in &mut record.items {
            // A task that panicked left its item running: it is an error.
            if item.status == RunStatus::Running {
                item.status = RunStatus::Error;
            }
            match item.status {
                RunStatus::Succeeded => record.succeeded += 1,
                RunStatus::Failed => record.failed += 1,
                RunStatus::TimedOut => record.timed_out += 1,
                RunStatus::Cancelled => record.cancelled += 1,
                RunStatus::Error | RunStatus::Running => record.errors += 1,
            }
        }
        record.status = if cancel.is_cancelled() {
            BatchStatus::Cancelled
        } else {
            BatchStatus::Completed
        };
        record.ended_at = Some(OffsetDateTime::now_utc());
        record.duration_ms = Some(started.elapsed().as_millis() as u64);
        if let Err(e) = self.save_batch(&record) {
            tracing::warn!(batch = %record.id, error = %e, "could not record the batch's end");
        }
        let _ = tx
            .send(BatchEvent::BatchFinished {
                batch: Box::new(record),
            })
            .await;
    }

    /// Runs one item to its end; its summary.
    async fn run_item(
        self: &Arc<Self>,
        who: &Principal,
        batch: &str,
        index: usize,
        spec: &RunSpec,
        tx: &mpsc::Sender<BatchEvent>,
        batch_cancel: &Cancel,
    ) -> ItemSummary {
        let mut summary = ItemSummary {
            index,
            args: Vec::new(),
            run_id: None,
            status: RunStatus::Error,
            exit_code: None,
            reason: None,
            error: None,
            duration_ms: None,
        };
        let mut handle = match self
            .start_in(who, spec, Some((batch, index)), Cancel::default())
            .await
        {
            Ok(h) => h,
            Err(e) => {
                summary.error = Some(e.to_string());
                let _ = tx
                    .send(BatchEvent::ItemFailed {
                        index,
                        status: RunStatus::Error,
                        error: e.to_string(),
                    })
                    .await;
                return summary;
            }
        };
        summary.run_id = Some(handle.id.clone());
        loop {
            let ev = tokio::select! {
                ev = handle.events.recv() => ev,
                _ = batch_cancel.cancelled(), if !handle.cancel.is_cancelled() => {
                    handle.cancel();
                    continue;
                }
            };
            match ev {
                Some(RunEvent::Started { run_id, sandbox_id }) => {
                    let _ = tx
                        .send(BatchEvent::ItemStarted {
                            index,
                            run_id,
                            sandbox_id,
                        })
                        .await;
                }
                Some(RunEvent::End { run }) => {
                    summary.status = run.status;
                    summary.exit_code = run.exit_code;
                    summary.reason = run.reason.clone();
                    summary.error = run.error.clone();
                    summary.duration_ms = run.duration_ms;
                    let _ = tx.send(BatchEvent::ItemFinished { index, run }).await;
                    return summary;
                }
                Some(_) => {}
                None => {
                    summary.error = Some("the run ended without a record".into());
                    return summary;
                }
            }
        }
    }

    /// A batch of `who`'s team.
    pub fn get_batch(&self, who: &Principal, id: &str) -> Result<BatchRecord, RunError> {
        let text = self
            .store
            .run_record(RunTable::Batches, &who.team, id)?
            .ok_or_else(|| RunError::NotFound(id.to_owned()))?;
        serde_json::from_str(&text).map_err(|e| {
            RunError::Store(crate::store::StoreError::Corrupt(format!(
                "batch {id}: {e}"
            )))
        })
    }

    /// The team's newest batches, newest first.
    pub fn list_batches(&self, who: &Principal, limit: u32) -> Result<Vec<BatchRecord>, RunError> {
        Ok(self
            .store
            .run_records(
                RunTable::Batches,
                &who.team,
                None,
                limit.min(super::MAX_LIST),
            )?
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect())
    }

    /// The runs of a batch, in item order.
    pub fn batch_runs(&self, who: &Principal, id: &str) -> Result<Vec<RunRecord>, RunError> {
        Ok(self
            .store
            .run_records(RunTable::Runs, &who.team, Some(id), MAX_ITEMS as u32)?
            .iter()
            .filter_map(|t| serde_json::from_str(t).ok())
            .collect())
    }
}

fn prefix(i: usize, e: RunError) -> RunError {
    match e {
        RunError::Invalid(m) => RunError::Invalid(format!("item {i}: {m}")),
        other => other,
    }
}

/// A running batch's place in its team's count ([`MAX_BATCHES_PER_TEAM`]).
struct BatchSlot {
    runs: Arc<Runs>,
    team: String,
}

impl Drop for BatchSlot {
    fn drop(&mut self) {
        let mut running = self.runs.batches.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = running.get_mut(&self.team) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                running.remove(&self.team);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_become_the_items_arguments() {
        let spec: BatchSpec = serde_json::from_value(serde_json::json!({
            "run": {"command": ["python3", "p.py", "{}", "--name={}"], "env": {"IN": "{}"}},
            "items": [{"args": ["a b.csv"]}, {"args": ["x", "y"], "env": {"E": "1"}}]
        }))
        .unwrap();
        let s = spec.item_specs().unwrap();
        assert_eq!(
            s[0].command.as_ref().unwrap(),
            &vec!["python3", "p.py", "a b.csv", "--name=a b.csv"]
        );
        assert_eq!(
            s[1].command.as_ref().unwrap(),
            &vec!["python3", "p.py", "x", "y", "--name=x y"]
        );
        assert_eq!(s[0].env["IN"], "a b.csv");
        assert_eq!(s[1].env["E"], "1");
        let spec: BatchSpec = serde_json::from_value(serde_json::json!({
            "run": {"shell": "wc -l {}"},
            "items": [{"args": ["it's here.csv"]}]
        }))
        .unwrap();
        assert_eq!(
            spec.item_specs().unwrap()[0].shell.as_deref(),
            Some(r"wc -l 'it'\''s here.csv'")
        );
        let empty = BatchSpec::default();
        assert!(empty.item_specs().is_err());
    }

    #[test]
    fn the_run_s_files_copied_to_every_item_are_bounded_first() {
        let big = "x".repeat(1 << 20);
        let spec: BatchSpec = serde_json::from_value(serde_json::json!({
            "run": {"command": ["true"], "files": [{"path": "in", "content": big}]},
            "items": vec![serde_json::json!({}); 300],
        }))
        .unwrap();
        let err = spec.item_specs().unwrap_err();
        assert!(matches!(err, RunError::TooLarge(_)), "{err}");
        assert!(err.to_string().contains("workspace"), "{err}");
    }

    /// Issue 15 M3/M4: a long command line times many items is bounded too (each item gets
    /// its own copy, `{}` replaced).
    #[test]
    fn command_lines_copied_to_every_item_are_bounded() {
        let line = format!("echo {} {{}}", "z".repeat(100 << 10));
        let items: Vec<_> = (0..400)
            .map(|i| serde_json::json!({"args": [i.to_string()]}))
            .collect();
        let spec: BatchSpec = serde_json::from_value(serde_json::json!({
            "run": {"shell": line},
            "items": items,
        }))
        .unwrap();
        let err = spec.item_specs().unwrap_err();
        assert!(matches!(err, RunError::TooLarge(_)), "{err}");
        // Fewer items fit.
        let spec: BatchSpec = serde_json::from_value(serde_json::json!({
            "run": {"shell": line},
            "items": (0..100).map(|i| serde_json::json!({"args": [i.to_string()]})).collect::<Vec<_>>(),
        }))
        .unwrap();
        assert_eq!(spec.item_specs().unwrap().len(), 100);
    }
}
