//! A template's start command and ready check: the start command is launched in the
//! background of every new sandbox of the template, and the ready check run until it exits 0,
//! before the sandbox is handed out (E2B templates' `start_cmd` / `ready_cmd`).

use std::time::{Duration, Instant};

use husk_proto::{ProcEvent, StartProc, User};

use crate::agent::AgentClient;
use crate::template::Resolved;

/// Ready checks run at most this often.
const RETRY: Duration = Duration::from_millis(100);

/// Default time a ready check may take.
const DEFAULT_READY_TIMEOUT: Duration = Duration::from_secs(60);

fn shell(cmd: &str, user: User, tag: &str, timeout: Option<Duration>) -> StartProc {
    StartProc {
        user,
        tag: Some(tag.into()),
        timeout_ms: timeout.map(|t| t.as_millis() as u64),
        ..StartProc::new("/bin/sh", vec!["-c".into(), cmd.into()])
    }
}

/// Starts the template's start command and waits for its ready check; the error says why
/// the sandbox cannot be handed out.
pub async fn run(agent: &AgentClient, template: &Resolved, user: User) -> Result<(), String> {
    let d = &template.defaults;
    let Some(start) = d.start_cmd.as_deref() else {
        return Ok(());
    };
    let name = &template.name;
    // The stream is dropped: the process runs on in the background (listed as `start_cmd`).
    agent
        .start(shell(start, user, "start_cmd", None))
        .await
        .map_err(|e| format!("template '{name}': starting its start command failed: {e}"))?;
    let Some(ready) = d.ready_cmd.as_deref() else {
        return Ok(());
    };
    let limit = d
        .ready_timeout_secs
        .map_or(DEFAULT_READY_TIMEOUT, Duration::from_secs);
    let deadline = Instant::now() + limit;
    let mut last = String::from("it never ran");
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, mut stream) = agent
            .start(shell(ready, user, "ready_cmd", Some(left)))
            .await
            .map_err(|e| format!("template '{name}': running its ready check failed: {e}"))?;
        while let Some(ev) = stream.next().await {
            if let ProcEvent::End(end) = ev {
                if end.exit_code == 0 {
                    return Ok(());
                }
                last = format!("last exit code {}", end.exit_code);
            }
        }
        tokio::time::sleep(RETRY.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
    Err(format!(
        "template '{name}': its ready check `{ready}` did not succeed within {} s ({last})",
        limit.as_secs()
    ))
}
