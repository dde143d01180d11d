//! What a sandbox is made of: the validated description the spawner builds from.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which user the command runs as inside the sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum User {
    /// uid/gid 1000, home `/home/user`, no capabilities at all (the default).
    User,
    /// uid/gid 0 of the sandbox's user namespace: a bounded capability set, still an
    /// unprivileged uid on the host.
    Root,
}

impl User {
    /// The uid (and gid) inside the sandbox.
    pub fn id(self) -> u32 {
        match self {
            User::User => 1000,
            User::Root => 0,
        }
    }

    /// The user's home directory inside the sandbox.
    pub fn home(self) -> &'static str {
        match self {
            User::User => "/home/user",
            User::Root => "/root",
        }
    }

    /// The login name.
    pub fn name(self) -> &'static str {
        match self {
            User::User => "user",
            User::Root => "root",
        }
    }
}

/// What a build step may keep in RAM (its `/dev` and `/dev/shm`): its writable layer is on the
/// host's disk, not in the tmpfs that every other sandbox's `--disk` sizes.
pub const BUILD_STEP_RAM_BYTES: u64 = 64 << 20;

/// Resource limits enforced by the sandbox's cgroups and rlimits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory for the sandbox's processes, in bytes (no swap). The memory cgroup holds more:
    /// see [`SandboxSpec::memory_cgroup_bytes`].
    pub memory_bytes: u64,
    /// CPU quota in millicpus (1000 = one full CPU).
    pub cpu_millis: u64,
    /// Maximum number of tasks (processes and threads).
    pub pids: u64,
    /// Size of the writable layer (tmpfs) in bytes.
    pub disk_bytes: u64,
}

impl Limits {
    /// [`SandboxSpec::files_in_memory`] for a sandbox whose writable layer is in RAM
    /// (`layer_in_ram`) or on the host's disk (a build step's).
    pub fn files_in_memory(&self, layer_in_ram: bool) -> u64 {
        if layer_in_ram {
            self.disk_bytes
        } else {
            BUILD_STEP_RAM_BYTES
        }
    }

    /// [`SandboxSpec::memory_cgroup_bytes`], with the same `layer_in_ram`.
    pub fn memory_cgroup_bytes(&self, layer_in_ram: bool) -> u64 {
        self.memory_bytes
            .saturating_add(self.files_in_memory(layer_in_ram))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: 512 << 20,
            cpu_millis: 1000,
            pids: 256,
            disk_bytes: 1 << 30,
        }
    }
}

/// A host path bind-mounted into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountSpec {
    /// Absolute host path (file or directory); the operator's input, trusted.
    pub host: PathBuf,
    /// Absolute path inside the sandbox.
    pub sandbox: PathBuf,
    /// Writable only when asked for; always nosuid and nodev.
    pub writable: bool,
    /// Whose the files are inside.
    #[serde(default)]
    pub ids: MountIds,
}

/// What a live sandbox is given when it becomes a create's (a warm sandbox claimed): what a
/// create would have given it from the start. See [`crate::Spawner::assign`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// Its hostname (the create's sandbox id).
    pub hostname: String,
    /// Its limits, when they differ from those it was made with (only ever lower: memory,
    /// CPU and tasks in its cgroups, the size of its writable layer).
    pub limits: Option<Limits>,
    /// Host paths mounted into it ([`SandboxSpec::mounts`]).
    pub mounts: Vec<MountSpec>,
}

/// How a host mount's owners appear inside the sandbox (an id-mapped mount; the host's files
/// keep their owners).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MountIds {
    /// Not mapped: every host id shows as `nobody`, and the sandbox's users can write only
    /// where the host's modes let anyone write.
    #[default]
    Unmapped,
    /// Through the sandbox's id mapping: the host's id N is the sandbox's id N (a workspace's
    /// files, owned by 1000 on the host, are the sandbox `user`'s), and what the sandbox writes
    /// is stored under the host's id N.
    Shared,
    /// The host's `uid`/`gid` (the owner of the mounted path) is the sandbox's user (the
    /// spec's [`User`]), and what that user writes is stored as the owner's; every other id
    /// shows as `nobody` and cannot write there. For the operator's own directories
    /// (`husk run -v`).
    Owner { uid: u32, gid: u32 },
}

/// What a sandbox's root file system is made of.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum RootSource {
    /// The host template: the host's `/usr` and a few `/etc` files (see
    /// [`crate::host_template`]).
    #[default]
    Host,
    /// A built template: an erofs image file, mounted once on the host (see [`crate::images`])
    /// and seen by every sandbox through an id-mapped view, so the image's root is the
    /// sandbox's root.
    Image {
        /// The image file (trusted: written by husk's builder).
        path: PathBuf,
        /// Its expected size: a file of another size (truncated, replaced) is refused.
        size: u64,
        /// Its content digest (`sha256:<hex>`): names the shared mount.
        digest: String,
    },
    /// A template build step: `lower` (top first: directories or mounted images, owned by
    /// sandbox ids) under a writable `upper` directory on the host that keeps the step's
    /// changes after the sandbox is gone. `upper` and `work` must be empty directories on
    /// the same file system; the runtime hands them to the sandbox's root.
    Layers {
        lower: Vec<PathBuf>,
        upper: PathBuf,
        work: PathBuf,
    },
}

/// The network a sandbox gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NetworkMode {
    /// Its own network namespace with loopback only.
    #[default]
    Loopback,
    /// The host's network namespace. Only for template build steps (package managers need
    /// the network); never for sandboxes that run users' code.
    Host,
    /// A network namespace the caller prepared and passes with the create request (husk's
    /// router gives it a link out and enforces its policy from outside). `nameserver` goes
    /// into the sandbox's `/etc/resolv.conf`.
    Joined { nameserver: std::net::Ipv4Addr },
}

impl NetworkMode {
    /// Whether the sandbox gets a network namespace of its own (created or passed in).
    pub fn isolated(&self) -> bool {
        !matches!(self, NetworkMode::Host)
    }
}

/// Everything the spawner needs to create one sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The command and its arguments; `None` leaves PID 1 idle until the sandbox is destroyed.
    pub command: Option<Vec<String>>,
    /// Environment of the command (`KEY=VALUE` pairs); PATH, HOME, USER, etc. get defaults.
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox; defaults to the user's home.
    pub workdir: Option<PathBuf>,
    pub user: User,
    pub hostname: String,
    pub limits: Limits,
    pub mounts: Vec<MountSpec>,
    /// Give the command a pseudo-terminal; the master end is handed to the caller.
    pub tty: bool,
    /// Initial terminal size (rows, cols) when `tty` is set.
    pub tty_size: Option<(u16, u16)>,
    /// Kill the sandbox if the process that created it dies (right for one-shot runs).
    pub die_with_parent: bool,
    /// How long the command may run. The creator enforces it; PID 1 enforces it too, a moment
    /// later, so the sandbox ends on time even if its creator is stopped or stuck.
    pub timeout: Option<std::time::Duration>,
    /// Start the command as soon as the sandbox is ready, without waiting for
    /// [`crate::Sandbox::start`] (saves a round trip when nothing is copied in first).
    pub autostart: bool,
    /// PID 1 becomes the agent registered with [`crate::Spawner::set_agent`] (server
    /// sandboxes): it gets a stream socket to the creator instead of running `command`.
    pub agent: bool,
    /// The root file system.
    pub rootfs: RootSource,
    pub network: NetworkMode,
    /// A CA certificate (PEM) the sandbox's trust store gets, before anything of the sandbox
    /// runs ([`crate::trust`]): the one its header rules' certificates are signed with.
    pub trust_ca: Option<String>,
    /// Saved layers (top first) over the template: what earlier sandboxes of the same lineage
    /// changed (a paused sandbox's files, a snapshot's), overlay-format directories on the
    /// host owned by image ids (see [`crate::layer_capture`]). Not for build steps.
    #[serde(default)]
    pub layers: Vec<PathBuf>,
}

/// Most saved layers a sandbox may stack over its template (each is an overlay lower layer,
/// and their paths share one page of mount options).
pub const MAX_SAVED_LAYERS: usize = 16;

impl SandboxSpec {
    /// A spec with defaults for everything but the command.
    pub fn new(command: Vec<String>) -> Self {
        SandboxSpec {
            command: Some(command),
            env: Vec::new(),
            workdir: None,
            user: User::User,
            hostname: "husk".into(),
            limits: Limits::default(),
            mounts: Vec::new(),
            tty: false,
            tty_size: None,
            die_with_parent: true,
            autostart: false,
            timeout: None,
            agent: false,
            rootfs: RootSource::Host,
            network: NetworkMode::Loopback,
            trust_ca: None,
            layers: Vec::new(),
        }
    }

    /// The most the sandbox's files can hold in RAM: the size of its staging tmpfs, which holds
    /// its writable layer, `/dev` and `/dev/shm` (`disk_bytes`; for build steps, whose layer is
    /// on the host's disk, [`BUILD_STEP_RAM_BYTES`]). Their pages are charged to the sandbox's
    /// memory cgroup like its processes' memory.
    ///
    /// Left out: the kernel's own per-file memory (inodes, dentries), which the cgroup is
    /// charged for too, bounded by the tmpfs's inode cap.
    pub fn files_in_memory(&self) -> u64 {
        self.limits.files_in_memory(self.layer_in_ram())
    }

    /// Whether the writable layer is the staging tmpfs (not a build step's directory on the
    /// host's disk).
    fn layer_in_ram(&self) -> bool {
        !matches!(self.rootfs, RootSource::Layers { .. })
    }

    /// The limit of the sandbox's memory cgroup: the processes' `memory_bytes` plus
    /// [`SandboxSpec::files_in_memory`]. With files and processes under one limit that only
    /// holds `memory_bytes`, a full disk would take memory from the processes, and past it the
    /// OOM killer would end the sandbox instead of the write failing with ENOSPC. With room for
    /// both, files stop at their own caps (ENOSPC) and never cost processes their `memory_bytes`;
    /// processes may use more while the files leave room. The host's worst case per sandbox is
    /// this sum, which is what the operator granted (memory and a disk in RAM).
    pub fn memory_cgroup_bytes(&self) -> u64 {
        self.limits.memory_cgroup_bytes(self.layer_in_ram())
    }

    /// A spec whose PID 1 idles (the shape of a server-side sandbox before its first command).
    pub fn idle() -> Self {
        let mut spec = SandboxSpec::new(Vec::new());
        spec.command = None;
        spec
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_holds_the_processes_memory_and_the_files_in_ram() {
        let mut spec = SandboxSpec::idle();
        // The defaults: 512 MiB + a 1 GiB tmpfs (the writable layer, /dev and /dev/shm).
        assert_eq!(spec.files_in_memory(), 1 << 30);
        assert_eq!(spec.memory_cgroup_bytes(), (512 << 20) + (1 << 30));
        spec.limits.memory_bytes = 64 << 20;
        spec.limits.disk_bytes = 8 << 20;
        assert_eq!(spec.memory_cgroup_bytes(), 72 << 20);
        // A built template's layer is a tmpfs too.
        spec.rootfs = RootSource::Image {
            path: "/i".into(),
            size: 1,
            digest: "sha256:0".into(),
        };
        assert_eq!(spec.memory_cgroup_bytes(), 72 << 20);
        // A build step's layer is on the host's disk: only /dev and /dev/shm are in RAM.
        spec.rootfs = RootSource::Layers {
            lower: Vec::new(),
            upper: "/u".into(),
            work: "/w".into(),
        };
        assert_eq!(spec.files_in_memory(), BUILD_STEP_RAM_BYTES);
        assert_eq!(spec.memory_cgroup_bytes(), 128 << 20);
    }

    #[test]
    fn the_memory_cgroup_limit_saturates_instead_of_wrapping() {
        let mut spec = SandboxSpec::idle();
        spec.limits.disk_bytes = u64::MAX - 1;
        assert_eq!(spec.files_in_memory(), u64::MAX - 1);
        assert_eq!(spec.memory_cgroup_bytes(), u64::MAX);
        spec.limits.disk_bytes = 1 << 30;
        spec.limits.memory_bytes = u64::MAX - (1 << 20);
        assert_eq!(spec.memory_cgroup_bytes(), u64::MAX);
    }
}
