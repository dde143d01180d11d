//! The manager's logic against a fake host and fake agents (no root, no namespaces): quotas,
//! tenancy, timeouts, agents that die, failures that must leave nothing behind, and how the
//! spawner's typed failures reach the caller.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use husk_runtime::failure::{Failure, FailureKind};
use husk_runtime::{Limits, RootSource};

use super::{Config, CoreError, CreateRequest, ListFilter, Manager, TimeRange, SAMPLES_KEPT};
use crate::store::{Principal, Store};
use crate::testing::{AgentMode, FakeHost, FAKE_DISK};

/// Long enough for anything the manager does in the background here (a destroy, a
/// supervisor noticing a dead agent); the polls end as soon as the condition holds.
pub(super) const DEADLINE: Duration = Duration::from_secs(10);

fn manager_with(config: Config) -> (Arc<Manager>, Arc<FakeHost>) {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let manager = Manager::new(store, host.clone(), config).unwrap();
    (manager, host)
}

fn manager(quota: u32) -> (Arc<Manager>, Arc<FakeHost>) {
    manager_with(Config {
        default_quota: quota,
        memory_reserve: 0,
        ..Config::default()
    })
}

pub(super) fn team(name: &str) -> Principal {
    Principal {
        team: name.into(),
        key_id: format!("key-of-{name}"),
        admin: false,
    }
}

fn req() -> CreateRequest {
    CreateRequest {
        template: "host".into(),
        timeout: Duration::from_secs(300),
        ..CreateRequest::default()
    }
}

fn records(m: &Manager) -> usize {
    m.store().list_sandboxes().unwrap().len()
}

#[tokio::test]
async fn a_create_asks_the_host_for_an_agent_sandbox_named_by_its_id() {
    let (m, host) = manager(10);
    let sb = m.create(&team("a"), req()).await.unwrap();
    let specs = host.specs();
    assert_eq!(specs.len(), 1);
    assert!(specs[0].agent);
    assert_eq!(specs[0].hostname, sb.id);
    assert!(matches!(specs[0].rootfs, RootSource::Host));
    assert_eq!(specs[0].limits, *m.limits());
    assert_eq!(host.live(), vec![sb.runtime_id.clone()]);
    assert_eq!(records(&m), 1);
    assert_eq!(sb.id.len(), 20);
    assert_ne!(sb.access_token, sb.traffic_access_token);
}

#[tokio::test]
async fn the_quota_counts_each_teams_sandboxes_alone() {
    let (m, host) = manager(2);
    let a = team("a");
    let first = m.create(&a, req()).await.unwrap();
    m.create(&a, req()).await.unwrap();
    match m.create(&a, req()).await {
        Err(CoreError::QuotaExceeded { team, limit }) => {
            assert_eq!((team.as_str(), limit), ("a", 2))
        }
        other => panic!("expected the quota, got {:?}", other.map(|s| s.id.clone())),
    }
    // The refused create never reached the host.
    assert_eq!(host.specs().len(), 2);
    // Another team has its own quota.
    m.create(&team("b"), req()).await.unwrap();
    // A kill frees a place.
    m.kill(&a, &first.id).await.unwrap();
    m.create(&a, req()).await.unwrap();
    assert_eq!(m.count(), 3);
}

#[tokio::test]
async fn a_teams_own_quota_overrides_the_default() {
    let (m, _) = manager(5);
    m.store().set_team_quota("small", Some(1)).unwrap();
    m.create(&team("small"), req()).await.unwrap();
    assert!(matches!(
        m.create(&team("small"), req()).await,
        Err(CoreError::QuotaExceeded { limit: 1, .. })
    ));
}

#[tokio::test]
async fn the_spawners_failures_keep_their_kind_and_give_the_quota_place_back() {
    let (m, host) = manager(1);
    let a = team("a");
    let cases = [
        (FailureKind::Exhausted, "HostExhausted"),
        (FailureKind::Template, "TemplateBroken"),
        (FailureKind::InvalidSpec, "InvalidArgument"),
        (FailureKind::Host, "Runtime"),
        (FailureKind::Internal, "Runtime"),
    ];
    for (kind, want) in cases {
        host.fail_next(Failure::new(kind, format!("the {kind:?} failure")));
        let err = match m.create(&a, req()).await {
            Err(e) => e,
            Ok(sb) => panic!("{kind:?}: created {}", sb.id),
        };
        let got = match &err {
            CoreError::HostExhausted(_) => "HostExhausted",
            CoreError::TemplateBroken(_) => "TemplateBroken",
            CoreError::InvalidArgument(_) => "InvalidArgument",
            CoreError::Runtime(_) => "Runtime",
            other => panic!("{kind:?}: unexpected {other:?}"),
        };
        assert_eq!(got, want, "{kind:?}");
        // The spawner's own words reach the caller, whatever the variant.
        let text = crate::error_chain(&err);
        assert!(text.contains(&format!("the {kind:?} failure")), "{text}");
    }
    // Nothing was made, nothing is recorded, and the quota of one is free again.
    assert!(host.live().is_empty());
    assert!(host.destroyed().is_empty());
    assert_eq!(records(&m), 0);
    m.create(&a, req()).await.unwrap();
}

#[tokio::test]
async fn a_sandbox_whose_agent_does_not_start_is_destroyed() {
    let (m, host) = manager(1);
    host.set_agent_mode(AgentMode::HangUp);
    let err = m
        .create(&team("a"), req())
        .await
        .err()
        .expect("the create fails");
    assert!(
        matches!(&err, CoreError::Internal { what, .. } if what.contains("agent did not start")),
        "{err:?}"
    );
    assert_eq!(host.destroyed(), vec!["fake-1".to_string()]);
    assert!(host.live().is_empty());
    assert_eq!((m.count(), records(&m)), (0, 0));
    // Its place in the quota is free again.
    host.set_agent_mode(AgentMode::Serve);
    m.create(&team("a"), req()).await.unwrap();
}

#[tokio::test]
async fn another_team_cannot_see_or_touch_a_sandbox() {
    let (m, host) = manager(10);
    let (a, b) = (team("a"), team("b"));
    let sb = m.create(&a, req()).await.unwrap();
    let id = sb.id.as_str();
    let not_found = |r: Result<(), CoreError>| matches!(r, Err(CoreError::NotFound(x)) if x == id);
    assert!(not_found(m.get(&b, id).map(|_| ())));
    assert!(not_found(m.kill(&b, id).await));
    assert!(not_found(m.set_timeout(&b, id, Duration::from_secs(1))));
    assert!(not_found(
        m.resume(&b, id, Some(Duration::from_secs(3600)), false)
            .await
            .map(|_| ())
    ));
    assert!(not_found(
        m.metrics(&b, id, TimeRange::default()).await.map(|_| ())
    ));
    assert!(not_found(
        m.set_network_policy(&b, id, husk_net::NetPolicy::None, Default::default())
            .await
    ));
    assert!(m.list_views(&b, &ListFilter::default()).is_empty());
    // None of it changed the sandbox.
    assert_eq!(host.live(), vec![sb.runtime_id.clone()]);
    assert_eq!(m.get(&a, id).unwrap().end_at(), sb.end_at());
    assert_eq!(m.list_views(&a, &ListFilter::default()).len(), 1);
}

#[tokio::test]
async fn a_kill_destroys_once_and_forgets_the_sandbox() {
    let (m, host) = manager(10);
    let a = team("a");
    let sb = m.create(&a, req()).await.unwrap();
    m.kill(&a, &sb.id).await.unwrap();
    assert_eq!(host.destroyed(), vec![sb.runtime_id.clone()]);
    assert!(matches!(m.get(&a, &sb.id), Err(CoreError::NotFound(_))));
    assert!(matches!(
        m.kill(&a, &sb.id).await,
        Err(CoreError::NotFound(_))
    ));
    assert_eq!(host.destroyed().len(), 1);
    assert_eq!(records(&m), 0);
    // Its agent connection ends (the reader task sees the hang-up).
    assert!(tokio::time::timeout(DEADLINE, sb.agent.closed())
        .await
        .is_ok());
}

#[tokio::test]
async fn a_sandbox_ends_at_its_timeout() {
    let (m, host) = manager(10);
    let mut r = req();
    // The shortest timeout there is (a zero is clamped to one second).
    r.timeout = Duration::ZERO;
    let sb = m.create(&team("a"), r).await.unwrap();
    let runtime_id = sb.runtime_id.clone();
    assert!(
        host.until(DEADLINE, |h| h.destroyed().contains(&runtime_id))
            .await,
        "not destroyed at its timeout"
    );
    // The record goes right after the host's destroy returns.
    let end = std::time::Instant::now() + DEADLINE;
    while records(&m) != 0 && std::time::Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!((m.count(), records(&m)), (0, 0));
}

#[tokio::test]
async fn a_new_timeout_moves_the_end_both_ways() {
    let (m, host) = manager(10);
    let a = team("a");
    let mut r = req();
    r.timeout = Duration::from_secs(1);
    let sb = m.create(&a, r).await.unwrap();
    m.set_timeout(&a, &sb.id, Duration::from_secs(3600))
        .unwrap();
    // Past the first deadline (a deliberate wait: what is checked is that nothing happens).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(host.destroyed().is_empty(), "destroyed at the old timeout");
    // The store knows the new end too (a restarted server reads it).
    let stored = m.store().list_sandboxes().unwrap();
    assert!(stored[0].end_at > time::OffsetDateTime::now_utc() + Duration::from_secs(3000));
    // Shortening takes effect at once (the supervisor is woken, it does not sleep it out).
    m.set_timeout(&a, &sb.id, Duration::from_secs(1)).unwrap();
    let runtime_id = sb.runtime_id.clone();
    assert!(
        host.until(DEADLINE, |h| h.destroyed().contains(&runtime_id))
            .await
    );
}

#[tokio::test]
async fn connecting_extends_the_timeout_but_never_shortens_it() {
    let (m, _) = manager(10);
    let a = team("a");
    let sb = m.create(&a, req()).await.unwrap();
    let end = sb.end_at();
    let resumed = |r: Result<(Arc<super::LiveSandbox>, bool), CoreError>| r.unwrap().1;
    assert!(!resumed(
        m.resume(&a, &sb.id, Some(Duration::from_secs(1)), false)
            .await
    ));
    assert_eq!(sb.end_at(), end);
    assert!(!resumed(
        m.resume(&a, &sb.id, Some(Duration::from_secs(3600)), false)
            .await
    ));
    assert!(sb.end_at() > end);
    // Clamped to the server's maximum.
    m.resume(
        &a,
        &sb.id,
        Some(Duration::from_secs(u32::MAX as u64)),
        false,
    )
    .await
    .unwrap();
    let max = time::OffsetDateTime::now_utc() + m.max_timeout();
    assert!(sb.end_at() <= max);
}

#[tokio::test]
async fn a_sandbox_whose_agent_dies_is_destroyed() {
    let (m, host) = manager(10);
    let sb = m.create(&team("a"), req()).await.unwrap();
    assert!(host.kill_agent(&sb.runtime_id));
    let runtime_id = sb.runtime_id.clone();
    assert!(
        host.until(DEADLINE, |h| h.destroyed().contains(&runtime_id))
            .await
    );
    assert_eq!((m.count(), records(&m)), (0, 0));
}

#[tokio::test]
async fn bad_requests_are_refused_before_the_host_is_asked() {
    let (m, host) = manager(10);
    let a = team("a");
    // (A bad environment cannot be asked for: EnvVars is checked when made.)
    let mut r = req();
    r.limits = Some(Limits {
        memory_bytes: m.limits().memory_bytes + 1,
        ..m.limits().clone()
    });
    assert!(matches!(
        m.create(&a, r).await,
        Err(CoreError::InvalidArgument(_))
    ));
    let mut r = req();
    r.template = "no-such-template".into();
    assert!(matches!(
        m.create(&a, r).await,
        Err(CoreError::TemplateNotFound(_))
    ));
    // No network on this server: asking for some is refused, never silently dropped.
    let mut r = req();
    r.network = Some(husk_net::NetPolicy::Egress {
        allow: Vec::new(),
        deny: Vec::new(),
    });
    assert!(matches!(
        m.create(&a, r).await,
        Err(CoreError::Unsupported(_))
    ));
    // Nor header rules, which need a link out.
    let mut r = req();
    r.rules = Some(header_rules());
    assert!(matches!(
        m.create(&a, r).await,
        Err(CoreError::Unsupported(m)) if m.contains("network.rules")
    ));
    let mut r = req();
    r.workspaces = vec![super::WorkspaceMount {
        name: "w".into(),
        path: "/work".into(),
        writable: false,
    }];
    assert!(matches!(
        m.create(&a, r).await,
        Err(CoreError::InvalidArgument(_))
    ));
    assert!(host.specs().is_empty());
    // Nothing of them holds a place in the quota.
    assert_eq!(m.count(), 0);
}

#[tokio::test]
async fn a_host_below_the_memory_reserve_takes_no_sandbox() {
    let (m, host) = manager_with(Config {
        memory_reserve: u64::MAX,
        ..Config::default()
    });
    assert!(matches!(
        m.create(&team("a"), req()).await,
        Err(CoreError::HostMemoryLow { .. })
    ));
    assert!(host.specs().is_empty());
}

#[tokio::test]
async fn metrics_take_the_disk_from_the_agent() {
    let (m, _) = manager(10);
    let a = team("a");
    let sb = m.create(&a, req()).await.unwrap();
    let samples = m.metrics(&a, &sb.id, TimeRange::default()).await.unwrap();
    let [metrics] = samples[..] else {
        panic!("one fresh sample: {samples:?}")
    };
    assert_eq!((metrics.disk_used, metrics.disk_total), FAKE_DISK);
    assert_eq!(metrics.mem_total, sb.limits.memory_bytes);
    assert_eq!(metrics.cpu_count, sb.cpu_count());
}

#[tokio::test]
async fn an_agent_that_never_reports_its_disk_delays_only_its_own_metrics() {
    let (m, host) = manager(10);
    host.set_agent_mode(AgentMode::NoDisk);
    let a = team("a");
    let sb = m.create(&a, req()).await.unwrap();
    let asked = std::time::Instant::now();
    let samples = m.metrics(&a, &sb.id, TimeRange::default()).await.unwrap();
    // Answered after the disk call's bound, with the figure it had (none yet: the empty disk).
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
    let [fresh] = samples[..] else {
        panic!("one fresh sample: {samples:?}")
    };
    assert_eq!(
        (fresh.disk_used, fresh.disk_total),
        (0, sb.limits.disk_bytes)
    );
    assert_eq!(fresh.mem_total, sb.limits.memory_bytes);
}

#[tokio::test]
async fn metrics_are_sampled_kept_bounded_and_asked_for_by_time() {
    use time::OffsetDateTime;
    let (m, _) = manager(10);
    let a = team("a");
    let sb = m.create(&a, req()).await.unwrap();
    let born = sb.started_at();
    // Periodic samples (the sampler's sweeps), each with the disk figure once the agent gave it.
    for _ in 0..3 {
        m.sample_all();
    }
    let all = |r| m.metrics(&a, &sb.id, r);
    let now_and_before = all(TimeRange::default()).await.unwrap();
    assert_eq!(now_and_before.len(), 4, "three sweeps and a fresh sample");
    assert!(now_and_before
        .windows(2)
        .all(|w| w[0].timestamp <= w[1].timestamp));
    let last = now_and_before.last().unwrap();
    assert_eq!(
        (last.disk_used, last.disk_total),
        FAKE_DISK,
        "the fresh one asks the agent"
    );

    // A range that ended before the sandbox existed, or lies before now: no fresh sample.
    let before = TimeRange {
        start: Some(born - time::Duration::hours(2)),
        end: Some(born - time::Duration::hours(1)),
    };
    assert!(all(before).await.unwrap().is_empty());
    let past = TimeRange {
        start: None,
        end: Some(last.timestamp),
    };
    assert_eq!(
        all(past).await.unwrap().len(),
        4,
        "no new sample for a closed range"
    );
    let later = TimeRange {
        start: Some(OffsetDateTime::now_utc() + time::Duration::hours(1)),
        end: None,
    };
    assert!(all(later).await.unwrap().is_empty());

    // Bounded: only the last SAMPLES_KEPT stay.
    for _ in 0..SAMPLES_KEPT + 10 {
        m.sample_all();
    }
    let kept = all(TimeRange {
        start: None,
        // Ended a moment ago: the kept samples only, no fresh one.
        end: Some(OffsetDateTime::now_utc()),
    })
    .await
    .unwrap();
    assert_eq!(kept.len(), SAMPLES_KEPT);
}

#[tokio::test]
async fn list_filters_and_orders_oldest_first() {
    let (m, _) = manager(10);
    let a = team("a");
    let mut ids = Vec::new();
    for i in 0..3 {
        let mut r = req();
        r.metadata = BTreeMap::from([("n".to_string(), i.to_string())]);
        if i == 2 {
            r.template = "base".into();
        }
        ids.push(m.create(&a, r).await.unwrap().id.clone());
    }
    let all: Vec<String> = m
        .list_views(&a, &ListFilter::default())
        .iter()
        .map(|s| s.id.clone())
        .collect();
    assert_eq!(all, ids);
    let one = m.list_views(
        &a,
        &ListFilter {
            metadata: vec![("n".into(), "1".into())],
            ..ListFilter::default()
        },
    );
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].id, ids[1]);
    let base = m.list_views(
        &a,
        &ListFilter {
            template: Some("base".into()),
            ..ListFilter::default()
        },
    );
    assert_eq!(base.len(), 1);
    assert_eq!(base[0].id, ids[2]);
}

#[tokio::test]
async fn shutdown_destroys_every_sandbox() {
    let (m, host) = manager(10);
    for t in ["a", "b", "a"] {
        m.create(&team(t), req()).await.unwrap();
    }
    m.shutdown().await;
    assert!(host.live().is_empty());
    assert_eq!(host.destroyed().len(), 3);
    assert_eq!((m.count(), records(&m)), (0, 0));
    // Each is listed as lost, to its own team only, saying why.
    let lost = m.lost_views(&team("a"), &ListFilter::default()).unwrap();
    assert_eq!(lost.len(), 2);
    let why = &lost[0].lost.as_ref().unwrap().reason;
    assert!(why.contains("was stopped"), "{why}");
    assert_eq!(
        m.lost_views(&team("b"), &ListFilter::default())
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn sandboxes_a_crash_left_are_lost_said_so_then_forgotten() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let config = Config {
        memory_reserve: 0,
        ..Config::default()
    };
    let m = Manager::new(store.clone(), host.clone(), config.clone()).unwrap();
    let (a, b) = (team("a"), team("b"));
    let sb = m.create(&a, req()).await.unwrap();
    let id = sb.id.clone();
    drop(sb);
    // Another record, lost more than a week ago.
    let old = crate::store::SandboxRecord {
        id: "old".into(),
        team: "a".into(),
        template: "host".into(),
        runtime_id: "s1-old".into(),
        created_at: time::OffsetDateTime::now_utc() - time::Duration::days(9),
        end_at: time::OffsetDateTime::now_utc(),
        metadata: Default::default(),
        description: None,
    };
    store.insert_sandbox(&old).unwrap();
    let eight_days_ago = time::OffsetDateTime::now_utc() - time::Duration::days(8);
    store
        .mark_sandbox_lost("old", "long ago", eight_days_ago)
        .unwrap();
    // The server crashed (nothing shut down); the next one starts over the same store.
    let m2 = Manager::new(store.clone(), host.clone(), config).unwrap();
    let lost = m2.lost_views(&a, &ListFilter::default()).unwrap();
    assert_eq!(
        lost.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
        vec![id.as_str()]
    );
    let resumed = m2.resume(&a, &id, None, false).await.err().unwrap();
    for e in [m2.view(&a, &id).unwrap_err(), resumed] {
        match e {
            CoreError::Lost {
                id: lost_id,
                reason,
                ..
            } => {
                assert_eq!(lost_id, id);
                assert!(
                    reason.contains("ended while no husk server ran"),
                    "{reason}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // Nothing to kill: the answer says so, and the record stays for the week.
    assert!(matches!(
        m2.kill(&a, &id).await,
        Err(CoreError::Lost { .. })
    ));
    assert_eq!(m2.lost_views(&a, &ListFilter::default()).unwrap().len(), 1);
    // Another team learns nothing of it; the old one was forgotten.
    assert!(matches!(m2.view(&b, &id), Err(CoreError::NotFound(_))));
    assert!(matches!(
        m2.kill(&b, &id).await,
        Err(CoreError::NotFound(_))
    ));
    assert!(matches!(m2.view(&a, "old"), Err(CoreError::NotFound(_))));
}

#[tokio::test]
async fn concurrent_creates_never_exceed_the_quota() {
    let (m, host) = manager(3);
    let a = team("a");
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (m, a) = (m.clone(), a.clone());
            tokio::spawn(async move { m.create(&a, req()).await.is_ok() })
        })
        .collect();
    let mut made = 0;
    for t in tasks {
        made += t.await.unwrap() as usize;
    }
    assert_eq!(made, 3);
    assert_eq!(host.live().len(), 3);
}

/// One header rule (a header for `api.example.com`), for creates that ask for rules.
pub(super) fn header_rules() -> crate::net_rules::NetRules {
    crate::net_rules::NetRules::new(vec![(
        "api.example.com".into(),
        vec![crate::net_rules::Rule {
            headers: vec![("x-key".into(), "v".into())],
        }],
    )])
    .unwrap()
}

/// A team at its quota that kills one sandbox and creates another, many times over and from
/// many tasks at once (what the SDK's benchmark at concurrency 100 against a quota of 100
/// does): a create never sees the quota full. Each task holds at most one place at any time,
/// so a refusal can only come from a sandbox counted twice (as being created and as running)
/// or a kill that frees its place late.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_at_exactly_the_quota_are_never_refused() {
    const TASKS: u32 = 8;
    const CYCLES: u32 = 300;
    let (m, _) = manager(TASKS);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let m = m.clone();
            tokio::spawn(async move {
                let a = team("a");
                for _ in 0..CYCLES {
                    let sb = m.create(&a, req()).await?;
                    m.kill(&a, &sb.id).await?;
                }
                Ok::<_, CoreError>(())
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            panic!("a create or kill at the quota failed: {e}");
        }
    }
    assert_eq!(m.count(), 0);
}

/// Counts by label value.
pub(super) type Counts = Vec<(&'static str, u64)>;

/// Good creates, counted by source (the operator's metrics).
pub(super) fn created_by_source(m: &Manager) -> Counts {
    m.server_stats()
        .creates
        .done
        .iter()
        .map(|(s, d)| (s.name(), d.count))
        .collect()
}

/// Good creates by source, and failed ones by kind.
fn creates_of(m: &Manager) -> (Counts, Counts) {
    let failed = m.server_stats().creates.failed;
    (
        created_by_source(m),
        failed.iter().map(|(k, n)| (k.name(), *n)).collect(),
    )
}

#[tokio::test]
async fn every_create_is_counted_once_by_how_it_ended() {
    let (m, host) = manager(2);
    let a = team("a");
    let fresh = creates_of(&m);
    assert_eq!(
        fresh,
        (
            vec![("new", 0), ("pool", 0), ("snapshot", 0), ("resume", 0)],
            vec![("rejected", 0), ("host_full", 0), ("failed", 0)]
        )
    );
    let one = m.create(&a, req()).await.unwrap();
    m.create(&a, req()).await.unwrap();
    // The quota of two: the request's fault.
    assert!(matches!(
        m.create(&a, req()).await,
        Err(CoreError::QuotaExceeded { .. })
    ));
    m.kill(&a, &one.id).await.unwrap();
    host.fail_next(Failure::new(FailureKind::Exhausted, "no uid range left"));
    assert!(m.create(&a, req()).await.is_err());
    host.fail_next(Failure::new(FailureKind::Internal, "the spawner broke"));
    assert!(m.create(&a, req()).await.is_err());
    let mut unknown = req();
    unknown.template = "no-such-template".into();
    assert!(m.create(&a, unknown).await.is_err());
    assert_eq!(
        creates_of(&m),
        (
            vec![("new", 2), ("pool", 0), ("snapshot", 0), ("resume", 0)],
            vec![("rejected", 2), ("host_full", 1), ("failed", 1)]
        )
    );
    let stats = m.server_stats();
    let new = &stats.creates.done[0].1;
    // Each good create took some time, and the histogram's last bucket holds them all.
    assert!(new.sum_seconds > 0.0);
    assert_eq!(new.cumulative.last().map(|b| b.1), Some(2));
    assert_eq!((stats.running, stats.paused), (1, 0));
    assert!(stats.pools.is_empty());
}

fn ends_of(m: &Manager) -> Counts {
    m.server_stats()
        .ends
        .iter()
        .map(|(r, n)| (r.name(), *n))
        .collect()
}

#[tokio::test]
async fn every_end_is_counted_once_by_why() {
    let (m, host) = manager(5);
    let a = team("a");
    assert_eq!(
        ends_of(&m),
        vec![("killed", 0), ("timeout", 0), ("agent_gone", 0)]
    );
    let killed = m.create(&a, req()).await.unwrap();
    m.kill(&a, &killed.id).await.unwrap();
    // Killed again, or by another team: nothing ends, nothing is counted.
    assert!(m.kill(&a, &killed.id).await.is_err());
    let mine = m.create(&a, req()).await.unwrap();
    assert!(m.kill(&team("b"), &mine.id).await.is_err());
    // Its agent dies unasked.
    assert!(host.kill_agent(&mine.runtime_id));
    let mut short = req();
    short.timeout = Duration::from_millis(50);
    let timed = m.create(&a, short).await.unwrap();
    let deadline = std::time::Instant::now() + DEADLINE;
    while m.count() > 0 {
        assert!(std::time::Instant::now() < deadline, "{} left", m.count());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(host.destroyed().contains(&timed.runtime_id));
    assert_eq!(
        ends_of(&m),
        vec![("killed", 1), ("timeout", 1), ("agent_gone", 1)]
    );
}
