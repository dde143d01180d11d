//! Rows of the `volumes` table: the identity E2B's volume API gives a team's workspace (an id
//! the content API is addressed by). The workspace itself, its files, lives in the files
//! helper's directory; its token is derived from the id (`crate::secrets`), never stored.

use rusqlite::{params, OptionalExtension};
use time::OffsetDateTime;

use super::{from_db_time, to_db_time, Sqlite, StoreError};

/// A volume: `team`'s workspace `name`, known by `id`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub team: String,
    pub name: String,
    pub created_at: OffsetDateTime,
}

pub(super) const COLUMNS: &str = "id, team, name, created_at";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(VolumeRecord, i64)> {
    Ok((
        VolumeRecord {
            id: r.get(0)?,
            team: r.get(1)?,
            name: r.get(2)?,
            created_at: OffsetDateTime::UNIX_EPOCH,
        },
        r.get(3)?,
    ))
}

pub(super) fn finish(parts: (VolumeRecord, i64)) -> Result<VolumeRecord, StoreError> {
    let (mut v, at) = parts;
    v.created_at = from_db_time(at)?;
    Ok(v)
}

impl Sqlite {
    /// Records `rec` unless `rec.team` already has a volume named `rec.name`; returns the
    /// volume of that name (the one recorded now, or the one already there).
    pub fn ensure_volume(&self, rec: &VolumeRecord) -> Result<VolumeRecord, StoreError> {
        let at = to_db_time(rec.created_at)?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO volumes (id, team, name, created_at) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT(team, name) DO NOTHING",
            params![rec.id, rec.team, rec.name, at],
        )?;
        let found = tx.query_row(
            &format!("SELECT {COLUMNS} FROM volumes WHERE team = ?1 AND name = ?2"),
            params![rec.team, rec.name],
            row,
        )?;
        tx.commit()?;
        finish(found)
    }

    /// The volume known by `id`, whichever team's.
    pub fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        let conn = self.reader();
        let found = conn
            .prepare_cached(&format!("SELECT {COLUMNS} FROM volumes WHERE id = ?1"))?
            .query_row(params![id], row)
            .optional()?;
        drop(conn);
        found.map(finish).transpose()
    }

    /// `team`'s volumes, by name.
    pub fn volumes(&self, team: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM volumes WHERE team = ?1 ORDER BY name"
        ))?;
        let rows = stmt
            .query_map(params![team], row)?
            .collect::<Result<Vec<_>, _>>()?;
        drop(stmt);
        drop(conn);
        rows.into_iter().map(finish).collect()
    }

    /// Forgets `team`'s volume `name` (its workspace was deleted); whether there was one.
    pub fn delete_volume(&self, team: &str, name: &str) -> Result<bool, StoreError> {
        let n = self.conn().execute(
            "DELETE FROM volumes WHERE team = ?1 AND name = ?2",
            params![team, name],
        )?;
        Ok(n > 0)
    }
}
