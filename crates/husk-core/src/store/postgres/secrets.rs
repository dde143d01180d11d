//! Sealed secrets and their uses in PostgreSQL (see the SQLite file's `store/secrets.rs`;
//! the sealing is `crate::secrets`'s, with the master key only the state helper holds).

use postgres::Row;

use super::super::secrets::{finish, metadata_json, Parts, COLUMNS};
use super::super::{from_db_time, to_db_time, PutMode, SealedRow, SecretUse, StoreError};
use super::Postgres;

fn parts(r: &Row) -> Parts {
    (
        SealedRow {
            team: r.get(0),
            name: r.get(1),
            key_id: r.get(2),
            nonce: r.get(3),
            ciphertext: r.get(4),
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            updated_at: time::OffsetDateTime::UNIX_EPOCH,
            version: 1,
            metadata: None,
        },
        r.get(5),
        r.get(6),
        r.get(7),
        r.get(8),
    )
}

impl Postgres {
    /// Inserts or replaces a sealed secret (its creation time is kept on replace).
    pub fn put_secret(&self, r: &SealedRow) -> Result<(), StoreError> {
        self.write_secret(r, PutMode::Upsert).map(|_| ())
    }

    /// Writes a sealed secret as `mode` says (a new value counts a new version; metadata is
    /// replaced when the row carries some). Whether anything was written.
    pub fn write_secret(&self, r: &SealedRow, mode: PutMode) -> Result<bool, StoreError> {
        let created = to_db_time(r.created_at)?;
        let updated = to_db_time(r.updated_at)?;
        let metadata = metadata_json(r)?;
        let mut conn = self.conn()?;
        let n = match mode {
            PutMode::Upsert | PutMode::Create => {
                let on_conflict = if mode == PutMode::Upsert {
                    "DO UPDATE SET key_id = excluded.key_id, nonce = excluded.nonce,
                       ciphertext = excluded.ciphertext, updated_at = excluded.updated_at,
                       version = secrets.version + 1,
                       metadata = coalesce($8, secrets.metadata)"
                } else {
                    "DO NOTHING"
                };
                conn.execute(
                    &format!(
                        "INSERT INTO secrets (team, name, key_id, nonce, ciphertext, created_at,
                           updated_at, metadata)
                         VALUES ($1, $2, $3, $4, $5, $6, $7, coalesce($8, '{{}}'))
                         ON CONFLICT (team, name) {on_conflict}"
                    ),
                    &[
                        &r.team,
                        &r.name,
                        &r.key_id,
                        &r.nonce,
                        &r.ciphertext,
                        &created,
                        &updated,
                        &metadata,
                    ],
                )?
            }
            PutMode::Update => conn.execute(
                "UPDATE secrets SET key_id = $3, nonce = $4, ciphertext = $5, updated_at = $6,
                   version = version + 1, metadata = coalesce($7, metadata)
                 WHERE team = $1 AND name = $2",
                &[
                    &r.team,
                    &r.name,
                    &r.key_id,
                    &r.nonce,
                    &r.ciphertext,
                    &updated,
                    &metadata,
                ],
            )?,
        };
        Ok(n > 0)
    }

    /// One sealed secret of `team`.
    pub fn secret(&self, team: &str, name: &str) -> Result<Option<SealedRow>, StoreError> {
        self.conn()?
            .query_opt(
                &format!("SELECT {COLUMNS} FROM secrets WHERE team = $1 AND name = $2"),
                &[&team, &name],
            )?
            .map(|r| finish(parts(&r)))
            .transpose()
    }

    /// `team`'s secrets by name (`None`: every team's, for key rotation).
    pub fn secrets(&self, team: Option<&str>) -> Result<Vec<SealedRow>, StoreError> {
        let rows = self.conn()?.query(
            &format!(
                "SELECT {COLUMNS} FROM secrets WHERE $1::text IS NULL OR team = $1
                 ORDER BY team, name"
            ),
            &[&team],
        )?;
        rows.iter().map(|r| finish(parts(r))).collect()
    }

    /// Deletes one; whether it existed.
    pub fn delete_secret(&self, team: &str, name: &str) -> Result<bool, StoreError> {
        Ok(self.conn()?.execute(
            "DELETE FROM secrets WHERE team = $1 AND name = $2",
            &[&team, &name],
        )? > 0)
    }

    /// Replaces every row's seal in one transaction (key rotation): all or nothing.
    pub fn reseal_secrets(&self, rows: &[SealedRow]) -> Result<(), StoreError> {
        let mut conn = self.conn()?;
        let mut tx = conn.transaction()?;
        let stmt = tx.prepare(
            "UPDATE secrets SET key_id = $3, nonce = $4, ciphertext = $5
             WHERE team = $1 AND name = $2",
        )?;
        for r in rows {
            tx.execute(
                &stmt,
                &[&r.team, &r.name, &r.key_id, &r.nonce, &r.ciphertext],
            )?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Records a use of a secret.
    pub fn record_secret_use(&self, u: &SecretUse) -> Result<(), StoreError> {
        let at = to_db_time(u.at)?;
        self.conn()?.execute(
            "INSERT INTO secret_uses (at, team, secret, sandbox, command)
             VALUES ($1, $2, $3, $4, $5)",
            &[&at, &u.team, &u.secret, &u.sandbox, &u.command],
        )?;
        Ok(())
    }

    /// `team`'s most recent uses of secrets, newest first.
    pub fn secret_uses(&self, team: &str, limit: u32) -> Result<Vec<SecretUse>, StoreError> {
        let rows = self.conn()?.query(
            "SELECT at, team, secret, sandbox, command FROM secret_uses
             WHERE team = $1 ORDER BY at DESC, id DESC LIMIT $2",
            &[&team, &i64::from(limit)],
        )?;
        rows.iter()
            .map(|r| {
                Ok(SecretUse {
                    at: from_db_time(r.get(0))?,
                    team: r.get(1),
                    secret: r.get(2),
                    sandbox: r.get(3),
                    command: r.get(4),
                })
            })
            .collect()
    }
}
