//! The builder: runs a [`BuildPlan`] into a registered template.
//!
//! Base layers first (mmdebstrap, an OCI image's layers, or another template's image), then
//! one cached layer per step, then husk's finalize layer; the merged stack becomes one erofs
//! image, which is registered under the template's name only once it is complete. A failed
//! build registers nothing and leaves no layer of the failed step behind.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use husk_core::store::{Store, TemplateRecord};
use husk_core::template::{self, LayerRecord, TemplateDefaults, TemplateManifest};
use husk_runtime::service::SpawnerService;
use husk_runtime::Limits;

use crate::accounts::{image_user, owner_ids, step_user};
use crate::layers::{KeyHasher, LayerCache};
use crate::plan::{Base, BuildPlan, Command, StepKind};
use crate::sandbox_step::{self, StepError, Work};
use crate::{finalize, oci, Progress, StepOutcome};

/// OCI config labels that carry husk's template settings through `husk template export`.
pub const LABEL_START_CMD: &str = "dev.husk.start_cmd";
pub const LABEL_READY_CMD: &str = "dev.husk.ready_cmd";
pub const LABEL_READY_TIMEOUT: &str = "dev.husk.ready_timeout";

/// Most layers one template may have (overlayfs lower layers and one page of mount options).
pub const MAX_LAYERS: usize = 96;

/// Errors of a build.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Plan(#[from] crate::plan::PlanError),
    #[error(
        "step {origin} failed ({reason}, exit code {exit_code}): {display}\n--- last lines of its output ---\n{tail}"
    )]
    StepFailed {
        origin: String,
        display: String,
        exit_code: i32,
        reason: String,
        tail: String,
    },
    #[error("step {origin} ({display}): {message}")]
    Step {
        origin: String,
        display: String,
        message: String,
    },
    #[error("base image: {0}")]
    Oci(#[from] oci::OciError),
    #[error("{0}")]
    Other(String),
    #[error(transparent)]
    Store(#[from] husk_core::store::StoreError),
}

fn other(what: &str) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |e| BuildError::Other(format!("{what}: {e}"))
}

/// Settings of builds.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub state_dir: PathBuf,
    /// The layer cache [default: `<state_dir>/templates/layers`]; several state directories
    /// may share one (layers are keyed by content).
    pub layers_dir: PathBuf,
    /// The runtime directory (where images are mounted).
    pub run_dir: PathBuf,
    /// Ignore cached layers (every step runs again).
    pub no_cache: bool,
    /// Resources of each build sandbox.
    pub limits: Limits,
    /// Longest a single step may run.
    pub step_timeout: Duration,
    pub registry: oci::RegistryOptions,
}

impl BuildOptions {
    pub fn new(state_dir: &Path) -> BuildOptions {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        BuildOptions {
            state_dir: state_dir.to_path_buf(),
            layers_dir: template::layers_dir(state_dir),
            run_dir: PathBuf::from(husk_runtime::spawner::DEFAULT_RUN_DIR),
            no_cache: false,
            limits: Limits {
                memory_bytes: 4 << 30,
                cpu_millis: cpus * 1000,
                pids: 4096,
                // Only the build sandbox's skeleton lives on its tmpfs (a size cap, not an
                // allocation); the layer is on disk. The same figure is every command's
                // RLIMIT_FSIZE, the largest file a step may write: package managers write big
                // ones (deno's binary is 96 MB, torch's libraries several hundred).
                disk_bytes: 64 << 30,
            },
            step_timeout: Duration::from_secs(3600),
            registry: oci::RegistryOptions::from_env(),
        }
    }
}

/// Builds templates.
pub struct Builder {
    pub spawner: Arc<SpawnerService>,
    pub store: Arc<Store>,
    pub opts: BuildOptions,
}

/// A layer of the stack being built.
struct Layer {
    dir: PathBuf,
    record: LayerRecord,
}

/// The state a build carries from step to step.
struct Stack {
    layers: Vec<Layer>,
    /// Key of the top layer (the parent of the next one).
    top_key: String,
    /// The base's sandbox defaults; their environment is also every step's starting one.
    defaults: TemplateDefaults,
    /// A base template's image, kept mounted while the build uses it.
    mounted: Option<husk_runtime::images::Mounted>,
}

impl Stack {
    /// Layer directories, top first.
    fn lower(&self) -> Vec<PathBuf> {
        self.layers.iter().rev().map(|l| l.dir.clone()).collect()
    }
}

impl Builder {
    /// Runs `plan` and registers the result as `name`.
    pub async fn build(
        &self,
        plan: &BuildPlan,
        name: &str,
        source: &str,
        progress: &dyn Progress,
    ) -> Result<TemplateRecord, BuildError> {
        let started = Instant::now();
        let cache = LayerCache::open(&self.opts.layers_dir).map_err(other("layer cache"))?;
        cache.remove_stale_temps();
        let total = plan.steps.len() + 2;
        let (mut stack, base_desc) = self.base(plan, &cache, total, progress).await?;
        for (i, step) in plan.steps.iter().enumerate() {
            let forced = plan.force_from.is_some_and(|f| i >= f);
            self.step(
                &cache,
                &mut stack,
                plan,
                step,
                i + 2,
                total,
                forced,
                progress,
            )
            .await?;
        }
        // husk's own last layer: the `user` account and home.
        let key = {
            let mut k = KeyHasher::new("finalize");
            k.str(&stack.top_key).str(finalize::FINALIZE_VERSION);
            k.finish()
        };
        progress.step_start(total, total, "finalize (user account, home)");
        let t = Instant::now();
        let cached = !self.opts.no_cache && cache.exists(&key);
        if !cached {
            let _ = cache.remove(&key);
            let tmp = cache.temp(&key).map_err(other("layer cache"))?;
            finalize::write_layer(&stack.lower(), tmp.path()).map_err(other("finalize layer"))?;
            cache
                .commit(&tmp.keep(), &key)
                .map_err(other("layer cache"))?;
        }
        progress.step_done(total, outcome(cached, t));
        push(&mut stack, &cache, key, "finalize", "husk");
        if stack.layers.len() > MAX_LAYERS {
            return Err(BuildError::Other(format!(
                "{} layers: at most {MAX_LAYERS} are supported; combine steps",
                stack.layers.len()
            )));
        }
        progress.message("writing the image");
        let image = crate::image::make(
            &self.opts.state_dir,
            &self.opts.run_dir,
            &cache,
            &stack.lower(),
            &stack.top_key,
            self.opts.no_cache,
        )
        .await
        .map_err(BuildError::Other)?;
        let mut defaults = stack.defaults.clone();
        merge_plan_defaults(&mut defaults, &plan.defaults);
        let manifest = TemplateManifest {
            defaults,
            source: source.to_string(),
            base: base_desc,
            layers: stack.layers.into_iter().map(|l| l.record).collect(),
            build_seconds: started.elapsed().as_secs_f64(),
            rootfs_bytes: image.rootfs_bytes,
            husk_version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let record = TemplateRecord {
            name: name.to_string(),
            digest: image.digest.clone(),
            image: image.path.clone(),
            size: image.size,
            manifest,
            created_at: husk_core::store::OffsetDateTime::now_utc(),
        };
        let old = self.store.put_template(&record)?;
        if let Some(old) = old {
            crate::image::release(&self.store, &self.opts.run_dir, &old);
        }
        Ok(record)
    }

    /// The base layers.
    async fn base(
        &self,
        plan: &BuildPlan,
        cache: &LayerCache,
        total: usize,
        progress: &dyn Progress,
    ) -> Result<(Stack, String), BuildError> {
        let mut stack = Stack {
            layers: Vec::new(),
            top_key: String::new(),
            defaults: TemplateDefaults::default(),
            mounted: None,
        };
        match &plan.base {
            Base::Scratch => {
                progress.step_start(1, total, "FROM scratch");
                progress.step_done(1, StepOutcome::Cached);
                stack.top_key = KeyHasher::new("scratch").finish();
                Ok((stack, "scratch".into()))
            }
            Base::Debian {
                suite,
                variant,
                packages,
            } => {
                let display = if packages.is_empty() {
                    format!("mmdebstrap {suite} ({variant})")
                } else {
                    format!("mmdebstrap {suite} ({variant}) + {}", packages.join(" "))
                };
                progress.step_start(1, total, &display);
                let t = Instant::now();
                let mirrors = crate::debian::mirror_args(suite);
                let key = {
                    let mut k = KeyHasher::new("debian");
                    k.str(suite).str(variant);
                    for p in packages {
                        k.str(p);
                    }
                    for m in &mirrors {
                        k.str(m);
                    }
                    k.finish()
                };
                let cached = !self.opts.no_cache && cache.exists(&key);
                if !cached {
                    let _ = cache.remove(&key);
                    let tmp = cache.temp(&key).map_err(other("layer cache"))?;
                    let target = tmp.path().join("root");
                    let args = crate::debian::mmdebstrap_args(suite, variant, packages, &target);
                    let mut cmd = tokio::process::Command::new("mmdebstrap");
                    cmd.args(&args);
                    crate::debian::run_host_tool(cmd, progress)
                        .await
                        .map_err(|(code, tail)| BuildError::StepFailed {
                            origin: "base".into(),
                            display,
                            exit_code: code,
                            reason: "mmdebstrap failed".into(),
                            tail,
                        })?;
                    let done = tmp.path().with_extension("root");
                    std::fs::rename(&target, &done).map_err(other("layer cache"))?;
                    drop(tmp);
                    let committed = cache.commit(&done, &key);
                    if committed.is_err() {
                        let _ = std::fs::remove_dir_all(&done);
                    }
                    committed.map_err(other("layer cache"))?;
                }
                progress.step_done(1, outcome(cached, t));
                push(
                    &mut stack,
                    cache,
                    key,
                    &format!("mmdebstrap {suite} {variant}"),
                    "base",
                );
                let desc = format!("debian {suite} ({variant})");
                Ok((stack, desc))
            }
            Base::Image(reference) => {
                progress.step_start(1, total, &format!("FROM {reference}"));
                let t = Instant::now();
                // A local template of that name wins, as a local image does in Docker.
                if let Some(rec) = self.store.template(reference)? {
                    husk_core::template::Templates::new(self.store.clone())
                        .verify(&rec)
                        .map_err(|e| BuildError::Other(e.to_string()))?;
                    let mounted = husk_runtime::images::ensure_mounted(
                        &self.opts.run_dir,
                        &rec.image,
                        rec.size,
                        &rec.digest,
                    )
                    .map_err(|e| BuildError::Other(e.to_string()))?;
                    let key = {
                        let mut k = KeyHasher::new("template");
                        k.str(&rec.digest);
                        k.finish()
                    };
                    stack.layers.push(Layer {
                        dir: mounted.path().to_path_buf(),
                        record: LayerRecord {
                            key: key.clone(),
                            step: format!("template {} ({})", rec.name, rec.digest),
                            origin: "base".into(),
                        },
                    });
                    stack.top_key = key;
                    stack.defaults = rec.manifest.defaults.clone();
                    // Every step's sandbox stacks on it: mounted until the build ends.
                    stack.mounted = Some(mounted);
                    progress.step_done(1, StepOutcome::Cached);
                    return Ok((stack, format!("template {} ({})", rec.name, rec.digest)));
                }
                let report = |p: oci::PullProgress| progress.pull(&p);
                let pulled = oci::pull(reference, &cache.dir, &self.opts.registry, &report).await?;
                let mut key = KeyHasher::new("image");
                key.str(&pulled.manifest_digest);
                for l in &pulled.layers {
                    stack.layers.push(Layer {
                        dir: l.dir.clone(),
                        record: LayerRecord {
                            key: l.key.clone(),
                            step: format!("layer {}", l.digest),
                            origin: "base".into(),
                        },
                    });
                }
                stack.top_key = key.finish();
                let cfg = &pulled.config;
                stack.defaults.env = cfg.env.clone();
                stack.defaults.workdir = cfg.workdir.clone().filter(|w| !w.is_empty());
                stack.defaults.user = cfg.user.as_deref().and_then(image_user);
                stack.defaults.start_cmd = cfg.labels.get(LABEL_START_CMD).cloned();
                stack.defaults.ready_cmd = cfg.labels.get(LABEL_READY_CMD).cloned();
                stack.defaults.ready_timeout_secs = cfg
                    .labels
                    .get(LABEL_READY_TIMEOUT)
                    .and_then(|t| t.parse().ok());
                let all_cached = pulled.layers.iter().all(|l| l.cached);
                progress.step_done(1, outcome(all_cached, t));
                Ok((
                    stack,
                    format!("{} ({})", pulled.reference, pulled.manifest_digest),
                ))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn step(
        &self,
        cache: &LayerCache,
        stack: &mut Stack,
        plan: &BuildPlan,
        step: &crate::plan::Step,
        index: usize,
        total: usize,
        forced: bool,
        progress: &dyn Progress,
    ) -> Result<(), BuildError> {
        let fail = |message: String| BuildError::Step {
            origin: step.origin.clone(),
            display: step.display.clone(),
            message,
        };
        progress.step_start(index, total, &step.display);
        let t = Instant::now();
        let mut k = KeyHasher::new("step");
        k.str(&stack.top_key);
        let work = match &step.kind {
            StepKind::Run {
                command,
                user,
                workdir,
                env,
            } => {
                match command {
                    Command::Shell(s) => k.str("shell").str(s),
                    Command::Exec(a) => {
                        k.str("exec");
                        for x in a {
                            k.str(x);
                        }
                        &mut k
                    }
                };
                k.str(user).str(workdir);
                // The base's environment, then the step's own.
                let mut all_env = stack.defaults.env.clone();
                for (name, value) in env {
                    all_env.retain(|(n, _)| n != name);
                    all_env.push((name.clone(), value.clone()));
                }
                for (name, value) in &all_env {
                    k.str(name).str(value);
                }
                let user = step_user(user, &stack.lower()).map_err(fail)?;
                Work::Run {
                    command,
                    user,
                    workdir,
                    env: all_env,
                }
            }
            StepKind::Copy {
                sources,
                dest,
                owner,
                ..
            } => {
                let owner_ids = match owner {
                    None => (0, 0),
                    Some(o) => owner_ids(o, &stack.lower()).map_err(fail)?,
                };
                k.str("copy")
                    .str(dest)
                    .str(&format!("{}:{}", owner_ids.0, owner_ids.1));
                let many = sources.len() > 1 || dest.ends_with('/');
                let mut files = Vec::new();
                for src in sources {
                    let host = plan.context.join(src);
                    crate::context_hash::hash_into(&host, &mut k)
                        .map_err(|e| fail(format!("{}: {e}", host.display())))?;
                    let target = if many && !host.is_dir() {
                        let base = host.file_name().unwrap_or_default().to_string_lossy();
                        format!("{}/{base}", dest.trim_end_matches('/'))
                    } else {
                        dest.clone()
                    };
                    files.push((host, target));
                }
                Work::Copy {
                    files,
                    owner: owner_ids,
                }
            }
        };
        let key = k.finish();
        let cached = !self.opts.no_cache && !forced && cache.exists(&key);
        if !cached {
            let _ = cache.remove(&key);
            let tmp = cache.temp(&key).map_err(other("layer cache"))?;
            let upper = tmp.path().join("upper");
            let workdir = tmp.path().join("work");
            for d in [&upper, &workdir] {
                std::fs::create_dir(d).map_err(other("layer cache"))?;
            }
            let ran = sandbox_step::run(
                &self.spawner,
                stack.lower(),
                &upper,
                &workdir,
                &self.opts.limits,
                self.opts.step_timeout,
                work,
                progress,
            )
            .await;
            match ran {
                Ok(()) => {}
                Err(StepError::Failed {
                    exit_code,
                    reason,
                    tail,
                }) => {
                    return Err(BuildError::StepFailed {
                        origin: step.origin.clone(),
                        display: step.display.clone(),
                        exit_code,
                        reason,
                        tail,
                    })
                }
                Err(StepError::Sandbox(m)) => return Err(fail(m)),
            }
            // The layer is the upper directory; the rest of the temporary directory goes.
            let done = tmp.path().with_extension("layer");
            std::fs::rename(&upper, &done).map_err(other("layer cache"))?;
            drop(tmp);
            let committed = cache.commit(&done, &key);
            if committed.is_err() {
                let _ = std::fs::remove_dir_all(&done);
            }
            committed.map_err(other("layer cache"))?;
        }
        progress.step_done(index, outcome(cached, t));
        push(stack, cache, key, &step.display, &step.origin);
        Ok(())
    }
}

fn outcome(cached: bool, t: Instant) -> StepOutcome {
    if cached {
        StepOutcome::Cached
    } else {
        StepOutcome::Built(t.elapsed())
    }
}

fn push(stack: &mut Stack, cache: &LayerCache, key: String, step: &str, origin: &str) {
    stack.layers.push(Layer {
        dir: cache.path(&key),
        record: LayerRecord {
            key: key.clone(),
            step: step.to_string(),
            origin: origin.to_string(),
        },
    });
    stack.top_key = key;
}

/// The plan's defaults over the base's (a value the plan sets wins; env merges by name).
fn merge_plan_defaults(d: &mut TemplateDefaults, plan: &crate::plan::Defaults) {
    if plan.user.is_some() {
        d.user = plan.user.clone();
    }
    if plan.workdir.is_some() {
        d.workdir = plan.workdir.clone();
    }
    for (k, v) in &plan.env {
        d.env.retain(|(n, _)| n != k);
        d.env.push((k.clone(), v.clone()));
    }
    if let Some(c) = &plan.contexts {
        d.contexts = c.clone();
    }
    // A pool is asked for per template: one built from it does not inherit it.
    d.warm = plan.warm;
    if plan.start_cmd.is_some() {
        d.start_cmd = plan.start_cmd.clone();
        d.ready_cmd = plan.ready_cmd.clone();
        d.ready_timeout_secs = plan.ready_timeout.map(|t| t.as_secs());
    }
    // Sandboxes run as `root` or `user`; any other image user means `user`.
    if let Some(u) = &d.user {
        if u != "root" {
            d.user = Some("user".into());
        }
    }
}
