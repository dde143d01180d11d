//! The record of live sandboxes: written when a sandbox is created, removed when it is
//! destroyed, and marked lost (kept a while, for its team to learn what became of it) when
//! it ended with the server that ran it.

use std::collections::BTreeMap;

use rusqlite::{ffi, params};
use time::OffsetDateTime;

use super::{
    from_db_time, to_db_time, LostSandbox, SandboxRecord, SavedSandboxRecord, SnapshotRow, Sqlite,
    StoreError,
};

/// The columns of a sandbox's record, in [`record_of`]'s order.
pub(super) const RECORD_COLUMNS: &str =
    "id, team, template, runtime_id, created_at, end_at, metadata, description";

/// A record from a row whose first columns are [`RECORD_COLUMNS`].
fn record_of(row: &rusqlite::Row<'_>) -> Result<SandboxRecord, StoreError> {
    record_from(RecordColumns {
        id: row.get(0)?,
        team: row.get(1)?,
        template: row.get(2)?,
        runtime_id: row.get(3)?,
        created_at: row.get(4)?,
        end_at: row.get(5)?,
        metadata: row.get(6)?,
        description: row.get(7)?,
    })
}

/// [`RECORD_COLUMNS`] as either database returns them.
pub(super) struct RecordColumns {
    pub(super) id: String,
    pub(super) team: String,
    pub(super) template: String,
    pub(super) runtime_id: String,
    pub(super) created_at: i64,
    pub(super) end_at: i64,
    /// A JSON object of strings.
    pub(super) metadata: String,
    pub(super) description: Option<String>,
}

/// The record those columns hold: times decoded, metadata parsed.
pub(super) fn record_from(c: RecordColumns) -> Result<SandboxRecord, StoreError> {
    let metadata: BTreeMap<String, String> = serde_json::from_str(&c.metadata)
        .map_err(|e| StoreError::Corrupt(format!("metadata of sandbox {:?}: {e}", c.id)))?;
    Ok(SandboxRecord {
        team: c.team,
        template: c.template,
        runtime_id: c.runtime_id,
        created_at: from_db_time(c.created_at)?,
        end_at: from_db_time(c.end_at)?,
        metadata,
        description: c.description,
        id: c.id,
    })
}

impl Sqlite {
    /// Records a new sandbox. Its id must not be recorded already.
    pub fn insert_sandbox(&self, record: &SandboxRecord) -> Result<(), StoreError> {
        // A map of strings always serialises; the error arm is only there to avoid a panic path.
        let metadata = serde_json::to_string(&record.metadata)
            .map_err(|e| StoreError::Corrupt(format!("metadata: {e}")))?;
        let created_at = to_db_time(record.created_at)?;
        let end_at = to_db_time(record.end_at)?;
        let conn = self.conn();
        let inserted = conn
            .prepare_cached(
                "INSERT INTO sandboxes
                    (id, team, template, runtime_id, created_at, end_at, metadata, description)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            )?
            .execute(params![
                record.id,
                record.team,
                record.template,
                record.runtime_id,
                created_at,
                end_at,
                metadata,
                record.description
            ]);
        match inserted {
            Ok(_) => Ok(()),
            Err(e)
                if e.sqlite_error().map(|e| e.extended_code)
                    == Some(ffi::SQLITE_CONSTRAINT_PRIMARYKEY) =>
            {
                Err(StoreError::SandboxExists(record.id.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Moves a sandbox's end (its timeout was changed). Returns whether it is recorded.
    pub fn update_sandbox_end(&self, id: &str, end_at: OffsetDateTime) -> Result<bool, StoreError> {
        let end_at = to_db_time(end_at)?;
        let changed = self
            .conn()
            .prepare_cached("UPDATE sandboxes SET end_at = ?2 WHERE id = ?1")?
            .execute(params![id, end_at])?;
        Ok(changed > 0)
    }

    /// Replaces a live sandbox's description (see [`SandboxRecord::description`]) and end.
    /// Returns whether it is recorded (and live).
    pub fn update_sandbox_description(
        &self,
        id: &str,
        end_at: OffsetDateTime,
        description: &str,
    ) -> Result<bool, StoreError> {
        let end_at = to_db_time(end_at)?;
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE sandboxes SET end_at = ?2, description = ?3
                 WHERE id = ?1 AND lost_at IS NULL",
            )?
            .execute(params![id, end_at, description])?;
        Ok(changed > 0)
    }

    /// Forgets a destroyed sandbox. Returns whether it was recorded.
    pub fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached("DELETE FROM sandboxes WHERE id = ?1")?
            .execute([id])?;
        Ok(changed > 0)
    }

    /// Every live recorded sandbox (not lost), oldest first.
    pub fn list_sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare(&format!(
            "SELECT {RECORD_COLUMNS} FROM sandboxes WHERE lost_at IS NULL ORDER BY created_at, id"
        ))?;
        let mut rows = stmt.query([])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(record_of(row)?);
        }
        Ok(out)
    }

    /// Marks one live sandbox lost. Returns whether it was recorded (and live).
    pub fn mark_sandbox_lost(
        &self,
        id: &str,
        reason: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let at = to_db_time(at)?;
        let changed = self
            .conn()
            .prepare_cached(
                "UPDATE sandboxes SET lost_at = ?2, lost_reason = ?3
                 WHERE lost_at IS NULL AND id = ?1",
            )?
            .execute(params![id, at, reason])?;
        Ok(changed > 0)
    }

    /// The lost sandboxes of `team` (every team's: `None`), or only `id`, most recently lost
    /// first.
    pub fn lost_sandboxes(
        &self,
        team: Option<&str>,
        id: Option<&str>,
    ) -> Result<Vec<LostSandbox>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {RECORD_COLUMNS}, lost_at, lost_reason FROM sandboxes
             WHERE lost_at IS NOT NULL AND (?1 IS NULL OR team = ?1) AND (?2 IS NULL OR id = ?2)
             ORDER BY lost_at DESC, id"
        ))?;
        let mut rows = stmt.query(params![team, id])?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            out.push(LostSandbox {
                record: record_of(row)?,
                lost_at: from_db_time(row.get(8)?)?,
                reason: row.get::<_, Option<String>>(9)?.unwrap_or_default(),
            });
        }
        Ok(out)
    }

    /// Forgets the sandboxes lost before `before`. Returns how many.
    pub fn prune_lost_sandboxes(&self, before: OffsetDateTime) -> Result<usize, StoreError> {
        let before = to_db_time(before)?;
        Ok(self.conn().execute(
            "DELETE FROM sandboxes WHERE lost_at IS NOT NULL AND lost_at < ?1",
            params![before],
        )?)
    }

    /// Records (or replaces) a sandbox kept beyond its processes.
    pub fn put_saved_sandbox(&self, record: &SavedSandboxRecord) -> Result<(), StoreError> {
        let saved_at = to_db_time(record.saved_at)?;
        self.conn()
            .prepare_cached(
                "INSERT INTO saved_sandboxes (id, team, saved_at, description)
                 VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (id) DO UPDATE SET team = excluded.team,
                    saved_at = excluded.saved_at, description = excluded.description",
            )?
            .execute(params![
                record.id,
                record.team,
                saved_at,
                record.description
            ])?;
        Ok(())
    }

    /// Forgets a saved sandbox (resumed or killed). Returns whether it was recorded.
    pub fn delete_saved_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached("DELETE FROM saved_sandboxes WHERE id = ?1")?
            .execute([id])?;
        Ok(changed > 0)
    }

    /// Every saved sandbox, oldest first.
    pub fn saved_sandboxes(&self) -> Result<Vec<SavedSandboxRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare(
            "SELECT id, team, saved_at, description FROM saved_sandboxes ORDER BY saved_at, id",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
                row.get::<_, String>(3)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, team, saved_at, description) = row?;
            out.push(SavedSandboxRecord {
                id,
                team,
                saved_at: from_db_time(saved_at)?,
                description,
            });
        }
        Ok(out)
    }

    /// Records (or replaces) snapshots, all or none: retiring one and recording another under
    /// its name is one change.
    pub fn put_snapshots(&self, rows: &[SnapshotRow]) -> Result<(), StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO snapshots (id, team, name, state, digest, created_at, record)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (id) DO UPDATE SET team = excluded.team, name = excluded.name,
                    state = excluded.state, digest = excluded.digest,
                    created_at = excluded.created_at, record = excluded.record",
            )?;
            for r in rows {
                stmt.execute(params![
                    r.id,
                    r.team,
                    r.name,
                    r.state,
                    r.digest,
                    to_db_time(r.created_at)?,
                    r.record
                ])?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// Forgets a snapshot. Returns whether it was recorded.
    pub fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        let changed = self
            .conn()
            .prepare_cached("DELETE FROM snapshots WHERE id = ?1")?
            .execute([id])?;
        Ok(changed > 0)
    }

    /// Every snapshot, oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare(
            "SELECT id, team, name, state, digest, created_at, record FROM snapshots
             ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, Option<String>>(2)?,
                row.get::<_, String>(3)?,
                row.get::<_, Option<String>>(4)?,
                row.get::<_, i64>(5)?,
                row.get::<_, String>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, team, name, state, digest, created_at, record) = row?;
            out.push(SnapshotRow {
                id,
                team,
                name,
                state,
                digest,
                created_at: from_db_time(created_at)?,
                record,
            });
        }
        Ok(out)
    }
}
