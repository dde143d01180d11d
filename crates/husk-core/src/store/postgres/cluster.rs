//! The cluster's membership and quota claims in PostgreSQL (see `store/cluster.rs`). Every
//! method is one statement: the claim and the sweep are functions in the database (schema
//! version 2) so that their lock, count and write are one round trip, atomic, and timed by
//! the database's clock rather than by machines' clocks that may disagree.

use std::time::Duration;

use super::super::cluster::{
    Claimed, Heartbeat, NodeLoad, NodeRow, NodeState, Reaped, NODE_CODE_LEN,
};
use super::super::keys::principal_of;
use super::super::{validate_team, Principal, StoreError};
use super::{is_unique_violation, Postgres};

/// How many random codes registering a new node tries before giving up (there are 36^4).
const CODE_ATTEMPTS: u32 = 16;

/// Longest node API URL.
const MAX_URL_LEN: usize = 512;

/// Most template digests a heartbeat carries.
pub const MAX_NODE_TEMPLATES: usize = 4096;

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

fn random_code() -> Result<String, StoreError> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; NODE_CODE_LEN];
    getrandom::fill(&mut bytes)
        .map_err(|e| StoreError::Corrupt(format!("the random number generator: {e}")))?;
    Ok(bytes
        .iter()
        .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
        .collect())
}

fn check_url(url: &str) -> Result<(), StoreError> {
    let ok = url.len() <= MAX_URL_LEN
        && (url.starts_with("http://") || url.starts_with("https://"))
        && !url.bytes().any(|b| b.is_ascii_control() || b == b' ');
    if ok {
        Ok(())
    } else {
        Err(StoreError::Corrupt(format!(
            "node API URL {url:?}: give http://HOST:PORT, at most {MAX_URL_LEN} characters"
        )))
    }
}

impl Postgres {
    /// Registers this node (or finds it registered) with where its node API listens and how
    /// many sandboxes it takes, marks it ready, and returns its code: kept for ever once
    /// drawn, since its sandboxes' ids begin with it.
    pub fn register_node(&self, url: &str, capacity: u32) -> Result<String, StoreError> {
        check_url(url)?;
        let mut conn = self.conn()?;
        let capacity = i64::from(capacity);
        for _ in 0..CODE_ATTEMPTS {
            let code = random_code()?;
            let row = conn.query_one(
                "INSERT INTO nodes (name, code, url, state, capacity, registered_at, last_seen)
                 VALUES ($1, $2, $3, 'ready', $4, husk_now(), husk_now())
                 ON CONFLICT (name) DO UPDATE
                   SET url = excluded.url, capacity = excluded.capacity,
                       state = CASE WHEN nodes.held THEN 'draining' ELSE 'ready' END,
                       last_seen = excluded.last_seen
                 RETURNING code",
                &[&self.node, &code, &url, &capacity],
            );
            match row {
                Ok(row) => return Ok(row.get(0)),
                // Another node drew this code first: draw again.
                Err(e) if is_unique_violation(&e) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(StoreError::Corrupt(format!(
            "no free node code after {CODE_ATTEMPTS} attempts"
        )))
    }

    /// This node's heartbeat: its load, now. `None` when the node is not registered (an
    /// operator removed it): register again.
    pub fn node_heartbeat(&self, load: &NodeLoad) -> Result<Option<Heartbeat>, StoreError> {
        let live = i64::from(load.live);
        let templates: Vec<&str> = load
            .templates
            .iter()
            .take(MAX_NODE_TEMPLATES)
            .map(String::as_str)
            .collect();
        let row = self.conn()?.query_opt(
            "WITH old AS (SELECT state FROM nodes WHERE name = $1 FOR UPDATE)
             UPDATE nodes n SET live = $2, templates = $3, last_seen = husk_now(),
                 state = CASE WHEN n.state <> 'lost' THEN n.state
                              WHEN n.held THEN 'draining' ELSE 'ready' END
             FROM old WHERE n.name = $1
             RETURNING n.state, old.state",
            &[&self.node, &live, &templates],
        )?;
        let Some(row) = row else { return Ok(None) };
        let state = NodeState::parse(row.get(0))?;
        let was = NodeState::parse(row.get(1))?;
        Ok(Some(Heartbeat {
            state,
            was_lost: was == NodeState::Lost,
        }))
    }

    /// Sets this node's state (`Draining` when it shuts down or is drained; `Ready` again).
    pub fn set_node_state(&self, state: NodeState) -> Result<bool, StoreError> {
        let n = self.conn()?.execute(
            "UPDATE nodes SET state = $2 WHERE name = $1",
            &[&self.node, &state.as_str()],
        )?;
        Ok(n == 1)
    }

    /// Holds this node out of placement (`held`: drained by an operator, through its
    /// restarts) or lets it back (ready); a lost node stays lost until it beats again. Whether
    /// the node is registered.
    pub fn hold_node(&self, held: bool) -> Result<bool, StoreError> {
        let n = self.conn()?.execute(
            "UPDATE nodes SET held = $2,
                 state = CASE WHEN state = 'lost' THEN 'lost'
                              WHEN $2 THEN 'draining' ELSE 'ready' END
             WHERE name = $1",
            &[&self.node, &held],
        )?;
        Ok(n == 1)
    }

    /// Every node, by name.
    pub fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        let rows = self.conn()?.query(
            "SELECT name, code, url, state, capacity, live, templates,
                    greatest(husk_now() - last_seen, 0), held
             FROM nodes ORDER BY name",
            &[],
        )?;
        rows.iter()
            .map(|r| {
                let count = |i: usize, what: &str| -> Result<u32, StoreError> {
                    let n: i64 = r.get(i);
                    u32::try_from(n).map_err(|_| StoreError::Corrupt(format!("node {what} {n}")))
                };
                let silent: i64 = r.get(7);
                Ok(NodeRow {
                    name: r.get(0),
                    code: r.get(1),
                    url: r.get(2),
                    state: NodeState::parse(r.get(3))?,
                    capacity: count(4, "capacity")?,
                    load: NodeLoad {
                        live: count(5, "load")?,
                        templates: r.get(6),
                    },
                    silent_for: Duration::from_nanos(u64::try_from(silent).unwrap_or(0)),
                    held: r.get(8),
                })
            })
            .collect()
    }

    /// Holds a place in `team`'s quota of running sandboxes (its own, else `default`),
    /// counted across the cluster (its live sandboxes on every node, plus places held by
    /// creates under way), for at most `ttl` (a gateway that dies mid-create frees its place
    /// then). The place (`None`: the quota is full) and the quota. Teams are serialised
    /// against their own claims only.
    pub fn claim_quota(
        &self,
        team: &str,
        default: u32,
        ttl: Duration,
    ) -> Result<(Option<i64>, u32), StoreError> {
        validate_team(team)?;
        let row = self.conn()?.query_one(
            "SELECT claim, quota FROM husk_claim_quota($1, $2, $3)",
            &[&team, &i64::from(default), &nanos(ttl)],
        )?;
        let quota: i64 = row.get(1);
        let quota = u32::try_from(quota)
            .map_err(|_| StoreError::Corrupt(format!("quota {quota} of team {team:?}")))?;
        Ok((row.get(0), quota))
    }

    /// A create's key check and claim in one round trip: the key's caller, and a place in
    /// its team's quota as [`Postgres::claim_quota`] holds one (`None`: no such key, and
    /// nothing claimed).
    pub fn check_key_and_claim(
        &self,
        presented: &str,
        default: u32,
        ttl: Duration,
    ) -> Result<Option<(Principal, Claimed)>, StoreError> {
        if !crate::keys::looks_like_key(presented) {
            return Ok(None);
        }
        let hash = crate::keys::hash(presented);
        let mut conn = self.conn()?;
        // The claim runs for the key's row only: the key's own conditions filter it first.
        let Some(row) = conn.query_opt(
            "SELECT k.id, k.hash, k.team, k.admin, k.last_used_at, c.claim, c.quota
             FROM keys k, LATERAL husk_claim_quota(k.team, $2, $3) c
             WHERE k.hash = $1 AND k.revoked_at IS NULL",
            &[&hash, &i64::from(default), &nanos(ttl)],
        )?
        else {
            return Ok(None);
        };
        let claimed = Claimed {
            claim: row.get(5),
            quota: {
                let q: i64 = row.get(6);
                u32::try_from(q).map_err(|_| StoreError::Corrupt(format!("quota {q}")))?
            },
        };
        let who = principal_of(super::keys::found_key(&row), &hash, |id, now| {
            conn.execute(
                "UPDATE keys SET last_used_at = $2 WHERE id = $1",
                &[&id, &now],
            )?;
            Ok(())
        })?;
        match who {
            Some(who) => Ok(Some((who, claimed))),
            None => {
                // Not its key after all (the hashes compare equal in SQL, so never): no place.
                if let Some(claim) = claimed.claim {
                    drop(conn);
                    self.release_quota(claim)?;
                }
                Ok(None)
            }
        }
    }

    /// Gives a place back (the create finished: its sandbox now counts, or it failed).
    pub fn release_quota(&self, claim: i64) -> Result<(), StoreError> {
        self.conn()?
            .execute("SELECT husk_release_quota($1)", &[&claim])?;
        Ok(())
    }

    /// Declares lost every ready node silent for longer than `silent` and every draining one
    /// silent for longer than `draining` (it stopped cleanly: a restart, an upgrade, and its
    /// sandboxes wait for the next process on that machine), and their sandboxes with them
    /// (freeing their quota). One process sweeps at a time (a transaction's advisory lock):
    /// another's concurrent call returns nothing.
    pub fn reap_nodes(
        &self,
        silent: Duration,
        draining: Duration,
    ) -> Result<Vec<Reaped>, StoreError> {
        let rows = self.conn()?.query(
            "SELECT * FROM husk_reap_nodes($1, $2)",
            &[&nanos(silent), &nanos(draining)],
        )?;
        rows.iter()
            .map(|r| {
                let n: i64 = r.get(1);
                Ok(Reaped {
                    node: r.get(0),
                    sandboxes: u64::try_from(n).unwrap_or(0),
                })
            })
            .collect()
    }
}
