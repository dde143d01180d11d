//! The operator's metrics: `GET /metrics` in Prometheus's text format (version 0.0.4), on a
//! listener of its own (`husk serve --metrics-listen`), never on the API's.
//!
//! Why a listener of its own and no key: a scraper is the operator's, on the operator's
//! network, and is configured with an address, not with an E2B key (Prometheus sends no
//! `X-API-Key`). The API's listener faces tenants; this one is bound where the operator says
//! (loopback by example) and answers nothing but `/metrics`. What it tells is counts only: no
//! team, key or sandbox is named (template names appear as the warm pools' labels).

use std::fmt::Write;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use husk_core::manager::{Manager, ServerStats};

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What does not change while the server runs.
#[derive(Clone, Debug)]
pub struct ServerInfo {
    pub version: String,
    /// Spawner processes.
    pub spawners: usize,
}

/// The metrics listener's service: `/metrics`, and 404 for every other path.
pub fn router(manager: Arc<Manager>, info: ServerInfo) -> Router {
    let info = Arc::new(info);
    Router::new()
        .route(
            "/metrics",
            get(move || {
                let (manager, info) = (manager.clone(), info.clone());
                async move {
                    // Reads /proc/meminfo: off the async threads.
                    let stats = tokio::task::spawn_blocking(move || manager.server_stats()).await;
                    match stats {
                        Ok(stats) => (
                            [(header::CONTENT_TYPE, CONTENT_TYPE)],
                            render(&stats, &info),
                        )
                            .into_response(),
                        Err(e) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            format!("reading the server's figures failed: {e}\n"),
                        )
                            .into_response(),
                    }
                }
            }),
        )
        .fallback(|| async {
            (
                StatusCode::NOT_FOUND,
                "this is husk's metrics listener: it serves GET /metrics only\n",
            )
                .into_response()
        })
}

/// A metric family: its `# HELP` and `# TYPE` lines, then its samples.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String, name: &'static str, kind: &str, help: &str) -> Family<'a> {
        // Writing to a String cannot fail.
        let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(out, "# TYPE {name} {kind}");
        Family { out, name }
    }

    /// One sample: `suffix` goes after the family's name (`_bucket`, `_sum`, ...).
    fn sample(&mut self, suffix: &str, labels: &[(&str, &str)], value: impl Into<Value>) {
        let _ = write!(self.out, "{}{suffix}", self.name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", value.into());
    }
}

/// A sample's value: counts as integers, the rest as Prometheus reads floats.
enum Value {
    Count(u64),
    Float(f64),
}

impl From<u64> for Value {
    fn from(v: u64) -> Value {
        Value::Count(v)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Count(n) => write!(f, "{n}"),
            Value::Float(x) if x.is_nan() => f.write_str("NaN"),
            Value::Float(x) if x.is_infinite() => {
                f.write_str(if *x > 0.0 { "+Inf" } else { "-Inf" })
            }
            Value::Float(x) => write!(f, "{x}"),
        }
    }
}

/// A label value as the text format quotes it: backslash, double quote and line feed escaped.
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A help text: backslash and line feed escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// `stats` in the text format.
pub fn render(stats: &ServerStats, info: &ServerInfo) -> String {
    let mut out = String::with_capacity(4096);
    Family::new(
        &mut out,
        "husk_build_info",
        "gauge",
        "The running husk's version (the value is always 1).",
    )
    .sample("", &[("version", &info.version)], 1u64);
    Family::new(
        &mut out,
        "husk_spawners",
        "gauge",
        "Spawner processes making and destroying sandboxes (--spawners).",
    )
    .sample("", &[], info.spawners as u64);
    let mut f = Family::new(
        &mut out,
        "husk_sandboxes",
        "gauge",
        "The teams' sandboxes on this server, by state (paused: in place or saved to disk; \
         warm pool sandboxes are not counted).",
    );
    f.sample("", &[("state", "running")], stats.running);
    f.sample("", &[("state", "paused")], stats.paused);

    let mut f = Family::new(
        &mut out,
        "husk_sandbox_creates_total",
        "counter",
        "Sandboxes created since the server started, by where they came from (new, pool: a \
         warm pool's, snapshot, resume: a paused one booted again).",
    );
    for (source, d) in &stats.creates.done {
        f.sample("", &[("source", source.name())], d.count);
    }
    let mut f = Family::new(
        &mut out,
        "husk_sandbox_create_failures_total",
        "counter",
        "Creates that failed since the server started: rejected (the request: quota, input, \
         unknown template; 4xx), host_full (memory below the reserve, uid ranges or file \
         descriptors out; 503), failed (husk, a template or the host; 5xx).",
    );
    for (kind, n) in &stats.creates.failed {
        f.sample("", &[("reason", kind.name())], *n);
    }
    let mut f = Family::new(
        &mut out,
        "husk_sandbox_ends_total",
        "counter",
        "Sandboxes ended since the server started, by why: killed (through the API), timeout \
         (its timeout, or paused past --paused-retention), agent_gone (its PID 1 ended \
         unasked: a crash, or a kill from the host).",
    );
    for (reason, n) in &stats.ends {
        f.sample("", &[("reason", reason.name())], *n);
    }
    let mut f = Family::new(
        &mut out,
        "husk_sandbox_create_duration_seconds",
        "histogram",
        "Time the server took for each create that succeeded (the request's arrival to the \
         sandbox ready), by source.",
    );
    for (source, d) in &stats.creates.done {
        let source = source.name();
        for (le, n) in &d.cumulative {
            f.sample(
                "_bucket",
                &[("source", source), ("le", &le.to_string())],
                *n,
            );
        }
        f.sample("_bucket", &[("source", source), ("le", "+Inf")], d.count);
        f.sample("_sum", &[("source", source)], d.sum_seconds);
        f.sample("_count", &[("source", source)], d.count);
    }

    type PoolField = fn(&husk_core::manager::PoolStats) -> u64;
    let pool_families: [(&'static str, &str, &str, PoolField); 9] = [
        (
            "husk_pool_target",
            "gauge",
            "Warm sandboxes a pool keeps (--warm, or the template's warm).",
            |p| p.target.into(),
        ),
        (
            "husk_pool_ready",
            "gauge",
            "Warm sandboxes ready to be claimed now.",
            |p| p.ready.into(),
        ),
        (
            "husk_pool_filling",
            "gauge",
            "Warm sandboxes being made now.",
            |p| p.filling.into(),
        ),
        (
            "husk_pool_claims_total",
            "counter",
            "Creates a pool served with a warm sandbox.",
            |p| p.claimed,
        ),
        (
            "husk_pool_claim_failures_total",
            "counter",
            "Claims that failed (the warm sandbox destroyed, the create made fresh).",
            |p| p.claim_failed,
        ),
        (
            "husk_pool_misses_total",
            "counter",
            "Creates of a pool's template it could not serve (empty, or a create a warm \
             sandbox cannot fit).",
            |p| p.missed,
        ),
        (
            "husk_pool_made_total",
            "counter",
            "Warm sandboxes made.",
            |p| p.made,
        ),
        (
            "husk_pool_fill_failures_total",
            "counter",
            "Fills that failed.",
            |p| p.failed,
        ),
        (
            "husk_pool_discarded_total",
            "counter",
            "Warm sandboxes destroyed unclaimed (template rebuilt, pool shrunk, memory short).",
            |p| p.discarded,
        ),
    ];
    for (name, kind, help, field) in pool_families {
        let mut f = Family::new(&mut out, name, kind, help);
        for p in &stats.pools {
            f.sample("", &[("template", &p.template)], field(p));
        }
    }

    if let Some(available) = stats.memory_available {
        Family::new(
            &mut out,
            "husk_host_memory_available_bytes",
            "gauge",
            "The host's MemAvailable.",
        )
        .sample("", &[], available);
    }
    Family::new(
        &mut out,
        "husk_memory_reserve_bytes",
        "gauge",
        "Memory the host must have available for a new sandbox (--memory-reserve); below it \
         creates get 503.",
    )
    .sample("", &[], stats.memory_reserve);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use husk_core::manager::{
        CreateFailure, CreateFigures, CreateSource, DurationFigures, EndReason,
    };

    fn stats() -> ServerStats {
        let durations = |count: u64| DurationFigures {
            cumulative: husk_core::manager::CREATE_BUCKETS
                .iter()
                .map(|&le| (le, if le >= 0.01 { count } else { 0 }))
                .collect(),
            count,
            sum_seconds: 0.0075 * count as f64,
        };
        ServerStats {
            creates: CreateFigures {
                done: vec![
                    (CreateSource::New, durations(3)),
                    (CreateSource::Pool, durations(0)),
                ],
                failed: vec![
                    (CreateFailure::Rejected, 2),
                    (CreateFailure::HostFull, 0),
                    (CreateFailure::Failed, 1),
                ],
            },
            ends: vec![
                (EndReason::Killed, 5),
                (EndReason::Timeout, 0),
                (EndReason::AgentGone, 1),
            ],
            running: 4,
            paused: 1,
            pools: vec![husk_core::manager::PoolStats {
                template: "code\"interp\\reter\nx".into(),
                target: 8,
                ready: 5,
                claimed: 7,
                ..Default::default()
            }],
            memory_available: Some(1 << 30),
            memory_reserve: 256 << 20,
        }
    }

    fn info() -> ServerInfo {
        ServerInfo {
            version: "1.2.3".into(),
            spawners: 2,
        }
    }

    #[test]
    fn the_figures_read_as_prometheus_samples() {
        let text = render(&stats(), &info());
        for line in [
            "husk_build_info{version=\"1.2.3\"} 1",
            "husk_spawners 2",
            "husk_sandboxes{state=\"running\"} 4",
            "husk_sandboxes{state=\"paused\"} 1",
            "husk_sandbox_creates_total{source=\"new\"} 3",
            "husk_sandbox_creates_total{source=\"pool\"} 0",
            "husk_sandbox_create_failures_total{reason=\"rejected\"} 2",
            "husk_sandbox_create_failures_total{reason=\"failed\"} 1",
            "husk_sandbox_ends_total{reason=\"killed\"} 5",
            "husk_sandbox_ends_total{reason=\"agent_gone\"} 1",
            "husk_sandbox_create_duration_seconds_bucket{source=\"new\",le=\"0.005\"} 0",
            "husk_sandbox_create_duration_seconds_bucket{source=\"new\",le=\"0.01\"} 3",
            "husk_sandbox_create_duration_seconds_bucket{source=\"new\",le=\"+Inf\"} 3",
            "husk_sandbox_create_duration_seconds_sum{source=\"new\"} 0.0225",
            "husk_sandbox_create_duration_seconds_count{source=\"new\"} 3",
            "husk_host_memory_available_bytes 1073741824",
            "husk_memory_reserve_bytes 268435456",
            "# TYPE husk_sandbox_create_duration_seconds histogram",
            "# TYPE husk_pool_claims_total counter",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "no line {line:?} in:\n{text}"
            );
        }
        // Each family is declared once, before its samples.
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let mut names: Vec<&str> = types.iter().map(|l| l.split(' ').nth(2).unwrap()).collect();
        let declared = names.len();
        names.dedup();
        assert_eq!(names.len(), declared, "{types:?}");
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn a_label_value_is_escaped_as_the_format_says() {
        let text = render(&stats(), &info());
        let want = "husk_pool_ready{template=\"code\\\"interp\\\\reter\\nx\"} 5";
        assert!(text.lines().any(|l| l == want), "no {want:?} in:\n{text}");
        // No raw line feed from a value splits a sample.
        assert!(
            text.lines()
                .all(|l| l.starts_with('#') || l.starts_with("husk_")),
            "{text}"
        );
    }

    #[test]
    fn without_pools_or_meminfo_those_families_have_no_samples() {
        let mut s = stats();
        s.pools.clear();
        s.memory_available = None;
        let text = render(&s, &info());
        assert!(!text.contains("husk_pool_ready{"), "{text}");
        assert!(text.contains("# TYPE husk_pool_ready gauge"), "{text}");
        assert!(!text.contains("husk_host_memory_available_bytes"), "{text}");
    }
}
