//! Volumes: E2B's name for husk's workspaces. A volume *is* a team's workspace (its files,
//! its quota, its mounts: `volume_mounts` and `workspaces` mount the same thing); what the
//! volume API adds is an id to address it by and a token that opens its content without an
//! API key.
//!
//! - **Id**: `vol_` and 20 random characters, recorded in the store ([`VolumeRecord`]) the
//!   first time the volume API creates or sees the workspace (a workspace made by husk's own
//!   API or CLI gets one when it is first listed or read). Ids are global: the content API
//!   finds the team from the id.
//! - **Token**: derived from the id under the master key ([`Secrets::volume_token`]), never
//!   stored, compared in constant time. It opens that volume only, for as long as the volume
//!   keeps its id.
//! - **Identity follows the workspace**: deleting the workspace (through any API, or the CLI)
//!   forgets the id, and a workspace made again under the same name gets a new id and so a
//!   new token; a record whose workspace is gone is found stale and dropped when next used.

use std::sync::Arc;

use subtle::ConstantTimeEq;
use time::OffsetDateTime;

use crate::secrets::{SecretError, Secrets};
use crate::store::{Store, StoreError, VolumeRecord};
use crate::workspaces::{WorkspaceError, Workspaces};

/// How volume ids start.
pub const ID_PREFIX: &str = "vol_";

/// Longest id the store keeps (its `volumes` table checks it too).
pub const MAX_ID_LEN: usize = 64;

/// Errors of the volume API.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// No volume of the caller's team has this id (another team's is the same answer).
    #[error("volume '{0}' not found")]
    NotFound(String),
    /// The content API's token is missing or is not this volume's.
    #[error("invalid volume token: use the token the volume API gave for this volume")]
    BadToken,
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// No random id could be made (the kernel's generator failed).
    #[error("cannot make a volume id: {0}")]
    Id(String),
}

/// A volume with its content token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    pub record: VolumeRecord,
    pub token: String,
}

/// The volume API over the store (ids), the secrets (tokens) and the workspaces (files).
pub struct Volumes {
    store: Arc<Store>,
    secrets: Arc<Secrets>,
    workspaces: Arc<Workspaces>,
}

impl Volumes {
    pub fn new(store: Arc<Store>, secrets: Arc<Secrets>, workspaces: Arc<Workspaces>) -> Volumes {
        Volumes {
            store,
            secrets,
            workspaces,
        }
    }

    /// The workspaces the volumes are.
    pub fn workspaces(&self) -> &Workspaces {
        &self.workspaces
    }

    /// Creates `team`'s volume `name`: a new, empty workspace with a new id.
    /// [`WorkspaceError::AlreadyExists`] when the name is taken.
    pub fn create(&self, team: &str, name: &str) -> Result<Volume, VolumeError> {
        self.workspaces.create(team, name)?;
        // The workspace did not exist a moment ago: any record of that name is stale.
        let recorded = self
            .store
            .delete_volume(team, name)
            .map_err(VolumeError::from)
            .and_then(|_| Ok(self.store.ensure_volume(&new_record(team, name)?)?));
        match recorded {
            Ok(record) => self.with_token(record),
            Err(e) => {
                // No volume without its id: the workspace goes again.
                let _ = self.workspaces.delete(team, name);
                Err(e)
            }
        }
    }

    /// `team`'s volumes, by name: every workspace of the team (one without an id gets one).
    pub fn list(&self, team: &str) -> Result<Vec<VolumeRecord>, VolumeError> {
        // Names only: a listing must not walk every volume's tree.
        let names = self.workspaces.names(team)?;
        let mut records = self.store.volumes(team)?;
        for stale in records.iter().filter(|r| !names.contains(&r.name)) {
            self.store.delete_volume(team, &stale.name)?;
        }
        records.retain(|r| names.contains(&r.name));
        let unrecorded: Vec<&String> = names
            .iter()
            .filter(|n| !records.iter().any(|r| &r.name == *n))
            .collect();
        for name in unrecorded {
            records.push(self.store.ensure_volume(&new_record(team, name)?)?);
        }
        records.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(records)
    }

    /// `team`'s volume `id`, with its token.
    pub fn get(&self, team: &str, id: &str) -> Result<Volume, VolumeError> {
        let record = self.live(id)?;
        if record.team != team {
            return Err(VolumeError::NotFound(id.to_string()));
        }
        self.with_token(record)
    }

    /// Deletes `team`'s volume `id` and everything in it.
    pub fn destroy(&self, team: &str, id: &str) -> Result<(), VolumeError> {
        let record = self.get(team, id)?.record;
        match self.workspaces.delete(team, &record.name) {
            Ok(()) | Err(WorkspaceError::NotFound(_)) => {}
            Err(e) => return Err(e.into()),
        }
        self.store.delete_volume(team, &record.name)?;
        Ok(())
    }

    /// The volume `token` opens, if it is volume `id`'s (the content API's check): the
    /// token first (a wrong one says nothing of whether the id exists), then the volume.
    pub fn authorize(&self, id: &str, token: &str) -> Result<VolumeRecord, VolumeError> {
        // No id is longer (the store refuses them): no need to ask the state helper.
        if id.len() > MAX_ID_LEN || token.len() > MAX_ID_LEN * 2 {
            return Err(VolumeError::BadToken);
        }
        let expected = self.secrets.volume_token(id)?;
        if !bool::from(expected.as_bytes().ct_eq(token.as_bytes())) {
            return Err(VolumeError::BadToken);
        }
        self.live(id)
    }

    /// Forgets the id of `team`'s workspace `name` (it was deleted or made anew by husk's own
    /// API): the next use gives it a new id, and so a new token.
    pub fn forget(&self, team: &str, name: &str) -> Result<(), VolumeError> {
        self.store.delete_volume(team, name)?;
        Ok(())
    }

    /// The record of `id`, if its workspace still exists (a stale record is dropped).
    fn live(&self, id: &str) -> Result<VolumeRecord, VolumeError> {
        let record = self
            .store
            .volume(id)?
            .ok_or_else(|| VolumeError::NotFound(id.to_string()))?;
        match self.workspaces.dir(&record.team, &record.name) {
            Ok(_) => Ok(record),
            Err(WorkspaceError::NotFound(_)) => {
                self.store.delete_volume(&record.team, &record.name)?;
                Err(VolumeError::NotFound(id.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    fn with_token(&self, record: VolumeRecord) -> Result<Volume, VolumeError> {
        let token = self.secrets.volume_token(&record.id)?;
        Ok(Volume { record, token })
    }
}

/// Forgets the id of `team`'s workspace `name` in the store of `state_dir`: for the CLI, which
/// creates and deletes workspaces next to a running server.
pub fn forget_in(state_dir: &std::path::Path, team: &str, name: &str) -> Result<(), StoreError> {
    Store::open(state_dir)?
        .delete_volume(team, name)
        .map(|_| ())
}

/// A record with a new id: `vol_` and 20 characters of `[a-z0-9]`, as sandbox ids.
fn new_record(team: &str, name: &str) -> Result<VolumeRecord, VolumeError> {
    let tail = crate::manager::new_sandbox_id().map_err(|e| VolumeError::Id(e.to_string()))?;
    Ok(VolumeRecord {
        id: format!("{ID_PREFIX}{tail}"),
        team: team.to_string(),
        name: name.to_string(),
        created_at: OffsetDateTime::now_utc(),
    })
}

#[cfg(test)]
mod tests;
