//! Debian bases: a root file system made by `mmdebstrap` from the Debian mirror the host's
//! apt is configured with (so a build works wherever the host's `apt-get` does).
//!
//! mmdebstrap runs on the host as root (`--mode=root`): it unpacks packages signed by the
//! host's Debian keyring and runs their maintainer scripts chrooted in the new tree. That is
//! the same trust the host's own `apt-get install` has; the build's own steps (RUN, pip, npm)
//! run in build sandboxes.

use std::fs;
use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncReadExt;

use crate::Progress;

/// The host's configured Debian mirror and security mirror (first of each), from apt's
/// sources in one-line (`deb URI suite ...`) and deb822 (`URIs:`) formats.
pub fn host_mirrors() -> (Option<String>, Option<String>) {
    let mut texts = Vec::new();
    if let Ok(t) = fs::read_to_string("/etc/apt/sources.list") {
        texts.push(t);
    }
    if let Ok(rd) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut paths: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            if let Ok(t) = fs::read_to_string(&p) {
                texts.push(t);
            }
        }
    }
    mirrors_of(&texts)
}

fn mirrors_of(texts: &[String]) -> (Option<String>, Option<String>) {
    let (mut main, mut security) = (None, None);
    for text in texts {
        for line in text.lines() {
            let line = line.trim();
            let uris: Vec<&str> = if let Some(rest) = line.strip_prefix("URIs:") {
                rest.split_whitespace().collect()
            } else if let Some(rest) = line.strip_prefix("deb ") {
                // `deb [options] URI suite components`
                let rest = match rest.trim_start().strip_prefix('[') {
                    Some(r) => r.split_once(']').map_or("", |(_, r)| r),
                    None => rest,
                };
                rest.split_whitespace().take(1).collect()
            } else {
                continue;
            };
            for uri in uris {
                let uri = uri.trim_end_matches('/').to_string();
                if !uri.contains("://") {
                    continue;
                }
                if uri.contains("security") {
                    security.get_or_insert(uri);
                } else {
                    main.get_or_insert(uri);
                }
            }
        }
    }
    (main, security)
}

/// mmdebstrap's MIRROR arguments for `suite`: the host's mirror (main, and `-updates` for a
/// release with updates) and its security mirror; empty when the host configures none (then
/// mmdebstrap uses deb.debian.org and adds updates and security itself).
pub fn mirror_args(suite: &str) -> Vec<String> {
    let (main, security) = host_mirrors();
    let Some(main) = main else {
        return Vec::new();
    };
    let mut out = vec![format!("deb {main} {suite} main")];
    let rolling = matches!(suite, "sid" | "unstable" | "experimental");
    if !rolling {
        out.push(format!("deb {main} {suite}-updates main"));
        if let Some(sec) = security {
            out.push(format!("deb {sec} {suite}-security main"));
        }
    }
    out
}

/// The mmdebstrap command line (without the program name) that makes `suite` into `target`.
pub fn mmdebstrap_args(
    suite: &str,
    variant: &str,
    packages: &[String],
    target: &Path,
) -> Vec<String> {
    let mut args = vec![
        "--mode=root".to_string(),
        "--format=directory".to_string(),
        format!("--variant={variant}"),
        "--aptopt=Acquire::Retries \"3\"".to_string(),
    ];
    if !packages.is_empty() {
        args.push(format!("--include={}", packages.join(",")));
    }
    args.push(suite.to_string());
    args.push(target.display().to_string());
    args.extend(mirror_args(suite));
    args
}

/// Runs a host tool (mmdebstrap), streaming its output; on failure its exit code and tail.
pub async fn run_host_tool(
    mut cmd: tokio::process::Command,
    progress: &dyn Progress,
) -> Result<(), (i32, String)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| (127, e.to_string()))?;
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let mut tail: Vec<u8> = Vec::new();
    let (mut b1, mut b2) = (vec![0u8; 8192], vec![0u8; 8192]);
    while out.is_some() || err.is_some() {
        let n = tokio::select! {
            r = async { out.as_mut().unwrap().read(&mut b1).await }, if out.is_some() => {
                match r { Ok(0) | Err(_) => { out = None; continue } Ok(n) => &b1[..n] }
            }
            r = async { err.as_mut().unwrap().read(&mut b2).await }, if err.is_some() => {
                match r { Ok(0) | Err(_) => { err = None; continue } Ok(n) => &b2[..n] }
            }
        };
        progress.log(n);
        tail.extend_from_slice(n);
        if tail.len() > 16 << 10 {
            tail.drain(..tail.len() - (16 << 10));
        }
    }
    let status = child.wait().await.map_err(|e| (127, e.to_string()))?;
    if status.success() {
        return Ok(());
    }
    let text = String::from_utf8_lossy(&tail);
    let lines: Vec<&str> = text.lines().collect();
    let from = lines.len().saturating_sub(25);
    Err((status.code().unwrap_or(-1), lines[from..].join("\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mirrors_are_read_from_both_formats() {
        let deb822 = "Types: deb\n# comment\nURIs: http://deb.example.org/debian\nSuites: bookworm\n\n\
                      Types: deb\nURIs: http://deb.example.org/debian-security\nSuites: bookworm-security\n";
        assert_eq!(
            mirrors_of(&[deb822.to_string()]),
            (
                Some("http://deb.example.org/debian".into()),
                Some("http://deb.example.org/debian-security".into())
            )
        );
        let one_line = "deb [arch=amd64 signed-by=/x.gpg] http://m.example/debian/ bookworm main\n# deb http://other/ x\n";
        assert_eq!(
            mirrors_of(&[one_line.to_string()]),
            (Some("http://m.example/debian".into()), None)
        );
    }
}
