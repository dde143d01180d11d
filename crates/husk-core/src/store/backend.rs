//! [`Store`]: the database as its users see it, whichever process holds it and whichever
//! database it is. In `husk serve` the state helper holds the database (the SQLite file, or
//! the connections to PostgreSQL) and the master key, and the server holds a
//! [`RemoteStore`](super::remote::RemoteStore); the CLI and tests open the database
//! themselves.

use std::path::Path;
use std::sync::Arc;

use time::OffsetDateTime;

use super::cluster::{Heartbeat, NodeLoad, NodeRow, NodeState, Reaped};
use super::postgres::Postgres;
use super::remote::RemoteStore;
use super::{
    KeyInfo, LostSandbox, Principal, PutMode, RunRow, RunTable, SandboxRecord, SavedSandboxRecord,
    SealedRow, SecretUse, SnapshotRow, Sqlite, StoreError, TemplateRecord, VolumeRecord,
};

/// The store: this process's SQLite file or PostgreSQL connections, or the state helper's.
#[derive(Debug)]
pub struct Store(Backend);

#[derive(Debug)]
enum Backend {
    Sqlite(Sqlite),
    Postgres(Postgres),
    Remote(Arc<RemoteStore>),
}

impl Store {
    /// Opens (creating if needed) the database in `state_dir` (see [`Sqlite::open`]).
    pub fn open(state_dir: &Path) -> Result<Store, StoreError> {
        Sqlite::open(state_dir).map(|s| Store(Backend::Sqlite(s)))
    }

    /// A private database in memory, gone when the `Store` is dropped; for tests of code that
    /// needs a store.
    pub fn open_in_memory() -> Result<Store, StoreError> {
        Sqlite::open_in_memory().map(|s| Store(Backend::Sqlite(s)))
    }

    /// The PostgreSQL database at `url`, as node `node`, TLS verified with the host's CAs
    /// and `ca` (see [`Postgres::open`]).
    pub fn open_postgres(url: &str, node: &str, ca: Option<&Path>) -> Result<Store, StoreError> {
        off_runtime(|| Postgres::open(url, node, ca)).map(|p| Store(Backend::Postgres(p)))
    }

    /// Opens where `location` says.
    pub fn open_at(location: &StoreLocation) -> Result<Store, StoreError> {
        match location {
            StoreLocation::Sqlite(dir) => Store::open(dir),
            StoreLocation::Postgres { url, node, ca } => {
                Store::open_postgres(url, node, ca.as_deref())
            }
        }
    }

    /// The state helper's database, through its channels.
    pub fn remote(remote: Arc<RemoteStore>) -> Store {
        Store(Backend::Remote(remote))
    }

    /// The database file (`None` in memory, or held by the state helper).
    pub fn path(&self) -> Option<&Path> {
        match &self.0 {
            Backend::Sqlite(s) => s.path(),
            Backend::Postgres(_) | Backend::Remote(_) => None,
        }
    }

    /// Who `presented` acts for, if it is an active key; `None` also when the database cannot
    /// answer (logged): for callers that only need yes or no and fail closed. The API uses
    /// [`Store::check_key`] to tell an unreachable database (503) from a bad key (401).
    pub fn authenticate(&self, presented: &str) -> Option<Principal> {
        match self.check_key(presented) {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %crate::error_chain(&e), "key lookup failed; refused");
                None
            }
        }
    }

    /// The state helper's channels, when the database is the helper's.
    pub(crate) fn as_remote(&self) -> Option<&Arc<RemoteStore>> {
        match &self.0 {
            Backend::Remote(r) => Some(r),
            Backend::Sqlite(_) | Backend::Postgres(_) => None,
        }
    }
}

/// Runs `f` where the synchronous PostgreSQL client may block: here, unless this thread is
/// one of a Tokio runtime's, where that client panics (it drives its connection on a runtime
/// of its own, which cannot start inside another); then on a thread of its own. In `husk
/// serve` the store runs in the state helper, which has no runtime, so this costs nothing
/// there; the CLI's commands call it from async code.
fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return f();
    }
    std::thread::scope(|s| {
        s.spawn(f)
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

impl Drop for Store {
    /// Closing PostgreSQL connections drops their clients' runtimes, which panics on a
    /// runtime's thread: that happens off it (see [`off_runtime`]).
    fn drop(&mut self) {
        if let Backend::Postgres(p) = &mut self.0 {
            let pool = p.take_pool();
            off_runtime(move || drop(pool));
        }
    }
}

/// Where the database is: a SQLite file in a state directory (one machine), or a PostgreSQL
/// database shared by a cluster's nodes, each opening it as itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    Sqlite(std::path::PathBuf),
    Postgres {
        url: String,
        node: String,
        /// A CA certificate (PEM) the database's TLS certificate may be signed by.
        ca: Option<std::path::PathBuf>,
    },
}

/// Each method goes to the backend's method of the same name and signature.
macro_rules! delegate {
    ($( $(#[$doc:meta])* fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty; )*) => {
        impl Store {
            $(
                $(#[$doc])*
                pub fn $name(&self $(, $arg: $ty)*) -> $ret {
                    match &self.0 {
                        Backend::Sqlite(s) => s.$name($($arg),*),
                        Backend::Postgres(p) => off_runtime(|| p.$name($($arg),*)),
                        Backend::Remote(r) => r.$name($($arg),*),
                    }
                }
            )*
        }
    };
}

delegate! {
    /// Creates a key for `team` (see [`Sqlite::create_key`]); returns it with its secret.
    fn create_key(&self, team: &str, admin: bool, label: Option<&str>) -> Result<(KeyInfo, String), StoreError>;
    /// Who `presented` acts for, if it is an active key (`None`: it is not); an error when
    /// the database cannot answer.
    fn check_key(&self, presented: &str) -> Result<Option<Principal>, StoreError>;
    fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError>;
    fn revoke_key(&self, id_or_key: &str) -> Result<bool, StoreError>;
    fn has_active_keys(&self) -> Result<bool, StoreError>;
    fn set_team_quota(&self, team: &str, max: Option<u32>) -> Result<(), StoreError>;
    fn team_quota(&self, team: &str) -> Result<Option<u32>, StoreError>;
    fn put_run_record(&self, row: &RunRow<'_>) -> Result<(), StoreError>;
    fn run_record(&self, table: RunTable, team: &str, id: &str) -> Result<Option<String>, StoreError>;
    fn run_records(&self, table: RunTable, team: &str, batch: Option<&str>, limit: u32) -> Result<Vec<String>, StoreError>;
    fn unfinished_runs(&self) -> Result<Vec<(RunTable, String, String)>, StoreError>;
    fn prune_records(&self, before: OffsetDateTime) -> Result<u64, StoreError>;
    fn insert_sandbox(&self, record: &SandboxRecord) -> Result<(), StoreError>;
    fn update_sandbox_end(&self, id: &str, end_at: OffsetDateTime) -> Result<bool, StoreError>;
    fn update_sandbox_description(&self, id: &str, end_at: OffsetDateTime, description: &str) -> Result<bool, StoreError>;
    fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError>;
    fn list_sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError>;
    fn mark_sandbox_lost(&self, id: &str, reason: &str, at: OffsetDateTime) -> Result<bool, StoreError>;
    fn lost_sandboxes(&self, team: Option<&str>, id: Option<&str>) -> Result<Vec<LostSandbox>, StoreError>;
    fn prune_lost_sandboxes(&self, before: OffsetDateTime) -> Result<usize, StoreError>;
    fn put_saved_sandbox(&self, record: &SavedSandboxRecord) -> Result<(), StoreError>;
    fn delete_saved_sandbox(&self, id: &str) -> Result<bool, StoreError>;
    fn saved_sandboxes(&self) -> Result<Vec<SavedSandboxRecord>, StoreError>;
    fn put_snapshots(&self, rows: &[SnapshotRow]) -> Result<(), StoreError>;
    fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError>;
    fn snapshots(&self) -> Result<Vec<SnapshotRow>, StoreError>;
    fn put_secret(&self, r: &SealedRow) -> Result<(), StoreError>;
    fn write_secret(&self, r: &SealedRow, mode: PutMode) -> Result<bool, StoreError>;
    fn secret(&self, team: &str, name: &str) -> Result<Option<SealedRow>, StoreError>;
    fn secrets(&self, team: Option<&str>) -> Result<Vec<SealedRow>, StoreError>;
    fn delete_secret(&self, team: &str, name: &str) -> Result<bool, StoreError>;
    fn reseal_secrets(&self, rows: &[SealedRow]) -> Result<(), StoreError>;
    fn record_secret_use(&self, u: &SecretUse) -> Result<(), StoreError>;
    fn secret_uses(&self, team: &str, limit: u32) -> Result<Vec<SecretUse>, StoreError>;
    fn put_template(&self, rec: &TemplateRecord) -> Result<Option<TemplateRecord>, StoreError>;
    fn template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError>;
    fn templates(&self) -> Result<Vec<TemplateRecord>, StoreError>;
    fn delete_template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError>;
    fn image_in_use(&self, digest: &str) -> Result<bool, StoreError>;
    fn ensure_volume(&self, rec: &VolumeRecord) -> Result<VolumeRecord, StoreError>;
    fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError>;
    fn volumes(&self, team: &str) -> Result<Vec<VolumeRecord>, StoreError>;
    fn delete_volume(&self, team: &str, name: &str) -> Result<bool, StoreError>;
}

/// The cluster's operations (`store/cluster.rs`): PostgreSQL's alone. A node's own three go
/// through the state helper in `husk serve`; the gateway's hold the database themselves.
impl Store {
    fn postgres(&self) -> Result<&Postgres, StoreError> {
        match &self.0 {
            Backend::Postgres(p) => Ok(p),
            Backend::Sqlite(_) | Backend::Remote(_) => Err(StoreError::NotClustered),
        }
    }

    /// Registers this node (see [`Postgres::register_node`]); its code.
    pub fn register_node(&self, url: &str, capacity: u32) -> Result<String, StoreError> {
        match &self.0 {
            Backend::Remote(r) => r.register_node(url, capacity),
            _ => {
                let p = self.postgres()?;
                off_runtime(|| p.register_node(url, capacity))
            }
        }
    }

    /// This node's heartbeat (see [`Postgres::node_heartbeat`]).
    pub fn node_heartbeat(&self, load: &NodeLoad) -> Result<Option<Heartbeat>, StoreError> {
        match &self.0 {
            Backend::Remote(r) => r.node_heartbeat(load),
            _ => {
                let p = self.postgres()?;
                off_runtime(|| p.node_heartbeat(load))
            }
        }
    }

    /// Sets this node's state (see [`Postgres::set_node_state`]).
    pub fn set_node_state(&self, state: NodeState) -> Result<bool, StoreError> {
        match &self.0 {
            Backend::Remote(r) => r.set_node_state(state),
            _ => {
                let p = self.postgres()?;
                off_runtime(|| p.set_node_state(state))
            }
        }
    }

    /// Holds this node out of placement or lets it back (see [`Postgres::hold_node`]): an
    /// operator's command, on the database.
    pub fn hold_node(&self, held: bool) -> Result<bool, StoreError> {
        let p = self.postgres()?;
        off_runtime(|| p.hold_node(held))
    }

    /// Every node (see [`Postgres::nodes`]).
    pub fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        match &self.0 {
            Backend::Remote(r) => r.nodes(),
            _ => {
                let p = self.postgres()?;
                off_runtime(|| p.nodes())
            }
        }
    }

    /// Holds a place in a team's quota across the cluster (see [`Postgres::claim_quota`]).
    pub fn claim_quota(
        &self,
        team: &str,
        default: u32,
        ttl: std::time::Duration,
    ) -> Result<(Option<i64>, u32), StoreError> {
        let p = self.postgres()?;
        off_runtime(|| p.claim_quota(team, default, ttl))
    }

    /// A create's key check and quota claim in one statement (see
    /// [`Postgres::check_key_and_claim`]).
    pub fn check_key_and_claim(
        &self,
        presented: &str,
        default: u32,
        ttl: std::time::Duration,
    ) -> Result<Option<(Principal, super::cluster::Claimed)>, StoreError> {
        let p = self.postgres()?;
        off_runtime(|| p.check_key_and_claim(presented, default, ttl))
    }

    /// Gives a place back (see [`Postgres::release_quota`]).
    pub fn release_quota(&self, claim: i64) -> Result<(), StoreError> {
        let p = self.postgres()?;
        off_runtime(|| p.release_quota(claim))
    }

    /// Declares silent nodes lost (see [`Postgres::reap_nodes`]).
    pub fn reap_nodes(
        &self,
        silent: std::time::Duration,
        draining: std::time::Duration,
    ) -> Result<Vec<Reaped>, StoreError> {
        let p = self.postgres()?;
        off_runtime(|| p.reap_nodes(silent, draining))
    }
}
