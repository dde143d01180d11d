//! A cgroup per sandbox, under a cgroup husk may manage, on cgroup v1, v2 and hybrid hosts.
//!
//! On a hybrid host (v1 controllers, v2 core files) memory/pids/cpu limits come from the v1
//! hierarchies that carry those controllers, and the unified v2 hierarchy still gives
//! `cgroup.kill` and `cgroup.freeze`. On a pure v2 host everything lives in one directory.
//! Each controller is taken from v1 if a v1 hierarchy has it, else from v2.
//!
//! Which v2 cgroup husk may write below ([`CgroupLayout::acquire`]):
//! - on a systemd host, a delegated one: the unit husk runs in if it has `Delegate=yes` (the
//!   shipped `husk.service`), else a transient scope systemd creates for it ([`crate::systemd`]);
//! - without systemd (a container with its own cgroup namespace, a minimal VM), the cgroup it
//!   was started in.
//!
//! v2's "no internal processes" rule allows controllers below a cgroup only once it holds no
//! process itself, so every process of that cgroup (husk, and whatever shares a delegated unit
//! with it) first moves into the leaf [`LEAF`]; sandboxes go beside it, below `husk/`.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::systemd::{Delegation, SystemdError};

/// The leaf cgroup that takes the processes of the cgroup husk manages (v2 only).
pub const LEAF: &str = "husk-leaf";

/// The file in the run directory that names the scope husk processes share.
const SHARED_SCOPE_STATE: &str = "run-scope";

/// A controller husk uses for limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Controller {
    Memory,
    Pids,
    Cpu,
}

impl Controller {
    /// All of them, in the order limits are written.
    pub const ALL: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];

    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
        }
    }

    /// What a missing controller leaves unenforced, for messages.
    fn limit(self) -> &'static str {
        match self {
            Controller::Memory => "memory limits (--memory, and --disk kept in RAM)",
            Controller::Pids => "process limits (--pids)",
            Controller::Cpu => "CPU limits (--cpus)",
        }
    }
}

impl std::str::FromStr for Controller {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Controller::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("unknown cgroup controller `{s}` (memory, pids or cpu)"))
    }
}

/// Why a controller is not there, which decides the remedy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lack {
    /// The kernel has it in no hierarchy.
    Kernel,
    /// The kernel has it, but it is not enabled for `cgroup` (its parent's
    /// `cgroup.subtree_control` lacks it), which husk may not change.
    NotDelegated { cgroup: PathBuf, systemd: bool },
}

/// Errors of cgroup discovery and management.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// A controller husk needs is not available to it.
    #[error("{}", missing_message(*.controller, .lack))]
    MissingController { controller: Controller, lack: Lack },
    /// Reading the process's cgroup membership or the mount table failed.
    #[error("cannot discover cgroups: {0}")]
    Discover(String),
    /// systemd runs this host but gave husk no delegated cgroup.
    #[error("{0}; husk needs a cgroup delegated by systemd: run it as the shipped unit (dist/husk.service, `Delegate=yes`) or under `systemd-run --scope -p Delegate=yes husk ...`; `husk doctor` checks this host")]
    Systemd(#[source] SystemdError),
    /// The cgroup husk manages kept processes that could not be moved into [`LEAF`].
    #[error("cgroup {} still holds processes {pids:?} that could not be moved into its leaf {LEAF}/", .cgroup.display())]
    Busy { cgroup: PathBuf, pids: Vec<i32> },
    /// The cgroup husk manages cannot be written (a container's read-only `/sys/fs/cgroup`).
    #[error("cannot manage cgroups below {}: {source}; husk needs a writable cgroup it may manage (in a container: a private cgroup namespace with /sys/fs/cgroup mounted read-write, e.g. `docker run --privileged --cgroupns=private`); `husk doctor` checks this host", .cgroup.display())]
    NotWritable {
        cgroup: PathBuf,
        #[source]
        source: io::Error,
    },
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

fn missing_message(c: Controller, lack: &Lack) -> String {
    let name = c.name();
    let optout = format!(
        "or accept running without {} by starting husk with `--unenforced-limits {name}`; `husk doctor` checks this host",
        c.limit()
    );
    match lack {
        Lack::Kernel => format!(
            "this kernel has no `{name}` cgroup controller (in neither cgroup v1 nor v2): enable it in the kernel configuration or boot options (`cgroup_disable=`, `systemd.unified_cgroup_hierarchy`), {optout}"
        ),
        Lack::NotDelegated { cgroup, systemd: true } => format!(
            "the `{name}` cgroup controller exists but systemd did not delegate it to {}: run husk as the shipped unit (dist/husk.service, `Delegate=yes`) or under `systemd-run --scope -p Delegate=yes`, {optout}",
            cgroup.display()
        ),
        Lack::NotDelegated { cgroup, systemd: false } => {
            let parent = cgroup.parent().unwrap_or(cgroup);
            format!(
                "the `{name}` cgroup controller exists but is not enabled for {} (husk's cgroup): enable it from outside, `echo +{name} > {}/cgroup.subtree_control` on the host (for a container: give it a cgroup namespace whose cgroup has `{name}` delegated, e.g. Docker with cgroup v2), {optout}",
                cgroup.display(),
                parent.display()
            )
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the operator allowed husk to do without.
#[derive(Debug, Clone, Default)]
pub struct CgroupOptions {
    /// Controllers whose limits the operator accepts not to enforce where the host lacks them
    /// (`--unenforced-limits`). husk still uses them where it can get them.
    pub unenforced: Vec<Controller>,
    /// On a systemd host, a transient scope of its own (see [`crate::systemd`]) even when
    /// the unit it runs in is delegated: a server's sandboxes outlive it (see
    /// [`crate::keep`]), and its unit's cgroup is no place for them: systemd kills what is
    /// left there when it stops the unit, and cannot start it again while a sub-cgroup with
    /// controllers holds processes.
    pub own_scope: bool,
    /// On a systemd host, outside a delegated unit, and without `own_scope`: share one scope
    /// with the other husk processes of the run directory, kept this long after the last one
    /// ends ([`crate::shared_scope`]); `None` asks systemd for a scope of its own each time.
    pub shared_scope_linger: Option<Duration>,
}

/// How husk got the cgroup it manages, for logs and `husk doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Every controller comes from cgroup v1 (hybrid and v1 hosts): below husk's own cgroups.
    V1,
    /// systemd delegated husk's unit, or a scope it created for husk.
    Systemd(Delegation),
    /// No systemd: the cgroup husk was started in.
    Own,
}

/// Where each hierarchy's sandbox parent directory is.
#[derive(Debug, Clone)]
pub struct CgroupLayout {
    /// v1 directories by controller name (memory, pids, cpu, freezer), each `<own>/husk`.
    v1: Vec<(&'static str, PathBuf)>,
    /// `<base>/husk` in the unified hierarchy, if one is mounted.
    v2: Option<PathBuf>,
    /// Controllers served by v2 (those no v1 hierarchy carries), once [`CgroupLayout::prepare`]
    /// found them; before, those husk needs from v2.
    v2_controllers: Vec<&'static str>,
    /// Controllers the host does not give husk and the operator accepted to go without.
    unenforced: Vec<Controller>,
    origin: Origin,
    /// Controllers this process enabled in `<base>`'s `cgroup.subtree_control` (not enabled
    /// before), to be disabled again by [`CgroupLayout::release`].
    enabled_in_base: Vec<&'static str>,
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

/// The v2 cgroup husk manages given the one it runs in: the parent if it runs in [`LEAF`]
/// (an earlier husk process of the same unit moved it there).
fn base_of(own: PathBuf) -> PathBuf {
    match own.parent() {
        Some(parent) if own.file_name().is_some_and(|n| n == LEAF) => parent.to_owned(),
        _ => own,
    }
}

impl CgroupLayout {
    /// Gets a cgroup husk may manage and prepares it ([`CgroupLayout::prepare`]): on a systemd
    /// host whose controllers come from v2, asks systemd for delegation first (see the module
    /// documentation). `run_dir` holds the state of the scope shared by husk processes
    /// ([`CgroupOptions::shared_scope_linger`]). The caller must be single-threaded.
    pub fn acquire(options: &CgroupOptions, run_dir: &Path) -> Result<Self, CgroupError> {
        let mut layout = Self::discover()?;
        if !layout.v2_controllers.is_empty() && crate::systemd::booted() {
            // A unit's cgroup is named after the unit (`husk.service`).
            let marked_unit = layout
                .v2
                .as_ref()
                .and_then(|p| p.parent())
                .filter(|base| !options.own_scope && marked_delegated(base))
                .and_then(|base| base.file_name())
                .map(|name| name.to_string_lossy().into_owned());
            let delegation = match (marked_unit, options.shared_scope_linger) {
                (Some(unit), _) => Delegation::Delegated { unit },
                (None, Some(linger)) if !options.own_scope => {
                    // The unit the process leaves, for logs: its cgroup's name.
                    let from = layout
                        .v2
                        .as_ref()
                        .and_then(|p| p.parent()?.file_name())
                        .map_or_else(|| "?".into(), |n| n.to_string_lossy().into_owned());
                    crate::shared_scope::delegate(&run_dir.join(SHARED_SCOPE_STATE), linger, from)
                        .map_err(CgroupError::Systemd)?
                }
                (None, _) => crate::systemd::ensure_delegated_with(options.own_scope)
                    .map_err(CgroupError::Systemd)?,
            };
            if matches!(delegation, Delegation::Scope { .. }) {
                layout = Self::discover()?;
            }
            layout.origin = Origin::Systemd(delegation);
        }
        layout.prepare(options)?;
        Ok(layout)
    }

    /// What [`CgroupLayout::acquire`] would do from this process, without doing it (no scope,
    /// no move, no write): one line on where sandboxes' cgroups would go and how husk gets
    /// them, or the refusal `acquire` would give (for `husk doctor`).
    pub fn diagnose() -> Result<String, CgroupError> {
        let layout = Self::discover()?;
        let Some(v2) = layout
            .v2
            .as_ref()
            .filter(|_| !layout.v2_controllers.is_empty())
        else {
            let parents: Vec<String> = layout
                .parents()
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            return Ok(format!(
                "memory, pids, cpu from cgroup v1; sandboxes' cgroups under {}",
                parents.join(", ")
            ));
        };
        let base = v2.parent().unwrap_or(v2);
        let needed = layout.v2_controllers.join(", ");
        if crate::systemd::booted() && !marked_delegated(base) {
            // systemd enables every controller of the hierarchy for a delegated scope.
            let root = mount_root_of(base);
            check_available(&root, &layout.v2_controllers, &[])?;
            return Ok(format!(
                "{needed} from cgroup v2: {} is not delegated, so husk asks systemd (D-Bus) for a transient scope with Delegate=yes at start (husk serve does everywhere, so that its sandboxes outlive it); husk processes from here share one, husk-run-<pid>.scope, kept 60 s after the last (HUSK_SCOPE_LINGER), so only the first waits for systemd",
                base.display()
            ));
        }
        check_available(base, &layout.v2_controllers, &[])?;
        let how = if crate::systemd::booted() {
            "delegated by systemd"
        } else {
            "no systemd: the cgroup husk starts in"
        };
        Ok(format!(
            "{needed} from cgroup v2 in {} ({how}); sandboxes' cgroups under {}",
            base.display(),
            v2.display()
        ))
    }

    /// Discovers the hierarchies from /proc/self/cgroup and /proc/self/mountinfo.
    pub fn discover() -> Result<Self, CgroupError> {
        Self::discover_for(None)
    }

    /// [`CgroupLayout::discover`] as process `pid` would see it from this mount namespace
    /// (this process with `None`).
    fn discover_for(pid: Option<libc::pid_t>) -> Result<Self, CgroupError> {
        let cgroup = pid.map_or_else(
            || "/proc/self/cgroup".to_owned(),
            |p| format!("/proc/{p}/cgroup"),
        );
        let cg = fs::read_to_string(&cgroup)
            .map_err(|e| CgroupError::Discover(format!("{cgroup}: {e}")))?;
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
                    v2 = Some(base_of(join(m, path)).join("husk"));
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
        let v2_controllers: Vec<&'static str> = Controller::ALL
            .into_iter()
            .map(Controller::name)
            .filter(|c| !v1.iter().any(|(n, _)| n == c))
            .collect();
        if v2.is_none() && !v1.iter().any(|(n, _)| *n == "freezer") {
            return Err(CgroupError::Discover(
                "neither a cgroup v2 hierarchy nor a v1 freezer is mounted: mount cgroup2 at /sys/fs/cgroup".into(),
            ));
        }
        Ok(CgroupLayout {
            v1,
            v2,
            v2_controllers,
            unenforced: Vec::new(),
            origin: Origin::Own,
            enabled_in_base: Vec::new(),
        })
    }

    /// How husk got its cgroup.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// Controllers whose limits are not enforced (the operator's `--unenforced-limits`, where
    /// the host lacks them).
    pub fn unenforced(&self) -> &[Controller] {
        &self.unenforced
    }

    /// One line for logs: where sandboxes' cgroups go, how husk got there, what is enforced.
    pub fn summary(&self) -> String {
        let whence = match &self.origin {
            Origin::V1 => "cgroup v1 controllers below husk's own cgroups".to_owned(),
            Origin::Own => "the cgroup husk was started in (no systemd)".to_owned(),
            Origin::Systemd(Delegation::Delegated { unit }) => {
                format!("delegated by systemd to {unit}")
            }
            Origin::Systemd(Delegation::Scope { unit, from }) => {
                format!("systemd scope {unit} with Delegate=yes (started from {from})")
            }
        };
        let place = self
            .v2
            .as_ref()
            .or(self.v1.first().map(|(_, p)| p))
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let mut out = format!("sandbox cgroups in {place}: {whence}");
        if !self.unenforced.is_empty() {
            let names: Vec<&str> = self.unenforced.iter().map(|c| c.name()).collect();
            out.push_str(&format!(
                "; NOT ENFORCED (--unenforced-limits): {}",
                names.join(", ")
            ));
        }
        out
    }

    /// The `husk` parent directories, one per hierarchy used.
    pub fn parents(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self.v1.iter().map(|(_, p)| p.clone()).collect();
        out.extend(self.v2.clone());
        out
    }

    /// Creates the parent directories and, on v2, enables the controllers husk needs for them
    /// (moving the processes of the cgroup it manages into [`LEAF`] where v2 requires it).
    pub fn prepare(&mut self, options: &CgroupOptions) -> Result<(), CgroupError> {
        if self.v2_controllers.is_empty() {
            self.origin = match self.origin {
                Origin::Own => Origin::V1,
                ref o => o.clone(),
            };
        }
        if let Some(v2) = &self.v2 {
            let base = v2.parent().unwrap_or(v2).to_owned();
            let (enabled, unenforced) =
                check_available(&base, &self.v2_controllers, &options.unenforced)?;
            self.v2_controllers = enabled;
            self.unenforced = unenforced;
            if !self.v2_controllers.is_empty() {
                let before =
                    fs::read_to_string(base.join("cgroup.subtree_control")).unwrap_or_default();
                self.enabled_in_base = self
                    .v2_controllers
                    .iter()
                    .copied()
                    .filter(|c| !before.split_whitespace().any(|b| b == *c))
                    .collect();
                self.enable_v2(&base, v2)?;
            }
            fs::create_dir_all(v2).map_err(io_err(v2))?;
            // The v2 core files (cgroup.freeze, cgroup.kill) replace the v1 freezer where the
            // kernel has them, which saves a hierarchy per sandbox.
            if v2.join("cgroup.freeze").exists() && v2.join("cgroup.kill").exists() {
                self.v1.retain(|(n, _)| *n != "freezer");
            }
        } else if !self.v2_controllers.is_empty() {
            return Err(CgroupError::MissingController {
                controller: Controller::ALL
                    .into_iter()
                    .find(|c| c.name() == self.v2_controllers[0])
                    .unwrap_or(Controller::Memory),
                lack: Lack::Kernel,
            });
        }
        for p in self.parents() {
            fs::create_dir_all(&p).map_err(io_err(&p))?;
        }
        Ok(())
    }

    /// Enables husk's controllers below `base` (moving its processes into [`LEAF`] if need be)
    /// and in `v2` (`<base>/husk`, created).
    fn enable_v2(&self, base: &Path, v2: &Path) -> Result<(), CgroupError> {
        let enable: String = self
            .v2_controllers
            .iter()
            .map(|c| format!("+{c} "))
            .collect();
        enable_below(base, &enable)?;
        fs::create_dir_all(v2).map_err(io_err(v2))?;
        let st = v2.join("cgroup.subtree_control");
        fs::write(&st, &enable).map_err(io_err(&st))
    }

    /// Gives back what [`CgroupLayout::prepare`] changed in a cgroup husk shares (a delegated
    /// unit with other processes, a container's cgroup), once no husk sandbox is left in it:
    /// removes `<base>/husk`, disables the controllers it enabled in `<base>` and moves the
    /// processes of [`LEAF`] back. Nothing on hybrid hosts, and nothing while another husk
    /// process has sandboxes there (its `husk/` is not empty); a husk process that starts
    /// meanwhile prepares again ([`CgroupLayout::create_v2`]).
    pub fn release(&self) {
        let Some(v2) = &self.v2 else { return };
        if self.v2_controllers.is_empty() || fs::remove_dir(v2).is_err() {
            return;
        }
        let Some(base) = v2.parent() else { return };
        if !self.enabled_in_base.is_empty() {
            let disable: String = self
                .enabled_in_base
                .iter()
                .map(|c| format!("-{c} "))
                .collect();
            if fs::write(base.join("cgroup.subtree_control"), disable).is_err() {
                return;
            }
        }
        let leaf = base.join(LEAF);
        if leaf.is_dir() && move_all(&leaf, base).is_ok() {
            let _ = fs::remove_dir(&leaf);
        }
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
            match fs::create_dir(d) {
                // Another husk process of the same cgroup gave it back as it ended (release).
                Err(e)
                    if e.kind() == io::ErrorKind::NotFound && !self.v2_controllers.is_empty() =>
                {
                    if let (Some(v2), Some(base)) =
                        (&self.v2, self.v2.as_ref().and_then(|p| p.parent()))
                    {
                        self.enable_v2(base, v2)?;
                    }
                    fs::create_dir(d).map_err(io_err(d))?;
                }
                other => other.map_err(io_err(d))?,
            }
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

/// The mount point of the cgroup v2 hierarchy that holds `cgroup` (the topmost cgroup this
/// process sees).
fn mount_root_of(cgroup: &Path) -> PathBuf {
    let mut root = cgroup;
    while let Some(parent) = root.parent() {
        if !parent.join("cgroup.controllers").exists() {
            break;
        }
        root = parent;
    }
    root.to_owned()
}

/// The v2 cgroup husk would manage for process `pid` (this process with `None`): its cgroup, or
/// the parent of its [`LEAF`]. `None` where it is gone or has no v2 cgroup.
pub(crate) fn v2_base_of(pid: Option<libc::pid_t>) -> Option<PathBuf> {
    let layout = CgroupLayout::discover_for(pid).ok()?;
    layout.v2?.parent().map(Path::to_owned)
}

/// Whether systemd marked `cgroup` as delegated (the `trusted.delegate` attribute it sets on
/// the cgroup of every unit with `Delegate=yes`, since systemd 251). Older systemd is asked
/// over D-Bus instead.
pub(crate) fn marked_delegated(cgroup: &Path) -> bool {
    crate::sys::cpath(cgroup)
        .ok()
        .and_then(|p| crate::sys::getxattr(&p, "trusted.delegate").ok().flatten())
        .is_some_and(|v| v == b"1")
}

/// Which of `needed` the cgroup `base` can give its children (its `cgroup.controllers`), and
/// which missing ones the operator accepted to go without; an error for any other.
fn check_available(
    base: &Path,
    needed: &[&'static str],
    unenforced: &[Controller],
) -> Result<(Vec<&'static str>, Vec<Controller>), CgroupError> {
    let list = base.join("cgroup.controllers");
    let available = fs::read_to_string(&list).map_err(io_err(&list))?;
    let (mut have, mut without) = (Vec::new(), Vec::new());
    for &name in needed {
        if available.split_whitespace().any(|c| c == name) {
            have.push(name);
            continue;
        }
        let controller = name.parse::<Controller>().map_err(CgroupError::Discover)?;
        if unenforced.contains(&controller) {
            without.push(controller);
            continue;
        }
        let lack = if kernel_has(name) {
            Lack::NotDelegated {
                cgroup: base.to_owned(),
                systemd: crate::systemd::booted(),
            }
        } else {
            Lack::Kernel
        };
        return Err(CgroupError::MissingController { controller, lack });
    }
    Ok((have, without))
}

/// Whether the kernel has `controller` enabled at all (/proc/cgroups, which lists every
/// controller the kernel was built with, in any hierarchy or none).
fn kernel_has(controller: &str) -> bool {
    fs::read_to_string("/proc/cgroups").is_ok_and(|s| {
        s.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.first() == Some(&controller) && f.get(3) == Some(&"1")
        })
    })
}

/// Enables `enable` ("+memory +pids ...") in `base`'s `cgroup.subtree_control`. If `base` holds
/// processes (v2 refuses with EBUSY), they all move into [`LEAF`] first: husk itself, and in a
/// delegated unit whatever else runs there (the script that called husk, say).
fn enable_below(base: &Path, enable: &str) -> Result<(), CgroupError> {
    let st = base.join("cgroup.subtree_control");
    match fs::write(&st, enable) {
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EROFS | libc::EACCES | libc::EPERM)
            ) =>
        {
            return Err(CgroupError::NotWritable {
                cgroup: base.to_owned(),
                source: e,
            })
        }
        other => return other.map_err(io_err(&st)),
    }
    move_all(base, &base.join(LEAF))?;
    fs::write(&st, enable).map_err(io_err(&st))
}

/// Moves every process of `from` into `to` (created if needed), until `from` is empty: a
/// process may fork while the others move, so this repeats, within a deadline.
fn move_all(from: &Path, to: &Path) -> Result<(), CgroupError> {
    fs::create_dir_all(to).map_err(io_err(to))?;
    let procs = to.join("cgroup.procs");
    let mut failed = None;
    let emptied = poll_until(Instant::now() + Duration::from_secs(5), || {
        let pids = read_pids(from);
        for pid in &pids {
            match fs::write(&procs, pid.to_string()) {
                Ok(()) => {}
                // Gone meanwhile.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => {
                    failed = Some(e);
                    return true;
                }
            }
        }
        pids.is_empty()
    });
    if let Some(source) = failed {
        return Err(CgroupError::Io {
            path: procs,
            source,
        });
    }
    emptied.ok_or_else(|| CgroupError::Busy {
        cgroup: from.to_owned(),
        pids: read_pids(from),
    })
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
    /// plus the files the sandbox keeps in RAM (its tmpfs: the writable layer, `/dev` and
    /// `/dev/shm`), which are charged to this cgroup too.
    pub fn complete(&self, spec: &crate::SandboxSpec) -> Result<(), CgroupError> {
        for (_, d) in &self.v1 {
            fs::create_dir(d).map_err(io_err(d))?;
        }
        self.write_limits(&spec.limits, spec.memory_cgroup_bytes())
    }

    /// Writes `limits` with `memory` as the memory cgroup's limit ([`SandboxCgroup::complete`];
    /// again, lower, when a warm sandbox is claimed with limits of its own).
    pub fn write_limits(
        &self,
        limits: &crate::spec::Limits,
        memory: u64,
    ) -> Result<(), CgroupError> {
        let memory = memory.to_string();
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

    /// Lets the processes of a frozen sandbox run again, and waits until the kernel says so.
    pub fn thaw(&self) -> Result<(), CgroupError> {
        self.set_frozen(false)
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

    /// The memory charged and the tasks counted now, where this host counts them.
    pub fn usage(&self) -> (Option<u64>, Option<u64>) {
        let num = |d: &Path, f: &str| {
            fs::read_to_string(d.join(f))
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
        };
        let memory = match (self.v1_dir("memory"), &self.v2) {
            (Some(d), _) => num(d, "memory.usage_in_bytes"),
            (None, Some(d)) if self.v2_controllers.contains(&"memory") => num(d, "memory.current"),
            _ => None,
        };
        let pids = match (self.v1_dir("pids"), &self.v2) {
            (Some(d), _) => num(d, "pids.current"),
            (None, Some(d)) if self.v2_controllers.contains(&"pids") => num(d, "pids.current"),
            _ => None,
        };
        (memory, pids)
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
    fn no_hierarchy_at_all_is_a_clear_error() {
        let err = CgroupLayout::from_tables("0::/\n", "").unwrap_err();
        assert!(err.to_string().contains("mount cgroup2"), "{err}");
    }

    #[test]
    fn pure_v2_needs_every_controller_from_v2_below_its_own_cgroup() {
        let cg = "0::/system.slice/husk.service\n";
        let mi = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = CgroupLayout::from_tables(cg, mi).unwrap();
        assert_eq!(
            l.v2,
            Some(PathBuf::from(
                "/sys/fs/cgroup/system.slice/husk.service/husk"
            ))
        );
        assert_eq!(l.v2_controllers, ["memory", "pids", "cpu"]);
        assert!(l.v1.is_empty());
    }

    #[test]
    fn a_process_in_the_leaf_manages_the_cgroup_above_it() {
        // The second `husk run` of a script in a delegated unit: the first moved the script
        // (and so its later children) into the leaf; sandboxes still go beside the leaf.
        let cg = "0::/system.slice/job.service/husk-leaf\n";
        let mi = "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let l = CgroupLayout::from_tables(cg, mi).unwrap();
        assert_eq!(
            l.v2,
            Some(PathBuf::from(
                "/sys/fs/cgroup/system.slice/job.service/husk"
            ))
        );
    }

    #[test]
    fn missing_controllers_name_the_remedy_for_the_kind_of_host() {
        let systemd = CgroupError::MissingController {
            controller: Controller::Cpu,
            lack: Lack::NotDelegated {
                cgroup: PathBuf::from("/sys/fs/cgroup/user.slice/session-1.scope"),
                systemd: true,
            },
        }
        .to_string();
        assert!(
            systemd.contains("`cpu`") && systemd.contains("Delegate=yes"),
            "{systemd}"
        );
        assert!(systemd.contains("--unenforced-limits cpu"), "{systemd}");
        assert!(systemd.contains("husk doctor"), "{systemd}");
        assert!(!systemd.contains("kernel"), "{systemd}");
        let container = CgroupError::MissingController {
            controller: Controller::Pids,
            lack: Lack::NotDelegated {
                cgroup: PathBuf::from("/sys/fs/cgroup/ctr"),
                systemd: false,
            },
        }
        .to_string();
        assert!(
            container.contains("echo +pids > /sys/fs/cgroup/cgroup.subtree_control"),
            "{container}"
        );
        let kernel = CgroupError::MissingController {
            controller: Controller::Memory,
            lack: Lack::Kernel,
        }
        .to_string();
        assert!(kernel.contains("kernel"), "{kernel}");
    }

    /// The cgroup v2 root of this host, and a controller it offers (hugetlb on the hybrid
    /// development host, every one on a pure v2 host).
    fn v2_root_and_controller() -> (PathBuf, String) {
        let mi = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = parse_mounts(&mi)
            .into_iter()
            .find(|m| m.v2 && m.root == "/")
            .expect("a cgroup v2 hierarchy is mounted")
            .point;
        let controllers = fs::read_to_string(root.join("cgroup.controllers")).unwrap();
        let c = controllers
            .split_whitespace()
            .next()
            .expect("the v2 root offers a controller")
            .to_owned();
        (root, c)
    }

    /// A scratch cgroup with a process in it; the process is killed and the cgroups removed
    /// on drop.
    struct Busy {
        dir: PathBuf,
        child: std::process::Child,
        /// The v2 root's `cgroup.subtree_control` and the controller the test enabled there
        /// (to be disabled again), if it was not enabled before.
        enabled_at_root: Option<(PathBuf, String)>,
    }

    impl Drop for Busy {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let leaf = self.dir.join(LEAF);
            let _ = poll_until(Instant::now() + Duration::from_secs(5), || {
                fs::remove_dir(&leaf).is_ok() || !leaf.exists()
            });
            let _ = fs::remove_dir(&self.dir);
            if let Some((st, c)) = &self.enabled_at_root {
                let _ = fs::write(st, format!("-{c}"));
            }
        }
    }

    // v2's "no internal processes" rule, on the real kernel: a cgroup whose processes block
    // controllers below it (EBUSY) gets them moved into its leaf, and then its controllers.
    #[test]
    fn a_cgroup_with_processes_moves_them_into_its_leaf_to_enable_controllers() {
        let (root, controller) = v2_root_and_controller();
        let dir = root.join(format!(
            "husk-test-leaf-{}-{:x}",
            std::process::id(),
            crate::sys::random_u64().unwrap()
        ));
        // The controller must reach the test's cgroup: on the development host nothing enables
        // hugetlb at the root, so the test does, and disables it again afterwards.
        let root_st = root.join("cgroup.subtree_control");
        let at_root = fs::read_to_string(&root_st).unwrap();
        let enabled_at_root = if at_root.split_whitespace().any(|c| c == controller) {
            None
        } else {
            fs::write(&root_st, format!("+{controller}")).unwrap();
            Some((root_st, controller.clone()))
        };
        fs::create_dir(&dir).unwrap();
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let busy = Busy {
            dir,
            child,
            enabled_at_root,
        };
        fs::write(busy.dir.join("cgroup.procs"), busy.child.id().to_string()).unwrap();
        let enable = format!("+{controller}");
        // v2 refuses this with EBUSY: the cgroup has a process.
        enable_below(&busy.dir, &enable).unwrap();
        let enabled = fs::read_to_string(busy.dir.join("cgroup.subtree_control")).unwrap();
        assert!(
            enabled.split_whitespace().any(|c| c == controller),
            "{enabled}"
        );
        assert!(read_pids(&busy.dir).is_empty());
        assert_eq!(read_pids(&busy.dir.join(LEAF)), [busy.child.id() as i32]);
        // Again, as a later husk process of the same unit does: nothing to move, no error.
        enable_below(&busy.dir, &enable).unwrap();
        // The last husk process out gives the cgroup back as it was: controllers off, the
        // process back in place, no husk/ and no leaf.
        let name: &'static str = Box::leak(controller.clone().into_boxed_str());
        fs::create_dir(busy.dir.join("husk")).unwrap();
        let layout = CgroupLayout {
            v1: Vec::new(),
            v2: Some(busy.dir.join("husk")),
            v2_controllers: vec![name],
            unenforced: Vec::new(),
            origin: Origin::Own,
            enabled_in_base: vec![name],
        };
        layout.release();
        assert!(!busy.dir.join("husk").exists());
        assert!(!busy.dir.join(LEAF).exists());
        assert_eq!(read_pids(&busy.dir), [busy.child.id() as i32]);
        let enabled = fs::read_to_string(busy.dir.join("cgroup.subtree_control")).unwrap();
        assert!(
            !enabled.split_whitespace().any(|c| c == controller),
            "{enabled}"
        );
    }

    #[test]
    fn a_controller_the_cgroup_lacks_is_refused_unless_the_operator_accepts_it() {
        let h = FakeHierarchy::new();
        fs::write(h.0.join("cgroup.controllers"), "cpuset memory pids\n").unwrap();
        let needed = ["memory", "pids", "cpu"];
        let err = check_available(&h.0, &needed, &[]).unwrap_err();
        // This host's kernel has `cpu` (/proc/cgroups): it is a delegation problem.
        assert!(
            matches!(
                &err,
                CgroupError::MissingController {
                    controller: Controller::Cpu,
                    lack: Lack::NotDelegated { .. }
                }
            ),
            "{err}"
        );
        let (have, without) = check_available(&h.0, &needed, &[Controller::Cpu]).unwrap();
        assert_eq!(have, ["memory", "pids"]);
        assert_eq!(without, [Controller::Cpu]);
        // Accepting one missing controller accepts no other.
        fs::write(h.0.join("cgroup.controllers"), "cpu\n").unwrap();
        assert!(check_available(&h.0, &needed, &[Controller::Pids]).is_err());
    }

    #[test]
    fn controller_names_parse_and_refuse_others() {
        assert_eq!("cpu".parse::<Controller>(), Ok(Controller::Cpu));
        assert!("io"
            .parse::<Controller>()
            .unwrap_err()
            .contains("memory, pids or cpu"));
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
        // 64 MiB for processes + 8 MiB of disk (/dev and /dev/shm included).
        assert_eq!(h.read("s1/memory.max"), (72u64 << 20).to_string());
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
            (72u64 << 20).to_string()
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
