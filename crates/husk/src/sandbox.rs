//! `husk sandbox`: a server's sandboxes. `list` shows them, running and paused; `pause`,
//! `resume`, `snapshot`, `fork` and `kill` act on one (the E2B API's calls); `logs` shows a
//! sandbox's denied connections (what its network policy refused), oldest first.

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
    /// The team's sandboxes, running and paused (or lost), oldest first.
    List(ListArgs),
    /// Pauses a sandbox: frozen in place with its memory, or (--files-only) its files saved
    /// to disk and its processes ended. It keeps its id and stays until resumed or killed.
    Pause(PauseArgs),
    /// Resumes a paused sandbox (a running one gets its timeout extended).
    Resume(ResumeArgs),
    /// Snapshots a running sandbox: a template of its files that new sandboxes start from
    /// (`husk template list` shows it). The sandbox is frozen for the copy, then goes on.
    Snapshot(SnapshotArgs),
    /// Starts new sandboxes from one snapshot of a running sandbox, with its settings; the
    /// source goes on. Prints one line per fork: its id, or why it did not start.
    Fork(ForkArgs),
    /// Kills a sandbox, running or paused, with everything it had.
    Kill(IdArgs),
    /// A sandbox's log: the connections its network policy refused.
    Logs(LogsArgs),
}

/// Where the server is.
#[derive(clap::Args, Debug)]
pub struct ServerFlags {
    /// The husk server [default: $HUSK_SERVER, else http://127.0.0.1:3000]. The key comes
    /// from HUSK_API_KEY, else E2B_API_KEY, else STATE_DIR/admin.key.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// State directory holding the admin key [default: /var/lib/husk].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

impl ServerFlags {
    fn client(&self) -> Result<Client> {
        Client::from_flags(self.server.as_deref(), self.state_dir.as_deref())
    }
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {
    /// Only sandboxes in this state; `lost`: those that ended with the server that ran them
    /// (kept a week, with when and why).
    #[arg(long, value_parser = ["running", "paused", "lost"])]
    pub state: Option<String>,
    #[command(flatten)]
    pub server: ServerFlags,
    /// Print the list as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct PauseArgs {
    /// The sandbox's id.
    pub id: String,
    /// Keep only its files (saved to disk; its processes end, its memory is freed).
    #[arg(long)]
    pub files_only: bool,
    #[command(flatten)]
    pub server: ServerFlags,
}

#[derive(clap::Args, Debug)]
pub struct ResumeArgs {
    /// The sandbox's id.
    pub id: String,
    /// Seconds it then runs before its timeout [default: the server's, 300].
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    #[command(flatten)]
    pub server: ServerFlags,
}

#[derive(clap::Args, Debug)]
pub struct SnapshotArgs {
    /// The sandbox's id.
    pub id: String,
    /// Name it (`name` or `name:tag`); a snapshot of the team already named so is replaced.
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub server: ServerFlags,
}

#[derive(clap::Args, Debug)]
pub struct ForkArgs {
    /// The sandbox's id.
    pub id: String,
    /// How many sandboxes to start (1 to 20).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub count: u32,
    /// Seconds each runs before its timeout [default: the source's].
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,
    #[command(flatten)]
    pub server: ServerFlags,
}

#[derive(clap::Args, Debug)]
pub struct IdArgs {
    /// The sandbox's id.
    pub id: String,
    #[command(flatten)]
    pub server: ServerFlags,
}

#[derive(clap::Args, Debug)]
pub struct LogsArgs {
    /// The sandbox's id.
    pub id: String,
    #[command(flatten)]
    pub server: ServerFlags,
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
        SandboxCommand::List(a) => list(a),
        SandboxCommand::Pause(a) => pause(a),
        SandboxCommand::Resume(a) => resume(a),
        SandboxCommand::Snapshot(a) => snapshot(a),
        SandboxCommand::Fork(a) => fork(a),
        SandboxCommand::Kill(a) => kill(a),
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

/// A sandbox as the list shows it (E2B's listed sandbox).
#[derive(Deserialize, Debug)]
struct Listed {
    #[serde(rename = "sandboxID")]
    id: String,
    #[serde(rename = "templateID")]
    template: String,
    state: String,
    #[serde(rename = "startedAt")]
    started_at: String,
    #[serde(rename = "endAt")]
    end_at: String,
    #[serde(rename = "lostReason", default)]
    lost_reason: Option<String>,
}

fn list(args: ListArgs) -> Result<i32> {
    let client = args.server.client()?;
    let rt = client::runtime()?;
    let mut path = "/v2/sandboxes?order=asc&limit=100".to_owned();
    if let Some(s) = &args.state {
        path.push_str(&format!("&state={s}"));
    }
    // Every page (the server answers at most 100 at a time).
    let mut all: Vec<serde_json::Value> = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let page_path = match &next {
            Some(t) => format!("{path}&nextToken={t}"),
            None => path.clone(),
        };
        let (page, token) = rt.block_on(client.get_json_paged(&page_path))?;
        all.extend(page);
        match token {
            Some(t) => next = Some(t),
            None => break,
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(0);
    }
    if all.is_empty() {
        eprintln!("husk: no sandboxes");
        return Ok(0);
    }
    println!(
        "{:<22} {:<8} {:<24} {:<26} ENDS (PAUSED AT, LOST AT)",
        "ID", "STATE", "TEMPLATE", "STARTED"
    );
    for v in all {
        let s: Listed = serde_json::from_value(v)?;
        println!(
            "{:<22} {:<8} {:<24} {:<26} {}{}",
            s.id,
            s.state,
            s.template,
            s.started_at,
            s.end_at,
            s.lost_reason
                .map(|r| format!("  ({r})"))
                .unwrap_or_default()
        );
    }
    Ok(0)
}

fn pause(args: PauseArgs) -> Result<i32> {
    let client = args.server.client()?;
    let rt = client::runtime()?;
    let body = serde_json::json!({"memory": !args.files_only});
    let path = format!("/sandboxes/{}/pause", args.id);
    let (status, _) = rt.block_on(client.post_json(&path, &body))?;
    if status == 409 {
        eprintln!("husk: sandbox {} is paused already", args.id);
    } else if args.files_only {
        eprintln!("husk: sandbox {} paused (its files saved to disk)", args.id);
    } else {
        eprintln!("husk: sandbox {} paused (frozen with its memory)", args.id);
    }
    Ok(0)
}

fn resume(args: ResumeArgs) -> Result<i32> {
    let client = args.server.client()?;
    let rt = client::runtime()?;
    let body = match args.timeout {
        Some(t) => serde_json::json!({"timeout": t}),
        None => serde_json::json!({}),
    };
    let path = format!("/v2/sandboxes/{}/connect", args.id);
    let (status, _) = rt.block_on(client.post_json(&path, &body))?;
    if status == 201 {
        eprintln!("husk: sandbox {} resumed", args.id);
    } else {
        eprintln!(
            "husk: sandbox {} was running (its timeout is extended)",
            args.id
        );
    }
    Ok(0)
}

/// The answer of a POST, or the server's reason for a 409 (a paused sandbox) as the error.
fn refused(status: u16, answer: Option<serde_json::Value>) -> Result<serde_json::Value> {
    let answer = answer.unwrap_or_default();
    if status == 409 {
        anyhow::bail!(
            "{}",
            answer["message"]
                .as_str()
                .unwrap_or("the sandbox is paused")
        );
    }
    Ok(answer)
}

fn snapshot(args: SnapshotArgs) -> Result<i32> {
    let client = args.server.client()?;
    let rt = client::runtime()?;
    let body = match &args.name {
        Some(n) => serde_json::json!({"name": n}),
        None => serde_json::json!({}),
    };
    let path = format!("/sandboxes/{}/snapshots", args.id);
    let (status, answer) = rt.block_on(client.post_json(&path, &body))?;
    let answer = refused(status, answer)?;
    let id = answer["snapshotID"].as_str().unwrap_or_default();
    // The id alone on stdout, for scripts: `husk sandbox snapshot X | xargs ...`.
    println!("{id}");
    eprintln!("husk: snapshot of sandbox {} taken", args.id);
    Ok(0)
}

fn fork(args: ForkArgs) -> Result<i32> {
    let client = args.server.client()?;
    let rt = client::runtime()?;
    let mut body = serde_json::json!({"count": args.count});
    if let Some(t) = args.timeout {
        body["timeout"] = t.into();
    }
    let path = format!("/sandboxes/{}/fork", args.id);
    let (status, answer) = rt.block_on(client.post_json(&path, &body))?;
    let answer = refused(status, answer)?;
    let mut failed = 0;
    for item in answer.as_array().map(Vec::as_slice).unwrap_or_default() {
        match item["sandbox"]["sandboxID"].as_str() {
            Some(id) => println!("{id}"),
            None => {
                failed += 1;
                eprintln!(
                    "husk: a fork did not start: {}",
                    item["error"]["message"]
                        .as_str()
                        .unwrap_or("(no reason given)")
                );
            }
        }
    }
    Ok(if failed > 0 { 1 } else { 0 })
}

fn kill(args: IdArgs) -> Result<i32> {
    let client = args.server.client()?;
    let rt = client::runtime()?;
    rt.block_on(client.delete(&format!("/sandboxes/{}", args.id)))?;
    eprintln!("husk: sandbox {} killed", args.id);
    Ok(0)
}

fn logs(args: LogsArgs) -> Result<i32> {
    let client = args.server.client()?;
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
