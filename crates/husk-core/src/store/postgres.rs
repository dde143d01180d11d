//! The PostgreSQL store: the same [`Store`](super::Store) interface as the SQLite file, on a
//! database several husk processes on several machines share (a cluster).
//!
//! **Shared and per-node rows.** Keys, teams and their quotas, secrets, templates, volumes
//! and the record of lost sandboxes are the cluster's: every process sees every write at
//! once (nothing is cached, as with SQLite). What a server takes up again when it starts is
//! its own: the live sandboxes, the sandboxes saved to disk, the snapshots (their files are on
//! that machine) and the runs in progress. Those rows carry the `node` the store was opened
//! for, and the listings a starting server reads ([`Postgres::list_sandboxes`],
//! [`Postgres::saved_sandboxes`], [`Postgres::snapshots`], [`Postgres::unfinished_runs`]) return only
//! that node's. Lookups by id see every node's rows: ids are unique across the cluster.
//!
//! **Synchronous, pooled, bounded.** Methods block like SQLite's; in `husk serve` they run in
//! the state helper, whose channels are its threads. A pool of [`POOL_SIZE`] connections
//! serves them, each keeping the statements it prepared (`postgres/pool.rs`); a connection is
//! checked before it is handed out, so a database that restarted costs no request more than
//! the reconnect. Connecting waits at most [`CONNECT_TIMEOUT`], a
//! statement runs at most [`STATEMENT_TIMEOUT`] (set on the server side), and a database that
//! cannot be reached is [`StoreError::Unavailable`], which the API answers with 503.
//!
//! **Schema** migrations are refinery's, in the table `husk_schema_history`, applied by
//! [`Postgres::open`] under an advisory lock so that nodes starting together migrate once.
//! Times are Unix nanoseconds in `BIGINT`, as in the SQLite file.

mod cluster;
mod keys;
mod pool;
mod runs;
mod sandboxes;
mod schema;
mod secrets;
mod templates;
mod tls;
mod volumes;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use postgres::error::SqlState;
use std::path::Path;

use super::StoreError;

/// Connections to the database per process. The state helper serves this many store calls
/// at once (its channels), so more would sit idle.
pub const POOL_SIZE: u32 = super::remote::CHANNELS as u32;

/// How long opening a connection may take before the database counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest one statement may run (the server cancels it after that): every store call is
/// a few indexed statements, so anything longer is a database in trouble, and a caller must
/// not wait on it for ever.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest node name.
pub const MAX_NODE_LEN: usize = 63;

pub use cluster::MAX_NODE_TEMPLATES;
use pool::Manager;

type Conn = r2d2::PooledConnection<Manager>;

/// The PostgreSQL store of one node (see the module documentation).
pub struct Postgres {
    /// `None` only while the store is being dropped (see [`Postgres::take_pool`]).
    pool: Option<r2d2::Pool<Manager>>,
    /// Whose per-node rows this process writes and lists.
    node: String,
    /// Where the database is, without the password, for messages.
    target: String,
    /// Why the pool last failed to connect (r2d2's own error keeps only a summary).
    last_error: LastError,
}

impl fmt::Debug for Postgres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Postgres")
            .field("target", &self.target)
            .field("node", &self.node)
            .finish()
    }
}

impl Postgres {
    /// Connects to the database at `url` (`postgres://user:password@host:port/database`, or
    /// the key=value form libpq takes) as node `node`, and brings its schema up to date.
    ///
    /// TLS is used when the URL says `sslmode=require`, and then the server's certificate is
    /// verified (against the host's CAs and `ca`, a PEM file) whatever libpq would do; without
    /// it the connection is plain (`prefer`, the default, is `disable`: a private network).
    /// Fails with [`StoreError::Unavailable`] if no connection can be made within
    /// [`CONNECT_TIMEOUT`].
    pub fn open(url: &str, node: &str, ca: Option<&Path>) -> Result<Postgres, StoreError> {
        validate_node(node)?;
        let mut config: postgres::Config = url
            .parse()
            .map_err(|e: postgres::Error| StoreError::BadUrl(e.to_string()))?;
        let require = config.get_ssl_mode() == postgres::config::SslMode::Require;
        if !require {
            config.ssl_mode(postgres::config::SslMode::Disable);
        }
        let tls = tls::connector(require, ca)?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("husk");
        }
        // Server-side bounds on every statement and on a transaction left idle (a process
        // that died mid-transaction must not hold locks).
        let options = format!(
            "-c statement_timeout={} -c idle_in_transaction_session_timeout={}",
            STATEMENT_TIMEOUT.as_millis(),
            STATEMENT_TIMEOUT.as_millis()
        );
        let options = match config.get_options() {
            Some(o) => format!("{o} {options}"),
            None => options,
        };
        config.options(&options);
        let target = describe(&config);
        let last_error = LastError::default();
        let pool = r2d2::Pool::builder()
            .max_size(POOL_SIZE)
            .min_idle(Some(1))
            .connection_timeout(CONNECT_TIMEOUT)
            // A connection the database closed (it restarted) is found out before use.
            .test_on_check_out(true)
            .error_handler(Box::new(last_error.clone()))
            .build(Manager { config, tls })
            .map_err(|_| {
                StoreError::Unavailable(format!(
                    "{target}: {}",
                    last_error.take_or("no connection in time")
                ))
            })?;
        let store = Postgres {
            pool: Some(pool),
            node: node.to_owned(),
            target,
            last_error,
        };
        schema::migrate(&mut store.conn()?.client)?;
        Ok(store)
    }

    /// The node this store writes and lists per-node rows for.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The pool, taken out so that its connections can be closed on another thread; the
    /// store answers no more calls after this.
    pub(super) fn take_pool(&mut self) -> Option<r2d2::Pool<Manager>> {
        self.pool.take()
    }

    /// Where the database is (host, port, database and user; never the password).
    pub fn target(&self) -> &str {
        &self.target
    }

    /// A connection from the pool; [`StoreError::Unavailable`] when none can be had in time.
    fn conn(&self) -> Result<Conn, StoreError> {
        let pool = self
            .pool
            .as_ref()
            .ok_or_else(|| StoreError::Unavailable(format!("{}: store closed", self.target)))?;
        pool.get().map_err(|_| {
            StoreError::Unavailable(format!(
                "{}: {}",
                self.target,
                self.last_error.take_or("no free connection in time")
            ))
        })
    }
}

/// The pool's most recent connection error, with its causes (for example "Connection
/// refused"), which r2d2 hands to its error handler and otherwise flattens to a summary.
#[derive(Debug, Default, Clone)]
struct LastError(Arc<Mutex<Option<String>>>);

impl LastError {
    /// The recorded error (cleared), else `fallback`.
    fn take_or(&self, fallback: &str) -> String {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(|| fallback.to_owned())
    }
}

impl r2d2::HandleError<postgres::Error> for LastError {
    fn handle_error(&self, error: postgres::Error) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(crate::error_chain(&error));
    }
}

/// Host, port, database and user of `config`, for messages and logs.
fn describe(config: &postgres::Config) -> String {
    use postgres::config::Host;
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "postgres://{}@{host}:{port}/{}",
        config.get_user().unwrap_or(""),
        config.get_dbname().unwrap_or("")
    )
}

/// Validates a node name: 1–63 characters of `[a-z0-9.-]`, starting with a letter or digit
/// (what a Kubernetes node name or a host name is), since it ends up in logs and sandbox ids.
pub fn validate_node(name: &str) -> Result<(), StoreError> {
    let ok = (1..=MAX_NODE_LEN).contains(&name.len())
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidNode(name.to_owned()))
    }
}

impl From<postgres::Error> for StoreError {
    /// A failure to reach the database (no connection, a connection lost, the server shutting
    /// down or out of connections) is [`StoreError::Unavailable`]: the caller may retry and the
    /// API answers 503. Anything the database refused is [`StoreError::Postgres`].
    fn from(e: postgres::Error) -> StoreError {
        let unreachable = match e.code() {
            None => e.as_db_error().is_none(),
            Some(code) => {
                let c = code.code();
                // Class 08: connection exception; 57P01-57P03: shutdown, crash, cannot connect
                // now; class 53: insufficient resources (too many connections).
                c.starts_with("08")
                    || c.starts_with("53")
                    || *code == SqlState::ADMIN_SHUTDOWN
                    || *code == SqlState::CRASH_SHUTDOWN
                    || *code == SqlState::CANNOT_CONNECT_NOW
            }
        };
        if unreachable {
            StoreError::Unavailable(crate::error_chain(&e))
        } else {
            StoreError::Postgres(e)
        }
    }
}

/// Whether `e` is the database refusing a duplicate key.
fn is_unique_violation(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// A count or size as PostgreSQL's `BIGINT`.
fn to_i64(n: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(n).map_err(|_| StoreError::Corrupt(format!("{what} {n} out of range")))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cluster_tests;
