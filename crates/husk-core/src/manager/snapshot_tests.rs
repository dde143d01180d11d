//! Snapshots and forks against a fake host and fake saved layers (no root): what a snapshot is
//! made of and named, that sandboxes created from it stand on its layers, tenancy, names
//! taken over, quotas, forks with per-fork errors, and that a snapshot's files stay exactly
//! as long as something stands on them (a running, paused or starting sandbox, another
//! snapshot) and go when nothing does, across a new manager too.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::pause_tests::{fixture, fixture_with, req, Fixture};
use super::tests::team;
use super::{Config, CoreError, CreateRequest, Manager, PauseMode, SnapshotFilter};
use crate::saved_layers::Home;

const STATE: &str = "/var/lib/husk-test";

fn snapshot_files(f: &Fixture) -> Vec<String> {
    let mut v: Vec<String> = (f.layers.in_home(Home::Snapshot).into_iter())
        .map(|(o, _)| o)
        .collect();
    v.sort();
    v
}

fn path_of(f: &Fixture, owner: &str) -> PathBuf {
    let (o, l) = f
        .layers
        .in_home(Home::Snapshot)
        .into_iter()
        .find(|(o, _)| o == owner)
        .expect("the snapshot's layer");
    PathBuf::from(format!("{STATE}/snapshots/{o}/{l}"))
}

fn from(template: &str) -> CreateRequest {
    CreateRequest {
        template: template.into(),
        ..req()
    }
}

#[tokio::test]
async fn a_snapshot_copies_the_sandbox_briefly_frozen_and_new_sandboxes_boot_on_it() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let snap = f.m.snapshot(&a, &sb.id, None).await.unwrap();
    // Its layer was copied into the snapshot's directory; the source keeps running, thawed.
    let captures = f.layers.captures.lock().unwrap().clone();
    assert_eq!(captures.len(), 1);
    assert_eq!(captures[0].0, sb.runtime_id);
    assert_eq!(
        (captures[0].1, captures[0].2.as_str()),
        (Home::Snapshot, snap.id.as_str())
    );
    assert_eq!(captures[0].3, None);
    assert!(!f.host.is_frozen(&sb.runtime_id));
    assert!(f.m.get(&a, &sb.id).is_ok());
    assert_eq!(snap.snapshot_id(), format!("{}:default", snap.id));
    assert_eq!(
        (snap.source.as_str(), snap.parent.as_str()),
        (sb.id.as_str(), "host")
    );
    assert_eq!(f.store.snapshots().unwrap().len(), 1);
    let listed = f.m.list_snapshots("a", &SnapshotFilter::default());
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, snap.id);
    // A sandbox from it boots on the snapshot's layer over the same root.
    let child = f.m.create(&a, from(&snap.snapshot_id())).await.unwrap();
    let spec = f.host.specs().last().unwrap().clone();
    assert_eq!(spec.layers, vec![path_of(&f, &snap.id)]);
    assert_eq!(spec.rootfs, husk_runtime::RootSource::Host);
    assert_eq!(child.template, snap.snapshot_id());
    // By its bare id too.
    f.m.create(&a, from(&snap.id)).await.unwrap();
    // A snapshot of that sandbox stands on the first one's layer (shared, not copied).
    let snap2 = f.m.snapshot(&a, &child.id, None).await.unwrap();
    assert_eq!(snap2.layers.len(), 2);
    assert_eq!(snap2.layers[1], snap.layers[0]);
    assert_eq!(snap2.parent, "host");
    f.m.create(&a, from(&snap2.snapshot_id())).await.unwrap();
    let spec = f.host.specs().last().unwrap().clone();
    assert_eq!(
        spec.layers,
        vec![path_of(&f, &snap2.id), path_of(&f, &snap.id)]
    );
}

#[tokio::test]
async fn snapshots_are_the_teams_own() {
    let f = fixture(10, 10);
    let (a, b) = (team("a"), team("b"));
    let sb = f.m.create(&a, req()).await.unwrap();
    let snap = f.m.snapshot(&a, &sb.id, Some("web")).await.unwrap();
    assert_eq!(snap.snapshot_id(), "a/web:default");
    assert_eq!(snap.names(), vec!["a/web:default".to_owned()]);
    for name in ["a/web:default", "a/web", "web", "web:default", &snap.id] {
        f.m.create(&a, from(name)).await.unwrap();
    }
    // Another team neither sees, uses, snapshots from nor deletes it.
    for name in ["a/web:default", "a/web", "web", &snap.id, "b/web"] {
        assert!(
            matches!(
                f.m.create(&b, from(name)).await,
                Err(CoreError::TemplateNotFound(_))
            ),
            "{name}"
        );
    }
    assert!(f
        .m
        .list_snapshots("b", &SnapshotFilter::default())
        .is_empty());
    assert!(!f.m.delete_snapshot("b", "a/web").await.unwrap());
    assert!(!f.m.delete_snapshot("b", &snap.id).await.unwrap());
    assert!(matches!(
        f.m.snapshot(&b, &sb.id, None).await,
        Err(CoreError::NotFound(_))
    ));
    assert!(matches!(
        f.m.fork(&b, &sb.id, 1, None).await,
        Err(CoreError::NotFound(_))
    ));
    assert_eq!(f.m.list_snapshots("a", &SnapshotFilter::default()).len(), 1);
    // Filters: by source sandbox, by name (any tag without one), by id.
    let by = |sandbox: Option<&str>, name: Option<&str>| {
        f.m.list_snapshots(
            "a",
            &SnapshotFilter {
                sandbox: sandbox.map(str::to_owned),
                name: name.map(str::to_owned),
            },
        )
        .len()
    };
    assert_eq!(by(Some(&sb.id), None), 1);
    assert_eq!(by(Some("other"), None), 0);
    assert_eq!(by(None, Some("web")), 1);
    assert_eq!(by(None, Some("a/web:default")), 1);
    assert_eq!(by(None, Some("web:v2")), 0);
    assert_eq!(by(None, Some(&snap.id)), 1);
    // Invalid names are refused before anything is copied.
    let before = f.layers.captures.lock().unwrap().len();
    for bad in ["Web", "a/b", "../x", ""] {
        assert!(matches!(
            f.m.snapshot(&a, &sb.id, Some(bad)).await,
            Err(CoreError::InvalidArgument(_))
        ));
    }
    assert_eq!(f.layers.captures.lock().unwrap().len(), before);
}

#[tokio::test]
async fn a_deleted_or_replaced_snapshot_stays_while_a_sandbox_stands_on_it() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let old = f.m.snapshot(&a, &sb.id, Some("web")).await.unwrap();
    let user = f.m.create(&a, from("a/web")).await.unwrap();
    // Taken over under its name: the name now means the new one.
    let new = f.m.snapshot(&a, &sb.id, Some("web")).await.unwrap();
    let listed = f.m.list_snapshots("a", &SnapshotFilter::default());
    assert_eq!(
        listed.iter().map(|s| &s.id).collect::<Vec<_>>(),
        vec![&new.id]
    );
    let on_new = f.m.create(&a, from("a/web")).await.unwrap();
    assert_eq!(
        f.host.specs().last().unwrap().layers,
        vec![path_of(&f, &new.id)]
    );
    // The old one is kept for the sandbox that stands on it, and can no longer be named.
    assert!(snapshot_files(&f).contains(&old.id));
    assert!(matches!(
        f.m.create(&a, from(&old.id)).await,
        Err(CoreError::TemplateNotFound(_))
    ));
    f.m.kill(&a, &user.id).await.unwrap();
    assert!(!snapshot_files(&f).contains(&old.id));
    assert_eq!(f.store.snapshots().unwrap().len(), 1);
    // Deleted while a sandbox stands on it, one paused to disk: kept until that one is killed.
    let paused = f.m.create(&a, from("a/web")).await.unwrap();
    f.m.pause(&a, &paused.id, PauseMode::Filesystem)
        .await
        .unwrap();
    assert!(f.m.delete_snapshot("a", "web").await.unwrap());
    assert!(!f.m.delete_snapshot("a", "web").await.unwrap());
    assert!(f
        .m
        .list_snapshots("a", &SnapshotFilter::default())
        .is_empty());
    assert!(matches!(
        f.m.create(&a, from("a/web")).await,
        Err(CoreError::TemplateNotFound(_))
    ));
    assert!(snapshot_files(&f).contains(&new.id));
    // ... and it resumes on its own layer over the snapshot's, gone from the list or not.
    f.m.resume(&a, &paused.id, None, false).await.unwrap();
    let layers = f.host.specs().last().unwrap().layers.clone();
    assert_eq!(layers.len(), 2);
    assert!(layers[0].starts_with(format!("{STATE}/paused/{}", paused.id)));
    assert_eq!(layers[1], path_of(&f, &new.id));
    // Paused again and killed while paused: nothing is left.
    f.m.pause(&a, &paused.id, PauseMode::Filesystem)
        .await
        .unwrap();
    f.m.kill(&a, &paused.id).await.unwrap();
    // The last sandbox standing on it.
    assert_eq!(snapshot_files(&f), vec![new.id.clone()]);
    f.m.kill(&a, &on_new.id).await.unwrap();
    assert!(snapshot_files(&f).is_empty());
    assert!(f.store.snapshots().unwrap().is_empty());
}

#[tokio::test]
async fn a_paused_sandbox_cannot_be_snapshotted_or_forked() {
    let f = fixture(10, 10);
    let a = team("a");
    let full = f.m.create(&a, req()).await.unwrap();
    f.m.pause(&a, &full.id, PauseMode::Full).await.unwrap();
    let disk = f.m.create(&a, req()).await.unwrap();
    f.m.pause(&a, &disk.id, PauseMode::Filesystem)
        .await
        .unwrap();
    for id in [&full.id, &disk.id] {
        assert!(matches!(
            f.m.snapshot(&a, id, None).await,
            Err(CoreError::Paused(_))
        ));
        assert!(matches!(
            f.m.fork(&a, id, 2, None).await,
            Err(CoreError::Paused(_))
        ));
    }
    assert!(matches!(
        f.m.snapshot(&a, "nosuchsandbox", None).await,
        Err(CoreError::NotFound(_))
    ));
    // Still paused in place, nothing copied.
    assert!(f.host.is_frozen(&full.runtime_id));
    assert!(snapshot_files(&f).is_empty());
}

#[tokio::test]
async fn a_fork_starts_sandboxes_with_the_sources_settings_on_one_snapshot() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let forks =
        f.m.fork(&a, &sb.id, 3, Some(Duration::from_secs(60)))
            .await
            .unwrap();
    assert_eq!(forks.len(), 3);
    let forks: Vec<_> = forks.into_iter().map(Result::unwrap).collect();
    // The operator's metrics count each fork as made from a snapshot.
    assert_eq!(
        super::tests::created_by_source(&f.m),
        vec![("new", 1), ("pool", 0), ("snapshot", 3), ("resume", 0)]
    );
    // One capture for all; each fork its own id and credentials, the source's settings.
    assert_eq!(f.layers.captures.lock().unwrap().len(), 1);
    let snap = snapshot_files(&f);
    assert_eq!(snap.len(), 1);
    let mut ids: Vec<&str> = forks.iter().map(|s| s.id.as_str()).collect();
    ids.push(&sb.id);
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 4);
    for fk in &forks {
        assert_ne!(fk.access_token, sb.access_token);
        assert_eq!(fk.env(), sb.env());
        assert_eq!(fk.metadata, sb.metadata);
        assert_eq!(fk.template, sb.template);
        assert_eq!(fk.timeout, Duration::from_secs(60));
        assert_eq!(fk.origin.snapshot.as_deref(), Some(snap[0].as_str()));
    }
    for spec in &f.host.specs()[1..] {
        assert_eq!(spec.layers, vec![path_of(&f, &snap[0])]);
    }
    // The source goes on; the fork's snapshot is nobody's to list or name.
    assert!(!f.host.is_frozen(&sb.runtime_id));
    assert!(f
        .m
        .list_snapshots("a", &SnapshotFilter::default())
        .is_empty());
    assert!(matches!(
        f.m.create(&a, from(&snap[0])).await,
        Err(CoreError::TemplateNotFound(_))
    ));
    // Its files go with the last fork.
    for fk in &forks {
        assert_eq!(snapshot_files(&f).len(), 1);
        f.m.kill(&a, &fk.id).await.unwrap();
    }
    assert!(snapshot_files(&f).is_empty());
    assert!(f.store.snapshots().unwrap().is_empty());
}

#[tokio::test]
async fn forks_over_the_quota_fail_one_by_one() {
    let f = fixture(3, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let results = f.m.fork(&a, &sb.id, 4, None).await.unwrap();
    let started = results.iter().filter(|r| r.is_ok()).count();
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(CoreError::QuotaExceeded { limit: 3, .. })))
        .count();
    assert_eq!((started, refused), (2, 2));
    for bad in [0, 21] {
        assert!(matches!(
            f.m.fork(&a, &sb.id, bad, None).await,
            Err(CoreError::InvalidArgument(_))
        ));
    }
    // No fork at all: the snapshot goes at once.
    for r in results.into_iter().flatten() {
        f.m.kill(&a, &r.id).await.unwrap();
    }
    assert!(snapshot_files(&f).is_empty());
}

#[tokio::test]
async fn a_team_has_a_quota_of_snapshots() {
    let f = fixture_with(Config {
        default_quota: 10,
        memory_reserve: 0,
        snapshot_quota: 1,
        ..Config::default()
    });
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    f.m.snapshot(&a, &sb.id, Some("web")).await.unwrap();
    assert!(matches!(
        f.m.snapshot(&a, &sb.id, None).await,
        Err(CoreError::SnapshotQuotaExceeded { limit: 1, .. })
    ));
    // Taking a name over does not add one; another team has its own quota.
    f.m.snapshot(&a, &sb.id, Some("web")).await.unwrap();
    let b = team("b");
    let other = f.m.create(&b, req()).await.unwrap();
    f.m.snapshot(&b, &other.id, None).await.unwrap();
    // A fork's snapshot is not counted.
    assert!(f.m.fork(&a, &sb.id, 1, None).await.unwrap()[0].is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_snapshot_quota_holds_under_concurrent_requests() {
    let f = fixture_with(Config {
        default_quota: 10,
        memory_reserve: 0,
        snapshot_quota: 2,
        ..Config::default()
    });
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let tasks: Vec<_> = (0..6)
        .map(|_| {
            let (m, a, id) = (f.m.clone(), a.clone(), sb.id.clone());
            tokio::spawn(async move { m.snapshot(&a, &id, None).await })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(CoreError::SnapshotQuotaExceeded { limit: 2, .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ok, 2);
    assert_eq!(f.m.list_snapshots("a", &SnapshotFilter::default()).len(), 2);
    // The copies of those refused were removed.
    assert_eq!(snapshot_files(&f).len(), 2);
    assert_eq!(f.store.snapshots().unwrap().len(), 2);
}

#[tokio::test]
async fn snapshots_outlive_their_manager_and_nothing_else_does() {
    let f = fixture(10, 10);
    let a = team("a");
    let sb = f.m.create(&a, req()).await.unwrap();
    let kept = f.m.snapshot(&a, &sb.id, Some("web")).await.unwrap();
    let gone = f.m.snapshot(&a, &sb.id, None).await.unwrap();
    // A sandbox paused to disk on a deleted snapshot keeps it through the restart.
    let on_gone = f.m.create(&a, from(&gone.id)).await.unwrap();
    f.m.pause(&a, &on_gone.id, PauseMode::Filesystem)
        .await
        .unwrap();
    assert!(f.m.delete_snapshot("a", &gone.id).await.unwrap());
    // Deleted, kept by a running sandbox that a crash of the server then ends.
    let crashed = f.m.snapshot(&a, &sb.id, None).await.unwrap();
    f.m.create(&a, from(&crashed.id)).await.unwrap();
    assert!(f.m.delete_snapshot("a", &crashed.id).await.unwrap());
    assert!(snapshot_files(&f).contains(&crashed.id));
    // What a capture cut short by a crash left.
    f.layers.put(Home::Snapshot, "lost", "0123456789abcdef");
    let m2 = Manager::new(f.store.clone(), f.host.clone(), Config::default()).unwrap();
    m2.set_saved_layers(f.layers.clone(), STATE.into());
    let mut expect = vec![kept.id.clone(), gone.id.clone()];
    expect.sort();
    assert_eq!(snapshot_files(&f), expect);
    let listed = m2.list_snapshots("a", &SnapshotFilter::default());
    assert_eq!(
        listed.iter().map(|s| &s.id).collect::<Vec<_>>(),
        vec![&kept.id]
    );
    assert_eq!(*listed[0], *kept);
    m2.create(&a, from("a/web")).await.unwrap();
    m2.resume(&a, &on_gone.id, None, false).await.unwrap();
    m2.kill(&a, &on_gone.id).await.unwrap();
    assert_eq!(snapshot_files(&f), vec![kept.id.clone()]);
}

#[tokio::test]
async fn a_snapshot_record_from_another_version_is_kept_whole() {
    let f = fixture(10, 10);
    let row = crate::store::SnapshotRow {
        id: "newer".into(),
        team: "a".into(),
        name: None,
        state: "retired".into(),
        digest: None,
        created_at: time::OffsetDateTime::now_utc(),
        record: r#"{"version": 99}"#.into(),
    };
    f.store.put_snapshots(&[row]).unwrap();
    f.layers.put(Home::Snapshot, "newer", "0123456789abcdef");
    let m2: Arc<Manager> =
        Manager::new(f.store.clone(), f.host.clone(), Config::default()).unwrap();
    m2.set_saved_layers(f.layers.clone(), STATE.into());
    // A collection after some other snapshot is retired leaves it too.
    let a = team("a");
    let sb = m2.create(&a, req()).await.unwrap();
    let s = m2.snapshot(&a, &sb.id, None).await.unwrap();
    m2.delete_snapshot("a", &s.id).await.unwrap();
    assert_eq!(snapshot_files(&f), vec!["newer".to_owned()]);
    assert_eq!(f.store.snapshots().unwrap().len(), 1);
}
