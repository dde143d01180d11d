//! Volumes in PostgreSQL (see the SQLite file's `store/volumes.rs`): the cluster's ids of
//! teams' workspaces.

use postgres::Row;

use super::super::volumes::{finish, COLUMNS};
use super::super::{to_db_time, StoreError, VolumeRecord};
use super::Postgres;

fn parts(r: &Row) -> (VolumeRecord, i64) {
    (
        VolumeRecord {
            id: r.get(0),
            team: r.get(1),
            name: r.get(2),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
        },
        r.get(3),
    )
}

impl Postgres {
    /// Records `rec` unless `rec.team` already has a volume named `rec.name`; returns the
    /// volume of that name (the one recorded now, or the one already there).
    pub fn ensure_volume(&self, rec: &VolumeRecord) -> Result<VolumeRecord, StoreError> {
        let at = to_db_time(rec.created_at)?;
        let mut conn = self.conn()?;
        conn.execute(
            "INSERT INTO volumes (id, team, name, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (team, name) DO NOTHING",
            &[&rec.id, &rec.team, &rec.name, &at],
        )?;
        let found = conn.query_one(
            &format!("SELECT {COLUMNS} FROM volumes WHERE team = $1 AND name = $2"),
            &[&rec.team, &rec.name],
        )?;
        finish(parts(&found))
    }

    /// The volume known by `id`, whichever team's.
    pub fn volume(&self, id: &str) -> Result<Option<VolumeRecord>, StoreError> {
        self.conn()?
            .query_opt(
                &format!("SELECT {COLUMNS} FROM volumes WHERE id = $1"),
                &[&id],
            )?
            .map(|r| finish(parts(&r)))
            .transpose()
    }

    /// `team`'s volumes, by name.
    pub fn volumes(&self, team: &str) -> Result<Vec<VolumeRecord>, StoreError> {
        let rows = self.conn()?.query(
            &format!("SELECT {COLUMNS} FROM volumes WHERE team = $1 ORDER BY name"),
            &[&team],
        )?;
        rows.iter().map(|r| finish(parts(r))).collect()
    }

    /// Forgets `team`'s volume `name`; whether there was one.
    pub fn delete_volume(&self, team: &str, name: &str) -> Result<bool, StoreError> {
        Ok(self.conn()?.execute(
            "DELETE FROM volumes WHERE team = $1 AND name = $2",
            &[&team, &name],
        )? > 0)
    }
}
