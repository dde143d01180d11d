//! Shared helpers for husk's end-to-end tests: they run the real `husk` binary as root against
//! the real kernel, and check from the host that nothing of a sandbox survives it.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use husk_runtime::cgroup::CgroupLayout;
use husk_runtime::uidrange;

pub mod internet;
pub mod sandbox;
pub mod server;
pub mod tarball;
pub mod templates;

pub const HUSK: &str = env!("CARGO_BIN_EXE_husk");

/// A temporary directory removed on drop (even when the test fails), after whatever is
/// mounted beneath it (a server's workspace file systems, which outlive the server by design)
/// is unmounted.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "husk-test-{tag}-{}-{:x}",
            std::process::id(),
            rand()
        ));
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        kill_kept(&self.0);
        unmount_beneath(&self.0);
        let _ = fs::remove_dir_all(&self.0);
    }
}

use husk_runtime::mountinfo::unmount_beneath;

/// Kills PID 1 of every sandbox kept for a server on `state` (its owner, in the registry's
/// keep lines: see `husk_runtime::keep`), so that a test that failed half-way leaves no
/// sandbox running after its state directory is gone; the next spawner reaps the rest.
pub fn kill_kept(state: &Path) {
    let Ok(owner) = fs::canonicalize(state) else {
        return;
    };
    let hex: String = owner
        .display()
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR).join("sandboxes");
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(text) = fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            // keep <owner hex> <id> <pid> <start time> <send fd> <layer fd>
            let f: Vec<&str> = line.split(' ').collect();
            if f.len() != 7 || f[0] != "keep" || f[1] != hex {
                continue;
            }
            let (Ok(pid), Ok(start)) = (f[3].parse::<i32>(), f[4].parse::<u64>()) else {
                continue;
            };
            if husk_runtime::sys::process_start_time(pid).ok() == Some(start) {
                let _ = husk_runtime::sys::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// The loop devices backed by a file beneath `dir` (`loopN`).
pub fn loop_devices_beneath(dir: &Path) -> Vec<String> {
    husk_runtime::mountinfo::loop_devices(|file| file.starts_with(dir))
}

pub fn rand() -> u64 {
    let mut b = [0u8; 8];
    use std::io::Read;
    fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut b)
        .unwrap();
    u64::from_ne_bytes(b)
}

/// The result of one `husk run`, with the sandbox id it reported.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
    pub id: String,
    pub elapsed: Duration,
}

impl Run {
    pub fn ok(&self) -> &Self {
        assert_eq!(
            self.code, 0,
            "husk run failed\nstdout:\n{}\nstderr:\n{}",
            self.stdout, self.stderr
        );
        self
    }
}

/// Runs `husk run <flags> --id-file F -- <cmd>`, checks that the sandbox left nothing behind,
/// and returns what happened.
pub fn husk_run(flags: &[&str], cmd: &[&str]) -> Run {
    husk_run_stdin(flags, cmd, None)
}

pub fn husk_run_stdin(flags: &[&str], cmd: &[&str], stdin: Option<&[u8]>) -> Run {
    let dir = TempDir::new("id");
    let id_file = dir.path().join("id");
    let mut c = Command::new(HUSK);
    c.arg("run")
        .args(flags)
        .arg("--id-file")
        .arg(&id_file)
        .arg("--")
        .args(cmd);
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let start = Instant::now();
    let mut child = c.spawn().expect("spawn husk");
    if let Some(data) = stdin {
        let mut si = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            use std::io::Write;
            let _ = si.write_all(&data);
        });
    }
    let out = child.wait_with_output().unwrap();
    let elapsed = start.elapsed();
    let id = fs::read_to_string(&id_file)
        .unwrap_or_default()
        .trim()
        .to_owned();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        id,
        elapsed,
    };
    if !run.id.is_empty() {
        assert_gone(&run.id);
    }
    run
}

/// `husk <command> <args> --state-dir STATE`, `stdin` written to it (else none): (exit code,
/// stdout, stderr).
pub fn husk_state(
    command: &str,
    args: &[&str],
    state: &Path,
    stdin: Option<&[u8]>,
) -> (i32, String, String) {
    let mut child = Command::new(HUSK)
        .arg(command)
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(data) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(data).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Plain `husk <args>` (for CLI error tests).
pub fn husk(args: &[&str]) -> Output {
    Command::new(HUSK)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Starts `husk run` in the background; returns the child and the id once the sandbox exists.
pub fn husk_spawn(flags: &[&str], cmd: &[&str], dir: &TempDir) -> (Child, String) {
    let id_file = dir.path().join(format!("id-{:x}", rand()));
    let child = Command::new(HUSK)
        .arg("run")
        .args(flags)
        .arg("--id-file")
        .arg(&id_file)
        .arg("--")
        .args(cmd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = wait_for(Duration::from_secs(10), || {
        fs::read_to_string(&id_file)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
    })
    .expect("sandbox id file never appeared");
    (child, id)
}

/// Makes the next husk process's first create sweep leftovers: the mark of the last sweep
/// (`<run dir>/swept`) is set to before `SWEEP_EVERY`.
pub fn sweep_due_now() {
    let stamp = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR).join("swept");
    if let Ok(f) = fs::File::options().write(true).open(&stamp) {
        let old = std::time::SystemTime::now() - husk_runtime::spawner::SWEEP_EVERY * 2;
        f.set_modified(old).expect("age the sweep mark");
    }
}

/// Polls `f` until it returns Some or the deadline passes.
pub fn wait_for<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if Instant::now() > end {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The slot of a sandbox id (`s<slot>-<hex>`).
pub fn slot_of(id: &str) -> u32 {
    id.strip_prefix('s')
        .and_then(|s| s.split_once('-'))
        .and_then(|(s, _)| s.parse().ok())
        .unwrap_or_else(|| panic!("bad sandbox id {id:?}"))
}

/// Host pids of processes whose real uid is in the sandbox's range.
pub fn sandbox_pids(id: &str) -> Vec<(i32, u32)> {
    let base = uidrange::base_of(slot_of(id));
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(status) = fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let uid: Option<u32> = status
            .lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|u| u.parse().ok());
        if let Some(uid) = uid {
            if (base..base + uidrange::RANGE).contains(&uid) {
                out.push((pid, uid));
            }
        }
    }
    out
}

/// Whether a process named `comm` runs in sandbox `id`.
pub fn sandbox_runs(id: &str, comm: &str) -> bool {
    sandbox_pids(id).iter().any(|(pid, _)| {
        fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
    })
}

/// Sends signal `sig` (a name, e.g. "TERM") to a husk process the test started.
pub fn signal_process(child: &Child, sig: &str) {
    signal_pid(child.id(), sig);
}

/// Sends signal `sig` (a name) to process `pid`.
pub fn signal_pid(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid} failed");
}

/// The helper processes of the husk server `server_pid` (its children named `husk-*`, as
/// `ps` shows them): (name, pid), sorted.
pub fn server_helpers(server_pid: u32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces and parentheses, so split at the last ')'.
        let Some((head, rest)) = stat.rsplit_once(") ") else {
            continue;
        };
        let comm = head.split_once(" (").map_or("", |(_, c)| c);
        let ppid: Option<u32> = rest.split(' ').nth(1).and_then(|p| p.parse().ok());
        if ppid == Some(server_pid) && comm.starts_with("husk-") {
            out.push((comm.to_string(), pid));
        }
    }
    out.sort();
    out
}

/// Waits (bounded) until a process named `comm` runs in sandbox `id`.
pub fn wait_until_running(id: &str, comm: &str) {
    wait_for(Duration::from_secs(10), || {
        sandbox_runs(id, comm).then_some(())
    })
    .unwrap_or_else(|| panic!("sandbox {id} never ran {comm}"));
}

/// Asserts that nothing of sandbox `id` exists on the host any more: no process in its uid
/// range, no cgroup directory, its uid slot free, the staging directory empty.
pub fn assert_gone(id: &str) {
    // A sandbox taken up from an earlier server is not its spawner's child: its PID 1 is
    // reaped by the host's init, a moment after it died.
    let _ = wait_for(Duration::from_secs(10), || {
        sandbox_pids(id).is_empty().then_some(())
    });
    let pids = sandbox_pids(id);
    assert!(
        pids.is_empty(),
        "processes of sandbox {id} survive: {pids:?}"
    );
    let layout = CgroupLayout::discover().unwrap();
    let cgroup = husk_runtime::spawner::cgroup_name(slot_of(id));
    for p in layout.handle(&cgroup).paths() {
        assert!(
            !p.exists(),
            "cgroup {} of sandbox {id} survives",
            p.display()
        );
    }
    let lock = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR).join("uid-slots");
    assert!(
        uidrange::is_free(&lock, slot_of(id)).unwrap(),
        "uid slot of sandbox {id} still held"
    );
    let registry = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR)
        .join("sandboxes")
        .join(&cgroup);
    assert!(
        !registry.exists(),
        "registry entry of sandbox {id} survives"
    );
    let staging = Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR).join("staging");
    let left: Vec<_> = fs::read_dir(&staging).unwrap().flatten().collect();
    assert!(left.is_empty(), "host staging dir not empty: {left:?}");
    // Template images are mounted once in the host namespace and shared by design
    // (`/run/husk/images/<digest>`); anything else of husk's must not be.
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let leaked: Vec<&str> = mounts
        .lines()
        .filter(|l| l.contains("/run/husk/") && !l.contains("/run/husk/images/"))
        .collect();
    assert!(
        leaked.is_empty(),
        "a husk mount leaked into the host namespace:\n{leaked:?}"
    );
}

/// Asserts that no process on the host is in the namespace with this inode (e.g. "net:[4026...]").
pub fn assert_namespace_gone(kind: &str, link: &str) {
    for e in fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().parse::<i32>().is_err() {
            continue;
        }
        if let Ok(l) = fs::read_link(e.path().join("ns").join(kind)) {
            assert_ne!(
                l.to_string_lossy(),
                link,
                "process {:?} still lives in the sandbox's {kind} namespace",
                e.file_name()
            );
        }
    }
}

/// A Python snippet run with the sandbox's python3 (from the host template's /usr).
pub fn py(code: &str) -> Vec<String> {
    vec!["/usr/bin/python3".into(), "-c".into(), code.into()]
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
