//! `husk run`: one sandbox for one command, stdio passed through, outputs copied back, the
//! sandbox destroyed whatever happens.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use husk_runtime::libc;
use husk_runtime::spawner::Event;
use husk_runtime::sys::{self, ExitStatus};
use husk_runtime::transfer::{self, HostDest, OutputLimits, SkipKind, TransferError};
use husk_runtime::{Fate, MountSpec, Sandbox, SandboxSpec, Spawner, User};

use crate::cli::RunArgs;

pub(crate) mod remote;
use crate::relay::{Fd, OnEof, Pump};
use crate::units::{
    format_duration, format_size, parse_cpus, parse_duration, parse_size, without_controls,
};

/// Exit code for husk's own failures (set-up, bad flags), as docker uses.
pub const EXIT_HUSK_ERROR: i32 = 125;
/// Exit code on timeout, as timeout(1) uses.
pub const EXIT_TIMEOUT: i32 = 124;

/// Validated configuration of one run (phase two, built from the raw flags).
pub struct Config {
    pub spec: SandboxSpec,
    pub timeout: Option<Duration>,
    pub copies: Vec<(PathBuf, PathBuf)>,
    pub outputs: Vec<(PathBuf, PathBuf)>,
    pub output_limits: OutputLimits,
    pub id_file: Option<PathBuf>,
    /// Attach a terminal on stdin (implied by a PTY).
    pub interactive: bool,
    /// `--net` other than `none`: the policy and where its traffic goes out.
    pub net: Option<(husk_net::NetPolicy, husk_net::router::RouterConfig)>,
    /// What the operator lets husk do without (`--unenforced-limits`).
    pub cgroups: husk_runtime::cgroup::CgroupOptions,
}

/// What `--template NAME` means: `host` without touching the state directory, else the
/// registered template (checked: a damaged image is refused here, before any sandbox).
fn resolve_template(name: &str, state_dir: Option<&Path>) -> Result<husk_core::template::Resolved> {
    use husk_core::template::{Resolved, Templates, HOST_TEMPLATE};
    if name == HOST_TEMPLATE {
        return Ok(Resolved {
            name: name.into(),
            ..Resolved::default()
        });
    }
    let dir = state_dir.unwrap_or(Path::new(husk_core::store::DEFAULT_STATE_DIR));
    let store = husk_core::store::Store::open(dir)
        .map_err(|e| anyhow!("--template {name}: state directory {}: {e}", dir.display()))?;
    Templates::new(std::sync::Arc::new(store))
        .resolve(name)
        .map_err(|e| anyhow!("--template: {e}"))
}

fn split_pair<'a>(s: &'a str, what: &str, form: &str) -> Result<(&'a str, &'a str)> {
    match s.split_once(':') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a, b)),
        _ => bail!("invalid {what} {s:?}: expected {form}"),
    }
}

fn absolute_host(p: &str) -> Result<PathBuf> {
    let path = Path::new(p);
    let abs = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir()?.join(path)
    };
    Ok(abs)
}

impl Config {
    /// Turns flags into a validated configuration; every error names the flag and the fix.
    pub fn from_args(a: RunArgs) -> Result<Config> {
        let server_only = [
            ("--secret", !a.job.secrets.is_empty()),
            ("--save", !a.job.saves.is_empty()),
            ("--save-to", a.job.save_to.is_some()),
            ("--file", !a.job.files.is_empty()),
        ];
        if let Some((flag, _)) = server_only.iter().find(|(_, given)| *given) {
            let hint = if *flag == "--file" {
                " (locally, --copy HOST:SANDBOX copies files in)"
            } else {
                ""
            };
            bail!("{flag} needs --server URL: it is a feature of husk serve{hint}");
        }
        let policy = if a.job.net.is_empty() {
            husk_net::NetPolicy::None
        } else {
            husk_net::NetPolicy::from_flags(&a.job.net).map_err(|e| anyhow!("--net: {e}"))?
        };
        let net = match policy {
            husk_net::NetPolicy::None => None,
            p => {
                let run_dir = PathBuf::from(husk_runtime::spawner::DEFAULT_RUN_DIR);
                match a.uplink.config(run_dir).map_err(|e| anyhow!("{e}"))? {
                    Some(cfg) => Some((p, cfg)),
                    None => bail!(
                        "--net {} needs a way out, but --egress is off",
                        a.job.net.join(" --net ")
                    ),
                }
            }
        };
        let mut spec = SandboxSpec::new(a.command);
        spec.tty = a.tty;
        let template_name = a.job.template.as_deref().unwrap_or("host");
        let template = resolve_template(template_name, a.state_dir.as_deref())?;
        spec.rootfs = template.rootfs;
        let defaults = template.defaults;
        spec.user = match a.job.user.as_deref().or(defaults.user.as_deref()) {
            None | Some("user") => User::User,
            Some("root") => User::Root,
            Some(other) => bail!("invalid --user {other:?}: use `user` or `root`"),
        };
        spec.hostname = a.hostname.unwrap_or_else(|| "husk".into());
        spec.workdir = a.job.workdir.or(defaults.workdir.map(PathBuf::from));
        // The template's environment first: a --env of the same name wins.
        spec.env = defaults.env;
        for e in a.job.env {
            let Some((k, v)) = e.split_once('=') else {
                bail!("invalid --env {e:?}: expected KEY=VALUE");
            };
            spec.env.retain(|(name, _)| name != k);
            spec.env.push((k.to_owned(), v.to_owned()));
        }
        let memory = a.job.memory.as_deref().unwrap_or("512M");
        let disk = a.job.disk.as_deref().unwrap_or("1G");
        spec.limits.memory_bytes = parse_size(memory).map_err(|e| anyhow!("--memory: {e}"))?;
        spec.limits.disk_bytes = parse_size(disk).map_err(|e| anyhow!("--disk: {e}"))?;
        spec.limits.cpu_millis =
            parse_cpus(a.job.cpus.as_deref().unwrap_or("1")).map_err(|e| anyhow!("{e}"))?;
        spec.limits.pids = a.job.pids.unwrap_or(256);
        for m in &a.mounts {
            let parts: Vec<&str> = m.split(':').collect();
            let (host, sandbox, writable) = match parts.as_slice() {
                [h, s] => (*h, *s, false),
                [h, s, "rw"] => (*h, *s, true),
                [h, s, "ro"] => (*h, *s, false),
                _ => bail!("invalid --mount {m:?}: expected HOST:SANDBOX[:rw]"),
            };
            let host = absolute_host(host)?;
            let owner = match fs::metadata(&host) {
                Ok(md) => md,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    bail!("--mount {m:?}: source {} does not exist", host.display())
                }
                Err(e) => bail!("--mount {m:?}: source {}: {e}", host.display()),
            };
            // The operator's directory is the sandbox user's (see --mount's help).
            spec.mounts.push(MountSpec {
                host,
                sandbox: PathBuf::from(sandbox),
                writable,
                ids: husk_runtime::MountIds::Owner {
                    uid: owner.uid(),
                    gid: owner.gid(),
                },
            });
        }
        if !a.job.workspaces.is_empty() {
            let dir = a
                .state_dir
                .as_deref()
                .unwrap_or(Path::new(husk_core::store::DEFAULT_STATE_DIR));
            let team = a.team.as_deref().unwrap_or("default");
            let all = husk_core::workspaces::Workspaces::open(dir)
                .map_err(|e| anyhow!("--workspace: state directory {}: {e}", dir.display()))?;
            for notice in all.notices() {
                eprintln!("husk: warning: {notice}");
            }
            for w in &a.job.workspaces {
                let ws = remote::parse_workspace(w)?;
                let host = all
                    .dir(team, &ws.name)
                    .map_err(|e| anyhow!("--workspace {w:?}: {e} (team {team})"))?;
                let writable = ws.mode.as_deref() == Some("rw");
                let sandbox = ws.path.unwrap_or_else(|| format!("/workspace/{}", ws.name));
                // Id-mapped: the workspace's files (owned by the workspace owner) are the
                // sandbox user's, and what the sandbox writes stays the workspace's.
                spec.mounts.push(MountSpec {
                    host,
                    sandbox: PathBuf::from(sandbox),
                    writable,
                    ids: husk_runtime::MountIds::Shared,
                });
            }
        } else if a.team.is_some() {
            bail!("--team is for --workspace (the team whose workspaces are mounted)");
        }
        let mut copies = Vec::new();
        for c in &a.copies {
            let (h, s) = split_pair(c, "--copy", "HOST:SANDBOX")?;
            let host = absolute_host(h)?;
            if !host.exists() {
                bail!("--copy {c:?}: source {} does not exist", host.display());
            }
            if !s.starts_with('/') {
                bail!("--copy {c:?}: the sandbox path must be absolute");
            }
            copies.push((host, PathBuf::from(s)));
        }
        let mut outputs = Vec::new();
        for o in &a.outputs {
            let (s, h) = split_pair(o, "--output", "SANDBOX_DIR:HOST_DIR")?;
            if !s.starts_with('/') {
                bail!("--output {o:?}: the sandbox path must be absolute");
            }
            outputs.push((PathBuf::from(s), absolute_host(h)?));
        }
        let output_limits =
            parse_output_limit(a.job.output_limit.as_deref().unwrap_or("1G:10000"))?;
        let timeout = a
            .job
            .timeout
            .as_deref()
            .map(parse_duration)
            .transpose()
            .map_err(|e| anyhow!("--timeout: {e}"))?;
        spec.timeout = timeout;
        // Nothing to copy in: the command may start the moment the sandbox is ready. Not with a
        // network: its services (the resolver, the proxy, the denial log's NFLOG binding) start
        // only once the sandbox exists (they start threads, which the fork must not see), and a
        // command that ran before them would have its first refusals go unlogged (a race that
        // lost `--net`'s denial reports about one run in three).
        spec.autostart = a.copies.is_empty() && a.job.net.is_empty();
        if spec.tty {
            spec.tty_size = husk_runtime::pty::window_size(io::stdout().as_fd())
                .or_else(|| husk_runtime::pty::window_size(io::stdin().as_fd()));
        }
        Ok(Config {
            spec,
            timeout,
            copies,
            outputs,
            output_limits,
            id_file: a.id_file,
            interactive: a.interactive || a.tty,
            net,
            cgroups: a.host.cgroups(),
        })
    }
}

/// `--output-limit SIZE[:FILES]`.
pub(crate) fn parse_output_limit(text: &str) -> Result<OutputLimits> {
    let (size, files) = match text.split_once(':') {
        Some((s, f)) => (s, Some(f)),
        None => (text, None),
    };
    let mut limits = OutputLimits {
        max_bytes: parse_size(size).map_err(|e| anyhow!("--output-limit: {e}"))?,
        ..OutputLimits::default()
    };
    if let Some(f) = files {
        limits.max_files = f
            .parse()
            .map_err(|_| anyhow!("invalid --output-limit file count {f:?}"))?;
    }
    Ok(limits)
}

/// Entry point: returns the process exit code.
pub fn main(args: RunArgs) -> i32 {
    if args.server.is_some() {
        return remote::main(args);
    }
    let result = Config::from_args(args).and_then(run);
    match result {
        Ok(code) => code,
        Err(e) => {
            // Error messages can carry names from inside the sandbox (say escapes them).
            crate::report::say(&crate::report::anyhow(&e));
            EXIT_HUSK_ERROR
        }
    }
}

/// The signals a process that stands in for a sandboxed command (`husk run`, the sandbox's
/// `sudo`) takes and forwards to it: what a terminal, a parent or a service manager sends.
pub(crate) const HANDLED_SIGNALS: &[libc::c_int] = &[
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

fn host_fd(i: i32) -> BorrowedFd<'static> {
    sys::stdio_fd(i)
}

/// Runs the configured sandbox to its end; returns the exit code.
pub fn run(mut cfg: Config) -> Result<i32> {
    // Block the signals first, so a Ctrl-C during set-up is still handled by destroying the
    // sandbox rather than leaving it behind.
    let sigfd = sys::signalfd(HANDLED_SIGNALS).context("signalfd")?;
    // Put in the background, husk must not be stopped by its terminal (the timeout has to keep
    // running): a read there then fails (EIO), which ends the stdin relay; writes go through.
    sys::ignore_signal(libc::SIGTTIN);
    sys::ignore_signal(libc::SIGTTOU);
    let spawner = Spawner::with_options(
        Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR),
        &cfg.cgroups,
    )
    .map_err(|e| {
        anyhow!(
            "{:#}\nhusk: {}",
            anyhow::Error::from(e),
            crate::doctor::HINT
        )
    })?;
    if !cfg.cgroups.unenforced.is_empty() {
        eprintln!("husk: {}", spawner.cgroup_summary());
    }
    // The router and the sandbox's link are made before the sandbox, without any thread (the
    // spawner forks); the resolver and proxy start once it exists.
    let net = match cfg.net.take() {
        Some((policy, rcfg)) => {
            let router = husk_net::router::Router::start(rcfg).context("--net")?;
            let link = router.attach(policy, None).context("--net")?;
            cfg.spec.network = husk_runtime::NetworkMode::Joined {
                nameserver: link.gateway(),
            };
            Some((router, link))
        }
        None => None,
    };

    // stdio: only pipes and /dev/null pass straight through. Anything else is relayed through
    // pipes (or the PTY): a host terminal would hand the sandbox its ioctls, a socket the host's
    // network namespace, a file the power to rewrite it.
    let mut pumps: Vec<Pump> = Vec::new();
    let mut sandbox_ends: Vec<OwnedFd> = Vec::new();
    let devnull = husk_runtime::sys::open(c"/dev/null", libc::O_RDWR, 0)?;
    let mut stdio: [BorrowedFd<'_>; 3] = [host_fd(0), host_fd(1), host_fd(2)];
    let mut relays: Vec<(i32, Rc<OwnedFd>)> = Vec::new();
    if cfg.spec.tty {
        stdio = [devnull.as_fd(), devnull.as_fd(), devnull.as_fd()];
    } else {
        // A terminal on stdin is attached only when asked for (-i), as in docker: otherwise
        // typeahead meant for the next program would go to the sandbox.
        if sys::isatty(0) && !cfg.interactive {
            stdio[0] = devnull.as_fd();
        }
        for i in 0..3 {
            if stdio[i as usize].as_raw_fd() == i && !sys::passable_stdio(i) {
                let (r, w) = sys::pipe()?;
                let (ours, theirs) = if i == 0 { (w, r) } else { (r, w) };
                relays.push((i, Rc::new(ours)));
                sandbox_ends.push(theirs);
            }
        }
        for (k, (i, _)) in relays.iter().enumerate() {
            stdio[*i as usize] = sandbox_ends[k].as_fd();
        }
    }
    // Host paths are resolved before the sandbox exists: a sandbox that can write along one of
    // them (a `:rw` mount) must not be able to swap a component for a symlink first.
    let dests = cfg
        .outputs
        .iter()
        .map(|(_, host)| {
            HostDest::open(host).with_context(|| format!("--output {}", host.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut id_file = match &cfg.id_file {
        Some(path) => Some(
            std::fs::File::create(path).with_context(|| format!("--id-file {}", path.display()))?,
        ),
        None => None,
    };
    let joined = match &net {
        Some((_, link)) => Some(link.netns.fd().try_clone_to_owned()?),
        None => None,
    };
    let mut sandbox = spawner.create_in(&cfg.spec, Some(stdio), joined)?;
    let net = match net {
        Some((router, link)) => Some(LocalNet::serve(router, link)?),
        None => None,
    };
    drop(sandbox_ends);
    for (i, fd) in relays {
        pumps.push(if i == 0 {
            Pump::new(Fd::Host(host_fd(0)), Fd::Owned(fd), OnEof::Close)?
        } else {
            Pump::new(Fd::Owned(fd), Fd::Host(host_fd(i)), OnEof::Keep)?
        });
    }
    if let Some(f) = &mut id_file {
        writeln!(f, "{}", sandbox.id()).context("--id-file")?;
    }
    copy_in(&sandbox, &cfg)?;

    let mut pty: Option<Rc<OwnedFd>> = None;
    let mut _raw = None;
    if cfg.spec.tty {
        let master = Rc::new(
            sandbox
                .take_pty()
                .ok_or_else(|| anyhow!("sandbox gave no PTY"))?,
        );
        // Raw mode only for a terminal husk owns right now (not when started in the background).
        if sys::isatty(0) && sys::is_foreground(host_fd(0)) {
            _raw = Some(husk_runtime::pty::RawMode::enable(host_fd(0))?);
        }
        // End of input becomes the terminal's end-of-file character (^D), as typed.
        pumps.push(Pump::new(
            Fd::Host(host_fd(0)),
            Fd::Owned(master.clone()),
            OnEof::Send(0x04),
        )?);
        pumps.push(Pump::new(
            Fd::Owned(master.clone()),
            Fd::Host(host_fd(1)),
            OnEof::Keep,
        )?);
        pty = Some(master);
    }

    sandbox.start().context("start command")?;
    let deadline = cfg.timeout.map(|t| Instant::now() + t);
    let ending = event_loop(&mut sandbox, &sigfd, &mut pumps, pty.as_deref(), deadline)?;
    // Output the command wrote before it ended still goes out, within a bound per stream (a
    // stalled stdout must not cost stderr's tail, often the error message).
    for p in &mut pumps {
        p.drain(Instant::now() + Duration::from_secs(1));
    }
    drop(pumps);
    drop(_raw);
    let mut notes = Vec::new();
    let outputs = copy_outputs(&sandbox, &cfg, &dests, &mut notes);
    sandbox.destroy()?;
    for note in notes {
        eprintln!("{note}");
    }
    if let Some(net) = net {
        net.finish();
    }
    let code = report(ending, &cfg);
    outputs?;
    Ok(code)
}

/// A local run's network: the router's services on a small runtime of their own (the run's
/// loop is not async), and the sandbox's link.
struct LocalNet {
    runtime: tokio::runtime::Runtime,
    service: husk_net::service::NetService,
    link: husk_net::router::Attachment,
}

/// Denied connections `husk run` lists at the end (the rest are counted).
const SHOWN_DENIALS: usize = 20;

impl LocalNet {
    fn serve(
        router: husk_net::router::Router,
        link: husk_net::router::Attachment,
    ) -> Result<LocalNet> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .context("--net: async runtime")?;
        let service = {
            let _in = runtime.enter();
            husk_net::service::NetService::serve(router).context("--net")?
        };
        Ok(LocalNet {
            runtime,
            service,
            link,
        })
    }

    /// Reports what the policy refused, and removes the link and the router.
    fn finish(self) {
        self.service.sync_log(Duration::from_millis(500));
        let denials = self.link.net.denials();
        for d in denials.iter().take(SHOWN_DENIALS) {
            eprintln!("husk: {}", husk_net::sandboxes::describe(d));
        }
        if denials.len() > SHOWN_DENIALS {
            eprintln!(
                "husk: ... and {} more denied connections",
                denials.len() - SHOWN_DENIALS
            );
        }
        drop(self.link);
        self.service.shutdown();
        drop(self.service);
        self.runtime.shutdown_background();
    }
}

/// How long a command may go on after a forwarded SIGINT/SIGTERM/SIGHUP/SIGQUIT before husk
/// destroys the sandbox anyway (docker stop's default grace period).
const STOP_GRACE: Duration = Duration::from_secs(10);

/// How the run ended, seen from the event loop.
enum Ending {
    Fate(Fate),
    /// A stop signal was forwarded, and the command then ignored a second one or the grace
    /// period: husk gave up on it.
    Stopped {
        signal: i32,
        second: bool,
    },
    /// The reader of husk's output went away (like SIGPIPE in a pipeline).
    OutputGone,
}

fn event_loop(
    sandbox: &mut Sandbox,
    sigfd: &OwnedFd,
    pumps: &mut [Pump],
    pty: Option<&OwnedFd>,
    deadline: Option<Instant>,
) -> Result<Ending> {
    // The first stop signal is forwarded; the sandbox cannot keep husk alive by ignoring it.
    let mut stopping: Option<(i32, Instant)> = None;
    loop {
        let control = sandbox
            .control_fd()
            .ok_or_else(|| anyhow!("sandbox lost its control channel"))?
            .as_raw_fd();
        let mut fds = vec![
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: control,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let mut owners = Vec::new();
        for (i, p) in pumps.iter().enumerate() {
            if let Some(pfd) = p.interest() {
                fds.push(pfd);
                owners.push(i);
            }
        }
        if let Some((signal, until)) = stopping {
            if Instant::now() >= until {
                return Ok(Ending::Stopped {
                    signal,
                    second: false,
                });
            }
        }
        let wake = match (deadline, stopping) {
            (Some(d), Some((_, g))) => Some(d.min(g)),
            (d, g) => d.or(g.map(|(_, g)| g)),
        };
        let timeout = match wake {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() && deadline.is_some_and(|d| Instant::now() >= d) {
                    return Ok(Ending::Fate(Fate::TimedOut));
                }
                // Round up so the loop does not spin in the last millisecond.
                (left.as_micros().div_ceil(1000)).min(i32::MAX as u128) as i32
            }
        };
        match sys::poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
        if fds[0].revents != 0 {
            while let Some(sig) = sys::read_signalfd(sigfd.as_fd())? {
                match (sig, pty) {
                    (libc::SIGWINCH, Some(m)) => {
                        if let Some((r, c)) = husk_runtime::pty::window_size(host_fd(1)) {
                            let _ = husk_runtime::pty::set_window_size(m.as_fd(), r, c);
                        }
                    }
                    (libc::SIGWINCH, None) => {}
                    (libc::SIGINT | libc::SIGTERM | libc::SIGHUP | libc::SIGQUIT, _) => {
                        if stopping.is_some() {
                            return Ok(Ending::Stopped {
                                signal: sig,
                                second: true,
                            });
                        }
                        stopping = Some((sig, Instant::now() + STOP_GRACE));
                        let _ = sandbox.signal(sig);
                    }
                    _ => {
                        let _ = sandbox.signal(sig);
                    }
                }
            }
        }
        for (k, &i) in owners.iter().enumerate() {
            pumps[i].step(fds[k + 2].revents);
        }
        if pumps.iter().any(Pump::host_reader_gone) {
            return Ok(Ending::OutputGone);
        }
        if fds[1].revents != 0 {
            if let Event::Done(fate) = sandbox.next_event(false)? {
                return Ok(Ending::Fate(fate));
            }
        }
    }
}

fn copy_in(sandbox: &Sandbox, cfg: &Config) -> Result<()> {
    if cfg.copies.is_empty() {
        return Ok(());
    }
    let root = sandbox.root_dir().context("open sandbox root")?;
    let id = sandbox.host_uid_base() + cfg.spec.user.id();
    for (host, dest) in &cfg.copies {
        transfer::copy_in(host, root.as_fd(), dest, (id, id))
            .with_context(|| format!("--copy {} -> {}", host.display(), dest.display()))?;
    }
    Ok(())
}

/// Freezes the sandbox and copies every `--output`. What was skipped is returned as lines to
/// print once the sandbox is gone (a stalled stderr must not keep a frozen sandbox alive).
fn copy_outputs(
    sandbox: &Sandbox,
    cfg: &Config,
    dests: &[HostDest],
    notes: &mut Vec<String>,
) -> Result<()> {
    if cfg.outputs.is_empty() {
        return Ok(());
    }
    sandbox.freeze().context("freeze sandbox for output copy")?;
    let root = sandbox.root_dir().context("open sandbox root")?;
    let mut left = cfg.output_limits;
    for ((src, _), dest) in cfg.outputs.iter().zip(dests) {
        match transfer::copy_out(root.as_fd(), src, dest, &left) {
            Ok(report) => {
                for s in &report.skipped {
                    let what = match &s.kind {
                        SkipKind::Symlink { target } => format!("symlink -> {}", printable(target)),
                        SkipKind::Device => "device".into(),
                        SkipKind::Fifo => "fifo".into(),
                        SkipKind::Socket => "socket".into(),
                    };
                    notes.push(format!(
                        "husk: output {}: skipped {} ({what}, not copied)",
                        src.display(),
                        printable(&s.path.to_string_lossy())
                    ));
                }
                if report.skipped_more > 0 {
                    notes.push(format!(
                        "husk: output {}: {} more entries skipped (not copied)",
                        src.display(),
                        report.skipped_more
                    ));
                }
                // The entry limit counts every entry the copy handled, like copy_out does.
                let entries =
                    report.files + report.dirs + report.skipped.len() as u64 + report.skipped_more;
                left.max_bytes -= report.bytes.min(left.max_bytes);
                left.max_files -= entries.min(left.max_files);
            }
            Err(e @ TransferError::LimitExceeded { .. }) => {
                return Err(anyhow::Error::new(e).context(format!("output {}", src.display())))
            }
            Err(e) => {
                let what = format!("output {} -> {}", src.display(), dest.path().display());
                return Err(anyhow::Error::new(e).context(what));
            }
        }
    }
    Ok(())
}

/// A name chosen inside the sandbox, made safe to print on the host's terminal: control
/// characters escaped (no forged husk lines, no terminal escape sequences), length capped.
fn printable(name: &str) -> String {
    const MAX: usize = 200;
    let mut out = without_controls(&name.chars().take(MAX).collect::<String>());
    if name.chars().nth(MAX).is_some() {
        out.push('…');
    }
    out
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSYS => "SIGSYS",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

/// Prints how the run ended (when it is not a plain exit) and returns husk's exit code.
fn report(ending: Ending, cfg: &Config) -> i32 {
    let fate = match ending {
        Ending::Fate(fate) => fate,
        Ending::Stopped { signal, second } => {
            let why = if second {
                format!("second {}", signal_name(signal))
            } else {
                format!(
                    "still running {} after {}",
                    format_duration(STOP_GRACE),
                    signal_name(signal)
                )
            };
            eprintln!("husk: killed: {why}");
            return 128 + signal;
        }
        // Quietly, as a shell's SIGPIPE.
        Ending::OutputGone => return 128 + libc::SIGPIPE,
    };
    let prog = cfg
        .spec
        .command
        .as_ref()
        .and_then(|c| c.first())
        .cloned()
        .unwrap_or_default();
    let mut err = io::stderr().lock();
    match fate {
        Fate::Exited(ExitStatus::Exited(code)) => code,
        Fate::Exited(ExitStatus::Signaled(sig)) => {
            // Like a shell: a pipe closed by the reader or an interrupt the user typed needs
            // no explanation; anything else does.
            if sig != libc::SIGPIPE && sig != libc::SIGINT {
                let _ = writeln!(err, "husk: killed: {}", signal_name(sig));
            }
            128 + sig
        }
        Fate::OutOfMemory {
            limit_bytes,
            files_bytes,
        } => {
            // The cgroup holds the files kept in RAM on top of the processes' limit, so that
            // a full disk is ENOSPC, never an OOM kill: say both figures.
            let _ = writeln!(
                err,
                "husk: killed: out of memory (limit {}, plus {} for files in memory)",
                format_size(limit_bytes),
                format_size(files_bytes)
            );
            128 + libc::SIGKILL
        }
        Fate::TimedOut => {
            let t = cfg.timeout.map(format_duration).unwrap_or_default();
            let _ = writeln!(err, "husk: killed: timeout after {t}");
            EXIT_TIMEOUT
        }
        Fate::ExecFailed(errno) => {
            let (why, code) = match errno {
                libc::ENOENT => ("command not found in the sandbox".to_owned(), 127),
                libc::EACCES => ("permission denied".to_owned(), 126),
                libc::ENOEXEC => ("not an executable format".to_owned(), 126),
                e => (io::Error::from_raw_os_error(e).to_string(), 126),
            };
            let _ = writeln!(err, "husk: cannot run {prog:?}: {why}");
            code
        }
        Fate::InitDied => {
            let _ = writeln!(err, "husk: the sandbox's init process died unexpectedly");
            EXIT_HUSK_ERROR
        }
    }
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn sandbox_names_are_printed_without_control_characters() {
        let forged = "b\n\u{1b}[1Ahusk: all outputs copied";
        let p = printable(forged);
        assert!(!p.chars().any(char::is_control), "{p:?}");
        assert!(p.contains("\\n") && p.contains("\\u{1b}"), "{p}");
        let long = "x".repeat(10_000);
        assert!(printable(&long).chars().count() <= 201);
        assert_eq!(printable("plain/name.txt"), "plain/name.txt");
    }
}
