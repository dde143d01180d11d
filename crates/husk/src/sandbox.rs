//! `husk sandbox`: looking at a server's running sandboxes. `logs` shows a sandbox's denied
//! connections (what its network policy refused), oldest first.

use std::path::PathBuf;

use anyhow::Result;
use serde::Deserialize;

use crate::client::{self, Client};

#[derive(clap::Args, Debug)]
pub struct SandboxArgs {
    #[command(subcommand)]
    pub command: SandboxCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum SandboxCommand {
    /// A sandbox's log: the connections its network policy refused.
    Logs(LogsArgs),
}

#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    /// The sandbox's id.
    pub id: String,
    /// The husk server [default: $HUSK_SERVER, else http://127.0.0.1:3000]. The key comes
    /// from HUSK_API_KEY, else E2B_API_KEY, else STATE_DIR/admin.key.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// State directory holding the admin key [default: /var/lib/husk].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print the records as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Deserialize, Debug)]
struct Denials {
    denials: Vec<husk_net::Denial>,
}

pub fn main(args: SandboxArgs) -> i32 {
    let result = match args.command {
        SandboxCommand::Logs(a) => logs(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            crate::report::say(&crate::report::anyhow(&e));
            1
        }
    }
}

fn logs(args: LogsArgs) -> Result<i32> {
    let client = Client::from_flags(args.server.as_deref(), args.state_dir.as_deref())?;
    let rt = client::runtime()?;
    let path = format!("/husk/v1/sandboxes/{}/denials", args.id);
    if args.json {
        let v: serde_json::Value = rt.block_on(client.get_json(&path))?;
        println!("{}", serde_json::to_string_pretty(&v["denials"])?);
        return Ok(0);
    }
    let d: Denials = rt.block_on(client.get_json(&path))?;
    if d.denials.is_empty() {
        eprintln!("husk: no denied connections");
    }
    for e in &d.denials {
        let at = time::OffsetDateTime::from_unix_timestamp(e.at as i64)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| e.at.to_string());
        println!("{at}  {}", husk_net::sandboxes::describe(e));
    }
    Ok(0)
}
