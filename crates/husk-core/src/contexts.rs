//! Code contexts: the stateful Jupyter kernels of one sandbox (E2B's code interpreter).
//!
//! A context is one kernel the agent runs inside the sandbox ([`husk_proto::KernelStart`]),
//! with a language, a working directory and an id clients name it by. Executions in a context
//! run one at a time (a second waits for the first); each is a task of its own
//! ([`exec`]) that keeps going when its client leaves: it interrupts the kernel and waits for
//! the kernel to finish, so the next execution finds the context idle and its state intact.
//!
//! Every sandbox has at most one *default* context per language: the one `/execute` uses when
//! the client names no context. The template's `contexts` start with the sandbox; other
//! languages' defaults start on first use. Restart replaces the kernel (same context id, state
//! gone); a kernel that dies stays dead until restarted, and executions say so.
//!
//! Nothing here knows HTTP or E2B's JSON: the server's code-interpreter adapter maps it.

mod envcode;
mod exec;
mod kernel;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use husk_proto::{KernelSpec, KernelStart, Reply, Request, User};

use crate::agent::{AgentClient, CallError};

pub use envcode::assign as envcode_assign;
pub use exec::{ExecOut, MimeValue};
use kernel::Kernel;

/// Contexts per sandbox (each is a kernel process: tens of MB).
pub const MAX_CONTEXTS: usize = 16;
/// Largest code of one execution (and of its env set-up code): it travels to the agent in
/// one frame of the agent protocol, with room to spare for the rest of the message.
pub const MAX_CODE_BYTES: usize = husk_proto::CHUNK - (16 << 10);

/// How long a kernel may take to start (import its libraries, bind its ports).
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Errors of context operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ContextError {
    #[error("context {0} not found")]
    NotFound(String),
    /// A bad request: unknown language, bad cwd, bad env var.
    #[error("{0}")]
    Invalid(String),
    /// Too many contexts.
    #[error("{0}")]
    Exhausted(String),
    /// The kernel did not start, or died.
    #[error("{0}")]
    Kernel(String),
    #[error("the sandbox is gone")]
    Gone,
}

impl From<CallError> for ContextError {
    fn from(e: CallError) -> Self {
        match e {
            CallError::Gone => ContextError::Gone,
            CallError::Agent(a) => match a.kind {
                husk_proto::ErrorKind::NotFound | husk_proto::ErrorKind::InvalidArgument => {
                    ContextError::Invalid(a.message)
                }
                husk_proto::ErrorKind::ResourceExhausted => ContextError::Exhausted(a.message),
                _ => ContextError::Kernel(a.message),
            },
        }
    }
}

/// What the sandbox's kernels get besides their own settings.
#[derive(Clone)]
pub struct KernelEnv {
    pub user: User,
    /// Resolved secrets of the sandbox's environment (`husk-secret://` values), for the
    /// kernel's process only.
    pub secret_envs: Vec<(String, String)>,
    /// Their values, masked in everything the kernel's executions report (empty: redaction
    /// is off, `HUSK_REDACT=0`).
    pub redact: Arc<Vec<zeroize::Zeroizing<Vec<u8>>>>,
}

/// One context, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextInfo {
    pub id: String,
    pub language: String,
    pub cwd: String,
}

/// One context.
pub struct Context {
    pub id: String,
    pub language: String,
    /// Where its kernel runs (absolute, as the client gave it or the default).
    pub cwd: String,
    spec: String,
    /// What its kernel process gets (kept for restarts).
    env: KernelEnv,
    envs: Vec<(String, String)>,
    /// The current kernel; replaced on restart.
    kernel: Mutex<Arc<Kernel>>,
    /// Held by an execution from start to end (one at a time), and by a restart while it
    /// replaces the kernel (after stopping the old one, which ends a running execution).
    exec_lock: Arc<tokio::sync::Mutex<()>>,
    /// Made for one run, with the run's own environment and secrets: not kept through a
    /// restart of the server (the run ends with it).
    for_run: bool,
}

/// A context as a restarted server takes it up again (see `manager::kept`): its kernel is
/// still running in the agent.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeptContext {
    pub id: String,
    pub language: String,
    pub cwd: String,
    /// Its kernel spec's name.
    pub spec: String,
    /// The agent's id of its kernel.
    pub kernel: u32,
    /// The default context of its language.
    pub default: bool,
}

impl Context {
    fn kernel(&self) -> Arc<Kernel> {
        self.kernel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn info(&self) -> ContextInfo {
        ContextInfo {
            id: self.id.clone(),
            language: self.language.clone(),
            cwd: self.cwd.clone(),
        }
    }
}

#[derive(Default)]
struct Table {
    contexts: HashMap<String, Arc<Context>>,
    /// Language → id of its default context.
    defaults: HashMap<String, String>,
}

/// The contexts of one sandbox.
pub struct Contexts {
    agent: AgentClient,
    env: KernelEnv,
    /// Working directory of contexts that name none.
    default_cwd: String,
    specs: tokio::sync::OnceCell<Vec<KernelSpec>>,
    table: Mutex<Table>,
    /// Creating a default context is serialised, so two first calls do not start two.
    default_lock: tokio::sync::Mutex<()>,
    next_kernel: Arc<std::sync::atomic::AtomicU32>,
    /// Told of every context made, removed or restarted (what a restarted server needs to
    /// know changed).
    changed: Arc<tokio::sync::Notify>,
}

/// The language names clients use, normalised: E2B's SDKs send `python`, `js`/`javascript`,
/// `ts`/`typescript` (JavaScript kernel), `bash`, `r`, `java`.
pub fn normalize_language(lang: &str) -> String {
    let l = shown(lang.trim()).to_ascii_lowercase();
    match l.as_str() {
        "py" | "python3" | "ipython" => "python".into(),
        "js" | "ts" | "typescript" | "node" | "nodejs" | "deno" => "javascript".into(),
        "sh" | "shell" => "bash".into(),
        _ => l,
    }
}

/// A client's string as error messages quote it: at most 64 characters (they are echoed
/// back, and a request body may hold megabytes).
fn shown(s: &str) -> String {
    match s.char_indices().nth(64) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

fn lock(m: &Mutex<Table>) -> std::sync::MutexGuard<'_, Table> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn new_context_id() -> Result<String, ContextError> {
    // UUID-shaped like Jupyter's kernel ids, which E2B uses as context ids.
    crate::ids::random_uuid().map_err(|e| ContextError::Kernel(format!("random id: {e}")))
}

impl Contexts {
    pub fn new(agent: AgentClient, env: KernelEnv, default_cwd: String) -> Contexts {
        Contexts {
            agent,
            env,
            default_cwd,
            specs: tokio::sync::OnceCell::new(),
            table: Mutex::new(Table::default()),
            default_lock: tokio::sync::Mutex::new(()),
            next_kernel: Arc::new(std::sync::atomic::AtomicU32::new(1)),
            changed: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Notified whenever a context is made, removed or restarted.
    pub fn changed(&self) -> Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    /// The contexts a restarted server takes up (not runs'), and the next kernel id.
    pub fn kept(&self) -> (Vec<KeptContext>, u32) {
        let t = lock(&self.table);
        let mut v: Vec<KeptContext> = t
            .contexts
            .values()
            .filter(|c| !c.for_run)
            .map(|c| KeptContext {
                id: c.id.clone(),
                language: c.language.clone(),
                cwd: c.cwd.clone(),
                spec: c.spec.clone(),
                kernel: c.kernel().id,
                default: t.defaults.get(&c.language) == Some(&c.id),
            })
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        (
            v,
            self.next_kernel.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// The contexts of a sandbox taken up again by a restarted server: each subscribed to its
    /// kernel, which still runs in the agent. A context whose kernel is gone is left out
    /// (its id then answers not found); returns those ids too.
    pub async fn restore(
        agent: AgentClient,
        env: KernelEnv,
        default_cwd: String,
        kept: Vec<KeptContext>,
        next_kernel: u32,
    ) -> (Contexts, Vec<String>) {
        let contexts = Contexts::new(agent, env, default_cwd);
        let highest = kept.iter().map(|k| k.kernel + 1).max().unwrap_or(1);
        contexts.next_kernel.store(
            next_kernel.max(highest),
            std::sync::atomic::Ordering::Relaxed,
        );
        let mut gone = Vec::new();
        for k in kept.into_iter().take(MAX_CONTEXTS) {
            let stream = match contexts.agent.kernel_attach(k.kernel).await {
                Ok(s) => s,
                Err(_) => {
                    gone.push(k.id);
                    continue;
                }
            };
            let kernel = Kernel::spawn_ready(k.kernel, contexts.agent.clone(), stream);
            let ctx = Arc::new(Context {
                id: k.id.clone(),
                language: k.language.clone(),
                cwd: k.cwd,
                spec: k.spec,
                env: contexts.env.clone(),
                envs: Vec::new(),
                kernel: Mutex::new(kernel),
                exec_lock: Arc::new(tokio::sync::Mutex::new(())),
                for_run: false,
            });
            let mut t = lock(&contexts.table);
            if k.default {
                t.defaults.insert(k.language, k.id.clone());
            }
            t.contexts.insert(k.id, ctx);
        }
        (contexts, gone)
    }

    /// The contexts of a warm sandbox handed to the create that claimed it: the same running
    /// kernels, under new context ids, now with the claimer's `env` (its secrets, their
    /// redaction, and what a restart gets). `vars` (the create's variables, its secrets'
    /// values over them) are set in each kernel first, by silent code that leaves nothing in
    /// its namespace and does not move its execution count; `Invalid` if a kernel's language
    /// has no such code.
    pub async fn claimed(
        &self,
        env: KernelEnv,
        vars: &[(String, String)],
    ) -> Result<Contexts, ContextError> {
        let taken: Vec<(Arc<Context>, bool)> = {
            let t = lock(&self.table);
            t.contexts
                .values()
                .map(|c| (c.clone(), t.defaults.get(&c.language) == Some(&c.id)))
                .collect()
        };
        if !vars.is_empty() {
            for (ctx, _) in &taken {
                let code = envcode::assign(&ctx.language, vars).ok_or_else(|| {
                    ContextError::Invalid(format!(
                        "a warm {} kernel cannot be given environment variables",
                        ctx.language
                    ))
                })?;
                if code.len() > MAX_CODE_BYTES {
                    return Err(ContextError::Invalid(
                        "the environment is too large to set in a warm kernel".into(),
                    ));
                }
                if let Err(e) = exec::silent(&ctx.kernel(), &code).await {
                    // Only the kind: the code held the variables' (and secrets') values.
                    let why = match e {
                        ExecOut::KernelDied(_) => "the kernel died",
                        ExecOut::SandboxGone => "the sandbox is gone",
                        _ => "the kernel reported an error",
                    };
                    return Err(ContextError::Kernel(format!(
                        "setting the environment of the warm {} kernel failed: {why}",
                        ctx.language
                    )));
                }
            }
        }
        let claimed = Contexts::new(self.agent.clone(), env, self.default_cwd.clone());
        if let Some(specs) = self.specs.get() {
            let _ = claimed.specs.set(specs.clone());
        }
        claimed.next_kernel.store(
            self.next_kernel.load(std::sync::atomic::Ordering::Relaxed),
            std::sync::atomic::Ordering::Relaxed,
        );
        for (ctx, default) in taken {
            let id = new_context_id()?;
            let moved = Arc::new(Context {
                id: id.clone(),
                language: ctx.language.clone(),
                cwd: ctx.cwd.clone(),
                spec: ctx.spec.clone(),
                env: claimed.env.clone(),
                envs: ctx.envs.clone(),
                kernel: Mutex::new(ctx.kernel()),
                exec_lock: Arc::new(tokio::sync::Mutex::new(())),
                for_run: false,
            });
            let mut t = lock(&claimed.table);
            if default {
                t.defaults.insert(ctx.language.clone(), id.clone());
            }
            t.contexts.insert(id, moved);
        }
        Ok(claimed)
    }

    /// The kernel specs of the sandbox's image (asked once).
    pub async fn specs(&self) -> Result<&[KernelSpec], ContextError> {
        let specs = self
            .specs
            .get_or_try_init(|| async {
                match self.agent.call(Request::KernelSpecs).await? {
                    Reply::KernelSpecs(s) => Ok::<_, ContextError>(s),
                    _ => Err(ContextError::Gone),
                }
            })
            .await?;
        Ok(specs)
    }

    /// The languages this sandbox has kernels for.
    pub async fn languages(&self) -> Result<Vec<String>, ContextError> {
        let mut langs: Vec<String> = self
            .specs()
            .await?
            .iter()
            .map(|s| normalize_language(&s.language))
            .collect();
        langs.sort();
        langs.dedup();
        Ok(langs)
    }

    /// The spec to launch for `language` (normalised): the one named like the language's
    /// usual kernel (`python3` for Python), else the first of that language.
    async fn spec_for(&self, language: &str) -> Result<String, ContextError> {
        let specs = self.specs().await?;
        let of_lang: Vec<&KernelSpec> = specs
            .iter()
            .filter(|s| normalize_language(&s.language) == language)
            .collect();
        let preferred = match language {
            "python" => "python3",
            other => other,
        };
        if let Some(s) = of_lang.iter().find(|s| s.name == preferred) {
            return Ok(s.name.clone());
        }
        if let Some(s) = of_lang.first() {
            return Ok(s.name.clone());
        }
        let have = self.languages().await?;
        Err(ContextError::Invalid(if have.is_empty() {
            format!(
                "no kernel for language '{language}': this sandbox's template has no Jupyter \
                 kernels (use the code-interpreter template)"
            )
        } else {
            format!(
                "no kernel for language '{language}' in this sandbox (it has: {})",
                have.join(", ")
            )
        }))
    }

    async fn start_kernel(
        &self,
        spec: &str,
        cwd: &str,
        env: &KernelEnv,
        envs: &[(String, String)],
    ) -> Result<Arc<Kernel>, ContextError> {
        start_kernel(&self.agent, &self.next_kernel, spec, cwd, env, envs).await
    }

    /// What starts a fresh kernel for `ctx` in its place when its kernel was killed for not
    /// stopping when interrupted (see `exec`): the same spec, cwd and environment.
    fn restarter(&self, ctx: &Context) -> exec::Restart {
        let agent = self.agent.clone();
        let next = self.next_kernel.clone();
        let (spec, cwd, env, envs) = (
            ctx.spec.clone(),
            ctx.cwd.clone(),
            ctx.env.clone(),
            ctx.envs.clone(),
        );
        Box::new(move || {
            Box::pin(async move { start_kernel(&agent, &next, &spec, &cwd, &env, &envs).await })
        })
    }

    /// Creates a context and waits for its kernel. `language` defaults to Python; `cwd` to
    /// the sandbox's working directory.
    pub async fn create(
        &self,
        language: Option<&str>,
        cwd: Option<&str>,
    ) -> Result<Arc<Context>, ContextError> {
        self.create_inner(language, cwd, false, None).await
    }

    /// Like [`Contexts::create`], for one run: its kernel process gets `envs` over the
    /// sandbox's environment, as `user`, with the run's resolved secrets (instead of the
    /// sandbox's), whose values `redact` masks in its output.
    pub async fn create_for_run(
        &self,
        language: &str,
        cwd: Option<&str>,
        user: User,
        envs: Vec<(String, String)>,
        secret_envs: Vec<(String, String)>,
        redact: Vec<zeroize::Zeroizing<Vec<u8>>>,
    ) -> Result<Arc<Context>, ContextError> {
        let env = KernelEnv {
            user,
            secret_envs,
            redact: Arc::new(redact),
        };
        self.create_inner(Some(language), cwd, false, Some((env, envs)))
            .await
    }

    async fn create_inner(
        &self,
        language: Option<&str>,
        cwd: Option<&str>,
        default: bool,
        own: Option<(KernelEnv, Vec<(String, String)>)>,
    ) -> Result<Arc<Context>, ContextError> {
        let language = normalize_language(language.unwrap_or("python"));
        let cwd = match cwd {
            Some(c) if !c.trim().is_empty() => {
                if c.contains('\0') || c.len() > 4096 {
                    return Err(ContextError::Invalid(format!("invalid cwd {c:?}")));
                }
                c.to_owned()
            }
            _ => self.default_cwd.clone(),
        };
        if lock(&self.table).contexts.len() >= MAX_CONTEXTS {
            return Err(ContextError::Exhausted(format!(
                "this sandbox has {MAX_CONTEXTS} contexts, the most it may; remove one first"
            )));
        }
        let spec = self.spec_for(&language).await?;
        let for_run = own.is_some();
        let (env, envs) = own.unwrap_or_else(|| (self.env.clone(), Vec::new()));
        let kernel = self.start_kernel(&spec, &cwd, &env, &envs).await?;
        let ctx = Arc::new(Context {
            id: new_context_id()?,
            language: language.clone(),
            cwd,
            spec,
            env,
            envs,
            kernel: Mutex::new(kernel.clone()),
            exec_lock: Arc::new(tokio::sync::Mutex::new(())),
            for_run,
        });
        let full = {
            let mut t = lock(&self.table);
            let full = t.contexts.len() >= MAX_CONTEXTS;
            if !full {
                t.contexts.insert(ctx.id.clone(), ctx.clone());
                if default {
                    t.defaults.insert(language, ctx.id.clone());
                }
            }
            full
        };
        if full {
            kernel.stop().await;
            return Err(ContextError::Exhausted(format!(
                "this sandbox has {MAX_CONTEXTS} contexts, the most it may; remove one first"
            )));
        }
        self.changed.notify_one();
        Ok(ctx)
    }

    /// The default context of `language`, started if there is none yet.
    pub async fn default_for(&self, language: &str) -> Result<Arc<Context>, ContextError> {
        let language = normalize_language(language);
        let find = |t: &Table| {
            t.defaults
                .get(&language)
                .and_then(|id| t.contexts.get(id))
                .cloned()
        };
        if let Some(c) = find(&lock(&self.table)) {
            return Ok(c);
        }
        let _one = self.default_lock.lock().await;
        if let Some(c) = find(&lock(&self.table)) {
            return Ok(c);
        }
        self.create_inner(Some(&language), None, true, None).await
    }

    /// A context by id.
    pub fn get(&self, id: &str) -> Result<Arc<Context>, ContextError> {
        lock(&self.table)
            .contexts
            .get(id)
            .cloned()
            .ok_or_else(|| ContextError::NotFound(shown(id)))
    }

    /// Every context, the per-language defaults running (the template's, or started by a
    /// first use) included, as E2B lists its default contexts; by id.
    pub fn list(&self) -> Vec<ContextInfo> {
        let t = lock(&self.table);
        let mut v: Vec<ContextInfo> = t.contexts.values().map(|c| c.info()).collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Removes a context and stops its kernel (a running execution ends with the kernel).
    pub async fn remove(&self, id: &str) -> Result<(), ContextError> {
        let ctx = {
            let mut t = lock(&self.table);
            let ctx = t
                .contexts
                .remove(id)
                .ok_or_else(|| ContextError::NotFound(shown(id)))?;
            t.defaults.retain(|_, d| d != id);
            ctx
        };
        ctx.kernel().stop().await;
        self.changed.notify_one();
        Ok(())
    }

    /// Replaces a context's kernel with a fresh one (its state is gone). A running execution
    /// ends with the old kernel.
    pub async fn restart(&self, id: &str) -> Result<(), ContextError> {
        let ctx = self.get(id)?;
        // Stopped first: a running execution (maybe the reason for the restart) then ends,
        // and its lock is free.
        ctx.kernel().stop().await;
        let _exec = ctx.exec_lock.lock().await;
        let fresh = self
            .start_kernel(&ctx.spec, &ctx.cwd, &ctx.env, &ctx.envs)
            .await?;
        *ctx.kernel.lock().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.changed.notify_one();
        Ok(())
    }

    /// Runs `code` in `ctx` with `env_vars` set for this execution only. The events come on
    /// the returned channel, ending with [`ExecOut::End`]; dropping the receiver interrupts
    /// the execution (the context stays usable).
    pub async fn execute(
        &self,
        ctx: Arc<Context>,
        code: String,
        env_vars: Vec<(String, String)>,
    ) -> Result<tokio::sync::mpsc::Receiver<ExecOut>, ContextError> {
        crate::manager::EnvVars::check(&env_vars)
            .map_err(|e| ContextError::Invalid(e.to_string()))?;
        let envcode = if env_vars.is_empty() {
            None
        } else {
            Some(
                envcode::for_language(&ctx.language, &env_vars).ok_or_else(|| {
                    ContextError::Invalid(format!(
                        "per-call env_vars are not supported for {} contexts",
                        ctx.language
                    ))
                })?,
            )
        };
        let longest = envcode
            .as_ref()
            .map_or(0, |c| c.set.len().max(c.restore.len()))
            .max(code.len());
        if longest > MAX_CODE_BYTES {
            return Err(ContextError::Invalid(format!(
                "the code (or its env_vars) takes {longest} bytes, more than the limit of \
                 {MAX_CODE_BYTES}: put large inputs in a file"
            )));
        }
        let restart = self.restarter(&ctx);
        Ok(exec::start(ctx, code, envcode, restart))
    }
}

/// Starts kernel `spec` for a context and waits until it is ready.
async fn start_kernel(
    agent: &AgentClient,
    next_kernel: &std::sync::atomic::AtomicU32,
    spec: &str,
    cwd: &str,
    env: &KernelEnv,
    envs: &[(String, String)],
) -> Result<Arc<Kernel>, ContextError> {
    let id = next_kernel.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let start = KernelStart {
        kernel: id,
        spec: spec.to_owned(),
        cwd: Some(cwd.to_owned()),
        user: env.user,
        envs: envs.to_vec(),
        secret_envs: env.secret_envs.clone(),
    };
    let stream = agent.kernel_start(start).await?;
    let kernel = Kernel::spawn(id, agent.clone(), stream);
    kernel.wait_ready(START_TIMEOUT).await?;
    Ok(kernel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn languages_are_normalised_and_bounded() {
        for (given, want) in [
            ("Python", "python"),
            ("python3", "python"),
            ("js", "javascript"),
            ("TypeScript", "javascript"),
            (" bash ", "bash"),
            ("sh", "bash"),
            ("r", "r"),
        ] {
            assert_eq!(normalize_language(given), want, "{given}");
        }
        let long = "x".repeat(10_000);
        assert!(normalize_language(&long).chars().count() <= 65);
        // Multi-byte characters are cut on a character boundary.
        let id = "é".repeat(1000);
        assert_eq!(
            shown(&id).chars().count(),
            65,
            "64 characters and an ellipsis"
        );
        assert_eq!(shown("short"), "short");
    }
}
