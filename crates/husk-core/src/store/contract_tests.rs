//! The store's behaviour, run on both backends: every test here is generated once for the
//! SQLite file and once for PostgreSQL (a private server the tests start, one fresh database
//! per test), so that the two cannot drift apart.

use std::collections::BTreeMap;
use std::path::PathBuf;

use time::{Duration, OffsetDateTime};

use super::test_postgres::TestPostgres;
use super::tests::TempDir;
use super::*;

/// Where one test's database is; [`Fixture::open`] opens it as another process would.
pub(super) enum Fixture {
    Sqlite(TempDir),
    Postgres(String),
}

impl Fixture {
    fn sqlite() -> Fixture {
        Fixture::Sqlite(TempDir::new())
    }

    fn postgres() -> Fixture {
        Fixture::Postgres(TestPostgres::shared().fresh_database())
    }

    /// A store on this test's database (each call a new one, as in another process; for
    /// PostgreSQL the same node).
    pub(super) fn open(&self) -> Store {
        match self {
            Fixture::Sqlite(dir) => Store::open(&dir.state()).expect("open SQLite store"),
            Fixture::Postgres(url) => {
                Store::open_postgres(url, "node-a", None).expect("open PostgreSQL")
            }
        }
    }
}

/// Generates `sqlite::<test>` and `postgres::<test>` for each test function named.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[test] fn $name() { super::$name(&super::Fixture::sqlite()) } )*
        }
        mod postgres {
            $( #[test] fn $name() { super::$name(&super::Fixture::postgres()) } )*
        }
    };
}

on_both_backends!(
    create_authenticate_revoke,
    wrong_and_malformed_keys_fail,
    key_list_never_contains_the_secret_or_hash,
    has_active_keys_is_false_after_revoking_all,
    invalid_teams_and_labels_are_refused,
    quota_set_and_get,
    sandbox_records_round_trip,
    records_older_than_the_retention_are_pruned,
    two_stores_see_each_others_writes,
    concurrent_writers_never_fail,
    run_records_list_filter_and_finish,
    secrets_write_modes_versions_and_uses,
    templates_register_replace_and_delete,
    volumes_are_named_once_per_team,
    saved_sandboxes_and_snapshots_round_trip,
);

fn create_authenticate_revoke(fx: &Fixture) {
    let store = fx.open();
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

fn wrong_and_malformed_keys_fail(fx: &Fixture) {
    let store = fx.open();
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

fn key_list_never_contains_the_secret_or_hash(fx: &Fixture) {
    let store = fx.open();
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

fn has_active_keys_is_false_after_revoking_all(fx: &Fixture) {
    let store = fx.open();
    let ids: Vec<String> = (0..3)
        .map(|_| store.create_key("t", false, None).expect("create").0.id)
        .collect();
    for (i, id) in ids.iter().enumerate() {
        assert!(store.has_active_keys().expect("active"), "before {i}");
        assert!(store.revoke_key(id).expect("revoke"));
    }
    assert!(!store.has_active_keys().expect("active"));
}

fn invalid_teams_and_labels_are_refused(fx: &Fixture) {
    let store = fx.open();
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

fn quota_set_and_get(fx: &Fixture) {
    let store = fx.open();
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

fn sandbox_records_round_trip(fx: &Fixture) {
    let store = fx.open();
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

/// Issue 15 M4: records that ended before the retention are deleted (a run still going is
/// kept whatever its age); newer ones stay; reads see them through the reader connections.
fn records_older_than_the_retention_are_pruned(fx: &Fixture) {
    let store = fx.open();
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

pub(super) fn record(id: &str, created_at: OffsetDateTime) -> SandboxRecord {
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

fn two_stores_see_each_others_writes(fx: &Fixture) {
    let cli = fx.open();
    let server = fx.open();

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

fn concurrent_writers_never_fail(fx: &Fixture) {
    fx.open();
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let store = fx.open();
                for i in 0..20 {
                    let (_, secret) = store
                        .create_key(&format!("team{t}"), false, None)
                        .expect("create");
                    assert!(store.authenticate(&secret).is_some());
                    let rec = record(&format!("s{t}-{i}"), OffsetDateTime::now_utc());
                    store.insert_sandbox(&rec).expect("insert");
                }
            });
        }
    });
    let store = fx.open();
    assert_eq!(store.list_keys().expect("list").len(), 80);
    assert_eq!(store.list_sandboxes().expect("list").len(), 80);
}

fn run_records_list_filter_and_finish(fx: &Fixture) {
    let store = fx.open();
    let t0 = OffsetDateTime::now_utc();
    let run = |id: &'static str, batch, at: i64, ended: bool, record: &'static str| RunRow {
        table: RunTable::Runs,
        id,
        team: "t",
        batch,
        created_at: t0 + Duration::seconds(at),
        ended_at: ended.then_some(t0 + Duration::seconds(at + 1)),
        record,
    };
    store
        .put_run_record(&run("r1", Some("b1"), 1, false, "{\"n\":1}"))
        .unwrap();
    store
        .put_run_record(&run("r2", Some("b1"), 2, true, "{\"n\":2}"))
        .unwrap();
    store
        .put_run_record(&run("r3", None, 3, true, "{\"n\":3}"))
        .unwrap();
    store
        .put_run_record(&RunRow {
            team: "other",
            ..run("r4", None, 4, false, "{\"n\":4}")
        })
        .unwrap();
    store
        .put_run_record(&RunRow {
            table: RunTable::Batches,
            ..run("b1", None, 0, false, "{\"batch\":1}")
        })
        .unwrap();

    // Newest first, the team's only, bounded by the limit.
    let all = store.run_records(RunTable::Runs, "t", None, 10).unwrap();
    assert_eq!(all, ["{\"n\":3}", "{\"n\":2}", "{\"n\":1}"]);
    assert_eq!(
        store
            .run_records(RunTable::Runs, "t", None, 2)
            .unwrap()
            .len(),
        2
    );
    // A batch's runs, oldest first.
    let in_batch = store
        .run_records(RunTable::Runs, "t", Some("b1"), 10)
        .unwrap();
    assert_eq!(in_batch, ["{\"n\":1}", "{\"n\":2}"]);
    // Another team's record is as missing as one that does not exist.
    assert_eq!(store.run_record(RunTable::Runs, "t", "r4").unwrap(), None);
    assert_eq!(
        store
            .run_record(RunTable::Runs, "other", "r4")
            .unwrap()
            .as_deref(),
        Some("{\"n\":4}")
    );
    assert_eq!(
        store
            .run_record(RunTable::Batches, "t", "b1")
            .unwrap()
            .as_deref(),
        Some("{\"batch\":1}")
    );

    let mut unfinished = store.unfinished_runs().unwrap();
    unfinished.sort_by(|a, b| a.1.cmp(&b.1));
    let ids: Vec<(RunTable, &str)> = unfinished
        .iter()
        .map(|(t, id, _)| (*t, id.as_str()))
        .collect();
    assert_eq!(
        ids,
        [
            (RunTable::Batches, "b1"),
            (RunTable::Runs, "r1"),
            (RunTable::Runs, "r4")
        ]
    );
    // Finishing replaces the record and its end; the creation stays.
    store
        .put_run_record(&run("r1", Some("b1"), 1, true, "{\"n\":\"done\"}"))
        .unwrap();
    assert_eq!(
        store
            .run_record(RunTable::Runs, "t", "r1")
            .unwrap()
            .as_deref(),
        Some("{\"n\":\"done\"}")
    );
    assert_eq!(store.unfinished_runs().unwrap().len(), 2);
}

fn sealed(team: &str, name: &str, value: u8, at: OffsetDateTime) -> SealedRow {
    SealedRow {
        team: team.into(),
        name: name.into(),
        key_id: "k1".into(),
        nonce: vec![value; 24],
        ciphertext: vec![value; 40],
        created_at: at,
        updated_at: at,
        version: 1,
        metadata: None,
    }
}

fn secrets_write_modes_versions_and_uses(fx: &Fixture) {
    let store = fx.open();
    let t0 = OffsetDateTime::now_utc();
    // Update of a missing secret makes nothing; create makes it at version 1, with `{}`.
    assert!(!store
        .write_secret(&sealed("t", "API", 1, t0), PutMode::Update)
        .unwrap());
    assert!(store
        .write_secret(&sealed("t", "API", 1, t0), PutMode::Create)
        .unwrap());
    let got = store.secret("t", "API").unwrap().expect("stored");
    assert_eq!((got.version, got.nonce.clone()), (1, vec![1; 24]));
    assert_eq!(got.metadata, Some(BTreeMap::new()));
    assert_eq!(got.created_at, t0);
    // Create of a taken name leaves it alone.
    assert!(!store
        .write_secret(&sealed("t", "API", 2, t0), PutMode::Create)
        .unwrap());
    assert_eq!(
        store.secret("t", "API").unwrap().unwrap().nonce,
        vec![1; 24]
    );
    // Upsert and update count versions; metadata is replaced only when given; the creation
    // time stays.
    let t1 = t0 + Duration::seconds(1);
    let mut with_meta = sealed("t", "API", 3, t1);
    with_meta.metadata = Some(BTreeMap::from([("owner".to_string(), "ops".to_string())]));
    assert!(store.write_secret(&with_meta, PutMode::Upsert).unwrap());
    assert!(store
        .write_secret(&sealed("t", "API", 4, t1), PutMode::Update)
        .unwrap());
    let got = store.secret("t", "API").unwrap().unwrap();
    assert_eq!(got.version, 3);
    assert_eq!(got.nonce, vec![4; 24]);
    assert_eq!(got.created_at, t0);
    assert_eq!(got.updated_at, t1);
    assert_eq!(got.metadata.unwrap()["owner"], "ops");

    store.put_secret(&sealed("t", "B", 5, t0)).unwrap();
    store.put_secret(&sealed("u", "A", 6, t0)).unwrap();
    // Another team's secret is not this team's.
    assert_eq!(store.secret("u", "API").unwrap(), None);
    let names = |team| {
        store
            .secrets(team)
            .unwrap()
            .into_iter()
            .map(|r| format!("{}/{}", r.team, r.name))
            .collect::<Vec<_>>()
    };
    assert_eq!(names(Some("t")), ["t/API", "t/B"]);
    assert_eq!(names(None), ["t/API", "t/B", "u/A"]);

    // Rotation re-seals every row at once.
    let mut rows = store.secrets(None).unwrap();
    for r in &mut rows {
        r.key_id = "k2".into();
        r.nonce = vec![9; 24];
    }
    store.reseal_secrets(&rows).unwrap();
    assert!(store
        .secrets(None)
        .unwrap()
        .iter()
        .all(|r| r.key_id == "k2" && r.nonce == vec![9; 24]));
    // A nonce of the wrong length is refused by the schema and changes nothing.
    let mut bad = sealed("t", "BAD", 1, t0);
    bad.nonce = vec![0; 3];
    assert!(store.put_secret(&bad).is_err());
    assert_eq!(store.secret("t", "BAD").unwrap(), None);

    assert!(store.delete_secret("t", "B").unwrap());
    assert!(!store.delete_secret("t", "B").unwrap());

    for i in 0..3 {
        store
            .record_secret_use(&SecretUse {
                at: t0 + Duration::seconds(i),
                team: "t".into(),
                secret: "API".into(),
                sandbox: format!("sb{i}"),
                command: "python3".into(),
            })
            .unwrap();
    }
    let uses = store.secret_uses("t", 2).unwrap();
    assert_eq!(
        uses.iter().map(|u| u.sandbox.as_str()).collect::<Vec<_>>(),
        ["sb2", "sb1"]
    );
    assert_eq!(uses[0].at, t0 + Duration::seconds(2));
    assert!(store.secret_uses("u", 10).unwrap().is_empty());
}

fn template(name: &str, digest: &str, at: OffsetDateTime) -> TemplateRecord {
    TemplateRecord {
        name: name.into(),
        digest: digest.into(),
        image: PathBuf::from(format!("/var/lib/husk/images/{digest}.erofs")),
        size: 4096,
        manifest: Default::default(),
        created_at: at,
    }
}

fn templates_register_replace_and_delete(fx: &Fixture) {
    let store = fx.open();
    let t0 = OffsetDateTime::now_utc();
    assert_eq!(
        store
            .put_template(&template("py", "sha256:aa", t0))
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .put_template(&template("base", "sha256:bb", t0))
            .unwrap(),
        None
    );
    // Replacing returns what it replaced.
    let replaced = store
        .put_template(&template("py", "sha256:cc", t0 + Duration::seconds(1)))
        .unwrap()
        .expect("replaced");
    assert_eq!(replaced, template("py", "sha256:aa", t0));
    assert_eq!(store.template("py").unwrap().unwrap().digest, "sha256:cc");
    assert_eq!(
        store
            .templates()
            .unwrap()
            .iter()
            .map(|t| t.name.as_str())
            .collect::<Vec<_>>(),
        ["base", "py"]
    );
    assert!(store.image_in_use("sha256:cc").unwrap());
    assert!(!store.image_in_use("sha256:aa").unwrap());
    // A snapshot's image stays in use while the snapshot is recorded.
    store
        .put_snapshots(&[SnapshotRow {
            id: "snap1".into(),
            team: "t".into(),
            name: None,
            state: "live".into(),
            digest: Some("sha256:aa".into()),
            created_at: t0,
            record: "{}".into(),
        }])
        .unwrap();
    assert!(store.image_in_use("sha256:aa").unwrap());
    assert_eq!(
        store.delete_template("base").unwrap(),
        Some(template("base", "sha256:bb", t0))
    );
    assert_eq!(store.delete_template("base").unwrap(), None);
    assert!(!store.image_in_use("sha256:bb").unwrap());
    assert_eq!(store.template("base").unwrap(), None);
}

fn volumes_are_named_once_per_team(fx: &Fixture) {
    let store = fx.open();
    let t0 = OffsetDateTime::now_utc();
    let vol = |id: &str, team: &str, name: &str| VolumeRecord {
        id: id.into(),
        team: team.into(),
        name: name.into(),
        created_at: t0,
    };
    assert_eq!(
        store.ensure_volume(&vol("v1", "t", "data")).unwrap(),
        vol("v1", "t", "data")
    );
    // The same name again keeps the first id.
    assert_eq!(
        store.ensure_volume(&vol("v2", "t", "data")).unwrap(),
        vol("v1", "t", "data")
    );
    // Another team may use the name.
    assert_eq!(
        store.ensure_volume(&vol("v3", "u", "data")).unwrap(),
        vol("v3", "u", "data")
    );
    store.ensure_volume(&vol("v4", "t", "cache")).unwrap();
    assert_eq!(store.volume("v3").unwrap(), Some(vol("v3", "u", "data")));
    assert_eq!(store.volume("v2").unwrap(), None);
    assert_eq!(
        store
            .volumes("t")
            .unwrap()
            .iter()
            .map(|v| v.id.as_str())
            .collect::<Vec<_>>(),
        ["v4", "v1"]
    );
    assert!(store.delete_volume("t", "data").unwrap());
    assert!(!store.delete_volume("t", "data").unwrap());
    assert_eq!(store.volume("v1").unwrap(), None);
    assert_eq!(store.volume("v3").unwrap(), Some(vol("v3", "u", "data")));
}

fn saved_sandboxes_and_snapshots_round_trip(fx: &Fixture) {
    let store = fx.open();
    let t0 = OffsetDateTime::now_utc();
    let saved = |id: &str, at: i64, d: &str| SavedSandboxRecord {
        id: id.into(),
        team: "t".into(),
        saved_at: t0 + Duration::seconds(at),
        description: d.into(),
    };
    store
        .put_saved_sandbox(&saved("b", 2, "{\"v\":1}"))
        .unwrap();
    store
        .put_saved_sandbox(&saved("a", 1, "{\"v\":1}"))
        .unwrap();
    store
        .put_saved_sandbox(&saved("b", 3, "{\"v\":2}"))
        .unwrap();
    assert_eq!(
        store.saved_sandboxes().unwrap(),
        [saved("a", 1, "{\"v\":1}"), saved("b", 3, "{\"v\":2}")]
    );
    assert!(store.delete_saved_sandbox("a").unwrap());
    assert!(!store.delete_saved_sandbox("a").unwrap());
    assert_eq!(store.saved_sandboxes().unwrap().len(), 1);

    let snap = |id: &str, name: Option<&str>, state: &str, at: i64| SnapshotRow {
        id: id.into(),
        team: "t".into(),
        name: name.map(str::to_owned),
        state: state.into(),
        digest: None,
        created_at: t0 + Duration::seconds(at),
        record: format!("{{\"id\":\"{id}\"}}"),
    };
    store
        .put_snapshots(&[snap("s1", Some("t/app"), "live", 1)])
        .unwrap();
    // A live name is the team's once: a second live snapshot of that name is refused, and
    // the whole call with it (all or none).
    assert!(store
        .put_snapshots(&[
            snap("s0", None, "live", 0),
            snap("s2", Some("t/app"), "live", 2)
        ])
        .is_err());
    assert_eq!(
        store.snapshots().unwrap(),
        [snap("s1", Some("t/app"), "live", 1)]
    );
    // Retiring the old one and recording the new one under its name is one change.
    store
        .put_snapshots(&[
            snap("s1", Some("t/app"), "retired", 1),
            snap("s2", Some("t/app"), "live", 2),
        ])
        .unwrap();
    assert_eq!(
        store.snapshots().unwrap(),
        [
            snap("s1", Some("t/app"), "retired", 1),
            snap("s2", Some("t/app"), "live", 2)
        ]
    );
    assert!(store.delete_snapshot("s1").unwrap());
    assert!(!store.delete_snapshot("s1").unwrap());
    assert_eq!(store.snapshots().unwrap().len(), 1);
}
