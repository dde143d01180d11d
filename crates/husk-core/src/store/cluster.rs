//! The cluster's membership as the store keeps it: which nodes there are, where their node
//! API listens, how loaded they are and which templates they hold, and the places in teams'
//! quotas that gateways hold while a create is under way. Only PostgreSQL keeps these (a
//! cluster shares one database); the SQLite file answers [`StoreError::NotClustered`].

use std::time::Duration;

use super::StoreError;

/// Characters of a node's code, the first characters of every sandbox id it makes: the
/// gateway routes by them without asking the database.
pub const NODE_CODE_LEN: usize = 4;

/// A node's state as gateways see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum NodeState {
    /// Takes creates.
    Ready,
    /// Serves its sandboxes but takes no creates (shutting down, or drained by an operator).
    Draining,
    /// Stopped answering: its sandboxes were recorded lost and their quota freed.
    Lost,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Ready => "ready",
            NodeState::Draining => "draining",
            NodeState::Lost => "lost",
        }
    }

    pub fn parse(s: &str) -> Result<NodeState, StoreError> {
        match s {
            "ready" => Ok(NodeState::Ready),
            "draining" => Ok(NodeState::Draining),
            "lost" => Ok(NodeState::Lost),
            other => Err(StoreError::Corrupt(format!("node state {other:?}"))),
        }
    }
}

/// What a node says about itself every heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeLoad {
    /// Sandboxes alive on it (paused ones included: they hold its memory).
    pub live: u32,
    /// The digests (`sha256:...`) of the template images it holds.
    pub templates: Vec<String>,
}

/// A node as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NodeRow {
    pub name: String,
    pub code: String,
    /// Where its node API listens (`http://10.0.0.5:3000`).
    pub url: String,
    pub state: NodeState,
    /// How many sandboxes it takes at most.
    pub capacity: u32,
    pub load: NodeLoad,
    /// Since its last heartbeat, by the database's clock (nodes' clocks may disagree).
    pub silent_for: Duration,
    /// Drained by an operator: it stays draining through its restarts until made ready.
    pub held: bool,
}

/// What a heartbeat learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Heartbeat {
    /// The node's state after the beat.
    pub state: NodeState,
    /// It had been declared lost (silent too long): its sandboxes were recorded lost, and
    /// those still running on it must go. The beat made it `ready` again.
    pub was_lost: bool,
}

/// Nodes declared lost by one sweep, and how many sandboxes each had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    pub node: String,
    pub sandboxes: u64,
}

/// A place claimed in a team's quota across the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimed {
    /// The place (give it back with `release_quota`); `None`: the quota is full.
    pub claim: Option<i64>,
    /// The team's quota.
    pub quota: u32,
}
