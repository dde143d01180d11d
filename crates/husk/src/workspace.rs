//! `husk workspace`: a team's persistent workspaces, worked on directly in the state
//! directory (next to a running server, which shares it): create, list, remove, and move
//! files and trees in and out.
//!
//! Everything read from a workspace is treated as hostile (a sandbox may have written it):
//! its symlinks are never followed (`get` of one is an error; inside a tree they arrive as
//! symlinks), its names are printed with control characters escaped, and a local file is
//! never overwritten without `--force`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use husk_core::store::DEFAULT_STATE_DIR;
use husk_core::workspaces::{
    export_local, import_local, Entry, EntryKind, ImportLimits, TarReport, WorkspaceError,
    WorkspaceInfo, WorkspaceQuota, Workspaces, MAX_DEPTH, MAX_TREE_ENTRIES,
};
use time::format_description::well_known::Rfc3339;

use crate::units::{format_size, parse_size, without_controls};

const EXIT_USAGE: i32 = 125;
const EXIT_FAILURE: i32 = 1;

#[derive(clap::Args, Debug)]
pub struct WorkspaceArgs {
    #[command(subcommand)]
    pub command: WorkspaceCommand,
    /// State directory [default: /var/lib/husk]
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Per-team quota, as `husk serve --workspace-quota` [default: what the last server on
    /// this state directory was configured with; none recorded: no quota].
    #[arg(long, global = true, value_name = "SIZE", value_parser = parse_size)]
    pub workspace_quota: Option<u64>,
}

#[derive(clap::Subcommand, Debug)]
pub enum WorkspaceCommand {
    /// Create an empty workspace.
    Create {
        /// 1-64 characters of A-Z, a-z, 0-9, '.', '_' and '-', not starting with '.' or '-'.
        name: String,
        /// The team that owns it.
        #[arg(long, value_name = "NAME")]
        team: String,
    },
    /// List a team's workspaces: size, files, creation time.
    List {
        #[arg(long, value_name = "NAME")]
        team: String,
        /// JSON, as the HTTP API answers.
        #[arg(long)]
        json: bool,
    },
    /// Delete a workspace and everything in it.
    Rm {
        name: String,
        #[arg(long, value_name = "NAME")]
        team: String,
    },
    /// List the files of a workspace, or of a path in it.
    Ls {
        /// NAME or NAME:PATH.
        target: String,
        #[arg(long, value_name = "NAME")]
        team: String,
        /// The whole tree, not only the first level.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Copy a local file or directory into a workspace.
    Put {
        name: String,
        #[arg(long, value_name = "NAME")]
        team: String,
        /// A file, or a directory (its whole tree; symlinks are copied as symlinks).
        local: PathBuf,
        /// Where in the workspace [default: the local file's or directory's name; `.` is the
        /// workspace root].
        dest: Option<String>,
        /// Most bytes copied.
        #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = parse_size)]
        limit: u64,
    },
    /// Copy a file or directory out of a workspace.
    Get {
        /// NAME:PATH (NAME alone: the whole workspace).
        target: String,
        #[arg(long, value_name = "NAME")]
        team: String,
        /// A file, or a directory to create (an existing directory receives a file under its
        /// name).
        local: PathBuf,
        /// Overwrite an existing local file, or merge into an existing directory.
        #[arg(long)]
        force: bool,
    },
    /// Write a tar archive of a workspace.
    Export {
        name: String,
        #[arg(long, value_name = "NAME")]
        team: String,
        /// The archive to write (`-`: stdout).
        #[arg(short, long, value_name = "FILE")]
        output: PathBuf,
        /// Only this path of the workspace.
        #[arg(long, default_value = "", value_name = "PATH")]
        path: String,
    },
    /// Unpack a tar or tar.gz archive into a workspace.
    Import {
        name: String,
        #[arg(long, value_name = "NAME")]
        team: String,
        /// The archive (`-`: stdin).
        archive: PathBuf,
        /// Under this path of the workspace (created if missing).
        #[arg(long, default_value = "", value_name = "PATH")]
        path: String,
        /// Most bytes of file content unpacked.
        #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = parse_size)]
        limit: u64,
    },
}

enum Failure {
    Usage(String),
    Failed(String),
}

impl From<WorkspaceError> for Failure {
    fn from(e: WorkspaceError) -> Failure {
        use WorkspaceError as E;
        match e {
            E::InvalidName(_)
            | E::InvalidTeam(_)
            | E::InvalidPath { .. }
            | E::NotAFile { .. }
            | E::NotADirectory { .. }
            | E::TooLarge { .. }
            | E::TooManyEntries { .. }
            | E::BadArchive { .. }
            | E::Conflict { .. } => Failure::Usage(crate::report::chain(&e)),
            other => Failure::Failed(crate::report::chain(&other)),
        }
    }
}

/// A workspace made or deleted is a new volume, or none: the id (and token) E2B's volume API
/// knew it by is forgotten (see `husk_core::volumes`).
fn forget_volume(state_dir: &Path, team: &str, name: &str) {
    if let Err(e) = husk_core::volumes::forget_in(state_dir, team, name) {
        eprintln!(
            "husk: warning: the volume id of workspace {name} is kept: {}",
            crate::report::chain(&e)
        );
    }
}

pub fn main(args: WorkspaceArgs) -> i32 {
    let state_dir = args
        .state_dir
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    let opened = match args.workspace_quota {
        None => Workspaces::open(&state_dir).map_err(|e| crate::report::chain(&e)),
        Some(bytes) => WorkspaceQuota::from_bytes(bytes)
            .map_err(|e| format!("--workspace-quota: {e}"))
            .and_then(|q| {
                Workspaces::open_with_quota(&state_dir, q).map_err(|e| crate::report::chain(&e))
            }),
    };
    let ws = match opened {
        Ok(w) => w,
        Err(e) => {
            crate::report::say(&e);
            return EXIT_FAILURE;
        }
    };
    for notice in ws.notices() {
        eprintln!("husk: warning: {}", without_controls(notice));
    }
    let result = match args.command {
        WorkspaceCommand::Create { name, team } => {
            ws.create(&team, &name).map_err(Failure::from).map(|_| {
                forget_volume(&state_dir, &team, &name);
                eprintln!("created workspace {name} of team {team}");
            })
        }
        WorkspaceCommand::List { team, json } => list(&ws, &team, json),
        WorkspaceCommand::Rm { name, team } => ws
            .delete(&team, &name)
            .map(|()| {
                forget_volume(&state_dir, &team, &name);
                eprintln!("removed workspace {name} of team {team}")
            })
            .map_err(Failure::from),
        WorkspaceCommand::Ls {
            target,
            team,
            recursive,
        } => ls(&ws, &team, &target, recursive),
        WorkspaceCommand::Put {
            name,
            team,
            local,
            dest,
            limit,
        } => put(&ws, &team, &name, &local, dest, limit),
        WorkspaceCommand::Get {
            target,
            team,
            local,
            force,
        } => get(&ws, &team, &target, &local, force),
        WorkspaceCommand::Export {
            name,
            team,
            output,
            path,
        } => export(&ws, &team, &name, &path, &output),
        WorkspaceCommand::Import {
            name,
            team,
            archive,
            path,
            limit,
        } => import(&ws, &team, &name, &path, &archive, limit),
    };
    match result {
        Ok(()) => 0,
        Err(Failure::Usage(m)) => {
            eprintln!("husk: {m}");
            EXIT_USAGE
        }
        Err(Failure::Failed(m)) => {
            eprintln!("husk: {m}");
            EXIT_FAILURE
        }
    }
}

fn rfc3339(t: time::OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// `2025-01-31 12:00` (UTC), for tables.
fn short_time(t: time::OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

fn info_json(i: &WorkspaceInfo) -> serde_json::Value {
    serde_json::json!({
        "name": i.name,
        "created_at": rfc3339(i.created_at),
        "size_bytes": i.size_bytes,
        "files": i.files,
    })
}

fn list(ws: &Workspaces, team: &str, json: bool) -> Result<(), Failure> {
    let all = ws.list(team)?;
    let usage = ws.usage(team)?;
    if json {
        let items: Vec<_> = all.iter().map(info_json).collect();
        let mut v = serde_json::json!({ "workspaces": items });
        if let Some(u) = usage {
            v["quota_bytes"] = u.quota_bytes.into();
            v["used_bytes"] = u.used_bytes.into();
        }
        println!("{v}");
        return Ok(());
    }
    if let Some(u) = usage {
        eprintln!(
            "team {team}: {} of its {} workspace quota used",
            format_size(u.used_bytes),
            format_size(u.quota_bytes)
        );
    }
    let rows: Vec<[String; 4]> = all
        .iter()
        .map(|i| {
            [
                i.name.clone(),
                format_size(i.size_bytes),
                i.files.to_string(),
                short_time(i.created_at),
            ]
        })
        .collect();
    print_table(
        &["NAME", "SIZE", "FILES", "CREATED"],
        &rows,
        &[false, true, true, false],
    );
    Ok(())
}

/// Prints aligned columns (`right`: right-aligned, for numbers); the last column unpadded.
fn print_table<const N: usize>(head: &[&str; N], rows: &[[String; N]], right: &[bool; N]) {
    let mut width = head.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                out.push_str(cell);
            } else if right[i] {
                out.push_str(&format!("{cell:>w$}  ", w = width[i]));
            } else {
                out.push_str(&format!("{cell:<w$}  ", w = width[i]));
            }
        }
        println!("{}", out.trim_end());
    };
    line(*head);
    for row in rows {
        line(std::array::from_fn(|i| row[i].as_str()));
    }
}

/// `NAME[:PATH]`.
fn split_target(target: &str) -> (&str, &str) {
    target.split_once(':').unwrap_or((target, ""))
}

fn ls(ws: &Workspaces, team: &str, target: &str, recursive: bool) -> Result<(), Failure> {
    let (name, path) = split_target(target);
    let depth = if recursive { MAX_DEPTH } else { 1 };
    let listing = ws.entries(team, name, path, depth)?;
    let rows: Vec<[String; 4]> = listing
        .entries
        .iter()
        .map(|e| {
            let mut shown = without_controls(&e.path);
            if let Some(t) = &e.target {
                shown.push_str(" -> ");
                shown.push_str(&without_controls(t));
            }
            [
                mode_string(e),
                format_size(e.size),
                short_time(e.mtime),
                shown,
            ]
        })
        .collect();
    print_table(
        &["MODE", "SIZE", "MODIFIED", "PATH"],
        &rows,
        &[false, true, false, false],
    );
    if listing.truncated {
        eprintln!(
            "husk: listing cut short after {} entries; list a subdirectory",
            listing.entries.len()
        );
    }
    Ok(())
}

/// `drwxr-xr-x`-style.
fn mode_string(e: &Entry) -> String {
    let kind = match e.kind {
        EntryKind::Dir => 'd',
        EntryKind::Symlink => 'l',
        EntryKind::File => '-',
        EntryKind::Other => '?',
    };
    let mut s = String::from(kind);
    for shift in [6, 3, 0] {
        let bits = (e.mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    s
}

fn put(
    ws: &Workspaces,
    team: &str,
    name: &str,
    local: &Path,
    dest: Option<String>,
    limit: u64,
) -> Result<(), Failure> {
    let meta =
        fs::metadata(local).map_err(|e| Failure::Usage(format!("{}: {e}", local.display())))?;
    let dest = match dest {
        Some(d) => d,
        None => local
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_string)
            .ok_or_else(|| {
                Failure::Usage(format!(
                    "{}: name the destination path in the workspace",
                    local.display()
                ))
            })?,
    };
    if meta.is_file() {
        // A directory as the destination (`.`, `dir/`): the file goes in under its name.
        let dest = if dest.is_empty() || dest == "." || dest.ends_with('/') {
            let base = local.file_name().and_then(|n| n.to_str()).ok_or_else(|| {
                Failure::Usage(format!("{}: name the destination file", local.display()))
            })?;
            if dest == "." {
                base.to_string()
            } else {
                format!("{dest}{base}")
            }
        } else {
            dest
        };
        let file =
            File::open(local).map_err(|e| Failure::Usage(format!("{}: {e}", local.display())))?;
        let r = ws.write_file(team, name, &dest, file, limit)?;
        eprintln!("copied {} to {name}:{dest}", format_size(r.bytes));
        return Ok(());
    }
    if !meta.is_dir() {
        return Err(Failure::Usage(format!(
            "{}: not a regular file or directory",
            local.display()
        )));
    }
    // The directory goes through the same import as an uploaded archive.
    let limits = ImportLimits {
        max_bytes: limit,
        ..ImportLimits::default()
    };
    let report = piped(
        |w| export_local(local, w).map(|_| ()),
        |r| ws.import_tar(team, name, &dest, r, limits),
    )?;
    eprintln!("copied {} into {name}:{dest}", summary(&report));
    Ok(())
}

fn get(
    ws: &Workspaces,
    team: &str,
    target: &str,
    local: &Path,
    force: bool,
) -> Result<(), Failure> {
    let (name, path) = split_target(target);
    let entry = ws.stat(team, name, path)?;
    match entry.kind {
        EntryKind::File => {
            let mut dest = local.to_path_buf();
            if local.is_dir() {
                if entry.name.is_empty() {
                    return Err(Failure::Usage("nothing to name the file by".into()));
                }
                dest.push(&entry.name);
            }
            let mut from = ws.read_file(team, name, path)?;
            let mut opts = OpenOptions::new();
            opts.write(true).mode(0o644);
            if force {
                opts.create(true).truncate(true);
            } else {
                opts.create_new(true);
            }
            let mut to = opts.open(&dest).map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Failure::Usage(format!(
                        "{} exists; use --force to overwrite it",
                        dest.display()
                    ))
                } else {
                    Failure::Failed(format!("{}: {e}", dest.display()))
                }
            })?;
            let n = io::copy(&mut from, &mut to)
                .map_err(|e| Failure::Failed(format!("copying to {}: {e}", dest.display())))?;
            eprintln!("copied {} to {}", format_size(n), dest.display());
            Ok(())
        }
        EntryKind::Dir => {
            match fs::symlink_metadata(local) {
                Ok(m) if m.is_dir() && force => {}
                Ok(_) => {
                    return Err(Failure::Usage(format!(
                        "{} exists; use --force to merge into it",
                        local.display()
                    )))
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(local)
                    .map_err(|e| Failure::Failed(format!("{}: {e}", local.display())))?,
                Err(e) => return Err(Failure::Failed(format!("{}: {e}", local.display()))),
            }
            let limits = ImportLimits {
                max_bytes: u64::MAX,
                max_entries: MAX_TREE_ENTRIES,
            };
            let report = piped(
                |w| ws.export_tar(team, name, path, w).map(|_| ()),
                |r| import_local(local, r, limits),
            )?;
            eprintln!("copied {} to {}", summary(&report), local.display());
            Ok(())
        }
        EntryKind::Symlink => Err(Failure::Usage(format!(
            "{name}:{} is a symlink, which husk never follows",
            without_controls(path)
        ))),
        EntryKind::Other => Err(Failure::Usage(format!(
            "{name}:{} is not a regular file or directory",
            without_controls(path)
        ))),
    }
}

fn export(
    ws: &Workspaces,
    team: &str,
    name: &str,
    path: &str,
    output: &Path,
) -> Result<(), Failure> {
    // Found before the output is touched.
    let exporter = ws.exporter(team, name, path)?;
    if output == Path::new("-") {
        if io::stdout().is_terminal() {
            return Err(Failure::Usage(
                "refusing to write an archive to a terminal; use -o FILE".into(),
            ));
        }
        let report = exporter.write_to(io::stdout().lock())?;
        eprintln!("exported {}", summary(&report));
        return Ok(());
    }
    let file =
        File::create(output).map_err(|e| Failure::Failed(format!("{}: {e}", output.display())))?;
    let mut out = io::BufWriter::new(file);
    let done = exporter
        .write_to(&mut out)
        .map_err(Failure::from)
        .and_then(|report| {
            out.flush()
                .map_err(|e| Failure::Failed(format!("{}: {e}", output.display())))?;
            Ok(report)
        });
    match done {
        Ok(report) => {
            eprintln!("exported {} to {}", summary(&report), output.display());
            Ok(())
        }
        Err(e) => {
            // A partial archive is not left to be mistaken for a whole one.
            let _ = fs::remove_file(output);
            Err(e)
        }
    }
}

fn import(
    ws: &Workspaces,
    team: &str,
    name: &str,
    path: &str,
    archive: &Path,
    limit: u64,
) -> Result<(), Failure> {
    let limits = ImportLimits {
        max_bytes: limit,
        ..ImportLimits::default()
    };
    let report = if archive == Path::new("-") {
        ws.import_tar(team, name, path, io::stdin().lock(), limits)?
    } else {
        let file = File::open(archive)
            .map_err(|e| Failure::Usage(format!("{}: {e}", archive.display())))?;
        ws.import_tar(team, name, path, io::BufReader::new(file), limits)?
    };
    eprintln!("imported {} into {name}:{path}", summary(&report));
    Ok(())
}

fn summary(r: &TarReport) -> String {
    let mut s = format!(
        "{} file(s), {} dir(s), {} symlink(s), {}",
        r.files,
        r.dirs,
        r.symlinks,
        format_size(r.bytes)
    );
    if r.skipped > 0 {
        s.push_str(&format!(
            "; skipped {} hard link(s) and special file(s)",
            r.skipped
        ));
    }
    s
}

/// Runs `write` on a thread of its own, feeding `read` through a pipe: a tar stream from one
/// tree to another, never held whole. The reader's error comes first (the writer's is then
/// only a broken pipe).
fn piped<T>(
    write: impl FnOnce(&mut File) -> Result<(), WorkspaceError> + Send,
    read: impl FnOnce(&mut File) -> Result<T, WorkspaceError>,
) -> Result<T, Failure> {
    let (r, w) =
        husk_runtime::sys::pipe().map_err(|e| Failure::Failed(format!("creating a pipe: {e}")))?;
    let (mut r, mut w) = (File::from(r), File::from(w));
    std::thread::scope(|s| {
        let writer = s.spawn(move || write(&mut w));
        let read = read(&mut r);
        drop(r);
        let written = writer.join().unwrap_or_else(|_| {
            Err(WorkspaceError::Io {
                place: "the copy".into(),
                op: "run".into(),
                path: String::new(),
                source: io::Error::other("the writing thread panicked"),
            })
        });
        let value = read?;
        written?;
        Ok(value)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Reads all of a pipe (for tests of [`piped`] without a workspace).
    fn drain_pipe(r: &mut File) -> Result<Vec<u8>, WorkspaceError> {
        let mut v = Vec::new();
        r.read_to_end(&mut v).map_err(|source| WorkspaceError::Io {
            place: "test".into(),
            op: "read".into(),
            path: String::new(),
            source,
        })?;
        Ok(v)
    }

    #[test]
    fn targets_and_modes() {
        assert_eq!(split_target("data"), ("data", ""));
        assert_eq!(split_target("data:a/b:c"), ("data", "a/b:c"));
        let e = Entry {
            name: "x".into(),
            path: "x".into(),
            kind: EntryKind::Dir,
            size: 0,
            mode: 0o750,
            uid: 1000,
            gid: 1000,
            mtime: time::OffsetDateTime::UNIX_EPOCH,
            atime: time::OffsetDateTime::UNIX_EPOCH,
            ctime: time::OffsetDateTime::UNIX_EPOCH,
            target: None,
        };
        assert_eq!(mode_string(&e), "drwxr-x---");
    }

    #[test]
    fn piped_streams_between_threads() {
        let data = vec![7u8; 1 << 20];
        let got = piped(
            |w| {
                w.write_all(&data).unwrap();
                Ok(())
            },
            drain_pipe,
        )
        .ok()
        .unwrap();
        assert_eq!(got, data);
    }
}
