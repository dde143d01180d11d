//! A cgroup per sandbox, under the husk process's own cgroup in every hierarchy, on cgroup v1,
//! v2 and hybrid hosts.
//!
//! On a hybrid host (v1 controllers, v2 core files) memory/pids/cpu limits come from the v1
//! hierarchies that carry those controllers, and the unified v2 hierarchy still gives
//! `cgroup.kill` and `cgroup.freeze`. On a pure v2 host everything lives in one directory.
//! Each controller is taken from v1 if a v1 hierarchy has it, else from v2.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of cgroup discovery and management.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The host has no hierarchy carrying a controller husk needs.
    #[error("cgroup controller `{0}` is not available on this host (neither v1 nor v2); enable it in the kernel/boot options")]
    MissingController(&'static str),
    /// Reading the process's cgroup membership or the mount table failed.
    #[error("cannot discover cgroups: {0}")]
    Discover(String),
    /// A file operation on a cgroup failed.
    #[error("cgroup {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The cgroup still had processes after the kill deadline.
    #[error("cgroup {0} still has processes after kill")]
    NotEmpty(PathBuf),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The controllers husk uses for limits.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// Where each hierarchy's sandbox parent directory is.
#[derive(Debug, Clone)]
pub struct CgroupLayout {
    /// v1 directories by controller name (memory, pids, cpu, freezer), each `<own>/husk`.
    v1: Vec<(&'static str, PathBuf)>,
    /// `<own>/husk` in the unified hierarchy, if one is mounted.
    v2: Option<PathBuf>,
    /// Controllers served by v2 (those no v1 hierarchy carries).
    v2_controllers: Vec<&'static str>,
}

struct Mount {
    point: PathBuf,
    root: String,
    v2: bool,
    options: Vec<String>,
}

fn parse_mounts(mountinfo: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((pre, post)) = line.split_once(" - ") else {
            continue;
        };
        let pre: Vec<&str> = pre.split(' ').collect();
        let post: Vec<&str> = post.split(' ').collect();
        if pre.len() < 5 || post.len() < 3 {
            continue;
        }
        let v2 = match post[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        out.push(Mount {
            point: PathBuf::from(crate::mountinfo::unescape(pre[4])),
            root: crate::mountinfo::unescape(pre[3]),
            v2,
            options: post[2].split(',').map(str::to_owned).collect(),
        });
    }
    out
}

/// Joins a hierarchy mount point and a cgroup path as seen in /proc/self/cgroup, accounting for
/// a mount whose root is not the hierarchy's root (inside a cgroup namespace).
fn join(mount: &Mount, own: &str) -> PathBuf {
    let rel = own.strip_prefix(mount.root.as_str()).unwrap_or(own);
    mount.point.join(rel.trim_start_matches('/'))
}

impl CgroupLayout {
    /// Discovers the hierarchies from /proc/self/cgroup and /proc/self/mountinfo.
    pub fn discover() -> Result<Self, CgroupError> {
        let cg = fs::read_to_string("/proc/self/cgroup")
            .map_err(|e| CgroupError::Discover(format!("/proc/self/cgroup: {e}")))?;
        let mi = fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| CgroupError::Discover(format!("/proc/self/mountinfo: {e}")))?;
        Self::from_tables(&cg, &mi)
    }

    fn from_tables(cgroup: &str, mountinfo: &str) -> Result<Self, CgroupError> {
        let mounts = parse_mounts(mountinfo);
        let mut v1 = Vec::new();
        let mut v2 = None;
        for line in cgroup.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if ctrls.is_empty() {
                if let Some(m) = mounts.iter().find(|m| m.v2) {
                    v2 = Some(join(m, path).join("husk"));
                }
                continue;
            }
            for want in ["memory", "pids", "cpu", "freezer"] {
                if !ctrls.split(',').any(|c| c == want) {
                    continue;
                }
                if let Some(m) = mounts
                    .iter()
                    .find(|m| !m.v2 && m.options.iter().any(|o| o == want))
                {
                    v1.push((want, join(m, path).join("husk")));
                }
            }
        }
        let mut v2_controllers = Vec::new();
        for c in CONTROLLERS {
            if v1.iter().any(|(n, _)| *n == c) {
                continue;
            }
            let available = v2
                .as_ref()
                .and_then(|p| p.parent().map(|p| p.join("cgroup.controllers")))
                .and_then(|p| fs::read_to_string(p).ok())
                .is_some_and(|s| s.split_whitespace().any(|x| x == c));
            if !available {
                return Err(CgroupError::MissingController(c));
            }
            v2_controllers.push(c);
        }
        if v2.is_none() && !v1.iter().any(|(n, _)| *n == "freezer") {
            return Err(CgroupError::MissingController("freezer"));
        }
        Ok(CgroupLayout {
            v1,
            v2,
            v2_controllers,
        })
    }

    /// The `husk` parent directories, one per hierarchy used.
    pub fn parents(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self.v1.iter().map(|(_, p)| p.clone()).collect();
        out.extend(self.v2.clone());
        out
    }

    /// Creates the parent directories and, on v2, delegates the controllers husk needs to them.
    pub fn prepare(&mut self) -> Result<(), CgroupError> {
        if let Some(v2) = &self.v2 {
            fs::create_dir_all(v2).map_err(io_err(v2))?;
            // The v2 core files (cgroup.freeze, cgroup.kill) replace the v1 freezer where the
            // kernel has them, which saves a hierarchy per sandbox.
            if v2.join("cgroup.freeze").exists() && v2.join("cgroup.kill").exists() {
                self.v1.retain(|(n, _)| *n != "freezer");
            }
        }
        for p in self.parents() {
            fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
        if let (Some(v2), false) = (&self.v2, self.v2_controllers.is_empty()) {
            let enable: String = self
                .v2_controllers
                .iter()
                .map(|c| format!("+{c} "))
                .collect();
            let own = v2.parent().unwrap_or(v2);
            // v2's "no internal processes" rule: controllers can only be delegated below a
            // cgroup that has no processes of its own. If husk shares its cgroup, it moves itself
            // into a leaf first.
            let st = own.join("cgroup.subtree_control");
            if let Err(e) = fs::write(&st, &enable) {
                if e.raw_os_error() != Some(libc::EBUSY) {
                    return Err(CgroupError::Io {
                        path: st,
                        source: e,
                    });
                }
                let leaf = own.join("husk-spawner");
                fs::create_dir_all(&leaf).map_err(io_err(&leaf))?;
                let procs = leaf.join("cgroup.procs");
                fs::write(&procs, "0").map_err(io_err(&procs))?;
                fs::write(&st, &enable).map_err(io_err(&st))?;
            }
            let st = v2.join("cgroup.subtree_control");
            fs::write(&st, &enable).map_err(io_err(&st))?;
        }
        Ok(())
    }

    /// Names of the sandbox cgroups that exist under the husk parents (for reaping).
    pub fn existing(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        for p in self.parents() {
            let Ok(rd) = fs::read_dir(&p) else { continue };
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if !names.contains(&n) {
                        names.push(n);
                    }
                }
            }
        }
        names
    }

    /// Creates the cgroup `name` with the limits of `spec` in every hierarchy.
    pub fn create(
        &self,
        name: &str,
        spec: &crate::SandboxSpec,
    ) -> Result<SandboxCgroup, CgroupError> {
        let cg = self.create_v2(name)?;
        match cg.complete(spec) {
            Ok(()) => Ok(cg),
            Err(e) => {
                let _ = cg.remove();
                Err(e)
            }
        }
    }

    /// First half of [`CgroupLayout::create`]: only the v2 directory, which must exist before
    /// the sandbox's first process is cloned into it. [`SandboxCgroup::complete`] does the rest
    /// while that process builds its root filesystem.
    pub fn create_v2(&self, name: &str) -> Result<SandboxCgroup, CgroupError> {
        let cg = self.handle(name);
        if let Some(d) = &cg.v2 {
            fs::create_dir(d).map_err(io_err(d))?;
        }
        Ok(cg)
    }

    /// A handle on the (possibly existing) cgroup `name`, without creating anything.
    pub fn handle(&self, name: &str) -> SandboxCgroup {
        SandboxCgroup {
            v1: self.v1.iter().map(|(c, p)| (*c, p.join(name))).collect(),
            v2: self.v2.as_ref().map(|p| p.join(name)),
            v2_controllers: self.v2_controllers.clone(),
        }
    }
}

/// A sandbox's resource usage, read from its cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupStats {
    /// Memory charged to the sandbox, page cache included.
    pub memory_bytes: u64,
    /// Of which page cache.
    pub memory_cache: u64,
    /// CPU time used by all its processes, in nanoseconds.
    pub cpu_usage_ns: u64,
}

/// One sandbox's cgroup directories.
#[derive(Debug)]
pub struct SandboxCgroup {
    v1: Vec<(&'static str, PathBuf)>,
    v2: Option<PathBuf>,
    v2_controllers: Vec<&'static str>,
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let p = dir.join(file);
    fs::write(&p, value).map_err(io_err(&p))
}

impl SandboxCgroup {
    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.v1.iter().map(|(_, p)| p).chain(self.v2.iter())
    }

    fn v1_dir(&self, controller: &str) -> Option<&Path> {
        self.v1
            .iter()
            .find(|(c, _)| *c == controller)
            .map(|(_, p)| p.as_path())
    }

    /// Creates the v1 directories and writes every limit of `spec` (second half of creation).
    /// Until the sandbox's first process joins them it runs no code of the sandbox's, so the
    /// limits are in place before anything they are meant to bound.
    ///
    /// The memory limit is [`crate::SandboxSpec::memory_cgroup_bytes`]: the processes' memory
    /// plus the files the sandbox keeps in RAM (its tmpfs writable layer and `/dev/shm`), which
    /// are charged to this cgroup too.
    pub fn complete(&self, spec: &crate::SandboxSpec) -> Result<(), CgroupError> {
        for (_, d) in &self.v1 {
            fs::create_dir(d).map_err(io_err(d))?;
        }
        let limits = &spec.limits;
        let memory = spec.memory_cgroup_bytes().to_string();
        let period: u64 = 100_000;
        let quota = (limits.cpu_millis.saturating_mul(period) / 1000).max(1000);
        if let Some(d) = self.v1_dir("memory") {
            write(d, "memory.limit_in_bytes", &memory)?;
            // memsw exists only with swap accounting; without it there is no swap to limit.
            // The same figure: no swap, and tmpfs pages may not be swapped out to make room.
            if d.join("memory.memsw.limit_in_bytes").exists() {
                write(d, "memory.memsw.limit_in_bytes", &memory)?;
            }
        }
        if let Some(d) = self.v1_dir("pids") {
            write(d, "pids.max", &limits.pids.to_string())?;
        }
        if let Some(d) = self.v1_dir("cpu") {
            write(d, "cpu.cfs_period_us", &period.to_string())?;
            write(d, "cpu.cfs_quota_us", &quota.to_string())?;
        }
        if let Some(d) = &self.v2 {
            for c in &self.v2_controllers {
                match *c {
                    "memory" => {
                        write(d, "memory.max", &memory)?;
                        if d.join("memory.swap.max").exists() {
                            write(d, "memory.swap.max", "0")?;
                        }
                    }
                    "pids" => write(d, "pids.max", &limits.pids.to_string())?,
                    "cpu" => write(d, "cpu.max", &format!("{quota} {period}"))?,
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// The v2 directory as an fd, for `clone3(CLONE_INTO_CGROUP)`.
    ///
    /// Why not write to `cgroup.procs` later: moving a whole thread group takes the global
    /// `cgroup_threadgroup_rwsem` for writing, which waits for an RCU grace period (~8 ms
    /// measured here). Being born into the cgroup, or a single-threaded process moving itself
    /// through v1's `tasks` file ([`SandboxCgroup::v1_tasks`]), skips that lock.
    pub fn v2_dir(&self) -> Result<Option<OwnedFd>, CgroupError> {
        match &self.v2 {
            Some(d) => Ok(Some(
                fs::File::open(d).map(OwnedFd::from).map_err(io_err(d))?,
            )),
            None => Ok(None),
        }
    }

    /// Every v1 hierarchy's `tasks` file opened for writing: the sandbox's first process writes
    /// "0" to each to join (see [`SandboxCgroup::v2_dir`] for why not `cgroup.procs`).
    pub fn v1_tasks(&self) -> Result<Vec<OwnedFd>, CgroupError> {
        self.v1
            .iter()
            .map(|(_, d)| {
                let p = d.join("tasks");
                fs::OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .map(OwnedFd::from)
                    .map_err(io_err(&p))
            })
            .collect()
    }

    /// How many times the OOM killer fired in this cgroup.
    pub fn oom_kills(&self) -> u64 {
        let from = |path: PathBuf, key: &str| -> Option<u64> {
            let s = fs::read_to_string(path).ok()?;
            s.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        };
        if let Some(d) = self.v1_dir("memory") {
            return from(d.join("memory.oom_control"), "oom_kill ").unwrap_or(0);
        }
        self.v2
            .as_ref()
            .and_then(|d| from(d.join("memory.events"), "oom_kill "))
            .unwrap_or(0)
    }

    /// Freezes every process of the sandbox and waits until the kernel reports it frozen.
    pub fn freeze(&self) -> Result<(), CgroupError> {
        self.set_frozen(true)
    }

    fn set_frozen(&self, frozen: bool) -> Result<(), CgroupError> {
        let deadline = Instant::now() + Duration::from_secs(5);
        if let Some(d) = self
            .v2
            .as_ref()
            .filter(|d| d.join("cgroup.freeze").exists())
        {
            write(d, "cgroup.freeze", if frozen { "1" } else { "0" })?;
            let want = if frozen { "frozen 1" } else { "frozen 0" };
            return poll_until(deadline, || {
                fs::read_to_string(d.join("cgroup.events"))
                    .map(|s| s.lines().any(|l| l == want))
                    .unwrap_or(true)
            })
            .ok_or_else(|| CgroupError::NotEmpty(d.clone()));
        }
        if let Some(d) = self.v1_dir("freezer") {
            let want = if frozen { "FROZEN" } else { "THAWED" };
            write(d, "freezer.state", want)?;
            return poll_until(deadline, || {
                fs::read_to_string(d.join("freezer.state"))
                    .map(|s| s.trim() == want)
                    .unwrap_or(true)
            })
            .ok_or_else(|| CgroupError::NotEmpty(d.to_owned()));
        }
        Ok(())
    }

    /// Kills every process in the sandbox's cgroups: `cgroup.kill` where the kernel has it,
    /// else freeze, SIGKILL each member, thaw (so no process can fork past the kill).
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        if let Some(d) = self.v2.as_ref().filter(|d| d.join("cgroup.kill").exists()) {
            write(d, "cgroup.kill", "1")?;
            return Ok(());
        }
        self.set_frozen(true)?;
        for d in self.dirs() {
            for pid in read_pids(d) {
                let _ = crate::sys::kill(pid, libc::SIGKILL);
            }
        }
        self.set_frozen(false)
    }

    /// Whether any of the directories exists.
    pub fn exists(&self) -> bool {
        self.dirs().any(|d| d.exists())
    }

    /// Removes every directory; waits (bounded) for exiting processes to leave first.
    pub fn remove(&self) -> Result<(), CgroupError> {
        self.remove_within(Duration::from_secs(10))
    }

    /// [`SandboxCgroup::remove`] with another bound on the wait.
    pub fn remove_within(&self, limit: Duration) -> Result<(), CgroupError> {
        let deadline = Instant::now() + limit;
        for d in self.dirs() {
            let done = poll_until(deadline, || match fs::remove_dir(d) {
                Ok(()) => true,
                Err(e) => e.kind() == io::ErrorKind::NotFound,
            });
            if done.is_none() {
                return Err(CgroupError::NotEmpty(d.clone()));
            }
        }
        Ok(())
    }

    /// A line-based description of the directories, for the sandbox registry (so that a husk
    /// process in another cgroup can still find and clean them up).
    pub fn to_registry(&self) -> String {
        let mut out = String::new();
        for (c, p) in &self.v1 {
            out.push_str(&format!("v1 {c} {}\n", p.display()));
        }
        if let Some(p) = &self.v2 {
            out.push_str(&format!("v2 {}\n", p.display()));
        }
        out
    }

    /// Parses [`SandboxCgroup::to_registry`]; `None` for anything malformed or outside
    /// `/sys/fs/cgroup`.
    pub fn from_registry(text: &str) -> Option<SandboxCgroup> {
        let mut cg = SandboxCgroup {
            v1: Vec::new(),
            v2: None,
            v2_controllers: Vec::new(),
        };
        for line in text.lines() {
            let mut parts = line.splitn(3, ' ');
            let kind = parts.next()?;
            let (controller, path) = match kind {
                "v1" => (Some(parts.next()?), parts.next()?),
                "v2" => (None, parts.next()?),
                _ => return None,
            };
            let path = PathBuf::from(path);
            if !path.starts_with("/sys/fs/cgroup")
                || path.components().any(|c| c.as_os_str() == "..")
            {
                return None;
            }
            match controller {
                Some(c) => {
                    let c = ["memory", "pids", "cpu", "freezer"]
                        .into_iter()
                        .find(|k| *k == c)?;
                    cg.v1.push((c, path));
                }
                None => cg.v2 = Some(path),
            }
        }
        Some(cg)
    }

    /// Current usage, from whichever hierarchy has each figure (v1 memory and v2 `cpu.stat` on
    /// hybrid hosts; all from v2 on pure v2 hosts). Missing figures read as 0.
    pub fn stats(&self) -> CgroupStats {
        let read = |p: PathBuf| fs::read_to_string(p).ok();
        let num = |p: PathBuf| read(p).and_then(|s| s.trim().parse::<u64>().ok());
        let key = |p: PathBuf, k: &str| {
            read(p).and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
            })
        };
        let mut st = CgroupStats::default();
        if let Some(d) = self.v1_dir("memory") {
            st.memory_bytes = num(d.join("memory.usage_in_bytes")).unwrap_or(0);
            st.memory_cache = key(d.join("memory.stat"), "total_cache").unwrap_or(0);
        } else if let Some(d) = &self.v2 {
            st.memory_bytes = num(d.join("memory.current")).unwrap_or(0);
            st.memory_cache = key(d.join("memory.stat"), "file").unwrap_or(0);
        }
        if let Some(usec) = self
            .v2
            .as_ref()
            .and_then(|d| key(d.join("cpu.stat"), "usage_usec"))
        {
            st.cpu_usage_ns = usec * 1000;
        } else if let Some(d) = self.v1_dir("cpu") {
            st.cpu_usage_ns = num(d.join("cpuacct.usage")).unwrap_or(0);
        }
        st
    }

    /// Every directory of this cgroup (for tests and leak checks).
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs().cloned().collect()
    }
}

fn read_pids(dir: &Path) -> Vec<libc::pid_t> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Polls `done` with short back-off until it holds or `deadline` passes.
pub(crate) fn poll_until(deadline: Instant, mut done: impl FnMut() -> bool) -> Option<()> {
    let mut pause = Duration::from_micros(50);
    loop {
        if done() {
            return Some(());
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CG: &str =
        "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/process_api/abc\n1:cpu:/\n0::/\n";
    const HYBRID_MI: &str = "\
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn hybrid_layout_uses_v1_controllers_and_own_cgroup() {
        let l = CgroupLayout::from_tables(HYBRID_CG, HYBRID_MI).unwrap();
        let mem = l.v1.iter().find(|(c, _)| *c == "memory").unwrap();
        assert_eq!(
            mem.1,
            PathBuf::from("/sys/fs/cgroup/memory/process_api/abc/husk")
        );
        assert!(l.v1.iter().any(|(c, _)| *c == "pids"));
        assert!(l.v1.iter().any(|(c, _)| *c == "cpu"));
        assert_eq!(l.v2, Some(PathBuf::from("/sys/fs/cgroup/unified/husk")));
        assert!(l.v2_controllers.is_empty());
    }

    #[test]
    fn registry_round_trips_and_rejects_foreign_paths() {
        let l = CgroupLayout::from_tables(HYBRID_CG, HYBRID_MI).unwrap();
        let cg = l.handle("s7");
        let back = SandboxCgroup::from_registry(&cg.to_registry()).unwrap();
        assert_eq!(back.paths(), cg.paths());
        assert!(SandboxCgroup::from_registry("v2 /etc\n").is_none());
        assert!(SandboxCgroup::from_registry("v2 /sys/fs/cgroup/../../etc\n").is_none());
        assert!(SandboxCgroup::from_registry("v1 devices /sys/fs/cgroup/devices/x\n").is_none());
    }

    #[test]
    fn missing_controller_is_a_clear_error() {
        let cg = "0::/\n";
        let mi = "41 31 0:38 / /nonexistent-cgroup2 rw - cgroup2 cgroup2 rw\n";
        let err = CgroupLayout::from_tables(cg, mi).unwrap_err();
        assert!(
            matches!(err, CgroupError::MissingController("memory")),
            "{err}"
        );
    }

    /// A scratch directory standing in for cgroup hierarchies, removed on drop.
    struct FakeHierarchy(PathBuf);

    impl FakeHierarchy {
        fn new() -> FakeHierarchy {
            let p = std::env::temp_dir().join(format!(
                "husk-cgroup-test-{}-{:x}",
                std::process::id(),
                crate::sys::random_u64().unwrap()
            ));
            fs::create_dir_all(&p).unwrap();
            FakeHierarchy(p)
        }

        fn read(&self, rel: &str) -> String {
            fs::read_to_string(self.0.join(rel)).unwrap()
        }
    }

    impl Drop for FakeHierarchy {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn small_spec() -> crate::SandboxSpec {
        let mut spec = crate::SandboxSpec::idle();
        spec.limits.memory_bytes = 64 << 20;
        spec.limits.disk_bytes = 8 << 20;
        spec.limits.pids = 100;
        spec.limits.cpu_millis = 500;
        spec
    }

    // Pure v2 is what most users' hosts have, and this development host cannot run it (its v2
    // hierarchy has no memory controller): the writing is checked on a fake directory.
    #[test]
    fn pure_v2_gets_memory_plus_files_in_memory_max_and_no_swap() {
        let h = FakeHierarchy::new();
        let dir = h.0.join("s1");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("memory.swap.max"), "max").unwrap();
        let cg = SandboxCgroup {
            v1: Vec::new(),
            v2: Some(dir),
            v2_controllers: vec!["memory", "pids", "cpu"],
        };
        cg.complete(&small_spec()).unwrap();
        // 64 MiB for processes + 8 MiB of disk + 64 MiB of /dev/shm.
        assert_eq!(h.read("s1/memory.max"), (136u64 << 20).to_string());
        assert_eq!(h.read("s1/memory.swap.max"), "0");
        assert_eq!(h.read("s1/pids.max"), "100");
        assert_eq!(h.read("s1/cpu.max"), "50000 100000");
    }

    #[test]
    fn v1_gets_memory_plus_files_in_memory_as_its_limit() {
        let h = FakeHierarchy::new();
        for c in ["memory", "pids"] {
            fs::create_dir(h.0.join(c)).unwrap();
        }
        let cg = SandboxCgroup {
            v1: vec![
                ("memory", h.0.join("memory/s1")),
                ("pids", h.0.join("pids/s1")),
            ],
            v2: None,
            v2_controllers: Vec::new(),
        };
        cg.complete(&small_spec()).unwrap();
        assert_eq!(
            h.read("memory/s1/memory.limit_in_bytes"),
            (136u64 << 20).to_string()
        );
        assert_eq!(h.read("pids/s1/pids.max"), "100");
    }

    #[test]
    fn mount_root_inside_cgroup_namespace_is_stripped() {
        let cg = "4:memory:/outer/inner\n6:freezer:/\n8:pids:/\n1:cpu:/\n";
        let mi = "\
35 31 0:32 /outer /cg/memory rw - cgroup cgroup rw,memory
37 31 0:34 / /cg/freezer rw - cgroup cgroup rw,freezer
39 31 0:36 / /cg/pids rw - cgroup cgroup rw,pids
32 31 0:29 / /cg/cpu rw - cgroup cgroup rw,cpu
";
        let l = CgroupLayout::from_tables(cg, mi).unwrap();
        let mem = l.v1.iter().find(|(c, _)| *c == "memory").unwrap();
        assert_eq!(mem.1, PathBuf::from("/cg/memory/inner/husk"));
    }
}
