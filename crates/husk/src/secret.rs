//! `husk secret`: store, list and remove a team's secrets, and rotate the master key, in the
//! state directory (next to a running server, which shares the database and the key file).
//!
//! A value is never taken from the command line (argv is visible to every local user in
//! `/proc`): it is read from stdin (without echo at a terminal) or from a file.

use std::io::{self, IsTerminal, Read, Write};
use std::path::PathBuf;
use std::sync::Arc;

use husk_core::secrets::{MasterKeys, SecretError, Secrets, MASTER_KEY_FILE, MAX_SECRET_BYTES};
use husk_core::store::DEFAULT_STATE_DIR;
use time::format_description::well_known::Rfc3339;
use zeroize::Zeroizing;

const EXIT_USAGE: i32 = 125;
const EXIT_FAILURE: i32 = 1;

#[derive(clap::Args, Debug)]
pub struct SecretArgs {
    #[command(subcommand)]
    pub command: SecretCommand,
    /// State directory [default: /var/lib/husk]
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// The master key file [default: STATE_DIR/master.key; created on first use, mode 0600].
    #[arg(long, global = true, value_name = "FILE")]
    pub master_key: Option<PathBuf>,
    #[command(flatten)]
    pub database: crate::database::DatabaseArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum SecretCommand {
    /// Store a secret (replacing one of the same name); the value comes from stdin or a file.
    Set {
        /// Name: letters, digits and '_', as an environment variable's.
        name: String,
        /// The team that owns it.
        #[arg(long, value_name = "NAME")]
        team: String,
        /// Read the value from this file (as is) instead of stdin.
        #[arg(long, value_name = "FILE")]
        from_file: Option<PathBuf>,
    },
    /// List a team's secrets: names and dates, never values.
    List {
        #[arg(long, value_name = "NAME")]
        team: String,
    },
    /// Remove a secret.
    Rm {
        name: String,
        #[arg(long, value_name = "NAME")]
        team: String,
    },
    /// Replace the master key, resealing every secret under the new one.
    RotateKey,
    /// Which secrets went into which sandboxes (newest first; never values).
    Audit {
        #[arg(long, value_name = "NAME")]
        team: String,
        /// How many records.
        #[arg(long, default_value_t = 100, value_name = "N")]
        limit: u32,
    },
}

pub fn main(args: SecretArgs) -> i32 {
    let state_dir = args
        .state_dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    let key_path = args
        .master_key
        .unwrap_or_else(|| state_dir.join(MASTER_KEY_FILE));
    let store = match args.database.open_or_explain(&state_dir) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(e),
    };
    let keys = match MasterKeys::load(&key_path) {
        Ok(k) => k,
        Err(e) => return fail(e),
    };
    let secrets = Secrets::new(store, keys);
    let result = match args.command {
        SecretCommand::Set {
            name,
            team,
            from_file,
        } => read_value(&name, from_file).and_then(|v| {
            secrets.set(&team, &name, &v).map_err(Failure::from)?;
            eprintln!("stored secret {name} of team {team}");
            Ok(())
        }),
        SecretCommand::List { team } => list(&secrets, &team),
        SecretCommand::Rm { name, team } => secrets
            .remove(&team, &name)
            .map(|()| eprintln!("removed secret {name} of team {team}"))
            .map_err(Failure::from),
        SecretCommand::Audit { team, limit } => secrets
            .uses(&team, limit)
            .map(|uses| {
                println!("{:<32} {:<24} {:<22} COMMAND", "TIME", "SECRET", "SANDBOX");
                for u in uses {
                    println!(
                        "{:<32} {:<24} {:<22} {}",
                        u.at.format(&Rfc3339).unwrap_or_default(),
                        u.secret,
                        u.sandbox,
                        crate::units::without_controls(&u.command)
                    );
                }
            })
            .map_err(Failure::from),
        SecretCommand::RotateKey => secrets
            .rotate()
            .map(|n| eprintln!("master key rotated; {n} secret(s) resealed"))
            .map_err(Failure::from),
    };
    match result {
        Ok(()) => 0,
        Err(Failure::Usage(m)) => {
            eprintln!("husk: {m}");
            EXIT_USAGE
        }
        Err(Failure::Failed(m)) => fail(m),
    }
}

enum Failure {
    Usage(String),
    Failed(String),
}

impl From<SecretError> for Failure {
    fn from(e: SecretError) -> Failure {
        match e {
            SecretError::InvalidName(_)
            | SecretError::TooLarge { .. }
            | SecretError::Nul(_)
            | SecretError::Store(husk_core::store::StoreError::InvalidTeam(_)) => {
                Failure::Usage(crate::report::chain(&e))
            }
            other => Failure::Failed(crate::report::chain(&other)),
        }
    }
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    crate::report::say(&msg.to_string());
    EXIT_FAILURE
}

/// The value: a file as is, or stdin (one trailing newline dropped: `echo v | husk secret set`).
fn read_value(name: &str, file: Option<PathBuf>) -> Result<Zeroizing<Vec<u8>>, Failure> {
    let limit = MAX_SECRET_BYTES as u64 + 1;
    let mut value = Zeroizing::new(Vec::new());
    match file {
        Some(path) => {
            std::fs::File::open(&path)
                .and_then(|f| f.take(limit).read_to_end(&mut value))
                .map_err(|e| Failure::Usage(format!("--from-file {}: {e}", path.display())))?;
        }
        None => {
            let stdin = io::stdin();
            let _quiet = if stdin.is_terminal() {
                eprint!("value of secret {name} (not shown): ");
                let _ = io::stderr().flush();
                husk_runtime::pty::RawMode::without_echo(std::os::fd::AsFd::as_fd(&stdin)).ok()
            } else {
                None
            };
            stdin
                .lock()
                .take(limit)
                .read_to_end(&mut value)
                .map_err(|e| Failure::Failed(format!("reading stdin: {e}")))?;
            if stdin.is_terminal() {
                eprintln!();
            }
            if value.ends_with(b"\n") {
                value.pop();
            }
        }
    }
    if value.is_empty() {
        return Err(Failure::Usage(format!("secret {name}: the value is empty")));
    }
    Ok(value)
}

fn list(secrets: &Secrets, team: &str) -> Result<(), Failure> {
    let all = secrets.list(team).map_err(Failure::from)?;
    println!("{:<40} {:<32} UPDATED", "NAME", "CREATED");
    for s in all {
        println!(
            "{:<40} {:<32} {}",
            s.name,
            s.created_at.format(&Rfc3339).unwrap_or_default(),
            s.updated_at.format(&Rfc3339).unwrap_or_default()
        );
    }
    Ok(())
}
