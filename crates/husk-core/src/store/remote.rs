//! The state helper: the process that holds the database and the master key, and the
//! server's side of it ([`RemoteStore`]).
//!
//! `husk serve` forks it before any thread (`husk_runtime::helper`); it opens the SQLite file
//! and the master key, and answers [`StateRequest`]s, one per store method, plus two for
//! secrets: seal and store a value, open one for a process. The server then never opens the
//! state directory or the key: the secrets it injects into processes come back one at a
//! time, by team and name, opened in the helper.
//!
//! Every request is hostile: the helper checks what the store's own methods check (team
//! names, labels, sizes of secrets), and a request that does not decode is answered as a
//! failure. Requests and replies are bounded by the channel's frame (16 MiB): a reply that
//! would not fit is an error.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use husk_runtime::failure::{Failure, FailureKind};
use husk_runtime::helper::{self as rt, Channels, HelperError};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use zeroize::Zeroizing;

use crate::operator_files::{self, MAX_CERT_FILE, MAX_KEY_FILE, MAX_TOKEN_FILE};

use super::cluster::{Heartbeat, NodeLoad, NodeRow, NodeState};
use super::{
    KeyInfo, LostSandbox, Principal, PutMode, RunRow, RunTable, SandboxRecord, SavedSandboxRecord,
    SealedRow, SecretUse, SnapshotRow, Store, StoreError, TemplateRecord, VolumeRecord,
};
use crate::secrets::{Metadata, SecretError, Secrets};

/// Channels to the state helper: this many store calls are served at once.
pub const CHANNELS: usize = 8;

/// What the server asks the state helper: one variant per store method, with its arguments
/// owned, and the two secret operations that need the master key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StateRequest {
    CreateKey {
        team: String,
        admin: bool,
        label: Option<String>,
    },
    Authenticate {
        presented: String,
    },
    ListKeys,
    RevokeKey {
        id_or_key: String,
    },
    HasActiveKeys,
    SetTeamQuota {
        team: String,
        max: Option<u32>,
    },
    TeamQuota {
        team: String,
    },
    PutRunRecord {
        table: RunTable,
        id: String,
        team: String,
        batch: Option<String>,
        created_at: OffsetDateTime,
        ended_at: Option<OffsetDateTime>,
        record: String,
    },
    RunRecord {
        table: RunTable,
        team: String,
        id: String,
    },
    RunRecords {
        table: RunTable,
        team: String,
        batch: Option<String>,
        limit: u32,
    },
    UnfinishedRuns,
    PruneRecords {
        before: OffsetDateTime,
    },
    InsertSandbox(SandboxRecord),
    UpdateSandboxEnd {
        id: String,
        end_at: OffsetDateTime,
    },
    DeleteSandbox {
        id: String,
    },
    ListSandboxes,
    UpdateSandboxDescription {
        id: String,
        end_at: OffsetDateTime,
        description: String,
    },
    MarkSandboxLost {
        id: String,
        reason: String,
        at: OffsetDateTime,
    },
    LostSandboxes {
        team: Option<String>,
        id: Option<String>,
    },
    PruneLostSandboxes {
        before: OffsetDateTime,
    },
    PutSavedSandbox(SavedSandboxRecord),
    DeleteSavedSandbox {
        id: String,
    },
    SavedSandboxes,
    PutSnapshots(Vec<SnapshotRow>),
    DeleteSnapshot {
        id: String,
    },
    Snapshots,
    PutSecret(SealedRow, PutMode),
    Secret {
        team: String,
        name: String,
    },
    Secrets {
        team: Option<String>,
    },
    DeleteSecret {
        team: String,
        name: String,
    },
    ResealSecrets(Vec<SealedRow>),
    RecordSecretUse(SecretUse),
    SecretUses {
        team: String,
        limit: u32,
    },
    PutTemplate(Box<TemplateRecord>),
    Template {
        name: String,
    },
    Templates,
    DeleteTemplate {
        name: String,
    },
    ImageInUse {
        digest: String,
    },
    EnsureVolume(VolumeRecord),
    Volume {
        id: String,
    },
    Volumes {
        team: String,
    },
    DeleteVolume {
        team: String,
        name: String,
    },
    /// The content token of volume `id` (derived under the master key, see
    /// [`Secrets::volume_token`]).
    VolumeToken {
        id: String,
    },
    /// Seals `value` under the current master key and stores it as `team`'s secret `name`.
    SealSecret {
        team: String,
        name: String,
        value: Vec<u8>,
        mode: PutMode,
        metadata: Option<Metadata>,
    },
    /// `team`'s secret `name`, opened.
    OpenSecret {
        team: String,
        name: String,
    },
    /// The node's own membership (a cluster's node, see `store/cluster.rs`).
    RegisterNode {
        url: String,
        capacity: u32,
    },
    NodeHeartbeat {
        load: NodeLoad,
    },
    SetNodeState {
        state: NodeState,
    },
    Nodes,
    /// The cluster token file, read again (a node's server, unprivileged, cannot read the
    /// file; the helper reads the one path it was started with and no other).
    ClusterTokenFile,
    /// The listener's certificate chain and key files (`--tls-cert`, `--tls-key`), read
    /// again for the same reason, both at once.
    TlsFiles,
}

/// The state helper's answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum StateReply {
    Unit,
    Bool(bool),
    Count(u64),
    Key(KeyInfo, String),
    Principal(Option<Principal>),
    Keys(Vec<KeyInfo>),
    Quota(Option<u32>),
    Record(Option<String>),
    Records(Vec<String>),
    Unfinished(Vec<(RunTable, String, String)>),
    Sandboxes(Vec<SandboxRecord>),
    SavedSandboxes(Vec<SavedSandboxRecord>),
    Lost(Vec<LostSandbox>),
    Snapshots(Vec<SnapshotRow>),
    Sealed(Option<SealedRow>),
    SealedRows(Vec<SealedRow>),
    Uses(Vec<SecretUse>),
    Template(Option<Box<TemplateRecord>>),
    Templates(Vec<TemplateRecord>),
    Opened(Vec<u8>),
    /// A certificate chain and its key.
    TlsFiles {
        cert: Vec<u8>,
        key: Vec<u8>,
    },
    Volume(Option<VolumeRecord>),
    Volumes(Vec<VolumeRecord>),
    Token(String),
    Heartbeat(Option<Heartbeat>),
    Nodes(Vec<NodeRow>),
    Store(WireStoreError),
    Secret(WireSecretError),
    Failed(Failure),
}

/// A [`StoreError`] as it crosses: the variants callers tell apart keep their type; what
/// happened inside the helper (SQLite, files) is its message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireStoreError {
    InvalidTeam(String),
    InvalidLabel,
    SandboxExists(String),
    TimeOutOfRange,
    SchemaTooNew {
        found: i64,
        supported: i64,
    },
    Corrupt(String),
    /// The database cannot be reached (the API's 503).
    Unavailable(String),
    /// A cluster's operation on the SQLite file.
    NotClustered,
    Other(String),
}

/// A [`SecretError`] as it crosses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum WireSecretError {
    NotFound(String),
    Exists(String),
    BadMetadata { name: String, reason: String },
    InvalidName(String),
    TooLarge { name: String, size: u64 },
    Nul(String),
    Undecryptable(String),
    NotUtf8(String),
    MasterKey { path: String, message: String },
    Store(WireStoreError),
}

impl From<&StoreError> for WireStoreError {
    fn from(e: &StoreError) -> WireStoreError {
        match e {
            StoreError::InvalidTeam(t) => WireStoreError::InvalidTeam(t.clone()),
            StoreError::InvalidLabel => WireStoreError::InvalidLabel,
            StoreError::SandboxExists(id) => WireStoreError::SandboxExists(id.clone()),
            StoreError::TimeOutOfRange => WireStoreError::TimeOutOfRange,
            StoreError::SchemaTooNew { found, supported } => WireStoreError::SchemaTooNew {
                found: *found,
                supported: *supported,
            },
            StoreError::Corrupt(m) => WireStoreError::Corrupt(m.clone()),
            StoreError::Unavailable(m) => WireStoreError::Unavailable(m.clone()),
            StoreError::NotClustered => WireStoreError::NotClustered,
            other => WireStoreError::Other(crate::error_chain(other)),
        }
    }
}

impl From<WireStoreError> for StoreError {
    fn from(e: WireStoreError) -> StoreError {
        match e {
            WireStoreError::InvalidTeam(t) => StoreError::InvalidTeam(t),
            WireStoreError::InvalidLabel => StoreError::InvalidLabel,
            WireStoreError::SandboxExists(id) => StoreError::SandboxExists(id),
            WireStoreError::TimeOutOfRange => StoreError::TimeOutOfRange,
            WireStoreError::SchemaTooNew { found, supported } => {
                StoreError::SchemaTooNew { found, supported }
            }
            WireStoreError::Corrupt(m) => StoreError::Corrupt(m),
            WireStoreError::Unavailable(m) => StoreError::Unavailable(m),
            WireStoreError::NotClustered => StoreError::NotClustered,
            WireStoreError::Other(m) => StoreError::Remote(m),
        }
    }
}

impl From<&SecretError> for WireSecretError {
    fn from(e: &SecretError) -> WireSecretError {
        match e {
            SecretError::NotFound(n) => WireSecretError::NotFound(n.clone()),
            SecretError::Exists(n) => WireSecretError::Exists(n.clone()),
            SecretError::BadMetadata { name, reason } => WireSecretError::BadMetadata {
                name: name.clone(),
                reason: reason.clone(),
            },
            SecretError::InvalidName(n) => WireSecretError::InvalidName(n.clone()),
            SecretError::TooLarge { name, size } => WireSecretError::TooLarge {
                name: name.clone(),
                size: *size as u64,
            },
            SecretError::Nul(n) => WireSecretError::Nul(n.clone()),
            SecretError::Undecryptable(n) => WireSecretError::Undecryptable(n.clone()),
            SecretError::NotUtf8(n) => WireSecretError::NotUtf8(n.clone()),
            SecretError::MasterKey { path, message } => WireSecretError::MasterKey {
                path: path.display().to_string(),
                message: message.clone(),
            },
            SecretError::Store(s) => WireSecretError::Store(s.into()),
        }
    }
}

impl From<WireSecretError> for SecretError {
    fn from(e: WireSecretError) -> SecretError {
        match e {
            WireSecretError::NotFound(n) => SecretError::NotFound(n),
            WireSecretError::Exists(n) => SecretError::Exists(n),
            WireSecretError::BadMetadata { name, reason } => {
                SecretError::BadMetadata { name, reason }
            }
            WireSecretError::InvalidName(n) => SecretError::InvalidName(n),
            WireSecretError::TooLarge { name, size } => SecretError::TooLarge {
                name,
                size: usize::try_from(size).unwrap_or(usize::MAX),
            },
            WireSecretError::Nul(n) => SecretError::Nul(n),
            WireSecretError::Undecryptable(n) => SecretError::Undecryptable(n),
            WireSecretError::NotUtf8(n) => SecretError::NotUtf8(n),
            WireSecretError::MasterKey { path, message } => SecretError::MasterKey {
                path: path.into(),
                message,
            },
            WireSecretError::Store(s) => SecretError::Store(s.into()),
        }
    }
}

/// The server's side: the state helper's channels.
#[derive(Debug)]
pub struct RemoteStore {
    channels: Channels,
    pid: husk_runtime::libc::pid_t,
    /// One more channel, for another helper ([`Self::take_spare_channel`]).
    spare: std::sync::Mutex<Option<OwnedFd>>,
}

fn unexpected(reply: &StateReply) -> StoreError {
    StoreError::Helper(HelperError::Protocol {
        helper: "state",
        message: format!("unexpected {reply:?}"),
    })
}

/// Sends `$req` and takes the reply that matches `$pat`, giving `$out`; a store failure is
/// the store's error, anything else a protocol error.
macro_rules! ask {
    ($self:ident, $req:expr, $pat:pat => $out:expr) => {
        match $self.call($req)? {
            $pat => Ok($out),
            StateReply::Store(e) => Err(StoreError::from(e)),
            other => Err(unexpected(&other)),
        }
    };
}

impl RemoteStore {
    /// Forks the state helper: `setup` runs in it and opens what it holds (the store and the
    /// secrets with their master key). Blocks until the helper is ready. The calling process
    /// must be single-threaded.
    ///
    /// `files` are the only files the helper reads on request
    /// ([`RemoteStore::cluster_token_file`], [`RemoteStore::tls_files`]).
    pub fn start(
        setup: impl FnOnce() -> Result<(Arc<Store>, Arc<Secrets>), String>,
        files: HelperFiles,
    ) -> Result<RemoteStore, Failure> {
        let forked = rt::fork("husk-state", CHANNELS + 1, &[], |channels| {
            let (store, secrets) = match setup() {
                Ok(x) => x,
                Err(e) => {
                    let _ = rt::ready::<()>(&channels, &Err(Failure::new(FailureKind::Host, e)));
                    return 1;
                }
            };
            // Open now, they are all it needs: no capability from here on (it stays uid 0,
            // which owns the state directory's files).
            if let Err(e) = husk_runtime::fences::server::drop_all_capabilities() {
                let f = Failure::new(
                    FailureKind::Host,
                    format!("the state helper could not drop its capabilities: {e}"),
                );
                let _ = rt::ready::<()>(&channels, &Err(f));
                return 1;
            }
            if rt::ready(&channels, &Ok(())).is_err() {
                return 1;
            }
            serve(channels, &store, &secrets, &files);
            0
        })?;
        rt::await_ready::<()>("state", &forked)?;
        let mut channels = forked.channels;
        let spare = channels.pop();
        Ok(RemoteStore {
            channels: Channels::new("state", channels),
            pid: forked.pid,
            spare: std::sync::Mutex::new(spare),
        })
    }

    /// One channel to the helper, once: for another helper (the build helper registers the
    /// templates it builds), which wraps it with [`Self::client`].
    pub fn take_spare_channel(&self) -> Option<OwnedFd> {
        self.spare.lock().ok()?.take()
    }

    /// The store through one channel taken from the server's (in another helper).
    pub fn client(channel: OwnedFd) -> RemoteStore {
        RemoteStore {
            channels: Channels::new("state", vec![channel]),
            pid: 0,
            spare: std::sync::Mutex::new(None),
        }
    }

    /// The helper's pid.
    pub fn pid(&self) -> husk_runtime::libc::pid_t {
        self.pid
    }

    /// Stops the helper and waits for it. Blocking. Later calls fail.
    pub fn shutdown(&self) {
        self.channels.close();
        if let Ok(mut spare) = self.spare.lock() {
            spare.take();
        }
        // A client in another helper has no process of its own to wait for.
        if self.pid > 0 {
            let _ = husk_runtime::sys::waitpid(self.pid, 0);
        }
    }

    fn call(&self, req: StateRequest) -> Result<StateReply, StoreError> {
        match self.channels.call::<_, StateReply>(&req, None)? {
            (_, Some(_)) => Err(StoreError::Helper(HelperError::Protocol {
                helper: "state",
                message: "a descriptor with a reply".into(),
            })),
            (StateReply::Failed(f), None) => Err(StoreError::Helper(HelperError::Failed(f))),
            (reply, None) => Ok(reply),
        }
    }

    pub fn create_key(
        &self,
        team: &str,
        admin: bool,
        label: Option<&str>,
    ) -> Result<(KeyInfo, String), StoreError> {
        let req = StateRequest::CreateKey {
            team: team.into(),
            admin,
            label: label.map(Into::into),
        };
        ask!(self, req, StateReply::Key(k, s) => (k, s))
    }

    /// Who `presented` acts for (`None`: no active key); an error when the helper or its
    /// database cannot answer.
    pub fn check_key(&self, presented: &str) -> Result<Option<Principal>, StoreError> {
        // A key is at most a few dozen bytes: anything longer is no key, and not sent.
        if presented.len() > MAX_KEY_BYTES {
            return Ok(None);
        }
        let req = StateRequest::Authenticate {
            presented: presented.into(),
        };
        ask!(self, req, StateReply::Principal(p) => p)
    }

    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        ask!(self, StateRequest::ListKeys, StateReply::Keys(k) => k)
    }

    pub fn revoke_key(&self, id_or_key: &str) -> Result<bool, StoreError> {
        let req = StateRequest::RevokeKey {
            id_or_key: id_or_key.into(),
        };
        ask!(self, req, StateReply::Bool(b) => b)
    }

    pub fn register_node(&self, url: &str, capacity: u32) -> Result<String, StoreError> {
        let req = StateRequest::RegisterNode {
            url: url.into(),
            capacity,
        };
        ask!(self, req, StateReply::Token(code) => code)
    }

    pub fn node_heartbeat(&self, load: &NodeLoad) -> Result<Option<Heartbeat>, StoreError> {
        let req = StateRequest::NodeHeartbeat { load: load.clone() };
        ask!(self, req, StateReply::Heartbeat(h) => h)
    }

    pub fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        ask!(self, StateRequest::Nodes, StateReply::Nodes(n) => n)
    }

    /// The cluster token file's text, as the helper reads it now.
    pub fn cluster_token_file(&self) -> Result<Zeroizing<Vec<u8>>, StoreError> {
        ask!(self, StateRequest::ClusterTokenFile, StateReply::Opened(v) => Zeroizing::new(v))
    }

    /// The listener's certificate chain and key, as the helper reads them now.
    #[allow(clippy::type_complexity)]
    pub fn tls_files(&self) -> Result<(Zeroizing<Vec<u8>>, Zeroizing<Vec<u8>>), StoreError> {
        ask!(self, StateRequest::TlsFiles, StateReply::TlsFiles { cert, key } => (Zeroizing::new(cert), Zeroizing::new(key)))
    }

    pub fn set_node_state(&self, state: NodeState) -> Result<bool, StoreError> {
        ask!(self, StateRequest::SetNodeState { state }, StateReply::Bool(b) => b)
    }

    pub fn has_active_keys(&self) -> Result<bool, StoreError> {
        ask!(self, StateRequest::HasActiveKeys, StateReply::Bool(b) => b)
    }

    pub fn set_team_quota(&self, team: &str, max: Option<u32>) -> Result<(), StoreError> {
        let req = StateRequest::SetTeamQuota {
            team: team.into(),
            max,
        };
        ask!(self, req, StateReply::Unit => ())
    }

    pub fn team_quota(&self, team: &str) -> Result<Option<u32>, StoreError> {
        let req = StateRequest::TeamQuota { team: team.into() };
        ask!(self, req, StateReply::Quota(q) => q)
    }

    pub fn put_run_record(&self, row: &RunRow<'_>) -> Result<(), StoreError> {
        let req = StateRequest::PutRunRecord {
            table: row.table,
            id: row.id.into(),
            team: row.team.into(),
            batch: row.batch.map(Into::into),
            created_at: row.created_at,
            ended_at: row.ended_at,
            record: row.record.into(),
        };
        ask!(self, req, StateReply::Unit => ())
    }

    pub fn run_record(
        &self,
        table: RunTable,
        team: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError> {
        let req = StateRequest::RunRecord {
            table,
            team: team.into(),
            id: id.into(),
        };
        ask!(self, req, StateReply::Record(r) => r)
    }

    pub fn run_records(
        &self,
        table: RunTable,
        team: &str,
        batch: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        let req = StateRequest::RunRecords {
            table,
            team: team.into(),
            batch: batch.map(Into::into),
            limit,
        };
        ask!(self, req, StateReply::Records(r) => r)
    }

    pub fn unfinished_runs(&self) -> Result<Vec<(RunTable, String, String)>, StoreError> {
        ask!(self, StateRequest::UnfinishedRuns, StateReply::Unfinished(r) => r)
    }

    pub fn prune_records(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        ask!(self, StateRequest::PruneRecords { before }, StateReply::Count(n) => n)
    }

    pub fn insert_sandbox(&self, record: &SandboxRecord) -> Result<(), StoreError> {
        ask!(self, StateRequest::InsertSandbox(record.clone()), StateReply::Unit => ())
    }

    pub fn update_sandbox_end(&self, id: &str, end_at: OffsetDateTime) -> Result<bool, StoreError> {
        let req = StateRequest::UpdateSandboxEnd {
            id: id.into(),
            end_at,
        };
        ask!(self, req, StateReply::Bool(b) => b)
    }

    pub fn update_sandbox_description(
        &self,
        id: &str,
        end_at: OffsetDateTime,
        description: &str,
    ) -> Result<bool, StoreError> {
        let req = StateRequest::UpdateSandboxDescription {
            id: id.into(),
            end_at,
            description: description.into(),
        };
        ask!(self, req, StateReply::Bool(b) => b)
    }

    pub fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        ask!(self, StateRequest::DeleteSandbox { id: id.into() }, StateReply::Bool(b) => b)
    }

    pub fn list_sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        ask!(self, StateRequest::ListSandboxes, StateReply::Sandboxes(s) => s)
    }

    pub fn mark_sandbox_lost(
        &self,
        id: &str,
        reason: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        ask!(self, StateRequest::MarkSandboxLost { id: id.into(), reason: reason.into(), at }, StateReply::Bool(b) => b)
    }

    pub fn lost_sandboxes(
        &self,
        team: Option<&str>,
        id: Option<&str>,
    ) -> Result<Vec<LostSandbox>, StoreError> {
        let req = StateRequest::LostSandboxes {
            team: team.map(str::to_owned),
            id: id.map(str::to_owned),
        };
        ask!(self, req, StateReply::Lost(l) => l)
    }

    pub fn prune_lost_sandboxes(&self, before: OffsetDateTime) -> Result<usize, StoreError> {
        ask!(self, StateRequest::PruneLostSandboxes { before }, StateReply::Count(n) => n as usize)
    }

    pub fn put_saved_sandbox(&self, record: &SavedSandboxRecord) -> Result<(), StoreError> {
        ask!(self, StateRequest::PutSavedSandbox(record.clone()), StateReply::Unit => ())
    }

    pub fn delete_saved_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        ask!(self, StateRequest::DeleteSavedSandbox { id: id.into() }, StateReply::Bool(b) => b)
    }

    pub fn saved_sandboxes(&self) -> Result<Vec<SavedSandboxRecord>, StoreError> {
        ask!(self, StateRequest::SavedSandboxes, StateReply::SavedSandboxes(s) => s)
    }

    pub fn put_snapshots(&self, rows: &[SnapshotRow]) -> Result<(), StoreError> {
        ask!(self, StateRequest::PutSnapshots(rows.to_vec()), StateReply::Unit => ())
    }

    pub fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        ask!(self, StateRequest::DeleteSnapshot { id: id.into() }, StateReply::Bool(b) => b)
    }

    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>, StoreError> {
        ask!(self, StateRequest::Snapshots, StateReply::Snapshots(s) => s)
    }

    pub fn put_secret(&self, r: &SealedRow) -> Result<(), StoreError> {
        self.write_secret(r, PutMode::Upsert).map(|_| ())
    }

    pub fn write_secret(&self, r: &SealedRow, mode: PutMode) -> Result<bool, StoreError> {
        ask!(self, StateRequest::PutSecret(r.clone(), mode), StateReply::Bool(b) => b)
    }

    pub fn secret(&self, team: &str, name: &str) -> Result<Option<SealedRow>, StoreError> {
        let req = StateRequest::Secret {
            team: team.into(),
            name: name.into(),
        };
        ask!(self, req, StateReply::Sealed(r) => r)
    }

    pub fn secrets(&self, team: Option<&str>) -> Result<Vec<SealedRow>, StoreError> {
        let req = StateRequest::Secrets {
            team: team.map(Into::into),
        };
        ask!(self, req, StateReply::SealedRows(r) => r)
    }

    pub fn delete_secret(&self, team: &str, name: &str) -> Result<bool, StoreError> {
        let req = StateRequest::DeleteSecret {
            team: team.into(),
            name: name.into(),
        };
        ask!(self, req, StateReply::Bool(b) => b)
    }

    pub fn reseal_secrets(&self, rows: &[SealedRow]) -> Result<(), StoreError> {
        ask!(self, StateRequest::ResealSecrets(rows.to_vec()), StateReply::Unit => ())
    }

    pub fn record_secret_use(&self, u: &SecretUse) -> Result<(), StoreError> {
        ask!(self, StateRequest::RecordSecretUse(u.clone()), StateReply::Unit => ())
    }

    pub fn secret_uses(&self, team: &str, limit: u32) -> Result<Vec<SecretUse>, StoreError> {
        let req = StateRequest::SecretUses {
            team: team.into(),
            limit,
        };
        ask!(self, req, StateReply::Uses(u) => u)
    }

    pub fn put_template(&self, rec: &TemplateRecord) -> Result<Option<TemplateRecord>, StoreError> {
        ask!(self, StateRequest::PutTemplate(Box::new(rec.clone())), StateReply::Template(t) => t.map(|t| *t))
    }

    pub fn template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        ask!(self, StateRequest::Template { name: name.into() }, StateReply::Template(t) => t.map(|t| *t))
    }

    pub fn templates(&self) -> Result<Vec<TemplateRecord>, StoreError> {
        ask!(self, StateRequest::Templates, StateReply::Templates(t) => t)
    }

    pub fn delete_template(&self, name: &str) -> Result<Option<TemplateRecord>, StoreError> {
        let req = StateRequest::DeleteTemplate { name: name.into() };
        ask!(self, req, StateReply::Template(t) => t.map(|t| *t))
    }

    pub fn image_in_use(&self, digest: &str) -> Result<bool, StoreError> {
        let req = StateRequest::ImageInUse {
            digest: digest.into(),
        };
        ask!(self, req, StateReply::Bool(b) => b)
    }

    pub fn ensure_volume(&self, rec: &VolumeRecord) -> Result<VolumeRecord, StoreError> {
        let req = StateRequest::EnsureVolume(rec.clone());
        ask!(self, req, StateReply::Volume(Some(v)) => v)
    }

    pub fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        ask!(self, StateRequest::Volume { id: id.into() }, StateReply::Volume(v) => v)
    }

    pub fn volumes(&self, team: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        ask!(self, StateRequest::Volumes { team: team.into() }, StateReply::Volumes(v) => v)
    }

    pub fn delete_volume(&self, team: &str, name: &str) -> Result<bool, StoreError> {
        let req = StateRequest::DeleteVolume {
            team: team.into(),
            name: name.into(),
        };
        ask!(self, req, StateReply::Bool(b) => b)
    }

    /// Volume `id`'s content token, derived in the helper (which holds the key).
    pub fn volume_token(&self, id: &str) -> Result<String, SecretError> {
        match self.call(StateRequest::VolumeToken { id: id.into() })? {
            StateReply::Token(t) => Ok(t),
            StateReply::Secret(e) => Err(e.into()),
            StateReply::Store(e) => Err(StoreError::from(e).into()),
            other => Err(unexpected(&other).into()),
        }
    }

    /// Seals and stores `team`'s secret `name` (in the helper, which holds the key).
    pub fn seal_secret(
        &self,
        team: &str,
        name: &str,
        value: &[u8],
        mode: PutMode,
        metadata: Option<&Metadata>,
    ) -> Result<(), SecretError> {
        let req = StateRequest::SealSecret {
            team: team.into(),
            name: name.into(),
            value: value.to_vec(),
            mode,
            metadata: metadata.cloned(),
        };
        match self.call(req)? {
            StateReply::Unit => Ok(()),
            StateReply::Secret(e) => Err(e.into()),
            StateReply::Store(e) => Err(StoreError::from(e).into()),
            other => Err(unexpected(&other).into()),
        }
    }

    /// `team`'s secret `name`, opened in the helper.
    pub fn open_secret(&self, team: &str, name: &str) -> Result<Zeroizing<Vec<u8>>, SecretError> {
        let req = StateRequest::OpenSecret {
            team: team.into(),
            name: name.into(),
        };
        match self.call(req)? {
            StateReply::Opened(v) => Ok(Zeroizing::new(v)),
            StateReply::Secret(e) => Err(e.into()),
            StateReply::Store(e) => Err(StoreError::from(e).into()),
            other => Err(unexpected(&other).into()),
        }
    }
}

/// Longest key string the server sends to be authenticated (a husk key is 44 bytes).
const MAX_KEY_BYTES: usize = 256;

/// The files a state helper reads when the server asks, fixed when it starts: the server runs
/// unprivileged and cannot read them itself, and it can name no other.
#[derive(Debug, Clone, Default)]
pub struct HelperFiles {
    /// A node's cluster token file.
    pub cluster_token: Option<PathBuf>,
    /// The listener's certificate chain and key (`--tls-cert`, `--tls-key`).
    pub tls: Option<(PathBuf, PathBuf)>,
}

/// Serves the channels until the server closes them, a thread each.
fn serve(channels: Vec<OwnedFd>, store: &Store, secrets: &Secrets, files: &HelperFiles) {
    rt::serve_channels(
        channels,
        "husk-state",
        |req, fd: Option<OwnedFd>, _| {
            if fd.is_some() {
                let f = Failure::new(
                    FailureKind::InvalidSpec,
                    "a descriptor with a state request",
                );
                return (StateReply::Failed(f), None);
            }
            match (&req, files) {
                (
                    StateRequest::ClusterTokenFile,
                    HelperFiles {
                        cluster_token: Some(path),
                        ..
                    },
                ) => return (read_token_file(path), None),
                (
                    StateRequest::TlsFiles,
                    HelperFiles {
                        tls: Some((cert, key)),
                        ..
                    },
                ) => return (read_tls_files(cert, key), None),
                _ => {}
            }
            (bounded(handle(store, secrets, req)), None)
        },
        |m| {
            StateReply::Failed(Failure::new(
                FailureKind::InvalidSpec,
                format!("bad request: {m}"),
            ))
        },
    );
}

/// `path` read whole and bounded, or why not as the server is told it (`what` and the path).
fn read_operator_file(what: &str, path: &Path, max: usize) -> Result<Vec<u8>, String> {
    operator_files::read(path, max)
        .map(|mut bytes| std::mem::take(&mut *bytes))
        .map_err(|e| format!("{what} {}: {e}", path.display()))
}

/// The cluster token file's text; its path and the error only when it cannot be read.
fn read_token_file(path: &Path) -> StateReply {
    match read_operator_file("cluster token file", path, MAX_TOKEN_FILE) {
        Ok(text) => StateReply::Opened(text),
        Err(e) => StateReply::Store(WireStoreError::Other(e)),
    }
}

/// The listener's certificate chain and key, both read at once; the path and the error when
/// one cannot be read.
fn read_tls_files(cert: &Path, key: &Path) -> StateReply {
    match (
        read_operator_file("--tls-cert", cert, MAX_CERT_FILE),
        read_operator_file("--tls-key", key, MAX_KEY_FILE),
    ) {
        (Ok(cert), Ok(key)) => StateReply::TlsFiles { cert, key },
        (Err(e), _) | (_, Err(e)) => StateReply::Store(WireStoreError::Other(e)),
    }
}

/// A reply that would not fit a frame becomes an error that does.
fn bounded(reply: StateReply) -> StateReply {
    match postcard::to_stdvec(&reply) {
        Ok(b) if b.len() <= rt::MAX_MESSAGE => reply,
        _ => StateReply::Store(WireStoreError::Other(
            "the answer is larger than the state helper's channel carries".into(),
        )),
    }
}

/// One request, against the helper's own store and secrets.
pub fn handle(store: &Store, secrets: &Secrets, req: StateRequest) -> StateReply {
    use StateReply as R;
    use StateRequest as Q;
    let result: Result<StateReply, StoreError> = (|| {
        Ok(match req {
            Q::CreateKey { team, admin, label } => {
                let (k, s) = store.create_key(&team, admin, label.as_deref())?;
                R::Key(k, s)
            }
            Q::Authenticate { presented } => match store.check_key(&presented) {
                Ok(p) => R::Principal(p),
                Err(e) => R::Store((&e).into()),
            },
            Q::ListKeys => R::Keys(store.list_keys()?),
            Q::RevokeKey { id_or_key } => R::Bool(store.revoke_key(&id_or_key)?),
            Q::HasActiveKeys => R::Bool(store.has_active_keys()?),
            Q::RegisterNode { url, capacity } => R::Token(store.register_node(&url, capacity)?),
            Q::NodeHeartbeat { load } => R::Heartbeat(store.node_heartbeat(&load)?),
            Q::SetNodeState { state } => R::Bool(store.set_node_state(state)?),
            Q::Nodes => R::Nodes(store.nodes()?),
            // Answered by `serve` on a node's helper, which has the file.
            Q::ClusterTokenFile => return Err(StoreError::NotClustered),
            // Answered by `serve` on the helper of a listener with a certificate.
            Q::TlsFiles => R::Store(WireStoreError::Other("no --tls-cert was given".into())),
            Q::SetTeamQuota { team, max } => {
                store.set_team_quota(&team, max)?;
                R::Unit
            }
            Q::TeamQuota { team } => R::Quota(store.team_quota(&team)?),
            Q::PutRunRecord {
                table,
                id,
                team,
                batch,
                created_at,
                ended_at,
                record,
            } => {
                super::validate_team(&team)?;
                store.put_run_record(&RunRow {
                    table,
                    id: &id,
                    team: &team,
                    batch: batch.as_deref(),
                    created_at,
                    ended_at,
                    record: &record,
                })?;
                R::Unit
            }
            Q::RunRecord { table, team, id } => R::Record(store.run_record(table, &team, &id)?),
            Q::RunRecords {
                table,
                team,
                batch,
                limit,
            } => R::Records(store.run_records(table, &team, batch.as_deref(), limit)?),
            Q::UnfinishedRuns => R::Unfinished(store.unfinished_runs()?),
            Q::PruneRecords { before } => R::Count(store.prune_records(before)?),
            Q::InsertSandbox(rec) => {
                super::validate_team(&rec.team)?;
                store.insert_sandbox(&rec)?;
                R::Unit
            }
            Q::UpdateSandboxEnd { id, end_at } => R::Bool(store.update_sandbox_end(&id, end_at)?),
            Q::DeleteSandbox { id } => R::Bool(store.delete_sandbox(&id)?),
            Q::ListSandboxes => R::Sandboxes(store.list_sandboxes()?),
            Q::UpdateSandboxDescription {
                id,
                end_at,
                description,
            } => R::Bool(store.update_sandbox_description(&id, end_at, &description)?),
            Q::MarkSandboxLost { id, reason, at } => {
                R::Bool(store.mark_sandbox_lost(&id, &reason, at)?)
            }
            Q::LostSandboxes { team, id } => {
                R::Lost(store.lost_sandboxes(team.as_deref(), id.as_deref())?)
            }
            Q::PruneLostSandboxes { before } => {
                R::Count(store.prune_lost_sandboxes(before)? as u64)
            }
            Q::PutSavedSandbox(r) => {
                store.put_saved_sandbox(&r)?;
                R::Unit
            }
            Q::DeleteSavedSandbox { id } => R::Bool(store.delete_saved_sandbox(&id)?),
            Q::SavedSandboxes => R::SavedSandboxes(store.saved_sandboxes()?),
            Q::PutSnapshots(rows) => {
                for r in &rows {
                    super::validate_team(&r.team)?;
                }
                store.put_snapshots(&rows)?;
                R::Unit
            }
            Q::DeleteSnapshot { id } => R::Bool(store.delete_snapshot(&id)?),
            Q::Snapshots => R::Snapshots(store.snapshots()?),
            Q::PutSecret(row, mode) => {
                super::validate_team(&row.team)?;
                R::Bool(store.write_secret(&row, mode)?)
            }
            Q::Secret { team, name } => R::Sealed(store.secret(&team, &name)?),
            Q::Secrets { team } => R::SealedRows(store.secrets(team.as_deref())?),
            Q::DeleteSecret { team, name } => R::Bool(store.delete_secret(&team, &name)?),
            Q::ResealSecrets(rows) => {
                store.reseal_secrets(&rows)?;
                R::Unit
            }
            Q::RecordSecretUse(u) => {
                store.record_secret_use(&u)?;
                R::Unit
            }
            Q::SecretUses { team, limit } => R::Uses(store.secret_uses(&team, limit)?),
            Q::PutTemplate(rec) => R::Template(store.put_template(&rec)?.map(Box::new)),
            Q::Template { name } => R::Template(store.template(&name)?.map(Box::new)),
            Q::Templates => R::Templates(store.templates()?),
            Q::DeleteTemplate { name } => R::Template(store.delete_template(&name)?.map(Box::new)),
            Q::ImageInUse { digest } => R::Bool(store.image_in_use(&digest)?),
            Q::EnsureVolume(rec) => {
                super::validate_team(&rec.team)?;
                R::Volume(Some(store.ensure_volume(&rec)?))
            }
            Q::Volume { id } => R::Volume(store.volume(&id)?),
            Q::Volumes { team } => R::Volumes(store.volumes(&team)?),
            Q::DeleteVolume { team, name } => R::Bool(store.delete_volume(&team, &name)?),
            Q::VolumeToken { id } => match secrets.volume_token(&id) {
                Ok(t) => R::Token(t),
                Err(e) => R::Secret((&e).into()),
            },
            Q::SealSecret {
                team,
                name,
                value,
                mode,
                metadata,
            } => match secrets.write(&team, &name, &value, mode, metadata.as_ref()) {
                Ok(()) => R::Unit,
                Err(e) => R::Secret((&e).into()),
            },
            Q::OpenSecret { team, name } => match secrets.get(&team, &name) {
                Ok(v) => R::Opened(v.to_vec()),
                Err(e) => R::Secret((&e).into()),
            },
        })
    })();
    match result {
        Ok(r) => r,
        Err(e) => R::Store((&e).into()),
    }
}

/// The helper's reading of one request frame, for husk's fuzz targets (`fuzz/`). Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Decodes `datagram` as the helper does and handles it against `store` and `secrets`
    /// (the fuzz target's own, in memory); returns the request encoded again and the reply.
    pub fn request(
        datagram: &[u8],
        store: &Store,
        secrets: &Secrets,
    ) -> Option<(Vec<u8>, StateReply)> {
        let req: StateRequest = postcard::from_bytes(datagram).ok()?;
        let encoded = postcard::to_stdvec(&req).expect("a decoded request encodes");
        Some((encoded, bounded(handle(store, secrets, req))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::MasterKeys;

    /// A state helper served on a thread of this process (a test cannot fork), over a store
    /// in memory and a master key in a scratch directory; and the server's side of it.
    struct Pair {
        remote: Arc<RemoteStore>,
        /// The helper's own secrets, with the key (what the server never holds).
        secrets: Arc<Secrets>,
        _dir: std::path::PathBuf,
        threads: Vec<std::thread::JoinHandle<()>>,
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            self.remote.channels.close();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
            let _ = std::fs::remove_dir_all(&self._dir);
        }
    }

    fn pair() -> Pair {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "husk-state-helper-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let store = Arc::new(Store::open_in_memory().unwrap());
        let keys = MasterKeys::load(&dir.join("master.key")).unwrap();
        let secrets = Arc::new(Secrets::new(store.clone(), keys));
        let mut ours = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (a, b) = husk_runtime::sys::stream_pair().unwrap();
            ours.push(a);
            let (store, secrets) = (store.clone(), secrets.clone());
            let files = HelperFiles {
                cluster_token: Some(dir.join("cluster-token")),
                tls: Some((dir.join("tls.crt"), dir.join("tls.key"))),
            };
            threads.push(std::thread::spawn(move || {
                serve(vec![b], &store, &secrets, &files)
            }));
        }
        Pair {
            remote: Arc::new(RemoteStore {
                channels: Channels::new("state", ours),
                pid: 0,
                spare: std::sync::Mutex::new(None),
            }),
            secrets,
            _dir: dir,
            threads,
        }
    }

    #[test]
    fn the_helper_reads_the_cluster_token_file_it_was_given_and_only_that() {
        let p = pair();
        let file = p._dir.join("cluster-token");
        assert!(matches!(
            p.remote.cluster_token_file(),
            Err(StoreError::Remote(m)) if m.contains("cluster-token") && m.contains("No such file")
        ));
        std::fs::write(&file, "one\n").unwrap();
        assert_eq!(p.remote.cluster_token_file().unwrap().as_slice(), b"one\n");
        std::fs::write(&file, "one\ntwo\n").unwrap();
        assert_eq!(
            p.remote.cluster_token_file().unwrap().as_slice(),
            b"one\ntwo\n"
        );
        std::fs::write(&file, vec![b'a'; MAX_TOKEN_FILE + 1]).unwrap();
        assert!(p.remote.cluster_token_file().is_err(), "bounded");
        // A helper without a file (a server of its own) has nothing to read.
        let store = Store::open_in_memory().unwrap();
        let reply = handle(&store, &p.secrets, StateRequest::ClusterTokenFile);
        assert_eq!(reply, StateReply::Store(WireStoreError::NotClustered));
    }

    #[test]
    fn the_helper_reads_the_certificate_and_key_it_was_given_both_at_once_and_bounded() {
        let p = pair();
        let (cert, key) = (p._dir.join("tls.crt"), p._dir.join("tls.key"));
        std::fs::write(&cert, "CERT").unwrap();
        assert!(matches!(
            p.remote.tls_files(),
            Err(StoreError::Remote(m)) if m.contains("tls.key") && m.contains("No such file")
        ));
        std::fs::write(&key, "KEY").unwrap();
        let (c, k) = p.remote.tls_files().unwrap();
        assert_eq!((c.as_slice(), k.as_slice()), (&b"CERT"[..], &b"KEY"[..]));
        std::fs::write(&cert, vec![b'a'; MAX_CERT_FILE]).unwrap();
        assert_eq!(p.remote.tls_files().unwrap().0.len(), MAX_CERT_FILE);
        std::fs::write(&cert, vec![b'a'; MAX_CERT_FILE + 1]).unwrap();
        assert!(matches!(
            p.remote.tls_files(),
            Err(StoreError::Remote(m)) if m.contains("larger than")
        ));
        std::fs::write(&key, vec![b'a'; MAX_KEY_FILE + 1]).unwrap();
        std::fs::write(&cert, "CERT").unwrap();
        assert!(p.remote.tls_files().is_err(), "the key is bounded too");
        // A helper given no files (a listener without TLS) reads nothing.
        let store = Store::open_in_memory().unwrap();
        let reply = handle(&store, &p.secrets, StateRequest::TlsFiles);
        assert!(
            matches!(reply, StateReply::Store(WireStoreError::Other(m)) if m.contains("--tls-cert"))
        );
    }

    #[test]
    fn the_store_works_the_same_through_the_helper() {
        let p = pair();
        let store = Store::remote(p.remote.clone());
        assert!(!store.has_active_keys().unwrap());
        let (info, key) = store.create_key("team-a", false, Some("ci")).unwrap();
        assert_eq!(info.team, "team-a");
        let who = store.authenticate(&key).expect("the key authenticates");
        assert_eq!((who.team.as_str(), who.admin), ("team-a", false));
        assert!(store.authenticate("e2b_0000").is_none());
        // A "key" of a megabyte is not even sent.
        assert!(store.authenticate(&"x".repeat(1 << 20)).is_none());
        let listed = store.list_keys().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!((&listed[0].id, &listed[0].label), (&info.id, &info.label));
        // The authentication above was recorded in the helper's database.
        assert!(listed[0].last_used_at.is_some());
        store.set_team_quota("team-a", Some(3)).unwrap();
        assert_eq!(store.team_quota("team-a").unwrap(), Some(3));
        assert!(store.revoke_key(&info.id).unwrap());
        assert!(store.authenticate(&key).is_none());
        // Errors keep their type across the channel.
        let err = store.create_key("Not A Team", false, None).unwrap_err();
        assert!(matches!(err, StoreError::InvalidTeam(_)), "{err}");
        let err = store
            .create_key("team-a", false, Some("bad\u{7}label"))
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidLabel), "{err}");
        // Records of runs, sandboxes and templates round-trip whole.
        let now = OffsetDateTime::now_utc();
        let big = "r".repeat(200 << 10);
        store
            .put_run_record(&RunRow {
                table: RunTable::Runs,
                id: "run-1",
                team: "team-a",
                batch: None,
                created_at: now,
                ended_at: None,
                record: &big,
            })
            .unwrap();
        assert_eq!(
            store
                .run_record(RunTable::Runs, "team-a", "run-1")
                .unwrap()
                .as_deref(),
            Some(big.as_str())
        );
        assert_eq!(
            store.run_record(RunTable::Runs, "team-b", "run-1").unwrap(),
            None
        );
        assert_eq!(store.unfinished_runs().unwrap().len(), 1);
        let rec = SandboxRecord {
            id: "sb".into(),
            team: "team-a".into(),
            template: "base".into(),
            runtime_id: "s1-x".into(),
            created_at: now,
            end_at: now,
            metadata: [("k".to_string(), "v".to_string())].into(),
            description: Some("{}".into()),
        };
        store.insert_sandbox(&rec).unwrap();
        let err = store.insert_sandbox(&rec).unwrap_err();
        assert!(matches!(err, StoreError::SandboxExists(_)), "{err}");
        let listed = store.list_sandboxes().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].metadata, rec.metadata);
        let now2 = now + time::Duration::seconds(1);
        assert!(store
            .mark_sandbox_lost(&rec.id, "the server stopped", now2)
            .unwrap());
        assert!(store.list_sandboxes().unwrap().is_empty());
        let lost = store
            .lost_sandboxes(Some(&rec.team), Some(&rec.id))
            .unwrap();
        assert_eq!(
            (lost.len(), lost[0].reason.as_str()),
            (1, "the server stopped")
        );
        assert!(store
            .lost_sandboxes(Some("other"), None)
            .unwrap()
            .is_empty());
        assert_eq!(
            store
                .prune_lost_sandboxes(now2 + time::Duration::seconds(1))
                .unwrap(),
            1
        );
    }

    #[test]
    fn secrets_are_sealed_and_opened_in_the_helper() {
        let p = pair();
        let store = Arc::new(Store::remote(p.remote.clone()));
        let secrets = Secrets::remote(store.clone());
        secrets.set("team-a", "OPENAI_KEY", b"sk-123").unwrap();
        assert_eq!(&*secrets.get("team-a", "OPENAI_KEY").unwrap(), b"sk-123");
        // What the server's store sees is sealed.
        let row = store.secret("team-a", "OPENAI_KEY").unwrap().unwrap();
        assert!(!row.ciphertext.windows(6).any(|w| w == b"sk-123"));
        // Another team's name is not found; typed errors cross.
        let err = secrets.get("team-b", "OPENAI_KEY").unwrap_err();
        assert!(matches!(err, SecretError::NotFound(_)), "{err}");
        let err = secrets.set("team-a", "bad name", b"x").unwrap_err();
        assert!(matches!(err, SecretError::InvalidName(_)), "{err}");
        let err = secrets.set("team-a", "NUL", b"a\0b").unwrap_err();
        assert!(matches!(err, SecretError::Nul(_)), "{err}");
        // The server holds no key: rotation is refused here.
        assert!(matches!(
            secrets.rotate(),
            Err(SecretError::MasterKey { .. })
        ));
        let mut env = vec![("K".to_string(), "husk-secret://OPENAI_KEY".to_string())];
        let inj = secrets.inject("team-a", &[], &mut env).unwrap();
        assert_eq!(inj.env, vec![("K".to_string(), "sk-123".to_string())]);
    }

    #[test]
    fn volumes_are_recorded_and_their_tokens_derived_in_the_helper() {
        let p = pair();
        let store = Arc::new(Store::remote(p.remote.clone()));
        let secrets = Secrets::remote(store.clone());
        let rec = VolumeRecord {
            id: "vol_a".into(),
            team: "team-a".into(),
            name: "data".into(),
            created_at: OffsetDateTime::now_utc(),
        };
        assert_eq!(store.ensure_volume(&rec).unwrap().id, "vol_a");
        // A second id for the same name is not recorded: the first is the volume's.
        let again = VolumeRecord {
            id: "vol_b".into(),
            ..rec.clone()
        };
        assert_eq!(store.ensure_volume(&again).unwrap().id, "vol_a");
        assert_eq!(store.volume("vol_a").unwrap().unwrap().name, "data");
        assert_eq!(store.volume("vol_b").unwrap(), None);
        assert_eq!(store.volumes("team-a").unwrap().len(), 1);
        assert!(store.volumes("team-b").unwrap().is_empty());
        // Tokens: the same through the helper as with the key in hand, one per id.
        let token = secrets.volume_token("vol_a").unwrap();
        assert_eq!(token, p.secrets.volume_token("vol_a").unwrap());
        assert_ne!(token, secrets.volume_token("vol_b").unwrap());
        assert!(token.starts_with(crate::secrets::VOLUME_TOKEN_PREFIX));
        assert!(store.delete_volume("team-a", "data").unwrap());
        assert!(!store.delete_volume("team-a", "data").unwrap());
        // A team name no key could have is refused.
        let bad = VolumeRecord {
            team: "../etc".into(),
            ..rec
        };
        let err = store.ensure_volume(&bad).unwrap_err();
        assert!(matches!(err, StoreError::InvalidTeam(_)), "{err}");
    }

    #[test]
    fn hostile_requests_are_checked_and_a_gone_helper_is_told() {
        let p = pair();
        // A record for a team name no key could have.
        let err = p
            .remote
            .put_run_record(&RunRow {
                table: RunTable::Runs,
                id: "x",
                team: "../etc",
                batch: None,
                created_at: OffsetDateTime::now_utc(),
                ended_at: None,
                record: "{}",
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidTeam(_)), "{err}");
        // A reply too large for the channel is an error that fits.
        let reply = bounded(StateReply::Records(vec!["x".repeat(rt::MAX_MESSAGE)]));
        assert!(
            matches!(reply, StateReply::Store(WireStoreError::Other(_))),
            "{reply:?}"
        );
        drop(p);
        let p = pair();
        p.remote.channels.close();
        let err = p.remote.list_keys().unwrap_err();
        assert!(
            matches!(err, StoreError::Helper(HelperError::Gone("state"))),
            "{err}"
        );
    }
}
