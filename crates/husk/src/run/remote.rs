//! `husk run --server URL -- CMD...`: the run goes through a husk server (`POST
//! /husk/v1/runs`) instead of a local sandbox. The command's output streams back as it comes;
//! husk exits with the command's exit code (124 on timeout, 125 for husk's own errors, 128+n
//! when stopped by signal n). On SIGINT/SIGTERM/SIGHUP the run is cancelled on the server
//! (`DELETE /husk/v1/runs/{id}`) and husk waits, bounded, for its end; a second signal leaves
//! at once (the server cancels a run whose client went away).
//!
//! [`JobArgs::spec`] turns the flags `husk run --server` and `husk batch` share into a
//! [`RunSpec`].

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use base64::Engine;
use husk_core::runs::spec::MAX_INLINE_BYTES;
use husk_core::runs::{
    InlineFile, OutputLimit, OutputsReport, RunLimits, RunRecord, RunSpec, RunStatus, RunWorkspace,
};
use husk_runtime::libc;
use serde::Deserialize;

use super::{EXIT_HUSK_ERROR, EXIT_TIMEOUT};
use crate::cli::{JobArgs, RunArgs};
use crate::client::{Client, StopSignals};
use crate::units::{
    format_duration, format_size, parse_cpus, parse_duration, parse_size, without_controls,
};

/// How long husk waits for the server to confirm a cancelled run's end.
pub const CANCEL_WAIT: Duration = Duration::from_secs(15);

/// `NAME[:rw|:ro][@PATH]`: a workspace, its mode, and where it is mounted.
pub fn parse_workspace(text: &str) -> Result<RunWorkspace> {
    let (head, path) = match text.split_once('@') {
        Some((h, p)) => (h, Some(p)),
        None => (text, None),
    };
    let (name, mode) = match head.split_once(':') {
        Some((n, m)) => (n, Some(m)),
        None => (head, None),
    };
    let form = "expected NAME, NAME:rw or NAME[:rw]@/PATH";
    if let Some(m) = mode {
        if m != "rw" && m != "ro" {
            bail!("invalid --workspace {text:?}: unknown mode {m:?} ({form})");
        }
    }
    husk_core::workspaces::validate_name(name)
        .map_err(|e| anyhow!("invalid --workspace {text:?}: {e}"))?;
    if let Some(p) = path {
        if !p.starts_with('/') {
            bail!("invalid --workspace {text:?}: the mount path must be absolute ({form})");
        }
    }
    Ok(RunWorkspace {
        name: name.to_owned(),
        path: path.map(str::to_owned),
        mode: mode.map(str::to_owned),
    })
}

/// Reads a local regular file for an inline file, counting its size against `total`.
pub fn read_local_file(local: &Path, flag: &str, total: &mut usize) -> Result<Vec<u8>> {
    let meta = std::fs::metadata(local).with_context(|| format!("{flag} {}", local.display()))?;
    if !meta.is_file() {
        bail!(
            "{flag} {}: not a regular file (directories go into a workspace)",
            local.display()
        );
    }
    *total = total.saturating_add(meta.len() as usize);
    if *total > MAX_INLINE_BYTES {
        bail!(
            "{flag}: files sent with a run take at most {} MiB in total; put large inputs in a \
             workspace",
            MAX_INLINE_BYTES >> 20
        );
    }
    std::fs::read(local).with_context(|| format!("{flag} {}", local.display()))
}

/// An inline file: the content base64-encoded, at `dest` (relative: under the workdir).
pub fn inline(dest: &str, bytes: &[u8]) -> InlineFile {
    InlineFile {
        path: dest.to_owned(),
        content: base64::engine::general_purpose::STANDARD.encode(bytes),
        encoding: Some("base64".into()),
    }
}

/// `--file LOCAL[:DEST]`: the local path and where the file goes (default: its name).
fn parse_file(text: &str) -> Result<(String, String)> {
    // A local name with a colon in it is taken whole when it exists.
    let (local, dest) = match text.split_once(':') {
        Some((l, d)) if !Path::new(text).exists() => (l, Some(d)),
        _ => (text, None),
    };
    if local.is_empty() {
        bail!("invalid --file {text:?}: expected LOCAL[:DEST]");
    }
    let dest = match dest {
        Some("") => bail!("invalid --file {text:?}: empty DEST"),
        Some(d) => d.to_owned(),
        None => Path::new(local)
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| anyhow!("invalid --file {text:?}: no file name; give LOCAL:DEST"))?
            .to_owned(),
    };
    Ok((local.to_owned(), dest))
}

/// Whole MiB, at least one (a size flag given to a server).
fn mib(flag: &str, text: &str) -> Result<u64> {
    let bytes = parse_size(text).map_err(|e| anyhow!("{flag}: {e}"))?;
    if bytes < 1 << 20 {
        bail!("{flag} {text:?}: give at least 1M");
    }
    Ok(bytes.div_ceil(1 << 20))
}

impl JobArgs {
    /// The run spec on a server (`husk run --server`, every item of `husk batch`); only what
    /// was given is sent (the server's defaults apply otherwise). `inline_total` counts the
    /// bytes of inline files (a batch adds its items' to it).
    pub fn spec(&self, command: Vec<String>, inline_total: &mut usize) -> Result<RunSpec> {
        let mut env = BTreeMap::new();
        for e in &self.env {
            let Some((k, v)) = e.split_once('=') else {
                bail!("invalid --env {e:?}: expected KEY=VALUE");
            };
            if k.is_empty() {
                bail!("invalid --env {e:?}: empty name");
            }
            env.insert(k.to_owned(), v.to_owned());
        }
        if let Some(u) = self.user.as_deref() {
            if u != "user" && u != "root" {
                bail!("invalid --user {u:?}: use `user` or `root`");
            }
        }
        let workdir = match self.workdir.as_deref() {
            None => None,
            Some(w) => Some(
                w.to_str()
                    .ok_or_else(|| anyhow!("--workdir {}: not UTF-8", w.display()))?
                    .to_owned(),
            ),
        };
        let timeout = match self.timeout.as_deref() {
            None => None,
            Some(t) => Some(
                parse_duration(t)
                    .map_err(|e| anyhow!("--timeout: {e}"))?
                    .as_secs_f64(),
            ),
        };
        let limits = RunLimits {
            memory_mb: self
                .memory
                .as_deref()
                .map(|m| mib("--memory", m))
                .transpose()?,
            cpus: self
                .cpus
                .as_deref()
                .map(|c| parse_cpus(c).map(|m| m as f64 / 1000.0))
                .transpose()
                .map_err(|e| anyhow!("{e}"))?,
            disk_mb: self.disk.as_deref().map(|d| mib("--disk", d)).transpose()?,
            pids: self.pids,
        };
        if limits.pids == Some(0) {
            bail!("--pids must be at least 1");
        }
        let workspaces = self
            .workspaces
            .iter()
            .map(|w| parse_workspace(w))
            .collect::<Result<Vec<_>>>()?;
        if let Some(w) = self.save_to.as_deref() {
            husk_core::workspaces::validate_name(w)
                .map_err(|e| anyhow!("invalid --save-to {w:?}: {e}"))?;
        }
        if !self.saves.is_empty() && workspaces.is_empty() && self.save_to.is_none() {
            bail!("--save needs a workspace to save into: --save-to NAME or --workspace NAME");
        }
        for s in &self.saves {
            if !s.starts_with('/') {
                bail!("--save {s:?}: give an absolute sandbox path (e.g. /home/user/out)");
            }
        }
        let mut files = Vec::new();
        for f in &self.files {
            let (local, dest) = parse_file(f)?;
            let bytes = read_local_file(Path::new(&local), "--file", inline_total)?;
            files.push(inline(&dest, &bytes));
        }
        let output_limit = match self.output_limit.as_deref() {
            None => OutputLimit::default(),
            Some(text) => {
                let l = super::parse_output_limit(text)?;
                OutputLimit {
                    bytes: Some(l.max_bytes),
                    files: text.contains(':').then_some(l.max_files),
                }
            }
        };
        Ok(RunSpec {
            template: self.template.clone(),
            command: Some(command),
            files,
            workspaces,
            env,
            secrets: self.secrets.clone(),
            limits,
            timeout,
            user: self.user.clone(),
            workdir,
            outputs: self.saves.clone(),
            output_workspace: self.save_to.clone(),
            output_limit,
            net: self.net.clone(),
            ..RunSpec::default()
        })
    }
}

/// The events of a run, as the server streams them.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Event {
    Started {
        run_id: String,
    },
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    Outputs(OutputsReport),
    Error {
        message: String,
    },
    End {
        run: Box<RunRecord>,
    },
    /// `exited` (its content is in the record) and events of later servers.
    #[serde(other)]
    Other,
}

/// Flags that only make sense for a local sandbox.
fn refuse_local_flags(a: &RunArgs) -> Result<()> {
    let local = [
        ("--tty", a.tty),
        ("--interactive", a.interactive),
        ("--copy", !a.copies.is_empty()),
        ("--output", !a.outputs.is_empty()),
        ("--mount", !a.mounts.is_empty()),
        ("--id-file", a.id_file.is_some()),
        ("--hostname", a.hostname.is_some()),
        ("--team", a.team.is_some()),
    ];
    if let Some((flag, _)) = local.iter().find(|(_, given)| *given) {
        let hint = match *flag {
            "--copy" => " (send files with --file LOCAL[:DEST], or put them in a workspace)",
            "--output" => " (save outputs into a workspace with --save PATH)",
            "--mount" => " (mount a workspace with --workspace NAME)",
            "--team" => " (the API key decides the team)",
            _ => "",
        };
        bail!("{flag} is not supported with --server{hint}");
    }
    Ok(())
}

/// Entry point of `husk run --server`: the process exit code.
pub fn main(a: RunArgs) -> i32 {
    match prepare(&a).and_then(|(client, spec)| {
        let rt = crate::client::runtime()?;
        rt.block_on(run(&client, &spec, a.job.timeout.as_deref()))
    }) {
        Ok(code) => code,
        Err(e) => {
            crate::report::say(&crate::report::anyhow(&e));
            EXIT_HUSK_ERROR
        }
    }
}

fn prepare(a: &RunArgs) -> Result<(Client, RunSpec)> {
    refuse_local_flags(a)?;
    let spec = a.job.spec(a.command.clone(), &mut 0)?;
    let client = Client::from_flags(a.server.as_deref(), a.state_dir.as_deref())?;
    Ok((client, spec))
}

/// Writes the command's output; `false` when the reader went away.
fn write_out(to_stdout: bool, data: &str) -> bool {
    let res = if to_stdout {
        let mut o = std::io::stdout().lock();
        o.write_all(data.as_bytes()).and_then(|_| o.flush())
    } else {
        let mut e = std::io::stderr().lock();
        e.write_all(data.as_bytes()).and_then(|_| e.flush())
    };
    res.is_ok()
}

/// Streams the run to its end; the exit code.
async fn run(client: &Client, spec: &RunSpec, timeout_flag: Option<&str>) -> Result<i32> {
    let mut signals = StopSignals::new()?;
    // A signal before the answer: dropping the request closes the connection, and the server
    // cancels a run whose client went away.
    let mut stream = tokio::select! {
        s = client.post_stream("/husk/v1/runs", spec) => s?,
        sig = signals.recv() => return Ok(128 + sig),
    };
    let mut id = stream.id.clone();
    let mut stopped: Option<i32> = None;
    let mut output_gone = false;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut record: Option<Box<RunRecord>> = None;
    let mut outputs: Option<OutputsReport> = None;
    let mut last_error: Option<String> = None;
    loop {
        let ev = tokio::select! {
            ev = stream.next::<Event>() => ev?,
            sig = signals.recv() => {
                if stopped.is_some() {
                    eprintln!("husk: second {}: not waiting for the run's end", signal_name(sig));
                    return Ok(128 + sig);
                }
                stopped = Some(sig);
                cancel(client, id.as_deref()).await;
                deadline = Some(tokio::time::Instant::now() + CANCEL_WAIT);
                continue;
            }
            _ = sleep_until(deadline) => {
                eprintln!(
                    "husk: the server did not confirm the end of the cancelled run in {} s",
                    CANCEL_WAIT.as_secs()
                );
                return Ok(128 + stopped.unwrap_or(libc::SIGTERM));
            }
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Started { run_id } => {
                id.get_or_insert(run_id);
            }
            Event::Stdout { data } | Event::Stderr { data } if output_gone => drop(data),
            Event::Stdout { data } => {
                if !write_out(true, &data) {
                    // As a shell's SIGPIPE: the reader is gone, so is the point of the run.
                    output_gone = true;
                    cancel(client, id.as_deref()).await;
                    deadline = Some(tokio::time::Instant::now() + CANCEL_WAIT);
                }
            }
            Event::Stderr { data } => {
                let _ = write_out(false, &data);
            }
            Event::Outputs(report) => outputs = Some(report),
            Event::Error { message } => last_error = Some(message),
            Event::Other => {}
            Event::End { run } => {
                record = Some(run);
                break;
            }
        }
    }
    if output_gone {
        return Ok(128 + libc::SIGPIPE);
    }
    if record.is_none() {
        // The stream broke off before the end: the record may still tell how it ended.
        if let Some(id) = &id {
            record = client
                .get_json::<RunRecord>(&format!("/husk/v1/runs/{id}"))
                .await
                .ok()
                .filter(|r| r.status.ended())
                .map(Box::new);
        }
    }
    let Some(rec) = record else {
        match last_error {
            Some(e) => bail!("{e}"),
            None => bail!("the server's stream ended before the run did"),
        }
    };
    if let Some(report) = rec.outputs.as_ref().or(outputs.as_ref()) {
        print_outputs(report);
    }
    Ok(exit_code(&rec, stopped, timeout_flag))
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Asks the server to cancel the run (a failure is reported, not fatal: closing the stream
/// cancels it too).
async fn cancel(client: &Client, id: Option<&str>) {
    let Some(id) = id else { return };
    if let Err(e) = client.delete(&format!("/husk/v1/runs/{id}")).await {
        eprintln!(
            "husk: cancelling run {id}: {}",
            without_controls(&format!("{e:#}"))
        );
    }
}

/// The summary of saved outputs, on stderr.
pub fn print_outputs(r: &OutputsReport) {
    let mut err = std::io::stderr().lock();
    for m in &r.missing {
        let _ = writeln!(
            err,
            "husk: --save {}: not found when the command ended",
            without_controls(m)
        );
    }
    for s in &r.skipped {
        let _ = writeln!(
            err,
            "husk: --save: skipped {} ({}, not saved)",
            without_controls(&s.path),
            without_controls(&s.kind)
        );
    }
    if r.skipped_more > 0 {
        let _ = writeln!(err, "husk: --save: {} more entries skipped", r.skipped_more);
    }
    let _ = writeln!(
        err,
        "husk: saved {} file{} ({}) to workspace {} at {}/",
        r.files.len(),
        if r.files.len() == 1 { "" } else { "s" },
        format_size(r.bytes),
        without_controls(&r.workspace),
        without_controls(r.dir.trim_end_matches('/'))
    );
}

/// Signal numbers of the agent's `signal: NAME` reasons (Go's names, as E2B reports them).
const SIGNAL_REASONS: &[(&str, i32)] = &[
    ("hangup", libc::SIGHUP),
    ("interrupt", libc::SIGINT),
    ("quit", libc::SIGQUIT),
    ("illegal instruction", libc::SIGILL),
    ("trace/breakpoint trap", libc::SIGTRAP),
    ("aborted", libc::SIGABRT),
    ("bus error", libc::SIGBUS),
    ("floating point exception", libc::SIGFPE),
    ("killed", libc::SIGKILL),
    ("user defined signal 1", libc::SIGUSR1),
    ("segmentation fault", libc::SIGSEGV),
    ("user defined signal 2", libc::SIGUSR2),
    ("broken pipe", libc::SIGPIPE),
    ("alarm clock", libc::SIGALRM),
    ("terminated", libc::SIGTERM),
    ("CPU time limit exceeded", libc::SIGXCPU),
    ("file size limit exceeded", libc::SIGXFSZ),
];

/// The signal of a `signal: NAME` (or `signal: signal N`) reason.
pub fn reason_signal(reason: &str) -> Option<i32> {
    let name = reason.strip_prefix("signal: ")?;
    if let Some(n) = name.strip_prefix("signal ") {
        return n.parse().ok();
    }
    SIGNAL_REASONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
}

fn signal_name(sig: i32) -> String {
    super::signal_name(sig)
}

/// husk's exit code for a run's record (and what to say about it on stderr), as a local
/// `husk run` would end.
pub fn exit_code(rec: &RunRecord, stopped: Option<i32>, timeout_flag: Option<&str>) -> i32 {
    let reason = rec.reason.clone().unwrap_or_default();
    match rec.status {
        RunStatus::Succeeded => 0,
        RunStatus::Failed if reason == "out of memory" => {
            eprintln!("husk: killed: out of memory");
            128 + libc::SIGKILL
        }
        RunStatus::Failed => match (rec.exit_code, reason_signal(&reason)) {
            (_, Some(sig)) => {
                if sig != libc::SIGPIPE && sig != libc::SIGINT {
                    eprintln!("husk: killed: {}", signal_name(sig));
                }
                128 + sig
            }
            (Some(code), None) if code >= 0 => code,
            _ => {
                eprintln!("husk: the command failed: {}", without_controls(&reason));
                EXIT_HUSK_ERROR
            }
        },
        RunStatus::TimedOut => {
            let after = timeout_flag
                .and_then(|t| parse_duration(t).ok())
                .map(|t| format!("timeout after {}", format_duration(t)))
                .unwrap_or(reason);
            eprintln!("husk: killed: {}", without_controls(&after));
            EXIT_TIMEOUT
        }
        RunStatus::Cancelled => match stopped {
            Some(sig) => 128 + sig,
            None => {
                eprintln!("husk: the run was cancelled on the server");
                EXIT_HUSK_ERROR
            }
        },
        RunStatus::Error
            if rec
                .error
                .as_deref()
                .is_some_and(|e| e.contains("starting the command failed")) =>
        {
            // As a local run: 127 for a command that is not there, 126 for one that cannot run.
            let err = rec.error.as_deref().unwrap_or_default();
            let prog = without_controls(rec.command.first().map(String::as_str).unwrap_or(""));
            let (why, code) = if err.contains("(os error 2)") {
                ("command not found in the sandbox", 127)
            } else if err.contains("(os error 13)") {
                ("permission denied", 126)
            } else {
                eprintln!("husk: {}", without_controls(err));
                return EXIT_HUSK_ERROR;
            };
            eprintln!("husk: cannot run {prog:?}: {why}");
            code
        }
        RunStatus::Error | RunStatus::Running => {
            let why = rec
                .error
                .clone()
                .or(rec.reason.clone())
                .unwrap_or_else(|| "the run ended without a result".into());
            eprintln!("husk: {}", without_controls(&why));
            EXIT_HUSK_ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_flags() {
        let w = parse_workspace("data").unwrap();
        assert_eq!((w.name.as_str(), w.path, w.mode), ("data", None, None));
        let w = parse_workspace("out:rw@/srv/out").unwrap();
        assert_eq!(w.mode.as_deref(), Some("rw"));
        assert_eq!(w.path.as_deref(), Some("/srv/out"));
        let w = parse_workspace("d@/x:y").unwrap();
        assert_eq!(w.path.as_deref(), Some("/x:y"));
        assert!(parse_workspace("d:wr").is_err());
        assert!(parse_workspace("d@rel").is_err());
        assert!(parse_workspace("../x").is_err());
        assert!(parse_workspace("").is_err());
    }

    #[test]
    fn file_flags() {
        assert_eq!(
            parse_file("dir/a.py").unwrap(),
            ("dir/a.py".into(), "a.py".into())
        );
        assert_eq!(
            parse_file("a.py:/tmp/b.py").unwrap(),
            ("a.py".into(), "/tmp/b.py".into())
        );
        assert!(parse_file("a.py:").is_err());
        assert!(parse_file(":x").is_err());
    }

    #[test]
    fn only_given_limits_are_sent() {
        let spec = JobArgs::default()
            .spec(vec!["true".into()], &mut 0)
            .unwrap();
        assert!(spec.limits.memory_mb.is_none() && spec.limits.cpus.is_none());
        assert!(spec.timeout.is_none() && spec.template.is_none());
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["command"], serde_json::json!(["true"]));
        let spec = JobArgs {
            memory: Some("1G".into()),
            cpus: Some("0.5".into()),
            timeout: Some("1500ms".into()),
            env: vec!["A=1".into()],
            ..JobArgs::default()
        }
        .spec(vec!["x".into()], &mut 0)
        .unwrap();
        assert_eq!(spec.limits.memory_mb, Some(1024));
        assert_eq!(spec.limits.cpus, Some(0.5));
        assert_eq!(spec.timeout, Some(1.5));
        assert_eq!(spec.env["A"], "1");
        let err = JobArgs {
            saves: vec!["/out".into()],
            ..JobArgs::default()
        }
        .spec(vec!["x".into()], &mut 0)
        .unwrap_err();
        assert!(err.to_string().contains("--save-to"), "{err}");
    }

    #[test]
    fn signal_reasons() {
        assert_eq!(reason_signal("signal: killed"), Some(libc::SIGKILL));
        assert_eq!(reason_signal("signal: signal 34"), Some(34));
        assert_eq!(reason_signal("exit status 1"), None);
    }
}
