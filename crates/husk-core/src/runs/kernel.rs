//! A `code` run in the template's Jupyter kernel: a context of its own (the run's env and
//! secrets in the kernel's environment, its workdir as the kernel's), one execution, its
//! output and results streamed as run events. The code interpreter's path, one-shot.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::exec::{emit, with_masking, Tail};
use super::spec::Plan;
use super::{Cancel, RunEvent, RunRecord, RunStatus};
use crate::contexts::ExecOut;
use crate::manager::{LiveSandbox, Manager};

/// Bytes of the main result's text kept in the record.
const RESULT_TEXT_BYTES: usize = 64 << 10;

/// Runs the code; `(status, exit code, reason)` as a process run reports them: 0 and
/// `succeeded` without an error, 1 and the error's `Name: value` with one.
#[allow(clippy::too_many_arguments)]
pub(super) async fn run(
    manager: &Arc<Manager>,
    plan: &Plan,
    sb: &Arc<LiveSandbox>,
    language: &str,
    code: String,
    workdir: Option<String>,
    rec: &mut RunRecord,
    tx: &mpsc::Sender<RunEvent>,
    cancel: &Cancel,
) -> Result<(RunStatus, Option<i32>, String), String> {
    let user = plan.user.unwrap_or(sb.default_user);
    let mut envs = plan.env.clone();
    with_masking(plan, &mut envs);
    let secrets = manager
        .process_secrets(sb, &mut envs)
        .map_err(|e| crate::error_chain(&e))?;
    let kernel = format!("{language} kernel");
    manager.audit_secrets(&sb.team, &sb.id, &kernel, &secrets.names);
    // The context masks the secrets' values in everything the kernel reports (output,
    // results, errors).
    let ctx = sb
        .contexts
        .create_for_run(
            language,
            workdir.as_deref(),
            user,
            envs,
            secrets.env,
            secrets.redact,
        )
        .await
        .map_err(|e| format!("starting the {language} kernel failed: {e}"))?;
    let mut events = sb
        .contexts
        .execute(ctx, code, Vec::new())
        .await
        .map_err(|e| e.to_string())?;
    let (mut out_tail, mut err_tail) = (Tail::default(), Tail::default());
    let deadline = tokio::time::Instant::now() + plan.timeout;
    let mut error: Option<String> = None;
    let mut died: Option<String> = None;
    let mut stop: Option<(RunStatus, String)> = None;
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = cancel.cancelled(), if stop.is_none() => {
                stop = Some((RunStatus::Cancelled, "cancelled".into()));
                break;
            }
            _ = tokio::time::sleep_until(deadline), if stop.is_none() => {
                stop = Some((
                    RunStatus::TimedOut,
                    format!("timeout after {} s", plan.timeout.as_secs_f64()),
                ));
                break;
            }
        };
        match ev {
            None | Some(ExecOut::End) => break,
            Some(ExecOut::Count(_)) => {}
            Some(ExecOut::Stdout { text: data, .. }) => {
                out_tail.push(data.as_bytes());
                emit(tx, RunEvent::Stdout { data }).await;
            }
            Some(ExecOut::Stderr { text: data, .. }) => {
                err_tail.push(data.as_bytes());
                emit(tx, RunEvent::Stderr { data }).await;
            }
            Some(ExecOut::Result { is_main, data }) => {
                if is_main {
                    rec.result = data
                        .iter()
                        .find(|d| d.mime == "text/plain")
                        .and_then(|d| d.value.as_str())
                        .map(|t| truncate(t, RESULT_TEXT_BYTES));
                }
                let data = data.into_iter().map(|d| (d.mime, d.value)).collect();
                emit(tx, RunEvent::Result { is_main, data }).await;
            }
            Some(ExecOut::Error {
                name,
                value,
                traceback,
            }) => {
                // The traceback goes to stderr as an interpreter would print it (without
                // IPython's colours).
                let mut data = strip_ansi(&traceback.join("\n"));
                data.push('\n');
                err_tail.push(data.as_bytes());
                emit(tx, RunEvent::Stderr { data }).await;
                error = Some(if value.is_empty() {
                    name
                } else {
                    format!("{name}: {value}")
                });
            }
            Some(ExecOut::KernelDied(why)) => died = Some(why),
            Some(ExecOut::SandboxGone) => {
                died = Some("the sandbox is gone".into());
                break;
            }
        }
    }
    // On a timeout or cancel, dropping the receiver interrupts the kernel (and the sandbox
    // goes right after anyway).
    drop(events);
    rec.stdout_tail = out_tail.text();
    rec.stderr_tail = err_tail.text();
    Ok(match (stop, died, error) {
        (Some((status, reason)), _, _) => (status, None, reason),
        (None, Some(why), _) if sb.oom_kills() > 0 => (
            RunStatus::Failed,
            None,
            format!("out of memory (the kernel died: {why})"),
        ),
        (None, Some(why), _) => (RunStatus::Failed, None, format!("the kernel died: {why}")),
        (None, None, Some(e)) => (RunStatus::Failed, Some(1), e),
        (None, None, None) => (RunStatus::Succeeded, Some(0), "succeeded".into()),
    })
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

/// Text without ANSI escape sequences (CSI `ESC [ ... final`), as IPython colours tracebacks.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ansi_colours_are_removed() {
        assert_eq!(
            strip_ansi("\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero"),
            "ZeroDivisionError: division by zero"
        );
        assert_eq!(strip_ansi("plain [text]"), "plain [text]");
    }

    #[test]
    fn truncation_keeps_whole_chars() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
