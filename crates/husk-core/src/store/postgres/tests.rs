//! What only the PostgreSQL store does: nodes sharing one database, migrations by several
//! processes at once, and a database that is unreachable or restarts. The behaviour both
//! backends share is tested on both in `store/contract_tests.rs`.

use time::OffsetDateTime;

use super::super::contract_tests::record;
use super::super::test_postgres::TestPostgres;
use super::super::*;
use super::{schema, validate_node, Postgres};

fn open(url: &str, node: &str) -> Store {
    Store::open_postgres(url, node, None).expect("open PostgreSQL")
}

#[test]
fn nodes_share_the_cluster_rows_and_list_only_their_own() {
    let url = TestPostgres::shared().fresh_database();
    let a = open(&url, "node-a");
    let b = open(&url, "node-b");
    let now = OffsetDateTime::now_utc();

    // Keys, quotas, templates and volumes are the cluster's.
    let (_, secret) = a.create_key("acme", false, None).unwrap();
    assert_eq!(b.authenticate(&secret).unwrap().team, "acme");
    b.set_team_quota("acme", Some(3)).unwrap();
    assert_eq!(a.team_quota("acme").unwrap(), Some(3));

    // Live sandboxes are listed by the node that runs them; ids are unique across nodes.
    a.insert_sandbox(&record("sa", now)).unwrap();
    b.insert_sandbox(&record("sb", now)).unwrap();
    assert_eq!(a.list_sandboxes().unwrap(), [record("sa", now)]);
    assert_eq!(b.list_sandboxes().unwrap(), [record("sb", now)]);
    assert!(matches!(
        b.insert_sandbox(&record("sa", now)),
        Err(StoreError::SandboxExists(id)) if id == "sa"
    ));
    // What one node lost, any node can tell the team.
    assert!(a.mark_sandbox_lost("sa", "node-a stopped", now).unwrap());
    let lost = b.lost_sandboxes(Some("acme"), Some("sa")).unwrap();
    assert_eq!(lost.len(), 1);
    assert_eq!(lost[0].reason, "node-a stopped");

    // Saved sandboxes, snapshots and unfinished runs are taken up by their own node only.
    a.put_saved_sandbox(&SavedSandboxRecord {
        id: "saved-a".into(),
        team: "acme".into(),
        saved_at: now,
        description: "{}".into(),
    })
    .unwrap();
    a.put_snapshots(&[SnapshotRow {
        id: "snap-a".into(),
        team: "acme".into(),
        name: Some("acme/app".into()),
        state: "live".into(),
        digest: None,
        created_at: now,
        record: "{}".into(),
    }])
    .unwrap();
    a.put_run_record(&RunRow {
        table: RunTable::Runs,
        id: "run-a",
        team: "acme",
        batch: None,
        created_at: now,
        ended_at: None,
        record: "{}",
    })
    .unwrap();
    assert_eq!(a.saved_sandboxes().unwrap().len(), 1);
    assert!(b.saved_sandboxes().unwrap().is_empty());
    assert_eq!(a.snapshots().unwrap().len(), 1);
    assert!(b.snapshots().unwrap().is_empty());
    assert_eq!(a.unfinished_runs().unwrap().len(), 1);
    assert!(b.unfinished_runs().unwrap().is_empty());
    // ... but a team's run record reads the same from any node.
    assert!(b
        .run_record(RunTable::Runs, "acme", "run-a")
        .unwrap()
        .is_some());
    // A snapshot's name is the team's across the cluster.
    assert!(b
        .put_snapshots(&[SnapshotRow {
            id: "snap-b".into(),
            team: "acme".into(),
            name: Some("acme/app".into()),
            state: "live".into(),
            digest: None,
            created_at: now,
            record: "{}".into(),
        }])
        .is_err());
}

#[test]
fn concurrent_first_opens_migrate_once() {
    let pg = TestPostgres::shared();
    let url = pg.fresh_database();
    std::thread::scope(|s| {
        for i in 0..6 {
            let url = &url;
            s.spawn(move || {
                let store = open(url, &format!("node-{i}"));
                store.create_key("t", false, None).expect("create");
            });
        }
    });
    assert_eq!(
        pg.psql(&url, "SELECT count(*) FROM husk_schema_history"),
        schema::SCHEMA_VERSION.to_string()
    );
    assert_eq!(open(&url, "node-0").list_keys().unwrap().len(), 6);
}

#[test]
fn a_database_from_a_newer_husk_is_refused() {
    let pg = TestPostgres::shared();
    let url = pg.fresh_database();
    drop(open(&url, "node-a"));
    let next = schema::SCHEMA_VERSION + 1;
    pg.psql(
        &url,
        &format!(
            "INSERT INTO husk_schema_history (version, name, applied_on, checksum)
             VALUES ({next}, 'future', '', '0')"
        ),
    );
    match Postgres::open(&url, "node-a", None) {
        Err(StoreError::SchemaTooNew { found, supported }) => {
            assert_eq!((found, supported), (next, schema::SCHEMA_VERSION));
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
}

#[test]
fn an_unreachable_database_is_unavailable() {
    // A loopback port nothing listens on: bound, then closed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://husk@127.0.0.1:{port}/husk");
    match Postgres::open(&url, "node-a", None) {
        Err(e) => assert!(e.is_unavailable(), "{e:?}"),
        Ok(_) => panic!("opened a database nothing serves"),
    }
}

/// The database stops under a running store: calls fail as unavailable (never hang, never
/// lose data), and once it is back the same store works again with everything kept.
#[test]
fn a_restarted_database_loses_nothing() {
    let pg = TestPostgres::start();
    let url = pg.fresh_database();
    let store = open(&url, "node-a");
    let (_, secret) = store.create_key("acme", false, None).unwrap();
    store
        .insert_sandbox(&record("kept", OffsetDateTime::now_utc()))
        .unwrap();

    pg.stop();
    let err = store.create_key("acme", false, None).unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    // Authentication fails closed while the database is away.
    assert_eq!(store.authenticate(&secret), None);

    pg.restart();
    assert_eq!(store.authenticate(&secret).unwrap().team, "acme");
    assert_eq!(store.list_sandboxes().unwrap().len(), 1);
    store.create_key("acme", false, None).unwrap();
    assert_eq!(store.list_keys().unwrap().len(), 2);
}

#[test]
fn bad_urls_and_node_names_are_refused() {
    for url in ["postgres://husk@127.0.0.1:notaport/husk", "mysql://x"] {
        assert!(
            matches!(
                Postgres::open(url, "node-a", None),
                Err(StoreError::BadUrl(_))
            ),
            "{url}"
        );
    }
    let long = "a".repeat(64);
    for node in ["", "Node", "-a", "a_b", "a b", "ä", long.as_str()] {
        assert!(
            matches!(validate_node(node), Err(StoreError::InvalidNode(_))),
            "{node:?}"
        );
    }
    for node in ["a", "node-1", "ip-10-0-0-1.ec2.internal", &"a".repeat(63)] {
        validate_node(node).expect(node);
    }
}

/// The synchronous client cannot block on a runtime's thread; the store moves such calls
/// (and the closing of its connections) to a thread of their own, so that async code can use
/// it as it uses SQLite (`husk template build` does).
#[test]
fn usable_and_droppable_inside_async_runtimes() {
    let url = TestPostgres::shared().fresh_database();
    for multi_thread in [false, true] {
        let runtime = if multi_thread {
            tokio::runtime::Builder::new_multi_thread().build()
        } else {
            tokio::runtime::Builder::new_current_thread().build()
        }
        .unwrap();
        runtime.block_on(async {
            let store = open(&url, "node-a");
            let (_, secret) = store.create_key("acme", false, None).unwrap();
            assert_eq!(store.authenticate(&secret).unwrap().team, "acme");
            drop(store);
        });
    }
    assert_eq!(open(&url, "node-a").list_keys().unwrap().len(), 2);
}

/// A CA and a certificate it signs for `hosts`: (CA PEM, certificate PEM, key PEM).
fn certificates(hosts: &[&str]) -> (String, String, String) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().unwrap();
    let params =
        CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca.pem(), cert.pem(), key.serialize_pem())
}

/// `sslmode=require` encrypts and verifies: with the database's CA the store works over TLS
/// (PostgreSQL says so of the session); with another CA, or a certificate for another name,
/// it refuses to connect; a CA without `sslmode=require` is a mistake said at once.
#[test]
fn tls_is_verified_when_required() {
    let pg = TestPostgres::start();
    let (ca, cert, key) = certificates(&["127.0.0.1"]);
    pg.enable_tls(&cert, &key);
    let url = format!("{}?sslmode=require", pg.fresh_database());
    let dir = super::super::tests::TempDir::new();
    let ca_path = dir.state().with_extension("ca.pem");
    std::fs::write(&ca_path, &ca).unwrap();

    let store = Store::open_postgres(&url, "node-a", Some(&ca_path)).expect("TLS with the CA");
    store.create_key("acme", false, None).unwrap();
    // Seen from the server: every session of the store's is encrypted.
    let db = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    assert_eq!(
        pg.psql(
            &pg.url("postgres"),
            &format!(
                "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                 WHERE a.datname = '{db}' AND a.application_name = 'husk'"
            )
        ),
        "t"
    );
    drop(store);

    // Another CA: the certificate cannot be verified.
    let (other_ca, _, _) = certificates(&["127.0.0.1"]);
    std::fs::write(&ca_path, &other_ca).unwrap();
    let err = Postgres::open(&url, "node-a", Some(&ca_path)).unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(format!("{err}").contains("certificate"), "{err}");

    // The right CA, a certificate for another name.
    let (ca2, cert2, key2) = certificates(&["db.example"]);
    pg.enable_tls(&cert2, &key2);
    std::fs::write(&ca_path, &ca2).unwrap();
    let err = Postgres::open(&url, "node-a", Some(&ca_path)).unwrap_err();
    assert!(format!("{err}").contains("certificate"), "{err}");

    // A CA given for a plain connection, and a CA file that is none.
    let plain = url.trim_end_matches("?sslmode=require");
    assert!(matches!(
        Postgres::open(plain, "node-a", Some(&ca_path)),
        Err(StoreError::Tls(_))
    ));
    std::fs::write(&ca_path, "not a certificate").unwrap();
    assert!(matches!(
        Postgres::open(&url, "node-a", Some(&ca_path)),
        Err(StoreError::Tls(_))
    ));
}
