//! The cluster's membership and quota claims, on a real PostgreSQL (`store/cluster.rs`).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use super::super::cluster::{NodeLoad, NodeState};
use super::super::contract_tests::record;
use super::super::test_postgres::TestPostgres;
use super::super::*;

fn open(url: &str, node: &str) -> Store {
    Store::open_postgres(url, node, None).expect("open PostgreSQL")
}

fn node<'a>(
    store: &Store,
    name: &str,
    rows: &'a mut Vec<cluster::NodeRow>,
) -> &'a cluster::NodeRow {
    *rows = store.nodes().expect("nodes");
    rows.iter()
        .find(|n| n.name == name)
        .expect("the node is listed")
}

#[test]
fn a_node_keeps_its_code_and_reports_its_load() {
    let url = TestPostgres::shared().fresh_database();
    let (a, b) = (open(&url, "node-a"), open(&url, "node-b"));
    let code = a.register_node("http://10.0.0.1:3000", 50).unwrap();
    assert_eq!(code.len(), cluster::NODE_CODE_LEN);
    assert!(
        code.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()),
        "{code}"
    );
    // Registering again (a restart, a new address) keeps the code its sandboxes' ids carry.
    assert_eq!(a.register_node("http://10.0.0.9:3000", 60).unwrap(), code);
    let other = b.register_node("http://10.0.0.2:3000", 50).unwrap();
    assert_ne!(other, code);

    let load = NodeLoad {
        live: 7,
        templates: vec!["sha256:aa".into(), "sha256:bb".into()],
    };
    let beat = a.node_heartbeat(&load).unwrap().expect("registered");
    assert_eq!(beat.state, NodeState::Ready);
    assert!(!beat.was_lost);
    let mut rows = Vec::new();
    let row = node(&b, "node-a", &mut rows);
    assert_eq!(row.code, code);
    assert_eq!(row.url, "http://10.0.0.9:3000");
    assert_eq!(row.capacity, 60);
    assert_eq!(row.load, load);
    assert!(
        row.silent_for < Duration::from_secs(5),
        "{:?}",
        row.silent_for
    );

    // Draining takes it out of placement; registering (the next start) makes it ready.
    assert!(a.set_node_state(NodeState::Draining).unwrap());
    assert_eq!(node(&b, "node-a", &mut rows).state, NodeState::Draining);
    a.register_node("http://10.0.0.9:3000", 60).unwrap();
    assert_eq!(node(&b, "node-a", &mut rows).state, NodeState::Ready);

    // A node nobody registered has no heartbeat; bad URLs are refused.
    let c = open(&url, "node-c");
    assert_eq!(c.node_heartbeat(&NodeLoad::default()).unwrap(), None);
    for bad in ["10.0.0.1:3000", "http://a b", "ftp://x", "http://x\n"] {
        assert!(c.register_node(bad, 1).is_err(), "{bad:?}");
    }
}

#[test]
fn an_operators_drain_holds_through_restarts_and_a_stops_does_not() {
    let url = TestPostgres::shared().fresh_database();
    let a = open(&url, "node-a");
    let state = |rows: &mut Vec<cluster::NodeRow>| {
        let n = node(&a, "node-a", rows);
        (n.state, n.held)
    };
    let mut rows = Vec::new();
    a.register_node("http://10.0.0.1:3000", 5).unwrap();
    // The node's own drain at a stop: ready again at its next start.
    a.set_node_state(NodeState::Draining).unwrap();
    a.register_node("http://10.0.0.1:3000", 5).unwrap();
    assert_eq!(state(&mut rows), (NodeState::Ready, false));
    // An operator's: held through restarts, and through a return from lost.
    assert!(a.hold_node(true).unwrap());
    assert_eq!(state(&mut rows), (NodeState::Draining, true));
    a.register_node("http://10.0.0.2:3000", 5).unwrap();
    assert_eq!(state(&mut rows), (NodeState::Draining, true));
    let load = NodeLoad::default();
    a.node_heartbeat(&load).unwrap();
    assert_eq!(state(&mut rows), (NodeState::Draining, true));
    let raw = super::Postgres::open(&url, "sweeper", None).unwrap();
    raw.conn()
        .unwrap()
        .execute("UPDATE nodes SET state = 'lost' WHERE name = 'node-a'", &[])
        .unwrap();
    // Lost: an operator's word does not bring it back, its heartbeat does (held still).
    assert!(a.hold_node(false).unwrap());
    assert_eq!(state(&mut rows), (NodeState::Lost, false));
    assert!(a.hold_node(true).unwrap());
    let hb = a.node_heartbeat(&load).unwrap().unwrap();
    assert!(hb.was_lost);
    assert_eq!(state(&mut rows), (NodeState::Draining, true));
    // Ready again when the operator says so, and after restarts.
    assert!(a.hold_node(false).unwrap());
    a.register_node("http://10.0.0.2:3000", 5).unwrap();
    assert_eq!(state(&mut rows), (NodeState::Ready, false));
    // A name never registered: nothing to hold.
    assert!(!open(&url, "node-z").hold_node(true).unwrap());
}

#[test]
fn the_sqlite_file_is_not_a_cluster() {
    let store = Store::open_in_memory().unwrap();
    assert!(matches!(
        store.register_node("http://127.0.0.1:1", 1),
        Err(StoreError::NotClustered)
    ));
    assert!(matches!(store.nodes(), Err(StoreError::NotClustered)));
    assert!(matches!(
        store.claim_quota("acme", 1, Duration::from_secs(1)),
        Err(StoreError::NotClustered)
    ));
}

#[test]
fn a_quota_counts_every_nodes_sandboxes_and_the_creates_under_way() {
    let url = TestPostgres::shared().fresh_database();
    let (a, b) = (open(&url, "node-a"), open(&url, "node-b"));
    let now = OffsetDateTime::now_utc();
    let ttl = Duration::from_secs(60);
    a.insert_sandbox(&record("sa", now)).unwrap();
    b.insert_sandbox(&record("sb", now)).unwrap();
    // Two running on two nodes, quota 3: one place left.
    let claim = a.claim_quota("acme", 3, ttl).unwrap().0.expect("a place");
    assert_eq!(b.claim_quota("acme", 3, ttl).unwrap().0, None);
    // Other teams are not counted.
    assert!(b.claim_quota("other", 1, ttl).unwrap().0.is_some());
    // A create that ends gives its place back; a lost sandbox no longer counts.
    a.release_quota(claim).unwrap();
    let again = b
        .claim_quota("acme", 3, ttl)
        .unwrap()
        .0
        .expect("given back");
    b.release_quota(again).unwrap();
    a.mark_sandbox_lost("sa", "gone", now).unwrap();
    let first = a.claim_quota("acme", 3, ttl).unwrap().0.expect("one");
    let second = a.claim_quota("acme", 3, ttl).unwrap().0.expect("two");
    assert_eq!(a.claim_quota("acme", 3, ttl).unwrap().0, None);
    a.release_quota(first).unwrap();
    a.release_quota(second).unwrap();
    // The team's own quota, when it has one, over the default.
    b.set_team_quota("acme", Some(1)).unwrap();
    assert_eq!(a.claim_quota("acme", 100, ttl).unwrap(), (None, 1));
    b.set_team_quota("acme", None).unwrap();
    // A place whose gateway died is free again once it expires.
    let short = Duration::from_millis(100);
    a.claim_quota("acme", 2, short).unwrap().0.expect("a place");
    assert_eq!(a.claim_quota("acme", 2, ttl).unwrap().0, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(c) = a.claim_quota("acme", 2, ttl).unwrap().0 {
            a.release_quota(c).unwrap();
            break;
        }
        assert!(
            Instant::now() < deadline,
            "an expired place was never freed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_creates_key_check_and_claim_are_one_statement_that_claims_only_for_a_valid_key() {
    let url = TestPostgres::shared().fresh_database();
    let gw = open(&url, "gateway");
    let ttl = Duration::from_secs(60);
    let (info, key) = gw.create_key("acme", false, None).unwrap();
    let (_, revoked) = gw.create_key("acme", true, None).unwrap();
    gw.revoke_key(&revoked).unwrap();
    let raw = super::Postgres::open(&url, "counter", None).unwrap();
    let claims = |_: &Store| -> i64 {
        raw.conn()
            .unwrap()
            .query_one("SELECT count(*) FROM quota_claims", &[])
            .unwrap()
            .get(0)
    };
    // A valid key: its caller and a place.
    let (who, claimed) = gw
        .check_key_and_claim(&key, 2, ttl)
        .unwrap()
        .expect("valid");
    assert_eq!(
        (who.team.as_str(), who.key_id.as_str(), who.admin),
        ("acme", info.id.as_str(), false)
    );
    assert_eq!(claimed.quota, 2);
    let first = claimed.claim.expect("a place");
    // The key's use is recorded as `check_key` records it.
    assert!(gw
        .list_keys()
        .unwrap()
        .iter()
        .any(|k| k.id == info.id && k.last_used_at.is_some()));
    // Unknown, malformed, revoked: nobody, and nothing claimed.
    for bad in [revoked.as_str(), "husk_nope", "", &format!("{key}x")] {
        assert!(
            gw.check_key_and_claim(bad, 2, ttl).unwrap().is_none(),
            "{bad:?}"
        );
    }
    assert_eq!(claims(&gw), 1);
    // The quota holds as for `claim_quota`: one more place, then none.
    let second = gw.check_key_and_claim(&key, 2, ttl).unwrap().unwrap().1;
    assert!(second.claim.is_some());
    let full = gw.check_key_and_claim(&key, 2, ttl).unwrap().unwrap().1;
    assert_eq!(
        full,
        cluster::Claimed {
            claim: None,
            quota: 2
        }
    );
    gw.release_quota(first).unwrap();
    gw.release_quota(second.claim.unwrap()).unwrap();
    assert_eq!(claims(&gw), 0);
    // Not a cluster's database: refused.
    let file = Store::open_in_memory().unwrap();
    assert!(matches!(
        file.check_key_and_claim(&key, 2, ttl),
        Err(StoreError::NotClustered)
    ));
}

#[test]
fn concurrent_claims_never_exceed_the_quota() {
    let url = TestPostgres::shared().fresh_database();
    let stores: Vec<Arc<Store>> = (0..4)
        .map(|i| Arc::new(open(&url, &format!("gw-{i}"))))
        .collect();
    let threads = 12;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                store
                    .claim_quota("acme", 5, Duration::from_secs(60))
                    .expect("claim")
                    .0
            })
        })
        .collect();
    let granted = handles
        .into_iter()
        .filter_map(|h| h.join().expect("thread"))
        .count();
    assert_eq!(granted, 5);
}

#[test]
fn claims_and_releases_commit_without_a_flush_and_only_their_own_transaction() {
    let url = TestPostgres::shared().fresh_database();
    // Opening a store migrates the database.
    drop(open(&url, "gw"));
    let mut client = ::postgres::Client::connect(&url, ::postgres::NoTls).expect("connect");
    // The test server runs without flushes; a production one's sessions wait for them.
    client.batch_execute("SET synchronous_commit = on").unwrap();
    let setting = |c: &mut ::postgres::Transaction<'_>| -> String {
        c.query_one("SHOW synchronous_commit", &[]).unwrap().get(0)
    };
    let mut tx = client.transaction().unwrap();
    assert_eq!(setting(&mut tx), "on");
    let claim: i64 = tx
        .query_one(
            "SELECT claim FROM husk_claim_quota('acme', 5, 60000000000)",
            &[],
        )
        .unwrap()
        .get(0);
    // The claim's transaction does not wait for the disk...
    assert_eq!(setting(&mut tx), "off");
    tx.commit().unwrap();
    // ...and the next (a sandbox's row, on a node's connection) does.
    let mut tx = client.transaction().unwrap();
    assert_eq!(setting(&mut tx), "on");
    tx.execute("SELECT husk_release_quota($1)", &[&claim])
        .unwrap();
    assert_eq!(setting(&mut tx), "off");
    tx.commit().unwrap();
    let left: i64 = client
        .query_one("SELECT count(*) FROM quota_claims", &[])
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    let session: String = client
        .query_one("SHOW synchronous_commit", &[])
        .unwrap()
        .get(0);
    assert_eq!(session, "on");
}

#[test]
fn claims_read_the_teams_rows_by_plain_index_scans_however_many_dead_rows_there_are() {
    let url = TestPostgres::shared().fresh_database();
    let store = open(&url, "gw");
    // A minute of creates' worth of dead claims, and no vacuum since (a new database, or
    // autovacuum not yet round): what makes the planner pick bitmap scans.
    for _ in 0..3000 {
        let (claim, _) = store
            .claim_quota("acme", 100, Duration::from_secs(60))
            .unwrap();
        store.release_quota(claim.expect("a place")).unwrap();
    }
    // The plans of a claim and a release on a new connection, sent to it as notices.
    let plans = Arc::new(std::sync::Mutex::new(String::new()));
    let mut config: ::postgres::Config = url.parse().unwrap();
    let seen = plans.clone();
    config.notice_callback(move |n| {
        let mut p = seen.lock().unwrap();
        p.push_str(n.message());
        p.push('\n');
    });
    let mut client = config.connect(::postgres::NoTls).expect("connect");
    client
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on;
             SET auto_explain.log_level = notice;",
        )
        .unwrap();
    let claim: i64 = client
        .query_one(
            "SELECT claim FROM husk_claim_quota('acme', 100, 60000000000)",
            &[],
        )
        .unwrap()
        .get(0);
    client
        .execute("SELECT husk_release_quota($1)", &[&claim])
        .unwrap();
    let plans = plans.lock().unwrap().clone();
    assert!(plans.contains("quota_claims"), "{plans}");
    assert!(plans.contains("Index"), "{plans}");
    assert!(!plans.contains("Bitmap"), "{plans}");
}

#[test]
fn a_silent_node_is_declared_lost_with_its_sandboxes_and_comes_back() {
    let url = TestPostgres::shared().fresh_database();
    let (a, b) = (open(&url, "node-a"), open(&url, "node-b"));
    a.register_node("http://10.0.0.1:3000", 10).unwrap();
    b.register_node("http://10.0.0.2:3000", 10).unwrap();
    let now = OffsetDateTime::now_utc();
    a.insert_sandbox(&record("sa1", now)).unwrap();
    a.insert_sandbox(&record("sa2", now)).unwrap();
    b.insert_sandbox(&record("sb", now)).unwrap();

    // node-b beats, node-a is silent: only node-a goes, with its two sandboxes.
    let silent = Duration::from_millis(300);
    let deadline = Instant::now() + Duration::from_secs(10);
    let reaped = loop {
        b.node_heartbeat(&NodeLoad::default()).unwrap();
        let reaped = b.reap_nodes(silent, Duration::from_secs(3600)).unwrap();
        if !reaped.is_empty() {
            break reaped;
        }
        assert!(Instant::now() < deadline, "node-a was never declared lost");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        reaped,
        [cluster::Reaped {
            node: "node-a".into(),
            sandboxes: 2
        }]
    );
    let lost = b.lost_sandboxes(Some("acme"), None).unwrap();
    let mut ids: Vec<_> = lost.iter().map(|l| l.record.id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["sa1", "sa2"]);
    assert!(lost.iter().all(|l| l.reason.contains("node-a")), "{lost:?}");
    // Their places in the quota are free: only node-b's sandbox counts.
    let claim = b.claim_quota("acme", 2, Duration::from_secs(60)).unwrap().0;
    assert!(claim.is_some());
    let mut rows = Vec::new();
    assert_eq!(node(&b, "node-a", &mut rows).state, NodeState::Lost);
    // Swept once: a second sweep finds nothing more.
    assert!(b.reap_nodes(silent, silent).unwrap().is_empty());

    // node-a beats again: it learns it was lost (to end what it still runs), and is ready.
    let beat = a
        .node_heartbeat(&NodeLoad::default())
        .unwrap()
        .expect("registered");
    assert!(beat.was_lost);
    assert_eq!(beat.state, NodeState::Ready);
    let beat = a
        .node_heartbeat(&NodeLoad::default())
        .unwrap()
        .expect("registered");
    assert!(!beat.was_lost);
}
