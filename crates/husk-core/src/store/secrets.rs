//! Rows of the `secrets` table: sealed values only (see `crate::secrets` for the sealing).

use std::collections::BTreeMap;

use rusqlite::{params, OptionalExtension};
use time::OffsetDateTime;

use super::{from_db_time, to_db_time, Sqlite, StoreError};

/// A sealed secret as stored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SealedRow {
    pub team: String,
    pub name: String,
    pub key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    /// 1 when made, one more with each new value (E2B's `currentVersion`). Ignored on writes.
    pub version: u64,
    /// The customer's metadata (E2B's secret API). On a write, `None` keeps what is stored
    /// (nothing, for a new secret); rows read always have it.
    pub metadata: Option<BTreeMap<String, String>>,
}

/// What a write of a secret may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PutMode {
    /// Make it, or give it a new value.
    Upsert,
    /// Make it; one of that name already there is left alone (and the write says so).
    Create,
    /// Give it a new value; a missing one is not made (and the write says so).
    Update,
}

pub(super) type Parts = (SealedRow, i64, i64, i64, String);

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Parts> {
    Ok((
        SealedRow {
            team: r.get(0)?,
            name: r.get(1)?,
            key_id: r.get(2)?,
            nonce: r.get(3)?,
            ciphertext: r.get(4)?,
            created_at: OffsetDateTime::UNIX_EPOCH,
            updated_at: OffsetDateTime::UNIX_EPOCH,
            version: 1,
            metadata: None,
        },
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

pub(super) fn finish(parts: Parts) -> Result<SealedRow, StoreError> {
    let (mut r, c, u, version, metadata) = parts;
    r.created_at = from_db_time(c)?;
    r.updated_at = from_db_time(u)?;
    r.version = u64::try_from(version)
        .map_err(|_| StoreError::Corrupt(format!("secret {} version", r.name)))?;
    r.metadata = Some(
        serde_json::from_str(&metadata)
            .map_err(|e| StoreError::Corrupt(format!("secret {} metadata: {e}", r.name)))?,
    );
    Ok(r)
}

pub(super) const COLUMNS: &str =
    "team, name, key_id, nonce, ciphertext, created_at, updated_at, version, metadata";

pub(super) fn metadata_json(r: &SealedRow) -> Result<Option<String>, StoreError> {
    r.metadata
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Corrupt(format!("secret {} metadata: {e}", r.name)))
}

impl Sqlite {
    /// Inserts or replaces a sealed secret (its creation time is kept on replace).
    pub fn put_secret(&self, r: &SealedRow) -> Result<(), StoreError> {
        self.write_secret(r, PutMode::Upsert).map(|_| ())
    }

    /// Writes a sealed secret as `mode` says: a new value counts a new version, and the
    /// metadata is replaced when the row carries some. Whether anything was written (a
    /// `Create` of a name taken, an `Update` of a missing one: nothing).
    pub fn write_secret(&self, r: &SealedRow, mode: PutMode) -> Result<bool, StoreError> {
        let created = to_db_time(r.created_at)?;
        let updated = to_db_time(r.updated_at)?;
        let metadata = metadata_json(r)?;
        let conn = self.conn();
        let n = match mode {
            PutMode::Upsert | PutMode::Create => {
                let on_conflict = if mode == PutMode::Upsert {
                    "DO UPDATE SET key_id = excluded.key_id, nonce = excluded.nonce,
                       ciphertext = excluded.ciphertext, updated_at = excluded.updated_at,
                       version = secrets.version + 1, metadata = coalesce(?8, secrets.metadata)"
                } else {
                    "DO NOTHING"
                };
                conn.execute(
                    &format!(
                        "INSERT INTO secrets (team, name, key_id, nonce, ciphertext, created_at,
                           updated_at, metadata)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, coalesce(?8, '{{}}'))
                         ON CONFLICT(team, name) {on_conflict}"
                    ),
                    params![
                        r.team,
                        r.name,
                        r.key_id,
                        r.nonce,
                        r.ciphertext,
                        created,
                        updated,
                        metadata
                    ],
                )?
            }
            PutMode::Update => conn.execute(
                "UPDATE secrets SET key_id = ?3, nonce = ?4, ciphertext = ?5, updated_at = ?6,
                   version = version + 1, metadata = coalesce(?7, metadata)
                 WHERE team = ?1 AND name = ?2",
                params![
                    r.team,
                    r.name,
                    r.key_id,
                    r.nonce,
                    r.ciphertext,
                    updated,
                    metadata
                ],
            )?,
        };
        Ok(n > 0)
    }

    /// One sealed secret of `team`.
    pub fn secret(&self, team: &str, name: &str) -> Result<Option<SealedRow>, StoreError> {
        let conn = self.reader();
        let found = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM secrets WHERE team = ?1 AND name = ?2"
            ))?
            .query_row(params![team, name], row)
            .optional()?;
        drop(conn);
        found.map(finish).transpose()
    }

    /// `team`'s secrets by name (`None`: every team's, for key rotation).
    pub fn secrets(&self, team: Option<&str>) -> Result<Vec<SealedRow>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM secrets WHERE ?1 IS NULL OR team = ?1 ORDER BY team, name"
        ))?;
        let rows = stmt
            .query_map(params![team], row)?
            .collect::<Result<Vec<_>, _>>()?;
        drop(stmt);
        drop(conn);
        rows.into_iter().map(finish).collect()
    }

    /// Deletes one; whether it existed.
    pub fn delete_secret(&self, team: &str, name: &str) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM secrets WHERE team = ?1 AND name = ?2",
            params![team, name],
        )?;
        Ok(n > 0)
    }

    /// Replaces every row's seal in one transaction (key rotation): all or nothing.
    pub fn reseal_secrets(&self, rows: &[SealedRow]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        for r in rows {
            tx.execute(
                "UPDATE secrets SET key_id = ?3, nonce = ?4, ciphertext = ?5
                 WHERE team = ?1 AND name = ?2",
                params![r.team, r.name, r.key_id, r.nonce, r.ciphertext],
            )?;
        }
        tx.commit()?;
        Ok(())
    }
}

/// One use of a secret: which secret went into which sandbox's process (never the value).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SecretUse {
    pub at: OffsetDateTime,
    pub team: String,
    pub secret: String,
    pub sandbox: String,
    /// The command it was injected into (its program name).
    pub command: String,
}

impl Sqlite {
    /// Records a use of a secret.
    pub fn record_secret_use(&self, u: &SecretUse) -> Result<(), StoreError> {
        let at = to_db_time(u.at)?;
        self.conn()
            .prepare_cached(
                "INSERT INTO secret_uses (at, team, secret, sandbox, command)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![at, u.team, u.secret, u.sandbox, u.command])?;
        Ok(())
    }

    /// `team`'s most recent uses of secrets, newest first.
    pub fn secret_uses(&self, team: &str, limit: u32) -> Result<Vec<SecretUse>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(
            "SELECT at, team, secret, sandbox, command FROM secret_uses
             WHERE team = ?1 ORDER BY at DESC LIMIT ?2",
        )?;
        let rows = stmt
            .query_map(params![team, limit], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        drop(stmt);
        drop(conn);
        rows.into_iter()
            .map(|(at, team, secret, sandbox, command)| {
                Ok(SecretUse {
                    at: from_db_time(at)?,
                    team,
                    secret,
                    sandbox,
                    command,
                })
            })
            .collect()
    }
}
