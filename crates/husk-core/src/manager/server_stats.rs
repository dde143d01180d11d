//! The server's own figures, for its operator (`husk serve --metrics-listen`): how creates
//! ended and how long the good ones took, what is alive, the warm pools and the host's memory.
//! Counted where a create ends (`Manager::create_as`), read by the server's Prometheus
//! exposition (`husk_server::prometheus`). Nothing here names a team or a sandbox: counts only.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{read, CoreError, Manager, PoolStats};

/// Upper bounds (seconds) of the create-duration histogram's buckets: a warm claim takes
/// milliseconds, a fresh code interpreter a few hundred, a create waiting for a slow template's
/// ready check seconds.
pub const CREATE_BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Where a created sandbox came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateSource {
    /// Made for the create (also a create whose warm claim failed).
    New,
    /// Claimed from a warm pool.
    Pool,
    /// Made from a snapshot (a create naming one, a fork).
    Snapshot,
    /// A paused sandbox booted again on its saved files.
    Resume,
}

impl CreateSource {
    pub const ALL: [CreateSource; 4] = [
        CreateSource::New,
        CreateSource::Pool,
        CreateSource::Snapshot,
        CreateSource::Resume,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            CreateSource::New => "new",
            CreateSource::Pool => "pool",
            CreateSource::Snapshot => "snapshot",
            CreateSource::Resume => "resume",
        }
    }
}

/// Why a create failed, in the three kinds an operator tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateFailure {
    /// The request's fault: a quota, bad input, an unknown template (4xx).
    Rejected,
    /// The host is full for now: memory below the reserve, uid ranges or descriptors out
    /// (503, the SDKs retry).
    HostFull,
    /// husk, a template or the host failed (5xx): the kind to alert on.
    Failed,
}

impl CreateFailure {
    pub const ALL: [CreateFailure; 3] = [
        CreateFailure::Rejected,
        CreateFailure::HostFull,
        CreateFailure::Failed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CreateFailure::Rejected => "rejected",
            CreateFailure::HostFull => "host_full",
            CreateFailure::Failed => "failed",
        }
    }

    /// The kind of `e`, as the API answers it (`husk_server::error`'s status mapping).
    pub fn of(e: &CoreError) -> CreateFailure {
        match e {
            CoreError::HostMemoryLow { .. } | CoreError::HostExhausted(_) => {
                CreateFailure::HostFull
            }
            CoreError::Runtime(_)
            | CoreError::Internal { .. }
            | CoreError::Store(_)
            | CoreError::TemplateBroken(_) => CreateFailure::Failed,
            CoreError::NotFound(_)
            | CoreError::TemplateNotFound(_)
            | CoreError::WorkspaceNotFound(_)
            | CoreError::QuotaExceeded { .. }
            | CoreError::PausedQuotaExceeded { .. }
            | CoreError::SnapshotQuotaExceeded { .. }
            | CoreError::Lost { .. }
            | CoreError::Paused(_)
            | CoreError::InvalidArgument(_)
            | CoreError::Unsupported(_) => CreateFailure::Rejected,
        }
    }
}

/// Why a sandbox ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// Killed through the API.
    Killed,
    /// Its timeout came (or, paused, the server's `--paused-retention`).
    Timeout,
    /// Its agent (PID 1) ended with nobody asking: the sandbox crashed or was killed from the
    /// host. The kind to look into.
    AgentGone,
}

impl EndReason {
    pub const ALL: [EndReason; 3] = [EndReason::Killed, EndReason::Timeout, EndReason::AgentGone];

    pub fn name(self) -> &'static str {
        match self {
            EndReason::Killed => "killed",
            EndReason::Timeout => "timeout",
            EndReason::AgentGone => "agent_gone",
        }
    }
}

/// A histogram of durations: counts per bucket of [`CREATE_BUCKETS`] (not cumulative), and
/// the sum.
#[derive(Default)]
struct Histogram {
    /// One more than the bounds: the last counts what is above every bound.
    buckets: [AtomicU64; CREATE_BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl Histogram {
    fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let i = CREATE_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(CREATE_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    fn figures(&self) -> DurationFigures {
        let mut cumulative = Vec::with_capacity(CREATE_BUCKETS.len());
        let mut seen = 0;
        for (le, n) in CREATE_BUCKETS.iter().zip(&self.buckets) {
            seen += n.load(Ordering::Relaxed);
            cumulative.push((*le, seen));
        }
        let count = seen + self.buckets[CREATE_BUCKETS.len()].load(Ordering::Relaxed);
        DurationFigures {
            cumulative,
            count,
            sum_seconds: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

/// The counters of creates and ends, kept by the manager for as long as it runs.
#[derive(Default)]
pub(super) struct Counters {
    /// Per [`CreateSource`], in `ALL`'s order: the duration of each good create.
    done: [Histogram; 4],
    /// Per [`CreateFailure`], in `ALL`'s order.
    failed: [AtomicU64; 3],
    /// Per [`EndReason`], in `ALL`'s order.
    ended: [AtomicU64; 3],
}

impl Counters {
    pub(super) fn record_ends(&self, reason: EndReason, n: u64) {
        self.ended[reason as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn ends(&self) -> Vec<(EndReason, u64)> {
        EndReason::ALL
            .iter()
            .map(|&r| (r, self.ended[r as usize].load(Ordering::Relaxed)))
            .collect()
    }

    pub(super) fn record(&self, outcome: Result<CreateSource, CreateFailure>, took: Duration) {
        match outcome {
            Ok(source) => self.done[source as usize].observe(took),
            Err(kind) => {
                self.failed[kind as usize].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn figures(&self) -> CreateFigures {
        CreateFigures {
            done: CreateSource::ALL
                .iter()
                .map(|&s| (s, self.done[s as usize].figures()))
                .collect(),
            failed: CreateFailure::ALL
                .iter()
                .map(|&k| (k, self.failed[k as usize].load(Ordering::Relaxed)))
                .collect(),
        }
    }
}

/// A histogram read at one moment: `(upper bound, creates at or below it)` per bucket, then
/// every create and their total time.
#[derive(Clone, Debug, PartialEq)]
pub struct DurationFigures {
    pub cumulative: Vec<(f64, u64)>,
    pub count: u64,
    pub sum_seconds: f64,
}

/// Creates since the server started.
#[derive(Clone, Debug, PartialEq)]
pub struct CreateFigures {
    /// Good creates by source, each with its durations (`count` is how many).
    pub done: Vec<(CreateSource, DurationFigures)>,
    pub failed: Vec<(CreateFailure, u64)>,
}

/// Everything [`Manager::server_stats`] reports.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerStats {
    pub creates: CreateFigures,
    /// Sandboxes ended since the server started, by why.
    pub ends: Vec<(EndReason, u64)>,
    /// Sandboxes of the teams, running (warm ones are not the teams' and not counted).
    pub running: u64,
    /// Paused, in place or saved to disk.
    pub paused: u64,
    pub pools: Vec<PoolStats>,
    /// The host's `MemAvailable`, if it could be read.
    pub memory_available: Option<u64>,
    /// Below it creates get 503 (`--memory-reserve`; 0: none).
    pub memory_reserve: u64,
}

impl Manager {
    /// Counts a sandbox's end.
    pub(super) fn count_end(&self, reason: EndReason) {
        self.count_ends(reason, 1);
    }

    /// Counts `n` sandboxes' ends.
    pub(super) fn count_ends(&self, reason: EndReason, n: u64) {
        self.counters.record_ends(reason, n);
    }

    /// The server's figures now (see [`ServerStats`]).
    pub fn server_stats(&self) -> ServerStats {
        let (mut running, mut paused) = (0u64, 0u64);
        for sb in read(&self.sandboxes).values() {
            if sb.is_paused() {
                paused += 1;
            } else {
                running += 1;
            }
        }
        paused += read(&self.dormant).len() as u64;
        ServerStats {
            creates: self.counters.figures(),
            ends: self.counters.ends(),
            running,
            paused,
            pools: self.pool_stats(),
            memory_available: super::limits::host_memory_available(),
            memory_reserve: self.config.memory_reserve,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_lands_in_its_bucket_and_buckets_read_cumulative() {
        let s = Counters::default();
        s.record(Ok(CreateSource::Pool), Duration::from_millis(3));
        s.record(Ok(CreateSource::Pool), Duration::from_millis(10));
        s.record(Ok(CreateSource::Pool), Duration::from_millis(40));
        s.record(Ok(CreateSource::Pool), Duration::from_secs(60));
        s.record(Ok(CreateSource::New), Duration::from_millis(200));
        s.record(Err(CreateFailure::HostFull), Duration::from_millis(1));
        let f = s.figures();
        let (source, pool) = &f.done[1];
        assert_eq!(*source, CreateSource::Pool);
        // 5 ms: 1; 10 ms (a bound is inclusive): 2; 25 ms: 2; 50 ms: 3; ... 30 s: 3; all: 4.
        let at = |le: f64| pool.cumulative.iter().find(|(b, _)| *b == le).unwrap().1;
        assert_eq!(
            (at(0.005), at(0.01), at(0.025), at(0.05), at(30.0)),
            (1, 2, 2, 3, 3)
        );
        assert_eq!(pool.count, 4);
        assert!(
            (pool.sum_seconds - 60.053).abs() < 1e-9,
            "{}",
            pool.sum_seconds
        );
        let new = &f.done[0].1;
        assert_eq!((new.count, at_of(new, 0.1), at_of(new, 0.25)), (1, 0, 1));
        assert_eq!(f.done[2].1.count + f.done[3].1.count, 0);
        assert_eq!(
            f.failed,
            vec![
                (CreateFailure::Rejected, 0),
                (CreateFailure::HostFull, 1),
                (CreateFailure::Failed, 0)
            ]
        );
    }

    fn at_of(d: &DurationFigures, le: f64) -> u64 {
        d.cumulative.iter().find(|(b, _)| *b == le).unwrap().1
    }

    #[test]
    fn failures_are_told_apart_as_the_api_answers_them() {
        let quota = CoreError::QuotaExceeded {
            team: "t".into(),
            limit: 1,
        };
        let memory = CoreError::HostMemoryLow {
            available: 1,
            reserve: 2,
        };
        let internal = CoreError::internal("a task", "it panicked");
        assert_eq!(CreateFailure::of(&quota), CreateFailure::Rejected);
        assert_eq!(
            CreateFailure::of(&CoreError::TemplateNotFound("x".into())),
            CreateFailure::Rejected
        );
        assert_eq!(CreateFailure::of(&memory), CreateFailure::HostFull);
        assert_eq!(CreateFailure::of(&internal), CreateFailure::Failed);
        assert_eq!(
            CreateFailure::of(&CoreError::TemplateBroken("ready check failed".into())),
            CreateFailure::Failed
        );
    }
}
