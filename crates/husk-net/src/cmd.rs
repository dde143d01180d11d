//! Running `ip` and `nft` inside a network namespace. A child process inherits the namespace
//! of the thread that starts it, so the command is started from a thread that entered it
//! ([`NetNs::run`]). Scripts go in on stdin (`ip -batch -`, `nft -f -`): one process per
//! change, applied atomically by nft.

use std::io::{self, Write};
use std::process::{Command, Stdio};

use crate::netns::NetNs;

/// Runs `program args…` with `script` on stdin, in `ns` (None: the caller's namespace). An
/// error carries the tool's own message.
pub fn run_script(
    ns: Option<&NetNs>,
    program: &str,
    args: &[&str],
    script: &str,
) -> io::Result<()> {
    let go = || {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| io::Error::new(e.kind(), format!("run {program}: {e}")))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin.write_all(script.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if out.status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )))
        }
    };
    match ns {
        Some(ns) => ns.run(go),
        None => go(),
    }
}

/// `ip -batch -` in `ns`.
pub fn ip(ns: Option<&NetNs>, script: &str) -> io::Result<()> {
    run_script(ns, "ip", &["-batch", "-"], script)
}

/// `nft -f -` in `ns`.
pub fn nft(ns: Option<&NetNs>, script: &str) -> io::Result<()> {
    run_script(ns, "nft", &["-f", "-"], script)
}

/// What `program args…` printed, run in `ns`.
pub fn output(ns: Option<&NetNs>, program: &str, args: &[&str]) -> io::Result<String> {
    let go = || {
        let out = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| io::Error::new(e.kind(), format!("run {program}: {e}")))?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "{program} {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    match ns {
        Some(ns) => ns.run(go),
        None => go(),
    }
}

/// Writes a sysctl of `ns` (`net/ipv4/ip_forward`, …): `/proc/sys/net` shows the namespace of
/// the thread that opens it.
pub fn sysctl(ns: Option<&NetNs>, key: &str, value: &str) -> io::Result<()> {
    let path = format!("/proc/sys/{key}");
    let go = || {
        std::fs::write(&path, value).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
    };
    match ns {
        Some(ns) => ns.run(go),
        None => go(),
    }
}

/// Reads a sysctl of the caller's namespace.
pub fn read_sysctl(key: &str) -> io::Result<String> {
    Ok(std::fs::read_to_string(format!("/proc/sys/{key}"))?
        .trim()
        .to_owned())
}
