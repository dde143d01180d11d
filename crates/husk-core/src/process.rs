//! Starting and attaching to processes in a sandbox: the one place that resolves a team's
//! secrets into a process's environment, masks them in its output (also for whoever attaches
//! later), and records their use for the audit. The E2B adapter's `process.Process`, husk's
//! runs and the code contexts all start processes through here.

use zeroize::Zeroizing;

use crate::agent::{CallError, ProcStream};
use crate::calls::{ProcessSpec, Selector};
use crate::manager::{LiveSandbox, Manager};
use crate::secrets::{Injection, SecretError, REDACT_ENV, SECRET_PREFIX};

/// Why a process could not be started or attached to.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The environment names secrets, and this server has none.
    #[error("secrets are not enabled on this server")]
    SecretsDisabled,
    /// A named secret does not exist for the team, or cannot be used.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The agent refused the call, or the sandbox is gone.
    #[error(transparent)]
    Agent(#[from] CallError),
}

/// Most bytes of a command line kept in the audit record.
const MAX_AUDIT_COMMAND: usize = 512;

/// A process's secrets, resolved: their values for its environment and output masking, their
/// names for the audit.
#[derive(Default)]
pub struct ProcessSecrets {
    /// (variable, value): for the agent's `StartProc::secret_envs` only, never the request's
    /// `envs`.
    pub env: Vec<(String, String)>,
    /// Values to mask in the output (empty: nothing to mask, or masking turned off).
    pub redact: Vec<Zeroizing<Vec<u8>>>,
    pub names: Vec<String>,
}

impl From<Injection> for ProcessSecrets {
    fn from(i: Injection) -> ProcessSecrets {
        ProcessSecrets {
            env: i.env,
            redact: i.redact,
            names: i.names,
        }
    }
}

impl Manager {
    /// Resolves the `husk-secret://NAME` references of a process's environment `envs` (the
    /// sandbox's environment `sandbox_env` under it) into `team`'s secrets. `envs` keeps the
    /// references (what a process list shows) and loses `HUSK_REDACT`, which only switches
    /// masking off.
    pub fn resolve_secrets(
        &self,
        team: &str,
        sandbox_env: &[(String, String)],
        envs: &mut Vec<(String, String)>,
    ) -> Result<ProcessSecrets, ProcessError> {
        let named = envs
            .iter()
            .chain(sandbox_env.iter())
            .any(|(_, v)| v.starts_with(SECRET_PREFIX));
        if !named {
            envs.retain(|(k, _)| k != REDACT_ENV);
            return Ok(ProcessSecrets::default());
        }
        let secrets = self.secrets().ok_or(ProcessError::SecretsDisabled)?;
        Ok(secrets.inject(team, sandbox_env, envs)?.into())
    }

    /// [`Manager::resolve_secrets`] for a process of `sb`.
    pub fn process_secrets(
        &self,
        sb: &LiveSandbox,
        envs: &mut Vec<(String, String)>,
    ) -> Result<ProcessSecrets, ProcessError> {
        self.resolve_secrets(&sb.team, &sb.env, envs)
    }

    /// Records that `names` went into `command` in sandbox `sandbox` of `team` (nothing when
    /// `names` is empty).
    pub fn audit_secrets(&self, team: &str, sandbox: &str, command: &str, names: &[String]) {
        if names.is_empty() {
            return;
        }
        if let Some(s) = self.secrets() {
            s.record_use(team, sandbox, bounded(command), names);
        }
    }

    /// Starts `p` in `sb` with its secrets (see [`Manager::process_secrets`]): its output
    /// comes back masked, and stays masked for whoever attaches to it later.
    pub async fn start_process(
        &self,
        sb: &LiveSandbox,
        mut p: ProcessSpec,
    ) -> Result<(u32, ProcStream), ProcessError> {
        let secrets = self.process_secrets(sb, p.envs_mut())?;
        // The audit keeps the command line, never a value it was given (a command may name
        // one literally), whether or not the output is masked. Built only when there is
        // something to audit: most starts (every `commands.run` without secrets) have none.
        let command = (!secrets.names.is_empty()).then(|| masked(&command_line(&p), &secrets.env));
        let (pid, events) = sb.agent.start(p.into_start(secrets.env)).await?;
        if let Some(command) = command {
            self.audit_secrets(&sb.team, &sb.id, &command, &secrets.names);
        }
        if !secrets.redact.is_empty() {
            sb.set_redaction(pid, secrets.redact.clone(), secrets.names.clone());
        }
        Ok((pid, events.redacted(secrets.redact)))
    }

    /// Attaches to a running process of `sb`; its output is masked as it was for its starter.
    pub async fn attach_process(
        &self,
        sb: &LiveSandbox,
        sel: Selector,
    ) -> Result<(u32, ProcStream), ProcessError> {
        let (pid, events) = sb.agent.attach(sel).await?;
        Ok((pid, events.redacted(sb.redaction(pid))))
    }
}

/// The command and its arguments, as the audit shows them.
fn command_line(p: &ProcessSpec) -> String {
    std::iter::once(p.command())
        .chain(p.args().iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` with every value of `secrets` replaced by `****`, as output is masked.
fn masked(text: &str, secrets: &[(String, String)]) -> String {
    let values: Vec<zeroize::Zeroizing<Vec<u8>>> = secrets
        .iter()
        .map(|(_, v)| zeroize::Zeroizing::new(v.as_bytes().to_vec()))
        .collect();
    let redactor = crate::secrets::redact::Redactor::new(&values);
    String::from_utf8_lossy(&redactor.mask(text.as_bytes())).into_owned()
}

/// At most [`MAX_AUDIT_COMMAND`] bytes of `s`, cut at a character boundary.
fn bounded(s: &str) -> &str {
    if s.len() <= MAX_AUDIT_COMMAND {
        return s;
    }
    let mut end = MAX_AUDIT_COMMAND;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
