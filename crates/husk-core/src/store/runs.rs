//! Rows of the `runs` and `batches` tables: each a JSON record (the shape the API returns,
//! owned by `crate::runs`) with the columns lists filter on.

use rusqlite::{params, OptionalExtension};
use time::OffsetDateTime;

use super::{to_db_time, Sqlite, StoreError};

/// Which table a record lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RunTable {
    Runs,
    Batches,
}

impl RunTable {
    fn name(self) -> &'static str {
        match self {
            RunTable::Runs => "runs",
            RunTable::Batches => "batches",
        }
    }
}

/// One row to write.
#[derive(Debug, Clone, Copy)]
pub struct RunRow<'a> {
    pub table: RunTable,
    pub id: &'a str,
    pub team: &'a str,
    /// The batch a run belongs to (runs only).
    pub batch: Option<&'a str>,
    pub created_at: OffsetDateTime,
    /// Set once it has ended.
    pub ended_at: Option<OffsetDateTime>,
    /// The JSON record.
    pub record: &'a str,
}

impl Sqlite {
    /// Inserts or replaces a run's (or batch's) record.
    pub fn put_run_record(&self, row: &RunRow<'_>) -> Result<(), StoreError> {
        let created = to_db_time(row.created_at)?;
        let ended = row.ended_at.map(to_db_time).transpose()?;
        let (id, team, record) = (row.id, row.team, row.record);
        let conn = self.conn();
        match row.table {
            RunTable::Runs => conn
                .prepare_cached(
                    "INSERT INTO runs (id, team, batch, created_at, ended_at, record)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT(id) DO UPDATE SET ended_at = excluded.ended_at,
                       record = excluded.record",
                )?
                .execute(params![id, team, row.batch, created, ended, record])?,
            RunTable::Batches => conn
                .prepare_cached(
                    "INSERT INTO batches (id, team, created_at, ended_at, record)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT(id) DO UPDATE SET ended_at = excluded.ended_at,
                       record = excluded.record",
                )?
                .execute(params![id, team, created, ended, record])?,
        };
        Ok(())
    }

    /// One record of `team` (another team's is `None`, as a missing one).
    pub fn run_record(
        &self,
        table: RunTable,
        team: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError> {
        let sql = format!(
            "SELECT record FROM {} WHERE id = ?1 AND team = ?2",
            table.name()
        );
        Ok(self
            .reader()
            .prepare_cached(&sql)?
            .query_row(params![id, team], |r| r.get(0))
            .optional()?)
    }

    /// The newest `limit` records of `team`, newest first (runs of one batch with `batch`).
    pub fn run_records(
        &self,
        table: RunTable,
        team: &str,
        batch: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        let conn = self.reader();
        let mut out = Vec::new();
        match batch {
            Some(b) => {
                let mut st = conn.prepare_cached(
                    "SELECT record FROM runs WHERE team = ?1 AND batch = ?2
                     ORDER BY created_at, id LIMIT ?3",
                )?;
                for r in st.query_map(params![team, b, limit], |r| r.get(0))? {
                    out.push(r?);
                }
            }
            None => {
                let sql = format!(
                    "SELECT record FROM {} WHERE team = ?1 ORDER BY created_at DESC, id LIMIT ?2",
                    table.name()
                );
                let mut st = conn.prepare_cached(&sql)?;
                for r in st.query_map(params![team, limit], |r| r.get(0))? {
                    out.push(r?);
                }
            }
        }
        Ok(out)
    }

    /// Records that never ended (a crashed server's), as (table, id, record).
    pub fn unfinished_runs(&self) -> Result<Vec<(RunTable, String, String)>, StoreError> {
        let conn = self.reader();
        let mut out = Vec::new();
        for table in [RunTable::Runs, RunTable::Batches] {
            let sql = format!(
                "SELECT id, record FROM {} WHERE ended_at IS NULL",
                table.name()
            );
            let mut st = conn.prepare(&sql)?;
            for r in st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))? {
                let (id, rec) = r?;
                out.push((table, id, rec));
            }
        }
        Ok(out)
    }

    /// Deletes the records that ended before `before`: runs and batches (those still running
    /// are kept whatever their age) and uses of secrets. In small batches, so that the write
    /// lock is never held for long. How many rows went.
    pub fn prune_records(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        let before = to_db_time(before)?;
        let mut gone = 0u64;
        for sql in [
            "DELETE FROM runs WHERE rowid IN
               (SELECT rowid FROM runs WHERE ended_at < ?1 LIMIT 500)",
            "DELETE FROM batches WHERE rowid IN
               (SELECT rowid FROM batches WHERE ended_at < ?1 LIMIT 500)",
            "DELETE FROM secret_uses WHERE rowid IN
               (SELECT rowid FROM secret_uses WHERE at < ?1 LIMIT 500)",
        ] {
            loop {
                let n = self.conn().prepare_cached(sql)?.execute([before])?;
                gone += n as u64;
                if n == 0 {
                    break;
                }
            }
        }
        Ok(gone)
    }
}
