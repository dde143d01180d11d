//! `husk key`: create, list and revoke API keys, and set team quotas, in the state directory's
//! database. It works next to a running server (both share the SQLite file); a revocation takes
//! effect on the server's next request.
//!
//! Output is for scripts first: `husk key create` prints the key alone on stdout, so
//! `KEY=$(husk key create --team a)` works, and everything else it says goes to stderr.

use std::io::{self, Write};
use std::path::PathBuf;

use husk_core::keys::{self, KeyRef};
use husk_core::store::{KeyInfo, OffsetDateTime, StoreError, DEFAULT_STATE_DIR};
use time::format_description::well_known::Rfc3339;

use crate::units::without_controls;

/// Exit status for a usage error (bad team name, label or quota), as for `husk run`.
const EXIT_USAGE: i32 = 125;
/// Exit status for a failure (no such key, the database cannot be opened or written).
const EXIT_FAILURE: i32 = 1;

#[derive(clap::Args, Debug)]
pub struct KeyArgs {
    #[command(subcommand)]
    pub command: KeyCommand,
    /// State directory [default: /var/lib/husk]
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub database: crate::database::DatabaseArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum KeyCommand {
    /// Create a key for a team (the team is created if new) and print it: it is shown only once.
    Create {
        /// The team the key acts for: 1-64 characters of a-z, 0-9, '-' and '_'.
        #[arg(long, value_name = "NAME")]
        team: String,
        /// Let the key manage every team's keys and quotas through the API.
        #[arg(long)]
        admin: bool,
        /// A label to recognise the key by in `husk key list`.
        #[arg(long, value_name = "LABEL")]
        name: Option<String>,
    },
    /// List all keys, revoked ones included (never the keys themselves).
    List,
    /// Revoke a key, named by its id (e2b_1a2b3c4d… as listed, or 1a2b3c4d) or the whole key.
    Revoke {
        #[arg(value_name = "ID_OR_KEY")]
        id_or_key: String,
    },
    /// Show a team's limit of concurrent sandboxes, or set it (`none`: the server's default).
    Quota {
        #[arg(long, value_name = "NAME")]
        team: String,
        /// The new limit, or `none` for the server's default; without it, show the limit.
        #[arg(value_name = "MAX|none")]
        max: Option<String>,
    },
}

/// Why a `husk key` command failed; each maps to one exit status.
#[derive(Debug, thiserror::Error)]
enum KeyCliError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    NoSuchKey(String),
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
}

impl KeyCliError {
    fn exit_code(&self) -> i32 {
        match self {
            KeyCliError::Usage(_)
            | KeyCliError::Store(StoreError::InvalidTeam(_) | StoreError::InvalidLabel) => {
                EXIT_USAGE
            }
            _ => EXIT_FAILURE,
        }
    }
}

/// Runs `husk key …` and returns the exit status.
pub fn main(args: KeyArgs) -> i32 {
    let stdout = io::stdout();
    let stderr = io::stderr();
    run(args, &mut stdout.lock(), &mut stderr.lock())
}

/// [`main`] with the output streams passed in (for tests).
fn run(args: KeyArgs, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    match execute(args, out, err) {
        Ok(()) => 0,
        Err(e) => {
            // If stderr is gone too, the exit status is all that is left to say.
            let _ = writeln!(err, "husk: {}", without_controls(&e.to_string()));
            e.exit_code()
        }
    }
}

fn execute(args: KeyArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), KeyCliError> {
    // Check what can be checked before touching (or creating) the state directory.
    let quota = match &args.command {
        KeyCommand::Quota {
            max: Some(max),
            team,
        } => {
            husk_core::store::validate_team(team)?;
            Some(parse_quota(max)?)
        }
        _ => None,
    };
    let state_dir = args
        .state_dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    let store = args.database.open(&state_dir)?;
    match args.command {
        KeyCommand::Create { team, admin, name } => {
            let (info, secret) = store.create_key(&team, admin, name.as_deref())?;
            if let Err(e) = writeln!(out, "{secret}").and_then(|()| out.flush()) {
                // Nobody saw the key, so nobody can use it: do not leave it valid.
                store.revoke_key(&info.id)?;
                return Err(e.into());
            }
            let admin = if admin { " (admin)" } else { "" };
            let _ = writeln!(
                err,
                "created key {} for team {}{admin}; it is shown only this once",
                info.display_id(),
                info.team
            );
        }
        KeyCommand::List => {
            let keys = store.list_keys()?;
            out.write_all(key_table(&keys).as_bytes())?;
            out.flush()?;
        }
        KeyCommand::Revoke { id_or_key } => {
            let Some(reference) = keys::parse_ref(&id_or_key) else {
                return Err(KeyCliError::NoSuchKey(
                    "no such key (name it by its id, e2b_1a2b3c4d… as listed, or the whole key)"
                        .into(),
                ));
            };
            // Never echo a whole key: name it by its id.
            let shown = match reference {
                KeyRef::Id(id) => keys::display_id(&id),
                KeyRef::Key(key) => keys::key_id(key).map(keys::display_id).unwrap_or_default(),
            };
            if !store.revoke_key(&id_or_key)? {
                return Err(KeyCliError::NoSuchKey(format!("no such key {shown}")));
            }
            writeln!(out, "revoked {shown}")?;
            out.flush()?;
        }
        KeyCommand::Quota { team, .. } => {
            let max = match quota {
                Some(max) => {
                    store.set_team_quota(&team, max)?;
                    max
                }
                None => store.team_quota(&team)?,
            };
            match max {
                Some(n) => writeln!(out, "team {team}: at most {n} concurrent sandboxes")?,
                None => writeln!(out, "team {team}: the server's default")?,
            }
            out.flush()?;
        }
    }
    Ok(())
}

/// `MAX` of `husk key quota`: a number of sandboxes, or `none` for the server's default.
fn parse_quota(s: &str) -> Result<Option<u32>, KeyCliError> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    s.parse::<u32>().map(Some).map_err(|_| {
        KeyCliError::Usage(format!(
            "invalid quota {:?}: a number of sandboxes, or 'none'",
            s
        ))
    })
}

/// The `husk key list` table, columns padded to their widest cell.
fn key_table(keys: &[KeyInfo]) -> String {
    let header = ["ID", "TEAM", "ADMIN", "LABEL", "CREATED", "REVOKED"].map(String::from);
    let rows: Vec<[String; 6]> = std::iter::once(header)
        .chain(keys.iter().map(|k| {
            [
                k.display_id(),
                k.team.clone(),
                if k.admin { "yes" } else { "no" }.to_owned(),
                // Labels hold no control characters (the store refuses them); escape anyway,
                // as a hand-edited database must not write to the terminal.
                k.label
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), without_controls),
                utc(k.created_at),
                k.revoked_at.map_or_else(|| "-".to_owned(), utc),
            ]
        }))
        .collect();
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut table = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = w - cell.chars().count() + 2;
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        table.push_str(line.trim_end());
        table.push('\n');
    }
    table
}

/// A time to the second in UTC, RFC 3339: `2025-01-31T12:00:00Z`.
fn utc(t: OffsetDateTime) -> String {
    t.to_offset(time::UtcOffset::UTC)
        .replace_nanosecond(0)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicU32, Ordering};

    use clap::Parser;

    use super::*;
    use husk_core::store::Store;

    /// `husk key …` as the lead wires it: a `key` subcommand taking [`KeyArgs`].
    #[derive(clap::Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        command: Top,
    }

    #[derive(clap::Subcommand, Debug)]
    enum Top {
        Key(KeyArgs),
    }

    /// A temporary state directory, removed on drop (also when a test fails).
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> TempDir {
            static N: AtomicU32 = AtomicU32::new(0);
            let path = std::env::temp_dir().join(format!(
                "husk-key-cli-test-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&path);
            TempDir(path)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Runs `husk key <argv…> --state-dir <dir>`; returns the status, stdout and stderr.
    fn husk_key(dir: &Path, argv: &[&str]) -> (i32, String, String) {
        let mut full = vec!["husk", "key"];
        full.extend_from_slice(argv);
        full.extend(["--state-dir", dir.to_str().expect("utf-8 temp dir")]);
        let Top::Key(args) = Cli::try_parse_from(full).expect("parses").command;
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(args, &mut out, &mut err);
        let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8 output");
        (code, text(out), text(err))
    }

    #[test]
    fn create_prints_only_the_key_and_it_can_be_revoked() {
        let tmp = TempDir::new();
        let (code, out, err) = husk_key(&tmp.0, &["create", "--team", "acme", "--name", "ci"]);
        assert_eq!(code, 0, "{err}");
        let key = out.strip_suffix('\n').expect("one line");
        assert!(keys::looks_like_key(key), "{out:?}");
        let id = keys::key_id(key).expect("id");
        assert!(err.contains(&format!("e2b_{id}…")), "{err}");
        assert!(!err.contains(key), "the hint must not repeat the key");
        assert!(Store::open(&tmp.0)
            .expect("open")
            .authenticate(key)
            .is_some());

        let (code, out, _) = husk_key(&tmp.0, &["list"]);
        assert_eq!(code, 0);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(lines[0].starts_with("ID "), "{out}");
        for col in ["TEAM", "ADMIN", "LABEL", "CREATED", "REVOKED"] {
            assert!(lines[0].contains(col), "{out}");
        }
        assert!(
            lines[1].starts_with(&format!("e2b_{id}…  acme  no  ")),
            "{out}"
        );
        assert!(lines[1].ends_with("Z  -"), "{out}");
        assert!(!out.contains(&key[12..]), "the list must not show the key");

        let (code, out, err) = husk_key(&tmp.0, &["revoke", &format!("e2b_{id}…")]);
        assert_eq!(
            (code, out.as_str()),
            (0, format!("revoked e2b_{id}…\n").as_str()),
            "{err}"
        );
        assert!(Store::open(&tmp.0)
            .expect("open")
            .authenticate(key)
            .is_none());
        let (_, out, _) = husk_key(&tmp.0, &["list"]);
        assert!(!out.lines().nth(1).expect("row").ends_with('-'), "{out}");
    }

    #[test]
    fn revoking_an_unknown_key_fails_without_echoing_secrets() {
        let tmp = TempDir::new();
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        for (arg, shown) in [("0000abcd", "e2b_0000abcd…"), (key, "e2b_01234567…")] {
            let (code, out, err) = husk_key(&tmp.0, &["revoke", arg]);
            assert_eq!(code, 1);
            assert_eq!(out, "");
            assert_eq!(err, format!("husk: no such key {shown}\n"));
        }
        let (code, _, err) = husk_key(&tmp.0, &["revoke", "\x1b[2Jnonsense"]);
        assert_eq!(code, 1);
        assert!(
            err.starts_with("husk: no such key") && !err.contains('\x1b'),
            "{err:?}"
        );
    }

    #[test]
    fn usage_errors_exit_125() {
        let tmp = TempDir::new();
        for argv in [
            &["create", "--team", "Not Valid"][..],
            &["create", "--team", "a", "--name", "\x1b[31m"],
            &["quota", "--team", "a", "many"],
            &["quota", "--team", "a", "4294967296"],
            &["quota", "--team", "A!", "3"],
        ] {
            let (code, out, err) = husk_key(&tmp.0, argv);
            assert_eq!(code, 125, "{argv:?}: {err}");
            assert_eq!(out, "");
            assert!(
                err.starts_with("husk: ") && err.lines().count() == 1,
                "{err:?}"
            );
            assert!(!err.contains('\x1b'), "{err:?}");
        }
    }

    #[test]
    fn quota_show_set_and_reset() {
        let tmp = TempDir::new();
        let q = |argv: &[&str]| {
            let mut full = vec!["quota", "--team", "acme"];
            full.extend_from_slice(argv);
            let (code, out, err) = husk_key(&tmp.0, &full);
            assert_eq!(code, 0, "{err}");
            out
        };
        assert_eq!(q(&[]), "team acme: the server's default\n");
        assert_eq!(q(&["10"]), "team acme: at most 10 concurrent sandboxes\n");
        assert_eq!(q(&[]), "team acme: at most 10 concurrent sandboxes\n");
        assert_eq!(q(&["none"]), "team acme: the server's default\n");
    }

    #[test]
    fn an_unusable_state_dir_fails_with_one_line() {
        let tmp = TempDir::new();
        std::fs::create_dir_all(&tmp.0).expect("mkdir");
        let file = tmp.0.join("file");
        std::fs::write(&file, "").expect("write");
        let (code, out, err) = husk_key(&file, &["list"]);
        assert_eq!((code, out.as_str()), (1, ""));
        assert!(
            err.starts_with("husk: ") && err.lines().count() == 1,
            "{err:?}"
        );
    }

    #[test]
    fn flags_parse_in_any_position_and_the_default_dir_is_documented() {
        let args =
            Cli::try_parse_from(["husk", "key", "--state-dir", "/x", "create", "--team", "a"])
                .expect("parses");
        let Top::Key(args) = args.command;
        assert_eq!(args.state_dir.as_deref(), Some(Path::new("/x")));
        assert!(matches!(
            args.command,
            KeyCommand::Create {
                admin: false,
                name: None,
                ..
            }
        ));
        assert!(
            Cli::try_parse_from(["husk", "key", "create"]).is_err(),
            "--team is required"
        );
        assert_eq!(DEFAULT_STATE_DIR, "/var/lib/husk");
    }
}
