//! The embedded SQLite store: teams and their quotas, API keys, and the record of live sandboxes.
//!
//! **One file, shared by processes.** The database is `husk.db` in the state directory
//! ([`DEFAULT_STATE_DIR`]). `husk key …` (the CLI) and a running `husk serve` open it at the same
//! time, so it runs in WAL mode (readers never block the writer) with a 5 s busy timeout (a
//! writer waits for the other process instead of failing), and every write that reads first
//! takes the write lock up front (`BEGIN IMMEDIATE`). Nothing is cached in memory: a key revoked
//! by the CLI stops working on the server's very next request.
//!
//! **Synchronous by design.** Every method is one or a few indexed statements on a local file,
//! so the server calls them straight from async code; a `Mutex` around the one connection makes
//! the [`Store`] `Send + Sync` and serialises statements within a process.
//!
//! **Timestamps** are [`OffsetDateTime`] in UTC in the API and Unix time in **nanoseconds**
//! (`INTEGER`) in the database: exact round trips, cheap comparisons and sorting, and readable
//! with `datetime(created_at / 1e9, 'unixepoch')` from the `sqlite3` shell. The range is the
//! years 1677–2262; a time outside it is refused with [`StoreError::TimeOutOfRange`].
//!
//! **Schema versions** are counted in `PRAGMA user_version` and applied by [`Store::open`]
//! (see `store/schema.rs`). A database written by a newer husk is refused rather than guessed at.

mod backend;
pub mod cluster;
mod keys;
pub mod postgres;
pub mod remote;
mod runs;
mod sandboxes;
mod schema;
mod secrets;
mod templates;
mod volumes;
pub use backend::{Store, StoreLocation};
/// Why the state helper could not be asked (in [`StoreError::Helper`]).
pub use husk_runtime::helper::HelperError;
pub use runs::{RunRow, RunTable};
pub use secrets::{PutMode, SealedRow, SecretUse};
pub use volumes::VolumeRecord;
#[cfg(test)]
mod contract_tests;
/// A private PostgreSQL for tests (other crates' too, with the `test-support` feature).
#[cfg(any(test, feature = "test-support"))]
pub mod test_postgres;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::fs::{DirBuilder, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rusqlite::Connection;
/// The store's duration type, re-exported likewise.
pub use time::Duration as TimeDuration;
/// The store's timestamp type, re-exported so that its users (the CLI) can name it without a
/// dependency of their own on `time`.
pub use time::OffsetDateTime;

/// Where husk keeps its persistent state (the database) unless told otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/husk";

/// The database's file name inside the state directory.
pub const DB_FILE: &str = "husk.db";

/// How long a statement waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Longest team name; short enough for logs, cgroup names and URLs.
pub const MAX_TEAM_LEN: usize = 64;

/// Longest key label, in characters; labels are for people reading `husk key list`.
pub const MAX_LABEL_LEN: usize = 128;

/// Everything the store can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Creating the state directory or the database file failed.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// SQLite failed (including a lock still held by another process after the busy timeout).
    #[error("database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database was written by a newer husk; opening it could misread or damage it.
    #[error("the database has schema version {found}, newer than this husk understands ({supported}); upgrade husk")]
    SchemaTooNew { found: i64, supported: i64 },
    /// A team name is not 1–64 characters of `[a-z0-9_-]`.
    #[error("invalid team name {0:?}: use 1-64 characters of a-z, 0-9, '-' and '_'")]
    InvalidTeam(String),
    /// A key label is too long or holds control characters (it is printed to terminals).
    #[error("invalid key label: at most 128 characters, no control characters")]
    InvalidLabel,
    /// A sandbox with this id is already recorded.
    #[error("sandbox {0:?} is already recorded")]
    SandboxExists(String),
    /// A timestamp does not fit the database's representation (nanoseconds since 1970 in an i64).
    #[error("timestamp outside the years 1677-2262")]
    TimeOutOfRange,
    /// A new key could not be drawn from the random number generator.
    #[error("cannot make a key: {0}")]
    Key(#[from] crate::keys::KeyError),
    /// Every freshly drawn key's id was taken; with 2^32 ids this means something is broken.
    #[error("cannot make a key: no free key id after {0} attempts")]
    NoFreeKeyId(u32),
    /// A stored value cannot be decoded (edited by hand, or a bug).
    #[error("corrupt database: {0}")]
    Corrupt(String),
    /// The state helper failed the request (its database's or its files' error, as it said).
    #[error("state helper: {0}")]
    Remote(String),
    /// The state helper could not be asked: it is gone, or it answered out of protocol.
    #[error(transparent)]
    Helper(#[from] husk_runtime::helper::HelperError),
    /// PostgreSQL refused a statement (a constraint, a type, a bug); see
    /// [`StoreError::Unavailable`] for a database that cannot be reached.
    #[error("database: {0}")]
    Postgres(::postgres::Error),
    /// The database cannot be reached (no connection in time, a connection lost, the server
    /// restarting): a retry may succeed, and nothing was lost.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// The database URL does not parse, or asks for what husk does not do.
    #[error("invalid database URL: {0}")]
    BadUrl(String),
    /// A node name is not 1-63 characters of `[a-z0-9.-]` starting with a letter or digit.
    #[error("invalid node name {0:?}: use 1-63 characters of a-z, 0-9, '-' and '.', starting with a letter or digit")]
    InvalidNode(String),
    /// TLS to the database cannot be set up (a CA file, no CA at all).
    #[error("database TLS: {0}")]
    Tls(String),
    /// A cluster's operation (nodes, quota claims) asked of the SQLite file: a cluster keeps
    /// its state in PostgreSQL.
    #[error("a husk cluster keeps its state in PostgreSQL: give --database-url")]
    NotClustered,
    /// Migrating the PostgreSQL schema failed.
    #[error("database migration: {0}")]
    Migration(String),
}

impl StoreError {
    /// Whether the database (or the state helper holding it) cannot be reached right now: the
    /// request may be retried, and the API answers 503.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            StoreError::Unavailable(_) | StoreError::Helper(HelperError::Gone(_))
        )
    }
}

/// A key as listed: everything but the secret and its hash, which never leave the store.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeyInfo {
    /// The public id: 8 hex digits (see [`crate::keys`]); show it with [`KeyInfo::display_id`].
    pub id: String,
    pub team: String,
    /// Admin keys may manage other teams' keys and quotas through the API.
    pub admin: bool,
    /// A free-form label the operator gave the key.
    pub label: Option<String>,
    pub created_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
    /// When the key last authenticated, to within a minute (updates are throttled).
    pub last_used_at: Option<OffsetDateTime>,
}

impl KeyInfo {
    /// The id as shown to people: `e2b_1a2b3c4d…`.
    pub fn display_id(&self) -> String {
        crate::keys::display_id(&self.id)
    }
}

/// Who a request acts for, once its key is authenticated.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Principal {
    pub team: String,
    /// The public id of the key used (for logs and audit; never the secret).
    pub key_id: String,
    pub admin: bool,
}

/// A built template as registered.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TemplateRecord {
    pub name: String,
    /// `sha256:<hex>` of the image file.
    pub digest: String,
    /// The erofs image file.
    pub image: PathBuf,
    /// Its size in bytes.
    pub size: u64,
    pub manifest: crate::template::TemplateManifest,
    pub created_at: OffsetDateTime,
}

/// A live sandbox as recorded, so that a restarted server knows what a crashed run left behind.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SandboxRecord {
    /// The id clients know the sandbox by.
    pub id: String,
    pub team: String,
    pub template: String,
    /// The runtime's own id for the sandbox (what it needs to find and destroy it).
    pub runtime_id: String,
    pub created_at: OffsetDateTime,
    /// When the sandbox times out.
    pub end_at: OffsetDateTime,
    /// The client's metadata, stored as a JSON object.
    pub metadata: BTreeMap<String, String>,
    /// What a restarted server needs to take the sandbox up again (the core's versioned
    /// JSON, `manager::kept`); `None` in records of older servers.
    pub description: Option<String>,
}

/// A sandbox that ended with the server that ran it: its record, when and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LostSandbox {
    pub record: SandboxRecord,
    pub lost_at: OffsetDateTime,
    pub reason: String,
}

/// A sandbox kept beyond its processes (paused to disk): who it belongs to and the core's
/// description of it (JSON, opaque to the store).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedSandboxRecord {
    pub id: String,
    pub team: String,
    pub saved_at: OffsetDateTime,
    pub description: String,
}

/// A snapshot as the store keeps it: who it belongs to, its name and state, and the core's
/// description of it (JSON, opaque to the store).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SnapshotRow {
    pub id: String,
    pub team: String,
    pub name: Option<String>,
    /// `live` or `retired`.
    pub state: String,
    /// The image of the template it was taken over (`None`: the host template).
    pub digest: Option<String>,
    pub created_at: OffsetDateTime,
    pub record: String,
}

/// The SQLite store: one connection for writes behind a mutex, and a few more for reads (so
/// that one team's large read never holds up another team's request). Cheap calls, no caching.
pub struct Sqlite {
    conn: Mutex<Connection>,
    /// Connections for statements that only read (WAL: they never wait for the writer). Empty
    /// for a database in memory, whose one connection is the database.
    readers: Vec<Mutex<Connection>>,
    /// Which reader the next read waits for when all are busy.
    next_reader: std::sync::atomic::AtomicUsize,
    path: Option<PathBuf>,
}

/// Connections for reads beside the writer's.
const READERS: usize = 4;

impl fmt::Debug for Sqlite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sqlite").field("path", &self.path).finish()
    }
}

impl Sqlite {
    /// Opens (creating if needed) `husk.db` in `state_dir` and brings its schema up to date.
    ///
    /// A missing `state_dir` is created with mode 0700 (and missing parents too), and a new
    /// database file with mode 0600: it holds key hashes and tenants' sandbox metadata, which is
    /// nobody else's business. An existing directory's mode is left as the operator set it.
    pub fn open(state_dir: &Path) -> Result<Sqlite, StoreError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| StoreError::Io {
                path: state_dir.to_owned(),
                source,
            })?;
        let path = state_dir.join(DB_FILE);
        // SQLite would create the file 0644 (less umask); create it first so it is 0600 from
        // the start. Its -wal and -shm files copy the main file's mode.
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|source| StoreError::Io {
                path: path.clone(),
                source,
            })?;
        // Opening can meet SQLITE_BUSY that the busy timeout does not cover: switching a new
        // database to WAL, or another process closing the last connection (it briefly locks the
        // file to clean up the WAL). Both last milliseconds, so try again until the timeout.
        let deadline = Instant::now() + BUSY_TIMEOUT;
        let mut pause = Duration::from_millis(1);
        let conn = loop {
            match Self::connect(&path) {
                Ok(conn) => break conn,
                Err(StoreError::Sqlite(e)) if is_busy(&e) && Instant::now() < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(50));
                }
                Err(e) => return Err(e),
            }
        };
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            readers.push(Mutex::new(Self::connect_reader(&path)?));
        }
        Ok(Sqlite {
            conn: Mutex::new(conn),
            readers,
            next_reader: Default::default(),
            path: Some(path),
        })
    }

    /// A connection for reads of a database the writer's connection has set up (WAL, schema).
    fn connect_reader(path: &Path) -> Result<Connection, StoreError> {
        let conn = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        Ok(conn)
    }

    /// One attempt at opening and setting up the database file.
    fn connect(path: &Path) -> Result<Connection, StoreError> {
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // The journal mode is stored in the file: only the first open of a new database
        // changes it, which needs an exclusive lock; later opens only read it.
        let mode: String = conn.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                // Some file systems (network ones) cannot do WAL. The rollback journal still
                // works with the busy timeout, only with readers and the writer taking turns.
                tracing::warn!(path = %path.display(), %mode, "SQLite WAL mode unavailable");
            }
        }
        Self::configure(&mut conn)?;
        Ok(conn)
    }

    /// A private database in memory, gone when the `Store` is dropped; for tests of code that
    /// needs a store (a server in a unit test), not for production.
    pub fn open_in_memory() -> Result<Sqlite, StoreError> {
        let mut conn = Connection::open_in_memory()?;
        Self::configure(&mut conn)?;
        Ok(Sqlite {
            conn: Mutex::new(conn),
            readers: Vec::new(),
            next_reader: Default::default(),
            path: None,
        })
    }

    /// Settings every connection needs, then the migrations.
    fn configure(conn: &mut Connection) -> Result<(), StoreError> {
        // NORMAL is crash-safe in WAL mode; it may lose the last transactions on power loss,
        // which is acceptable for this data and keeps sandbox bookkeeping off the fsync path.
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        // Off by default in SQLite, per connection; the schema relies on it (keys → teams).
        conn.pragma_update(None, "foreign_keys", true)?;
        schema::migrate(conn)
    }

    /// The database file (`None` in memory).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The connection. A panic while it was held cannot leave a transaction open (a dropped
    /// `Transaction` rolls back), so a poisoned lock is still a usable connection.
    fn conn(&self) -> MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection for a statement that only reads: a free reader, else (all busy) the next
    /// in turn; the writer's for a database in memory.
    fn reader(&self) -> MutexGuard<'_, Connection> {
        if self.readers.is_empty() {
            return self.conn();
        }
        for r in &self.readers {
            if let Ok(guard) = r.try_lock() {
                return guard;
            }
        }
        let i = self
            .next_reader
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % self.readers.len();
        self.readers[i]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Validates a team name: 1–64 characters of `[a-z0-9_-]`. The set is what is safe everywhere a
/// team name ends up unquoted: URLs, log lines, file and cgroup names.
pub fn validate_team(name: &str) -> Result<(), StoreError> {
    let ok = (1..=MAX_TEAM_LEN).contains(&name.len())
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidTeam(name.to_owned()))
    }
}

/// Validates a key label: at most [`MAX_LABEL_LEN`] characters, none of them control characters
/// (labels are printed to terminals, where escape sequences could forge output).
fn validate_label(label: &str) -> Result<(), StoreError> {
    if label.chars().count() <= MAX_LABEL_LEN && !label.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(StoreError::InvalidLabel)
    }
}

/// Whether SQLite failed only because another connection held a lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// A time as stored: Unix nanoseconds.
fn to_db_time(t: OffsetDateTime) -> Result<i64, StoreError> {
    i64::try_from(t.unix_timestamp_nanos()).map_err(|_| StoreError::TimeOutOfRange)
}

/// A stored time, back in UTC.
fn from_db_time(nanos: i64) -> Result<OffsetDateTime, StoreError> {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(nanos))
        .map_err(|e| StoreError::Corrupt(format!("timestamp {nanos}: {e}")))
}

fn from_db_time_opt(nanos: Option<i64>) -> Result<Option<OffsetDateTime>, StoreError> {
    nanos.map(from_db_time).transpose()
}
