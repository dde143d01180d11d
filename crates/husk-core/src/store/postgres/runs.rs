//! Rows of the `runs` and `batches` tables in PostgreSQL (see the SQLite file's
//! `store/runs.rs`). A run belongs to the node that runs it: `unfinished_runs` is what a
//! restarted server marks failed, so it lists only its own.

use time::OffsetDateTime;

use super::super::{to_db_time, RunRow, RunTable, StoreError};
use super::Postgres;

/// Rows `prune_records` deletes per statement, so that no statement runs long.
const PRUNE_BATCH: i64 = 500;

fn table_name(table: RunTable) -> &'static str {
    match table {
        RunTable::Runs => "runs",
        RunTable::Batches => "batches",
    }
}

impl Postgres {
    /// Inserts or replaces a run's (or batch's) record.
    pub fn put_run_record(&self, row: &RunRow<'_>) -> Result<(), StoreError> {
        let created = to_db_time(row.created_at)?;
        let ended = row.ended_at.map(to_db_time).transpose()?;
        let (id, team, record, node) = (row.id, row.team, row.record, self.node.as_str());
        let mut conn = self.conn()?;
        match row.table {
            RunTable::Runs => conn.execute(
                "INSERT INTO runs (id, node, team, batch, created_at, ended_at, record)
                 VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT (id) DO UPDATE SET ended_at = excluded.ended_at,
                   record = excluded.record",
                &[&id, &node, &team, &row.batch, &created, &ended, &record],
            )?,
            RunTable::Batches => conn.execute(
                "INSERT INTO batches (id, node, team, created_at, ended_at, record)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (id) DO UPDATE SET ended_at = excluded.ended_at,
                   record = excluded.record",
                &[&id, &node, &team, &created, &ended, &record],
            )?,
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
            "SELECT record FROM {} WHERE id = $1 AND team = $2",
            table_name(table)
        );
        Ok(self
            .conn()?
            .query_opt(&sql, &[&id, &team])?
            .map(|r| r.get(0)))
    }

    /// The newest `limit` records of `team`, newest first (runs of one batch with `batch`,
    /// oldest first).
    pub fn run_records(
        &self,
        table: RunTable,
        team: &str,
        batch: Option<&str>,
        limit: u32,
    ) -> Result<Vec<String>, StoreError> {
        let limit = i64::from(limit);
        let mut conn = self.conn()?;
        let rows = match batch {
            Some(b) => conn.query(
                "SELECT record FROM runs WHERE team = $1 AND batch = $2
                 ORDER BY created_at, id LIMIT $3",
                &[&team, &b, &limit],
            )?,
            None => conn.query(
                &format!(
                    "SELECT record FROM {} WHERE team = $1
                     ORDER BY created_at DESC, id LIMIT $2",
                    table_name(table)
                ),
                &[&team, &limit],
            )?,
        };
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// This node's records that never ended (its crashed server's), as (table, id, record).
    pub fn unfinished_runs(&self) -> Result<Vec<(RunTable, String, String)>, StoreError> {
        let mut conn = self.conn()?;
        let mut out = Vec::new();
        for table in [RunTable::Runs, RunTable::Batches] {
            let sql = format!(
                "SELECT id, record FROM {} WHERE ended_at IS NULL AND node = $1",
                table_name(table)
            );
            for r in conn.query(&sql, &[&self.node])? {
                out.push((table, r.get(0), r.get(1)));
            }
        }
        Ok(out)
    }

    /// Deletes the records that ended before `before` (runs, batches, uses of secrets), in
    /// small batches. How many rows went.
    pub fn prune_records(&self, before: OffsetDateTime) -> Result<u64, StoreError> {
        let before = to_db_time(before)?;
        let mut conn = self.conn()?;
        let mut gone = 0u64;
        for sql in [
            "DELETE FROM runs WHERE id IN
               (SELECT id FROM runs WHERE ended_at < $1 LIMIT $2)",
            "DELETE FROM batches WHERE id IN
               (SELECT id FROM batches WHERE ended_at < $1 LIMIT $2)",
            "DELETE FROM secret_uses WHERE id IN
               (SELECT id FROM secret_uses WHERE at < $1 LIMIT $2)",
        ] {
            loop {
                let n = conn.execute(sql, &[&before, &PRUNE_BATCH])?;
                gone += n;
                if n == 0 {
                    break;
                }
            }
        }
        Ok(gone)
    }
}
