//! Store tests on real SQLite files in a temporary directory.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use time::{Duration, OffsetDateTime};

use super::*;

/// A fresh directory under the system temp dir, removed on drop (also when a test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "husk-store-test-{}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed),
            OffsetDateTime::now_utc().unix_timestamp_nanos()
        ));
        std::fs::create_dir(&path).expect("create temp dir");
        TempDir(path)
    }

    /// A state directory inside, not yet existing, so that `Store::open` creates it.
    fn state(&self) -> PathBuf {
        self.0.join("state")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn open(dir: &Path) -> Sqlite {
    Sqlite::open(dir).expect("open store")
}

#[test]
fn store_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Store>();
}

#[test]
fn open_creates_a_private_state_dir_and_db() {
    let tmp = TempDir::new();
    let state = tmp.state().join("nested");
    let store = open(&state);
    let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join(DB_FILE)), 0o600);
    assert_eq!(store.path(), Some(state.join(DB_FILE).as_path()));
    let conn = store.conn();
    let journal: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .expect("journal_mode");
    assert_eq!(journal, "wal");
    let fk: bool = conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .expect("foreign_keys");
    assert!(fk);
}

#[test]
fn create_authenticate_revoke() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    assert!(!store.has_active_keys().expect("has_active_keys"));

    let (info, secret) = store
        .create_key("acme", false, Some("ci runner"))
        .expect("create");
    assert!(crate::keys::looks_like_key(&secret));
    assert_eq!(crate::keys::key_id(&secret), Some(info.id.as_str()));
    assert_eq!(info.team, "acme");
    assert!(!info.admin);
    assert_eq!(info.label.as_deref(), Some("ci runner"));
    assert_eq!(info.revoked_at, None);
    assert_eq!(info.display_id(), format!("e2b_{}…", info.id));
    assert!(store.has_active_keys().expect("has_active_keys"));

    let who = store.authenticate(&secret).expect("authenticates");
    assert_eq!(
        who,
        Principal {
            team: "acme".into(),
            key_id: info.id.clone(),
            admin: false
        }
    );
    // The first use is recorded.
    let listed = store.list_keys().expect("list");
    assert!(listed[0].last_used_at.is_some());

    let (admin_info, admin_secret) = store.create_key("ops", true, None).expect("create");
    assert!(store.authenticate(&admin_secret).expect("admin").admin);

    assert!(store.revoke_key(&info.id).expect("revoke"));
    assert_eq!(store.authenticate(&secret), None);
    // The other key is unaffected.
    assert!(store.authenticate(&admin_secret).is_some());
    // Revoking again is fine and keeps the first time.
    let first = store.list_keys().expect("list")[0].revoked_at;
    assert!(first.is_some());
    assert!(store.revoke_key(&info.display_id()).expect("revoke again"));
    assert_eq!(store.list_keys().expect("list")[0].revoked_at, first);

    // The whole key works as a name too.
    assert!(store.revoke_key(&admin_secret).expect("revoke by key"));
    assert_eq!(store.authenticate(&admin_secret), None);
    assert!(store.list_keys().expect("list")[1].revoked_at.is_some());
    assert_eq!(store.list_keys().expect("list")[1].id, admin_info.id);
    assert!(!store.has_active_keys().expect("has_active_keys"));
}

#[test]
fn wrong_and_malformed_keys_fail() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    let (info, secret) = store.create_key("acme", true, None).expect("create");

    // Same id, different secret: must not match.
    let mut forged = secret.clone();
    let last = if forged.ends_with('0') { "1" } else { "0" };
    forged.replace_range(forged.len() - 1.., last);
    assert_eq!(crate::keys::key_id(&forged), Some(info.id.as_str()));

    let huge = format!("e2b_{}", "a".repeat(10 * 1024));
    let upper = secret.to_uppercase();
    let spaced = format!("{secret} ");
    let bearer = format!("Bearer {secret}");
    let display = info.display_id();
    let hash = crate::keys::hash(&secret);
    let nuls = format!("e2b_{}", "\0".repeat(40));
    let cases: [&str; 13] = [
        "",
        "e2b_",
        &forged,
        &huge,
        "e2b_zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        &secret[..secret.len() - 1],
        &upper,
        &spaced,
        &bearer,
        &info.id,
        &display,
        &hash,
        &nuls,
    ];
    for case in cases {
        assert_eq!(store.authenticate(case), None, "{case:?}");
    }
    assert!(store.authenticate(&secret).is_some());
    // Unknown references revoke nothing.
    for case in [
        "",
        "e2b_",
        "nothing",
        "00000000",
        forged.as_str(),
        huge.as_str(),
    ] {
        if case == info.id {
            continue;
        }
        assert!(!store.revoke_key(case).expect("revoke"), "{case:?}");
    }
    assert!(store.authenticate(&secret).is_some());
}

#[test]
fn key_list_never_contains_the_secret_or_hash() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    let mut secrets = Vec::new();
    for team in ["a", "b", "c"] {
        secrets.push(store.create_key(team, false, Some(team)).expect("create").1);
    }
    let listed = store.list_keys().expect("list");
    assert_eq!(listed.len(), 3);
    let text = format!("{listed:?}");
    for secret in &secrets {
        let random = &secret[crate::keys::PREFIX.len()..];
        assert!(!text.contains(random), "secret in {text}");
        let hash = crate::keys::hash(secret);
        assert!(!text.contains(&hash[..16]), "hash in {text}");
    }
    assert_eq!(
        listed.iter().map(|k| k.team.as_str()).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}

#[test]
fn has_active_keys_is_false_after_revoking_all() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    let ids: Vec<String> = (0..3)
        .map(|_| store.create_key("t", false, None).expect("create").0.id)
        .collect();
    for (i, id) in ids.iter().enumerate() {
        assert!(store.has_active_keys().expect("active"), "before {i}");
        assert!(store.revoke_key(id).expect("revoke"));
    }
    assert!(!store.has_active_keys().expect("active"));
}

#[test]
fn invalid_teams_and_labels_are_refused() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    let long = "a".repeat(65);
    for team in ["", "Acme", "a b", "a/b", "ä", "a\n", long.as_str()] {
        assert!(
            matches!(
                store.create_key(team, false, None),
                Err(StoreError::InvalidTeam(_))
            ),
            "{team:?}"
        );
        assert!(matches!(
            store.set_team_quota(team, Some(1)),
            Err(StoreError::InvalidTeam(_))
        ));
    }
    let ok = "a".repeat(64);
    store.create_key(&ok, false, None).expect("64 characters");
    store
        .create_key("a-b_c9", false, None)
        .expect("punctuation");
    let long_label = "x".repeat(129);
    for label in ["\x1b[31mred", "a\nb", long_label.as_str()] {
        assert!(matches!(
            store.create_key("t", false, Some(label)),
            Err(StoreError::InvalidLabel)
        ));
    }
    store
        .create_key("t", false, Some(&"é".repeat(128)))
        .expect("128 characters");
}

#[test]
fn two_stores_on_one_file_see_each_others_writes() {
    let tmp = TempDir::new();
    let cli = open(&tmp.state());
    let server = open(&tmp.state());

    let (info, secret) = cli.create_key("acme", false, None).expect("create");
    assert_eq!(
        server.authenticate(&secret).map(|p| p.team).as_deref(),
        Some("acme")
    );
    cli.set_team_quota("acme", Some(7)).expect("quota");
    assert_eq!(server.team_quota("acme").expect("quota"), Some(7));

    assert!(cli.revoke_key(&info.id).expect("revoke"));
    // No cache: the very next check in the other process fails.
    assert_eq!(server.authenticate(&secret), None);

    let rec = record("sbx-1", OffsetDateTime::now_utc());
    server.insert_sandbox(&rec).expect("insert");
    assert_eq!(cli.list_sandboxes().expect("list"), vec![rec]);
}

#[test]
fn concurrent_writers_in_two_stores_wait_instead_of_failing() {
    let tmp = TempDir::new();
    let state = tmp.state();
    open(&state);
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let state = state.clone();
            std::thread::spawn(move || {
                let store = open(&state);
                for i in 0..25 {
                    let (_, secret) = store
                        .create_key(&format!("team{t}"), false, None)
                        .expect("create");
                    assert!(store.authenticate(&secret).is_some());
                    let rec = record(&format!("s{t}-{i}"), OffsetDateTime::now_utc());
                    store.insert_sandbox(&rec).expect("insert");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer thread");
    }
    let store = open(&state);
    assert_eq!(store.list_keys().expect("list").len(), 50);
    assert_eq!(store.list_sandboxes().expect("list").len(), 50);
}

#[test]
fn concurrent_first_opens_migrate_once() {
    for _ in 0..5 {
        let tmp = TempDir::new();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let state = tmp.state();
                std::thread::spawn(move || {
                    let store = open(&state);
                    store.create_key("t", false, None).expect("create");
                })
            })
            .collect();
        for t in threads {
            t.join().expect("opener thread");
        }
        let store = open(&tmp.state());
        assert_eq!(store.list_keys().expect("list").len(), 4);
    }
}

#[test]
fn migrations_are_idempotent_on_reopen() {
    let tmp = TempDir::new();
    let (_, secret) = {
        let store = open(&tmp.state());
        assert_eq!(
            schema::version(&store.conn()).expect("version"),
            schema::SCHEMA_VERSION
        );
        store.create_key("acme", false, None).expect("create")
    };
    for _ in 0..3 {
        let store = open(&tmp.state());
        assert_eq!(
            schema::version(&store.conn()).expect("version"),
            schema::SCHEMA_VERSION
        );
        assert!(store.authenticate(&secret).is_some());
        assert_eq!(store.list_keys().expect("list").len(), 1);
    }
}

#[test]
fn a_database_from_a_newer_husk_is_refused() {
    let tmp = TempDir::new();
    {
        let store = open(&tmp.state());
        store
            .conn()
            .pragma_update(None, "user_version", schema::SCHEMA_VERSION + 1)
            .expect("bump version");
    }
    match Sqlite::open(&tmp.state()) {
        Err(StoreError::SchemaTooNew { found, supported }) => {
            assert_eq!(found, schema::SCHEMA_VERSION + 1);
            assert_eq!(supported, schema::SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[test]
fn quota_set_and_get() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    assert_eq!(store.team_quota("nobody").expect("quota"), None);
    store
        .set_team_quota("early", Some(3))
        .expect("before any key");
    assert_eq!(store.team_quota("early").expect("quota"), Some(3));
    let (_, secret) = store.create_key("early", false, None).expect("create");
    // Creating a key for an existing team keeps its quota.
    assert_eq!(store.team_quota("early").expect("quota"), Some(3));
    assert!(store.authenticate(&secret).is_some());
    store.set_team_quota("early", Some(0)).expect("zero");
    assert_eq!(store.team_quota("early").expect("quota"), Some(0));
    store.set_team_quota("early", Some(u32::MAX)).expect("max");
    assert_eq!(store.team_quota("early").expect("quota"), Some(u32::MAX));
    store.set_team_quota("early", None).expect("default");
    assert_eq!(store.team_quota("early").expect("quota"), None);
}

fn record(id: &str, created_at: OffsetDateTime) -> SandboxRecord {
    SandboxRecord {
        id: id.into(),
        team: "acme".into(),
        template: "base".into(),
        runtime_id: format!("s1-{id}"),
        created_at,
        end_at: created_at + Duration::seconds(300),
        metadata: BTreeMap::new(),
        description: None,
    }
}

#[test]
fn sandbox_records_round_trip() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    assert!(store.list_sandboxes().expect("list").is_empty());

    let t0 = OffsetDateTime::now_utc();
    let mut a = record("a", t0);
    a.metadata.insert("user".into(), "alice".into());
    a.metadata.insert("quote\"d".into(), "ünïcode \n ✓".into());
    // Not UTC on the way in: stored as an instant, read back in UTC.
    let mut b = record("b", t0 + Duration::nanoseconds(1));
    b.created_at = b
        .created_at
        .to_offset(time::UtcOffset::from_hms(2, 0, 0).expect("offset"));
    b.team = "other".into(); // no such team: the record must still accept it
    store.insert_sandbox(&a).expect("insert a");
    store.insert_sandbox(&b).expect("insert b");
    assert!(matches!(
        store.insert_sandbox(&a),
        Err(StoreError::SandboxExists(id)) if id == "a"
    ));

    let listed = store.list_sandboxes().expect("list");
    assert_eq!(listed, vec![a.clone(), b.clone()]);
    assert_eq!(listed[1].created_at.offset(), time::UtcOffset::UTC);

    let later = t0 + Duration::hours(1);
    assert!(store.update_sandbox_end("a", later).expect("update"));
    assert!(!store.update_sandbox_end("nope", later).expect("update"));
    assert_eq!(store.list_sandboxes().expect("list")[0].end_at, later);

    assert!(store.delete_sandbox("a").expect("delete"));
    assert!(!store.delete_sandbox("a").expect("delete again"));
    assert_eq!(store.list_sandboxes().expect("list"), vec![b.clone()]);

    store.insert_sandbox(&record("c", t0)).expect("insert c");
    // One lost by itself, then every live one: none is listed live any more; each keeps its
    // record, when and why, until pruned; none is marked twice.
    let t1 = t0 + Duration::seconds(5);
    assert!(store.mark_sandbox_lost("c", "it died", t0).expect("lost c"));
    assert!(!store
        .mark_sandbox_lost("c", "again", t1)
        .expect("lost c again"));
    assert!(!store.mark_sandbox_lost("nope", "x", t1).expect("lost nope"));
    assert!(store
        .mark_sandbox_lost("b", "the server stopped", t1)
        .expect("lost b"));
    assert!(store.list_sandboxes().expect("list").is_empty());
    let lost = store.lost_sandboxes(None, None).expect("lost");
    let seen: Vec<(&str, &str)> = lost
        .iter()
        .map(|l| (l.record.id.as_str(), l.reason.as_str()))
        .collect();
    assert_eq!(seen, vec![("b", "the server stopped"), ("c", "it died")]);
    assert_eq!(lost[0].record, b);
    assert_eq!(lost[0].lost_at, t1);
    assert_eq!(store.prune_lost_sandboxes(t1).expect("prune"), 1);
    assert_eq!(store.lost_sandboxes(None, None).expect("lost").len(), 1);
    assert_eq!(
        store
            .lost_sandboxes(Some("other"), Some("b"))
            .expect("b")
            .len(),
        1
    );
    assert!(store
        .lost_sandboxes(Some("acme"), Some("b"))
        .expect("b")
        .is_empty());
    assert!(store.delete_sandbox("b").expect("delete lost"));

    // Times the database cannot represent are refused, not wrapped.
    let far = record(
        "far",
        OffsetDateTime::new_utc(
            time::Date::from_calendar_date(2300, time::Month::January, 1).expect("date"),
            time::Time::MIDNIGHT,
        ),
    );
    assert!(matches!(
        store.insert_sandbox(&far),
        Err(StoreError::TimeOutOfRange)
    ));
}

#[test]
fn in_memory_store_works() {
    let store = Sqlite::open_in_memory().expect("memory");
    assert_eq!(store.path(), None);
    let (_, secret) = store.create_key("t", false, None).expect("create");
    assert!(store.authenticate(&secret).is_some());
}

/// Issue 15 M4: records that ended before the retention are deleted (a run still going is
/// kept whatever its age); newer ones stay; reads see them through the reader connections.
#[test]
fn records_older_than_the_retention_are_pruned() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    let now = OffsetDateTime::now_utc();
    let old = now - Duration::days(30);
    let row = |table, id: &'static str, created, ended| RunRow {
        table,
        id,
        team: "t",
        batch: None,
        created_at: created,
        ended_at: ended,
        record: "{}",
    };
    // 1200 old runs: more than one pruning batch.
    let ids: Vec<String> = (0..1200).map(|i| format!("old{i}")).collect();
    for id in &ids {
        store
            .put_run_record(&RunRow {
                id,
                ..row(RunTable::Runs, "x", old, Some(old))
            })
            .unwrap();
    }
    store
        .put_run_record(&row(RunTable::Runs, "running", old, None))
        .unwrap();
    store
        .put_run_record(&row(RunTable::Runs, "recent", now, Some(now)))
        .unwrap();
    store
        .put_run_record(&row(RunTable::Batches, "oldbatch", old, Some(old)))
        .unwrap();
    store
        .record_secret_use(&SecretUse {
            at: old,
            team: "t".into(),
            secret: "S".into(),
            sandbox: "sb".into(),
            command: "c".into(),
        })
        .unwrap();
    let listed = |table| store.run_records(table, "t", None, 5000).unwrap().len();
    assert_eq!(listed(RunTable::Runs), 1202);

    let gone = store.prune_records(now - Duration::days(7)).unwrap();
    assert_eq!(gone, 1200 + 1 + 1);
    assert_eq!(listed(RunTable::Runs), 2);
    assert_eq!(listed(RunTable::Batches), 0);
    assert!(store
        .run_record(RunTable::Runs, "t", "running")
        .unwrap()
        .is_some());
    assert!(store
        .run_record(RunTable::Runs, "t", "recent")
        .unwrap()
        .is_some());
    assert!(store.secret_uses("t", 10).unwrap().is_empty());
    // Nothing more to do.
    assert_eq!(store.prune_records(now - Duration::days(7)).unwrap(), 0);
}

/// Reads go through connections of their own: each sees every write made before it, and a
/// read holding its connection (a long listing) leaves the others free.
#[test]
fn readers_see_every_write_and_do_not_wait_for_each_other() {
    let tmp = TempDir::new();
    let store = open(&tmp.state());
    assert_eq!(store.readers.len(), READERS);
    let held: Vec<_> = (0..READERS - 1).map(|_| store.reader()).collect();
    // Written through the writer, read at once through the one free reader.
    let (_, key) = store.create_key("t", false, None).unwrap();
    assert_eq!(store.authenticate(&key).unwrap().team, "t");
    assert_eq!(store.list_keys().unwrap().len(), 1);
    drop(held);
    // All readers busy: a read still gets through (it waits its turn on one).
    let all: Vec<_> = (0..READERS).map(|_| store.reader()).collect();
    let handle = std::thread::scope(|s| {
        let t = s.spawn(|| store.list_keys().unwrap().len());
        std::thread::sleep(std::time::Duration::from_millis(50));
        drop(all);
        t.join().unwrap()
    });
    assert_eq!(handle, 1);
}
