//! One delegated systemd scope shared by the husk processes of a run directory that start
//! outside a delegated unit (a root shell, cron, a script in an ordinary service).
//!
//! Such a process needs a cgroup systemd delegated ([`crate::systemd`]). Asking systemd for a
//! transient scope costs more than the rest of a one-shot `husk run` (systemd makes, starts
//! and later collects a unit; docs/design.md §18), so the first process asks for one scope,
//! `husk-run-<holder>.scope`, and the next ones move into it themselves: one write to its
//! `cgroup.procs`, no D-Bus. Sharing a delegated cgroup is what husk processes of one
//! delegated unit already do (the leaf, `husk/`, giving it back when the last ends: see
//! [`crate::cgroup`]).
//!
//! A scope ends with its last process, so the first process also starts a *holder*: a small
//! husk process (`husk __hold-scope`, a clean exec: no copy of the caller's memory or
//! environment) that keeps the scope alive while husk processes use it and for `linger`
//! after the last one is gone, then exits, and systemd collects the scope. Nothing else
//! stays: the holder is in its own session with its standard streams on `/dev/null`.
//!
//! The state file (`<run dir>/run-scope`, root's alone) names the scope and its holder. Every
//! step that reads or changes it holds an exclusive `flock` on it: a process joins or starts
//! the scope under the lock, and the holder decides to end under it (non-blocking, re-checking
//! that it is still idle, and it exits holding it), so that no process joins a scope whose
//! holder has just left. The entry is checked against the kernel before use: the holder must
//! be alive and in the scope the entry names (a pid reused by another process is in another
//! cgroup).
//!
//! Joining without asking systemd is only right where a missing `trusted.delegate` attribute
//! tells that the caller's own unit is not delegated: systemd 251 and later mark delegated
//! units' cgroups. Where the shared scope itself is unmarked (an older systemd), the state
//! file says so and every process asks systemd as before.

use std::ffi::{CString, OsString};
use std::fs;
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cgroup::{self, LEAF};
use crate::sys;
use crate::systemd::{Delegation, ScopeSpec, SystemdError};

/// The hidden subcommand the holder runs as: `husk __hold-scope STATE LINGER_MS`.
pub const HOLD_ARG: &str = "__hold-scope";

/// How long a process waits for the lock: longer than a D-Bus conversation may take
/// ([`crate::systemd`]'s 30 s) while another process starts the scope.
const LOCK_WAIT: Duration = Duration::from_secs(45);

/// How long a new holder waits to be named in the state file before giving up (its starter
/// failed or was killed).
const NAMED_WAIT: Duration = Duration::from_secs(60);

/// How long a process keeps trying to move into a scope that another husk process is
/// preparing or giving back at that moment.
const JOIN_WAIT: Duration = Duration::from_millis(20);

/// The state file's content for a systemd that does not mark delegated units.
const UNMARKED: &str = "unmarked";

/// What the state file names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// The scope `husk-run-<holder>.scope` and its holder.
    Scope { holder: i32 },
    /// This host's systemd does not mark delegated units: no sharing.
    Unmarked,
}

impl Entry {
    fn unit(holder: i32) -> String {
        format!("husk-run-{holder}.scope")
    }

    fn parse(text: &str) -> Option<Entry> {
        let text = text.trim();
        if text == UNMARKED {
            return Some(Entry::Unmarked);
        }
        let holder: i32 = text
            .strip_prefix("husk-run-")?
            .strip_suffix(".scope")?
            .parse()
            .ok()?;
        (holder > 0).then_some(Entry::Scope { holder })
    }

    fn render(&self) -> String {
        match self {
            Entry::Scope { holder } => format!("{}\n", Entry::unit(*holder)),
            Entry::Unmarked => format!("{UNMARKED}\n"),
        }
    }
}

fn err(what: &str) -> impl FnOnce(io::Error) -> SystemdError + '_ {
    move |e| SystemdError::SharedScope {
        what: what.to_owned(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

/// Gets the calling process a delegated cgroup through the shared scope of `state`'s run
/// directory: joins it, or asks systemd for it (with a new holder that keeps it `linger`
/// after its last user). Returns what [`crate::systemd::ensure_delegated`] returns: a scope
/// (the caller moved; rediscover its cgroup) or, on a systemd that does not mark delegated
/// units and finds the caller's unit delegated, that unit. The caller must be
/// single-threaded (it forks) and its own cgroup must not be marked delegated; `from` names
/// the unit it is in, for logs.
pub(crate) fn delegate(
    state: &Path,
    linger: Duration,
    from: String,
) -> Result<Delegation, SystemdError> {
    let mut file = sys::create_lock_file(state).map_err(err("open the state file"))?;
    lock_within(&file, LOCK_WAIT)?;
    // The lock is the open file's: it ends when `file` is closed, on every path out.
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(err("read the state file"))?;
    match Entry::parse(&text) {
        Some(Entry::Unmarked) => {
            // Nothing to share: unlocked, so that these processes do not wait on each other.
            drop(file);
            return crate::systemd::ensure_delegated();
        }
        Some(Entry::Scope { holder }) => {
            if let Some(unit) = join(holder) {
                return Ok(Delegation::Scope { unit, from });
            }
        }
        None => {}
    }
    let holder = spawn_holder(state, linger)?;
    let spec = ScopeSpec {
        unit: Entry::unit(holder),
        also: vec![holder as u32],
        description: "husk sandboxes of husk processes started outside a delegated unit \
                      (shared; ends after the last)"
            .to_owned(),
    };
    let answer = crate::systemd::ensure_delegated_into(spec);
    let entry = match &answer {
        Ok(Delegation::Scope { .. }) => {
            let marked = cgroup::v2_base_of(None).is_some_and(|b| cgroup::marked_delegated(&b));
            marked.then_some(Entry::Scope { holder })
        }
        _ => None,
    };
    if entry.is_none() {
        // Not shared after all (the caller's own unit is delegated, systemd refused, or
        // it does not mark delegation): the holder has nothing to hold.
        let _ = sys::kill(holder, libc::SIGKILL);
        let _ = sys::waitpid(holder, 0);
    }
    let mut write = |e: &Entry| -> io::Result<()> {
        file.set_len(0)?;
        file.rewind()?;
        file.write_all(e.render().as_bytes())
    };
    match (&answer, &entry) {
        (_, Some(e)) => write(e).map_err(err("write the state file"))?,
        // A scope systemd did not mark, or the caller's own unit delegated though unmarked
        // (only so is it asked): this systemd does not mark delegation, and joining without
        // asking would be wrong here; later processes ask systemd each time.
        (Ok(_), None) => write(&Entry::Unmarked).map_err(err("write the state file"))?,
        (Err(_), None) => {}
    }
    answer
}

/// Takes the exclusive lock on `file`, polling until `wait` has passed.
fn lock_within(file: &fs::File, wait: Duration) -> Result<(), SystemdError> {
    let mut failed = None;
    let locked = cgroup::poll_until(Instant::now() + wait, || {
        match sys::flock_try_exclusive(file.as_fd()) {
            Ok(held) => held,
            Err(e) => {
                failed = Some(e);
                true
            }
        }
    });
    if let Some(e) = failed {
        return Err(err("lock the state file")(e));
    }
    locked.ok_or_else(|| SystemdError::SharedScope {
        what: "lock the state file (held by another husk process)".into(),
        errno: libc::ETIMEDOUT,
    })
}

/// Moves the calling process into the scope of `holder`, if that holder is alive, in the
/// scope its number names, and the scope is marked delegated. `Some(unit)` once moved.
fn join(holder: i32) -> Option<String> {
    let unit = Entry::unit(holder);
    let base = cgroup::v2_base_of(Some(holder))?;
    if base.file_name()? != unit.as_str() || !cgroup::marked_delegated(&base) {
        return None;
    }
    let me = sys::getpid().to_string();
    // Into the leaf while husk processes there have enabled controllers below the scope
    // (v2 refuses processes in a cgroup that has them), else into the scope itself; another
    // process may be giving the scope back or preparing it meanwhile, hence a few tries.
    let moved = cgroup::poll_until(Instant::now() + JOIN_WAIT, || {
        [base.join(LEAF), base.clone()]
            .iter()
            .any(|dir| fs::write(dir.join("cgroup.procs"), &me).is_ok())
    });
    moved.map(|()| unit)
}

/// Starts the holder: `husk __hold-scope STATE LINGER_MS`, from this process's own image, in
/// a session of its own, with no descriptors but `/dev/null` and no environment.
fn spawn_holder(state: &Path, linger: Duration) -> Result<i32, SystemdError> {
    use std::os::unix::ffi::OsStrExt;
    let cstr = |s: &[u8]| {
        CString::new(s).map_err(|_| SystemdError::SharedScope {
            what: "the holder's arguments (a NUL byte)".into(),
            errno: libc::EINVAL,
        })
    };
    let argv = [
        cstr(b"husk")?,
        cstr(HOLD_ARG.as_bytes())?,
        cstr(state.as_os_str().as_bytes())?,
        cstr(linger.as_millis().to_string().as_bytes())?,
    ];
    // SAFETY: the caller is single-threaded (acquire's contract).
    let pid = unsafe { sys::fork() }.map_err(err("fork the holder"))?;
    if pid == 0 {
        let _ = sys::setsid();
        let _ = sys::reset_signals();
        if let Ok(null) = sys::open(c"/dev/null", libc::O_RDWR, 0) {
            for fd in 0..3 {
                let _ = sys::dup2(std::os::fd::AsRawFd::as_raw_fd(&null), fd);
            }
        }
        sys::close_fds_from(3, &[]);
        let _ = sys::execve(c"/proc/self/exe", &argv, &[]);
        sys::exit_now(127);
    }
    Ok(pid)
}

/// Whether a scope is idle: no process in it but the holder (`me`) and no sandbox cgroup
/// populated. `base` and `leaf` are the `cgroup.procs` of the scope and of its leaf, `husk`
/// the `cgroup.events` of its `husk/` (sandboxes' parent), `None` where absent.
fn idle(me: i32, base: &str, leaf: Option<&str>, husk: Option<&str>) -> bool {
    let others = base
        .split_whitespace()
        .chain(leaf.unwrap_or("").split_whitespace())
        .any(|p| p.parse::<i32>().ok() != Some(me));
    let populated = husk.is_some_and(|e| {
        e.lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["populated", "1"])
    });
    !others && !populated
}

fn idle_now(me: i32, base: &Path) -> Option<bool> {
    let procs = fs::read_to_string(base.join("cgroup.procs")).ok()?;
    let leaf = fs::read_to_string(base.join(LEAF).join("cgroup.procs")).ok();
    let husk = fs::read_to_string(base.join("husk").join("cgroup.events")).ok();
    Some(idle(me, &procs, leaf.as_deref(), husk.as_deref()))
}

/// The holder's decision once its scope has been idle for its linger: it takes the state
/// file's lock (`lock`, without waiting) and leaves only if the scope is still idle under it
/// (`still_idle`), keeping the lock to its exit so that nobody joins a scope it leaves;
/// found in use again (a process joined between the look and the lock), it stays and lets
/// the lock go (`unlock`), or every later husk process would wait for it.
fn leave_now(
    lock: impl FnOnce() -> bool,
    still_idle: impl FnOnce() -> bool,
    unlock: impl FnOnce(),
) -> bool {
    if !lock() {
        return false;
    }
    if still_idle() {
        return true;
    }
    unlock();
    false
}

/// The holder (`husk __hold-scope STATE LINGER_MS`): waits to be named in the state file, then
/// stays while the scope is in use and for `linger` after, and exits. Returns the exit code.
pub fn hold_main(args: &[OsString]) -> i32 {
    let (Some(state), Some(linger)) = (
        args.first().map(PathBuf::from),
        args.get(1)
            .and_then(|s| s.to_str()?.parse::<u64>().ok())
            .map(Duration::from_millis),
    ) else {
        eprintln!("usage: husk {HOLD_ARG} STATE LINGER_MS (started by husk itself)");
        return 2;
    };
    let me = sys::getpid();
    let Ok(file) = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&state)
    else {
        return 1;
    };
    let named = || {
        fs::read_to_string(&state)
            .ok()
            .as_deref()
            .and_then(Entry::parse)
            == Some(Entry::Scope { holder: me })
    };
    if cgroup::poll_until(Instant::now() + NAMED_WAIT, named).is_none() {
        return 1;
    }
    let tick = (linger / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut idle_since: Option<Instant> = None;
    loop {
        std::thread::sleep(tick);
        // The scope is wherever this process is (husk processes move it between the scope
        // and its leaf); gone, there is nothing left to hold.
        let Some(base) = cgroup::v2_base_of(None) else {
            return 0;
        };
        match idle_now(me, &base) {
            None => return 0,
            Some(false) => idle_since = None,
            Some(true) => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() < linger {
                    continue;
                }
                let leave = leave_now(
                    || sys::flock_try_exclusive(file.as_fd()).unwrap_or(false),
                    || idle_now(me, &base) == Some(true),
                    || {
                        let _ = sys::flock_unlock(file.as_fd());
                    },
                );
                if leave {
                    if named() {
                        let _ = fs::write(&state, "");
                    }
                    return 0;
                }
                idle_since = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_names_its_scope_and_nothing_else_is_one() {
        let e = Entry::Scope { holder: 4242 };
        assert_eq!(e.render(), "husk-run-4242.scope\n");
        assert_eq!(Entry::parse(&e.render()), Some(e));
        assert_eq!(Entry::parse("unmarked\n"), Some(Entry::Unmarked));
        for bad in [
            "",
            "husk-run-.scope",
            "husk-run-0.scope",
            "husk-run--5.scope",
            "husk-run-12.service",
            "husk-12.scope",
            "husk-run-12.scope/../x",
            "husk-run-99999999999.scope",
        ] {
            assert_eq!(Entry::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_holder_leaves_only_under_the_lock_and_lets_it_go_when_it_stays() {
        use std::cell::Cell;
        let (checked, unlocked) = (Cell::new(false), Cell::new(false));
        let run = |locked: bool, idle: bool| {
            checked.set(false);
            unlocked.set(false);
            leave_now(
                || locked,
                || {
                    checked.set(true);
                    idle
                },
                || unlocked.set(true),
            )
        };
        // Idle under the lock: it leaves, keeping the lock to its exit.
        assert!(run(true, true));
        assert!(checked.get() && !unlocked.get());
        // A process joined between the look and the lock: it stays and lets the lock go.
        assert!(!run(true, false));
        assert!(checked.get() && unlocked.get());
        // Someone else holds the lock: it stays, without looking, and unlocks nothing.
        assert!(!run(false, true));
        assert!(!checked.get() && !unlocked.get());
    }

    #[test]
    fn a_scope_is_idle_with_its_holder_alone_and_no_sandbox() {
        let empty = Some("populated 0\nfrozen 0\n");
        let busy = Some("populated 1\nfrozen 0\n");
        assert!(idle(7, "7\n", None, None));
        assert!(idle(7, "", Some("7\n"), empty));
        assert!(idle(7, "", Some(""), empty));
        // Another husk process in the scope or its leaf, or a sandbox still running.
        assert!(!idle(7, "7\n8\n", None, None));
        assert!(!idle(7, "", Some("7\n9\n"), empty));
        assert!(!idle(7, "7\n", Some(""), busy));
        assert!(!idle(7, "junk\n", None, None));
    }
}
