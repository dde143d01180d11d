//! `husk template`: build, list, inspect, remove and export templates in the state directory.
//!
//! A build runs its steps in build sandboxes, so, like `husk serve`, it forks the spawner
//! process first, while this process is still single-threaded, and only then starts the async
//! runtime. It works next to a running server: both share the store, and a template is
//! registered only when its image is complete.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use husk_build::build::{BuildOptions, Builder};
use husk_build::oci::{self, ExportTarget, ImageConfig, RegistryOptions};
use husk_core::store::{Store, TemplateRecord, DEFAULT_STATE_DIR};
use husk_core::template::{self, Templates};
use time::format_description::well_known::Rfc3339;

use crate::template_progress::TermProgress;

const EXIT_USAGE: i32 = 125;
const EXIT_FAILURE: i32 = 1;

#[derive(clap::Args, Debug)]
pub struct TemplateArgs {
    #[command(subcommand)]
    pub command: TemplateCommand,
    /// State directory [default: /var/lib/husk]
    #[arg(long, global = true, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    #[command(flatten)]
    pub database: crate::database::DatabaseArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum TemplateCommand {
    /// Build a template from a husk.toml spec or a Dockerfile (or a directory holding one).
    Build(BuildCli),
    /// List templates.
    List {
        /// One JSON object per template.
        #[arg(long)]
        json: bool,
    },
    /// Show a template's manifest (defaults, base, layers) as JSON.
    Inspect { name: String },
    /// Remove a template (sandboxes running from it keep working).
    Rm { name: String },
    /// Remove cached build layers that no registered template uses.
    Prune {
        /// Layer cache directory [default: STATE_DIR/templates/layers].
        #[arg(long, value_name = "DIR")]
        layer_cache: Option<PathBuf>,
    },
    /// Write a template as an OCI image: an OCI layout tar, or pushed to a registry.
    Export {
        name: String,
        /// Write an OCI image layout tar here.
        #[arg(long, short = 'o', value_name = "FILE.tar", conflicts_with = "push")]
        output: Option<PathBuf>,
        /// Push to this registry reference (plain HTTP for loopback registries and those in
        /// HUSK_INSECURE_REGISTRIES; credentials from HUSK_REGISTRY_USERNAME/PASSWORD).
        #[arg(long, value_name = "REF")]
        push: Option<String>,
    },
}

pub fn main(args: TemplateArgs) -> i32 {
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
    match args.command {
        TemplateCommand::Build(cli) => build(&state_dir, &args.database, cli),
        other => {
            let store = match args.database.open_or_explain(&state_dir) {
                Ok(s) => Arc::new(s),
                Err(e) => return fail(e),
            };
            match other {
                TemplateCommand::List { json } => list(&store, json),
                TemplateCommand::Inspect { name } => inspect(&store, &name),
                TemplateCommand::Rm { name } => remove(&store, &name),
                TemplateCommand::Export { name, output, push } => {
                    export(&store, &name, output, push)
                }
                TemplateCommand::Prune { layer_cache } => prune(
                    &store,
                    &layer_cache.unwrap_or_else(|| template::layers_dir(&state_dir)),
                ),
                TemplateCommand::Build(_) => unreachable!("handled above"),
            }
        }
    }
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    crate::report::say(&msg.to_string());
    EXIT_FAILURE
}

fn usage(msg: impl std::fmt::Display) -> i32 {
    crate::report::say(&msg.to_string());
    EXIT_USAGE
}

#[derive(clap::Args, Debug)]
pub struct BuildCli {
    /// husk.toml, Dockerfile, e2b.Dockerfile, or a directory with one of them.
    #[arg(value_name = "FILE|DIR")]
    file: PathBuf,
    /// Template name [default: the spec's `name`, else the directory's name].
    #[arg(long, short = 'n', value_name = "NAME")]
    name: Option<String>,
    /// A Dockerfile ARG value (repeatable).
    #[arg(long = "build-arg", value_name = "KEY=VALUE")]
    build_args: Vec<String>,
    /// Run every step again instead of using cached layers.
    #[arg(long)]
    no_cache: bool,
    /// Print only errors and the final line (for CI).
    #[arg(long, short = 'q')]
    quiet: bool,
    /// Longest one step may run (e.g. 30m).
    #[arg(long, default_value = "1h", value_name = "DURATION")]
    step_timeout: String,
    /// Memory limit of each build sandbox.
    #[arg(long, default_value = "4G", value_name = "SIZE")]
    memory: String,
    #[command(flatten)]
    host: crate::cli::HostArgs,
    /// Layer cache directory [default: STATE_DIR/templates/layers]; state directories may
    /// share one, since layers are keyed by their content.
    #[arg(long, value_name = "DIR")]
    layer_cache: Option<PathBuf>,
}

fn build(state_dir: &Path, database: &crate::database::DatabaseArgs, a: BuildCli) -> i32 {
    let mut build_args = Vec::new();
    for b in &a.build_args {
        match b.split_once('=') {
            Some((k, v)) if !k.is_empty() => build_args.push((k.to_string(), v.to_string())),
            _ => {
                return usage(format_args!(
                    "invalid --build-arg {b:?}: expected KEY=VALUE"
                ))
            }
        }
    }
    let plan = match husk_build::spec::load(&a.file, &build_args) {
        Ok(p) => p,
        Err(e) => return usage(e),
    };
    let name = match a
        .name
        .clone()
        .or_else(|| plan.name.clone())
        .or_else(|| default_name(&a.file))
    {
        Some(n) => n,
        None => return usage("no template name: pass --name NAME"),
    };
    if !husk_build::spec::valid_template_name(&name) {
        return usage(format_args!(
            "invalid template name {name:?}: use 1-63 characters of a-z, 0-9, '.', '_' and '-', starting with a letter or digit"
        ));
    }
    if name == template::HOST_TEMPLATE {
        return usage("the name `host` is reserved for the host template");
    }
    let mut opts = BuildOptions::new(state_dir);
    opts.no_cache = a.no_cache;
    if let Some(dir) = &a.layer_cache {
        opts.layers_dir = dir.clone();
    }
    match crate::units::parse_duration(&a.step_timeout) {
        Ok(d) => opts.step_timeout = d,
        Err(e) => return usage(format_args!("--step-timeout: {e}")),
    }
    match crate::units::parse_size(&a.memory) {
        Ok(m) => opts.limits.memory_bytes = m,
        Err(e) => return usage(format_args!("--memory: {e}")),
    }
    // Before any thread: the spawner must be forked from a single-threaded process.
    let spawner = match husk_runtime::service::start_with(husk_agent::main, a.host.cgroups()) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            crate::report::say(&crate::report::chain(&e));
            return fail(crate::doctor::HINT);
        }
    };
    let store = match database.open_or_explain(state_dir) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(e),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format_args!("async runtime: {}", crate::report::chain(&e))),
    };
    // Build sandboxes (a layered root, maybe the host's network) are made on the spawner's
    // build channel: its main channel refuses them, as a server's does.
    let Some(build_channel) = spawner.take_build_channel() else {
        return fail("the spawner's build channel is gone");
    };
    let builder = Builder {
        spawner: Arc::new(husk_runtime::service::SpawnerService::client(
            build_channel,
            spawner.pid(),
        )),
        store,
        opts,
    };
    let progress = TermProgress::new(a.quiet);
    let started = Instant::now();
    let source = std::fs::canonicalize(&a.file)
        .unwrap_or_else(|_| a.file.clone())
        .display()
        .to_string();
    let result = runtime.block_on(builder.build(&plan, &name, &source, &progress));
    progress.finish();
    drop(runtime);
    drop(builder);
    if let Ok(s) = Arc::try_unwrap(spawner) {
        let _ = s.shutdown();
    }
    match result {
        Ok(rec) => {
            let cached = progress.cached();
            println!(
                "built template {}: {} image ({} of files), {} layers ({} cached), {:.1} s, {}",
                rec.name,
                human(rec.size),
                human(rec.manifest.rootfs_bytes),
                rec.manifest.layers.len(),
                cached,
                started.elapsed().as_secs_f64(),
                rec.digest
            );
            0
        }
        Err(e) => fail(format_args!(
            "building template {name} failed: {}",
            crate::report::chain(&e)
        )),
    }
}

/// The directory's name for `templates/base/husk.toml` or `templates/base`.
fn default_name(file: &Path) -> Option<String> {
    let abs = std::fs::canonicalize(file).ok()?;
    let dir = if abs.is_dir() {
        abs
    } else {
        abs.parent()?.to_path_buf()
    };
    let n = dir.file_name()?.to_string_lossy().to_lowercase();
    husk_build::spec::valid_template_name(&n).then_some(n)
}

pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn list(store: &Store, json: bool) -> i32 {
    let templates = match store.templates() {
        Ok(t) => t,
        Err(e) => return fail(crate::report::chain(&e)),
    };
    // Teams' snapshots are templates too (made of a sandbox, on its template).
    let snapshots: Vec<husk_core::manager::Snapshot> = match store.snapshots() {
        Ok(rows) => rows
            .iter()
            .filter_map(|r| husk_core::manager::Snapshot::from_row(r).ok())
            .filter(|s| s.state == husk_core::manager::SnapshotState::Live)
            .collect(),
        Err(e) => return fail(crate::report::chain(&e)),
    };
    if json {
        for t in &templates {
            println!("{}", summary_json(t));
        }
        for s in &snapshots {
            println!("{}", s.summary_json());
        }
        return 0;
    }
    println!(
        "{:<24} {:>10} {:>8} {:<22} DIGEST",
        "NAME", "SIZE", "LAYERS", "CREATED"
    );
    println!(
        "{:<24} {:>10} {:>8} {:<22} (the host's /usr)",
        template::HOST_TEMPLATE,
        "-",
        "-",
        "-"
    );
    for t in &templates {
        println!(
            "{:<24} {:>10} {:>8} {:<22} {}",
            t.name,
            human(t.size),
            t.manifest.layers.len(),
            t.created_at.format(&Rfc3339).unwrap_or_default(),
            &t.digest[..t.digest.len().min(19)]
        );
    }
    for s in &snapshots {
        println!(
            "{:<24} {:>10} {:>8} {:<22} snapshot of {} (team {}, parent {})",
            s.snapshot_id(),
            human(s.bytes),
            s.layers.len(),
            s.created_at().format(&Rfc3339).unwrap_or_default(),
            s.source,
            s.team,
            s.parent
        );
    }
    if !templates.iter().any(|t| t.name == template::BASE_TEMPLATE) {
        eprintln!("(`base` means the host template until a template called base is built)");
    }
    0
}

/// A template as JSON (the same shape the HTTP API returns).
pub use husk_core::template::summary_json;

fn inspect(store: &Store, name: &str) -> i32 {
    match store.template(name) {
        Ok(Some(t)) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&summary_json(&t)).unwrap_or_default()
            );
            0
        }
        Ok(None) => fail(format_args!("template '{name}' not found")),
        Err(e) => fail(crate::report::chain(&e)),
    }
}

fn remove(store: &Store, name: &str) -> i32 {
    match store.delete_template(name) {
        Ok(Some(old)) => {
            husk_build::image::release(
                store,
                Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR),
                &old,
            );
            eprintln!("removed template {name}");
            0
        }
        Ok(None) => fail(format_args!("template '{name}' not found")),
        Err(e) => fail(crate::report::chain(&e)),
    }
}

fn prune(store: &Store, cache: &Path) -> i32 {
    let templates = match store.templates() {
        Ok(t) => t,
        Err(e) => return fail(crate::report::chain(&e)),
    };
    let used: std::collections::HashSet<String> = templates
        .iter()
        .flat_map(|t| t.manifest.layers.iter().map(|l| l.key.clone()))
        .collect();
    let Ok(rd) = std::fs::read_dir(cache) else {
        eprintln!("no layer cache at {}", cache.display());
        return 0;
    };
    let (mut removed, mut freed) = (0, 0);
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        // Temporary directories belong to builds that may be running.
        if name.starts_with('.') || used.contains(&name) {
            continue;
        }
        let bytes = husk_build::layers::tree_size(&e.path()).map_or(0, |(b, _)| b);
        if std::fs::remove_dir_all(e.path()).is_ok() {
            removed += 1;
            freed += bytes;
        }
    }
    eprintln!("removed {removed} unused layer(s), {}", human(freed));
    0
}

fn export(store: &Arc<Store>, name: &str, output: Option<PathBuf>, push: Option<String>) -> i32 {
    let target = match (output, push) {
        (Some(o), None) => ExportTarget::Layout(o),
        (None, Some(p)) => ExportTarget::Push(p),
        _ => return usage("pass --output FILE.tar or --push REF"),
    };
    let rec = match store.template(name) {
        Ok(Some(t)) => t,
        Ok(None) => return fail(format_args!("template '{name}' not found")),
        Err(e) => return fail(crate::report::chain(&e)),
    };
    if let Err(e) = Templates::new(store.clone()).verify(&rec) {
        return fail(crate::report::chain(&e));
    }
    let run_dir = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR);
    let rootfs =
        match husk_runtime::images::ensure_mounted(run_dir, &rec.image, rec.size, &rec.digest) {
            Ok(p) => p,
            Err(e) => return fail(crate::report::chain(&e)),
        };
    let (config, annotations) = oci_config(&rec);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(format_args!("async runtime: {}", crate::report::chain(&e))),
    };
    let opts = RegistryOptions::from_env();
    match runtime.block_on(oci::export(
        rootfs.path(),
        &config,
        &annotations,
        &target,
        &opts,
    )) {
        Ok(s) => {
            let to = match &target {
                ExportTarget::Layout(p) => p.display().to_string(),
                ExportTarget::Push(r) => r.clone(),
            };
            println!(
                "exported template {name} to {to}: {} layer, manifest {}",
                human(s.layer_bytes),
                s.manifest_digest
            );
            0
        }
        Err(e) => fail(format_args!(
            "exporting template {name}: {}",
            crate::report::chain(&e)
        )),
    }
}

/// The OCI config of an exported template: its defaults as Env/User/WorkingDir, and husk's
/// own settings (start and ready commands) as labels another husk reads back.
pub fn oci_config(rec: &TemplateRecord) -> (ImageConfig, BTreeMap<String, String>) {
    let d = &rec.manifest.defaults;
    let mut labels = BTreeMap::new();
    if let Some(s) = &d.start_cmd {
        labels.insert(husk_build::build::LABEL_START_CMD.to_string(), s.clone());
    }
    if let Some(r) = &d.ready_cmd {
        labels.insert(husk_build::build::LABEL_READY_CMD.to_string(), r.clone());
    }
    if let Some(t) = d.ready_timeout_secs {
        labels.insert(
            husk_build::build::LABEL_READY_TIMEOUT.to_string(),
            t.to_string(),
        );
    }
    let config = ImageConfig {
        env: d.env.clone(),
        user: d.user.clone(),
        workdir: d.workdir.clone(),
        cmd: Vec::new(),
        entrypoint: Vec::new(),
        labels,
    };
    let mut annotations = BTreeMap::new();
    annotations.insert(
        "org.opencontainers.image.title".to_string(),
        rec.name.clone(),
    );
    annotations.insert("dev.husk.template.digest".to_string(), rec.digest.clone());
    (config, annotations)
}
