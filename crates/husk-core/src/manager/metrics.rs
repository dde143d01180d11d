//! Sandboxes' usage over time: a sample every [`SAMPLE_EVERY`] of every live sandbox (CPU
//! and memory from its cgroups, disk from its agent at most every [`DISK_EVERY`]), the last
//! [`SAMPLES_KEPT`] of them kept per sandbox, and asked for by time range, as E2B's
//! `get_metrics(start, end)` does.
//!
//! One task samples every sandbox, on tokio's blocking pool (reading a cgroup's three files
//! costs microseconds and never waits for a sandbox, but thousands of them add up). Disk usage needs the agent (it is a `statvfs` inside the sandbox), so
//! it is asked by a task of its own per sandbox, bounded in time, and a sample carries the last
//! figure it gave: a slow or hostile agent delays only its own disk figure (a request that asks
//! for a fresh sample waits for it at most [`DISK_TIMEOUT`]).

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use husk_proto::{Reply, Request};
use time::OffsetDateTime;

use super::{CoreError, LiveSandbox, Manager, Metrics};
use crate::agent::CallError;
use crate::store::Principal;

/// How often every sandbox is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(5);
/// Samples kept per sandbox (ten minutes' worth; about 7 KiB).
pub const SAMPLES_KEPT: usize = 120;
/// How often the periodic samples refresh a sandbox's disk figure.
pub const DISK_EVERY: Duration = Duration::from_secs(30);
/// How long an agent has to report its disk usage.
const DISK_TIMEOUT: Duration = Duration::from_secs(2);

/// A sandbox's samples and what the next one is computed from.
pub(crate) struct MetricsLog {
    samples: VecDeque<Metrics>,
    /// (when, cgroup CPU ns) at the last sample: the next one's CPU share is over the time since.
    cpu: (Instant, u64),
    /// (when, used, total) of the last disk figure the agent gave.
    disk: Option<(Instant, u64, u64)>,
    /// A disk refresh is under way.
    disk_asked: bool,
}

impl MetricsLog {
    pub(crate) fn new() -> MetricsLog {
        MetricsLog {
            samples: VecDeque::new(),
            cpu: (Instant::now(), 0),
            disk: None,
            disk_asked: false,
        }
    }
}

/// A time range of samples; an unset end is now, an unset start the sandbox's start.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimeRange {
    pub start: Option<OffsetDateTime>,
    pub end: Option<OffsetDateTime>,
}

impl LiveSandbox {
    fn log(&self) -> std::sync::MutexGuard<'_, MetricsLog> {
        self.metrics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a sample now with the disk figure `disk` (used, total) and keeps it.
    fn sample(&self, disk: (u64, u64)) -> Metrics {
        let st = self.cgroup.stats();
        let now = Instant::now();
        let mut log = self.log();
        let (then, cpu_then) = log.cpu;
        let wall = now.duration_since(then).as_nanos().max(1) as f64;
        let used = st.cpu_usage_ns.saturating_sub(cpu_then) as f64;
        log.cpu = (now, st.cpu_usage_ns);
        let m = Metrics {
            timestamp: OffsetDateTime::now_utc(),
            cpu_count: self.cpu_count(),
            cpu_used_pct: (used / wall / self.cpu_count() as f64 * 100.0).clamp(0.0, 100.0),
            mem_used: st.memory_bytes,
            mem_total: self.limits.memory_bytes,
            mem_cache: st.memory_cache,
            disk_used: disk.0,
            disk_total: disk.1,
        };
        if log.samples.len() >= SAMPLES_KEPT {
            log.samples.pop_front();
        }
        log.samples.push_back(m);
        m
    }

    /// The disk figure from the agent now (remembered for the periodic samples). An agent
    /// that refuses gives none: used 0 of the sandbox's disk.
    async fn disk_now(&self) -> Result<(u64, u64), CallError> {
        let disk = match self.agent.call(Request::Disk).await {
            Ok(Reply::Disk { used, total }) => (used, total),
            Ok(_) | Err(CallError::Agent(_)) => (0, self.limits.disk_bytes),
            Err(CallError::Gone) => return Err(CallError::Gone),
        };
        self.log().disk = Some((Instant::now(), disk.0, disk.1));
        Ok(disk)
    }

    /// The last disk figure, or the sandbox's empty disk before the first.
    fn last_disk(&self) -> (u64, u64) {
        self.log()
            .disk
            .map_or((0, self.limits.disk_bytes), |(_, used, total)| {
                (used, total)
            })
    }

    /// Whether the periodic samples should ask the agent again (and that it is being asked).
    fn disk_due(&self) -> bool {
        let mut log = self.log();
        let due = !log.disk_asked && log.disk.is_none_or(|(at, _, _)| at.elapsed() >= DISK_EVERY);
        if due {
            log.disk_asked = true;
        }
        due
    }

    /// The kept samples within `[start, end]`, oldest first.
    fn samples_between(&self, start: OffsetDateTime, end: OffsetDateTime) -> Vec<Metrics> {
        self.log()
            .samples
            .iter()
            .filter(|m| m.timestamp >= start && m.timestamp <= end)
            .copied()
            .collect()
    }
}

impl Manager {
    /// `who`'s sandbox's samples in `range`. A range that reaches now gets a fresh sample
    /// (with the disk figure from the agent now) as its last.
    pub async fn metrics(
        &self,
        who: &Principal,
        id: &str,
        range: TimeRange,
    ) -> Result<Vec<Metrics>, CoreError> {
        // Paused to disk: it has no figures while it does not exist (E2B's are empty too).
        if self.dormant(&who.team, id).is_some() {
            return Ok(Vec::new());
        }
        let sb = self.get(who, id)?;
        let now = OffsetDateTime::now_utc();
        let start = range.start.unwrap_or(sb.started_at()).max(sb.started_at());
        let mut end = range.end.unwrap_or(now);
        if end < start {
            return Ok(Vec::new());
        }
        if end >= now && !sb.is_paused() {
            // An agent that does not answer in time delays only its own figure: the last one.
            let disk = match tokio::time::timeout(DISK_TIMEOUT, sb.disk_now()).await {
                Ok(Ok(disk)) => disk,
                Ok(Err(_)) => return Err(CoreError::NotFound(id.to_string())),
                Err(_) => sb.last_disk(),
            };
            // Taken a little after `now`: still within a range that reaches now.
            end = end.max(sb.sample(disk).timestamp);
        }
        Ok(sb.samples_between(start, end))
    }

    /// Samples every live sandbox once (see the module's comment).
    pub fn sample_all(&self) {
        for sb in self.all_sandboxes() {
            if sb.is_gone() {
                continue;
            }
            // A frozen agent answers nothing: a paused sandbox's disk stays as last read.
            if sb.disk_due() && !sb.is_paused() {
                let sb = sb.clone();
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(DISK_TIMEOUT, sb.disk_now()).await;
                    sb.log().disk_asked = false;
                });
            }
            sb.sample(sb.last_disk());
        }
    }

    /// Samples every sandbox every [`SAMPLE_EVERY`] until the manager is dropped.
    pub fn spawn_metrics_sampler(self: &Arc<Self>) {
        let manager: Weak<Manager> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(m) = manager.upgrade() else { return };
                // Blocking reads of every sandbox's cgroup files: off the async workers.
                if tokio::task::spawn_blocking(move || m.sample_all())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
    }
}
