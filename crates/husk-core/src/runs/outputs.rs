//! Saving a run's outputs: from the frozen sandbox into `runs/<run-id>/` of a workspace, with
//! the rules of `husk run --output` (no symlink followed, on either side; no special file
//! opened; size and count bounded) and a manifest of every file's size and SHA-256, written
//! beside them as `husk-manifest.json` and returned in the run's record.

use std::io::Write;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

use husk_runtime::transfer::{self, HostDest, OutputLimits, SkipKind, TransferError};
use serde::{Deserialize, Serialize};

use super::spec::MANIFEST_FILE;
use crate::workspaces::WORKSPACE_OWNER;

/// Where a run's outputs went and what they are.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputsReport {
    pub workspace: String,
    /// The directory in the workspace: `runs/<run-id>`.
    pub dir: String,
    pub files: Vec<OutputFile>,
    /// Entries that were not copied (symlinks, devices, fifos, sockets), the first 100.
    pub skipped: Vec<OutputSkipped>,
    /// How many more were skipped.
    pub skipped_more: u64,
    /// Output paths the run declared that did not exist when it ended.
    pub missing: Vec<String>,
    /// Total bytes copied.
    pub bytes: u64,
}

/// One saved file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputFile {
    /// Relative to the run's directory: `<output name>[/<path below it>]`.
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

/// One entry not saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSkipped {
    pub path: String,
    /// `symlink`, `device`, `fifo` or `socket`.
    pub kind: String,
    /// A symlink's target text (never followed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

fn name_of(src: &str) -> &str {
    src.trim_end_matches('/').rsplit('/').next().unwrap_or(src)
}

fn rel(prefix: &str, p: &Path) -> String {
    let p = p.to_string_lossy();
    if p.is_empty() {
        prefix.to_owned()
    } else {
        format!("{prefix}/{p}")
    }
}

/// Why a run's outputs were not (all) saved.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SaveError {
    /// The workspace's file system is full (its team's quota is used up); what was being
    /// written.
    NoSpace(String),
    Other(String),
}

impl std::fmt::Display for SaveError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SaveError::NoSpace(what) => write!(f, "{what}: no space left in the workspace"),
            SaveError::Other(what) => f.write_str(what),
        }
    }
}

impl From<String> for SaveError {
    fn from(s: String) -> SaveError {
        SaveError::Other(s)
    }
}

/// `e` (with `context` in front, when given), told apart by whether it is a host write that
/// found no space.
fn failed(context: &str, e: TransferError) -> SaveError {
    let full = matches!(&e, TransferError::Io { source, .. }
        if matches!(source.raw_os_error(), Some(husk_runtime::libc::ENOSPC | husk_runtime::libc::EDQUOT)));
    let text = if context.is_empty() {
        e.to_string()
    } else {
        format!("{context}: {e}")
    };
    if full {
        SaveError::NoSpace(text)
    } else {
        SaveError::Other(text)
    }
}

/// Copies `outputs` (absolute sandbox paths, distinct last components) out of the sandbox
/// whose root is open at `root` into `<workspace_dir>/runs/<run_id>/`. Blocking.
pub fn save(
    root: BorrowedFd<'_>,
    workspace: &str,
    workspace_dir: &Path,
    run_id: &str,
    outputs: &[String],
    limits: &OutputLimits,
) -> Result<OutputsReport, SaveError> {
    let msg = |e: TransferError| failed("", e);
    let base = HostDest::open(workspace_dir)
        .map_err(msg)?
        .with_manifest()
        .owned_by(WORKSPACE_OWNER)
        .map_err(msg)?;
    let dir = base
        .subdir("runs")
        .and_then(|d| d.subdir(run_id))
        .map_err(|e| failed(&format!("workspace '{workspace}'"), e))?;
    let mut report = OutputsReport {
        workspace: workspace.to_owned(),
        dir: format!("runs/{run_id}"),
        ..OutputsReport::default()
    };
    let mut left = *limits;
    for src in outputs {
        let name = name_of(src);
        let path = PathBuf::from(src);
        let is_dir = match transfer::sandbox_is_dir(root, &path) {
            Ok(d) => d,
            Err(TransferError::NotFound { .. }) => {
                report.missing.push(src.clone());
                continue;
            }
            Err(TransferError::Symlink { .. }) => {
                report.skipped.push(OutputSkipped {
                    path: name.to_owned(),
                    kind: "symlink".into(),
                    target: None,
                });
                continue;
            }
            Err(e) => return Err(failed(&format!("output {src}"), e)),
        };
        // A file lands as runs/<id>/<name>; a directory's contents under runs/<id>/<name>/.
        let (dest, prefix) = if is_dir {
            (dir.subdir(name).map_err(msg)?, name.to_owned())
        } else {
            (dir.try_clone().map_err(msg)?, String::new())
        };
        let r = transfer::copy_out(root, &path, &dest, &left)
            .map_err(|e| failed(&format!("output {src}"), e))?;
        for m in r.manifest {
            let p = if prefix.is_empty() {
                m.path.to_string_lossy().into_owned()
            } else {
                rel(&prefix, &m.path)
            };
            report.files.push(OutputFile {
                path: p,
                size: m.size,
                sha256: m.sha256,
            });
        }
        for s in r.skipped {
            let (kind, target) = match s.kind {
                SkipKind::Symlink { target } => ("symlink", Some(target)),
                SkipKind::Device => ("device", None),
                SkipKind::Fifo => ("fifo", None),
                SkipKind::Socket => ("socket", None),
            };
            let p = if prefix.is_empty() {
                s.path.to_string_lossy().into_owned()
            } else {
                rel(&prefix, &s.path)
            };
            if report.skipped.len() < transfer::MAX_SKIPPED_LISTED {
                report.skipped.push(OutputSkipped {
                    path: p,
                    kind: kind.into(),
                    target,
                });
            } else {
                report.skipped_more += 1;
            }
        }
        report.skipped_more += r.skipped_more;
        report.bytes += r.bytes;
        let entries = r.files + r.dirs + r.skipped_more + report.skipped.len() as u64;
        left.max_bytes -= r.bytes.min(left.max_bytes);
        left.max_files -= entries.min(left.max_files);
    }
    report.files.sort_by(|a, b| a.path.cmp(&b.path));
    write_manifest(&dir, &report)?;
    Ok(report)
}

/// `husk-manifest.json` in the run's directory, created fresh (never through an existing
/// entry, found from the directory's descriptor, not its path), owned like the outputs.
fn write_manifest(dir: &HostDest, report: &OutputsReport) -> Result<(), SaveError> {
    let context = "write the manifest";
    let text = serde_json::to_vec_pretty(report).map_err(|e| format!("{context}: {e}"))?;
    let mut f = dir
        .create_file(MANIFEST_FILE, 0o644)
        .map_err(|e| failed(context, e))?;
    f.write_all(&text)
        .and_then(|_| f.write_all(b"\n"))
        .map_err(|e| {
            if matches!(
                e.raw_os_error(),
                Some(husk_runtime::libc::ENOSPC | husk_runtime::libc::EDQUOT)
            ) {
                SaveError::NoSpace(context.into())
            } else {
                SaveError::Other(format!("{context}: {e}"))
            }
        })
}
