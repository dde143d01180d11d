//! Creating and destroying sandboxes.
//!
//! [`Spawner::create`] allocates a uid range, creates the cgroups, forks the sandbox's first
//! process with `clone3` into new PID, mount, network, IPC and UTS namespaces, writes its
//! uid/gid maps when it has entered its user namespace, and returns once it reports ready.
//! [`Sandbox::destroy`] (also run on drop) kills every process, waits for PID 1, removes the
//! cgroups and returns the uid range; mounts and the writable layer vanish with the mount
//! namespace when its last process is gone.

use std::cell::{Cell, RefCell};
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cgroup::{CgroupError, CgroupLayout, CgroupOptions, SandboxCgroup};
use crate::control::{self, FromInit, ToInit};
use crate::fences::Fences;
use crate::host_template::{self, HostTemplate};
use crate::init::{self, ChildArgs};
use crate::spec::{MountIds, NetworkMode, RootSource, SandboxSpec};
use crate::sys::{self, ExitStatus, Forked};
use crate::uidrange::{self, UidRange, RANGE};

mod adopt;
mod assign;

pub(crate) use assign::validate_assignment;

/// Errors of creating, waiting for and destroying sandboxes.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// husk needs root (CAP_SYS_ADMIN and friends in the host's namespaces).
    #[error(
        "husk must run as root (it creates namespaces, cgroups and mounts); try: sudo husk ..."
    )]
    NotRoot,
    /// A kernel feature husk needs is missing.
    #[error("kernel feature missing: {0}")]
    KernelFeature(String),
    /// The spec is invalid.
    #[error("{0}")]
    InvalidSpec(String),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    /// The sandbox could not be set up (reported by its first process).
    #[error("sandbox set-up failed: {0}")]
    Setup(String),
    /// The sandbox's template cannot be used (its image is missing, damaged, ...).
    #[error("{0}")]
    Template(String),
    /// Preparing the seccomp/Landlock fences failed.
    #[error("preparing security fences: {0}")]
    Fences(String),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

fn io_ctx(what: impl Into<String>) -> impl FnOnce(io::Error) -> SpawnError {
    let what = what.into();
    move |source| SpawnError::Io { what, source }
}

/// How often, at most, the first create of a husk process sweeps what crashed husk processes
/// left ([`Spawner::sweep_due`]); a server's spawner sweeps at its start whatever the time.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// Most id-map namespaces a spawner keeps (one per uid slot it used for built templates).
const MAX_IDMAPS: usize = 256;

/// Where husk keeps per-host runtime state (the uid slot lock, the host template, staging).
pub const DEFAULT_RUN_DIR: &str = "/run/husk";

/// Creates sandboxes. Must be used from a single-threaded process.
pub struct Spawner {
    run_dir: PathBuf,
    layout: CgroupLayout,
    template: RefCell<HostTemplate>,
    fences: Fences,
    /// The spawner's own network namespace, to return to after creating a sandbox's.
    host_netns: OwnedFd,
    /// Where this process's command line lives (read once; a sandbox's init overwrites its copy).
    arg_area: Option<sys::ArgArea>,
    /// Whether leftovers of crashed husk processes were reaped yet (done once, during the first
    /// create, while that sandbox's first process builds its root filesystem, when a sweep is
    /// due: [`Spawner::sweep_due`]).
    reaped: Cell<bool>,
    /// What PID 1 of `agent` specs runs (see [`crate::agent`]), and husk's layer over their
    /// `/usr` (see [`crate::usr_layer`]).
    /// The layer's directory is looked up again when it went missing (another husk process
    /// removed it as unused while this one had no sandbox).
    agent: Option<(crate::agent::AgentEntry, RefCell<PathBuf>)>,
    /// Per uid slot: a user namespace with the slot's id mapping, for the id-mapped layers of
    /// built templates (made once per slot, on first use).
    idmaps: RefCell<std::collections::HashMap<u32, OwnedFd>>,
    /// Held from the first sandbox of a built template on: keeps image mounts in place (see
    /// [`crate::images`]); released as the spawner ends.
    images_in_use: RefCell<Option<crate::images::InUse>>,
    /// Images whose content was checked (each is, before it is mounted for a sandbox).
    verifier: crate::images::Verifier,
    /// Whose sandboxes outlive this spawner and may be taken up by a later one (see
    /// [`crate::keep`]); `None`: every sandbox ends with its spawner.
    owner: Option<String>,
    /// Low descriptors reserved so that a sandbox's first process need not copy this
    /// process's whole descriptor table (see [`crate::handoff`]).
    handoff: crate::handoff::Handoff,
    /// Which of a server's spawner processes this is (see [`crate::service`]): named in the
    /// ids of the sandboxes it makes, so that every later request about one reaches it.
    worker: usize,
}

impl Drop for Spawner {
    /// The last husk process that used template images detaches their mounts, and the last
    /// one with sandboxes in a shared cgroup gives it back as it found it.
    fn drop(&mut self) {
        // Only a spawner that used images can be their last user (and a one-shot `husk run`
        // of the host template pays nothing); a crash's leftovers go at the next start (reap).
        if self.images_in_use.take().is_some() {
            let _ = crate::images::release_unused(&self.run_dir);
        }
        self.layout.release();
    }
}

/// How a sandbox's command ended, as far as the runtime can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// The command exited or was killed by a signal (not by the OOM killer).
    Exited(ExitStatus),
    /// The command was killed by the OOM killer of the sandbox's memory cgroup, which holds
    /// `limit_bytes` for processes plus `files_bytes` for the files kept in RAM (see
    /// [`SandboxSpec::memory_cgroup_bytes`]).
    OutOfMemory { limit_bytes: u64, files_bytes: u64 },
    /// The deadline passed; the caller should destroy the sandbox.
    TimedOut,
    /// The command could not be executed (errno).
    ExecFailed(i32),
    /// PID 1 died unexpectedly.
    InitDied,
}

impl Spawner {
    /// Checks privileges and kernel features, prepares cgroup parents, the host template and
    /// the fences, and reaps what crashed husk processes left behind.
    pub fn new() -> Result<Spawner, SpawnError> {
        Self::with_run_dir(Path::new(DEFAULT_RUN_DIR))
    }

    /// Like [`Spawner::new`] with another runtime directory.
    pub fn with_run_dir(run_dir: &Path) -> Result<Spawner, SpawnError> {
        Self::with_options(run_dir, &CgroupOptions::default())
    }

    /// Like [`Spawner::with_run_dir`], with what the operator allowed husk to do without.
    pub fn with_options(run_dir: &Path, cgroups: &CgroupOptions) -> Result<Spawner, SpawnError> {
        // Effective uid 0 is required for namespaces, cgroups and id maps.
        if fs::read_to_string("/proc/self/status").ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        }) != Some(true)
        {
            return Err(SpawnError::NotRoot);
        }
        // First, while this process's lowest descriptors are free.
        let handoff = crate::handoff::Handoff::new().map_err(io_ctx("reserve descriptors"))?;
        // Namespaces, tmpfs and overlayfs (loading the module if needed): file reads only.
        crate::probe::startup().map_err(SpawnError::KernelFeature)?;
        // Writable by root alone (the registry tells husk which cgroups to kill), listable by
        // root alone; traversable, because sandbox set-up works below staging/ with the
        // sandbox's fsuid.
        for (dir, mode) in [
            (run_dir.to_path_buf(), 0o711),
            (run_dir.join("staging"), 0o711),
            (run_dir.join("sandboxes"), 0o700),
        ] {
            fs::create_dir_all(&dir).map_err(io_ctx("create run dir"))?;
            fs::set_permissions(&dir, fs::Permissions::from_mode(mode))
                .map_err(io_ctx("protect run dir"))?;
        }
        let layout = CgroupLayout::acquire(cgroups, run_dir)?;
        let template = host_template::ensure(run_dir).map_err(io_ctx("build host template"))?;
        let fences = Fences::prepare().map_err(|e| SpawnError::Fences(e.to_string()))?;
        let host_netns = sys::open(c"/proc/thread-self/ns/net", libc::O_RDONLY, 0)
            .map_err(io_ctx("open own network namespace"))?;
        Ok(Spawner {
            host_netns,
            arg_area: sys::arg_area().ok(),
            run_dir: run_dir.to_owned(),
            layout,
            template: RefCell::new(template),
            fences,
            reaped: Cell::new(false),
            agent: None,
            idmaps: RefCell::new(std::collections::HashMap::new()),
            images_in_use: RefCell::new(None),
            verifier: crate::images::Verifier::default(),
            owner: None,
            handoff,
            worker: 0,
        })
    }

    /// Makes this spawner's agent sandboxes that do not die with their creator *kept*: they
    /// outlive it, and a spawner with the same `owner` (a server's state directory) takes
    /// them up ([`Spawner::adopt`]). See [`crate::keep`].
    pub fn set_owner(&mut self, owner: String) {
        self.owner = Some(owner);
    }

    /// Makes this process, a fork of the spawner that prepared everything, spawner `worker`
    /// of several (see [`crate::service`]): the ids of its sandboxes name it, it reaps
    /// nothing (the first spawner does, once the others took up their kept sandboxes), and
    /// its hand-off signal is its own (a shared one would let another spawner's child signal
    /// this one's fork early).
    pub(crate) fn become_worker(&mut self, worker: usize) -> io::Result<()> {
        self.handoff.renew()?;
        self.worker = worker;
        self.reaped.set(true);
        Ok(())
    }

    /// A new, empty network namespace (owned by the host's user namespace). The spawner enters
    /// it to create it and returns to its own at once, so afterwards only the sandbox holds it.
    fn new_netns(&self) -> io::Result<OwnedFd> {
        sys::unshare(libc::CLONE_NEWNET)?;
        let netns = sys::open(c"/proc/thread-self/ns/net", libc::O_RDONLY, 0);
        sys::setns(self.host_netns.as_fd(), libc::CLONE_NEWNET)?;
        netns
    }

    /// The uid slots' lock files ([`uidrange`]).
    fn lock_path(&self) -> PathBuf {
        self.run_dir.join("uid-slots")
    }

    /// Where sandboxes' cgroups go, how husk got them and what is not enforced (one line).
    pub fn cgroup_summary(&self) -> String {
        self.layout.summary()
    }

    /// Removes what sandboxes whose owner is gone (its uid slot is free) left behind: what a
    /// husk process that crashed or was SIGKILLed left, in whatever cgroup it ran. With no other
    /// sandbox left, old host-template copies are removed too.
    /// Image mounts a crashed husk left are detached too (unless a live husk process uses
    /// them): here, at a server's start, not on a one-shot run's create path.
    pub fn reap_stale(&self) -> usize {
        let reaped = self.reap(None);
        let _ = crate::images::release_unused(&self.run_dir);
        reaped
    }

    /// [`Spawner::reap_stale`], not counting `own` (the slot of the sandbox being created).
    fn reap(&self, own: Option<u32>) -> usize {
        self.reaped.set(true);
        let (mut reaped, mut others) = (0, 0);
        for slot in self.registered_slots() {
            if Some(slot) == own {
                continue;
            }
            // Holding the slot's lock while cleaning, so no new owner can take it meanwhile.
            match uidrange::try_take(&self.lock_path(), slot) {
                Ok(Some(_held)) if self.clear_slot(slot) => reaped += 1,
                _ => others += 1,
            }
        }
        if others == 0 {
            let usr = self.agent.as_ref().map(|(_, u)| u.borrow());
            host_template::remove_unused(
                &self.run_dir,
                &self.template.borrow(),
                usr.as_deref().map(PathBuf::as_path),
            );
        }
        reaped
    }

    /// Whether this process's first create should sweep leftovers, and if so, marks the sweep
    /// done for the others: at most one per [`SWEEP_EVERY`] among husk processes. A sweep
    /// tries the lock of every registered slot, so each `husk run` sweeping would make a
    /// one-shot's cost grow with the sandboxes alive (about 15 ms with 5,000). A leftover
    /// waits at most that long; one in the slot a create picks is cleared by that create.
    fn sweep_due(&self) -> bool {
        let stamp = self.run_dir.join("swept");
        let recent = fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age < SWEEP_EVERY));
        if recent {
            return false;
        }
        // Two processes that both find it old both sweep; that is harmless.
        let _ = fs::File::create(&stamp).and_then(|f| f.set_modified(std::time::SystemTime::now()));
        true
    }

    /// Slots with an entry in the sandbox registry.
    fn registered_slots(&self) -> Vec<u32> {
        let Ok(rd) = fs::read_dir(self.run_dir.join("sandboxes")) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| parse_slot(&e.file_name().to_string_lossy()))
            .collect()
    }

    fn registry_entry(&self, slot: u32) -> PathBuf {
        self.run_dir.join("sandboxes").join(cgroup_name(slot))
    }

    /// Whether the uid range of `slot` (whose lock the caller holds) may be handed out: nothing
    /// of a previous owner is registered, or what is registered (an owner that died without
    /// tearing down) can be emptied and removed now. A range is only reused once every process
    /// that ever ran with its uids is gone; its cgroups are the proof, as sandbox processes
    /// cannot leave them. The registry records them wherever they are (husk processes in
    /// different cgroups put their sandboxes in different places).
    fn clear_slot(&self, slot: u32) -> bool {
        let entry = self.registry_entry(slot);
        let text = match fs::read_to_string(&entry) {
            Ok(t) if t.is_empty() => return unregister(&entry).is_ok(),
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return true,
            Err(_) => return false,
        };
        // A kept sandbox whose PID 1 runs is no leftover, whoever owns it.
        let text = match crate::keep::split_entry(&text) {
            (_, Some(keep)) if keep.alive().is_some() => return false,
            (cgroup, _) => cgroup,
        };
        // A sandbox of a husk from before the lock file per slot, running beside this one.
        if uidrange::held_by_legacy(&self.run_dir.join("uid-slots.lock"), slot) {
            return false;
        }
        // Only a sandbox cgroup of this very slot is touched: `.../husk/s<slot>`.
        let Some(cg) = SandboxCgroup::from_registry(&text).filter(|cg| {
            cg.paths().iter().all(|p| {
                p.file_name().is_some_and(|n| *n == *cgroup_name(slot))
                    && p.parent()
                        .and_then(Path::file_name)
                        .is_some_and(|n| n == "husk")
            })
        }) else {
            return false;
        };
        let _ = cg.kill_all();
        cg.remove_within(Duration::from_secs(2)).is_ok() && unregister(&entry).is_ok()
    }

    /// Records the cgroups of the sandbox in `slot` before they exist, in one write: a crash
    /// before it leaves an empty entry, which is right (nothing was created yet). The entry is
    /// deleted after the cgroups are removed, so the registry only ever lists live sandboxes and
    /// leftovers (every husk process reads it once).
    fn register(&self, slot: u32, cgroup: &SandboxCgroup) -> io::Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(self.registry_entry(slot))?;
        f.write_all(cgroup.to_registry().as_bytes())
    }

    /// Registers the agent that PID 1 of specs with `agent: true` hands over to, and prepares
    /// the `/usr` layer its sandboxes get (husk's `sudo`).
    pub fn set_agent(&mut self, entry: crate::agent::AgentEntry) -> Result<(), SpawnError> {
        let usr =
            crate::usr_layer::ensure(&self.run_dir).map_err(io_ctx("build the sudo layer"))?;
        self.agent = Some((entry, RefCell::new(usr)));
        Ok(())
    }

    /// Creates a sandbox and waits until its PID 1 reports ready (the command, if any, has been
    /// started). `stdio` replaces the sandbox's fds 0, 1, 2 (default: the caller's own); each
    /// must be a pipe or `/dev/null` ([`sys::passable_stdio`]): relay anything else.
    pub fn create(
        &self,
        spec: &SandboxSpec,
        stdio: Option<[BorrowedFd<'_>; 3]>,
    ) -> Result<Sandbox, SpawnError> {
        self.create_in(spec, stdio, None)
    }

    /// [`Spawner::create`] for a sandbox that joins the network namespace `netns`
    /// (`spec.network` must be [`NetworkMode::Joined`] exactly when it is given).
    pub fn create_in(
        &self,
        spec: &SandboxSpec,
        stdio: Option<[BorrowedFd<'_>; 3]>,
        netns: Option<OwnedFd>,
    ) -> Result<Sandbox, SpawnError> {
        validate(spec)?;
        if matches!(spec.network, NetworkMode::Joined { .. }) != netns.is_some() {
            return Err(SpawnError::InvalidSpec(
                "a joined network needs exactly one network namespace (and only it)".into(),
            ));
        }
        // A long-lived spawner's template copy may have been replaced and removed after a
        // change of the host's /etc (see host_template::remove_unused): take the current one.
        if fs::symlink_metadata(&self.template.borrow().lower).is_err() {
            let fresh =
                host_template::ensure(&self.run_dir).map_err(io_ctx("build host template"))?;
            *self.template.borrow_mut() = fresh;
        }
        // Likewise husk's /usr layer (removed as unused by the last husk process with no
        // sandbox, see host_template::remove_unused).
        if let (true, Some((_, usr))) = (spec.agent, &self.agent) {
            if fs::symlink_metadata(usr.borrow().join(crate::usr_layer::SUDO_PATH)).is_err() {
                *usr.borrow_mut() = crate::usr_layer::ensure(&self.run_dir)
                    .map_err(io_ctx("build the sudo layer"))?;
            }
        }
        for (i, fd) in (0..3).map(|i| (i, stdio.map_or(i, |s| s[i as usize].as_raw_fd()))) {
            if !sys::passable_stdio(fd) {
                return Err(SpawnError::InvalidSpec(format!(
                    "stdio fd {i} is not a pipe or /dev/null: terminals, sockets, files and \
                     devices must be relayed, not handed to a sandbox"
                )));
            }
        }
        // Sandboxes with id-mapped layers prefer a slot whose id-map namespace exists.
        let preferred: Vec<u32> = match spec.rootfs {
            RootSource::Host => Vec::new(),
            _ => self.idmaps.borrow().keys().copied().collect(),
        };
        let uids = uidrange::allocate_preferring(&self.lock_path(), &preferred, |slot| {
            self.clear_slot(slot)
        })
        .map_err(io_ctx("allocate uid range"))?;
        let id = sandbox_id(
            uids.slot(),
            sys::random_u64().map_err(io_ctx("random"))? >> 16,
            self.worker,
        );
        let slot = uids.slot();
        let name = cgroup_name(slot);
        self.register(slot, &self.layout.handle(&name))
            .map_err(io_ctx("register sandbox"))?;
        let cgroup = match self.layout.create_v2(&name) {
            Ok(cg) => cg,
            Err(e) => {
                let _ = unregister(&self.registry_entry(slot));
                return Err(e.into());
            }
        };
        // From here on, the Sandbox value owns the clean-up.
        let mut sandbox = Sandbox {
            id,
            pid: 0,
            pidfd: None,
            control: None,
            cgroup,
            uids: Some(uids),
            limits_memory: spec.limits.memory_bytes,
            files_in_memory: spec.files_in_memory(),
            pty_master: None,
            upper: None,
            fate: None,
            destroyed: false,
            registry: Some(self.registry_entry(slot)),
            agent_conn: None,
            rendezvous: None,
            adopted: false,
        };
        self.start(&mut sandbox, spec, stdio, netns)?;
        Ok(sandbox)
    }

    fn start(
        &self,
        sb: &mut Sandbox,
        spec: &SandboxSpec,
        stdio: Option<[BorrowedFd<'_>; 3]>,
        joined: Option<OwnedFd>,
    ) -> Result<(), SpawnError> {
        let v2_dir = sb.cgroup.v2_dir()?;
        let (parent_end, child_end) = sys::seqpacket_pair().map_err(io_ctx("control socket"))?;
        let agent = match (spec.agent, &self.agent) {
            (false, _) => None,
            (true, Some((entry, _))) => {
                let (ours, theirs) = sys::stream_pair().map_err(io_ctx("agent socket"))?;
                sb.agent_conn = Some(ours);
                Some((*entry, theirs))
            }
            (true, None) => {
                return Err(SpawnError::InvalidSpec(
                    "an agent sandbox needs a spawner with an agent registered".into(),
                ))
            }
        };
        // A kept sandbox's rendezvous and the place of its layer's copy in PID 1 (see
        // crate::keep), made here so that their numbers are known.
        let mut kept = match (&self.owner, &agent, spec.die_with_parent) {
            (Some(_), Some(_), false) => {
                let (send, recv) = sys::seqpacket_pair().map_err(io_ctx("rendezvous"))?;
                let layer = send.try_clone().map_err(io_ctx("rendezvous"))?;
                Some((send, recv, layer))
            }
            _ => None,
        };
        let base = sb.uids.as_ref().map(UidRange::base).unwrap_or(0);
        let staging = self.run_dir.join("staging");
        // A spawner that holds the images lock mounts without taking it again; the first image
        // sandbox takes it (and keeps it, below).
        let (image, mounted) = match &spec.rootfs {
            RootSource::Image { path, size, digest } => {
                let template = |e: crate::images::ImageError| SpawnError::Template(e.to_string());
                // The spawner trusts no one's word for an image: its content must be the
                // digest the spec names (a server names images only by what the store says).
                self.verifier
                    .verify(&self.run_dir, path, *size, digest)
                    .map_err(template)?;
                match &*self.images_in_use.borrow() {
                    Some(held) => (
                        Some(
                            held.ensure_mounted(&self.run_dir, path, *size, digest)
                                .map_err(template)?,
                        ),
                        None,
                    ),
                    None => {
                        let m = crate::images::ensure_mounted(&self.run_dir, path, *size, digest)
                            .map_err(template)?;
                        (Some(m.path().to_path_buf()), Some(m))
                    }
                }
            }
            _ => (None, None),
        };
        let flags =
            libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
        // Forking is only sound single-threaded (see clone3_fork); checked on every create,
        // since the process could have started a thread after Spawner::new.
        single_threaded()?;
        // Id-mapped layers and mounts need the slot's mapping (a namespace kept per slot).
        let idmap = match &spec.rootfs {
            RootSource::Host
                if spec.layers.is_empty()
                    && !spec.mounts.iter().any(|m| m.ids == MountIds::Shared) =>
            {
                None
            }
            _ => Some(self.idmap(sb.uids.as_ref().map(UidRange::slot).unwrap_or(0), base)?),
        };
        // Mounts whose owner is the sandbox's user: a mapping each (made here, in the host's
        // user namespace; the sandbox's first process keeps the fds only while it mounts).
        let mut owner_maps = Vec::with_capacity(spec.mounts.len());
        for m in &spec.mounts {
            owner_maps.push(match m.ids {
                MountIds::Owner { uid, gid } => {
                    let user = base + spec.user.id();
                    // SAFETY: the process is single-threaded (checked above).
                    Some(
                        unsafe {
                            sys::userns_with_maps(
                                &format!("{uid} {user} 1\n"),
                                &format!("{gid} {user} 1\n"),
                            )
                        }
                        .map_err(io_ctx("id map of a mount"))?,
                    )
                }
                _ => None,
            });
        }
        // The descriptors the child keeps, by the numbers it will see them under: in the
        // handoff's slots (a fork that shares this process's table and then copies only its
        // lowest part), or where they are (a plain fork) when there are more than slots.
        let mut placing = self.handoff.placing();
        let mut put =
            |fd: std::os::fd::RawFd| placing.put(fd).map_err(io_ctx("hand descriptors over"));
        let control_fd = put(child_end.as_raw_fd())?;
        let agent_fd = match &agent {
            Some((entry, fd)) => Some((*entry, put(fd.as_raw_fd())?)),
            None => None,
        };
        let idmap_fd = idmap.map(&mut put).transpose()?;
        let kept_fds = match &kept {
            Some((send, recv, layer)) => Some(init::KeptFds {
                send: put(send.as_raw_fd())?,
                recv: put(recv.as_raw_fd())?,
                layer: put(layer.as_raw_fd())?,
            }),
            None => None,
        };
        let owner_fds = owner_maps
            .iter()
            .map(|fd| fd.as_ref().map(|f| put(f.as_raw_fd())).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let stdio_fds = match stdio {
            Some([i, o, e]) => Some([
                put(i.as_raw_fd())?,
                put(o.as_raw_fd())?,
                put(e.as_raw_fd())?,
            ]),
            None => None,
        };
        let handoff = placing.for_child();
        // Borrowed across the fork, which only reads it.
        let usr = self.agent.as_ref().map(|(_, u)| u.borrow());
        let flags = match handoff {
            Some(_) => flags | libc::CLONE_FILES,
            None => flags,
        };
        // SAFETY: the process is single-threaded (checked just above; nothing in between
        // starts a thread).
        match unsafe { sys::clone3_fork(flags, v2_dir.as_ref().map(|d| d.as_fd())) }
            .map_err(io_ctx("clone3"))?
        {
            Forked::Child => {
                // Before anything else touches the descriptor table it shares with the
                // spawner (see crate::handoff).
                if let Some(h) = handoff {
                    if h.child_unshare().is_err() {
                        sys::exit_now(125);
                    }
                }
                // Not closed here: with a table of its own, the child may not have it at this
                // number (init closes every descriptor it does not keep).
                std::mem::forget(parent_end);
                init::child_main(ChildArgs {
                    spec,
                    template: &self.template.borrow(),
                    staging: &staging,
                    base,
                    fences: &self.fences,
                    control: control_fd,
                    stdio: stdio_fds,
                    agent: agent_fd,
                    usr_layer: match (&agent, &usr) {
                        (Some(_), Some(usr)) => Some(usr.as_path()),
                        _ => None,
                    },
                    image: image.as_deref(),
                    idmap: idmap_fd,
                    mount_maps: &owner_fds,
                    arg_area: self.arg_area,
                    keep: kept_fds,
                })
            }
            Forked::Parent { pid, pidfd } => {
                // First: nothing may change the shared table before the child has its own.
                if handoff.is_some() {
                    placing
                        .wait_for(pidfd.as_fd())
                        .map_err(io_ctx("hand descriptors over"))?;
                }
                drop(placing);
                drop(child_end);
                drop(agent);
                drop(v2_dir);
                drop(owner_maps);
                sb.pid = pid;
                sb.pidfd = Some(pidfd);
                // PID 1 is the last of its sandbox the OOM killer may take: if it goes, the
                // whole sandbox goes (crate::oom). Lowering the value takes CAP_SYS_RESOURCE in
                // the host's user namespace, which the spawner has and the child is about to
                // lose; the child runs nothing of the sandbox's before `IdMapDone` below.
                // Best effort: where the spawner may not (a container that forbids it), the
                // sandbox works as before, and `husk serve` warns about its own value.
                let _ = crate::oom::set(pid, crate::oom::SANDBOX_INIT);
            }
        }
        let control = parent_end.as_fd();
        // While the child builds its root filesystem, create its network namespace (the most
        // expensive namespace, ~0.9 ms here) and finish the cgroups: the two sides run in
        // parallel, and the child enters and joins them before anything of the sandbox runs.
        if spec.network.isolated() {
            let netns = match joined {
                Some(fd) => fd,
                None => self
                    .new_netns()
                    .map_err(io_ctx("create network namespace"))?,
            };
            // A child that already failed has closed its end; its report is read below.
            let _ = control::send_to_init(control, &ToInit::NetNs { netns });
        }
        // The child has its own copy of the image's mount now; this spawner keeps image mounts
        // in place until it ends (see crate::images).
        if let Some(m) = mounted {
            *self.images_in_use.borrow_mut() = Some(m.into_lock());
        }
        sb.cgroup.complete(spec)?;
        let mut cgroup_tasks = Some(sb.cgroup.v1_tasks()?);
        if !self.reaped.get() {
            if self.sweep_due() {
                self.reap(sb.uids.as_ref().map(UidRange::slot));
            } else {
                self.reaped.set(true);
            }
        }
        loop {
            match control::recv_from_init(control).map_err(io_ctx("sandbox control"))? {
                Some(FromInit::NeedIdMap) => {
                    write_id_maps(sb.pid, base).map_err(io_ctx("write uid/gid maps"))?;
                    let cgroup_tasks = cgroup_tasks.take().unwrap_or_default();
                    control::send_to_init(control, &ToInit::IdMapDone { cgroup_tasks })
                        .map_err(io_ctx("sandbox control"))?;
                }
                // Once, before the id map: after that, init runs the sandbox's code.
                Some(FromInit::Layer { upper }) if sb.upper.is_none() && cgroup_tasks.is_some() => {
                    sb.upper = Some(upper);
                }
                Some(FromInit::Ready { pty_master }) => {
                    sb.pty_master = pty_master;
                    sb.control = Some(parent_end);
                    if let (Some((send, _, _)), Some(numbers), Some(owner)) =
                        (kept.take(), kept_fds, &self.owner)
                    {
                        self.record_kept(sb, owner, numbers)?;
                        sb.rendezvous = Some(send);
                    }
                    return Ok(());
                }
                Some(FromInit::SetupFailed(msg)) => return Err(SpawnError::Setup(msg)),
                Some(other) => {
                    return Err(SpawnError::Setup(format!("unexpected message {other:?}")))
                }
                None => {
                    return Err(SpawnError::Setup(
                        "sandbox init exited during set-up".into(),
                    ))
                }
            }
        }
    }
}

impl Spawner {
    /// Adds a kept sandbox's line to its registry entry (see [`crate::keep`]), once it is
    /// ready: before, a crash leaves an entry without one, which the reaper clears.
    fn record_kept(
        &self,
        sb: &Sandbox,
        owner: &str,
        numbers: init::KeptFds,
    ) -> Result<(), SpawnError> {
        use std::io::Write;
        let record = crate::keep::KeepRecord {
            owner: owner.to_string(),
            id: sb.id.clone(),
            pid: sb.pid,
            start: sys::process_start_time(sb.pid).map_err(io_ctx("read PID 1's start time"))?,
            send: numbers.send,
            layer: sb.upper.is_some().then_some(numbers.layer),
        };
        let Some(entry) = &sb.registry else {
            return Ok(());
        };
        fs::OpenOptions::new()
            .append(true)
            .open(entry)
            .and_then(|mut f| f.write_all(record.line().as_bytes()))
            .map_err(io_ctx("register the kept sandbox"))
    }

    /// The raw fd of the user namespace with `slot`'s id mapping (kept open by the spawner;
    /// the sandbox's first process inherits it).
    fn idmap(&self, slot: u32, base: u32) -> Result<std::os::fd::RawFd, SpawnError> {
        let mut maps = self.idmaps.borrow_mut();
        if let Some(fd) = maps.get(&slot) {
            return Ok(fd.as_raw_fd());
        }
        // Bounded: an evicted namespace is only the spawner's reference (a sandbox's first
        // process has its own copy of the fd while it needs it).
        if maps.len() >= MAX_IDMAPS {
            if let Some(k) = maps.keys().next().copied() {
                maps.remove(&k);
            }
        }
        // SAFETY: the process is single-threaded: start(), the only caller, checks it just
        // before.
        let fd = unsafe { sys::idmap_userns(base, RANGE) }.map_err(io_ctx("id-map namespace"))?;
        let raw = fd.as_raw_fd();
        maps.insert(slot, fd);
        Ok(raw)
    }
}

/// Maps sandbox ids 0..65535 to the slot's host range (uid and gid alike).
fn write_id_maps(pid: libc::pid_t, base: u32) -> io::Result<()> {
    let line = format!("0 {base} {RANGE}\n");
    sys::write_file(Path::new(&format!("/proc/{pid}/uid_map")), line.as_bytes())?;
    sys::write_file(Path::new(&format!("/proc/{pid}/gid_map")), line.as_bytes())
}

/// Deletes a registry entry: its sandbox's cgroups are gone.
fn unregister(entry: &Path) -> io::Result<()> {
    match fs::remove_file(entry) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The cgroup of the sandbox holding uid slot `slot`. Named by slot, not by sandbox id, so
/// that allocating a slot can check with one lookup that nothing of its previous owner is left.
pub fn cgroup_name(slot: u32) -> String {
    format!("s{slot}")
}

fn parse_slot(name: &str) -> Option<u32> {
    name.strip_prefix('s')?.parse().ok()
}

/// A sandbox's id: `s<slot>-<12 hex digits>`, and `-w<worker>` for the sandboxes of a
/// server's spawner other than its first (see [`worker_of`]).
fn sandbox_id(slot: u32, random: u64, worker: usize) -> String {
    match worker {
        0 => format!("s{slot}-{random:012x}"),
        w => format!("s{slot}-{random:012x}-w{w}"),
    }
}

/// Which spawner of a server made the sandbox `id` ([`sandbox_id`]); 0 for ids without a
/// worker (the first spawner's, and every sandbox of a husk from before several spawners).
pub fn worker_of(id: &str) -> usize {
    id.rsplit_once("-w")
        .and_then(|(_, w)| w.parse().ok())
        .unwrap_or(0)
}

/// A hostname a sandbox may have: 1 to 64 letters, digits, `-` and `.`.
pub fn valid_hostname(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
}

/// An error unless this process has one thread: forking (a sandbox's first process, an id-map
/// namespace, a child that enters a sandbox's namespace) is only sound then.
fn single_threaded() -> Result<(), SpawnError> {
    match sys::settled_thread_count() {
        Ok(1) => Ok(()),
        Ok(n) => Err(SpawnError::Setup(format!(
            "the spawner must run in a single-threaded process (this one has {n} threads)"
        ))),
        Err(e) => Err(io_ctx("count threads")(e)),
    }
}

fn validate_limits(l: &crate::spec::Limits) -> Result<(), SpawnError> {
    let bad = |m: &str| Err(SpawnError::InvalidSpec(m.into()));
    if l.memory_bytes < 4 << 20 {
        return bad("memory limit must be at least 4 MiB");
    }
    if l.pids < 2 {
        return bad("pids limit must be at least 2");
    }
    if l.cpu_millis < 10 {
        return bad("cpu limit must be at least 0.01");
    }
    if l.disk_bytes < 1 << 20 {
        return bad("disk size must be at least 1 MiB");
    }
    Ok(())
}

fn validate_mounts(mounts: &[crate::spec::MountSpec]) -> Result<(), SpawnError> {
    for m in mounts {
        if !m.host.is_absolute() {
            return Err(SpawnError::InvalidSpec(format!(
                "mount source {} must be an absolute path",
                m.host.display()
            )));
        }
        if fs::metadata(&m.host).is_err() {
            return Err(SpawnError::InvalidSpec(format!(
                "mount source {} does not exist",
                m.host.display()
            )));
        }
        crate::rootfs::relative(&m.sandbox).map_err(|e| SpawnError::InvalidSpec(e.to_string()))?;
    }
    Ok(())
}

pub(crate) fn validate(spec: &SandboxSpec) -> Result<(), SpawnError> {
    let bad = |m: String| Err(SpawnError::InvalidSpec(m));
    if let Some(cmd) = &spec.command {
        if cmd.is_empty() {
            return bad("no command given".into());
        }
    }
    if !valid_hostname(&spec.hostname) {
        return bad(format!(
            "invalid hostname {:?}: use 1-64 letters, digits, '-' and '.'",
            spec.hostname
        ));
    }
    validate_limits(&spec.limits)?;
    validate_mounts(&spec.mounts)?;
    if let Some(w) = &spec.workdir {
        crate::rootfs::relative(w).map_err(|e| SpawnError::InvalidSpec(format!("workdir: {e}")))?;
    }
    crate::env::EnvVars::check(&spec.env).map_err(|e| SpawnError::InvalidSpec(e.to_string()))?;
    if let Some(ca) = &spec.trust_ca {
        crate::trust::check_ca(ca).map_err(|e| SpawnError::InvalidSpec(e.to_string()))?;
    }
    if !spec.layers.is_empty() {
        if matches!(spec.rootfs, RootSource::Layers { .. }) {
            return bad("a build step takes no saved layers".into());
        }
        if spec.layers.len() > crate::spec::MAX_SAVED_LAYERS {
            return bad(format!(
                "{} saved layers, at most {}",
                spec.layers.len(),
                crate::spec::MAX_SAVED_LAYERS
            ));
        }
        for l in &spec.layers {
            let plain = l.is_absolute()
                && l.components().all(|c| {
                    matches!(
                        c,
                        std::path::Component::RootDir | std::path::Component::Normal(_)
                    )
                })
                && !l.as_os_str().as_encoded_bytes().contains(&b':')
                && !l.as_os_str().as_encoded_bytes().contains(&b',');
            if !plain {
                return bad(format!(
                    "saved layer {} must be an absolute path without '..', ':' or ','",
                    l.display()
                ));
            }
            if !fs::symlink_metadata(l).is_ok_and(|m| m.is_dir()) {
                return bad(format!("saved layer {} is not a directory", l.display()));
            }
        }
    }
    Ok(())
}

/// A live sandbox. Dropping it destroys it.
#[derive(Debug)]
pub struct Sandbox {
    id: String,
    pid: libc::pid_t,
    pidfd: Option<OwnedFd>,
    control: Option<OwnedFd>,
    cgroup: SandboxCgroup,
    uids: Option<UidRange>,
    limits_memory: u64,
    /// What the memory cgroup holds beyond `limits_memory` for files in RAM.
    files_in_memory: u64,
    pty_master: Option<OwnedFd>,
    /// The sandbox's writable layer (its overlay's upper directory), as init opened it:
    /// holding it keeps the layer's tmpfs until the sandbox is destroyed.
    upper: Option<OwnedFd>,
    fate: Option<Fate>,
    destroyed: bool,
    /// The sandbox's registry entry, removed once its cgroups are gone.
    registry: Option<PathBuf>,
    /// The creator's end of the agent's stream socket (agent sandboxes), until taken.
    agent_conn: Option<OwnedFd>,
    /// A kept sandbox's rendezvous, sending end (see [`crate::keep`]).
    rendezvous: Option<OwnedFd>,
    /// Taken up from an earlier spawner: PID 1 is not this process's child.
    adopted: bool,
}

/// What [`Sandbox::next_event`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Nothing yet.
    None,
    /// The command's fate is known.
    Done(Fate),
}

impl Sandbox {
    /// The sandbox id (unique on this host; names its cgroups).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Host uid that sandbox uid 0 maps to.
    pub fn host_uid_base(&self) -> u32 {
        self.uids.as_ref().map(UidRange::base).unwrap_or(0)
    }

    /// Takes the creator's end of the agent's stream socket (specs with `agent: true`).
    pub fn take_agent_conn(&mut self) -> Option<OwnedFd> {
        self.agent_conn.take()
    }

    /// PID 1's pid (in the caller's PID namespace).
    pub fn init_pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether the sandbox outlives this spawner (see [`crate::keep`]).
    pub fn is_kept(&self) -> bool {
        self.rendezvous.is_some()
    }

    /// A new connection to a kept sandbox's agent: the agent drops the one it had (if any)
    /// and serves this one, which must start with a hello, like the first.
    pub fn reconnect(&self) -> io::Result<OwnedFd> {
        let Some(send) = &self.rendezvous else {
            return Err(io::Error::other("the sandbox is not kept"));
        };
        let (ours, theirs) = sys::stream_pair()?;
        crate::keep::send_conn(send.as_fd(), &theirs)?;
        Ok(ours)
    }

    /// Leaves a kept sandbox running for a later spawner: its descriptors and uid slot's lock
    /// are let go, its registry entry stays. Any other sandbox is destroyed.
    pub fn release(mut self) -> Result<(), SpawnError> {
        if self.is_kept() {
            self.destroyed = true;
            return Ok(());
        }
        self.destroy()
    }

    /// The sandbox's cgroup directories (to read its usage from another process).
    pub fn cgroup(&self) -> &SandboxCgroup {
        &self.cgroup
    }

    /// Takes the PTY master (when the spec asked for a TTY).
    pub fn take_pty(&mut self) -> Option<OwnedFd> {
        self.pty_master.take()
    }

    /// The control socket: readable when init has something to report.
    pub fn control_fd(&self) -> Option<BorrowedFd<'_>> {
        self.control.as_ref().map(|c| c.as_fd())
    }

    /// Lets init start the command (after the caller copied files in, for example).
    pub fn start(&self) -> io::Result<()> {
        match &self.control {
            Some(c) => control::send_to_init(c.as_fd(), &ToInit::Start),
            None => Err(io::Error::other("sandbox has no control channel")),
        }
    }

    /// Asks init to forward `sig` to the command.
    pub fn signal(&self, sig: i32) -> io::Result<()> {
        match &self.control {
            Some(c) => control::send_to_init(c.as_fd(), &ToInit::Signal(sig)),
            None => Ok(()),
        }
    }

    /// Reads what init reported, without blocking when `block` is false.
    pub fn next_event(&mut self, block: bool) -> io::Result<Event> {
        if let Some(f) = self.fate {
            return Ok(Event::Done(f));
        }
        let Some(control) = &self.control else {
            return Ok(Event::Done(Fate::InitDied));
        };
        if !block {
            let mut p = [libc::pollfd {
                fd: control.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            if sys::poll(&mut p, 0)? == 0 {
                return Ok(Event::None);
            }
        }
        let fate = match control::recv_from_init(control.as_fd()) {
            Ok(Some(FromInit::Exited(status))) => {
                if status == ExitStatus::Signaled(libc::SIGKILL) && self.cgroup.oom_kills() > 0 {
                    Fate::OutOfMemory {
                        limit_bytes: self.limits_memory,
                        files_bytes: self.files_in_memory,
                    }
                } else {
                    Fate::Exited(status)
                }
            }
            Ok(Some(FromInit::ExecFailed { errno })) => Fate::ExecFailed(errno),
            Ok(Some(FromInit::TimedOut)) => Fate::TimedOut,
            Ok(Some(_)) => return Ok(Event::None),
            Ok(None) | Err(_) => {
                if self.cgroup.oom_kills() > 0 {
                    Fate::OutOfMemory {
                        limit_bytes: self.limits_memory,
                        files_bytes: self.files_in_memory,
                    }
                } else {
                    Fate::InitDied
                }
            }
        };
        self.fate = Some(fate);
        Ok(Event::Done(fate))
    }

    /// Blocks until the command's fate is known or `deadline` passes.
    pub fn wait(&mut self, deadline: Option<Instant>) -> io::Result<Fate> {
        loop {
            if let Some(f) = self.fate {
                return Ok(f);
            }
            let timeout = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(Fate::TimedOut);
                    }
                    left.as_millis().min(i32::MAX as u128) as i32
                }
            };
            let Some(control) = &self.control else {
                return Ok(Fate::InitDied);
            };
            let mut p = [libc::pollfd {
                fd: control.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            match sys::poll(&mut p, timeout) {
                Ok(0) => continue,
                Ok(_) => {
                    self.next_event(true)?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// Freezes every process of the sandbox (before copying its outputs, or to pause it).
    pub fn freeze(&self) -> Result<(), SpawnError> {
        Ok(self.cgroup.freeze()?)
    }

    /// Lets the processes of a frozen sandbox run again.
    pub fn thaw(&self) -> Result<(), SpawnError> {
        Ok(self.cgroup.thaw()?)
    }

    /// Sets the hostname of the sandbox's UTS namespace (a warm sandbox claimed: see
    /// `husk_core`'s pools). The sandbox's own root cannot: it holds no `CAP_SYS_ADMIN`. The
    /// calling thread enters the namespace through PID 1's pidfd (never a pid that could be
    /// reused), sets the name and goes back to its own; namespaces of this kind are per thread,
    /// so nothing else of the spawner is ever in the sandbox's.
    pub fn set_hostname(&self, name: &str) -> Result<(), SpawnError> {
        if !valid_hostname(name) {
            return Err(SpawnError::InvalidSpec(format!(
                "invalid hostname {name:?}: use 1-64 letters, digits, '-' and '.'"
            )));
        }
        let io = |what: &str| {
            let what = what.to_owned();
            move |source: io::Error| SpawnError::Io { what, source }
        };
        let pidfd = match &self.pidfd {
            Some(fd) => fd.try_clone().map_err(io("the sandbox's pidfd"))?,
            None => sys::pidfd_open(self.pid).map_err(io("pidfd_open"))?,
        };
        let own = sys::open(
            c"/proc/thread-self/ns/uts",
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        )
        .map_err(io("the spawner's UTS namespace"))?;
        sys::setns(pidfd.as_fd(), libc::CLONE_NEWUTS)
            .map_err(io("entering the sandbox's UTS namespace"))?;
        let set = sys::sethostname(name);
        // Back to its own before anything else; a thread that cannot go back must not go on.
        if let Err(e) = sys::setns(own.as_fd(), libc::CLONE_NEWUTS) {
            panic!("the spawner could not leave a sandbox's UTS namespace: {e}");
        }
        set.map_err(io("sethostname"))
    }

    /// The sandbox's writable layer (the overlay's upper directory), a new descriptor of it:
    /// everything below it is the sandbox's and hostile (see [`crate::layer_capture`]).
    /// `None` for a build step's sandbox, whose layer is on the host already.
    pub fn upper_dir(&self) -> io::Result<Option<OwnedFd>> {
        self.upper.as_ref().map(|u| u.try_clone()).transpose()
    }

    /// Opens the sandbox's root directory (through PID 1's `/proc/<pid>/root`) as an O_PATH fd,
    /// for copying files in and out with lookups confined to the sandbox root.
    pub fn root_dir(&self) -> io::Result<OwnedFd> {
        let p = sys::cpath(Path::new(&format!("/proc/{}/root", self.pid)))?;
        sys::open(&p, libc::O_PATH | libc::O_DIRECTORY, 0)
    }

    /// Kills everything and removes every trace of the sandbox from the host. Idempotent.
    pub fn destroy(&mut self) -> Result<(), SpawnError> {
        if self.destroyed {
            return Ok(());
        }
        self.destroyed = true;
        // cgroup.kill (or freezer + SIGKILL) reaches every process of the sandbox at once; the
        // SIGKILL to PID 1 also makes the kernel kill its whole PID namespace, and covers a
        // hierarchy without cgroup.kill.
        let _ = self.cgroup.kill_all();
        if let Some(pidfd) = self.pidfd.take() {
            let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            if self.adopted {
                // Not this process's child: its parent (the host's init, or a subreaper)
                // reaps it; the pidfd turns readable once it has exited.
                sys::pidfd_wait_exit(pidfd.as_fd(), Duration::from_secs(10))
                    .map_err(io_ctx("wait for sandbox init"))?;
            } else {
                sys::waitid_pidfd(pidfd.as_fd(), false).map_err(io_ctx("reap sandbox init"))?;
            }
        }
        self.rendezvous = None;
        self.control = None;
        self.pty_master = None;
        self.upper = None;
        // With PID 1 reaped every process of the namespace is gone; remove() retries while the
        // kernel finishes releasing them, and a straggler outside the namespace gets killed.
        if self.cgroup.remove().is_err() {
            let _ = self.cgroup.kill_all();
            self.cgroup.remove()?;
        }
        if let Some(registry) = &self.registry {
            let _ = unregister(registry);
        }
        // Only now is the uid range safe to hand out again.
        self.uids = None;
        Ok(())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.destroy();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registry_entry_naming_a_foreign_cgroup_is_not_acted_on() {
        let run = std::env::temp_dir().join(format!(
            "husk-reg-test-{}-{:x}",
            std::process::id(),
            sys::random_u64().unwrap()
        ));
        let spawner = Spawner::with_run_dir(&run).unwrap();
        // A cgroup that is not a sandbox's: an entry pointing at it must not get it killed.
        let victim = std::path::PathBuf::from(format!(
            "/sys/fs/cgroup/unified/husk-test-victim-{:x}",
            sys::random_u64().unwrap()
        ));
        fs::create_dir(&victim).unwrap();
        let entry = spawner.registry_entry(5);
        fs::write(&entry, format!("v2 {}\n", victim.display())).unwrap();
        let cleared = spawner.clear_slot(5);
        let survived = victim.exists();
        let _ = fs::remove_dir(&victim);
        let _ = fs::remove_dir_all(&run);
        assert!(!cleared, "a foreign cgroup was accepted as slot 5's");
        assert!(survived, "a foreign cgroup was removed");
    }

    #[test]
    fn an_id_names_its_slot_and_its_spawner() {
        for worker in [0, 1, 7, 63] {
            let id = sandbox_id(42, 0xabc, worker);
            assert_eq!(worker_of(&id), worker, "{id}");
            assert_eq!(id.split('-').next().and_then(parse_slot), Some(42), "{id}");
        }
        assert_eq!(sandbox_id(3, 0xabc, 0), "s3-000000000abc");
        // Ids of a husk before several spawners are the first spawner's.
        assert_eq!(worker_of("s12-00ab12cd34ef"), 0);
        assert_eq!(worker_of("s12-00ab12cd34ef-wx"), 0);
    }

    #[test]
    fn slot_is_parsed_from_sandbox_id() {
        assert_eq!(parse_slot(&cgroup_name(42)), Some(42));
        assert_eq!(parse_slot("husk-spawner"), None);
        assert_eq!(parse_slot("s-1"), None);
        assert_eq!(parse_slot("s42-00ab"), None);
    }
}
