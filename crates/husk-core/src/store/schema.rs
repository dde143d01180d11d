//! Versioned schema migrations, counted in `PRAGMA user_version`.
//!
//! `MIGRATIONS[i]` takes the schema from version `i` to `i + 1`. Migrations are append-only:
//! once released, an entry never changes, and a change to the schema is a new entry. All pending
//! migrations and the new version number are committed in one transaction, so a crash leaves the
//! database at the old version or the new one, never in between.

use rusqlite::{Connection, TransactionBehavior};

use super::StoreError;

/// Version 1: teams, keys and the sandbox record.
///
/// Tables are `STRICT`, so SQLite refuses a value of the wrong type instead of storing it.
/// Times are Unix nanoseconds (see the module documentation of `store`).
/// `sandboxes.team` deliberately has no foreign key: the record must never refuse a sandbox
/// that exists (for example one created while the server runs without keys), or a crash would
/// leave it untracked.
const V1: &str = "
CREATE TABLE teams (
    name          TEXT PRIMARY KEY NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    created_at    INTEGER NOT NULL,
    max_sandboxes INTEGER NULL CHECK (max_sandboxes IS NULL OR max_sandboxes >= 0)
) STRICT;

CREATE TABLE keys (
    id           TEXT PRIMARY KEY NOT NULL,
    hash         TEXT NOT NULL UNIQUE,
    team         TEXT NOT NULL REFERENCES teams(name),
    admin        INTEGER NOT NULL DEFAULT 0 CHECK (admin IN (0, 1)),
    name         TEXT NULL,
    created_at   INTEGER NOT NULL,
    revoked_at   INTEGER NULL,
    last_used_at INTEGER NULL
) STRICT;

CREATE INDEX keys_by_team ON keys(team);

CREATE TABLE sandboxes (
    id         TEXT PRIMARY KEY NOT NULL,
    team       TEXT NOT NULL,
    template   TEXT NOT NULL,
    runtime_id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    end_at     INTEGER NOT NULL,
    metadata   TEXT NOT NULL DEFAULT '{}'
) STRICT;
";

/// Version 2: built templates. `manifest` is the template's JSON manifest (sandbox defaults,
/// how it was built, its layers); the image file itself lives in the state directory.
const V2: &str = "
CREATE TABLE templates (
    name       TEXT PRIMARY KEY NOT NULL CHECK (length(name) BETWEEN 1 AND 63),
    digest     TEXT NOT NULL,
    image      TEXT NOT NULL,
    size       INTEGER NOT NULL CHECK (size > 0),
    manifest   TEXT NOT NULL,
    created_at INTEGER NOT NULL
) STRICT;
";

/// Version 3: secrets, encrypted (XChaCha20-Poly1305) under a master key kept outside the
/// database; `key_id` names the master key a row is sealed with (for rotation).
const V3: &str = "
CREATE TABLE secrets (
    team       TEXT NOT NULL,
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    key_id     TEXT NOT NULL,
    nonce      BLOB NOT NULL CHECK (length(nonce) = 24),
    ciphertext BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (team, name)
) STRICT;

CREATE TABLE secret_uses (
    at      INTEGER NOT NULL,
    team    TEXT NOT NULL,
    secret  TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    command TEXT NOT NULL
) STRICT;
CREATE INDEX secret_uses_team ON secret_uses (team, at);
";

/// Version 4: the record of one-shot runs and batches. `record` is the JSON the API returns
/// (see `crate::runs`); the columns beside it are what lists filter and sort on. A row whose
/// `ended_at` is NULL is a run in progress (or one a crashed server left; marked failed at
/// the next start).
const V4: &str = "
CREATE TABLE runs (
    id         TEXT PRIMARY KEY NOT NULL,
    team       TEXT NOT NULL,
    batch      TEXT NULL,
    created_at INTEGER NOT NULL,
    ended_at   INTEGER NULL,
    record     TEXT NOT NULL
) STRICT;
CREATE INDEX runs_by_team ON runs (team, created_at);
CREATE INDEX runs_by_batch ON runs (batch) WHERE batch IS NOT NULL;

CREATE TABLE batches (
    id         TEXT PRIMARY KEY NOT NULL,
    team       TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    ended_at   INTEGER NULL,
    record     TEXT NOT NULL
) STRICT;
CREATE INDEX batches_by_team ON batches (team, created_at);
";

/// Version 5: indexes for the retention of records (runs, batches and secret uses older than
/// the server's retention are deleted; see `Store::prune_records`).
const V5: &str = "
CREATE INDEX runs_by_end ON runs (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX batches_by_end ON batches (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX secret_uses_by_time ON secret_uses (at);
";

/// Version 6: volumes, the ids E2B's volume API knows teams' workspaces by (one per
/// workspace name; the files are the workspace's, the token is derived from the id).
const V6: &str = "
CREATE TABLE volumes (
    id         TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
    team       TEXT NOT NULL,
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    created_at INTEGER NOT NULL,
    UNIQUE (team, name)
) STRICT;
";

/// Version 7: what E2B's secret API keeps beside a value: its version (1 when made, one more
/// at each new value) and the customer's metadata (a JSON object of strings).
const V7: &str = "
ALTER TABLE secrets ADD COLUMN version INTEGER NOT NULL DEFAULT 1 CHECK (version >= 1);
ALTER TABLE secrets ADD COLUMN metadata TEXT NOT NULL DEFAULT '{}';
";

/// Version 8: sandboxes kept beyond their processes (paused to disk). `description` is the
/// core's JSON description of the sandbox (what a resume recreates it from, versioned inside);
/// its files are in the state directory (`paused/<id>/`).
const V8: &str = "
CREATE TABLE saved_sandboxes (
    id          TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
    team        TEXT NOT NULL,
    saved_at    INTEGER NOT NULL,
    description TEXT NOT NULL
) STRICT;
";

/// Version 9: snapshots, templates a team made of a sandbox's files. `record` is the core's
/// JSON description (versioned inside); its layers are in the state directory
/// (`snapshots/<id>/`). `state` is `live` (listed, created from by name) or `retired`
/// (deleted, replaced under its name, or a fork's: kept only while a sandbox or another
/// snapshot stands on it). `digest` is its template's image, which stays while it is used.
const V9: &str = "
CREATE TABLE snapshots (
    id         TEXT PRIMARY KEY NOT NULL CHECK (length(id) BETWEEN 1 AND 64),
    team       TEXT NOT NULL,
    name       TEXT NULL CHECK (name IS NULL OR length(name) BETWEEN 3 AND 129),
    state      TEXT NOT NULL CHECK (state IN ('live', 'retired')),
    digest     TEXT NULL,
    created_at INTEGER NOT NULL,
    record     TEXT NOT NULL
) STRICT;
CREATE UNIQUE INDEX snapshots_by_name ON snapshots (team, name)
    WHERE state = 'live' AND name IS NOT NULL;
CREATE INDEX snapshots_by_digest ON snapshots (digest) WHERE digest IS NOT NULL;
";

/// Version 10: sandboxes that ended with the server that ran them (it stopped or crashed and
/// nothing could take them up again) stay recorded, marked lost with when and why, so that
/// their team is told what happened to them rather than "not found"; kept for a week.
const V10: &str = "
ALTER TABLE sandboxes ADD COLUMN lost_at INTEGER NULL;
ALTER TABLE sandboxes ADD COLUMN lost_reason TEXT NULL;
CREATE INDEX sandboxes_lost ON sandboxes (lost_at) WHERE lost_at IS NOT NULL;
";

/// A running sandbox's description, for the server that takes it up after a restart.
const V11: &str = "
ALTER TABLE sandboxes ADD COLUMN description TEXT NULL;
";

const MIGRATIONS: &[&str] = &[V1, V2, V3, V4, V5, V6, V7, V8, V9, V10, V11];

/// The schema version this husk writes and understands.
pub(super) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the schema up to [`SCHEMA_VERSION`]. A database that is already current costs one read
/// and takes no write lock, so opening the store next to a busy server stays cheap.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    if check(version(conn)?)? {
        return Ok(());
    }
    // Another process may be migrating at the same moment: take the write lock first, then
    // read the version again and apply only what is still missing.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found = version(&tx)?;
    if !check(found)? {
        // `found` is in 0..SCHEMA_VERSION here, checked above.
        let done = usize::try_from(found).unwrap_or(0);
        for sql in MIGRATIONS.iter().skip(done) {
            tx.execute_batch(sql)?;
        }
        tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    }
    tx.commit()?;
    Ok(())
}

/// The stored schema version.
pub(super) fn version(conn: &Connection) -> Result<i64, StoreError> {
    Ok(conn.pragma_query_value(None, "user_version", |row| row.get(0))?)
}

/// Whether `found` is current; an error if it is newer than this husk or nonsense.
fn check(found: i64) -> Result<bool, StoreError> {
    match found {
        v if v == SCHEMA_VERSION => Ok(true),
        v if v > SCHEMA_VERSION => Err(StoreError::SchemaTooNew {
            found: v,
            supported: SCHEMA_VERSION,
        }),
        v if v < 0 => Err(StoreError::Corrupt(format!("schema version {v}"))),
        _ => Ok(false),
    }
}
