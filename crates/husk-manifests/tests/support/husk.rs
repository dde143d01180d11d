//! What the real husk binary accepts (its `--help`), and what a container asks of it (its
//! command line and `HUSK_*` variables).

use std::collections::BTreeSet;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, EnvVar};

use super::{shown, workspace_root};

/// Where the binary a debug build makes is, below a target directory.
const DEBUG_BIN: &str = "x86_64-unknown-linux-gnu/debug/husk";

/// The husk binary to ask: `HUSK_BIN`, else the debug build in `$CARGO_TARGET_DIR`, else the
/// one in the workspace's `target/` (where scripts/test's `cargo build --workspace` puts it
/// before `cargo test`; a test run with a target directory of its own still finds it). Panics,
/// saying how to get one, when there is none: the flag checks are not skipped.
pub fn binary() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("HUSK_BIN") {
        Some(bin) => vec![PathBuf::from(bin)],
        None => std::env::var_os("CARGO_TARGET_DIR")
            .map(|dir| PathBuf::from(dir).join(DEBUG_BIN))
            .into_iter()
            .chain([workspace_root().join("target").join(DEBUG_BIN)])
            .collect(),
    };
    match candidates.iter().find(|c| c.is_file()) {
        Some(found) => found.clone(),
        None => panic!(
            "no husk binary at {}: build it first (`cargo build --locked -p husk`, as \
             scripts/test does before `cargo test`), or set HUSK_BIN to one",
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(" or ")
        ),
    }
}

/// The long flags and `HUSK_*` variables of one subcommand, from `husk SUB --help`.
#[derive(Debug)]
pub struct Help {
    pub flags: BTreeSet<String>,
    pub env: BTreeSet<String>,
}

/// Runs `husk SUB --help` and reads its flags (`--name`) and variables (`[env: NAME]`).
pub fn help(subcommand: &str) -> Result<Help, String> {
    let bin = binary();
    let out = Command::new(&bin)
        .args([subcommand, "--help"])
        .env_clear()
        .output()
        .map_err(|e| format!("run {} {subcommand} --help: {e}", bin.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "`husk {subcommand} --help` failed ({}): {}\n(this husk, {}, has no `{subcommand}` \
             subcommand; the manifests need one)",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            shown(&bin)
        ));
    }
    Ok(Help {
        // Only where clap lists an option (`  -h, --help`, `      --listen <ADDR:PORT>`), not
        // a flag named in another's description.
        flags: text
            .lines()
            .filter_map(|line| {
                let line = line.trim_start();
                let line = match line.split_once(", ") {
                    Some((short, rest)) if short.len() == 2 && short.starts_with('-') => rest,
                    _ => line,
                };
                line.strip_prefix("--")
            })
            .map(|w| {
                w.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect::<String>()
            })
            .filter(|w| !w.is_empty())
            .collect(),
        env: text
            .split("[env: ")
            .skip(1)
            .map(|rest| {
                rest.chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect(),
    })
}

/// How long [`boolean_env`] waits for husk to refuse to start.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// What `husk SUB` makes of `value` in `var`, the variable of a boolean flag: clap's own
/// answer, from the real binary (its `--help` does not list a flag's values, and short-circuits
/// before variables are read). husk runs with that variable alone and no arguments, so that it
/// stops at clap's checks: a value clap refuses fails as "invalid value"; one it takes gets as
/// far as the arguments the subcommand requires, which a cluster's `node` and `gateway` have
/// (and which the process is given `PROBE_TIMEOUT` to stop at, then killed). clap's booleans
/// are `true` and `false`; any other value it took would be an error here, since which it means
/// would be a guess.
pub fn boolean_env(subcommand: &str, var: &str, value: &str) -> Result<bool, String> {
    let bin = binary();
    let mut child = Command::new(&bin)
        .arg(subcommand)
        .env_clear()
        .env(var, value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("run {} {subcommand}: {e}", bin.display()))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < PROBE_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`{var}={value} husk {subcommand}` with no arguments ran for {PROBE_TIMEOUT:?} \
                     instead of stopping at clap's checks"
                ));
            }
            Err(e) => return Err(format!("wait for husk {subcommand}: {e}")),
        }
    };
    let mut stderr = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut stderr);
    }
    let said = stderr.lines().next().unwrap_or_default().trim();
    if said.contains("invalid value") {
        return Err(format!("husk refuses {var}={value:?}: {said}"));
    }
    if !said.contains("required arguments were not provided") {
        return Err(format!(
            "`{var}={value} husk {subcommand}` with no arguments: {status}, {said:?}: neither \
             clap's refusal of the value nor of the missing arguments"
        ));
    }
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(format!(
            "husk takes {var}={other:?}, which is neither `true` nor `false`: write one of those"
        )),
    }
}

/// A container's husk command line: the subcommand, then each flag with its value.
#[derive(Debug)]
pub struct Invocation {
    pub subcommand: String,
    pub flags: Vec<(String, Option<String>)>,
}

impl Invocation {
    /// The value given to `--flag`.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.flags
            .iter()
            .find(|(f, _)| f == flag)
            .and_then(|(_, v)| v.as_deref())
    }
}

/// Whether `container` runs husk's image.
pub fn is_husk(container: &Container) -> bool {
    let image = container.image.as_deref().unwrap_or_default();
    let repo = image.split(':').next().unwrap_or_default();
    repo == "husk" || repo.ends_with("/husk")
}

/// The husk command line of `container`: its `command` (the binary, if given) and `args`.
/// Only long flags: `--flag value` or `--flag=value`.
pub fn invocation(container: &Container) -> Result<Invocation, String> {
    let mut argv: Vec<String> = Vec::new();
    if let Some(command) = container.command.as_deref().filter(|c| !c.is_empty()) {
        if !command[0].ends_with("husk") {
            return Err(format!(
                "container {} runs {:?}, not husk",
                container.name, command[0]
            ));
        }
        argv.extend(command[1..].iter().cloned());
    }
    argv.extend(container.args.iter().flatten().cloned());
    let mut words = argv.into_iter().peekable();
    let subcommand = match words.next() {
        Some(s) if !s.starts_with('-') => s,
        other => {
            return Err(format!(
                "container {}: the first argument must be husk's subcommand, not {other:?}",
                container.name
            ))
        }
    };
    let mut flags = Vec::new();
    while let Some(word) = words.next() {
        let Some(flag) = word.strip_prefix("--") else {
            return Err(format!(
                "container {}: {word:?} is neither a long flag nor a flag's value",
                container.name
            ));
        };
        match flag.split_once('=') {
            Some((name, value)) => flags.push((name.to_owned(), Some(value.to_owned()))),
            None => {
                let value = words.next_if(|w| !w.starts_with("--"));
                flags.push((flag.to_owned(), value));
            }
        }
    }
    Ok(Invocation { subcommand, flags })
}

/// The variable clap reads for `--flag`: `HUSK_` and the flag in capitals.
pub fn env_name(flag: &str) -> String {
    format!("HUSK_{}", flag.to_ascii_uppercase().replace('-', "_"))
}

/// Where a container sets a setting of husk's: its flag or its `HUSK_*` variable.
#[derive(Debug)]
pub enum Setting<'a> {
    Flag(Option<&'a str>),
    Env(&'a EnvVar),
}

impl Setting<'_> {
    /// The literal value, if the manifest writes it out.
    pub fn literal(&self) -> Option<&str> {
        match self {
            Setting::Flag(v) => *v,
            Setting::Env(e) => e.value.as_deref(),
        }
    }
}

/// How `container` (running `inv`) sets `--flag`, if it does.
pub fn setting<'a>(
    container: &'a Container,
    inv: &'a Invocation,
    flag: &str,
) -> Option<Setting<'a>> {
    if let Some((_, v)) = inv.flags.iter().find(|(f, _)| f == flag) {
        return Some(Setting::Flag(v.as_deref()));
    }
    let name = env_name(flag);
    container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .map(Setting::Env)
}

/// A size as husk reads one (`512M`, `1G`: powers of 1024), in bytes.
pub fn husk_size(s: &str) -> Option<u64> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "ki" | "kib" => 10,
        "m" | "mi" | "mib" => 20,
        "g" | "gi" | "gib" => 30,
        "t" | "ti" | "tib" => 40,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// A Kubernetes memory quantity (`16Gi`, `512Mi`, `1G`), in bytes.
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let mult: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return None,
    };
    n.parse::<u64>().ok()?.checked_mul(mult)
}

/// The port of an `ADDR:PORT` listen address.
pub fn listen_port(listen: &str) -> Option<i32> {
    listen.rsplit_once(':')?.1.parse().ok()
}
