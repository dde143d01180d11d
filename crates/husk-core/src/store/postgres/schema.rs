//! The PostgreSQL schema, as refinery migrations in `husk_schema_history`.
//!
//! Append-only like the SQLite migrations: a released entry never changes (refinery checks
//! each applied migration's checksum and refuses a database whose history diverges), and a
//! change is a new entry. The first version is the SQLite schema as it stands at its version
//! 11, in PostgreSQL's types, plus the `node` of the rows a server takes up when it starts.

use refinery::Migration;

use super::super::StoreError;

/// Version 1: everything the SQLite file holds at its version 11.
///
/// Times are Unix nanoseconds (`BIGINT`). `sandboxes.team` has no foreign key, for the
/// reason given in the SQLite schema (the record must never refuse a sandbox that exists).
const V1: &str = "
CREATE TABLE teams (
    name          TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 64),
    created_at    BIGINT NOT NULL,
    max_sandboxes BIGINT NULL CHECK (max_sandboxes IS NULL OR max_sandboxes >= 0)
);

CREATE TABLE keys (
    id           TEXT PRIMARY KEY,
    hash         TEXT NOT NULL UNIQUE,
    team         TEXT NOT NULL REFERENCES teams(name),
    admin        BOOLEAN NOT NULL DEFAULT false,
    name         TEXT NULL,
    created_at   BIGINT NOT NULL,
    revoked_at   BIGINT NULL,
    last_used_at BIGINT NULL
);
CREATE INDEX keys_by_team ON keys (team);

CREATE TABLE sandboxes (
    id          TEXT PRIMARY KEY,
    node        TEXT NOT NULL,
    team        TEXT NOT NULL,
    template    TEXT NOT NULL,
    runtime_id  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    end_at      BIGINT NOT NULL,
    metadata    TEXT NOT NULL DEFAULT '{}',
    description TEXT NULL,
    lost_at     BIGINT NULL,
    lost_reason TEXT NULL
);
CREATE INDEX sandboxes_live_by_node ON sandboxes (node, created_at) WHERE lost_at IS NULL;
CREATE INDEX sandboxes_live_by_team ON sandboxes (team) WHERE lost_at IS NULL;
CREATE INDEX sandboxes_lost ON sandboxes (lost_at) WHERE lost_at IS NOT NULL;

CREATE TABLE templates (
    name       TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 63),
    digest     TEXT NOT NULL,
    image      TEXT NOT NULL,
    size       BIGINT NOT NULL CHECK (size > 0),
    manifest   TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX templates_by_digest ON templates (digest);

CREATE TABLE secrets (
    team       TEXT NOT NULL,
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 128),
    key_id     TEXT NOT NULL,
    nonce      BYTEA NOT NULL CHECK (length(nonce) = 24),
    ciphertext BYTEA NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    version    BIGINT NOT NULL DEFAULT 1 CHECK (version >= 1),
    metadata   TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (team, name)
);

CREATE TABLE secret_uses (
    id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      BIGINT NOT NULL,
    team    TEXT NOT NULL,
    secret  TEXT NOT NULL,
    sandbox TEXT NOT NULL,
    command TEXT NOT NULL
);
CREATE INDEX secret_uses_team ON secret_uses (team, at);
CREATE INDEX secret_uses_by_time ON secret_uses (at);

CREATE TABLE runs (
    id         TEXT PRIMARY KEY,
    node       TEXT NOT NULL,
    team       TEXT NOT NULL,
    batch      TEXT NULL,
    created_at BIGINT NOT NULL,
    ended_at   BIGINT NULL,
    record     TEXT NOT NULL
);
CREATE INDEX runs_by_team ON runs (team, created_at);
CREATE INDEX runs_by_batch ON runs (batch) WHERE batch IS NOT NULL;
CREATE INDEX runs_by_end ON runs (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX runs_unfinished ON runs (node) WHERE ended_at IS NULL;

CREATE TABLE batches (
    id         TEXT PRIMARY KEY,
    node       TEXT NOT NULL,
    team       TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    ended_at   BIGINT NULL,
    record     TEXT NOT NULL
);
CREATE INDEX batches_by_team ON batches (team, created_at);
CREATE INDEX batches_by_end ON batches (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX batches_unfinished ON batches (node) WHERE ended_at IS NULL;

CREATE TABLE volumes (
    id         TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    team       TEXT NOT NULL,
    name       TEXT NOT NULL CHECK (length(name) BETWEEN 1 AND 64),
    created_at BIGINT NOT NULL,
    UNIQUE (team, name)
);

CREATE TABLE saved_sandboxes (
    id          TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    node        TEXT NOT NULL,
    team        TEXT NOT NULL,
    saved_at    BIGINT NOT NULL,
    description TEXT NOT NULL
);
CREATE INDEX saved_sandboxes_by_node ON saved_sandboxes (node);

CREATE TABLE snapshots (
    id         TEXT PRIMARY KEY CHECK (length(id) BETWEEN 1 AND 64),
    node       TEXT NOT NULL,
    team       TEXT NOT NULL,
    name       TEXT NULL CHECK (name IS NULL OR length(name) BETWEEN 3 AND 129),
    state      TEXT NOT NULL CHECK (state IN ('live', 'retired')),
    digest     TEXT NULL,
    created_at BIGINT NOT NULL,
    record     TEXT NOT NULL
);
CREATE UNIQUE INDEX snapshots_by_name ON snapshots (team, name)
    WHERE state = 'live' AND name IS NOT NULL;
CREATE INDEX snapshots_by_digest ON snapshots (digest) WHERE digest IS NOT NULL;
CREATE INDEX snapshots_by_node ON snapshots (node);
";

/// Version 2: the cluster. Nodes (see `store/cluster.rs`), places in teams' quotas held by
/// gateways while a create is under way, and the two operations that must be atomic and
/// timed by one clock, as functions: claiming a place (the team's quota or the default, lock
/// the team, count its sandboxes on every node and the places held, hold one) and declaring silent nodes lost (a node that
/// stopped cleanly, draining, is given longer: it is being restarted). The advisory lock keys
/// spell "husq" and "husr".
const V2: &str = "
CREATE TABLE nodes (
    name          TEXT PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 63),
    code          TEXT NOT NULL UNIQUE CHECK (length(code) = 4),
    url           TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('ready', 'draining', 'lost')),
    capacity      BIGINT NOT NULL CHECK (capacity >= 0),
    live          BIGINT NOT NULL DEFAULT 0 CHECK (live >= 0),
    templates     TEXT[] NOT NULL DEFAULT '{}',
    registered_at BIGINT NOT NULL,
    last_seen     BIGINT NOT NULL
);

CREATE TABLE quota_claims (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    team       TEXT NOT NULL,
    expires_at BIGINT NOT NULL
);
CREATE INDEX quota_claims_by_team ON quota_claims (team);

CREATE FUNCTION husk_now() RETURNS BIGINT LANGUAGE sql VOLATILE AS
$$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000000)::BIGINT $$;

CREATE FUNCTION husk_claim_quota(p_team TEXT, p_default BIGINT, p_ttl BIGINT)
RETURNS TABLE (claim BIGINT, quota BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    now_ns BIGINT := husk_now();
    used   BIGINT;
BEGIN
    quota := coalesce((SELECT max_sandboxes FROM teams WHERE name = p_team), p_default);
    claim := NULL;
    PERFORM pg_advisory_xact_lock(1752527729, hashtext(p_team));
    DELETE FROM quota_claims WHERE team = p_team AND expires_at < now_ns;
    SELECT (SELECT count(*) FROM sandboxes WHERE team = p_team AND lost_at IS NULL)
         + (SELECT count(*) FROM quota_claims q WHERE q.team = p_team)
      INTO used;
    IF used < quota THEN
        INSERT INTO quota_claims (team, expires_at) VALUES (p_team, now_ns + p_ttl)
            RETURNING id INTO claim;
    END IF;
    RETURN NEXT;
END $$;

CREATE FUNCTION husk_reap_nodes(p_silent BIGINT, p_draining BIGINT)
RETURNS TABLE (lost_node TEXT, lost_sandboxes BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    now_ns BIGINT := husk_now();
BEGIN
    IF NOT pg_try_advisory_xact_lock(1752527730) THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH gone AS (
        UPDATE nodes SET state = 'lost'
        WHERE (state = 'ready' AND last_seen < now_ns - p_silent)
           OR (state = 'draining' AND last_seen < now_ns - p_draining)
        RETURNING name
    ), lost AS (
        UPDATE sandboxes s
        SET lost_at = now_ns,
            lost_reason = format('its node %s stopped answering', gone.name)
        FROM gone WHERE s.node = gone.name AND s.lost_at IS NULL
        RETURNING s.node
    )
    SELECT gone.name, (SELECT count(*) FROM lost WHERE lost.node = gone.name) FROM gone;
END $$;
";

/// Version 3: a node an operator drained (`husk cluster drain`) stays drained through its
/// restarts until `husk cluster ready`; a node's own drain at a stop does not (`held`).
const V3: &str = "
ALTER TABLE nodes ADD COLUMN held BOOLEAN NOT NULL DEFAULT false;
";

/// Version 4, for creates at a sustained rate:
/// - A quota claim and its release commit without waiting for the disk (the transaction's
///   `synchronous_commit`, never the session's). A claim lives for one create: one lost in a
///   database crash frees a place early, at worst letting the creates under way at that
///   moment past a full quota once. Their sandboxes' rows, which count after, stay durable.
///   A create's claim through a gateway then costs one round trip, not also a flush.
/// - Their statements read the team's rows by plain index scans (`enable_bitmapscan` off in
///   the functions alone). Every create leaves a dead claim row, and every kill a dead
///   sandbox row. A plain index scan marks dead entries so the next scan skips them; a
///   bitmap scan (what the planner picks on tables not yet vacuumed) visits every one again.
///   A claim and release measured 0.2 ms at first and 2.4 ms a minute of churn later, until
///   autovacuum ran; with plain scans they stay at 0.2 ms.
const V4: &str = "
CREATE OR REPLACE FUNCTION husk_claim_quota(p_team TEXT, p_default BIGINT, p_ttl BIGINT)
RETURNS TABLE (claim BIGINT, quota BIGINT)
LANGUAGE plpgsql
SET enable_bitmapscan = off
AS $$
DECLARE
    now_ns BIGINT := husk_now();
    used   BIGINT;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    quota := coalesce((SELECT max_sandboxes FROM teams WHERE name = p_team), p_default);
    claim := NULL;
    PERFORM pg_advisory_xact_lock(1752527729, hashtext(p_team));
    DELETE FROM quota_claims WHERE team = p_team AND expires_at < now_ns;
    SELECT (SELECT count(*) FROM sandboxes WHERE team = p_team AND lost_at IS NULL)
         + (SELECT count(*) FROM quota_claims q WHERE q.team = p_team)
      INTO used;
    IF used < quota THEN
        INSERT INTO quota_claims (team, expires_at) VALUES (p_team, now_ns + p_ttl)
            RETURNING id INTO claim;
    END IF;
    RETURN NEXT;
END $$;

CREATE FUNCTION husk_release_quota(p_claim BIGINT) RETURNS VOID
LANGUAGE plpgsql
SET enable_bitmapscan = off
AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    DELETE FROM quota_claims WHERE id = p_claim;
END $$;
";

/// The migrations, oldest first: (refinery's name, SQL).
const MIGRATIONS: &[(&str, &str)] = &[
    ("V1__initial", V1),
    ("V2__cluster", V2),
    ("V3__held_nodes", V3),
    ("V4__async_quota_claims", V4),
];

/// The schema version this husk writes and understands.
pub(in crate::store) const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// refinery's table of applied migrations.
const HISTORY: &str = "husk_schema_history";

/// The advisory lock that serialises migrations across processes ("husk" in ASCII).
const MIGRATION_LOCK: i64 = 0x6875_736b;

/// Brings the schema up to [`SCHEMA_VERSION`], refusing a database from a newer husk.
/// Nodes starting at once take turns under an advisory lock; the second finds nothing to do.
pub(super) fn migrate(client: &mut postgres::Client) -> Result<(), StoreError> {
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])?;
    let result = migrate_locked(client);
    // The lock is the session's: a connection returned to the pool must not keep it.
    let unlocked = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]);
    result?;
    unlocked?;
    Ok(())
}

fn migrate_locked(client: &mut postgres::Client) -> Result<(), StoreError> {
    let found = version(client)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(());
    }
    let migrations = MIGRATIONS
        .iter()
        .map(|(name, sql)| Migration::unapplied(name, sql))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| StoreError::Migration(e.to_string()))?;
    // One transaction for all pending migrations: a crash leaves the old schema or the new
    // one, as with SQLite.
    let mut runner = refinery::Runner::new(&migrations).set_grouped(true);
    runner
        .set_migration_table_name(HISTORY)
        .run(client)
        .map_err(|e| StoreError::Migration(e.to_string()))?;
    Ok(())
}

/// The newest applied migration's version (0: none, a new database).
pub(in crate::store) fn version(client: &mut postgres::Client) -> Result<i64, StoreError> {
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY])?
        .get(0);
    if !exists {
        return Ok(0);
    }
    let v: Option<i32> = client
        .query_one(&format!("SELECT max(version) FROM {HISTORY}"), &[])?
        .get(0);
    Ok(i64::from(v.unwrap_or(0)))
}
