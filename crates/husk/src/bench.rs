//! `husk bench`: the figures behind husk's performance budgets, each measured side by side with
//! its peer in the same run (timings on shared machines drift; ratios hold).
//!
//! - one-shot: `husk run -- true` against `bwrap --unshare-all ... true` and, where installed
//!   and able to run here, the OCI runtimes `crun` and `runc` ([`crate::bench_oci`]), interleaved.
//! - create → ready and destroy latency of idle sandboxes, in process (the server-side figure).
//! - throughput: N worker processes creating and destroying sandboxes for a fixed time, idle
//!   (creates per second) and with `true` run in each (one-shot cycles per second).
//! - idle density: host memory (MemAvailable) consumed per idle sandbox with many alive.
//! - network ([`crate::bench_net`]): create with a link out against without, and latency and
//!   throughput through husk's router and domain proxy against a plain veth.
//! - with `--template NAME`: sandboxes from that built template against the host template,
//!   interleaved (create → ready in process, and one-shot `husk run`), and the template's image
//!   size against its root file system's.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use husk_core::store::{Store, DEFAULT_STATE_DIR};
use husk_core::template::Templates;
use husk_runtime::{RootSource, SandboxSpec, Spawner};

use crate::cli::{BenchArgs, BenchFigure, WorkerArgs};
use crate::units::format_size;

/// The budget of a built template's create → ready, relative to the host template's.
const TEMPLATE_BUDGET: f64 = 1.1;

/// An error with its whole chain of causes, on one line.
pub(crate) fn chain<E: std::error::Error + Send + Sync + 'static>(e: E) -> String {
    crate::report::chain(&e)
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[idx]
}

/// Whether `program --version` runs and succeeds: the peer is on this machine.
pub(crate) fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub(crate) fn time_cmd(cmd: &mut Command) -> Result<f64, String> {
    let start = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{e}"))?;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    if !status.status.success() {
        return Err(String::from_utf8_lossy(&status.stderr).trim().to_owned());
    }
    Ok(ms)
}

fn bwrap_cmd() -> Command {
    let mut c = Command::new("bwrap");
    c.args([
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--",
        "/usr/bin/true",
    ]);
    c
}

/// Prints the percentiles of `v` (sorting it); returns p50 and p99.
pub(crate) fn stats(name: &str, v: &mut [f64]) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let (p50, p99) = (percentile(v, 0.5), percentile(v, 0.99));
    println!(
        "  {name:<28} p50 {p50:7.2} ms   p90 {:7.2} ms   p99 {p99:7.2} ms   (n={})",
        percentile(v, 0.9),
        v.len()
    );
    (p50, p99)
}

fn oneshot(runs: usize, beside: Option<&Path>) -> Result<(), String> {
    use crate::bench_oci::{Found, OciPeer};
    let exe = std::env::current_exe().map_err(chain)?;
    let have_bwrap = installed("bwrap");
    // Each runtime runs once here: a warm-up, and the test of whether it works on this host.
    let mut oci = Vec::new();
    let mut absent = Vec::new();
    for runtime in ["crun", "runc"] {
        match OciPeer::find(runtime) {
            Found::Ready(peer) => oci.push((peer, Vec::new())),
            Found::Missing => absent.push(format!("  {runtime}: not installed - no figure")),
            Found::Failed(e) => {
                absent.push(format!("  {runtime}: cannot run here ({e}) - no figure"))
            }
        }
    }
    println!("one-shot run of `true` ({runs} runs each, interleaved):");
    let (mut husk, mut bwrap, mut other) = (Vec::new(), Vec::new(), Vec::new());
    let run_true = |exe: &Path| time_cmd(Command::new(exe).args(["run", "--", "/usr/bin/true"]));
    // Warm the page cache and the host template once.
    run_true(&exe)?;
    if let Some(b) = beside {
        run_true(b).map_err(|e| format!("{}: {e}", b.display()))?;
    }
    for run in 0..runs {
        husk.push(run_true(&exe)?);
        if let Some(b) = beside {
            other.push(run_true(b).map_err(|e| format!("{}: {e}", b.display()))?);
        }
        if have_bwrap {
            bwrap.push(time_cmd(&mut bwrap_cmd()).map_err(|e| format!("bwrap: {e}"))?);
        }
        time_peers(
            &mut oci,
            (run + 1, runs),
            &mut absent,
            |peer| {
                let ms = time_cmd(&mut peer.command());
                if ms.is_err() {
                    peer.delete_last();
                }
                ms
            },
            |peer| peer.runtime,
        );
    }
    let (h, _) = stats("husk run -- true", &mut husk);
    if let Some(b) = beside {
        let (o, _) = stats(&format!("beside: {}", b.display()), &mut other);
        println!("  ratio husk/beside (p50)      {:.2}", h / o);
    }
    if have_bwrap {
        let (b, _) = stats("bwrap --unshare-all true", &mut bwrap);
        println!("  ratio husk/bwrap (p50)       {:.2}", h / b);
    } else {
        println!("  bwrap: not installed (apt-get install bubblewrap) - no peer figure");
    }
    for (peer, times) in &mut oci {
        let (o, _) = stats(&format!("{} run (husk's limits)", peer.runtime), times);
        println!(
            "  ratio husk/{:<17} {:.2}",
            format!("{} (p50)", peer.runtime),
            h / o
        );
    }
    for line in absent {
        println!("{line}");
    }
    Ok(())
}

/// Times one run (`at`: this run and of how many) of each peer, in order. A peer whose run
/// fails is dropped, its figures with it, and `dropped` gets a line saying at which run and
/// why (the error's first line): husk's figures and the other peers' are kept. An OCI
/// runtime's run depends on the host's cgroup set-up, which systemd may change between two
/// runs (crun, on Debian's 6.1 from an ordinary service: "the requested cgroup controller
/// `cpu` is not available" at a run after several that worked).
fn time_peers<P>(
    peers: &mut Vec<(P, Vec<f64>)>,
    at: (usize, usize),
    dropped: &mut Vec<String>,
    mut time: impl FnMut(&mut P) -> Result<f64, String>,
    name: impl Fn(&P) -> &str,
) {
    peers.retain_mut(|(peer, times)| match time(peer) {
        Ok(ms) => {
            times.push(ms);
            true
        }
        Err(e) => {
            dropped.push(format!(
                "  {}: failed at run {} of {} ({}) - no figure",
                name(peer),
                at.0,
                at.1,
                e.lines().next().unwrap_or("no message")
            ));
            false
        }
    });
}

/// Sequential create → ready and destroy latency of idle sandboxes, in this process.
fn latency(runs: usize) -> Result<(), String> {
    println!("create -> ready and destroy of an idle sandbox, in process ({runs} each):");
    let spawner = Spawner::new().map_err(chain)?;
    let spec = SandboxSpec::idle();
    let devnull = std::fs::File::open("/dev/null").map_err(chain)?;
    let stdio = Some([devnull.as_fd(), devnull.as_fd(), devnull.as_fd()]);
    let (mut create, mut destroy) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let mut sb = spawner.create(&spec, stdio).map_err(chain)?;
        create.push(t.elapsed().as_secs_f64() * 1000.0);
        let t = Instant::now();
        sb.destroy().map_err(chain)?;
        destroy.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    stats("create -> ready", &mut create);
    stats("destroy", &mut destroy);
    Ok(())
}

/// A built template under test, resolved (its image checked) once.
struct BuiltTemplate {
    name: String,
    state_dir: PathBuf,
    rootfs: RootSource,
    image_bytes: u64,
    rootfs_bytes: u64,
}

impl BuiltTemplate {
    /// Resolves `name` as sandboxes do; only a registered template will do (`base` falls back
    /// to the host template when none is built, which would compare the host with itself).
    fn load(name: &str, state_dir: Option<&Path>) -> Result<BuiltTemplate, String> {
        let state_dir = state_dir.unwrap_or(Path::new(DEFAULT_STATE_DIR)).to_owned();
        let store = Store::open(&state_dir)
            .map_err(|e| format!("state directory {}: {}", state_dir.display(), chain(e)))?;
        let record = store.template(name).map_err(chain)?.ok_or_else(|| {
            format!(
                "--template {name}: no template of that name is built in {} (husk template \
                 build; or pass --state-dir)",
                state_dir.display()
            )
        })?;
        let resolved = Templates::new(Arc::new(store))
            .resolve(name)
            .map_err(chain)?;
        Ok(BuiltTemplate {
            name: name.to_owned(),
            state_dir,
            rootfs: resolved.rootfs,
            image_bytes: record.size,
            rootfs_bytes: record.manifest.rootfs_bytes,
        })
    }
}

/// Prints `template/host` of p50 and p99, against `budget` if there is one.
fn ratios(what: &str, host: (f64, f64), template: (f64, f64), budget: Option<f64>) {
    let (p50, p99) = (template.0 / host.0, template.1 / host.1);
    let verdict = match budget {
        Some(b) if p50 <= b => format!("   (budget <= {b:.2}: met)"),
        Some(b) => format!("   (budget <= {b:.2}: MISSED)"),
        None => String::new(),
    };
    println!("  ratio {what:<22} p50 {p50:7.2}      p99 {p99:7.2}{verdict}");
}

/// Built template against host template: image size, create → ready in process (the same
/// path as [`latency`]) and one-shot `husk run -- true` (as [`oneshot`]), interleaved.
fn template_vs_host(runs: usize, t: &BuiltTemplate) -> Result<(), String> {
    let name = &t.name;
    println!("template '{name}' against the host template:");
    let ratio = if t.rootfs_bytes > 0 {
        format!("{:.2}", t.image_bytes as f64 / t.rootfs_bytes as f64)
    } else {
        "-".into()
    };
    println!(
        "  image {} for {} of files (image/files {ratio})",
        format_size(t.image_bytes),
        format_size(t.rootfs_bytes)
    );

    let spawner = Spawner::new().map_err(chain)?;
    let host_spec = SandboxSpec::idle();
    let mut template_spec = SandboxSpec::idle();
    template_spec.rootfs = t.rootfs.clone();
    let devnull = std::fs::File::open("/dev/null").map_err(chain)?;
    let stdio = Some([devnull.as_fd(), devnull.as_fd(), devnull.as_fd()]);
    let create = |spec: &SandboxSpec| -> Result<f64, String> {
        let start = Instant::now();
        let mut sb = spawner.create(spec, stdio).map_err(chain)?;
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        sb.destroy().map_err(chain)?;
        Ok(ms)
    };
    // The first sandbox of an image mounts it (once per host); shown apart, not in the figures.
    let first = create(&template_spec)?;
    create(&host_spec)?;
    println!(
        "  first create from '{name}'     {first:7.2} ms (mounts the image if not yet mounted)"
    );
    println!("  create -> ready of an idle sandbox ({runs} each, interleaved, in process):");
    let (mut host, mut template) = (Vec::new(), Vec::new());
    for i in 0..runs {
        // Alternate which goes first, so neither always follows the other's destroy.
        if i % 2 == 0 {
            host.push(create(&host_spec)?);
            template.push(create(&template_spec)?);
        } else {
            template.push(create(&template_spec)?);
            host.push(create(&host_spec)?);
        }
    }
    let h = stats("host", &mut host);
    let b = stats(name, &mut template);
    ratios("template/host", h, b, Some(TEMPLATE_BUDGET));

    let exe = std::env::current_exe().map_err(chain)?;
    let state_dir = t.state_dir.to_string_lossy();
    let host_run = || time_cmd(Command::new(&exe).args(["run", "--", "/usr/bin/true"]));
    let template_run = || {
        time_cmd(Command::new(&exe).args([
            "run",
            "--template",
            name,
            "--state-dir",
            &state_dir,
            "--",
            "/usr/bin/true",
        ]))
        .map_err(|e| format!("husk run --template {name}: {e}"))
    };
    println!("  one-shot `husk run -- true` ({runs} each, interleaved):");
    template_run()?;
    host_run()?;
    let (mut host, mut template) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        host.push(host_run()?);
        template.push(template_run()?);
    }
    let h = stats("host", &mut host);
    let b = stats(&format!("--template {name}"), &mut template);
    ratios("template/host", h, b, None);
    Ok(())
}

fn throughput(parallel: usize, seconds: f64, mode: &str, what: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(chain)?;
    let start = Instant::now();
    let children: Vec<_> = (0..parallel)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "__bench-worker",
                    "--seconds",
                    &seconds.to_string(),
                    "--mode",
                    mode,
                ])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<_, _>>()
        .map_err(chain)?;
    let mut total = 0u64;
    for c in children {
        let out = c.wait_with_output().map_err(chain)?;
        if !out.status.success() {
            return Err("a bench worker failed".into());
        }
        total += String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse::<u64>()
            .map_err(chain)?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "  {what:<28} {:6.0} /s  ({total} in {elapsed:.2} s, {parallel} worker processes)",
        total as f64 / elapsed
    );
    Ok(())
}

/// A worker: create (and run `true` in, with `--mode cycle`) and destroy sandboxes until the
/// time is up; prints the count.
pub fn worker(args: WorkerArgs) -> i32 {
    let run = || -> Result<u64, String> {
        let spawner = Spawner::new().map_err(chain)?;
        let cycle = args.mode == "cycle";
        let spec = if cycle {
            SandboxSpec::new(vec!["/usr/bin/true".into()])
        } else {
            SandboxSpec::idle()
        };
        let devnull = std::fs::File::open("/dev/null").map_err(chain)?;
        let stdio = Some([devnull.as_fd(), devnull.as_fd(), devnull.as_fd()]);
        let end = Instant::now() + Duration::from_secs_f64(args.seconds);
        let mut n = 0;
        while Instant::now() < end {
            let mut sb = spawner.create(&spec, stdio).map_err(chain)?;
            if cycle {
                sb.start().map_err(chain)?;
                sb.wait(None).map_err(chain)?;
            }
            sb.destroy().map_err(chain)?;
            n += 1;
        }
        Ok(n)
    };
    match run() {
        Ok(n) => {
            println!("{n}");
            0
        }
        Err(e) => {
            eprintln!("husk bench worker: {e}");
            1
        }
    }
}

fn mem_available_kib() -> u64 {
    kib_field("/proc/meminfo", "MemAvailable:")
}

/// A `kB` field of a `/proc` file such as `/proc/meminfo` (0 when it is not there).
fn kib_field(file: &str, key: &str) -> u64 {
    kib_in(&std::fs::read_to_string(file).unwrap_or_default(), key)
}

/// The `kB` field `key` of a `/proc` file's text (0 when it is not there).
fn kib_in(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// This process's resident anonymous memory and page tables (KiB). The sandboxes' first
/// processes are forks of it: a fork copies the page tables of what it has resident, so
/// whatever it keeps per live sandbox makes every later create dearer.
fn own_anon_and_page_tables_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    (kib_in(&status, "RssAnon:"), kib_in(&status, "VmPTE:"))
}

fn density(n: usize) -> Result<(), String> {
    println!("idle density ({n} idle sandboxes alive at once):");
    husk_runtime::sys::lift_nofile_limit().map_err(chain)?;
    let spawner = Spawner::new().map_err(chain)?;
    let spec = SandboxSpec::idle();
    let devnull = std::fs::File::open("/dev/null").map_err(chain)?;
    let stdio = Some([devnull.as_fd(), devnull.as_fd(), devnull.as_fd()]);
    let before = mem_available_kib();
    let own_before = own_anon_and_page_tables_kib();
    let start = Instant::now();
    let mut alive = Vec::with_capacity(n);
    // Creates per second in each tenth of the run: a create must cost the same with many
    // sandboxes alive as with none (issue 20), and a falling rate shows that it does not.
    let mut tenths = Tenths::new(n);
    for _ in 0..n {
        alive.push(spawner.create(&spec, stdio).map_err(chain)?);
        tenths.done_one();
    }
    let created = start.elapsed().as_secs_f64();
    // Let lazily-freed memory from the creation burst settle before reading.
    std::thread::sleep(Duration::from_millis(500));
    let after = mem_available_kib();
    let own_after = own_anon_and_page_tables_kib();
    let per = (before.saturating_sub(after)) as f64 / n as f64;
    println!(
        "  created {n} in {created:.2} s ({:.0}/s)",
        n as f64 / created
    );
    println!(
        "  creates/s in each {} as more are alive: {tenths}",
        tenths.size
    );
    println!(
        "  host memory per idle sandbox: {per:.0} KiB ({:.2} MiB; MemAvailable drop {} MiB)",
        per / 1024.0,
        before.saturating_sub(after) / 1024
    );
    println!(
        "  the spawner (this process, which each create forks): anonymous memory {} -> {} KiB, \
         page tables {} -> {} KiB",
        own_before.0, own_after.0, own_before.1, own_after.1
    );
    let start = Instant::now();
    let mut tenths = Tenths::new(n);
    for mut sb in alive {
        sb.destroy().map_err(chain)?;
        tenths.done_one();
    }
    println!("  destroyed all in {:.2} s", start.elapsed().as_secs_f64());
    println!(
        "  destroys/s in each {} as fewer are alive: {tenths}",
        tenths.size
    );
    Ok(())
}

/// Operations per second in each tenth of a run of `n` (the whole tenths only).
struct Tenths {
    size: usize,
    done: usize,
    since: Instant,
    rates: Vec<f64>,
}

impl Tenths {
    fn new(n: usize) -> Tenths {
        Tenths {
            size: (n / 10).max(1),
            done: 0,
            since: Instant::now(),
            rates: Vec::new(),
        }
    }

    fn done_one(&mut self) {
        self.done += 1;
        if self.done % self.size == 0 {
            self.rates
                .push(self.size as f64 / self.since.elapsed().as_secs_f64());
            self.since = Instant::now();
        }
    }
}

impl std::fmt::Display for Tenths {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rates: Vec<String> = self.rates.iter().map(|r| format!("{r:.0}")).collect();
        f.write_str(&rates.join(" "))
    }
}

/// `husk bench`.
pub fn main(args: BenchArgs) -> i32 {
    let parallel = args.parallel.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    // Resolved first: a wrong name fails before minutes of other figures.
    let template = match args.template.as_deref() {
        Some(name) => match BuiltTemplate::load(name, args.state_dir.as_deref()) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("husk bench: {e}");
                return 1;
            }
        },
        None => None,
    };
    let wanted = |f: BenchFigure| args.only.is_empty() || args.only.contains(&f);
    let result = (|| {
        if wanted(BenchFigure::Oneshot) {
            oneshot(args.runs, args.beside.as_deref())?;
        }
        if wanted(BenchFigure::Latency) {
            latency(args.runs)?;
            if let Some(t) = &template {
                template_vs_host(args.runs, t)?;
            }
        }
        if wanted(BenchFigure::Throughput) {
            println!("throughput:");
            throughput(parallel, args.seconds, "create", "create + destroy (idle)")?;
            throughput(
                parallel,
                args.seconds,
                "cycle",
                "create + run `true` + destroy",
            )?;
        }
        if wanted(BenchFigure::Density) {
            density(args.idle)?;
        }
        if wanted(BenchFigure::Network) {
            crate::bench_net::run(args.runs.min(100))?;
        }
        Ok::<(), String>(())
    })();
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("husk bench: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_that_fails_is_dropped_with_its_reason_and_the_others_go_on() {
        // Two fake peers: "flaky" fails at its second run, "steady" never does.
        let mut peers = vec![(("flaky", 0), Vec::new()), (("steady", 0), Vec::new())];
        let mut dropped = Vec::new();
        for run in 1..=3 {
            time_peers(
                &mut peers,
                (run, 3),
                &mut dropped,
                |(name, n): &mut (&str, u32)| {
                    *n += 1;
                    if *name == "flaky" && *n == 2 {
                        Err("cgroup controller `cpu` is not available\nmore log".to_owned())
                    } else {
                        Ok(f64::from(*n))
                    }
                },
                |(name, _)| name,
            );
        }
        assert_eq!(peers.len(), 1);
        assert_eq!(peers[0].0 .0, "steady");
        assert_eq!(peers[0].1, vec![1.0, 2.0, 3.0]);
        assert_eq!(
            dropped,
            vec!["  flaky: failed at run 2 of 3 (cgroup controller `cpu` is not available) - no figure"]
        );
    }
}
