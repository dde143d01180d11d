//! Store tests on real SQLite files in a temporary directory.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use time::OffsetDateTime;

use super::*;

/// A fresh directory under the system temp dir, removed on drop (also when a test fails).
pub(super) struct TempDir(PathBuf);

impl TempDir {
    pub(super) fn new() -> TempDir {
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
    pub(super) fn state(&self) -> PathBuf {
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
        assert!(store.check_key(&secret).unwrap().is_some());
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
fn in_memory_store_works() {
    let store = Sqlite::open_in_memory().expect("memory");
    assert_eq!(store.path(), None);
    let (_, secret) = store.create_key("t", false, None).expect("create");
    assert!(store.check_key(&secret).unwrap().is_some());
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
    assert_eq!(store.check_key(&key).unwrap().unwrap().team, "t");
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
