//! `husk cluster`: the operator's view of a cluster's nodes, in the shared database: list
//! them, drain one (gateways stop placing creates on it; its sandboxes keep running and
//! answering; it stays drained through its restarts, shown `held`), or make it ready again.

use std::io::{self, Write};

use husk_core::store::cluster::{NodeRow, NodeState};
use husk_core::store::Store;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    #[command(subcommand)]
    pub command: ClusterCommand,
    #[command(flatten)]
    pub database: crate::database::PostgresArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum ClusterCommand {
    /// List the nodes: state, load, capacity, images held, time since the last heartbeat.
    Nodes {
        /// One JSON object per node, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Take a node out of placement: no new sandboxes there; what it runs keeps running. Lasts
    /// through the node's restarts until `husk cluster ready NAME`.
    Drain {
        #[arg(value_name = "NAME")]
        node: String,
    },
    /// Put a drained node back into placement.
    Ready {
        #[arg(value_name = "NAME")]
        node: String,
    },
}

/// Opens the database as `node` (whose row the command changes; any valid name to list).
fn open(args: &ClusterArgs, node: &str) -> Result<Store, String> {
    args.database.open("husk cluster", node)
}

pub fn main(args: ClusterArgs) -> i32 {
    match run(&args) {
        Ok(()) => 0,
        Err(e) => {
            crate::report::say(&e);
            1
        }
    }
}

fn run(args: &ClusterArgs) -> Result<(), String> {
    match &args.command {
        ClusterCommand::Nodes { json } => {
            let store = open(args, "cli")?;
            let nodes = store.nodes().map_err(|e| crate::report::chain(&e))?;
            print_nodes(&nodes, *json).map_err(|e| e.to_string())
        }
        ClusterCommand::Drain { node } => set(args, node, NodeState::Draining),
        ClusterCommand::Ready { node } => set(args, node, NodeState::Ready),
    }
}

fn set(args: &ClusterArgs, node: &str, state: NodeState) -> Result<(), String> {
    husk_core::store::postgres::validate_node(node).map_err(|e| e.to_string())?;
    let store = open(args, node)?;
    let known = store.nodes().map_err(|e| crate::report::chain(&e))?;
    match known.iter().find(|n| n.name == node).map(|n| n.state) {
        None => {
            return Err(format!(
                "no node {node:?} in this cluster (husk cluster nodes)"
            ))
        }
        Some(NodeState::Lost) => {
            return Err(format!(
                "node {node:?} is lost: it becomes ready again by itself when it is back"
            ))
        }
        Some(_) => {}
    }
    // Held by the operator: the node stays drained through its restarts until made ready.
    store
        .hold_node(state == NodeState::Draining)
        .map_err(|e| crate::report::chain(&e))?;
    eprintln!(
        "husk: node {node} is {}{}",
        state.as_str(),
        match state {
            NodeState::Draining =>
                " (gateways place no new sandboxes there within a second; it stays drained \
                 through its restarts until `husk cluster ready`)",
            _ => "",
        }
    );
    Ok(())
}

fn print_nodes(nodes: &[NodeRow], json: bool) -> io::Result<()> {
    let mut out = io::stdout().lock();
    if json {
        for n in nodes {
            let v = serde_json::json!({
                "name": n.name, "code": n.code, "url": n.url, "state": n.state.as_str(),
                "capacity": n.capacity, "live": n.load.live, "templates": n.load.templates,
                "silentForMs": n.silent_for.as_millis() as u64, "held": n.held,
            });
            writeln!(out, "{v}")?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{:<24} {:<5} {:<9} {:>6} {:>8} {:>7} {:>9}  URL",
        "NAME", "CODE", "STATE", "LIVE", "CAPACITY", "IMAGES", "SILENT"
    )?;
    for n in nodes {
        writeln!(
            out,
            "{:<24} {:<5} {:<9} {:>6} {:>8} {:>7} {:>8.1}s  {}",
            n.name,
            n.code,
            match (n.state, n.held) {
                (NodeState::Draining, true) => "held",
                (state, _) => state.as_str(),
            },
            n.load.live,
            n.capacity,
            n.load.templates.len(),
            n.silent_for.as_secs_f64(),
            n.url
        )?;
    }
    Ok(())
}
