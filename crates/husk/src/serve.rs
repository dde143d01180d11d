//! `husk serve`: the E2B-compatible server.
//!
//! Order matters: the spawner process is forked first, while this process is still
//! single-threaded; only then does the async runtime (and its threads) start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use husk_build::build::BuildOptions;
use husk_core::manager::{Config, Manager};
use husk_core::store::remote::RemoteStore;
use husk_core::store::Store;
use husk_server::templates::{SandboxSize, TemplateService};
use husk_server::AppState;

use crate::units::format_size;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on (HTTP/1.1 and h2c). Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:3000", value_name = "ADDR:PORT")]
    pub listen: SocketAddr,
    /// Also serve the operator's metrics (Prometheus text format, `GET /metrics`) on this
    /// address: a listener apart from the API's, answering without a key, so bind it where
    /// only the operator's scraper reaches (e.g. 127.0.0.1:9464). Port 0 picks a free one.
    /// [default: no metrics listener]
    #[arg(long, value_name = "ADDR:PORT", env = "HUSK_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// Where the database (unless --database-url), the admin key, templates, workspaces and
    /// paused sandboxes live.
    #[arg(long, value_name = "DIR", default_value = husk_core::store::DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    #[command(flatten)]
    pub database: crate::database::DatabaseArgs,
    /// Concurrent sandboxes per team (a team's own quota, set with `husk key quota`, wins).
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_sandboxes: u32,
    /// Paused sandboxes per team (in place and on disk together); they do not count against
    /// --max-sandboxes.
    #[arg(long, default_value_t = husk_core::manager::DEFAULT_PAUSED_QUOTA, value_name = "N")]
    pub max_paused: u32,
    /// Snapshots per team (`sbx.create_snapshot()`; a fork's are not counted).
    #[arg(long, default_value_t = husk_core::manager::DEFAULT_SNAPSHOT_QUOTA, value_name = "N")]
    pub max_snapshots: u32,
    /// Kill sandboxes paused for longer than this (checked every minute) [default: never:
    /// paused sandboxes stay until killed].
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub paused_retention: Option<std::time::Duration>,
    /// Destroy running sandboxes when the server stops, and let those it creates end with it
    /// when it crashes, as husk did before sandboxes outlived it (those it took up from an
    /// earlier server were made to outlive theirs, and still do). By default they keep running
    /// through a stop, a crash or an upgrade, and the next `husk serve` on the same state
    /// directory takes them up again.
    #[arg(long)]
    pub destroy_on_exit: bool,
    /// Memory for each sandbox's processes (its disk, /dev/shm included, held in RAM, comes on top).
    #[arg(long, default_value = "512M", value_name = "SIZE")]
    pub memory: String,
    /// CPU quota of each sandbox, in CPUs.
    #[arg(long, default_value = "1", value_name = "N")]
    pub cpus: String,
    /// Size of each sandbox's writable layer (held in RAM, on top of --memory).
    #[arg(long, default_value = "1G", value_name = "SIZE")]
    pub disk: String,
    /// The master key that seals teams' secrets [default: STATE_DIR/master.key; created on
    /// first start, mode 0600]. Keep it off the database's backups.
    #[arg(long, value_name = "FILE")]
    pub master_key: Option<PathBuf>,
    /// Largest upload into a workspace: one file, or the content of one tar archive.
    #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub workspace_upload_limit: u64,
    /// Most bytes each team's workspaces may hold in all. Each team gets a size-capped ext4
    /// file system of this size (a sparse image in STATE_DIR/workspace-images, loop-mounted
    /// on its directory), so every write past it fails with "no space left on device" (507
    /// over the API), a sandbox's own writes to a read-write workspace included. A larger
    /// value grows existing ones at start; none is ever shrunk. 0: no quota (plain
    /// directories, unbounded).
    #[arg(long, default_value = "10G", value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub workspace_quota: u64,
    /// Longest a client may make husk wait on a request body (or on reading a workspace
    /// download) while sending (reading) less than 1 KiB/s on average; slower transfers are
    /// cut (408 for a body). Sandbox servers' own traffic and commands' stdin are exempt.
    #[arg(long, default_value = "30s", value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub body_timeout: std::time::Duration,
    /// Workspace operations (uploads, downloads, archives, listings) one team may have in
    /// progress at once; more get 429.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub max_transfers_per_team: usize,
    /// Workspace operations in progress at once on the whole server; more get 429.
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_transfers: usize,
    /// How long the records of ended runs and batches, and of secret uses, are kept; older
    /// ones are deleted (checked at start and hourly).
    #[arg(long, default_value = "7d", value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub record_retention: std::time::Duration,
    /// The most a run may copy out as outputs (its `output_limit.bytes`).
    #[arg(long, default_value = "4G", value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub max_run_output: u64,
    /// Memory the host must have available (MemAvailable) for a new sandbox: what the server
    /// and the sandboxes it has keep for themselves. Below it creates get 503 (the SDKs retry).
    /// 0: no reserve [default: 5% of the host's memory, at least 256M].
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub memory_reserve: Option<u64>,
    /// A warm pool: keep COUNT sandboxes of TEMPLATE made ahead of demand, with the
    /// template's start command and code contexts (kernels) already running, for creates to
    /// claim (repeat for more templates). Creates a warm sandbox cannot serve (workspaces,
    /// limits of their own, ...) or that find the pool empty are made fresh.
    #[arg(long, value_name = "TEMPLATE=COUNT")]
    pub warm: Vec<husk_core::manager::WarmTarget>,
    /// Below this much available host memory (MemAvailable) the warm pools stop filling and
    /// give their sandboxes back. Default: twice --memory-reserve.
    #[arg(long, value_name = "SIZE", value_parser = crate::units::parse_size)]
    pub warm_memory_floor: Option<u64>,
    /// Spawner processes, which make and destroy sandboxes side by side (each one at a
    /// time) [default: one per CPU this process may use, at most 64].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=husk_runtime::service::MAX_SPAWNERS as i64))]
    pub spawners: Option<u16>,
    /// The unprivileged user the server becomes once its helpers run and its listener is
    /// bound (a name from /etc/passwd, or UID[:GID]); it holds no capability and may open
    /// nothing but /proc and the cgroup tree. Root is refused.
    #[arg(long, default_value = crate::server_user::DEFAULT, value_name = "USER")]
    pub server_user: String,
    /// The domain sandboxes are reachable under, given to the SDKs as each sandbox's
    /// `domain`: they then reach port P of a sandbox at `https://P-<sandboxID>.<DOMAIN>`
    /// (without `E2B_SANDBOX_URL`; it needs wildcard DNS and TLS in front of husk) and
    /// `get_host(P)` names that host. Unset: `domain` is null.
    #[arg(long, value_name = "DOMAIN", value_parser = parse_domain)]
    pub domain: Option<husk_server::domain::Domain>,
    #[command(flatten)]
    pub egress: crate::egress::EgressArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
    #[command(flatten)]
    pub tls: TlsArgs,
    #[command(flatten)]
    pub host: crate::cli::HostArgs,
}

/// HTTPS on the listener.
#[derive(clap::Args, Debug, Clone)]
pub struct TlsArgs {
    /// Serve HTTPS only, with this PEM certificate chain (leaf first); read again every 2 s,
    /// so a renewed certificate is used without a restart. Needs --tls-key.
    #[arg(long, value_name = "FILE", env = "HUSK_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", env = "HUSK_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The two files, when given.
    pub fn files(&self) -> Option<(PathBuf, PathBuf)> {
        Some((self.tls_cert.clone()?, self.tls_key.clone()?))
    }

    /// The listener's TLS, read now (a server that cannot use its certificate does not start).
    pub fn load(&self) -> Result<Option<husk_server::tls::ServerTls>, husk_server::tls::TlsError> {
        let Some((cert, key)) = self.files() else {
            return Ok(None);
        };
        let files = husk_server::tls::CertFiles::read(&cert, &key)?;
        husk_server::tls::ServerTls::from_pem(&files.cert, &files.key).map(Some)
    }
}

/// `http` or `https`, as the listener speaks.
pub fn scheme(tls: Option<&husk_server::tls::ServerTls>) -> &'static str {
    if tls.is_some() {
        "https"
    } else {
        "http"
    }
}

/// What the listener admits: bounds on what a client without a key can make the server hold.
#[derive(clap::Args, Debug)]
pub struct ConnArgs {
    /// Connections open at once, all clients together; more are answered 503 and closed.
    #[arg(long, default_value = "4096", value_name = "N", value_parser = parse_count)]
    pub max_connections: usize,
    /// Connections open at once from one client address (an IPv6 client: its /64). Behind a
    /// reverse proxy every client has the proxy's address: raise it to --max-connections.
    #[arg(long, default_value = "1024", value_name = "N", value_parser = parse_count)]
    pub max_connections_per_ip: usize,
    /// How long a client has for a connection's first bytes, and then for each whole request
    /// head. An HTTP/1.1 connection waiting for its next request is closed after it too.
    #[arg(long, default_value = "10s", value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub header_timeout: std::time::Duration,
    /// How long a connection may stay open with no request in flight (HTTP/2; HTTP/1.1 is also
    /// under --header-timeout).
    #[arg(long, default_value = "60s", value_name = "DURATION", value_parser = crate::units::parse_duration)]
    pub idle_timeout: std::time::Duration,
}

impl ConnArgs {
    pub fn limits(&self) -> husk_server::ConnLimits {
        husk_server::ConnLimits {
            max_connections: self.max_connections,
            max_connections_per_ip: self.max_connections_per_ip,
            header_timeout: self.header_timeout,
            idle_timeout: self.idle_timeout,
            ..husk_server::ConnLimits::default()
        }
    }
}

fn parse_count(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive number")),
    }
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    crate::report::say(&msg.to_string());
    1
}

pub fn main(args: ServeArgs) -> i32 {
    main_with(args, None)
}

/// `husk serve`, or with `node` a cluster's node (`husk node`, see `crate::cluster`).
pub fn main_with(args: ServeArgs, node: Option<crate::cluster::NodeSettings>) -> i32 {
    // The core logs sandbox lifecycle events (timeouts, agents gone) with `tracing`; to
    // stderr, at `info` unless HUSK_LOG says otherwise (e.g. HUSK_LOG=debug).
    let filter = tracing_subscriber::EnvFilter::try_from_env("HUSK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    // Every client connection and every sandbox holds descriptors: the soft limit (often 1024)
    // would refuse connections long before --max-connections. The hard limit is the operator's
    // (LimitNOFILE= in a unit).
    if let Err(e) = husk_runtime::sys::raise_nofile_limit() {
        eprintln!("husk: warning: cannot raise the open-file limit: {e}");
    }
    // 5% of a 24 GiB host is 1.2 GiB: measured, 609 sandboxes with a Python kernel each left
    // 0.3 GiB, and under 256M of reserve the next kernel's start thrashed the page cache
    // for a minute and failed, where a 503 should have said the host was full.
    let memory_reserve = args.memory_reserve.unwrap_or_else(|| {
        husk_core::manager::host_memory_total()
            .map_or(husk_core::manager::DEFAULT_MEMORY_RESERVE, |total| {
                (total / 20).max(husk_core::manager::DEFAULT_MEMORY_RESERVE)
            })
    });
    let mut config = Config {
        default_quota: args.max_sandboxes,
        memory_reserve,
        paused_quota: args.max_paused,
        paused_retention: args.paused_retention,
        snapshot_quota: args.max_snapshots,
        keep: !args.destroy_on_exit,
        warm: args.warm.clone(),
        warm_memory_floor: args
            .warm_memory_floor
            .unwrap_or(memory_reserve.saturating_mul(2)),
        ..Config::default()
    };
    match (
        crate::units::parse_size(&args.memory),
        crate::units::parse_cpus(&args.cpus),
        crate::units::parse_size(&args.disk),
    ) {
        (Ok(m), Ok(c), Ok(d)) => {
            config.limits.memory_bytes = m;
            config.limits.cpu_millis = c;
            config.limits.disk_bytes = d;
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            crate::report::say(&e);
            return 125;
        }
    }
    // Checked before anything is started: a user the server cannot become stops it here.
    let server_user =
        match crate::server_user::resolve(&args.server_user, std::path::Path::new("/etc/passwd")) {
            Ok(u) => u,
            Err(e) => return fail(e),
        };
    // Read now, as root: the server that serves it is not (the state helper reads the files
    // again for renewals).
    let tls = match args.tls.load() {
        Ok(t) => t,
        Err(e) => {
            crate::report::say(&crate::report::chain(&e));
            return 2;
        }
    };
    // husk's own memory is charged to no sandbox, and if the kernel killed the server, every
    // team's sandboxes would end with it: in an OOM, sandbox processes go first, then their
    // agents, husk last (see husk_runtime::oom). Before the spawner is forked, which inherits
    // it. Not fatal: without it husk works as before, only less protected.
    if let Err(e) = husk_runtime::oom::set_own(husk_runtime::oom::SERVER) {
        eprintln!(
            "husk: warning: cannot protect the server from the OOM killer \
             (oom_score_adj {}: {e}); sandboxes' agents will not be protected either",
            husk_runtime::oom::SERVER
        );
    }
    // The spawner checks every host path a spec names (mount sources, images, build layers)
    // against these roots itself: the server that asks is not trusted with the host's files.
    let run_dir = PathBuf::from(husk_runtime::spawner::DEFAULT_RUN_DIR);
    let confinement = husk_runtime::confine::Confinement {
        mount_roots: vec![args.state_dir.join(husk_core::workspaces::WORKSPACES_DIR)],
        mount_files: vec![PathBuf::from(husk_build::sandbox_step::HOST_CA_BUNDLE)],
        // Templates' images and layers; the /usr layers and the mounted images a build
        // stacks its layers on when it starts from a template.
        image_roots: vec![
            args.state_dir.join("templates"),
            run_dir.join("templates"),
            run_dir.join("images"),
        ],
        layer_roots: vec![
            args.state_dir.join(husk_core::saved_layers::PAUSED_DIR),
            args.state_dir.join(husk_core::saved_layers::SNAPSHOTS_DIR),
        ],
    };
    // The spawner's owner: sandboxes outlive the server, and the next server on the same
    // state directory takes them up (husk_runtime::keep), even one that will not keep its
    // own (--destroy-on-exit). Its canonical path, so that a relative or symlinked
    // --state-dir names the same owner.
    // Made here if missing, as the store would make it (0700), so that its path resolves.
    use std::os::unix::fs::DirBuilderExt;
    if let Err(e) = std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&args.state_dir)
    {
        return fail(format_args!(
            "state directory {}: {e}",
            args.state_dir.display()
        ));
    }
    let owner = match std::fs::canonicalize(&args.state_dir) {
        Ok(p) => Some(p.display().to_string()),
        Err(e) => {
            return fail(format_args!(
                "state directory {}: {e}",
                args.state_dir.display()
            ))
        }
    };
    // One server per state directory, checked before anything is started or taken up
    // (crate::state_lock). Held until this process ends.
    let _state_lock = match crate::state_lock::StateLock::take(&args.state_dir) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    // Sandboxes that outlive the server live outside its unit (systemd hosts). A server is
    // one long-lived process: a scope of its own, never the one short husk processes share.
    let cgroups = husk_runtime::cgroup::CgroupOptions {
        own_scope: !args.destroy_on_exit,
        shared_scope_linger: None,
        ..args.host.cgroups()
    };
    // One per CPU: a create's time is mostly the kernel's (namespaces, cgroups, mounts),
    // which runs in the spawner that asks for it.
    let spawners = args.spawners.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    );
    let spawner = match husk_runtime::service::start_spawners(
        husk_agent::main,
        cgroups,
        Some(confinement),
        owner,
        spawners,
    ) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            crate::report::say(&crate::report::chain(&e));
            return fail(crate::doctor::HINT);
        }
    };
    eprintln!(
        "husk: {} spawner process(es); {}",
        spawner.pids().len(),
        spawner.cgroup_summary()
    );
    // Nothing is weaker without saying so (`husk doctor` has the whole report).
    for gap in husk_runtime::probe::unenforced() {
        eprintln!("husk: warning: Landlock {gap}");
    }
    if !spawner.adopted().is_empty() {
        eprintln!(
            "husk: {} sandbox(es) of the previous server are still running; taking them up",
            spawner.adopted().len()
        );
    }
    if spawner.reaped_at_start() > 0 {
        eprintln!(
            "husk: cleaned up {} sandbox(es) left by an earlier run",
            spawner.reaped_at_start()
        );
    }
    // The router and sockets in sandboxes' namespaces live in a helper process of their own,
    // forked now while this process is still single-threaded (husk_net::helper).
    let default_policy = match args.egress.default_policy() {
        Ok(p) => p,
        Err(e) => return fail(format_args!("--net-default: {e}")),
    };
    let egress = args.egress.clone();
    let network = match husk_net::helper::NetHelper::start(move || {
        egress.start(PathBuf::from(husk_runtime::spawner::DEFAULT_RUN_DIR))
    }) {
        Ok(n) => Arc::new(n),
        Err(e) => return fail(e),
    };
    // The database and the master key live in the state helper: this process never opens
    // either (husk_core::store::remote).
    let state_dir = args.state_dir.clone();
    let key_path = args
        .master_key
        .clone()
        .unwrap_or_else(|| args.state_dir.join(husk_core::secrets::MASTER_KEY_FILE));
    let location = match args.database.location(&args.state_dir) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    let helper_files = husk_core::store::remote::HelperFiles {
        cluster_token: node.as_ref().map(|n| n.token_file.clone()),
        tls: args.tls.files(),
    };
    let state = match RemoteStore::start(
        move || {
            let store = Store::open_at(&location).map(Arc::new).map_err(|e| {
                format!(
                    "{}: {}",
                    crate::database::describe(&location),
                    crate::report::chain(&e)
                )
            })?;
            ensure_admin_key(&store, &state_dir)?;
            let keys = husk_core::secrets::MasterKeys::load(&key_path)
                .map_err(|e| crate::report::chain(&e))?;
            let secrets = Arc::new(husk_core::secrets::Secrets::new(store.clone(), keys));
            Ok((store, secrets))
        },
        helper_files,
    ) {
        Ok(s) => Arc::new(s),
        Err(e) => return fail(e),
    };
    let store = Arc::new(Store::remote(state.clone()));
    // The workspaces (their files, the teams' loop-mounted file systems) and the copying of
    // runs' outputs out of sandboxes live in the files helper, which gets sandboxes' roots
    // from the spawner, by id (husk_core::workspaces::remote).
    // On storage every node of a cluster mounts, a team's quota is the volume's business: a
    // size-capped file system per team, loop-mounted by several machines at once, would be
    // corrupted.
    let shared_workspaces = node.as_ref().is_some_and(|n| n.shared_workspaces);
    let workspace_quota = if shared_workspaces {
        0
    } else {
        args.workspace_quota
    };
    let quota = match husk_core::workspaces::WorkspaceQuota::from_bytes(workspace_quota) {
        Ok(q) => q,
        Err(e) => return fail(format_args!("--workspace-quota: {e}")),
    };
    let ws_dir = args.state_dir.clone();
    let files = match husk_core::workspaces::remote::RemoteWorkspaces::start(
        args.max_transfers.max(1),
        spawner.take_root_channel(),
        move || {
            husk_core::workspaces::LocalWorkspaces::open_with_quota(&ws_dir, quota)
                .map_err(|e| e.to_string())
        },
    ) {
        Ok(f) => Arc::new(f),
        Err(e) => return fail(e),
    };
    // Template builds (contexts, build sandboxes, layers and images) live in the build helper,
    // with the spawner's build channel and one channel to the state helper.
    let builds = match husk_build::helper::BuildHelper::start(
        spawner.take_build_channel(),
        spawner.pid(),
        state.take_spare_channel(),
        BuildOptions::new(&args.state_dir),
    ) {
        Ok(b) => Arc::new(b),
        Err(e) => return fail(e),
    };
    // Everything that needs root is done once the listener is bound (a port below 1024 needs
    // it) and the helpers are watched: the server drops to an unprivileged user now, while it
    // is still single-threaded (Landlock binds the calling thread and those it starts). A
    // failure here still stops the helpers in order, below.
    let ready = (|| {
        let bind = |addr: SocketAddr, what: &str| {
            std::net::TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| format!("{what} on {addr}: {}", crate::report::chain(&e)))
        };
        let listener = bind(args.listen, "listen")?;
        let metrics = args
            .metrics_listen
            .map(|addr| bind(addr, "--metrics-listen"))
            .transpose()?;
        let mut helpers: Vec<(&'static str, i32)> =
            spawner.pids().into_iter().map(|p| ("spawner", p)).collect();
        helpers.extend([
            ("network", network.pid()),
            ("state", state.pid()),
            ("files", files.pid()),
            ("build", builds.pid()),
        ]);
        let watched = watch(helpers);
        drop_privileges(&server_user)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("async runtime: {}", crate::report::chain(&e)))?;
        Ok::<_, String>((listener, metrics, watched, runtime))
    })();
    let keep = !args.destroy_on_exit;
    let code = match ready {
        Ok((listener, metrics, watched, runtime)) => {
            let code = runtime.block_on(run(
                args,
                node,
                store,
                Helpers {
                    state: state.clone(),
                    spawner: spawner.clone(),
                    network: network.clone(),
                    files: files.clone(),
                    builds: builds.clone(),
                    watched,
                },
                Listening {
                    socket: listener,
                    tls,
                    metrics,
                },
                default_policy,
                config,
            ));
            drop(runtime);
            code
        }
        Err(e) => fail(e),
    };
    // Sandboxes are gone, their links with them; then the router and what it added to the
    // host.
    network.shutdown();
    files.shutdown();
    // Before the state helper, which waits for every channel to it, the build helper's too.
    builds.shutdown();
    state.shutdown();
    match Arc::try_unwrap(spawner) {
        Ok(s) => {
            // Sandboxes that outlive the server stay for the next one.
            let stopped = if keep {
                s.shutdown_keeping()
            } else {
                s.shutdown()
            };
            if let Err(e) = stopped {
                eprintln!("husk: stopping the spawner: {e}");
            }
        }
        Err(_) => eprintln!("husk: spawner still in use at exit"),
    }
    if code == 0 {
        eprintln!("husk: stopped");
    }
    code
}

/// On first start (no active key), creates the admin key, prints it once and saves it.
fn ensure_admin_key(store: &Store, dir: &std::path::Path) -> Result<(), String> {
    if store.has_active_keys().map_err(|e| e.to_string())? {
        return Ok(());
    }
    let (_, key) = store
        .create_key("default", true, Some("admin"))
        .map_err(|e| e.to_string())?;
    let path = dir.join("admin.key");
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{key}").map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!(
        "husk: created the admin key (team \"default\"), shown only this once and saved to {}:\n{key}",
        path.display()
    );
    Ok(())
}

/// The server's privileged helpers, and the pids it watches.
struct Helpers {
    /// The state helper (a node reads its cluster token file through it).
    state: Arc<RemoteStore>,
    spawner: Arc<husk_runtime::service::SpawnerService>,
    network: Arc<husk_net::helper::NetHelper>,
    files: Arc<husk_core::workspaces::remote::RemoteWorkspaces>,
    builds: Arc<husk_build::helper::BuildHelper>,
    watched: Vec<Watched>,
}

/// The bound listening socket, and its TLS when it has a certificate.
struct Listening {
    socket: std::net::TcpListener,
    tls: Option<husk_server::tls::ServerTls>,
    /// The operator's metrics listener (--metrics-listen).
    metrics: Option<std::net::TcpListener>,
}

async fn run(
    args: ServeArgs,
    node: Option<crate::cluster::NodeSettings>,
    store: Arc<Store>,
    helpers: Helpers,
    Listening {
        socket: listener,
        tls,
        metrics,
    }: Listening,
    default_policy: husk_net::NetPolicy,
    mut config: Config,
) -> i32 {
    // First of all: a stop asked for from now on waits for the server to have started.
    let signals = stop_signals();
    // A node registers before it makes any sandbox: their ids begin with its code.
    let port = listener.local_addr().map_or(0, |a| a.port());
    let node = node.map(|n| Arc::new(n.with_port(port)));
    if let Some(node) = &node {
        match crate::cluster::register(&store, node) {
            Ok(code) => {
                eprintln!(
                    "husk: node registered (code {code}, reached at {}, capacity {})",
                    node.url, node.capacity
                );
                config.id_prefix = code;
                // Templates' images by digest, this machine's own (fetched from peers).
                config.local_images = Some(husk_core::template::images_dir(&args.state_dir));
            }
            Err(e) => return fail(e),
        }
    }
    let Helpers {
        state: state_helper,
        spawner,
        network,
        files,
        builds,
        watched: helpers,
    } = helpers;
    let size = SandboxSize {
        cpu_count: config.limits.cpu_millis.div_ceil(1000).max(1) as u32,
        memory_mb: config.limits.memory_bytes >> 20,
        disk_mb: config.limits.disk_bytes >> 20,
    };
    let code = config.id_prefix.clone();
    let spawners = spawner.pids().len();
    let manager = match Manager::new(store, spawner, config) {
        Ok(m) => m,
        Err(e) => return fail(crate::report::chain(&e)),
    };
    let images = node.as_ref().map(|n| {
        let images = Arc::new(husk_server::node_images::NodeImages::new(
            builds.clone(),
            manager.store_arc(),
            n.token.clone(),
            code,
            &n.peers_tls,
        ));
        manager.set_image_source(images.clone());
        images
    });
    manager.set_network(network, default_policy);
    // Paused sandboxes' files are saved (and removed) by the files helper; those an earlier
    // server left paused are taken up here.
    manager.set_saved_layers(files.clone(), args.state_dir.clone());
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => {
            return fail(format_args!(
                "listen on {}: {}",
                args.listen,
                crate::report::chain(&e)
            ))
        }
    };
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let secrets = Arc::new(husk_core::secrets::Secrets::remote(manager.store_arc()));
    manager.set_secrets(secrets.clone());
    let workspaces = Arc::new(
        husk_core::workspaces::Workspaces::remote(files).with_upload_limits(
            husk_core::workspaces::ImportLimits {
                max_bytes: args.workspace_upload_limit,
                ..Default::default()
            },
        ),
    );
    // Sandboxes mount them (E2B volumeMounts, runs); runs save outputs into them.
    // A cluster's node serves workspaces only from storage every node mounts: elsewhere a
    // team's workspace would be on one machine and its next sandbox on another.
    let shared_workspaces = node.as_ref().is_some_and(|n| n.shared_workspaces);
    let workspaces_here = node.is_none() || shared_workspaces;
    if workspaces_here {
        manager.set_workspaces(workspaces.clone());
    }
    // What the previous server left running (the spawner took it up): same ids, processes,
    // network, kernels; before the listener serves anyone.
    match manager.take_up().await {
        Ok(t) if t.running + t.lost + t.strays > 0 => eprintln!(
            "husk: took up {} sandbox(es) the previous server left running or paused{}{}",
            t.running,
            if t.lost > 0 {
                format!("; {} could not be taken up (listed as lost)", t.lost)
            } else {
                String::new()
            },
            if t.strays > 0 {
                format!("; destroyed {} that no record named", t.strays)
            } else {
                String::new()
            }
        ),
        Ok(_) => {}
        Err(e) => return fail(crate::report::chain(&e)),
    }
    let metrics = match metrics {
        Some(socket) => match serve_metrics(socket, manager.clone(), spawners) {
            Ok(m) => Some(m),
            Err(e) => return fail(e),
        },
        None => None,
    };
    // Said once the sandboxes an earlier server left are back: a client that waits for this
    // line finds them (connections made before wait in the listener's backlog).
    eprintln!(
        "husk: listening on {}://{addr} (state in {})",
        scheme(tls.as_ref()),
        args.state_dir.display()
    );
    // The open logged what is wrong, if anything; this says what is in force.
    match workspaces.quota_state() {
        _ if !workspaces_here => eprintln!(
            "husk: workspaces and volumes: off (give --shared-workspaces once a volume every \
             node mounts is at {})",
            args.state_dir
                .join(husk_core::workspaces::WORKSPACES_DIR)
                .display()
        ),
        husk_core::workspaces::QuotaState::Off if shared_workspaces => eprintln!(
            "husk: workspaces: on the volume every node mounts at {} (its own quota applies)",
            args.state_dir
                .join(husk_core::workspaces::WORKSPACES_DIR)
                .display()
        ),
        husk_core::workspaces::QuotaState::PerTeam(q) => eprintln!(
            "husk: workspace quota: {} per team (a size-capped file system each, in {})",
            format_size(*q),
            args.state_dir
                .join(husk_core::workspaces::IMAGES_DIR)
                .display()
        ),
        husk_core::workspaces::QuotaState::Off => eprintln!(
            "husk: workspace quota: none (--workspace-quota 0): workspaces are plain \
             directories, bounded only by the disk"
        ),
        husk_core::workspaces::QuotaState::Unavailable { quota, .. } => eprintln!(
            "husk: workspace quota: {} per team NOT enforced (see the warning above)",
            format_size(*quota)
        ),
    }
    let mut runs_config = husk_core::runs::RunsConfig::default();
    runs_config.max_output.max_bytes = args.max_run_output;
    let runs = match husk_core::runs::Runs::with_config(manager.clone(), runs_config) {
        Ok(r) => r,
        Err(e) => return fail(crate::report::chain(&e)),
    };
    let state = AppState::new(manager.clone())
        .with_templates(TemplateService::new(builds, size))
        .with_secrets(secrets)
        .with_runs(runs)
        .with_body_policy(husk_server::body::BodyPolicy::with_window(
            args.body_timeout,
        ))
        .with_domain(args.domain.clone())
        .with_transfer_limits(husk_server::transfers::TransferLimits {
            per_team: args.max_transfers_per_team.max(1),
            total: args.max_transfers.max(1),
        });
    let state = if workspaces_here {
        state.with_workspaces(workspaces)
    } else {
        state
    };
    let state = match &node {
        Some(node) => {
            crate::cluster::spawn_heartbeat(
                manager.store_arc(),
                manager.clone(),
                node.clone(),
                images.clone(),
            );
            // The server cannot read the token file itself (it is root's, and this process
            // is not root any more): its state helper reads it again.
            let helper = state_helper.clone();
            node.token.spawn_reload(move || {
                helper
                    .cluster_token_file()
                    .map_err(|e| crate::report::chain(&e))
            });
            state.with_cluster(node.token.clone())
        }
        None => state,
    };
    tokio::spawn(prune_records(manager.store_arc(), args.record_retention));
    manager.spawn_metrics_sampler();
    manager.spawn_paused_expiry();
    manager.spawn_pools();
    let shutdown_manager = manager.clone();
    let drain_store = node.as_ref().map(|_| manager.store_arc());
    let destroy_on_exit = args.destroy_on_exit;
    let failed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let failed_in_stop = failed.clone();
    let shutdown = async move {
        tokio::select! {
            _ = wait_for_stop(signals) => {
                if let Some(store) = &drain_store {
                    let store = store.clone();
                    let _ = tokio::task::spawn_blocking(move || crate::cluster::drain(&store)).await;
                }
            }
            gone = helper_exited(helpers) => {
                // Without it the server cannot go on (its sandboxes, its state or its network
                // are gone): stop, and say so, so that a service manager restarts husk.
                eprintln!("husk: {gone}; stopping");
                failed_in_stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        if destroy_on_exit {
            eprintln!(
                "husk: stopping: destroying {} sandbox(es) (--destroy-on-exit); those paused \
                 are kept on disk",
                shutdown_manager.count()
            );
            shutdown_manager.shutdown().await;
        } else {
            let kept = shutdown_manager.stop_keeping().await;
            eprintln!(
                "husk: stopping: {kept} sandbox(es) keep running for the next husk serve on \
                 this state directory (--destroy-on-exit to destroy them)"
            );
        }
    };
    if let Some(tls) = &tls {
        // As with the token file: the helper reads the files this process may not.
        let helper = state_helper.clone();
        tls.spawn_reload(move || {
            let (cert, key) = helper.tls_files().map_err(|e| crate::report::chain(&e))?;
            Ok(husk_server::tls::CertFiles { cert, key })
        });
    }
    husk_server::serve(listener, state, args.conn.limits(), tls.as_ref(), shutdown).await;
    if let Some((stop, task)) = metrics {
        let _ = stop.send(());
        let _ = task.await;
    }
    if args.destroy_on_exit {
        manager.shutdown().await;
    } else {
        manager.stop_keeping().await;
    }
    i32::from(failed.load(std::sync::atomic::Ordering::Relaxed))
}

/// Connections the metrics listener holds at once (all, and from one address): a scraper or
/// two need a few; the bound keeps anyone else who reaches it from holding more.
const METRICS_CONNECTIONS: (usize, usize) = (64, 16);

/// Serves `GET /metrics` on `socket` (`husk_server::prometheus`) until the sender returned is
/// used; says where.
fn serve_metrics(
    socket: std::net::TcpListener,
    manager: Arc<Manager>,
    spawners: usize,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    String,
> {
    let listener = tokio::net::TcpListener::from_std(socket)
        .map_err(|e| format!("--metrics-listen: {}", crate::report::chain(&e)))?;
    let addr = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let router = husk_server::prometheus::router(
        manager,
        husk_server::prometheus::ServerInfo {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            spawners,
        },
    );
    let limits = husk_server::ConnLimits {
        max_connections: METRICS_CONNECTIONS.0,
        max_connections_per_ip: METRICS_CONNECTIONS.1,
        ..husk_server::ConnLimits::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        husk_server::listener::serve(listener, router, limits, None, async move {
            let _ = stopped.await;
        })
        .await
    });
    eprintln!("husk: metrics on http://{addr}/metrics (Prometheus text format, no key)");
    Ok((stop, task))
}

/// A helper the server watches: its name, pid and pidfd.
type Watched = (&'static str, i32, std::os::fd::OwnedFd);

/// Opens the helpers' pidfds (before the server drops its privileges).
fn watch(helpers: Vec<(&'static str, i32)>) -> Vec<Watched> {
    let mut watched = Vec::new();
    for (name, pid) in helpers {
        match husk_runtime::sys::pidfd_open(pid) {
            Ok(fd) => watched.push((name, pid, fd)),
            Err(e) => eprintln!("husk: warning: cannot watch the {name} helper: {e}"),
        }
    }
    watched
}

/// What the server may still read once it is unprivileged: its sandboxes' usage (cgroups),
/// the host's memory (/proc/meminfo), the CPUs the runtime sizes itself by, and the kernel's
/// random devices (a static binary's `getrandom` crate reads /dev/urandom: it cannot look the
/// libc function up).
pub const READABLE: &[&str] = &[
    "/proc",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
];

/// Becomes `user` with no capability, under no_new_privs, Landlock and seccomp
/// (`husk_runtime::fences::server`), and says so.
fn drop_privileges(user: &crate::server_user::ServerUser) -> Result<(), String> {
    let fences = husk_runtime::fences::server::ServerFences::prepare(READABLE).map_err(|e| {
        format!(
            "preparing the server's fences: {}",
            crate::report::chain(&e)
        )
    })?;
    let applied = fences.apply(user.uid, user.gid).map_err(|e| {
        format!(
            "dropping to user {} ({}:{}): {} (name another with --server-user)",
            user.name,
            user.uid,
            user.gid,
            crate::report::chain(&e)
        )
    })?;
    let landlock = match applied.landlock {
        husk_runtime::fences::LandlockState::Enforced { abi } if applied.landlock_complete => {
            format!("Landlock (ABI {abi})")
        }
        husk_runtime::fences::LandlockState::Enforced { abi } => {
            format!("Landlock (ABI {abi}, partly: the kernel lacks newer rights)")
        }
        husk_runtime::fences::LandlockState::Unsupported => {
            eprintln!(
                "husk: warning: this kernel has no Landlock: the server's file access is \
                 bounded by its user's permissions only"
            );
            "no Landlock".into()
        }
    };
    eprintln!(
        "husk: the server runs as {} (uid {}, gid {}) with no capabilities, under seccomp \
         and {landlock}",
        user.name, user.uid, user.gid
    );
    Ok(())
}

/// Waits until one of the helper processes exits, and says which. A thread of its own polls
/// their pidfds (readable once a process has exited); it outlives nothing but this process.
async fn helper_exited(watched: Vec<Watched>) -> String {
    use husk_runtime::libc;
    use std::os::fd::AsRawFd;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let watcher = std::thread::Builder::new()
        .name("husk-helpers".into())
        .spawn(move || {
            let mut fds: Vec<libc::pollfd> = watched
                .iter()
                .map(|(_, _, fd)| libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            if fds.is_empty() {
                return;
            }
            loop {
                match husk_runtime::sys::poll(&mut fds, -1) {
                    Ok(_) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => return,
                }
            }
            if let Some(i) = fds.iter().position(|p| p.revents != 0) {
                let (name, pid, _) = &watched[i];
                let _ = tx.send(format!("the {name} helper (pid {pid}) exited"));
            }
        });
    if let Err(e) = watcher {
        eprintln!("husk: warning: cannot watch the helpers: {e}");
    }
    match rx.await {
        Ok(gone) => gone,
        Err(_) => std::future::pending().await,
    }
}

/// Deletes the records older than `retention`, now and every hour (the state database must not
/// grow without bound).
async fn prune_records(store: Arc<Store>, retention: std::time::Duration) {
    let every = std::time::Duration::from_secs(3600);
    loop {
        // A retention reaching before the store's epoch keeps everything.
        let before = husk_core::store::OffsetDateTime::now_utc()
            .checked_sub(time_duration(retention))
            .filter(|t| t.year() >= 1970);
        let store = store.clone();
        let pruned = tokio::task::spawn_blocking(move || match before {
            Some(before) => store.prune_records(before),
            None => Ok(0),
        });
        match pruned.await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(records = n, "deleted records past their retention"),
            Ok(Err(e)) => tracing::warn!(error = %e, "could not delete old records"),
            Err(e) => tracing::warn!(error = %e, "could not delete old records"),
        }
        tokio::time::sleep(every).await;
    }
}

/// A std duration as the store's (saturating: a retention of centuries keeps everything).
fn time_duration(d: std::time::Duration) -> husk_core::store::TimeDuration {
    husk_core::store::TimeDuration::try_from(d).unwrap_or(husk_core::store::TimeDuration::MAX)
}

/// SIGTERM and SIGINT, caught from the moment this is made: a stop asked for while the
/// server is still starting (taking sandboxes up) is an orderly stop once it has started, never
/// the signal's default action.
pub(crate) fn stop_signals() -> Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)> {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => Some((term, int)),
        // Without signal handlers the server can still be killed; the next start takes up or
        // cleans up what it left.
        _ => None,
    }
}

pub(crate) async fn wait_for_stop(
    signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
) {
    let Some((mut term, mut int)) = signals else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

fn parse_domain(text: &str) -> Result<husk_server::domain::Domain, String> {
    husk_server::domain::Domain::parse(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        conn: ConnArgs,
    }

    #[test]
    fn the_flags_default_to_the_servers_own_limits() {
        let cli = Cli::try_parse_from(["serve"]).unwrap();
        assert_eq!(cli.conn.limits(), husk_server::ConnLimits::default());
    }

    #[test]
    fn the_flags_are_read_and_zero_is_refused() {
        let cli = Cli::try_parse_from([
            "serve",
            "--max-connections",
            "10",
            "--max-connections-per-ip",
            "2",
            "--header-timeout",
            "500ms",
            "--idle-timeout",
            "2m",
        ])
        .unwrap();
        let l = cli.conn.limits();
        assert_eq!((l.max_connections, l.max_connections_per_ip), (10, 2));
        assert_eq!(l.header_timeout, std::time::Duration::from_millis(500));
        assert_eq!(l.idle_timeout, std::time::Duration::from_secs(120));
        assert!(Cli::try_parse_from(["serve", "--max-connections", "0"]).is_err());
        assert!(Cli::try_parse_from(["serve", "--max-connections-per-ip", "-1"]).is_err());
    }
}
