//! Warm pools against the fake host: a pool fills, a create claims a warm sandbox under its
//! own id and environment and it is never given back, creates it cannot serve are made
//! fresh, a host short of memory gets the warm sandboxes back, and none outlives the server.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tests::{team, DEADLINE};
use super::{Config, CreateRequest, EnvVars, Manager, WarmTarget};
use crate::store::Store;
use crate::testing::FakeHost;

fn pooled(size: u32, floor: u64) -> (Arc<Manager>, Arc<FakeHost>) {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let config = Config {
        memory_reserve: 0,
        warm: vec![WarmTarget {
            template: "host".into(),
            size,
        }],
        warm_memory_floor: floor,
        ..Config::default()
    };
    let m = Manager::new(store, host.clone(), config).unwrap();
    (m, host)
}

fn req() -> CreateRequest {
    CreateRequest {
        template: "host".into(),
        timeout: Duration::from_secs(300),
        ..CreateRequest::default()
    }
}

async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + DEADLINE;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ready(m: &Manager) -> u32 {
    m.pool_stats().first().map_or(0, |s| s.ready)
}

#[tokio::test]
async fn a_create_claims_a_warm_sandbox_under_its_own_id_and_environment() {
    let (m, host) = pooled(2, 0);
    m.spawn_pools();
    until("the pool to fill", || ready(&m) == 2).await;
    assert_eq!(host.specs().len(), 2);
    let warm_names: Vec<String> = host.specs().iter().map(|s| s.hostname.clone()).collect();
    let mut r = req();
    r.env = EnvVars::new(vec![("K".into(), "v".into())]).unwrap();
    r.metadata.insert("m".into(), "1".into());
    let sb = m.create(&team("a"), r).await.unwrap();
    // One of the warm sandboxes, not a new one; named by its own id from now on.
    assert!(host.live().contains(&sb.runtime_id));
    assert!(!warm_names.contains(&sb.id));
    let given = host.given(&sb.runtime_id).expect("nothing given");
    assert_eq!(given.hostname, sb.id);
    // The server's limits, which it has, and no workspace.
    assert_eq!((given.limits, given.mounts.len()), (None, 0));
    let (hostname, env) = host.assigned(&sb.runtime_id).expect("no assign");
    assert_eq!(hostname, sb.id);
    assert!(env.contains(&("K".to_string(), "v".to_string())), "{env:?}");
    // Its backstop is its own (the warm one's, in the past, is gone).
    until(
        "its backstop",
        || matches!(host.deadline(&sb.runtime_id), Some(Some(ms)) if ms > 1_000),
    )
    .await;
    let stats = &m.pool_stats()[0];
    assert_eq!((stats.claimed, stats.missed), (1, 0));
    // It is the team's, recorded, and the pool makes a new one in its place.
    assert_eq!(m.store().list_sandboxes().unwrap().len(), 1);
    until("the refill", || ready(&m) == 2 && host.specs().len() == 3).await;
    // Killed, it is not given back: the pool stays at two, all of them never claimed.
    m.kill(&team("a"), &sb.id).await.unwrap();
    until("the destroy", || !host.live().contains(&sb.runtime_id)).await;
    assert_eq!(ready(&m), 2);
    assert_eq!(host.live().len(), 2);
}

#[tokio::test]
async fn a_create_with_lower_limits_claims_and_the_host_lowers_them() {
    let (m, host) = pooled(1, 0);
    m.spawn_pools();
    until("the pool to fill", || ready(&m) == 1).await;
    let mut r = req();
    let mut limits = m.limits().clone();
    limits.memory_bytes /= 2;
    limits.pids = 20;
    r.limits = Some(limits.clone());
    let sb = m.create(&team("a"), r).await.unwrap();
    // The warm one, made with the server's limits, is given the create's.
    let specs = host.specs();
    assert_eq!(specs[0].limits, *m.limits());
    let given = host.given(&sb.runtime_id).expect("nothing given");
    assert_eq!(given.limits, Some(limits.clone()));
    assert_eq!(sb.limits, limits);
    let stats = &m.pool_stats()[0];
    assert_eq!((stats.claimed, stats.missed), (1, 0));
}

#[tokio::test]
async fn a_claim_the_host_refuses_falls_back_to_a_fresh_create() {
    let (m, host) = pooled(1, 0);
    m.spawn_pools();
    until("the pool to fill", || ready(&m) == 1).await;
    let warm = host.live()[0].clone();
    // The host refuses the claim (a warm sandbox already using more than the create allows).
    host.fail_next(husk_runtime::failure::Failure::new(
        husk_runtime::failure::FailureKind::InvalidSpec,
        "the sandbox already uses more memory",
    ));
    let mut r = req();
    let mut limits = m.limits().clone();
    limits.memory_bytes /= 2;
    r.limits = Some(limits.clone());
    let sb = m.create(&team("a"), r).await.unwrap();
    // The warm one is gone; a fresh one with the create's limits is the create's.
    assert!(host.destroyed().contains(&warm));
    let specs = host.specs();
    assert_eq!(specs[1].hostname, sb.id, "made fresh, named by its id");
    assert_eq!(specs[1].limits, limits);
    assert_eq!(host.given(&sb.runtime_id), None);
    let stats = &m.pool_stats()[0];
    assert_eq!((stats.claimed, stats.claim_failed), (0, 1));
}

#[test]
fn what_a_warm_sandbox_cannot_be_given() {
    use crate::template::Resolved;
    let env = |r: &mut CreateRequest| {
        r.env = EnvVars::new(vec![("K".into(), "v".into())]).unwrap();
    };
    let plain = Resolved {
        name: "t".into(),
        ..Resolved::default()
    };
    // Limits, workspaces and networks are given at the claim.
    let mut r = req();
    r.limits = Some(husk_runtime::Limits::default());
    r.workspaces = vec![super::WorkspaceMount {
        name: "w".into(),
        path: "/work".into(),
        writable: true,
    }];
    assert_eq!(super::pool::misfit(&r, &plain), None);
    env(&mut r);
    assert_eq!(super::pool::misfit(&r, &plain), None);
    // Variables, where the start command already runs with the template's.
    let mut started = plain.clone();
    started.defaults.start_cmd = Some("serve".into());
    assert!(super::pool::misfit(&r, &started).is_some());
    assert_eq!(super::pool::misfit(&req(), &started), None);
    // Variables a kernel cannot be given; a snapshot.
    let mut kernels = plain.clone();
    kernels.defaults.contexts = vec!["cobol".into()];
    assert!(super::pool::misfit(&r, &kernels).is_some());
    // Header rules: their CA is written into a sandbox only when it is made.
    let mut ruled = req();
    ruled.rules = Some(super::tests::header_rules());
    assert_eq!(super::pool::misfit(&ruled, &plain), Some("header rules"));
    let mut snap = plain.clone();
    snap.snapshot = Some("snap".into());
    assert!(super::pool::misfit(&req(), &snap).is_some());
}

#[tokio::test]
async fn a_host_short_of_memory_gets_the_warm_sandboxes_back() {
    let (m, host) = pooled(2, 1 << 30);
    let available = Arc::new(std::sync::atomic::AtomicU64::new(u64::MAX));
    let probe = available.clone();
    m.set_pool_memory_probe(Arc::new(move || {
        Some(probe.load(std::sync::atomic::Ordering::Relaxed))
    }));
    m.spawn_pools();
    until("the pool to fill", || ready(&m) == 2).await;
    // The probe reads it on every pass.
    available.store(1 << 20, std::sync::atomic::Ordering::Relaxed);
    until("the warm sandboxes to go", || host.live().is_empty()).await;
    let stats = &m.pool_stats()[0];
    assert_eq!((stats.ready, stats.discarded, stats.made), (0, 2, 2));
    // Nothing is made while memory stays short; a create is still served (fresh).
    let sb = m.create(&team("a"), req()).await.unwrap();
    assert_eq!(host.specs().len(), 3);
    assert_eq!(host.specs()[2].hostname, sb.id);
}

#[tokio::test]
async fn no_warm_sandbox_outlives_the_server() {
    let (m, host) = pooled(2, 0);
    m.spawn_pools();
    until("the pool to fill", || ready(&m) == 2).await;
    // Each has a backstop in the past: with no server it ends at once.
    for rid in host.live() {
        assert_eq!(host.deadline(&rid), Some(Some(0)));
    }
    m.stop_keeping().await;
    until("the warm sandboxes to go", || host.live().is_empty()).await;
    assert_eq!(ready(&m), 0);
}

#[tokio::test]
async fn a_templates_spec_asks_for_a_pool_and_warm_overrides_it() {
    let targets = |warm: Vec<WarmTarget>| {
        let store = Arc::new(Store::open_in_memory().unwrap());
        let mut manifest = crate::template::TemplateManifest::default();
        manifest.defaults.warm = Some(3);
        for name in ["asks", "quiet"] {
            let mut m = manifest.clone();
            if name == "quiet" {
                m.defaults.warm = None;
            }
            store
                .put_template(&crate::store::TemplateRecord {
                    name: name.into(),
                    digest: format!("sha256:{name}"),
                    image: format!("/nonexistent/{name}").into(),
                    size: 1,
                    manifest: m,
                    created_at: time::OffsetDateTime::now_utc(),
                })
                .unwrap();
        }
        let config = Config {
            memory_reserve: 0,
            warm,
            ..Config::default()
        };
        let m = Manager::new(store, FakeHost::new(), config).unwrap();
        m.pool_targets().into_iter().collect::<Vec<_>>()
    };
    let t = |name: &str, size| WarmTarget {
        template: name.into(),
        size,
    };
    assert_eq!(targets(vec![]), vec![("asks".to_string(), 3)]);
    assert_eq!(
        targets(vec![t("asks", 1), t("quiet", 2)]),
        vec![("asks".to_string(), 1), ("quiet".to_string(), 2)]
    );
    assert_eq!(targets(vec![t("asks", 0)]), vec![]);
}

#[tokio::test]
async fn a_claim_counts_as_a_create_from_the_pool_and_the_pool_shows_in_the_servers_figures() {
    let (m, _host) = pooled(1, 0);
    m.spawn_pools();
    until("the pool to fill", || ready(&m) == 1).await;
    let stats = m.server_stats();
    // The warm sandbox is no team's: not counted as running.
    assert_eq!((stats.running, stats.pools.len()), (0, 1));
    assert_eq!((stats.pools[0].target, stats.pools[0].ready), (1, 1));
    m.create(&team("a"), req()).await.unwrap();
    // A claim wakes the refill at once: the second create may find a warm sandbox or not.
    let second = m.create(&team("a"), req()).await.unwrap();
    let stats = m.server_stats();
    let counts = super::tests::created_by_source(&m);
    let pool = &stats.pools[0];
    // Whether the second create found the pool refilled depends on timing; the totals do not.
    assert_eq!(counts[1].1, pool.claimed, "{counts:?} {pool:?}");
    assert_eq!(counts[0].1 + counts[1].1, 2, "{counts:?}");
    assert!(pool.claimed >= 1, "{pool:?}");
    assert_eq!(stats.running, 2);
    assert!(!second.id.is_empty());
}
