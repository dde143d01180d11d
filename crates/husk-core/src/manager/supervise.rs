//! The end of a sandbox: its timeout, its agent's death, a kill or the server's shutdown.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::{read, write, LiveSandbox, Manager};

impl Manager {
    /// Ends the sandbox at its timeout, or when its agent dies.
    pub(super) async fn supervise(self: Arc<Self>, sb: Arc<LiveSandbox>) {
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

    pub(super) async fn destroy_runtime(&self, runtime_id: String) {
        let host = self.host.clone();
        let res = tokio::task::spawn_blocking(move || host.destroy(&runtime_id)).await;
        if let Ok(Err(e)) = res {
            tracing::warn!(error = %e, "destroying sandbox failed");
        }
    }

    /// Removes and destroys a sandbox (no tenancy check). Idempotent.
    pub(super) async fn remove(&self, id: &str) -> bool {
        let Some(sb) = write(&self.sandboxes).remove(id) else {
            return false;
        };
        sb.agent.close().await;
        self.destroy_runtime(sb.runtime_id.clone()).await;
        let _ = self.store.delete_sandbox(id);
        true
    }

    /// Destroys every sandbox (server shutdown).
    pub async fn shutdown(&self) {
        let ids: Vec<String> = read(&self.sandboxes).keys().cloned().collect();
        for id in ids {
            self.remove(&id).await;
        }
    }
}
