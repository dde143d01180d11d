//! The holder of the scope husk processes share on a systemd host (`husk __hold-scope`,
//! `husk_runtime::shared_scope`): it waits to be named in the state file, stays while another
//! process is in its cgroup or a sandbox cgroup below it is populated, and ends `linger` after
//! the last, under the state file's lock, emptying the file. A plain cgroup v2 directory
//! stands in for the systemd scope here (no systemd on the machines that run this suite); the
//! whole, with systemd, is checked by scripts/test-vm (login and script kinds).

mod common;
use common::*;

use std::fs;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long the holders here linger.
const LINGER_MS: u64 = 300;

/// The cgroup v2 hierarchy's mount point (`/sys/fs/cgroup`, or `…/unified` on hybrid hosts).
fn v2_mount() -> PathBuf {
    let mi = fs::read_to_string("/proc/self/mountinfo").unwrap();
    mi.lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(point))
        })
        .expect("no cgroup2 hierarchy mounted")
}

/// A stand-in scope, `husk-run-<holder>.scope` at the top of the v2 hierarchy, with what the
/// test put in it; on drop, every process still in it is killed and the cgroups removed.
struct Scope {
    dir: PathBuf,
    children: Vec<Child>,
}

impl Scope {
    fn new(holder: u32) -> Scope {
        let dir = v2_mount().join(format!("husk-run-{holder}.scope"));
        fs::create_dir(&dir).unwrap();
        Scope {
            dir,
            children: Vec::new(),
        }
    }

    /// Moves `pid` into `sub` (relative to the scope; "" for the scope itself).
    fn put(&self, sub: &str, pid: u32) {
        let d = self.dir.join(sub);
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// A `sleep` in `sub`, killed when the scope is dropped or by [`Scope::end`].
    fn user(&mut self, sub: &str) -> usize {
        let c = Command::new("sleep").arg("600").spawn().unwrap();
        self.put(sub, c.id());
        self.children.push(c);
        self.children.len() - 1
    }

    fn end(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = fs::write(self.dir.join("cgroup.kill"), "1");
        for sub in ["husk/s1", "husk", "husk-leaf", ""] {
            let d = self.dir.join(sub);
            let _ = wait_for(Duration::from_secs(5), || {
                (fs::remove_dir(&d).is_ok() || !d.exists()).then_some(())
            });
        }
    }
}

/// A holder started on an empty state file and moved into a stand-in scope of its own; it
/// waits to be named ([`Held::name`]). Dropping the scope kills it if it is still there.
struct Held {
    holder: Child,
    scope: Scope,
    state: PathBuf,
    _dir: TempDir,
}

impl Held {
    fn start(tag: &str) -> Held {
        let dir = TempDir::new(tag);
        let state = dir.path().join("run-scope");
        fs::write(&state, "").unwrap();
        let holder = Command::new(HUSK)
            .args(["__hold-scope"])
            .arg(&state)
            .arg(LINGER_MS.to_string())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let scope = Scope::new(holder.id());
        scope.put("", holder.id());
        Held {
            holder,
            scope,
            state,
            _dir: dir,
        }
    }

    /// Names the holder in the state file, as the process that started its scope does.
    fn name(&self) {
        fs::write(
            &self.state,
            format!("husk-run-{}.scope\n", self.holder.id()),
        )
        .unwrap();
    }
}

/// Whether `child` is still running after `wait` (the holder must not end meanwhile).
fn still_running(child: &mut Child, wait: Duration) -> bool {
    wait_for(wait, || child.try_wait().unwrap()).is_none()
}

fn exits_within(child: &mut Child, wait: Duration) -> Option<std::process::ExitStatus> {
    wait_for(wait, || child.try_wait().unwrap())
}

#[test]
fn the_holder_stays_while_its_scope_is_used_and_ends_after_its_linger() {
    let mut h = Held::start("holder");
    let caller = h.scope.user("husk-leaf");
    h.name();

    // Another process in the scope (a husk process in the leaf): the holder stays.
    assert!(
        still_running(&mut h.holder, Duration::from_millis(4 * LINGER_MS)),
        "the holder left while a process was in its scope"
    );
    // That process gone, but a sandbox still running below `husk/`: it stays.
    let sandbox = h.scope.user("husk/s1");
    h.scope.end(caller);
    assert!(
        still_running(&mut h.holder, Duration::from_millis(4 * LINGER_MS)),
        "the holder left while a sandbox cgroup was populated"
    );
    // The last one gone: it ends after its linger, and says so in the state file.
    h.scope.end(sandbox);
    let status = exits_within(&mut h.holder, Duration::from_secs(10))
        .expect("the holder stayed on with nothing in its scope");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        fs::read_to_string(&h.state).unwrap(),
        "",
        "the state still names it"
    );
}

#[test]
fn the_holder_does_not_leave_while_another_process_holds_the_lock() {
    let mut h = Held::start("holder-lock");
    // A process joining holds the lock: the holder, idle, must wait for it.
    let lock = fs::File::open(&h.state).unwrap();
    // SAFETY: flock takes no pointers; the fd is valid while `lock` lives.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    h.name();
    assert!(
        still_running(&mut h.holder, Duration::from_millis(6 * LINGER_MS)),
        "the holder left while another process held the lock"
    );
    drop(lock);
    let status = exits_within(&mut h.holder, Duration::from_secs(10))
        .expect("the holder stayed on after the lock was released");
    assert!(status.success(), "{status:?}");
}

#[test]
fn the_holder_refuses_bad_arguments_and_a_missing_state_file() {
    let out = husk(&["__hold-scope"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("usage: husk __hold-scope"),
        "{out:?}"
    );
    let out = husk(&["__hold-scope", "/nonexistent/run-scope", "100"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}
