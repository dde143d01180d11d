//! One build step in a build sandbox: the sandbox's root is the stack of layers below the step
//! (id-mapped, read-only) under an empty upper directory on the host's disk that collects the
//! step's changes; it has the host's network (package managers need it) and otherwise every
//! fence of an ordinary sandbox. When the step ends the sandbox is destroyed and the upper
//! directory's owners are shifted from the sandbox's host ids back to image ids.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use husk_core::agent::AgentClient;
use husk_proto::{ErrorKind, Hello, ProcEvent, Request, StartProc, User, VERSION};
use husk_runtime::service::SpawnerService;
use husk_runtime::{Limits, NetworkMode, RootSource, SandboxSpec};

use crate::plan::Command;
use crate::Progress;

/// Where build steps find the host's CA bundle (so builds work behind TLS-inspecting
/// proxies whose CA the host trusts); removed from the layer after the step.
pub const BUILD_CA_PATH: &str = "/run/husk-build-ca.crt";

/// The host's CA bundle, if it has one.
pub const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How much of a failed step's output its error shows.
const TAIL_LINES: usize = 25;
const TAIL_BYTES: usize = 16 << 10;

/// What a step does inside its sandbox.
pub enum Work<'a> {
    Run {
        command: &'a Command,
        user: User,
        workdir: &'a str,
        env: Vec<(String, String)>,
    },
    /// Copies host files (trusted build context) to `(source, sandbox path)` owned by
    /// `(uid, gid)` in image ids.
    Copy {
        files: Vec<(PathBuf, String)>,
        owner: (u32, u32),
    },
}

/// How a step ended when it did not succeed.
#[derive(Debug)]
pub enum StepError {
    /// The command exited non-zero (or was killed, or timed out).
    Failed {
        exit_code: i32,
        reason: String,
        tail: String,
    },
    /// The sandbox could not be made or used.
    Sandbox(String),
}

/// Runs `work` in a build sandbox over `lower` (top first), collecting its changes into the
/// directory `upper` (empty; `work_dir` is overlayfs's work directory beside it).
#[allow(clippy::too_many_arguments)]
pub async fn run(
    spawner: &Arc<SpawnerService>,
    lower: Vec<PathBuf>,
    upper: &Path,
    work_dir: &Path,
    limits: &Limits,
    timeout: Duration,
    work: Work<'_>,
    progress: &dyn Progress,
) -> Result<(), StepError> {
    let mut spec = SandboxSpec::idle();
    spec.agent = true;
    spec.hostname = "husk-build".into();
    spec.limits = limits.clone();
    spec.network = NetworkMode::Host;
    spec.rootfs = RootSource::Layers {
        lower,
        upper: upper.to_path_buf(),
        work: work_dir.to_path_buf(),
    };
    let ca = Path::new(HOST_CA_BUNDLE);
    if ca.is_file() {
        spec.mounts.push(husk_runtime::MountSpec {
            host: ca.to_path_buf(),
            sandbox: PathBuf::from(BUILD_CA_PATH),
            writable: false,
            ids: husk_runtime::MountIds::Unmapped,
        });
    }
    let sp = spawner.clone();
    let created = tokio::task::spawn_blocking(move || sp.create(&spec))
        .await
        .map_err(|e| StepError::Sandbox(e.to_string()))?
        .map_err(|e| StepError::Sandbox(format!("creating the build sandbox: {e}")))?;
    let runtime_id = created.id.clone();
    let init_pid = created.init_pid;
    let result = async {
        let (env, user, workdir) = match &work {
            Work::Run {
                env, user, workdir, ..
            } => (env.clone(), *user, Some(workdir.to_string())),
            Work::Copy { .. } => (Vec::new(), User::Root, None),
        };
        let hello = Hello {
            version: VERSION,
            env: with_ca_env(env, ca.is_file()),
            default_user: user,
            default_workdir: workdir,
        };
        let agent = AgentClient::connect(created.agent, hello)
            .await
            .map_err(|e| StepError::Sandbox(format!("build sandbox agent: {e}")))?;
        let r = match &work {
            Work::Run {
                command,
                user,
                workdir,
                ..
            } => run_command(&agent, command, *user, workdir, timeout, progress).await,
            Work::Copy { files, owner } => copy_files(init_pid, files, *owner),
        };
        agent.close().await;
        r
    }
    .await;
    let sp = spawner.clone();
    let destroyed = tokio::task::spawn_blocking(move || sp.destroy(&runtime_id)).await;
    result?;
    match destroyed {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(StepError::Sandbox(format!(
                "destroying the build sandbox: {e}"
            )))
        }
        Err(e) => return Err(StepError::Sandbox(e.to_string())),
    }
    finish_upper(upper).map_err(|e| StepError::Sandbox(format!("collecting the layer: {e}")))
}

/// The step's environment plus the variables that point TLS clients at the host's CA bundle
/// (unless the step sets them itself).
fn with_ca_env(mut env: Vec<(String, String)>, have_ca: bool) -> Vec<(String, String)> {
    if have_ca {
        for k in [
            "SSL_CERT_FILE",
            "REQUESTS_CA_BUNDLE",
            "PIP_CERT",
            "NODE_EXTRA_CA_CERTS",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO",
        ] {
            if !env.iter().any(|(e, _)| e == k) {
                env.push((k.into(), BUILD_CA_PATH.into()));
            }
        }
    }
    env
}

async fn run_command(
    agent: &AgentClient,
    command: &Command,
    user: User,
    workdir: &str,
    timeout: Duration,
    progress: &dyn Progress,
) -> Result<(), StepError> {
    match agent
        .call(Request::MakeDir {
            path: workdir.to_string(),
            user: User::Root,
        })
        .await
    {
        Ok(_) => {}
        Err(husk_core::agent::CallError::Agent(e)) if e.kind == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StepError::Sandbox(format!("workdir {workdir}: {e}"))),
    }
    let (cmd, args) = match command {
        Command::Shell(s) => ("/bin/sh".to_string(), vec!["-c".to_string(), s.clone()]),
        Command::Exec(argv) => match argv.split_first() {
            Some((c, a)) => (c.clone(), a.to_vec()),
            None => return Err(StepError::Sandbox("empty command".into())),
        },
    };
    let (_, mut stream) = agent
        .start(StartProc {
            cmd,
            args,
            envs: Vec::new(),
            cwd: Some(workdir.to_string()),
            user,
            pty: None,
            tag: Some("build-step".into()),
            stdin: false,
            timeout_ms: Some(timeout.as_millis() as u64),
            secret_envs: Vec::new(),
        })
        .await
        .map_err(|e| StepError::Sandbox(format!("starting the command: {e}")))?;
    let mut tail = Tail::default();
    while let Some(ev) = stream.next().await {
        match ev {
            ProcEvent::Stdout(b) | ProcEvent::Stderr(b) | ProcEvent::Pty(b) => {
                progress.log(&b);
                tail.push(&b);
            }
            ProcEvent::End(end) => {
                if end.exit_code == 0 && end.exited {
                    return Ok(());
                }
                let reason = match end.error {
                    Some(e) if e == husk_proto::PROCESS_TIMED_OUT => {
                        format!("timed out after {} s", timeout.as_secs())
                    }
                    Some(e) => e,
                    None => end.status,
                };
                return Err(StepError::Failed {
                    exit_code: end.exit_code,
                    reason,
                    tail: tail.text(),
                });
            }
        }
    }
    Err(StepError::Sandbox("the build sandbox went away".into()))
}

/// Copies the build context's files in through the sandbox's root (every lookup confined to
/// it; its symlinks are never followed).
fn copy_files(
    init_pid: i32,
    files: &[(PathBuf, String)],
    owner: (u32, u32),
) -> Result<(), StepError> {
    let root = std::fs::File::open(format!("/proc/{init_pid}/root"))
        .map_err(|e| StepError::Sandbox(format!("opening the build sandbox's root: {e}")))?;
    let base = host_base(init_pid).map_err(StepError::Sandbox)?;
    for (src, dest) in files {
        husk_runtime::transfer::copy_in(
            src,
            root.as_fd(),
            Path::new(dest),
            (base + owner.0, base + owner.1),
        )
        .map_err(|e| StepError::Failed {
            exit_code: 1,
            reason: format!("copying {} to {dest}", src.display()),
            tail: e.to_string(),
        })?;
    }
    Ok(())
}

/// The host uid that sandbox uid 0 of the sandbox with PID 1 `pid` maps to.
fn host_base(pid: i32) -> Result<u32, String> {
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map"))
        .map_err(|e| format!("reading the sandbox's uid map: {e}"))?;
    map.split_whitespace()
        .nth(1)
        .and_then(|b| b.parse().ok())
        .ok_or_else(|| format!("unexpected uid map {map:?}"))
}

/// Turns the step's upper directory into a layer: owners back to image ids (the runtime gave
/// the directory to the sandbox's root, so its owner is the sandbox's base id), and the mount
/// point of the CA bundle removed.
fn finish_upper(upper: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let base = std::fs::symlink_metadata(upper)?.uid();
    let ca = upper.join(BUILD_CA_PATH.trim_start_matches('/'));
    if std::fs::symlink_metadata(&ca).is_ok_and(|m| m.is_file() && m.len() == 0) {
        std::fs::remove_file(&ca)?;
    }
    crate::layers::shift_ids(upper, base)?;
    Ok(())
}

/// The last lines of a step's output, bounded.
#[derive(Default)]
struct Tail {
    bytes: VecDeque<u8>,
}

impl Tail {
    fn push(&mut self, b: &[u8]) {
        self.bytes.extend(b.iter().copied());
        while self.bytes.len() > TAIL_BYTES {
            self.bytes.pop_front();
        }
    }

    fn text(&self) -> String {
        let all: Vec<u8> = self.bytes.iter().copied().collect();
        let text = String::from_utf8_lossy(&all);
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(TAIL_LINES);
        lines[from..].join("\n")
    }
}
