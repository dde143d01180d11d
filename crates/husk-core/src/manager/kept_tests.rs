//! Sandboxes that outlive the server, against a fake host whose "spawner" takes its live
//! sandboxes up at a restart (no root): a new manager over the same store takes them up as
//! they were (id, team, credentials, metadata, deadline, processes and their masks), reports
//! lost what it cannot take up, forgets what reached its timeout meanwhile, destroys what no
//! record names; and the agent's backstop follows the timeout and pauses.

use std::sync::Arc;
use std::time::Duration;

use super::tests::{team, DEADLINE};
use super::{Config, CoreError, CreateRequest, Lifecycle, ListFilter, Manager, OnTimeout};
use super::{PauseMode, Paused};
use crate::calls::{Answer, Call, ProcessSpec, Selector};
use crate::host::SandboxHost;
use crate::secrets::{MasterKeys, Secrets, MASTER_KEY_FILE};
use crate::store::Store;
use crate::testing::{stdout_of as output, FakeHost};

const VALUE: &str = "sk-live-kept-0123456789";

/// A directory removed on drop (the master key lives in it).
struct Dir(std::path::PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Fixture {
    store: Arc<Store>,
    host: Arc<FakeHost>,
    secrets: Arc<Secrets>,
    _dir: Dir,
}

fn config() -> Config {
    Config {
        memory_reserve: 0,
        ..Config::default()
    }
}

fn fixture() -> Fixture {
    let mut r = [0u8; 8];
    getrandom::fill(&mut r).unwrap();
    let dir = Dir(std::env::temp_dir().join(format!("husk-kept-{}", hex::encode(r))));
    std::fs::create_dir_all(&dir.0).unwrap();
    let store = Arc::new(Store::open_in_memory().unwrap());
    let keys = MasterKeys::load(&dir.0.join(MASTER_KEY_FILE)).unwrap();
    let secrets = Arc::new(Secrets::new(store.clone(), keys));
    secrets.set("a", "API", VALUE.as_bytes()).unwrap();
    Fixture {
        store,
        host: FakeHost::new(),
        secrets,
        _dir: dir,
    }
}

impl Fixture {
    /// A manager over the fixture's store and host: what `husk serve` makes at each start.
    fn manager(&self) -> Arc<Manager> {
        let m = Manager::new(self.store.clone(), self.host.clone(), config()).unwrap();
        m.set_secrets(self.secrets.clone());
        m
    }
}

fn req(timeout: Duration) -> CreateRequest {
    CreateRequest {
        template: "host".into(),
        timeout,
        metadata: [("k".to_owned(), "v".to_owned())].into(),
        ..CreateRequest::default()
    }
}

fn printenv(envs: &[(&str, &str)]) -> ProcessSpec {
    let envs = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    ProcessSpec::new("/bin/bash", vec!["-c".into(), "printenv".into()])
        .unwrap()
        .env(super::EnvVars::new(envs).unwrap())
}

/// Polls until `check` holds (the supervisor works in the background).
async fn until(check: impl Fn() -> bool) -> bool {
    let end = std::time::Instant::now() + DEADLINE;
    while std::time::Instant::now() < end {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    check()
}

#[tokio::test]
async fn a_restarted_server_takes_up_its_sandboxes_as_they_were() {
    let f = fixture();
    let m1 = f.manager();
    let a = team("a");
    let sb = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let other = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let (pid, events) = m1
        .start_process(&sb, printenv(&[("K", "husk-secret://API")]))
        .await
        .unwrap();
    assert!(output(events).await.contains("K=****"));
    // The supervisor records what changed (the masked process) before the stop.
    let (id, rid) = (sb.id.clone(), sb.runtime_id.clone());
    let before = m1.view(&a, &id).unwrap();
    assert_eq!(m1.stop_keeping().await, 2);
    assert!(
        f.host.destroyed().is_empty(),
        "a keeping stop destroys nothing"
    );
    drop((sb, other));

    f.host.restart();
    let m2 = f.manager();
    assert!(
        m2.lost_views(&a, &ListFilter::default())
            .unwrap()
            .is_empty(),
        "what the host took up is not lost"
    );
    let taken = m2.take_up().await.unwrap();
    assert_eq!((taken.running, taken.lost, taken.strays), (2, 0, 0));
    assert!(m2.runs_runtime(&rid));
    let after = m2.view(&a, &id).unwrap();
    assert_eq!(after.metadata, before.metadata);
    assert_eq!(after.end_at, before.end_at);
    assert_eq!(after.started_at, before.started_at);
    let sb2 = m2.get(&a, &id).unwrap();
    assert_eq!(after.access_token, before.access_token);
    assert_eq!(after.traffic_access_token, before.traffic_access_token);
    // Its processes are the same, and a reconnect to the masked one is masked still.
    match sb2.call(Call::ListProcesses).await.unwrap() {
        Answer::Processes(p) => assert!(p.iter().any(|p| p.pid == pid)),
        other => panic!("{other:?}"),
    }
    let (again, events) = m2.attach_process(&sb2, Selector::Pid(pid)).await.unwrap();
    assert_eq!(again, pid);
    let printed = output(events).await;
    assert!(
        printed.contains("K=****") && !printed.contains(VALUE),
        "{printed}"
    );
    // Another team still sees nothing of it; its owner kills it as any other.
    assert!(matches!(
        m2.view(&team("b"), &id),
        Err(CoreError::NotFound(_))
    ));
    m2.kill(&a, &id).await.unwrap();
    assert!(until(|| f.host.destroyed().contains(&rid)).await);
    assert!(m2
        .store()
        .list_sandboxes()
        .unwrap()
        .iter()
        .all(|r| r.id != id));
}

#[tokio::test]
async fn what_cannot_be_taken_up_is_lost_what_is_over_is_forgotten_and_strays_go() {
    let f = fixture();
    let m1 = f.manager();
    let a = team("a");
    let alive = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let died = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let over = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let broken = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    m1.stop_keeping().await;
    // One died meanwhile (its PID 1 killed), one reached its timeout meanwhile and ended by
    // its backstop, one's record cannot be read; and the host has a sandbox no record names.
    f.host.lose(&died.runtime_id);
    f.host.lose(&over.runtime_id);
    let past = time::OffsetDateTime::now_utc() - time::Duration::seconds(5);
    let desc = f
        .store
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .find(|r| r.id == over.id)
        .unwrap()
        .description
        .unwrap();
    f.store
        .update_sandbox_description(&over.id, past, &desc)
        .unwrap();
    f.store
        .update_sandbox_description(&broken.id, broken.end_at(), "{\"version\": 99}")
        .unwrap();
    let stray = f
        .host
        .create(&husk_runtime::SandboxSpec::idle(), None)
        .unwrap()
        .id;
    f.host.restart();
    let m2 = f.manager();
    let taken = m2.take_up().await.unwrap();
    assert_eq!((taken.running, taken.lost, taken.strays), (1, 1, 1));
    assert!(m2.get(&a, &alive.id).is_ok());
    // The one that died and the unreadable one are lost, each saying why; the one over is
    // forgotten, as a sandbox that ended at its timeout is.
    let lost = m2.lost_views(&a, &ListFilter::default()).unwrap();
    let mut ids: Vec<&str> = lost.iter().map(|v| v.id.as_str()).collect();
    ids.sort();
    let mut want = vec![died.id.as_str(), broken.id.as_str()];
    want.sort();
    assert_eq!(ids, want);
    match m2.view(&a, &broken.id) {
        Err(CoreError::Lost { reason, .. }) => {
            assert!(reason.contains("could not be taken up"), "{reason}");
            assert!(reason.contains("version is 99"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    match m2.view(&a, &died.id) {
        Err(CoreError::Lost { reason, .. }) => {
            assert!(
                reason.contains("ended while no husk server ran"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(m2.view(&a, &over.id), Err(CoreError::NotFound(_))));
    // What could not be taken up and the stray were destroyed; nothing else was.
    let destroyed = f.host.destroyed();
    assert!(destroyed.contains(&broken.runtime_id) && destroyed.contains(&stray));
    assert!(!destroyed.contains(&alive.runtime_id));
    assert_eq!(f.host.live(), vec![alive.runtime_id.clone()]);
}

#[tokio::test]
async fn a_create_answers_only_once_its_sandbox_has_its_backstop() {
    // An agent slow to take it: a create that left it to the supervisor would answer first,
    // and a server killed then would leave a sandbox that never ends.
    let f = fixture();
    f.host
        .set_agent_mode(crate::testing::AgentMode::SlowDeadline);
    let m = f.manager();
    let sb = m
        .create(&team("a"), req(Duration::from_secs(600)))
        .await
        .unwrap();
    let end = (sb.end_at().unix_timestamp_nanos() / 1_000_000) as u64;
    assert_eq!(f.host.deadline(&sb.runtime_id), Some(Some(end)));
}

#[tokio::test]
async fn the_backstop_follows_the_timeout_and_pauses() {
    let f = fixture();
    let m = f.manager();
    let layers = Arc::new(crate::testing::FakeLayers::default());
    m.set_saved_layers(layers, "/var/lib/husk-test".into());
    let a = team("a");
    let sb = m.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let rid = sb.runtime_id.clone();
    let ms = |t: time::OffsetDateTime| (t.unix_timestamp_nanos() / 1_000_000) as u64;
    let end = ms(sb.end_at());
    assert!(until(|| f.host.deadline(&rid) == Some(Some(end))).await);
    // A new timeout moves it.
    m.set_timeout(&a, &sb.id, Duration::from_secs(60)).unwrap();
    let end = ms(sb.end_at());
    assert!(until(|| f.host.deadline(&rid) == Some(Some(end))).await);
    // A paused sandbox has none (it waits for a server), and gets it back when resumed.
    assert_eq!(
        m.pause(&a, &sb.id, PauseMode::Full).await.unwrap(),
        Paused::Paused
    );
    assert_eq!(f.host.deadline(&rid), Some(None));
    m.resume(&a, &sb.id, None, false).await.unwrap();
    let end = ms(sb.end_at());
    assert!(until(|| f.host.deadline(&rid) == Some(Some(end))).await);
    // One paused at its timeout has none either.
    let mut r = req(Duration::from_secs(600));
    r.lifecycle = Lifecycle {
        on_timeout: OnTimeout::Pause(PauseMode::Full),
        auto_resume: false,
    };
    let auto = m.create(&a, r).await.unwrap();
    let auto_rid = auto.runtime_id.clone();
    assert!(until(|| f.host.deadline(&auto_rid) == Some(None)).await);
}

#[tokio::test]
async fn a_sandbox_paused_in_place_is_taken_up_paused() {
    let f = fixture();
    let m1 = f.manager();
    let a = team("a");
    let sb = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let (id, rid) = (sb.id.clone(), sb.runtime_id.clone());
    m1.pause(&a, &id, PauseMode::Full).await.unwrap();
    assert!(f.host.is_frozen(&rid));
    m1.stop_keeping().await;
    drop(sb);
    f.host.restart();
    let m2 = f.manager();
    let taken = m2.take_up().await.unwrap();
    assert_eq!(taken.running, 1);
    let sb2 = m2.get(&a, &id).unwrap();
    assert!(sb2.is_paused());
    assert!(f.host.is_frozen(&rid), "frozen again once reconnected");
    // Resumed as any paused sandbox is.
    let (resumed, _) = m2.resume(&a, &id, None, false).await.unwrap();
    assert!(!resumed.is_paused());
    assert!(!f.host.is_frozen(&rid));
}

#[tokio::test]
async fn a_run_the_stop_interrupted_has_its_sandbox_ended_not_taken_on() {
    let f = fixture();
    let m1 = f.manager();
    let a = team("a");
    let sb = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    let other = m1.create(&a, req(Duration::from_secs(600))).await.unwrap();
    // A run under way in `sb` when the server stopped.
    let now = time::OffsetDateTime::now_utc();
    let record = serde_json::json!({
        "id": "run_1", "team": "a", "key_id": "k", "template": "host",
        "command": ["sleep", "100"], "status": "running", "exit_code": null,
        "reason": null, "error": null,
        "created_at": now.format(&time::format_description::well_known::Rfc3339).unwrap(),
        "duration_ms": null, "sandbox_id": sb.id, "workspaces": [], "secrets": [],
        "outputs": null, "stdout_tail": "", "stderr_tail": ""
    })
    .to_string();
    f.store
        .put_run_record(&crate::store::RunRow {
            table: crate::store::RunTable::Runs,
            id: "run_1",
            team: "a",
            batch: None,
            created_at: now,
            ended_at: None,
            record: &record,
        })
        .unwrap();
    m1.stop_keeping().await;
    f.host.restart();
    let m2 = f.manager();
    assert_eq!(m2.take_up().await.unwrap().running, 2);
    let _runs = crate::runs::Runs::new(m2.clone()).unwrap();
    // No one is left to collect its output: its sandbox ends; the other stays.
    assert!(until(|| f.host.destroyed().contains(&sb.runtime_id)).await);
    assert!(m2.get(&a, &other.id).is_ok());
    assert!(!f.host.destroyed().contains(&other.runtime_id));
}
