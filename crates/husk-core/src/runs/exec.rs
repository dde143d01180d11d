//! One run, start to end: sandbox, files, process, events, outputs, destruction.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::calls::{ProcEnd, ProcEvent, ProcessSpec, SandboxPath, PROCESS_TIMED_OUT};
use time::OffsetDateTime;
use tokio::sync::mpsc;

use super::spec::{fill_limits, Plan};
use super::{Cancel, RunEvent, RunRecord, RunStatus, Runs};
use crate::manager::{CreateRequest, EnvVars, LiveSandbox, Manager};
use crate::secrets::REDACT_ENV;
use crate::store::Principal;

/// Time the sandbox outlives the run's timeout, for saving its outputs (the manager's own
/// timeout is only a backstop: the run destroys its sandbox itself).
const OUTPUT_GRACE: Duration = Duration::from_secs(120);

/// How long after the run's timeout the agent must have reported the process's end before the
/// run gives up on it.
const END_GRACE: Duration = Duration::from_secs(5);

/// Bytes of stdout and stderr kept for the record.
const TAIL_BYTES: usize = 4096;

/// Destroys the sandbox when dropped, whatever path the run took (a panic included).
struct Destroy {
    manager: Arc<Manager>,
    who: Principal,
    id: Option<String>,
}

impl Destroy {
    async fn now(mut self) {
        if let Some(id) = self.id.take() {
            let _ = self.manager.kill(&self.who, &id).await;
        }
    }
}

impl Drop for Destroy {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let (m, who) = (self.manager.clone(), self.who.clone());
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(async move {
                    let _ = m.kill(&who, &id).await;
                });
            }
        }
    }
}

/// Decodes a byte stream as UTF-8 across chunk boundaries (a character split between two
/// chunks is sent whole with the second); invalid bytes become U+FFFD.
#[derive(Default)]
struct Utf8Stream {
    carry: Vec<u8>,
}

impl Utf8Stream {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.carry.extend_from_slice(bytes);
        // An incomplete sequence at the end is at most 3 bytes long.
        let cut = match std::str::from_utf8(&self.carry) {
            Ok(_) => self.carry.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => incomplete_tail(&self.carry),
        };
        let rest = self.carry.split_off(cut);
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry = rest;
        text
    }

    fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.carry).into_owned();
        self.carry.clear();
        text
    }
}

/// Where an incomplete UTF-8 sequence starts at the end of `b` (its length if none does).
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let i = b.len() - back;
        let lead = b[i];
        if lead & 0xC0 != 0x80 {
            let need = match lead {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                0xF0..=0xF7 => 4,
                _ => 1,
            };
            return if need > back { i } else { b.len() };
        }
    }
    b.len()
}

/// The last [`TAIL_BYTES`] of a stream.
#[derive(Default)]
pub(super) struct Tail(Vec<u8>);

impl Tail {
    pub(super) fn push(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
        if self.0.len() > TAIL_BYTES * 2 {
            let cut = self.0.len() - TAIL_BYTES;
            self.0.drain(..cut);
        }
    }

    pub(super) fn text(&self) -> String {
        let start = self.0.len().saturating_sub(TAIL_BYTES);
        String::from_utf8_lossy(&self.0[start..]).into_owned()
    }
}

/// Sends an event; a client that went away is not an error here (its handle's drop cancels
/// the run, unless it was detached).
pub(super) async fn emit(tx: &mpsc::Sender<RunEvent>, ev: RunEvent) {
    let _ = tx.send(ev).await;
}

/// Runs `plan` to its end and records it; never returns before the sandbox is destroyed.
pub(super) async fn run(
    runs: &Arc<Runs>,
    who: &Principal,
    plan: Plan,
    mut rec: RunRecord,
    tx: mpsc::Sender<RunEvent>,
    cancel: Cancel,
) {
    let started = Instant::now();
    if let Err(message) = execute(runs, who, &plan, &mut rec, &tx, &cancel, started).await {
        if !rec.status.ended() || rec.status == RunStatus::Succeeded {
            rec.status = RunStatus::Error;
        }
        rec.error = Some(message.clone());
        emit(&tx, RunEvent::Error { message }).await;
    }
    if !rec.status.ended() {
        rec.status = RunStatus::Error;
    }
    rec.ended_at = Some(OffsetDateTime::now_utc());
    rec.duration_ms = Some(started.elapsed().as_millis() as u64);
    if let Err(e) = runs.save_run(&rec) {
        tracing::warn!(run = %rec.id, error = %e, "could not record the run's end");
    }
    emit(&tx, RunEvent::End { run: Box::new(rec) }).await;
}

async fn execute(
    runs: &Arc<Runs>,
    who: &Principal,
    plan: &Plan,
    rec: &mut RunRecord,
    tx: &mpsc::Sender<RunEvent>,
    cancel: &Cancel,
    started: Instant,
) -> Result<(), String> {
    let manager = runs.manager().clone();
    let (sb, guard) = create_sandbox(&manager, who, plan, rec).await?;
    if cancel.is_cancelled() {
        rec.status = RunStatus::Cancelled;
        rec.reason = Some("cancelled".into());
        guard.now().await;
        return Ok(());
    }
    let _ = runs.save_run(rec);
    emit(
        tx,
        RunEvent::Started {
            run_id: rec.id.clone(),
            sandbox_id: sb.id.clone(),
        },
    )
    .await;
    let user = plan.user.unwrap_or(sb.default_user);
    // Relative files go where the command runs: the run's workdir, else the template's (else
    // the agent resolves them against the user's home, where the command then runs too).
    let workdir = plan.workdir.clone().or_else(|| sb.default_workdir.clone());
    let kernel = kernel_for(plan, &sb).await;
    write_inputs(plan, &sb, workdir.as_deref(), user, kernel.is_none()).await?;
    let (status, exit_code, reason) = match kernel {
        Some((lang, code)) => {
            super::kernel::run(&manager, plan, &sb, &lang, code, workdir, rec, tx, cancel).await?
        }
        None => run_command(&manager, plan, &sb, user, rec, tx, cancel).await?,
    };
    finish(
        runs, who, plan, rec, tx, &sb, guard, started, status, exit_code, reason,
    )
    .await
}

/// The run's sandbox, recorded in `rec`, and the guard that destroys it.
async fn create_sandbox(
    manager: &Arc<Manager>,
    who: &Principal,
    plan: &Plan,
    rec: &mut RunRecord,
) -> Result<(Arc<LiveSandbox>, Destroy), String> {
    let mut metadata = BTreeMap::new();
    metadata.insert("husk.run".to_owned(), rec.id.clone());
    let req = CreateRequest {
        template: plan.template.clone(),
        timeout: plan.timeout + OUTPUT_GRACE,
        metadata,
        // A code run's environment is its sandbox's: the kernel (the sandbox's interpreter)
        // and the agent's kernel lookup (`JUPYTER_PATH`) see it. Secrets stay references
        // there, resolved for the one process or kernel that runs.
        env: match &plan.code {
            Some(_) => EnvVars::new(
                plan.env
                    .iter()
                    .filter(|(k, _)| k != REDACT_ENV)
                    .cloned()
                    .collect(),
            )
            .map_err(|e| e.to_string())?,
            None => EnvVars::default(),
        },
        allow_internet_access: None,
        workspaces: plan.workspaces.clone(),
        limits: plan
            .limits
            .as_ref()
            .map(|l| fill_limits(l, manager.limits())),
        network: plan.network.clone(),
        allow_public_traffic: None,
        mask_request_host: None,
        rules: None,
        lifecycle: Default::default(),
    };
    // Not raced against the cancel: a creation under way always finishes (see
    // Manager::create), and the caller destroys the sandbox if the run was cancelled.
    let sb = manager
        .create(who, req)
        .await
        .map_err(|e| format!("creating the sandbox failed: {}", crate::error_chain(&e)))?;
    let guard = Destroy {
        manager: manager.clone(),
        who: who.clone(),
        id: Some(sb.id.clone()),
    };
    rec.sandbox_id = Some(sb.id.clone());
    Ok((sb, guard))
}

/// Code runs in the template's Jupyter kernel for its language when there is one (the code
/// interpreter's path: the last expression's value and display data come back as results);
/// otherwise as a file run by the language's interpreter. Code too large for one kernel
/// request runs as a file.
async fn kernel_for(plan: &Plan, sb: &LiveSandbox) -> Option<(String, String)> {
    match &plan.code {
        Some((lang, code)) if code.len() <= crate::contexts::MAX_CODE_BYTES => {
            match sb.contexts.languages().await {
                Ok(langs) if langs.contains(lang) => Some((lang.clone(), code.clone())),
                _ => None,
            }
        }
        _ => None,
    }
}

/// Writes the inline files (and the code's file, when `with_code_file`) into the sandbox;
/// relative paths go below `workdir`.
async fn write_inputs(
    plan: &Plan,
    sb: &LiveSandbox,
    workdir: Option<&str>,
    user: husk_proto::User,
    with_code_file: bool,
) -> Result<(), String> {
    let code_file = plan.code_file.as_ref().filter(|_| with_code_file);
    for (path, bytes) in code_file.into_iter().chain(plan.files.iter()) {
        let path = match (workdir, path.starts_with('/')) {
            (Some(w), false) => format!("{}/{path}", w.trim_end_matches('/')),
            _ => path.clone(),
        };
        write_file(sb, &path, bytes, user)
            .await
            .map_err(|e| format!("writing {path} into the sandbox failed: {e}"))?;
    }
    Ok(())
}

/// Runs the command, streaming its output as events, until it ends, the run is cancelled or
/// its time is up: how it ended.
async fn run_command(
    manager: &Manager,
    plan: &Plan,
    sb: &LiveSandbox,
    user: husk_proto::User,
    rec: &mut RunRecord,
    tx: &mpsc::Sender<RunEvent>,
    cancel: &Cancel,
) -> Result<(RunStatus, Option<i32>, String), String> {
    // The plan's values were checked when the run was asked for; the spec checks them again
    // as it checks every caller's.
    let invalid = |e: crate::calls::InvalidValue| format!("starting the command failed: {e}");
    let env =
        EnvVars::new(plan.env.clone()).map_err(|e| format!("starting the command failed: {e}"))?;
    let mut p = ProcessSpec::new(plan.argv[0].clone(), plan.argv[1..].to_vec())
        .map_err(invalid)?
        .env(env)
        .user(user)
        .stdin(false)
        .timeout_ms(Some(plan.timeout.as_millis() as u64));
    if let Some(dir) = &plan.workdir {
        p = p.cwd(SandboxPath::named("workdir", dir.clone()).map_err(invalid)?);
    }
    with_masking(plan, p.envs_mut());
    // Secrets, masking and audit: as for any process started in a sandbox.
    let (_pid, mut events) = manager
        .start_process(sb, p)
        .await
        .map_err(|e| format!("starting the command failed: {}", crate::error_chain(&e)))?;

    let (mut out, mut err) = (Utf8Stream::default(), Utf8Stream::default());
    let (mut out_tail, mut err_tail) = (Tail::default(), Tail::default());
    let deadline = tokio::time::Instant::now() + plan.timeout + END_GRACE;
    let mut cancelled = false;
    let mut overdue = false;
    let end: Option<ProcEnd> = loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(ProcEvent::Stdout(b)) => {
                    out_tail.push(&b);
                    let data = out.push(&b);
                    if !data.is_empty() {
                        emit(tx, RunEvent::Stdout { data }).await;
                    }
                }
                Some(ProcEvent::Stderr(b)) => {
                    err_tail.push(&b);
                    let data = err.push(&b);
                    if !data.is_empty() {
                        emit(tx, RunEvent::Stderr { data }).await;
                    }
                }
                Some(ProcEvent::Pty(_)) => {}
                Some(ProcEvent::End(e)) => break Some(e),
                None => break None,
            },
            _ = cancel.cancelled() => {
                cancelled = true;
                break None;
            }
            _ = tokio::time::sleep_until(deadline) => {
                overdue = true;
                break None;
            }
        }
    };
    for (s, ev) in [(out.finish(), true), (err.finish(), false)] {
        if !s.is_empty() {
            let e = if ev {
                RunEvent::Stdout { data: s }
            } else {
                RunEvent::Stderr { data: s }
            };
            emit(tx, e).await;
        }
    }
    rec.stdout_tail = out_tail.text();
    rec.stderr_tail = err_tail.text();
    let secs = plan.timeout.as_secs_f64();
    Ok(if cancelled {
        (RunStatus::Cancelled, None, "cancelled".to_owned())
    } else if overdue {
        (RunStatus::TimedOut, None, format!("timeout after {secs} s"))
    } else {
        match end {
            Some(e) if e.error.as_deref() == Some(PROCESS_TIMED_OUT) => (
                RunStatus::TimedOut,
                Some(e.exit_code),
                format!("timeout after {secs} s"),
            ),
            Some(e) if e.exited && e.exit_code == 0 => (RunStatus::Succeeded, Some(0), e.status),
            Some(e) if e.exited => (RunStatus::Failed, Some(e.exit_code), e.status),
            Some(e) if sb.oom_kills() > 0 => (
                RunStatus::Failed,
                Some(e.exit_code),
                "out of memory".to_owned(),
            ),
            Some(e) => (RunStatus::Failed, Some(e.exit_code), e.status),
            None if sb.oom_kills() > 0 => (RunStatus::Failed, None, "out of memory".to_owned()),
            None => (
                RunStatus::Error,
                None,
                "the sandbox ended before the command did".to_owned(),
            ),
        }
    })
}

/// The run's environment `envs` with its masking switch (`HUSK_REDACT=0` unless the run
/// masks its secrets' values), for [`Manager::process_secrets`] to resolve.
pub(super) fn with_masking(plan: &Plan, envs: &mut Vec<(String, String)>) {
    envs.retain(|(k, _)| k != REDACT_ENV);
    if !plan.redact {
        envs.push((REDACT_ENV.into(), "0".into()));
    }
}

/// Records how the run ended, saves its outputs and destroys its sandbox.
#[allow(clippy::too_many_arguments)]
async fn finish(
    runs: &Arc<Runs>,
    who: &Principal,
    plan: &Plan,
    rec: &mut RunRecord,
    tx: &mpsc::Sender<RunEvent>,
    sb: &Arc<LiveSandbox>,
    guard: Destroy,
    started: Instant,
    status: RunStatus,
    exit_code: Option<i32>,
    reason: String,
) -> Result<(), String> {
    let cancelled = status == RunStatus::Cancelled;
    rec.status = status;
    rec.exit_code = exit_code;
    rec.reason = Some(reason.clone());
    emit(
        tx,
        RunEvent::Exited {
            exit_code,
            status,
            reason,
            duration_ms: started.elapsed().as_millis() as u64,
        },
    )
    .await;

    if !plan.outputs.is_empty() && !cancelled {
        let saved = save_outputs(runs, who, plan, &rec.id, sb).await;
        match saved {
            Ok(report) => {
                rec.outputs = Some(report.clone());
                emit(tx, RunEvent::Outputs(report)).await;
            }
            Err(e) => {
                guard.now().await;
                return Err(format!("saving outputs failed: {e}"));
            }
        }
    }
    guard.now().await;
    Ok(())
}

/// Freezes the sandbox and copies the outputs into the output workspace.
async fn save_outputs(
    runs: &Arc<Runs>,
    who: &Principal,
    plan: &Plan,
    run_id: &str,
    sb: &Arc<LiveSandbox>,
) -> Result<super::OutputsReport, String> {
    let ws_name = plan.output_workspace.clone().ok_or("no output workspace")?;
    let workspaces = runs
        .manager()
        .workspaces()
        .ok_or("workspaces are not enabled on this server")?
        .clone();
    let (outputs, limits, run_id) = (plan.outputs.clone(), plan.output_limits, run_id.to_owned());
    let (sb, team) = (sb.clone(), who.team.clone());
    // Frozen first, then copied: through the files helper, which gets the sandbox's root from
    // the spawner by the sandbox's id.
    tokio::task::spawn_blocking(move || {
        let saved = workspaces.save_outputs(&team, &ws_name, &run_id, &sb, &outputs, &limits);
        saved.map_err(|e| match e {
            // The team's quota: said as the workspace API says it (what was being written
            // after).
            super::outputs::SaveError::NoSpace(what) => match workspaces.quota_error(&team) {
                Some(quota) => format!("{quota} ({what})"),
                None => format!("{what}: no space left on the host's disk"),
            },
            other => other.to_string(),
        })
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Writes `bytes` to `path` in the sandbox as `user` (through the core's file door; the agent
/// resolves the path inside the sandbox).
async fn write_file(
    sb: &LiveSandbox,
    path: &str,
    bytes: &[u8],
    user: husk_proto::User,
) -> Result<(), String> {
    let path = SandboxPath::new(path).map_err(|e| e.to_string())?;
    let mut file = sb
        .write_file(&path, user, Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    for chunk in bytes.chunks(husk_proto::CHUNK) {
        file.write(chunk.to_vec())
            .await
            .map_err(|e| e.to_string())?;
    }
    file.finish().await.map(|_| ()).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_across_chunks_is_sent_whole() {
        let mut s = Utf8Stream::default();
        let text = "naïve €5 😀";
        let bytes = text.as_bytes();
        let mut got = String::new();
        for b in bytes.chunks(1) {
            got.push_str(&s.push(b));
        }
        got.push_str(&s.finish());
        assert_eq!(got, text);
        // Invalid bytes are replaced, not held back forever.
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(b"a\xffb"), "a\u{fffd}b");
        assert_eq!(s.push(b"\xe2\x82"), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = Tail::default();
        for _ in 0..100 {
            t.push(&[b'x'; 1000]);
        }
        t.push(b"END");
        let text = t.text();
        assert_eq!(text.len(), TAIL_BYTES);
        assert!(text.ends_with("END"));
    }
}
