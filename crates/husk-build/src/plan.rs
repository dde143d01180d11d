//! What a template build does, whatever it was written in: the one description that husk's
//! TOML spec ([`crate::spec`]) and Dockerfiles ([`crate::dockerfile`]) are parsed into and that
//! the builder ([`crate::build`]) executes. Every step carries where it came from, so errors
//! and progress name the line or key the user wrote.

use std::path::PathBuf;
use std::time::Duration;

/// A parsed, validated build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildPlan {
    /// The name the spec asks for (`husk template build --name` wins).
    pub name: Option<String>,
    /// Where relative `COPY`/`[[files]]` sources are resolved (the spec file's directory, or
    /// the Dockerfile's).
    pub context: PathBuf,
    pub base: Base,
    /// In order; each one's result is a cached layer.
    pub steps: Vec<Step>,
    /// What sandboxes of the template get unless their create request says otherwise.
    pub defaults: Defaults,
    /// The first step that must run whatever the cache holds; every later one runs too (E2B's
    /// `force` of a step). `None`: all may come from the cache.
    pub force_from: Option<usize>,
}

/// What the first layer(s) come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// A Debian root file system made by `mmdebstrap` from the host's configured mirror.
    Debian {
        /// `bookworm`, `trixie`, ...
        suite: String,
        /// mmdebstrap variant: `minbase` (default), `buildd`, `important`, ...
        variant: String,
        /// Installed by mmdebstrap itself (`--include`), sorted and deduplicated.
        packages: Vec<String>,
    },
    /// An OCI image reference (`registry/repo:tag`, `repo@sha256:...`), or the name of a local
    /// husk template: a local template of that name wins, as in Docker.
    Image(String),
    /// Nothing: an empty root (`FROM scratch`).
    Scratch,
}

/// One build step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Where it was written: `Dockerfile:7`, `husk.toml [[run]] #2`, `husk.toml packages.pip`.
    pub origin: String,
    /// One line for progress output: `RUN pip install numpy`, `COPY app/ /srv/app`.
    pub display: String,
    pub kind: StepKind,
}

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepKind {
    /// Runs a command in a build sandbox (with network access); its changes are the layer.
    /// Package installs (apt/pip/npm lists) are rendered into `Run` steps by the parsers.
    Run {
        command: Command,
        /// `root`, `user`, a name from the image's `/etc/passwd`, or `uid[:gid]`.
        user: String,
        /// Absolute; created if missing.
        workdir: String,
        /// Environment of the command (ENV and ARG values in effect, in order).
        env: Vec<(String, String)>,
    },
    /// Copies files of the build context into the root file system.
    Copy {
        /// Relative to the context; never absolute, never `..` (checked by the parser).
        sources: Vec<PathBuf>,
        /// Absolute path in the image; a trailing `/` (or several sources) means a directory.
        dest: String,
        /// Owner of what is copied: a user name or `uid[:gid]`; default root.
        owner: Option<String>,
        /// Working directory in effect (for a relative `dest` in a Dockerfile, already applied
        /// to `dest`; kept for the cache key and the display).
        workdir: String,
    },
}

/// A command to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run with `/bin/sh -c`.
    Shell(String),
    /// argv, executed directly (Dockerfile exec form `RUN ["a", "b"]`).
    Exec(Vec<String>),
}

/// Sandbox defaults recorded in the template's manifest.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Defaults {
    /// Default user of processes (`root` or `user`); `None`: husk's default (`user`).
    pub user: Option<String>,
    /// Default working directory; `None`: the user's home.
    pub workdir: Option<String>,
    /// Environment every process of a sandbox gets (Dockerfile `ENV`, spec `[sandbox.env]`).
    pub env: Vec<(String, String)>,
    /// Started in the background when a sandbox is created, before it is handed out.
    pub start_cmd: Option<String>,
    /// Run repeatedly after `start_cmd` until it exits 0; the sandbox is handed out then.
    pub ready_cmd: Option<String>,
    /// How long the ready check may take before the create fails (default 60 s).
    pub ready_timeout: Option<Duration>,
    /// Languages whose code contexts (Jupyter kernels) start with every sandbox, ready before
    /// it is handed out; `None`: the base's.
    pub contexts: Option<Vec<String>>,
    /// Warm sandboxes the server keeps of this template (a warm pool; `husk serve --warm`
    /// overrides it). Not inherited by templates built from this one.
    pub warm: Option<u32>,
}

/// A parse or validation error, naming where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct PlanError {
    /// `Dockerfile:12`, `husk.toml`, `husk.toml: packages.pip`.
    pub origin: String,
    pub message: String,
}
