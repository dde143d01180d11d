//! The record of sandboxes in PostgreSQL (see the SQLite file's `store/sandboxes.rs`): live
//! ones, lost ones, those saved to disk, and snapshots. Live and saved sandboxes and
//! snapshots are listed per node (their processes and files are that machine's); lookups,
//! updates and the lost record by id or team see the whole cluster.

use postgres::Row;
use time::OffsetDateTime;

use super::super::sandboxes::{record_from, RecordColumns, RECORD_COLUMNS};
use super::super::{
    from_db_time, to_db_time, LostSandbox, SandboxRecord, SavedSandboxRecord, SnapshotRow,
    StoreError,
};
use super::{is_unique_violation, Postgres};

/// A record from a row whose first columns are [`RECORD_COLUMNS`].
fn record_of(row: &Row) -> Result<SandboxRecord, StoreError> {
    record_from(RecordColumns {
        id: row.get(0),
        team: row.get(1),
        template: row.get(2),
        runtime_id: row.get(3),
        created_at: row.get(4),
        end_at: row.get(5),
        metadata: row.get(6),
        description: row.get(7),
    })
}

impl Postgres {
    /// Records a new sandbox of this node. Its id must not be recorded already (by any node).
    pub fn insert_sandbox(&self, record: &SandboxRecord) -> Result<(), StoreError> {
        let metadata = serde_json::to_string(&record.metadata)
            .map_err(|e| StoreError::Corrupt(format!("metadata: {e}")))?;
        let created_at = to_db_time(record.created_at)?;
        let end_at = to_db_time(record.end_at)?;
        let inserted = self.conn()?.execute(
            "INSERT INTO sandboxes
                (id, node, team, template, runtime_id, created_at, end_at, metadata, description)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &record.id,
                &self.node,
                &record.team,
                &record.template,
                &record.runtime_id,
                &created_at,
                &end_at,
                &metadata,
                &record.description,
            ],
        );
        match inserted {
            Ok(_) => Ok(()),
            Err(e) if is_unique_violation(&e) => Err(StoreError::SandboxExists(record.id.clone())),
            Err(e) => Err(e.into()),
        }
    }

    /// Moves a sandbox's end. Returns whether it is recorded.
    pub fn update_sandbox_end(&self, id: &str, end_at: OffsetDateTime) -> Result<bool, StoreError> {
        let end_at = to_db_time(end_at)?;
        let n = self.conn()?.execute(
            "UPDATE sandboxes SET end_at = $2 WHERE id = $1",
            &[&id, &end_at],
        )?;
        Ok(n > 0)
    }

    /// Replaces a live sandbox's description and end. Returns whether it is recorded (and
    /// live).
    pub fn update_sandbox_description(
        &self,
        id: &str,
        end_at: OffsetDateTime,
        description: &str,
    ) -> Result<bool, StoreError> {
        let end_at = to_db_time(end_at)?;
        let n = self.conn()?.execute(
            "UPDATE sandboxes SET end_at = $2, description = $3
             WHERE id = $1 AND lost_at IS NULL",
            &[&id, &end_at, &description],
        )?;
        Ok(n > 0)
    }

    /// Forgets a destroyed sandbox. Returns whether it was recorded.
    pub fn delete_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()?
            .execute("DELETE FROM sandboxes WHERE id = $1", &[&id])?
            > 0)
    }

    /// This node's live recorded sandboxes (not lost), oldest first.
    pub fn list_sandboxes(&self) -> Result<Vec<SandboxRecord>, StoreError> {
        let rows = self.conn()?.query(
            &format!(
                "SELECT {RECORD_COLUMNS} FROM sandboxes WHERE node = $1 AND lost_at IS NULL
                 ORDER BY created_at, id"
            ),
            &[&self.node],
        )?;
        rows.iter().map(record_of).collect()
    }

    /// Marks one live sandbox lost. Returns whether it was recorded (and live).
    pub fn mark_sandbox_lost(
        &self,
        id: &str,
        reason: &str,
        at: OffsetDateTime,
    ) -> Result<bool, StoreError> {
        let at = to_db_time(at)?;
        let n = self.conn()?.execute(
            "UPDATE sandboxes SET lost_at = $2, lost_reason = $3
             WHERE lost_at IS NULL AND id = $1",
            &[&id, &at, &reason],
        )?;
        Ok(n > 0)
    }

    /// The lost sandboxes of `team` (every team's: `None`), or only `id`, most recently lost
    /// first, whichever node lost them.
    pub fn lost_sandboxes(
        &self,
        team: Option<&str>,
        id: Option<&str>,
    ) -> Result<Vec<LostSandbox>, StoreError> {
        let rows = self.conn()?.query(
            &format!(
                "SELECT {RECORD_COLUMNS}, lost_at, lost_reason FROM sandboxes
                 WHERE lost_at IS NOT NULL
                   AND ($1::text IS NULL OR team = $1) AND ($2::text IS NULL OR id = $2)
                 ORDER BY lost_at DESC, id"
            ),
            &[&team, &id],
        )?;
        rows.iter()
            .map(|row| {
                Ok(LostSandbox {
                    record: record_of(row)?,
                    lost_at: from_db_time(row.get(8))?,
                    reason: row.get::<_, Option<String>>(9).unwrap_or_default(),
                })
            })
            .collect()
    }

    /// Forgets the sandboxes lost before `before`. Returns how many.
    pub fn prune_lost_sandboxes(&self, before: OffsetDateTime) -> Result<usize, StoreError> {
        let before = to_db_time(before)?;
        let n = self.conn()?.execute(
            "DELETE FROM sandboxes WHERE lost_at IS NOT NULL AND lost_at < $1",
            &[&before],
        )?;
        usize::try_from(n).map_err(|_| StoreError::Corrupt(format!("{n} rows")))
    }

    /// Records (or replaces) a sandbox of this node kept beyond its processes.
    pub fn put_saved_sandbox(&self, record: &SavedSandboxRecord) -> Result<(), StoreError> {
        let saved_at = to_db_time(record.saved_at)?;
        self.conn()?.execute(
            "INSERT INTO saved_sandboxes (id, node, team, saved_at, description)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (id) DO UPDATE SET node = excluded.node, team = excluded.team,
                saved_at = excluded.saved_at, description = excluded.description",
            &[
                &record.id,
                &self.node,
                &record.team,
                &saved_at,
                &record.description,
            ],
        )?;
        Ok(())
    }

    /// Forgets a saved sandbox (resumed or killed). Returns whether it was recorded.
    pub fn delete_saved_sandbox(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()?
            .execute("DELETE FROM saved_sandboxes WHERE id = $1", &[&id])?
            > 0)
    }

    /// This node's saved sandboxes, oldest first.
    pub fn saved_sandboxes(&self) -> Result<Vec<SavedSandboxRecord>, StoreError> {
        let rows = self.conn()?.query(
            "SELECT id, team, saved_at, description FROM saved_sandboxes WHERE node = $1
             ORDER BY saved_at, id",
            &[&self.node],
        )?;
        rows.iter()
            .map(|row| {
                Ok(SavedSandboxRecord {
                    id: row.get(0),
                    team: row.get(1),
                    saved_at: from_db_time(row.get(2))?,
                    description: row.get(3),
                })
            })
            .collect()
    }

    /// Records (or replaces) snapshots of this node, all or none.
    pub fn put_snapshots(&self, rows: &[SnapshotRow]) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let mut tx = conn.transaction()?;
        let stmt = tx.prepare(
            "INSERT INTO snapshots (id, node, team, name, state, digest, created_at, record)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (id) DO UPDATE SET node = excluded.node, team = excluded.team,
                name = excluded.name, state = excluded.state, digest = excluded.digest,
                created_at = excluded.created_at, record = excluded.record",
        )?;
        for r in rows {
            let created_at = to_db_time(r.created_at)?;
            tx.execute(
                &stmt,
                &[
                    &r.id,
                    &self.node,
                    &r.team,
                    &r.name,
                    &r.state,
                    &r.digest,
                    &created_at,
                    &r.record,
                ],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Forgets a snapshot. Returns whether it was recorded.
    pub fn delete_snapshot(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()?
            .execute("DELETE FROM snapshots WHERE id = $1", &[&id])?
            > 0)
    }

    /// This node's snapshots, oldest first.
    pub fn snapshots(&self) -> Result<Vec<SnapshotRow>, StoreError> {
        let rows = self.conn()?.query(
            "SELECT id, team, name, state, digest, created_at, record FROM snapshots
             WHERE node = $1 ORDER BY created_at, id",
            &[&self.node],
        )?;
        rows.iter()
            .map(|row| {
                Ok(SnapshotRow {
                    id: row.get(0),
                    team: row.get(1),
                    name: row.get(2),
                    state: row.get(3),
                    digest: row.get(4),
                    created_at: from_db_time(row.get(5))?,
                    record: row.get(6),
                })
            })
            .collect()
    }
}
