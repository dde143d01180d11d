//! `husk batch`: one command over many inputs on a husk server (`POST /husk/v1/batches`), at
//! most `--parallel` sandboxes at a time, each item a run of its own. Inputs are local files
//! (`--input GLOB`: each file is sent with its item, at the same relative path under the
//! workdir, and `{}` in the command is its path), lines of a file (`--args-from`) or values
//! (`--arg`). Progress goes to stderr (a bar on a terminal, a line per finished item
//! otherwise); a summary table (or `--json`: the batch's record) to stdout. Exit 0 when every
//! item succeeded, 1 otherwise, 125 for husk's own errors, 128+n when stopped by signal n (the
//! batch is cancelled on the server first).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Arg, Args};
use husk_core::runs::batch::{BatchItem, BatchRecord, BatchSpec, MAX_ITEMS};
use husk_core::runs::{RunRecord, RunSpec, RunStatus};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Deserialize;

use crate::cli::JobArgs;
use crate::client::{Client, StopSignals};
use crate::run::remote;
use crate::run::EXIT_HUSK_ERROR;
use crate::units::without_controls;

/// How long husk waits for a cancelled batch's end (every running item destroys its sandbox).
const CANCEL_WAIT: Duration = Duration::from_secs(30);

/// Lines of a failed item's stderr shown in the summary.
const TAIL_LINES: usize = 5;

/// `husk batch`'s help for the flags it shares with `husk run` ([`JobArgs`], whose own help is
/// `husk run`'s): the same flags, said of every item.
const ITEM_HELP: [(&str, &str); 16] = [
    (
        "env",
        "Environment variable of every item; `{}` in VALUE is the item's input (repeatable)",
    ),
    (
        "workdir",
        "Working directory inside the sandbox [default: the template's, else the user's home]",
    ),
    (
        "user",
        "User inside the sandbox: `user` or `root` [default: the template's, else user]",
    ),
    ("template", "Template [default: the server's (`base`)]"),
    (
        "timeout",
        "Each item's time limit (e.g. 60s, 5m) [default: the server's (300 s)]",
    ),
    (
        "memory",
        "Memory limit of each item's sandbox [default: the server's]",
    ),
    (
        "cpus",
        "CPU quota of each item's sandbox, in CPUs [default: the server's]",
    ),
    (
        "pids",
        "Maximum processes and threads of each item [default: the server's]",
    ),
    (
        "disk",
        "Size of each item's writable layer [default: the server's]",
    ),
    (
        "workspaces",
        "Mount a workspace at /workspace/NAME (or PATH) in every item, read-only unless `:rw` \
         (repeatable)",
    ),
    (
        "secrets",
        "The team's secret NAME as the environment variable NAME of every item, masked in its \
         output (repeatable)",
    ),
    (
        "saves",
        "After each item, save this sandbox path into a workspace under runs/<run-id>/ \
         (repeatable)",
    ),
    (
        "save_to",
        "The workspace --save goes to [default: the first --workspace]",
    ),
    (
        "files",
        "Send a local file along with every item, to DEST (relative to the workdir) [default \
         DEST: the file's name] (repeatable)",
    ),
    (
        "output_limit",
        "Limit of each item's saved outputs: size, optionally with a file count [default: \
         1G:10000]",
    ),
    (
        "net",
        "Network of every item's sandbox: none, internet, allow=LIST, deny=LIST (CIDRs and \
         domains; repeatable) [default: the server's]",
    ),
];

/// Gives a shared flag its [`ITEM_HELP`].
fn item_help(arg: Arg) -> Arg {
    match ITEM_HELP.iter().find(|(id, _)| arg.get_id() == *id) {
        Some((_, help)) => arg.help(*help),
        None => arg,
    }
}

#[derive(Args, Debug, Default)]
#[command(mut_args(item_help))]
pub struct BatchArgs {
    /// The husk server [default: $HUSK_SERVER, else http://127.0.0.1:3000]. The key comes from
    /// HUSK_API_KEY, else E2B_API_KEY, else STATE_DIR/admin.key.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// State directory whose admin.key is used when no key is in the environment [default:
    /// /var/lib/husk].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// How many items run at once [default: the server's number of CPUs].
    #[arg(short = 'p', long, value_name = "N")]
    pub parallel: Option<usize>,
    /// Local files, one item each: a pattern relative to the current directory (`*` and `?`
    /// in any component, e.g. 'data/*.csv'; quote it). Each file is sent with its item to the
    /// same relative path under the workdir, and `{}` in the command is that path
    /// (repeatable).
    #[arg(long = "input", value_name = "GLOB")]
    pub inputs: Vec<String>,
    /// One item per line of FILE (`-`: stdin), the line being `{}` (e.g. paths in a
    /// workspace). Empty lines are skipped.
    #[arg(long, value_name = "FILE")]
    pub args_from: Option<PathBuf>,
    /// One item with VALUE as `{}` (repeatable).
    #[arg(long = "arg", value_name = "VALUE")]
    pub args: Vec<String>,
    // What runs in every item (shared with `husk run`; help texts: ITEM_HELP).
    #[command(flatten)]
    pub job: JobArgs,
    /// Print the batch's final record as JSON instead of the summary table.
    #[arg(long)]
    pub json: bool,
    /// The command and its arguments; `{}` is the item's input.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// Entry point: the process exit code.
pub fn main(a: BatchArgs) -> i32 {
    let result = prepare(&a).and_then(|(client, spec)| {
        let rt = crate::client::runtime()?;
        rt.block_on(run(&client, &spec, a.json))
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            crate::report::say(&crate::report::anyhow(&e));
            EXIT_HUSK_ERROR
        }
    }
}

fn prepare(a: &BatchArgs) -> Result<(Client, BatchSpec)> {
    if a.parallel == Some(0) {
        bail!("--parallel must be at least 1");
    }
    // One budget for every file sent: the whole batch is one request.
    let mut total = 0usize;
    let run: RunSpec = a.job.spec(a.command.clone(), &mut total)?;
    let items = items(a, &mut total)?;
    if !a.command.iter().any(|c| c.contains("{}")) {
        eprintln!("husk: note: the command has no {{}}: every item runs the same command");
    }
    let client = Client::from_flags(a.server.as_deref(), a.state_dir.as_deref())?;
    Ok((
        client,
        BatchSpec {
            run,
            items,
            parallel: a.parallel,
        },
    ))
}

/// The batch's items, in the order: --input files, --args-from lines, --arg values.
fn items(a: &BatchArgs, total: &mut usize) -> Result<Vec<BatchItem>> {
    let mut items = Vec::new();
    for pattern in &a.inputs {
        let files = expand(pattern)?;
        if files.is_empty() {
            bail!("--input {pattern:?}: no file matches");
        }
        for path in files {
            let bytes = remote::read_local_file(Path::new(&path), "--input", total)?;
            items.push(BatchItem {
                args: vec![path.clone()],
                files: vec![remote::inline(&path, &bytes)],
                ..BatchItem::default()
            });
        }
    }
    if let Some(file) = &a.args_from {
        let lines: Vec<String> = if file == Path::new("-") {
            std::io::stdin()
                .lock()
                .lines()
                .collect::<Result<_, _>>()
                .context("--args-from -: reading stdin")?
        } else {
            std::fs::read_to_string(file)
                .with_context(|| format!("--args-from {}", file.display()))?
                .lines()
                .map(str::to_owned)
                .collect()
        };
        for line in lines {
            let line = line.trim_end_matches('\r');
            if !line.trim().is_empty() {
                items.push(BatchItem {
                    args: vec![line.to_owned()],
                    ..BatchItem::default()
                });
            }
        }
    }
    for v in &a.args {
        items.push(BatchItem {
            args: vec![v.clone()],
            ..BatchItem::default()
        });
    }
    if items.is_empty() {
        bail!("no items: give --input GLOB, --args-from FILE or --arg VALUE");
    }
    if items.len() > MAX_ITEMS {
        bail!("{} items: a batch has at most {MAX_ITEMS}", items.len());
    }
    Ok(items)
}

/// Whether `name` matches `pattern` (`*`: any run of characters, `?`: one character). A
/// leading `.` is matched only by a literal `.`, as in a shell.
fn matches(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Iterative wildcard matching with one backtrack point (the last `*`).
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// The regular files a relative pattern names, sorted; paths as the pattern writes them
/// (`.` and empty components dropped).
fn expand(pattern: &str) -> Result<Vec<String>> {
    expand_in(Path::new("."), pattern)
}

/// [`expand`] relative to `base`.
fn expand_in(base: &Path, pattern: &str) -> Result<Vec<String>> {
    if pattern.starts_with('/') {
        bail!(
            "--input {pattern:?}: give a pattern relative to the current directory (each file \
             goes to the same relative path under the workdir); cd to the data first"
        );
    }
    let comps: Vec<&str> = pattern
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if comps.is_empty() {
        bail!("--input {pattern:?}: empty pattern");
    }
    if comps.contains(&"..") {
        bail!(
            "--input {pattern:?}: '..' would put files outside the workdir; cd to a parent \
             directory first"
        );
    }
    let mut found: Vec<String> = vec![String::new()];
    for comp in &comps {
        let mut next = Vec::new();
        for prefix in &found {
            let join = |name: &str| {
                if prefix.is_empty() {
                    name.to_owned()
                } else {
                    format!("{prefix}/{name}")
                }
            };
            if !comp.contains(['*', '?']) {
                next.push(join(comp));
                continue;
            }
            let dir = base.join(prefix);
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                // A directory that is not there (or not one) matches nothing.
                Err(e)
                    if e.kind() == std::io::ErrorKind::NotFound
                        || e.raw_os_error() == Some(husk_runtime::libc::ENOTDIR) =>
                {
                    continue
                }
                Err(e) => return Err(anyhow!("--input {pattern:?}: {}: {e}", dir.display())),
            };
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| matches(comp, n))
                .collect();
            names.sort();
            next.extend(names.iter().map(|n| join(n)));
        }
        found = next;
    }
    // Regular files only (a symlink to one counts); a directory matched by `*` is skipped.
    let mut files: Vec<String> = found
        .into_iter()
        .filter(|p| std::fs::metadata(base.join(p)).is_ok_and(|m| m.is_file()))
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

/// The events of a batch, as the server streams them.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    BatchStarted {
        batch_id: String,
        total: usize,
    },
    ItemStarted {
        index: usize,
    },
    ItemFinished {
        index: usize,
        run: Box<RunRecord>,
    },
    ItemFailed {
        index: usize,
        status: RunStatus,
        error: String,
    },
    BatchFinished {
        batch: Box<BatchRecord>,
    },
    #[serde(other)]
    Other,
}

/// What is known of one item.
#[derive(Default, Clone)]
struct ItemState {
    running: bool,
    finished: bool,
    status: Option<RunStatus>,
    /// The last lines of stderr (failed items only), or why it never ran.
    notes: Vec<String>,
}

/// Progress on stderr: a bar on a terminal, else a line per finished item.
struct Progress {
    bar: ProgressBar,
    total: usize,
    done: usize,
    running: usize,
    ok: usize,
    failed: usize,
}

impl Progress {
    fn new(total: usize) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        let p = Progress {
            bar,
            total,
            done: 0,
            running: 0,
            ok: 0,
            failed: 0,
        };
        p.refresh();
        p
    }

    fn refresh(&self) {
        self.bar.set_length(self.total as u64);
        self.bar.set_position(self.done as u64);
        self.bar.set_message(format!(
            "· {} running · {} ok · {} failed",
            self.running, self.ok, self.failed
        ));
    }

    /// An item ended: counted, and (without a terminal) a line.
    fn finished(&mut self, index: usize, input: &str, how: &str, ok: bool, was_running: bool) {
        self.done += 1;
        if was_running {
            self.running = self.running.saturating_sub(1);
        }
        if ok {
            self.ok += 1;
        } else {
            self.failed += 1;
        }
        let line = format!(
            "husk: [{}/{}] item {index} {input}: {how}",
            self.done, self.total
        );
        if self.bar.is_hidden() {
            let _ = writeln!(std::io::stderr(), "{line}");
        } else if !ok {
            // Failures as they happen, above the bar; the summary has the rest.
            self.bar.println(line);
        }
        self.refresh();
    }

    fn message(&self, text: &str) {
        if self.bar.is_hidden() {
            let _ = writeln!(std::io::stderr(), "{text}");
        } else {
            self.bar.println(text);
        }
    }
}

fn status_word(s: RunStatus) -> &'static str {
    match s {
        RunStatus::Running => "running",
        RunStatus::Succeeded => "ok",
        RunStatus::Failed => "failed",
        RunStatus::TimedOut => "timed out",
        RunStatus::Cancelled => "cancelled",
        RunStatus::Error => "error",
    }
}

/// The input column: the item's arguments, printable, bounded.
fn input_text(args: &[String]) -> String {
    const MAX: usize = 48;
    let joined = without_controls(&args.join(" "));
    if joined.chars().count() > MAX {
        let mut s: String = joined.chars().take(MAX - 1).collect();
        s.push('…');
        s
    } else {
        joined
    }
}

/// The last non-empty lines of a stream's tail, printable.
fn last_lines(tail: &str, n: usize) -> Vec<String> {
    let lines: Vec<&str> = tail.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| without_controls(l).chars().take(200).collect())
        .collect()
}

fn seconds(ms: Option<u64>) -> String {
    ms.map(|ms| format!("{:.1} s", ms as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// Streams the batch to its end and prints the summary; the exit code.
async fn run(client: &Client, spec: &BatchSpec, json: bool) -> Result<i32> {
    let mut signals = StopSignals::new()?;
    let mut stream = tokio::select! {
        s = client.post_stream("/husk/v1/batches", spec) => s?,
        sig = signals.recv() => return Ok(128 + sig),
    };
    let mut id = stream.id.clone();
    let inputs: Vec<String> = spec.items.iter().map(|i| input_text(&i.args)).collect();
    let mut items = vec![ItemState::default(); spec.items.len()];
    let mut progress = Progress::new(spec.items.len());
    let mut stopped: Option<i32> = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    let record: BatchRecord = loop {
        let ev = tokio::select! {
            ev = stream.next::<Event>() => ev,
            sig = signals.recv() => {
                if stopped.is_some() {
                    progress.bar.finish_and_clear();
                    eprintln!("husk: second signal: not waiting for the batch's end");
                    return Ok(128 + sig);
                }
                stopped = Some(sig);
                progress.message("husk: cancelling the batch...");
                if let Some(id) = &id {
                    if let Err(e) = client.delete(&format!("/husk/v1/batches/{id}")).await {
                        progress.message(&format!(
                            "husk: cancelling batch {id}: {}",
                            without_controls(&format!("{e:#}"))
                        ));
                    }
                }
                deadline = Some(tokio::time::Instant::now() + CANCEL_WAIT);
                continue;
            }
            _ = sleep_until(deadline) => {
                progress.bar.finish_and_clear();
                eprintln!(
                    "husk: the server did not confirm the end of the cancelled batch in {} s",
                    CANCEL_WAIT.as_secs()
                );
                return Ok(128 + stopped.unwrap_or(husk_runtime::libc::SIGTERM));
            }
        };
        let ev = match ev {
            Ok(Some(ev)) => ev,
            Ok(None) => {
                progress.bar.finish_and_clear();
                bail!("the server's stream ended before the batch did");
            }
            Err(e) => {
                progress.bar.finish_and_clear();
                return Err(e);
            }
        };
        match ev {
            Event::BatchStarted { batch_id, total } => {
                id.get_or_insert(batch_id);
                progress.total = total;
                if items.len() < total {
                    items.resize(total, ItemState::default());
                }
                progress.refresh();
            }
            Event::ItemStarted { index } => {
                if let Some(it) = items.get_mut(index) {
                    if !it.running && !it.finished {
                        it.running = true;
                        progress.running += 1;
                        progress.refresh();
                    }
                }
            }
            Event::ItemFinished { index, run } => {
                let Some(it) = items.get_mut(index) else {
                    continue;
                };
                if it.finished {
                    continue;
                }
                it.finished = true;
                it.status = Some(run.status);
                if run.status != RunStatus::Succeeded {
                    let mut notes = Vec::new();
                    if let Some(e) = &run.error {
                        notes.push(without_controls(e));
                    }
                    notes.extend(last_lines(&run.stderr_tail, TAIL_LINES));
                    it.notes = notes;
                }
                let mut how = status_word(run.status).to_owned();
                if let Some(c) = run.exit_code {
                    how.push_str(&format!(" (exit {c}, {})", seconds(run.duration_ms)));
                }
                let input = inputs.get(index).cloned().unwrap_or_default();
                let was_running = std::mem::take(&mut it.running);
                progress.finished(
                    index,
                    &input,
                    &how,
                    run.status == RunStatus::Succeeded,
                    was_running,
                );
            }
            Event::ItemFailed {
                index,
                status,
                error,
            } => {
                let Some(it) = items.get_mut(index) else {
                    continue;
                };
                if it.finished {
                    continue;
                }
                it.finished = true;
                it.status = Some(status);
                it.notes = vec![without_controls(&error)];
                let input = inputs.get(index).cloned().unwrap_or_default();
                let how = format!("{}: {}", status_word(status), without_controls(&error));
                let was_running = std::mem::take(&mut it.running);
                progress.finished(index, &input, &how, false, was_running);
            }
            Event::BatchFinished { batch } => break *batch,
            Event::Other => {}
        }
    };
    progress.bar.finish_and_clear();
    let mut out = std::io::stdout().lock();
    if json {
        let text = serde_json::to_string_pretty(&record).context("batch record")?;
        let _ = writeln!(out, "{text}");
    } else {
        let _ = out.write_all(summary(&record, &items).as_bytes());
    }
    let _ = out.flush();
    if let Some(sig) = stopped {
        return Ok(128 + sig);
    }
    Ok(if record.succeeded == record.total {
        0
    } else {
        1
    })
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The summary table and the totals line.
fn summary(rec: &BatchRecord, items: &[ItemState]) -> String {
    let mut rows: Vec<[String; 6]> = vec![[
        "#".into(),
        "INPUT".into(),
        "STATUS".into(),
        "EXIT".into(),
        "TIME".into(),
        "RUN".into(),
    ]];
    for it in &rec.items {
        rows.push([
            it.index.to_string(),
            input_text(&it.args),
            status_word(it.status).into(),
            it.exit_code
                .map(|c| c.to_string())
                .unwrap_or_else(|| "-".into()),
            seconds(it.duration_ms),
            it.run_id.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    let widths: Vec<usize> = (0..6)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut text = String::new();
    for (k, row) in rows.iter().enumerate() {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
        // Why a failed item failed, under its row.
        if k > 0 {
            let it = &rec.items[k - 1];
            if it.status != RunStatus::Succeeded {
                let notes = items
                    .get(it.index)
                    .map(|s| s.notes.clone())
                    .filter(|n| !n.is_empty())
                    .or_else(|| it.error.as_deref().map(|e| vec![without_controls(e)]))
                    .unwrap_or_default();
                for n in notes {
                    text.push_str(&format!("    │ {n}\n"));
                }
            }
        }
    }
    let mut totals = format!(
        "{} item{}: {} ok, {} failed, {} timed out",
        rec.total,
        if rec.total == 1 { "" } else { "s" },
        rec.succeeded,
        rec.failed,
        rec.timed_out
    );
    if rec.cancelled > 0 {
        totals.push_str(&format!(", {} cancelled", rec.cancelled));
    }
    if rec.errors > 0 {
        totals.push_str(&format!(", {} errors", rec.errors));
    }
    text.push_str(&format!("{totals} (wall {})\n", seconds(rec.duration_ms)));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shared_flag_has_its_batch_help_and_keeps_its_run_help() {
        use clap::{Args as _, CommandFactory};
        let job = JobArgs::augment_args(clap::Command::new("job"));
        let mut shared: Vec<&str> = job.get_arguments().map(|a| a.get_id().as_str()).collect();
        let mut ids: Vec<&str> = ITEM_HELP.iter().map(|(id, _)| *id).collect();
        shared.sort_unstable();
        ids.sort_unstable();
        assert_eq!(shared, ids);
        let cli = crate::cli::Cli::command();
        let help = |cmd: &str, id: &str| {
            let c = cli.find_subcommand(cmd).unwrap();
            let arg = c.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_help().unwrap().to_string()
        };
        for (id, text) in ITEM_HELP {
            assert_eq!(help("batch", id), text);
            assert_ne!(help("run", id), text);
        }
    }

    #[test]
    fn wildcards() {
        assert!(matches("*.csv", "a.csv"));
        assert!(matches("a?c", "abc"));
        assert!(!matches("a?c", "ac"));
        assert!(matches("*", "x"));
        assert!(!matches("*", ".hidden"));
        assert!(matches(".*", ".hidden"));
        assert!(matches("a*b*c", "aXXbYYc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("data-*-[1].txt", "data-x-[1].txt"));
    }

    #[test]
    fn patterns_expand_to_files_as_written() {
        let dir = std::env::temp_dir().join(format!("husk-batch-glob-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("d/sub")).unwrap();
        for f in ["d/b.txt", "d/a.txt", "d/c.csv", "d/sub/x.txt", "d/.h.txt"] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        let got = (
            expand_in(&dir, "d/*.txt"),
            expand_in(&dir, "./d/*/x.txt"),
            expand_in(&dir, "d/?.csv"),
            expand_in(&dir, "d/*"),
            expand_in(&dir, "none/*.txt"),
        );
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(got.0.unwrap(), vec!["d/a.txt", "d/b.txt"]);
        assert_eq!(got.1.unwrap(), vec!["d/sub/x.txt"]);
        assert_eq!(got.2.unwrap(), vec!["d/c.csv"]);
        assert_eq!(got.3.unwrap(), vec!["d/a.txt", "d/b.txt", "d/c.csv"]);
        assert!(got.4.unwrap().is_empty());
        assert!(expand("/etc/*.conf").is_err());
        assert!(expand("../*.txt").is_err());
    }

    #[test]
    fn tails_are_printable_and_short() {
        let t = "one\n\ntwo\nthree \u{1b}[31mred\n";
        assert_eq!(last_lines(t, 2), vec!["two", "three \\u{1b}[31mred"]);
        assert_eq!(input_text(&["a\nb".into()]), "a\\nb");
        assert!(input_text(&["x".repeat(100)]).chars().count() <= 48);
    }
}
