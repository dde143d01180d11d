//! What a client asks a run to do ([`RunSpec`], the JSON of `POST /husk/v1/runs`), and its
//! validation into a [`Plan`]: every mistake is found here, before any sandbox exists, and
//! named in the error.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use husk_proto::User;
use husk_runtime::Limits;
use serde::{Deserialize, Serialize};

use super::RunError;
use crate::manager::{check_mount_path, WorkspaceMount};
use crate::secrets::SECRET_PREFIX;

/// Longest run a client may ask for when the server says nothing else.
pub const DEFAULT_RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Most inline files of one run, and their total decoded size (the `code` of a code run
/// counts too). The request that carries them is held in the server's memory whole: large
/// inputs belong in a workspace.
pub const MAX_INLINE_FILES: usize = 1000;
pub const MAX_INLINE_BYTES: usize = 8 << 20;

/// Longest argument of a command (the kernel's own bound, `MAX_ARG_STRLEN`: exec refuses a
/// longer one) and most bytes of a command's arguments together. The command is kept in the
/// run's record.
pub const MAX_ARG_BYTES: usize = 128 << 10;
pub const MAX_ARGV_BYTES: usize = 256 << 10;

/// Most output paths of one run.
pub const MAX_OUTPUTS: usize = 64;

/// The name of the manifest written beside a run's outputs (so no output may have it).
pub const MANIFEST_FILE: &str = "husk-manifest.json";

/// Refuses an argument or a whole command over the kernel's bounds (see [`MAX_ARGV_BYTES`]).
fn check_argv(argv: &[String]) -> Result<(), RunError> {
    if let Some(a) = argv.iter().find(|a| a.len() >= MAX_ARG_BYTES) {
        return Err(RunError::TooLarge(format!(
            "an argument of the command takes {} bytes; the limit is {} (the kernel's); \
             put long inputs in a file",
            a.len(),
            MAX_ARG_BYTES - 1
        )));
    }
    let total: usize = argv.iter().map(|a| a.len() + 1).sum();
    if total > MAX_ARGV_BYTES {
        return Err(RunError::TooLarge(format!(
            "the command's arguments take {total} bytes, more than the limit of \
             {MAX_ARGV_BYTES}; put long inputs in a file"
        )));
    }
    Ok(())
}

/// A one-shot run, as the client sends it. Exactly one of `command`, `shell` and `code`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    /// Template name [default: `base`].
    #[serde(default)]
    pub template: Option<String>,
    /// The program and its arguments, executed directly (no shell).
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// A command line for `/bin/sh -c`.
    #[serde(default)]
    pub shell: Option<String>,
    /// Source code to run with `language`'s interpreter.
    #[serde(default)]
    pub code: Option<String>,
    /// `python` (the default), `javascript`/`node`, `bash` or `sh`.
    #[serde(default)]
    pub language: Option<String>,
    /// Files written into the sandbox before the command starts.
    #[serde(default)]
    pub files: Vec<InlineFile>,
    /// The team's workspaces to mount (read-only unless `mode` is `rw`).
    #[serde(default)]
    pub workspaces: Vec<RunWorkspace>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Secrets of the team, each given to the command as the environment variable of the same
    /// name (`env` can also name one: `"VAR": "husk-secret://NAME"`).
    #[serde(default)]
    pub secrets: Vec<String>,
    #[serde(default)]
    pub limits: RunLimits,
    /// Seconds the command may run [default: 300]; the sandbox is destroyed after it.
    #[serde(default)]
    pub timeout: Option<f64>,
    /// `user` or `root` [default: the template's, else `user`].
    #[serde(default)]
    pub user: Option<String>,
    /// Working directory [default: the template's, else the user's home].
    #[serde(default)]
    pub workdir: Option<String>,
    /// Sandbox paths (files or directories) copied into a workspace when the command ends.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// Where outputs go [default: the first workspace mounted].
    #[serde(default)]
    pub output_workspace: Option<String>,
    #[serde(default)]
    pub output_limit: OutputLimit,
    /// Mask secret values in the streamed output [default: true].
    #[serde(default)]
    pub redact: Option<bool>,
    /// Egress, as `husk run --net` takes it: `none`, `internet`, `allow=LIST`, `deny=LIST`
    /// (LIST: CIDRs and domains, comma-separated). Empty: the server's default.
    #[serde(default)]
    pub net: Vec<String>,
}

/// A file written into the sandbox before the run starts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InlineFile {
    /// Absolute, or relative to the run's working directory.
    pub path: String,
    pub content: String,
    /// `utf8` (the default) or `base64`.
    #[serde(default)]
    pub encoding: Option<String>,
}

/// A workspace mounted into the run's sandbox.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RunWorkspace {
    pub name: String,
    /// Where [default: `/workspace/<name>`].
    #[serde(default)]
    pub path: Option<String>,
    /// `ro` (the default) or `rw`.
    #[serde(default)]
    pub mode: Option<String>,
}

/// Resources of the run's sandbox; each at most the server's, which is also the default.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLimits {
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub disk_mb: Option<u64>,
    #[serde(default)]
    pub pids: Option<u64>,
}

/// Bounds of the outputs copied out of one run.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputLimit {
    /// Total bytes [default: 1 GiB].
    #[serde(default)]
    pub bytes: Option<u64>,
    /// Entries (files, directories, skipped entries) [default: 10 000].
    #[serde(default)]
    pub files: Option<u64>,
}

/// A validated run.
#[derive(Debug, Clone)]
pub struct Plan {
    pub template: String,
    /// What the record shows as the command.
    pub argv: Vec<String>,
    /// Source code to write before starting (`(path, code)`), for `code` runs without a
    /// kernel for their language.
    pub code_file: Option<(String, Vec<u8>)>,
    /// `code` runs: the language (normalised) and the code, run in the template's Jupyter
    /// kernel for that language when it has one (else as `code_file` with `argv`).
    pub code: Option<(String, String)>,
    pub files: Vec<(String, Vec<u8>)>,
    pub workspaces: Vec<WorkspaceMount>,
    /// The process's environment, secrets as `husk-secret://NAME` references.
    pub env: Vec<(String, String)>,
    /// Secret names the run asked for (by `secrets` or by reference in `env`).
    pub secrets: Vec<String>,
    pub limits: Option<Limits>,
    pub timeout: Duration,
    pub user: Option<User>,
    pub workdir: Option<String>,
    pub outputs: Vec<String>,
    pub output_workspace: Option<String>,
    pub output_limits: husk_runtime::transfer::OutputLimits,
    pub redact: bool,
    /// `None`: the server's default.
    pub network: Option<husk_net::NetPolicy>,
}

/// The kernel language of a code run's interpreter.
fn interp_language(interp: &str) -> &'static str {
    match interp {
        "python3" => "python",
        "node" => "javascript",
        _ => "bash",
    }
}

fn invalid(msg: impl Into<String>) -> RunError {
    RunError::Invalid(msg.into())
}

/// A sandbox path in a request: absolute, or relative to `workdir` (the sandbox resolves
/// relative ones against the user's home when there is none). No NUL; bounded.
fn sandbox_path(what: &str, p: &str) -> Result<(), RunError> {
    if p.is_empty() || p.len() > 4096 || p.contains('\0') {
        return Err(invalid(format!("invalid {what} path {p:?}")));
    }
    Ok(())
}

/// The last component of an absolute, normalised output path.
fn output_name(p: &str) -> Result<String, RunError> {
    if !p.starts_with('/') {
        return Err(invalid(format!("output path {p:?} must be absolute")));
    }
    let comps: Vec<&str> = p.split('/').filter(|c| !c.is_empty()).collect();
    if comps.iter().any(|c| *c == "." || *c == "..") {
        return Err(invalid(format!("output path {p:?} has '.' or '..' in it")));
    }
    match comps.last() {
        None => Err(invalid(
            "the output path '/' is the whole sandbox; name a directory",
        )),
        Some(name) => Ok((*name).to_owned()),
    }
}

impl RunSpec {
    /// About how many bytes the spec holds in memory: its strings (files, command, code,
    /// environment), which are all that can be large.
    pub fn approx_bytes(&self) -> usize {
        let files: usize = self
            .files
            .iter()
            .map(|f| f.path.len() + f.content.len())
            .sum();
        let argv: usize = self.command.iter().flatten().map(String::len).sum();
        let env: usize = self.env.iter().map(|(k, v)| k.len() + v.len()).sum();
        files
            + argv
            + env
            + self.shell.as_ref().map_or(0, String::len)
            + self.code.as_ref().map_or(0, String::len)
    }

    /// Checks everything that can be checked without the team's state (secrets and
    /// workspaces are checked against it when the run starts), phase by phase.
    pub fn plan(&self, max_timeout: Duration) -> Result<Plan, RunError> {
        let user = self.user()?;
        if let Some(w) = &self.workdir {
            sandbox_path("workdir", w)?;
        }
        let Program {
            argv,
            code_file,
            kernel_code,
        } = self.program()?;
        let files = self.inline_files(code_file.as_ref().map_or(0, |(_, c)| c.len()))?;
        let workspaces = self.workspace_mounts()?;
        let (env, secrets) = self.environment()?;
        let limits = self.limits.to_limits()?;
        let timeout = self.timeout(max_timeout)?;
        let output_workspace = self.outputs(&workspaces)?;
        Ok(Plan {
            template: self.template.clone().unwrap_or_else(|| "base".into()),
            argv,
            code_file,
            code: kernel_code,
            files,
            workspaces,
            env,
            secrets,
            limits,
            timeout,
            user,
            workdir: self.workdir.clone(),
            outputs: self.outputs.clone(),
            output_workspace,
            output_limits: self.output_limits(),
            redact: self.redact.unwrap_or(true),
            network: self.network()?,
        })
    }

    /// Whom the command runs as (`None`: the template's user).
    fn user(&self) -> Result<Option<User>, RunError> {
        match self.user.as_deref() {
            None => Ok(None),
            Some(name) => User::from_name(name)
                .map(Some)
                .ok_or_else(|| invalid(format!("unknown user {name:?}: use user or root"))),
        }
    }

    /// What runs: exactly one of an argv, a shell line or code (written to a file, and run by
    /// a kernel where the template has one).
    fn program(&self) -> Result<Program, RunError> {
        let given = [
            self.command.is_some(),
            self.shell.is_some(),
            self.code.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(invalid(
                "give exactly one of command (an argv list), shell (a command line) and code",
            ));
        }
        if self.language.is_some() && self.code.is_none() {
            return Err(invalid("language is only for code"));
        }
        let mut code_file = None;
        let mut kernel_code = None;
        let argv = if let Some(argv) = &self.command {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(invalid("command is empty"));
            }
            argv.clone()
        } else if let Some(line) = &self.shell {
            if line.trim().is_empty() {
                return Err(invalid("shell is empty"));
            }
            vec!["/bin/sh".into(), "-c".into(), line.clone()]
        } else {
            let code = self.code.clone().unwrap_or_default();
            let (interp, ext) = match self.language.as_deref().unwrap_or("python") {
                "python" | "python3" | "py" => ("python3", "py"),
                "javascript" | "js" | "node" => ("node", "js"),
                "bash" => ("bash", "sh"),
                "sh" => ("sh", "sh"),
                other => {
                    return Err(invalid(format!(
                        "unknown language {other:?}: use python, javascript, bash or sh"
                    )))
                }
            };
            let path = format!("/tmp/husk-run/main.{ext}");
            kernel_code = Some((
                crate::contexts::normalize_language(interp_language(interp)),
                code.clone(),
            ));
            code_file = Some((path.clone(), code.into_bytes()));
            vec![interp.into(), path]
        };
        if argv.iter().any(|a| a.contains('\0')) {
            return Err(invalid("the command has a NUL byte in it"));
        }
        check_argv(&argv)?;
        Ok(Program {
            argv,
            code_file,
            kernel_code,
        })
    }

    /// The inline files, decoded, within [`MAX_INLINE_BYTES`] together with the code's
    /// `code_bytes`.
    fn inline_files(&self, code_bytes: usize) -> Result<Vec<(String, Vec<u8>)>, RunError> {
        if self.files.len() > MAX_INLINE_FILES {
            return Err(invalid(format!("at most {MAX_INLINE_FILES} inline files")));
        }
        let mut files = Vec::new();
        let mut total = code_bytes;
        for f in &self.files {
            sandbox_path("file", &f.path)?;
            let bytes = match f.encoding.as_deref().unwrap_or("utf8") {
                "utf8" | "utf-8" | "text" => f.content.clone().into_bytes(),
                "base64" => base64::engine::general_purpose::STANDARD
                    .decode(f.content.as_bytes())
                    .map_err(|e| invalid(format!("file {:?}: bad base64: {e}", f.path)))?,
                other => {
                    return Err(invalid(format!(
                        "file {:?}: unknown encoding {other:?}: use utf8 or base64",
                        f.path
                    )))
                }
            };
            total += bytes.len();
            if total > MAX_INLINE_BYTES {
                return Err(RunError::TooLarge(format!(
                    "inline files (and code) take more than {} MiB; put large inputs in a \
                     workspace",
                    MAX_INLINE_BYTES >> 20
                )));
            }
            files.push((f.path.clone(), bytes));
        }
        Ok(files)
    }

    /// The workspaces to mount, each at its path (`/workspace/NAME` unless given).
    fn workspace_mounts(&self) -> Result<Vec<WorkspaceMount>, RunError> {
        let mut workspaces = Vec::new();
        for w in &self.workspaces {
            let path = w
                .path
                .clone()
                .unwrap_or_else(|| format!("/workspace/{}", w.name));
            check_mount_path(&path).map_err(RunError::Invalid)?;
            let writable = match w.mode.as_deref().unwrap_or("ro") {
                "ro" => false,
                "rw" => true,
                other => {
                    return Err(invalid(format!(
                        "workspace {:?}: unknown mode {other:?}: use ro or rw",
                        w.name
                    )))
                }
            };
            workspaces.push(WorkspaceMount {
                name: w.name.clone(),
                path,
                writable,
            });
        }
        Ok(workspaces)
    }

    /// The environment, with each named secret as a `husk-secret://` reference of its own
    /// name, and the secrets it references.
    fn environment(&self) -> Result<(Env, Vec<String>), RunError> {
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for name in &self.secrets {
            crate::secrets::validate_env_name(name).map_err(|e| invalid(e.to_string()))?;
            if self.env.contains_key(name) {
                return Err(invalid(format!(
                    "secret {name} would replace the env variable of the same name"
                )));
            }
            env.push((name.clone(), format!("{SECRET_PREFIX}{name}")));
        }
        crate::manager::EnvVars::check(&env).map_err(|e| invalid(e.to_string()))?;
        let mut secrets: Vec<String> = Vec::new();
        for (_, v) in &env {
            if let Some(name) = v.strip_prefix(SECRET_PREFIX) {
                if !secrets.iter().any(|s| s == name) {
                    secrets.push(name.to_owned());
                }
            }
        }
        Ok((env, secrets))
    }

    /// The run's timeout: its own, within the server's, or the default.
    fn timeout(&self, max_timeout: Duration) -> Result<Duration, RunError> {
        match self.timeout {
            None => Ok(DEFAULT_RUN_TIMEOUT.min(max_timeout)),
            Some(t) if t.is_finite() && t > 0.0 => {
                let t = Duration::try_from_secs_f64(t).unwrap_or(max_timeout);
                if t > max_timeout {
                    return Err(invalid(format!(
                        "timeout {} s is more than this server allows ({} s)",
                        t.as_secs(),
                        max_timeout.as_secs()
                    )));
                }
                Ok(t)
            }
            Some(t) => Err(invalid(format!("invalid timeout {t}: give seconds > 0"))),
        }
    }

    /// Checks the outputs (distinct names, not the manifest's) and says which workspace they
    /// go to: the named one, else the first mounted.
    fn outputs(&self, workspaces: &[WorkspaceMount]) -> Result<Option<String>, RunError> {
        if self.outputs.len() > MAX_OUTPUTS {
            return Err(invalid(format!("at most {MAX_OUTPUTS} outputs")));
        }
        let mut names: Vec<String> = Vec::new();
        for o in &self.outputs {
            sandbox_path("output", o)?;
            let name = output_name(o)?;
            if name == MANIFEST_FILE {
                return Err(invalid(format!(
                    "output {o:?}: the name {MANIFEST_FILE} is kept for the manifest"
                )));
            }
            if names.contains(&name) {
                return Err(invalid(format!(
                    "two outputs are named {name:?}: outputs are saved by their last path component"
                )));
            }
            names.push(name);
        }
        let output_workspace = match (&self.output_workspace, workspaces.first()) {
            (Some(w), _) => Some(w.clone()),
            (None, Some(first)) => Some(first.name.clone()),
            (None, None) => None,
        };
        if !self.outputs.is_empty() && output_workspace.is_none() {
            return Err(invalid(
                "outputs need a workspace to go to: mount one or name output_workspace",
            ));
        }
        Ok(output_workspace)
    }

    fn output_limits(&self) -> husk_runtime::transfer::OutputLimits {
        let mut limits = husk_runtime::transfer::OutputLimits::default();
        if let Some(b) = self.output_limit.bytes {
            limits.max_bytes = b;
        }
        if let Some(f) = self.output_limit.files {
            limits.max_files = f;
        }
        limits
    }

    /// The egress policy the run asked for (`None`: the server's default).
    fn network(&self) -> Result<Option<husk_net::NetPolicy>, RunError> {
        if self.net.is_empty() {
            return Ok(None);
        }
        husk_net::NetPolicy::from_flags(&self.net)
            .map(Some)
            .map_err(|e| invalid(e.to_string()))
    }
}

/// Environment variables, in order.
type Env = Vec<(String, String)>;

/// What a run executes.
struct Program {
    argv: Vec<String>,
    /// Code written into the sandbox before the run: (path, bytes).
    code_file: Option<(String, Vec<u8>)>,
    /// Code a kernel may run instead: (language, code).
    kernel_code: Option<(String, String)>,
}

impl RunLimits {
    /// The sandbox's limits, filled in with the server's defaults later (`None`: all defaults).
    fn to_limits(&self) -> Result<Option<Limits>, RunError> {
        if self.memory_mb.is_none()
            && self.cpus.is_none()
            && self.disk_mb.is_none()
            && self.pids.is_none()
        {
            return Ok(None);
        }
        let mut l = Limits {
            memory_bytes: 0,
            cpu_millis: 0,
            pids: 0,
            disk_bytes: 0,
        };
        l.memory_bytes = self.memory_mb.map(|m| m << 20).unwrap_or(0);
        l.disk_bytes = self.disk_mb.map(|m| m << 20).unwrap_or(0);
        l.pids = self.pids.unwrap_or(0);
        if let Some(c) = self.cpus {
            if !c.is_finite() || c < 0.01 {
                return Err(invalid(format!("invalid cpus {c}: give at least 0.01")));
            }
            l.cpu_millis = (c * 1000.0).round() as u64;
        }
        Ok(Some(l))
    }
}

/// Fills the zero fields of `req` with `server`'s.
pub fn fill_limits(req: &Limits, server: &Limits) -> Limits {
    let pick = |a: u64, b: u64| if a == 0 { b } else { a };
    Limits {
        memory_bytes: pick(req.memory_bytes, server.memory_bytes),
        cpu_millis: pick(req.cpu_millis, server.cpu_millis),
        pids: pick(req.pids, server.pids),
        disk_bytes: pick(req.disk_bytes, server.disk_bytes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Result<Plan, RunError> {
        let s: RunSpec = serde_json::from_value(json).map_err(|e| invalid(e.to_string()))?;
        s.plan(Duration::from_secs(3600))
    }

    fn err(json: serde_json::Value) -> String {
        spec(json).unwrap_err().to_string()
    }

    #[test]
    fn one_of_command_shell_code() {
        assert!(err(serde_json::json!({})).contains("exactly one"));
        assert!(err(serde_json::json!({"command": ["a"], "shell": "b"})).contains("exactly one"));
        assert!(err(serde_json::json!({"command": []})).contains("empty"));
        let p = spec(serde_json::json!({"shell": "echo hi"})).unwrap();
        assert_eq!(p.argv, vec!["/bin/sh", "-c", "echo hi"]);
        let p = spec(serde_json::json!({"code": "print(1)"})).unwrap();
        assert_eq!(p.argv, vec!["python3", "/tmp/husk-run/main.py"]);
        assert_eq!(p.code_file.unwrap().1, b"print(1)");
        assert!(err(serde_json::json!({"code": "x", "language": "cobol"})).contains("cobol"));
        assert!(err(serde_json::json!({"command": ["a"], "colour": 1})).contains("colour"));
    }

    #[test]
    fn secrets_become_references_and_are_listed() {
        let p = spec(serde_json::json!({
            "command": ["env"], "secrets": ["API_KEY"],
            "env": {"OTHER": "husk-secret://TOKEN", "PLAIN": "x"}
        }))
        .unwrap();
        assert!(p
            .env
            .contains(&("API_KEY".into(), "husk-secret://API_KEY".into())));
        assert_eq!(p.secrets, vec!["TOKEN".to_string(), "API_KEY".to_string()]);
        assert!(
            err(serde_json::json!({"command": ["a"], "secrets": ["bad-name"]}))
                .contains("bad-name")
        );
    }

    #[test]
    fn workspaces_outputs_and_limits() {
        let p = spec(serde_json::json!({
            "command": ["a"], "workspaces": [{"name": "data"}, {"name": "out", "path": "/o", "mode": "rw"}],
            "outputs": ["/home/user/out", "/tmp/r.csv"],
        }))
        .unwrap();
        assert_eq!(p.workspaces[0].path, "/workspace/data");
        assert!(!p.workspaces[0].writable && p.workspaces[1].writable);
        assert_eq!(p.output_workspace.as_deref(), Some("data"));
        assert!(
            err(serde_json::json!({"command": ["a"], "outputs": ["/x"]}))
                .contains("need a workspace")
        );
        assert!(err(
            serde_json::json!({"command": ["a"], "output_workspace": "w",
            "outputs": ["/a/x", "/b/x"]})
        )
        .contains("two outputs"));
        assert!(err(
            serde_json::json!({"command": ["a"], "output_workspace": "w",
            "outputs": ["/a/../x"]})
        )
        .contains(".."));
        assert!(err(
            serde_json::json!({"command": ["a"], "output_workspace": "w",
            "outputs": ["/"]})
        )
        .contains("whole sandbox"));
        assert!(err(serde_json::json!({"command": ["a"],
            "workspaces": [{"name": "d", "path": "/proc/x"}]}))
        .contains("/proc"));
        assert!(err(serde_json::json!({"command": ["a"],
            "workspaces": [{"name": "d", "mode": "wr"}]}))
        .contains("mode"));
        assert!(err(serde_json::json!({"command": ["a"], "timeout": 7200})).contains("allows"));
        assert!(err(serde_json::json!({"command": ["a"], "timeout": -1})).contains("timeout"));
        let huge = "v".repeat(300 << 10);
        assert!(
            err(serde_json::json!({"command": ["a"], "env": {"BIG": huge}}))
                .contains("more than the limit")
        );
        let p = spec(serde_json::json!({"command": ["a"], "limits": {"memory_mb": 64}})).unwrap();
        let full = fill_limits(&p.limits.unwrap(), &Limits::default());
        assert_eq!(full.memory_bytes, 64 << 20);
        assert_eq!(full.pids, Limits::default().pids);
    }

    #[test]
    fn inline_files_are_decoded_and_bounded() {
        let p = spec(serde_json::json!({"command": ["a"], "files": [
            {"path": "a.txt", "content": "hi"},
            {"path": "/b.bin", "content": "AAEC", "encoding": "base64"}
        ]}))
        .unwrap();
        assert_eq!(p.files[1].1, vec![0u8, 1, 2]);
        assert!(err(serde_json::json!({"command": ["a"], "files": [
            {"path": "a", "content": "!!", "encoding": "base64"}]}))
        .contains("base64"));
        assert!(err(serde_json::json!({"command": ["a"], "files": [
            {"path": "a\u{0}b", "content": ""}]}))
        .contains("invalid file path"));
        // The code of a code run counts with the files.
        let half = "x".repeat(MAX_INLINE_BYTES / 2 + 1);
        assert!(spec(serde_json::json!({"code": half})).is_ok());
        let e = spec(serde_json::json!({"code": half, "files": [{"path": "f", "content": half}]}))
            .unwrap_err();
        assert!(matches!(e, RunError::TooLarge(_)), "{e}");
    }

    /// Issue 15 M4: a run's command line is kept in its record, and exec refuses what the
    /// kernel's bounds refuse anyway: both are bounded before any sandbox exists.
    #[test]
    fn command_lines_are_bounded() {
        let long = "x".repeat(MAX_ARG_BYTES);
        let e = spec(serde_json::json!({"shell": long})).unwrap_err();
        assert!(matches!(e, RunError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains("put long inputs in a file"), "{e}");
        let e = spec(serde_json::json!({"command": ["echo", long]})).unwrap_err();
        assert!(matches!(e, RunError::TooLarge(_)), "{e}");
        // Many arguments each under the per-argument bound, over the total.
        let arg = "y".repeat(MAX_ARG_BYTES - 1);
        let argv: Vec<&str> = std::iter::repeat_n(arg.as_str(), 3).collect();
        let e = spec(serde_json::json!({"command": argv})).unwrap_err();
        assert!(e.to_string().contains("arguments take"), "{e}");
        // Just under both bounds is fine.
        let argv: Vec<&str> = std::iter::repeat_n(arg.as_str(), 1).collect();
        assert!(spec(serde_json::json!({"command": argv})).is_ok());
    }
}
