//! Pause and resume against a fake host and fake saved layers (no root): the states, the
//! quotas, tenancy, the timeout's pause, auto-resume's credentials, and that a sandbox paused
//! to disk comes back as the same sandbox (id, credentials, what it was created with) on its
//! layer, survives a new manager over the same store, and leaves nothing when killed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::tests::{team, DEADLINE};
use super::{
    Config, CoreError, CreateRequest, Inactive, Lifecycle, ListFilter, Manager, OnTimeout,
    PauseMode, Paused,
};
use crate::saved_layers::Home;
use crate::store::Store;
use crate::testing::{FakeHost, FakeLayers};

pub(super) struct Fixture {
    pub(super) m: Arc<Manager>,
    pub(super) host: Arc<FakeHost>,
    pub(super) layers: Arc<FakeLayers>,
    pub(super) store: Arc<Store>,
}

pub(super) fn fixture(quota: u32, paused_quota: u32) -> Fixture {
    fixture_with(Config {
        default_quota: quota,
        paused_quota,
        memory_reserve: 0,
        ..Config::default()
    })
}

pub(super) fn fixture_with(config: Config) -> Fixture {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let layers = Arc::new(FakeLayers::default());
    let _ = layers.host.set(host.clone());
    let m = Manager::new(store.clone(), host.clone(), config).unwrap();
    m.set_saved_layers(layers.clone(), "/var/lib/husk-test".into());
    Fixture {
        m,
        host,
        layers,
        store,
    }
}

pub(super) fn req() -> CreateRequest {
    let mut metadata = BTreeMap::new();
    metadata.insert("k".to_owned(), "v".to_owned());
    CreateRequest {
        template: "host".into(),
        timeout: Duration::from_secs(300),
        metadata,
        env: super::EnvVars::new(vec![("A".into(), "1".into())]).unwrap(),
        ..CreateRequest::default()
    }
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn paused_only() -> ListFilter {
    ListFilter {
        paused: true,
        ..ListFilter::default()
    }
}

fn running_only() -> ListFilter {
    ListFilter {
        running: true,
        ..ListFilter::default()
    }
}

#[tokio::test]
async fn a_full_pause_freezes_in_place_and_a_resume_thaws() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    assert_eq!(
        f.m.pause(&a, &sb.id, PauseMode::Full).await.unwrap(),
        Paused::Paused
    );
    assert!(f.host.is_frozen(&sb.runtime_id));
    assert_eq!(
        f.m.pause(&a, &sb.id, PauseMode::Full).await.unwrap(),
        Paused::AlreadyPaused
    );
    // A filesystem pause of a paused sandbox is "already paused" too, never a second copy.
    assert_eq!(
        f.m.pause(&a, &sb.id, PauseMode::Filesystem).await.unwrap(),
        Paused::AlreadyPaused
    );
    let view = f.m.view(&a, &sb.id).unwrap();
    assert_eq!(view.paused, Some(PauseMode::Full));
    assert_eq!(f.m.list_views(&a, &paused_only()).len(), 1);
    assert!(f.m.list_views(&a, &running_only()).is_empty());
    // A call that needs it running is refused, and cannot wake it (no auto-resume).
    assert!(matches!(
        f.m.set_timeout(&a, &sb.id, Duration::from_secs(5)),
        Err(CoreError::Paused(_))
    ));
    assert!(matches!(
        f.m.active(&sb.id, |_| true).await,
        Err(Inactive::Paused)
    ));
    let (again, resumed) =
        f.m.resume(&a, &sb.id, Some(Duration::from_secs(60)), false)
            .await
            .unwrap();
    assert!(resumed);
    assert!(Arc::ptr_eq(&again, &sb));
    assert!(!f.host.is_frozen(&sb.runtime_id));
    let left = sb.end_at() - time::OffsetDateTime::now_utc();
    assert!(left > time::Duration::seconds(55) && left <= time::Duration::seconds(60));
    // Connecting to a running sandbox resumes nothing.
    let (_, resumed) = f.m.resume(&a, &sb.id, None, false).await.unwrap();
    assert!(!resumed);
}

#[tokio::test]
async fn a_filesystem_pause_saves_destroys_and_boots_the_same_sandbox_again() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let (id, token, traffic) = (
        sb.id.clone(),
        sb.access_token.clone(),
        sb.traffic_access_token.clone(),
    );
    f.m.pause(&a, &id, PauseMode::Filesystem).await.unwrap();
    // Destroyed on the host, its layer saved, recorded in the store.
    assert_eq!(f.host.destroyed(), vec![sb.runtime_id.clone()]);
    let layers = f.layers.in_home(Home::Paused);
    assert_eq!(layers.len(), 1);
    assert_eq!(layers[0].0, id);
    assert_eq!(f.store.saved_sandboxes().unwrap().len(), 1);
    assert!(f.m.get(&a, &id).is_err());
    let view = f.m.view(&a, &id).unwrap();
    assert_eq!(view.paused, Some(PauseMode::Filesystem));
    assert_eq!(view.metadata.get("k").map(String::as_str), Some("v"));
    assert_eq!(
        f.m.pause(&a, &id, PauseMode::Filesystem).await.unwrap(),
        Paused::AlreadyPaused
    );
    // Resumed: a new sandbox on the host, with the same id and credentials, booted on the
    // saved layer, with what it was created with.
    let (back, resumed) = f.m.resume(&a, &id, None, false).await.unwrap();
    assert!(resumed);
    // The operator's metrics count it as a resume, beside the first create.
    assert_eq!(
        super::tests::created_by_source(&f.m),
        vec![("new", 1), ("pool", 0), ("snapshot", 0), ("resume", 1)]
    );
    assert_eq!(
        (back.id.as_str(), back.access_token.as_str()),
        (id.as_str(), token.as_str())
    );
    assert_eq!(back.traffic_access_token, traffic);
    assert_ne!(back.runtime_id, sb.runtime_id);
    assert_eq!(back.env(), &[("A".to_owned(), "1".to_owned())]);
    let spec = f.host.specs().last().unwrap().clone();
    assert_eq!(spec.hostname, id);
    assert_eq!(
        spec.layers,
        vec![std::path::PathBuf::from(format!(
            "/var/lib/husk-test/paused/{id}/{}",
            layers[0].1
        ))]
    );
    assert!(f.store.saved_sandboxes().unwrap().is_empty());
    // Paused again: the new layer is merged over the one it booted on, which goes.
    f.m.pause(&a, &id, PauseMode::Filesystem).await.unwrap();
    let captures = f.layers.captures.lock().unwrap().clone();
    assert_eq!(
        captures[1].3.as_ref().map(|b| b.layer.as_str()),
        Some(layers[0].1.as_str())
    );
    let now = f.layers.in_home(Home::Paused);
    assert_eq!(now.len(), 1);
    assert_ne!(now[0].1, layers[0].1);
    // Killed while paused: record and files gone.
    f.m.kill(&a, &id).await.unwrap();
    assert!(f.layers.layers.lock().unwrap().is_empty());
    assert!(f.store.saved_sandboxes().unwrap().is_empty());
    assert!(matches!(f.m.view(&a, &id), Err(CoreError::NotFound(_))));
    assert!(matches!(
        f.m.kill(&a, &id).await,
        Err(CoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_sandbox_paused_to_disk_outlives_its_manager() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let id = sb.id.clone();
    f.m.pause(&a, &id, PauseMode::Filesystem).await.unwrap();
    drop(sb);
    // A new server over the same store and layers.
    let m2 = Manager::new(f.store.clone(), f.host.clone(), Config::default()).unwrap();
    m2.set_saved_layers(f.layers.clone(), "/var/lib/husk-test".into());
    assert_eq!(
        m2.view(&a, &id).unwrap().paused,
        Some(PauseMode::Filesystem)
    );
    assert!(matches!(
        m2.view(&team("b"), &id),
        Err(CoreError::NotFound(_))
    ));
    let (back, resumed) = m2.resume(&a, &id, None, false).await.unwrap();
    assert!(resumed);
    assert_eq!(back.id, id);
}

#[tokio::test]
async fn a_record_from_another_version_is_reported_and_kept() {
    let f = fixture(10, 10);
    let rec = crate::store::SavedSandboxRecord {
        id: "abc".into(),
        team: "a".into(),
        saved_at: time::OffsetDateTime::now_utc(),
        description: r#"{"version": 99}"#.into(),
    };
    f.store.put_saved_sandbox(&rec).unwrap();
    let m2 = Manager::new(f.store.clone(), f.host.clone(), Config::default()).unwrap();
    m2.set_saved_layers(f.layers.clone(), "/var/lib/husk-test".into());
    assert!(m2.view(&team("a"), "abc").is_err());
    // Never deleted: a newer husk may still read it; its files are kept whole.
    assert_eq!(f.store.saved_sandboxes().unwrap().len(), 1);
    f.layers.put(Home::Paused, "abc", "0123456789abcdef");
    m2.set_saved_layers(f.layers.clone(), "/var/lib/husk-test".into());
    assert_eq!(f.layers.layers.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn at_start_layers_no_paused_sandbox_needs_are_removed() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    f.m.pause(&a, &sb.id, PauseMode::Filesystem).await.unwrap();
    // A sandbox resumed on its layer, then lost with its server (no kill removed its layer).
    f.layers.put(Home::Paused, "lost", "0123456789abcdef");
    let m2 = Manager::new(f.store.clone(), f.host.clone(), Config::default()).unwrap();
    m2.set_saved_layers(f.layers.clone(), "/var/lib/husk-test".into());
    let left = f.layers.in_home(Home::Paused);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, sb.id);
}

#[tokio::test]
async fn paused_sandboxes_have_their_own_quota() {
    let f = fixture(1, 1);
    let a = team("a");
    let first = f.m.create(&a, req()).await.unwrap();
    assert!(matches!(
        f.m.create(&a, req()).await,
        Err(CoreError::QuotaExceeded { .. })
    ));
    f.m.pause(&a, &first.id, PauseMode::Full).await.unwrap();
    // Paused: its place among the running is free.
    let second = f.m.create(&a, req()).await.unwrap();
    // Two paused would exceed the paused quota of one.
    assert!(matches!(
        f.m.pause(&a, &second.id, PauseMode::Filesystem).await,
        Err(CoreError::PausedQuotaExceeded { limit: 1, .. })
    ));
    // Resuming the first would make two running.
    assert!(matches!(
        f.m.resume(&a, &first.id, None, false).await,
        Err(CoreError::QuotaExceeded { .. })
    ));
    assert!(first.is_paused());
    f.m.kill(&a, &second.id).await.unwrap();
    assert!(f.m.resume(&a, &first.id, None, false).await.unwrap().1);
}

#[tokio::test]
async fn another_team_cannot_pause_resume_or_see_a_paused_sandbox() {
    let f = fixture(10, 10);
    let (a, b) = (team("a"), team("b"));
    let sb = f.m.create(&a, req()).await.unwrap();
    assert!(matches!(
        f.m.pause(&b, &sb.id, PauseMode::Full).await,
        Err(CoreError::NotFound(_))
    ));
    f.m.pause(&a, &sb.id, PauseMode::Filesystem).await.unwrap();
    assert!(matches!(
        f.m.resume(&b, &sb.id, None, false).await,
        Err(CoreError::NotFound(_))
    ));
    assert!(matches!(
        f.m.kill(&b, &sb.id).await,
        Err(CoreError::NotFound(_))
    ));
    assert!(f.m.list_views(&b, &ListFilter::default()).is_empty());
    assert_eq!(f.m.list_views(&a, &ListFilter::default()).len(), 1);
}

#[tokio::test]
async fn the_timeout_pauses_and_activity_resumes_only_with_credentials() {
    let f = fixture(10, 10);
    let a = team("a");
    let mut r = req();
    r.timeout = Duration::from_secs(1);
    r.lifecycle = Lifecycle {
        on_timeout: OnTimeout::Pause(PauseMode::Full),
        auto_resume: true,
    };
    let sb = f.m.create(&a, r).await.unwrap();
    wait_until("the timeout's pause", || sb.is_paused()).await;
    assert!(f.host.is_frozen(&sb.runtime_id));
    // Still there long after its timeout.
    assert!(f.m.get(&a, &sb.id).is_ok());
    // A request without the sandbox's credentials does not wake it.
    assert!(matches!(
        f.m.active(&sb.id, |c| c.access_token == "wrong").await,
        Err(Inactive::Paused)
    ));
    assert!(sb.is_paused());
    let token = sb.access_token.clone();
    let woken =
        f.m.active(&sb.id, |c| c.access_token == token)
            .await
            .unwrap();
    assert!(!woken.is_paused());
    assert!(!f.host.is_frozen(&sb.runtime_id));
    // Its timeout is the one it was created with again: it pauses once more.
    wait_until("the second pause", || sb.is_paused()).await;
}

#[tokio::test]
async fn a_timeout_pause_to_disk_and_an_auto_resume_from_it() {
    let f = fixture(10, 10);
    let a = team("a");
    let mut r = req();
    r.timeout = Duration::from_secs(1);
    r.lifecycle = Lifecycle {
        on_timeout: OnTimeout::Pause(PauseMode::Filesystem),
        auto_resume: true,
    };
    let sb = f.m.create(&a, r).await.unwrap();
    let id = sb.id.clone();
    wait_until("the pause to disk", || f.m.get(&a, &id).is_err()).await;
    assert_eq!(
        f.m.view(&a, &id).unwrap().paused,
        Some(PauseMode::Filesystem)
    );
    let token = sb.access_token.clone();
    let back = f.m.active(&id, |c| c.access_token == token).await.unwrap();
    assert_eq!(back.id, id);
    assert!(f.m.view(&a, &id).unwrap().paused.is_none());
    f.m.kill(&a, &id).await.unwrap();
}

#[tokio::test]
async fn without_a_layer_store_a_pause_to_disk_is_unsupported_and_harmless() {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let m = Manager::new(store, host.clone(), Config::default()).unwrap();
    let a = team("a");
    let sb = m.create(&a, req()).await.unwrap();
    assert!(matches!(
        m.pause(&a, &sb.id, PauseMode::Filesystem).await,
        Err(CoreError::Unsupported(_))
    ));
    // Still running, not frozen.
    assert!(!sb.is_paused());
    assert!(!host.is_frozen(&sb.runtime_id));
    assert!(m.get(&a, &sb.id).is_ok());
}

#[tokio::test]
async fn at_shutdown_a_sandbox_paused_in_place_is_saved_to_disk() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let running = f.m.create(&a, req()).await.unwrap();
    f.m.pause(&a, &sb.id, PauseMode::Full).await.unwrap();
    f.m.shutdown().await;
    let saved = f.store.saved_sandboxes().unwrap();
    assert_eq!(saved.len(), 1);
    assert_eq!(saved[0].id, sb.id);
    assert!(f.host.live().is_empty());
    assert!(f.m.get(&a, &running.id).is_err());
}

#[tokio::test]
async fn a_reboot_boots_a_sandbox_paused_in_place_again_on_its_files() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    f.m.pause(&a, &sb.id, PauseMode::Full).await.unwrap();
    let (back, resumed) = f.m.resume(&a, &sb.id, None, true).await.unwrap();
    assert!(resumed);
    assert_eq!(back.id, sb.id);
    assert_eq!(back.access_token, sb.access_token);
    // A new sandbox on the host, on the layer saved from the old one, which is gone.
    assert_ne!(back.runtime_id, sb.runtime_id);
    assert_eq!(f.host.destroyed(), vec![sb.runtime_id.clone()]);
    assert_eq!(f.host.specs().last().unwrap().layers.len(), 1);
    assert!(!back.is_paused());
    // A reboot of a running sandbox is a plain connect.
    let (same, resumed) = f.m.resume(&a, &sb.id, None, true).await.unwrap();
    assert!(!resumed);
    assert!(Arc::ptr_eq(&same, &back));
}

#[tokio::test]
async fn paused_sandboxes_beyond_the_retention_are_killed() {
    let Fixture {
        m, layers, store, ..
    } = fixture_with(Config {
        memory_reserve: 0,
        paused_retention: Some(Duration::from_millis(300)),
        ..Config::default()
    });
    let a = team("a");
    let (resident, on_disk, running) = (
        m.create(&a, req()).await.unwrap(),
        m.create(&a, req()).await.unwrap(),
        m.create(&a, req()).await.unwrap(),
    );
    m.pause(&a, &resident.id, PauseMode::Full).await.unwrap();
    m.pause(&a, &on_disk.id, PauseMode::Filesystem)
        .await
        .unwrap();
    // Not yet.
    assert_eq!(m.expire_paused().await, 0);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(m.expire_paused().await, 2);
    assert!(matches!(
        m.view(&a, &resident.id),
        Err(CoreError::NotFound(_))
    ));
    assert!(matches!(
        m.view(&a, &on_disk.id),
        Err(CoreError::NotFound(_))
    ));
    assert!(layers.layers.lock().unwrap().is_empty());
    assert!(store.saved_sandboxes().unwrap().is_empty());
    // A running sandbox is no paused one, however old.
    assert!(m.get(&a, &running.id).is_ok());
}

/// Sandboxes paused in place and resumed over and over, from as many tasks as the team's
/// quota: a resume never sees the quota full. Each task's sandbox holds at most one place at
/// any time, so a refusal can only come from one counted twice (its reservation and, resumed,
/// itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resumes_at_exactly_the_quota_are_never_refused() {
    const TASKS: u32 = 6;
    const CYCLES: u32 = 200;
    let f = fixture(TASKS, TASKS);
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let m = f.m.clone();
            tokio::spawn(async move {
                let a = team("a");
                let sb = m.create(&a, req()).await?;
                for _ in 0..CYCLES {
                    m.pause(&a, &sb.id, PauseMode::Full).await?;
                    m.resume(&a, &sb.id, None, false).await?;
                }
                m.kill(&a, &sb.id).await
            })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await.unwrap() {
            panic!("a pause or resume at the quota failed: {e}");
        }
    }
    assert_eq!(f.m.count(), 0);
}
