//! Teams, their quotas, and API keys.

use rusqlite::{params, OptionalExtension, TransactionBehavior};
use time::{Duration, OffsetDateTime};

use super::{
    from_db_time, from_db_time_opt, to_db_time, validate_label, validate_team, KeyInfo, Principal,
    Sqlite, StoreError,
};
use crate::keys::{self, KeyRef};

/// How many fresh keys `create_key` draws before concluding that ids cannot be had.
const KEY_ATTEMPTS: u32 = 16;

/// `last_used_at` is written at most this often per key, so that authenticating (every request)
/// is a read, not a write that would contend for the database lock with the CLI and other writes.
const LAST_USED_GRANULARITY: Duration = Duration::minutes(1);

impl Sqlite {
    /// Creates a key for `team` (creating the team if it is new) and returns what is listed
    /// about it together with the secret. The secret is not stored, only its hash: this is the
    /// only time it exists.
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
        let created_at = OffsetDateTime::now_utc();
        let now = to_db_time(created_at)?;
        let mut conn = self.conn();
        // IMMEDIATE: the id check and the insert must see the same database.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO teams (name, created_at) VALUES (?1, ?2) ON CONFLICT (name) DO NOTHING",
            params![team, now],
        )?;
        for _ in 0..KEY_ATTEMPTS {
            let secret = keys::generate()?;
            let Some(id) = keys::key_id(&secret) else {
                continue;
            };
            let hash = keys::hash(&secret);
            let taken: bool = tx.query_row(
                "SELECT EXISTS (SELECT 1 FROM keys WHERE id = ?1 OR hash = ?2)",
                params![id, hash],
                |row| row.get(0),
            )?;
            if taken {
                // Ids of revoked keys count too: an id names one key forever.
                continue;
            }
            tx.execute(
                "INSERT INTO keys (id, hash, team, admin, name, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![id, hash, team, admin, label, now],
            )?;
            tx.commit()?;
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
    /// alike, with no detail (a caller must not be able to tell them apart), and never a
    /// panic; an error only when the database cannot answer (callers fail closed).
    ///
    /// The key is looked up by its hash, then the stored hash is compared again in constant
    /// time. Nothing is cached, so a revocation takes effect on the next call, in any process.
    pub fn check_key(&self, presented: &str) -> Result<Option<Principal>, StoreError> {
        // Also bounds the work: nothing but a 44-byte key is ever hashed.
        if !keys::looks_like_key(presented) {
            return Ok(None);
        }
        self.lookup(&keys::hash(presented))
    }

    fn lookup(&self, hash: &str) -> Result<Option<Principal>, StoreError> {
        let row = self
            .reader()
            .prepare_cached(
                "SELECT id, hash, team, admin, last_used_at FROM keys
                 WHERE hash = ?1 AND revoked_at IS NULL",
            )?
            .query_row([hash], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, String>(2)?,
                    row.get::<_, bool>(3)?,
                    row.get::<_, Option<i64>>(4)?,
                ))
            })
            .optional()?;
        let Some((id, stored, team, admin, last_used)) = row else {
            return Ok(None);
        };
        let found = FoundKey {
            id,
            stored,
            team,
            admin,
            last_used,
        };
        principal_of(found, hash, |id, now| {
            self.conn()
                .prepare_cached("UPDATE keys SET last_used_at = ?2 WHERE id = ?1")?
                .execute(params![id, now])?;
            Ok(())
        })
    }

    /// All keys, revoked ones included, oldest first. Never the secrets or their hashes.
    pub fn list_keys(&self) -> Result<Vec<KeyInfo>, StoreError> {
        let conn = self.reader();
        let mut stmt = conn.prepare(
            "SELECT id, team, admin, name, created_at, revoked_at, last_used_at FROM keys
             ORDER BY created_at, id",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, bool>(2)?,
                row.get::<_, Option<String>>(3)?,
                row.get::<_, i64>(4)?,
                row.get::<_, Option<i64>>(5)?,
                row.get::<_, Option<i64>>(6)?,
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, team, admin, label, created, revoked, used) = row?;
            out.push(KeyInfo {
                id,
                team,
                admin,
                label,
                created_at: from_db_time(created)?,
                revoked_at: from_db_time_opt(revoked)?,
                last_used_at: from_db_time_opt(used)?,
            });
        }
        Ok(out)
    }

    /// Revokes a key named by its id (`1a2b3c4d`), its displayed id (`e2b_1a2b3c4d…`) or the
    /// whole key. Returns whether such a key exists; it is revoked afterwards either way
    /// (revoking twice is not an error and keeps the first revocation time). Input that names
    /// no key in any of these forms is simply `false`.
    pub fn revoke_key(&self, id_or_key: &str) -> Result<bool, StoreError> {
        let now = to_db_time(OffsetDateTime::now_utc())?;
        let conn = self.conn();
        let changed = match keys::parse_ref(id_or_key) {
            None => 0,
            Some(KeyRef::Id(id)) => conn.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, ?2) WHERE id = ?1",
                params![id, now],
            )?,
            Some(KeyRef::Key(key)) => conn.execute(
                "UPDATE keys SET revoked_at = COALESCE(revoked_at, ?2) WHERE hash = ?1",
                params![keys::hash(key), now],
            )?,
        };
        Ok(changed > 0)
    }

    /// Whether any key can still authenticate; the server uses this to tell an open
    /// development setup from one whose operator revoked everything.
    pub fn has_active_keys(&self) -> Result<bool, StoreError> {
        let conn = self.reader();
        Ok(conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM keys WHERE revoked_at IS NULL)",
            [],
            |row| row.get(0),
        )?)
    }

    /// Sets how many sandboxes `team` may run at once (`None`: the server's default), creating
    /// the team if it is new so that quotas can be set before its first key.
    pub fn set_team_quota(&self, team: &str, max: Option<u32>) -> Result<(), StoreError> {
        validate_team(team)?;
        let now = to_db_time(OffsetDateTime::now_utc())?;
        self.conn().execute(
            "INSERT INTO teams (name, created_at, max_sandboxes) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET max_sandboxes = excluded.max_sandboxes",
            params![team, now, max],
        )?;
        Ok(())
    }

    /// The quota of `team`: `None` means the server's default, also for a team that does not
    /// exist (yet).
    pub fn team_quota(&self, team: &str) -> Result<Option<u32>, StoreError> {
        validate_team(team)?;
        let max: Option<Option<i64>> = self
            .reader()
            .query_row(
                "SELECT max_sandboxes FROM teams WHERE name = ?1",
                [team],
                |row| row.get(0),
            )
            .optional()?;
        max.flatten()
            .map(|n| {
                u32::try_from(n)
                    .map_err(|_| StoreError::Corrupt(format!("quota {n} of team {team:?}")))
            })
            .transpose()
    }
}

/// An active key as found by its hash, in either database.
pub(super) struct FoundKey {
    pub(super) id: String,
    /// The hash as stored, compared again in constant time.
    pub(super) stored: String,
    pub(super) team: String,
    pub(super) admin: bool,
    /// When it last authenticated (Unix nanoseconds).
    pub(super) last_used: Option<i64>,
}

/// Who `found` acts for, if its stored hash is `hash`. Records the use through `touch(id,
/// now)` when the last record is older than [`LAST_USED_GRANULARITY`] (or in the future):
/// bookkeeping only, so a failure there (say, another process holding the write lock) is
/// logged and never refuses a valid key.
pub(super) fn principal_of(
    found: FoundKey,
    hash: &str,
    touch: impl FnOnce(&str, i64) -> Result<(), StoreError>,
) -> Result<Option<Principal>, StoreError> {
    if !keys::hashes_equal(&found.stored, hash) {
        return Ok(None);
    }
    let now = OffsetDateTime::now_utc();
    let stale = match from_db_time_opt(found.last_used)? {
        None => true,
        Some(t) => now - t >= LAST_USED_GRANULARITY || t > now,
    };
    if stale {
        if let Err(e) = to_db_time(now).and_then(|now| touch(&found.id, now)) {
            tracing::warn!(key = %keys::display_id(&found.id), error = %e, "cannot record key use");
        }
    }
    Ok(Some(Principal {
        team: found.team,
        key_id: found.id,
        admin: found.admin,
    }))
}
