//! The end of a sandbox: its timeout, its agent's death, a kill or the server's shutdown.

use std::sync::Arc;
use std::time::Duration;

use time::OffsetDateTime;

use super::{read, write, CoreError, EndReason, LiveSandbox, Manager, OnTimeout, PauseMode};

impl Manager {
    /// Ends the sandbox at its timeout, or when its agent dies.
    pub(super) async fn supervise(self: Arc<Self>, sb: Arc<LiveSandbox>) {
        let reason = loop {
            // Its backstop and record follow what changed (see kept.rs).
            self.sync_kept(&sb).await;
            if sb.is_paused() {
                // A paused sandbox does not time out; its agent cannot end while frozen but
                // may be killed.
                tokio::select! {
                    _ = sb.timeout_changed.notified() => continue,
                    _ = sb.changed.notified() => continue,
                    _ = sb.agent.closed() => {
                        if !self.holds(&sb) {
                            // Left running for the next server (stop_keeping), or removed.
                            return;
                        }
                        tracing::info!(sandbox = %sb.id, "agent gone: destroying sandbox");
                        break EndReason::AgentGone;
                    }
                }
            }
            let left = sb.end_at() - OffsetDateTime::now_utc();
            if left <= time::Duration::ZERO {
                if let OnTimeout::Pause(mode) = sb.lifecycle.on_timeout {
                    match self.pause_sandbox(&sb, mode).await {
                        Ok(_) if mode == PauseMode::Filesystem => return,
                        Ok(_) => {
                            tracing::info!(sandbox = %sb.id, "timeout: paused");
                            continue;
                        }
                        // Gone meanwhile (killed).
                        Err(CoreError::NotFound(_)) => return,
                        Err(e) => tracing::warn!(
                            sandbox = %sb.id,
                            error = %crate::error_chain(&e),
                            "timeout: pausing failed, destroying the sandbox"
                        ),
                    }
                }
                tracing::info!(sandbox = %sb.id, "timeout: destroying sandbox");
                break EndReason::Timeout;
            }
            let left = Duration::try_from(left).unwrap_or(Duration::ZERO);
            tokio::select! {
                _ = tokio::time::sleep(left) => {}
                _ = sb.timeout_changed.notified() => {}
                _ = sb.changed.notified() => {}
                _ = sb.agent.closed() => {
                    if !self.holds(&sb) {
                        return;
                    }
                    tracing::info!(sandbox = %sb.id, "agent gone: destroying sandbox");
                    break EndReason::AgentGone;
                }
            }
        };
        // Counted only if this was the end (a kill may have removed it meanwhile).
        if self.remove(&sb.id).await {
            self.count_end(reason);
        }
    }

    /// Whether `sb` is (still) one of the manager's live sandboxes.
    fn holds(&self, sb: &Arc<LiveSandbox>) -> bool {
        read(&self.sandboxes)
            .get(&sb.id)
            .is_some_and(|s| Arc::ptr_eq(s, sb))
    }

    pub(super) async fn destroy_runtime(&self, runtime_id: String) {
        let host = self.host.clone();
        let res = tokio::task::spawn_blocking(move || host.destroy(&runtime_id)).await;
        if let Ok(Err(e)) = res {
            tracing::warn!(error = %e, "destroying sandbox failed");
        }
    }

    /// Removes and destroys a sandbox (no tenancy check), and its saved files. Idempotent.
    pub(super) async fn remove(&self, id: &str) -> bool {
        self.remove_with(id, true).await
    }

    /// Removes and destroys a sandbox; with `drop_layers`, its saved files too (not when it
    /// is being paused to disk: they are what it resumes on).
    pub(super) async fn remove_with(&self, id: &str, drop_layers: bool) -> bool {
        self.remove_as(id, drop_layers, None).await
    }

    /// [`Self::remove_with`]; with `lost`, its record is kept, marked lost for that reason.
    async fn remove_as(&self, id: &str, drop_layers: bool, lost: Option<&str>) -> bool {
        let Some(sb) = write(&self.sandboxes).remove(id) else {
            return false;
        };
        sb.agent.close().await;
        self.destroy_runtime(sb.runtime_id.clone()).await;
        let _ = match lost {
            Some(reason) => {
                let now = time::OffsetDateTime::now_utc();
                self.store.mark_sandbox_lost(id, reason, now)
            }
            None => self.store.delete_sandbox(id),
        };
        if drop_layers && sb.base_layer.is_some() {
            self.drop_layers(id).await;
        }
        if sb.origin.snapshot.is_some() {
            self.collect_snapshots().await;
        }
        true
    }

    /// A cluster node declared lost while it still ran (it was cut off from the database
    /// for too long): a gateway has told the teams its sandboxes are lost and freed their
    /// quota, so those must not run on. Destroys each whose record says lost; how many.
    pub async fn end_declared_lost(&self) -> usize {
        let ids: Vec<String> = read(&self.sandboxes).keys().cloned().collect();
        let mut ended = 0;
        for id in ids {
            let lost = match self.store.lost_sandboxes(None, Some(&id)) {
                Ok(l) => !l.is_empty(),
                Err(e) => {
                    tracing::warn!(sandbox = %id, error = %crate::error_chain(&e), "cannot tell whether a sandbox was declared lost");
                    false
                }
            };
            if lost && self.remove_as(&id, true, Some(NODE_DECLARED_LOST)).await {
                ended += 1;
            }
        }
        ended
    }

    /// Server shutdown: sandboxes paused in place are saved to disk, every other one is
    /// destroyed and listed as lost. Sandboxes paused to disk stay as they are, for the next
    /// server.
    pub async fn shutdown(self: &Arc<Self>) {
        self.drain_pools().await;
        let saved = self.save_paused_at_stop().await;
        if saved > 0 {
            tracing::info!(count = saved, "saved paused sandboxes to disk");
        }
        let ids: Vec<String> = read(&self.sandboxes).keys().cloned().collect();
        for id in ids {
            self.remove_as(&id, true, Some(super::LOST_AT_STOP)).await;
        }
    }
}

/// Why the sandboxes of a node that was declared lost while it ran were ended.
pub const NODE_DECLARED_LOST: &str =
    "its node was cut off from the cluster for too long and was declared lost";
