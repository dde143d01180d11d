//! Teams, their quotas, and API keys, in PostgreSQL (the same behaviour as the SQLite file's
//! `store/keys.rs`, whose documentation says why each rule is there).

use time::OffsetDateTime;

use super::super::keys::{principal_of, FoundKey};
use super::super::{
    from_db_time, from_db_time_opt, to_db_time, validate_label, validate_team, KeyInfo, Principal,
    StoreError,
};
use super::Postgres;
use crate::keys::{self, KeyRef};

/// How many fresh keys `create_key` draws before concluding that ids cannot be had.
const KEY_ATTEMPTS: u32 = 16;

impl Postgres {
    /// Creates a key for `team` (creating the team if it is new) and returns what is listed
    /// about it together with the secret, which is not stored (only its hash).
    pub fn create_key(
        &self,
        team: &str,
        admin: bool,
        label: Option<&str>,
    ) -> Result<(KeyInfo, String), StoreError> {
        validate_team(team)?;
        if let Some(label) = label {
            validate_label(label)?;
        }
        let now = to_db_time(OffsetDateTime::now_utc())?;
        let mut conn = self.conn()?;
        conn.execute(
            "INSERT INTO teams (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
            &[&team, &now],
        )?;
        for _ in 0..KEY_ATTEMPTS {
            let secret = keys::generate()?;
            let Some(id) = keys::key_id(&secret) else {
                continue;
            };
            let hash = keys::hash(&secret);
            // Ids of revoked keys count too (an id names one key for ever): both the id and
            // the hash are unique in the table, so a taken one inserts nothing.
            let n = conn.execute(
                "INSERT INTO keys (id, hash, team, admin, name, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                &[&id, &hash, &team, &admin, &label, &now],
            )?;
            if n == 0 {
                continue;
            }
            let info = KeyInfo {
                id: id.to_owned(),
                team: team.to_owned(),
                admin,
                label: label.map(str::to_owned),
                created_at: from_db_time(now)?,
                revoked_at: None,
                last_used_at: None,
            };
            return Ok((info, secret));
        }
        Err(StoreError::NoFreeKeyId(KEY_ATTEMPTS))
    }

    /// Who `presented` authenticates as: `None` for unknown, revoked and malformed keys
    /// alike; an error only when the database cannot answer (callers fail closed).
    pub fn check_key(&self, presented: &str) -> Result<Option<Principal>, StoreError> {
        if !keys::looks_like_key(presented) {
            return Ok(None);
        }
        self.lookup(&keys::hash(presented))
    }

    fn lookup(&self, hash: &str) -> Result<Option<Principal>, StoreError> {
        let mut conn = self.conn()?;
        let Some(row) = conn.query_opt(
            "SELECT id, hash, team, admin, last_used_at FROM keys
             WHERE hash = $1 AND revoked_at IS NULL",
            &[&hash],
        )?
        else {
            return Ok(None);
        };
        principal_of(found_key(&row), hash, |id, now| {
            conn.execute(
                "UPDATE keys SET last_used_at = $2 WHERE id = $1",
                &[&id, &now],
            )?;
            Ok(())
        })
    }

    /// All keys, revoked ones included, oldest first. Never the secrets or their hashes.
    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        let rows = self.conn()?.query(
            "SELECT id, team, admin, name, created_at, revoked_at, last_used_at FROM keys
             ORDER BY created_at, id",
            &[],
        )?;
        rows.iter()
            .map(|row| {
                Ok(KeyInfo {
                    id: row.get(0),
                    team: row.get(1),
                    admin: row.get(2),
                    label: row.get(3),
                    created_at: from_db_time(row.get(4))?,
                    revoked_at: from_db_time_opt(row.get(5))?,
                    last_used_at: from_db_time_opt(row.get(6))?,
                })
            })
            .collect()
    }

    /// Revokes a key named by its id, its displayed id or the whole key; whether it exists.
    pub fn revoke_key(&self, id_or_key: &str) -> Result<bool, StoreError> {
        let now = to_db_time(OffsetDateTime::now_utc())?;
        let mut conn = self.conn()?;
        let changed = match keys::parse_ref(id_or_key) {
            None => 0,
            Some(KeyRef::Id(id)) => conn.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, $2) WHERE id = $1",
                &[&id, &now],
            )?,
            Some(KeyRef::Key(key)) => conn.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, $2) WHERE hash = $1",
                &[&keys::hash(key), &now],
            )?,
        };
        Ok(changed > 0)
    }

    /// Whether any key can still authenticate.
    pub fn has_active_keys(&self) -> Result<bool, StoreError> {
        Ok(self
            .conn()?
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM keys WHERE revoked_at IS NULL)",
                &[],
            )?
            .get(0))
    }

    /// Sets how many sandboxes `team` may run at once (`None`: the server's default).
    pub fn set_team_quota(&self, team: &str, max: Option<u32>) -> Result<(), StoreError> {
        validate_team(team)?;
        let now = to_db_time(OffsetDateTime::now_utc())?;
        let max = max.map(i64::from);
        self.conn()?.execute(
            "INSERT INTO teams (name, created_at, max_sandboxes) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET max_sandboxes = excluded.max_sandboxes",
            &[&team, &now, &max],
        )?;
        Ok(())
    }

    /// The quota of `team` (`None`: the server's default, also for a team not known).
    pub fn team_quota(&self, team: &str) -> Result<Option<u32>, StoreError> {
        validate_team(team)?;
        let max: Option<i64> = self
            .conn()?
            .query_opt("SELECT max_sandboxes FROM teams WHERE name = $1", &[&team])?
            .and_then(|row| row.get(0));
        max.map(|n| {
            u32::try_from(n).map_err(|_| StoreError::Corrupt(format!("quota {n} of team {team:?}")))
        })
        .transpose()
    }
}

/// A key's row as [`principal_of`] takes it, from columns 0-4 of a row that selects `id,
/// hash, team, admin, last_used_at` first (a create's check joins the claim after them).
pub(super) fn found_key(row: &postgres::Row) -> FoundKey {
    FoundKey {
        id: row.get(0),
        stored: row.get(1),
        team: row.get(2),
        admin: row.get(3),
        last_used: row.get(4),
    }
}
