//! Command-line flags (phase one of configuration: raw flags; `run::Config` is phase two).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// husk: run untrusted code in disposable, isolated Linux sandboxes.
#[derive(Parser, Debug)]
#[command(name = "husk", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What `husk run` says of itself, in `husk --help` and `husk run --help` alike.
/// (No closing period: clap drops it from a doc comment's summary, as for the other commands.)
const RUN_ABOUT: &str = "Run one command in a fresh sandbox; the sandbox is destroyed when it ends";

#[derive(Subcommand, Debug)]
pub enum Command {
    #[command(about = RUN_ABOUT)]
    Run(Box<RunArgs>),
    /// Serve the E2B-compatible API: sandboxes for the stock E2B SDKs and husk's own clients.
    Serve(Box<crate::serve::ServeArgs>),
    /// Serve as one node of a husk cluster: `husk serve` with its state in PostgreSQL,
    /// reached by the cluster's gateways only (see `husk gateway`).
    Node(Box<crate::cluster::NodeArgs>),
    /// Serve a cluster's E2B endpoint: authenticate, place sandboxes on nodes, route every
    /// request to the node that holds its sandbox. Stateless: run as many as you like.
    Gateway(Box<crate::cluster::GatewayArgs>),
    /// A cluster's nodes, in its database: list them, drain one, make it ready again.
    Cluster(crate::cluster_admin::ClusterArgs),
    /// Run one command per input on a husk server, in parallel, with a summary.
    Batch(Box<crate::batch::BatchArgs>),
    /// Manage API keys (and teams' sandbox quotas) in the server's state directory.
    Key(crate::keys::KeyArgs),
    /// Store, list and remove teams' secrets (encrypted at rest), and rotate the master key.
    Secret(crate::secret::SecretArgs),
    /// Look at a server's sandboxes: `husk sandbox logs ID` shows its denied connections.
    Sandbox(crate::sandbox::SandboxArgs),
    /// Persistent per-team workspaces: create, list, remove, and move files in and out.
    Workspace(crate::workspace::WorkspaceArgs),
    /// Build, list, inspect, remove and export templates (sandbox root file systems).
    Template(crate::template::TemplateArgs),
    /// Measure sandbox start-up, throughput and density against bubblewrap.
    Bench(BenchArgs),
    /// Check whether this host can run husk: every kernel feature, cgroups, tools, and what
    /// to do about what is missing. Exit code 1 when something required is missing.
    Doctor(crate::doctor::DoctorArgs),
    /// (internal) a benchmark worker process.
    #[command(hide = true, name = "__bench-worker")]
    BenchWorker(WorkerArgs),
}

/// `husk run` parsed on its own, with the same flags, help and errors as through [`Cli`].
///
/// clap builds a derived parser's whole tree (every subcommand's every flag, with their help)
/// before it parses: for `husk run` that was about 100 page faults and 0.28 ms of a one-shot
/// run spent on the other commands' flags (design §18). `main` takes this path when the first
/// argument is `run`; a test holds the two parsers to the same help, results and errors.
#[derive(Parser, Debug)]
#[command(name = "husk-run", bin_name = "husk run", about = RUN_ABOUT, long_about = None)]
pub struct RunCli {
    #[command(flatten)]
    pub args: RunArgs,
}

impl RunCli {
    /// Parses `husk run ARGS…` when `argv` is that (`None` otherwise, for [`Cli`]); exits with
    /// clap's message and code on an error or `--help`, as [`Cli::parse`] does.
    pub fn parse_if_run(argv: &[std::ffi::OsString]) -> Option<RunArgs> {
        if argv.get(1).map(|a| a.as_os_str()) != Some("run".as_ref()) {
            return None;
        }
        let rest = std::iter::once(std::ffi::OsString::from("husk run"))
            .chain(argv.iter().skip(2).cloned());
        Some(RunCli::parse_from(rest).args)
    }
}

#[derive(Args, Debug, Default)]
pub struct RunArgs {
    /// Give the command a pseudo-terminal (interactive shells); implies -i.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Attach a terminal on stdin to the command (pipes and files are always attached).
    #[arg(short = 'i', long)]
    pub interactive: bool,
    // What runs (shared with `husk batch`).
    #[command(flatten)]
    pub job: JobArgs,
    /// State directory: built templates, workspaces, and the admin key used with --server when
    /// no key is in the environment [default: /var/lib/husk].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    // Where --net traffic goes out (local runs).
    #[command(flatten)]
    pub uplink: crate::egress::UplinkArgs,
    /// Hostname inside the sandbox [default: husk].
    #[arg(long, value_name = "NAME")]
    pub hostname: Option<String>,
    /// Run on this husk server (POST /husk/v1/runs) instead of in a local sandbox. The key
    /// comes from HUSK_API_KEY, else E2B_API_KEY, else STATE_DIR/admin.key.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Team whose workspaces a local run mounts (with --server, the key's team).
    #[arg(long, value_name = "TEAM")]
    pub team: Option<String>,
    /// Bind-mount a host path, read-only unless `:rw` (always nosuid, nodev; repeatable).
    /// Inside, the path's owner on the host is the sandbox's user (`user`, or `root` with
    /// -u root), and what that user writes belongs to the owner on the host; files of other
    /// host users show as `nobody` and the sandbox cannot write as them. On a file system the
    /// kernel cannot id-map (tmpfs before Linux 6.3), every host id shows as `nobody`.
    #[arg(short = 'v', long = "mount", value_name = "HOST:SANDBOX[:rw]")]
    pub mounts: Vec<String>,
    /// Copy a host file or directory into the sandbox's writable layer (repeatable).
    #[arg(long = "copy", value_name = "HOST:SANDBOX")]
    pub copies: Vec<String>,
    /// After the command ends, copy regular files under SANDBOX_DIR to HOST_DIR (repeatable).
    #[arg(short = 'o', long = "output", value_name = "SANDBOX_DIR:HOST_DIR")]
    pub outputs: Vec<String>,
    /// Write the sandbox id to this file once it exists.
    #[arg(long, value_name = "PATH")]
    pub id_file: Option<PathBuf>,
    #[command(flatten)]
    pub host: HostArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// What the host may lack, by the operator's choice (`husk run`, `husk serve`, template builds).
#[derive(Args, Debug, Default, Clone)]
pub struct HostArgs {
    /// Run even where the host does not give husk these cgroup controllers (comma-separated:
    /// memory, pids, cpu), without the limits they enforce. Without this flag husk refuses to
    /// start where it cannot enforce a limit; with it, it says at start what is not enforced.
    #[arg(long, value_name = "CONTROLLERS", value_delimiter = ',', value_parser = parse_controller)]
    pub unenforced_limits: Vec<husk_runtime::cgroup::Controller>,
}

/// How long the systemd scope husk processes share outlives the last of them: 60 s, or
/// `HUSK_SCOPE_LINGER` (a duration such as `10s`; `0` gives each husk process a scope of its
/// own, as before sharing existed). A value that does not parse is said and the default kept.
pub(crate) fn shared_scope_linger(env: Option<String>) -> Option<std::time::Duration> {
    const DEFAULT: std::time::Duration = std::time::Duration::from_secs(60);
    let v = env.as_deref().map(str::trim).unwrap_or("");
    if v.is_empty() {
        return Some(DEFAULT);
    }
    let zero = v
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        .parse::<f64>()
        .is_ok_and(|n| n == 0.0);
    if zero {
        return None;
    }
    match crate::units::parse_duration(v) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("husk: HUSK_SCOPE_LINGER: {e}; using 60s");
            Some(DEFAULT)
        }
    }
}

fn parse_controller(s: &str) -> Result<husk_runtime::cgroup::Controller, String> {
    s.trim().parse()
}

impl HostArgs {
    /// The runtime's cgroup options.
    pub fn cgroups(&self) -> husk_runtime::cgroup::CgroupOptions {
        husk_runtime::cgroup::CgroupOptions {
            unenforced: self.unenforced_limits.clone(),
            own_scope: false,
            shared_scope_linger: shared_scope_linger(std::env::var("HUSK_SCOPE_LINGER").ok()),
        }
    }
}

/// The flags of what runs, shared by `husk run` and `husk batch` (whose help says them of every
/// item: `batch::ITEM_HELP`); `JobArgs::spec` turns them into a run spec for a server.
#[derive(Args, Debug, Default)]
pub struct JobArgs {
    /// Environment variable for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// Working directory inside the sandbox [default: the user's home].
    #[arg(short = 'w', long, value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// User inside the sandbox: `user` (uid 1000, no capabilities) or `root` [default: the
    /// template's, else user].
    #[arg(short = 'u', long, value_name = "user|root")]
    pub user: Option<String>,
    /// Template: `host` (the host's /usr) or a built template's name [default: host; with
    /// --server, the server's default (`base`)].
    #[arg(short = 'T', long, value_name = "NAME")]
    pub template: Option<String>,
    /// Kill the sandbox after this long (e.g. 30s, 500ms, 5m) [default: no timeout; with
    /// --server, the server's default (300 s)].
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
    /// Memory for the sandbox's processes, no swap; its disk (/dev/shm included), held in RAM,
    /// comes on top [default: 512M; with --server, the server's].
    #[arg(short = 'm', long, value_name = "SIZE")]
    pub memory: Option<String>,
    /// CPU quota in CPUs (e.g. 0.5, 2) [default: 1; with --server, the server's].
    #[arg(long, value_name = "N")]
    pub cpus: Option<String>,
    /// Maximum number of processes and threads [default: 256; with --server, the server's].
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// Size of the writable layer, held in RAM on top of --memory [default: 1G; with --server,
    /// the server's].
    #[arg(long, value_name = "SIZE")]
    pub disk: Option<String>,
    /// Mount a workspace at /workspace/NAME (or at PATH), read-only unless `:rw`
    /// (repeatable). Locally, the workspace of --team in the state directory.
    #[arg(long = "workspace", value_name = "NAME[:rw][@PATH]")]
    pub workspaces: Vec<String>,
    /// (--server) Give the command the team's secret NAME as the environment variable NAME,
    /// masked as **** in its output (repeatable).
    #[arg(long = "secret", value_name = "NAME")]
    pub secrets: Vec<String>,
    /// (--server) After the command ends, save this sandbox path (file or directory) into a
    /// workspace under runs/<run-id>/ (repeatable).
    #[arg(long = "save", value_name = "PATH")]
    pub saves: Vec<String>,
    /// (--server) The workspace --save goes to [default: the first --workspace].
    #[arg(long, value_name = "NAME")]
    pub save_to: Option<String>,
    /// (--server) Send a local file along, written to DEST in the sandbox (relative to the
    /// workdir) before the command starts [default DEST: the file's name] (repeatable).
    #[arg(long = "file", value_name = "LOCAL[:DEST]")]
    pub files: Vec<String>,
    /// Limit of copied outputs (--output, --save), in total: size, optionally with a file
    /// count [default: 1G:10000].
    #[arg(long, value_name = "SIZE[:FILES]")]
    pub output_limit: Option<String>,
    /// Network: `none` (loopback only), `internet`, `allow=LIST`, `deny=LIST` (LIST: CIDRs
    /// and domains like pypi.org or *.example.com, comma-separated; allow beats deny; an allow
    /// list alone allows only what it names). Private, host and metadata addresses are never
    /// reachable. Repeatable [default: none locally; the server's default with --server].
    #[arg(long = "net", value_name = "POLICY")]
    pub net: Vec<String>,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// One-shot runs per contender (husk run, bwrap), and sequential creates for the latency.
    #[arg(long, default_value_t = 200)]
    pub runs: usize,
    /// Parallel workers for the throughput figures [default: number of CPUs].
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Seconds each creates-per-second worker runs.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Idle sandboxes kept alive for the memory figure.
    #[arg(long, default_value_t = 500)]
    pub idle: usize,
    /// Also compare sandboxes from this built template with the host template: create →
    /// ready and one-shot runs, interleaved, and the template's image size.
    #[arg(long, value_name = "NAME")]
    pub template: Option<String>,
    /// State directory the template is registered in [default: /var/lib/husk].
    #[arg(long, value_name = "DIR", requires = "template")]
    pub state_dir: Option<PathBuf>,
    /// Measure only these figures (repeatable; default: all).
    #[arg(long, value_enum, value_name = "FIGURE")]
    pub only: Vec<BenchFigure>,
    /// Another husk binary (an earlier build, a variant) whose one-shot runs interleaved with
    /// this one's: a before and after in one run.
    #[arg(long, value_name = "PATH")]
    pub beside: Option<PathBuf>,
}

/// The figures `husk bench` measures, in the order it measures them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BenchFigure {
    /// `husk run -- true` against bubblewrap.
    Oneshot,
    /// Create → ready and destroy of one idle sandbox (and `--template`'s).
    Latency,
    /// Creates per second from parallel workers.
    Throughput,
    /// Host memory per idle sandbox, and creates per second as they accumulate.
    Density,
    /// Sandboxes with a network against ones without.
    Network,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Seconds to keep creating sandboxes.
    #[arg(long)]
    pub seconds: f64,
    /// `create` (idle sandboxes) or `cycle` (run `true` in each).
    #[arg(long, default_value = "create")]
    pub mode: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_scope_lingers_a_minute_unless_told_otherwise() {
        let secs = |v: Option<&str>| shared_scope_linger(v.map(str::to_owned));
        let s = std::time::Duration::from_secs;
        assert_eq!(secs(None), Some(s(60)));
        assert_eq!(secs(Some("")), Some(s(60)));
        assert_eq!(secs(Some("5s")), Some(s(5)));
        assert_eq!(secs(Some(" 2m ")), Some(s(120)));
        assert_eq!(
            secs(Some("250ms")),
            Some(std::time::Duration::from_millis(250))
        );
        // Zero, in any unit, is a scope per process.
        for zero in ["0", "0s", "0ms", "0.0"] {
            assert_eq!(secs(Some(zero)), None, "{zero}");
        }
        // What does not parse keeps the default (and is said on stderr).
        for bad in ["soon", "-5s", "5 parsecs"] {
            assert_eq!(secs(Some(bad)), Some(s(60)), "{bad}");
        }
    }

    /// What a parse of `husk run ARGS` gave: the flags, or clap's message, kind and exit code.
    fn outcome(r: Result<RunArgs, clap::Error>) -> String {
        match r {
            Ok(args) => format!("ok {args:?}"),
            Err(e) => format!(
                "{:?} exit {}: {}\n{}",
                e.kind(),
                e.exit_code(),
                e.render(),
                e.render().ansi()
            ),
        }
    }

    fn through_cli(args: &[&str]) -> String {
        let argv = ["husk", "run"].iter().chain(args);
        outcome(Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Run(args) => *args,
            other => panic!("parsed as {other:?}"),
        }))
    }

    fn alone(args: &[&str]) -> String {
        let argv = ["husk run"].iter().chain(args);
        outcome(RunCli::try_parse_from(argv).map(|c| c.args))
    }

    #[test]
    fn husk_run_parsed_alone_gives_what_the_whole_cli_gives() {
        let cases: &[&[&str]] = &[
            &["--", "true"],
            &["-t", "-i", "--hostname", "box", "--", "sh", "-c", "echo hi"],
            &[
                "-v",
                "/a:/b:rw",
                "--mount",
                "/c:/d",
                "--copy",
                "/e:/f",
                "-o",
                "/out:/tmp/x",
                "--id-file",
                "/tmp/id",
                "--state-dir",
                "/tmp/state",
                "--team",
                "acme",
                "--unenforced-limits",
                "memory,cpu",
                "--",
                "python3",
                "-c",
                "print(1)",
            ],
            &["--server", "http://127.0.0.1:1", "--", "true"],
            // Errors and help: the same text, kind and exit code.
            &[],
            &["true"],
            &["--bogus", "--", "true"],
            &["--unenforced-limits", "nope", "--", "true"],
            &["--hostname"],
            &["--help"],
            &["-h"],
            &["--version"],
        ];
        for case in cases {
            let (full, fast) = (through_cli(case), alone(case));
            assert_eq!(full, fast, "husk run {case:?}");
        }
        // The cases above do reach both outcomes.
        assert!(alone(&["--", "true"]).starts_with("ok "));
        assert!(
            alone(&["--help"]).contains("husk run [OPTIONS] -- <CMD>..."),
            "{}",
            alone(&["--help"])
        );
        assert!(alone(&["--bogus"]).contains("'--bogus'"));
    }

    #[test]
    fn only_husk_run_takes_the_short_path() {
        let argv = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(RunCli::parse_if_run(&argv(&["husk", "run", "--", "true"])).is_some());
        for other in [
            &["husk"][..],
            &["husk", "serve"],
            &["husk", "--help"],
            &["husk", "bench", "run"],
            &["husk", "runs"],
        ] {
            assert!(RunCli::parse_if_run(&argv(other)).is_none(), "{other:?}");
        }
    }
}
