//! husk's Linux sandbox runtime (the "namespace tier").
//!
//! This crate is the only place in husk with syscalls and `unsafe`; every other crate forbids
//! unsafe code and talks to the kernel through the safe API here.
//!
//! The principal types:
//! - [`SandboxSpec`] describes one sandbox: template, command, user, env, mounts, limits.
//! - [`Spawner`] creates sandboxes. It must run in a single-threaded process (forking a
//!   multithreaded process is unsafe), so `husk run` uses it in-process and `husk serve` will run
//!   it as a separate privileged process.
//! - [`Sandbox`] is a live sandbox: its PID 1 (husk's init), cgroups, uid range. Dropping or
//!   [`Sandbox::destroy`]ing it kills every process in it and removes everything it had on the host.
//!
//! ```no_run
//! use husk_runtime::{SandboxSpec, Spawner};
//! let spawner = Spawner::new()?;
//! let mut spec = SandboxSpec::new(vec!["/bin/echo".into(), "hello".into()]);
//! spec.limits.memory_bytes = 256 << 20;
//! let mut sandbox = spawner.create(&spec, None)?; // None: the caller's own stdio
//! sandbox.start()?;                                // copy files in first, if needed
//! let fate = sandbox.wait(None)?;
//! sandbox.destroy()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod agent;
pub mod cgroup;
pub mod confine;
pub mod control;
pub mod env;
pub mod exec;
pub mod failure;
pub mod fences;
mod handoff;
pub mod helper;
pub mod host_template;
pub mod images;
mod init;
pub mod keep;
pub mod layer_capture;
pub mod layerfs;
pub mod modules;
pub mod mountinfo;
pub mod oom;
pub mod probe;
pub mod pty;
pub mod rootfs;
pub mod service;
pub mod shared_scope;
pub mod spawner;
pub mod spec;
pub mod sys;
pub mod systemd;
pub mod transfer;
pub mod trust;
pub mod uidrange;
pub mod usr_layer;

/// Re-exported for the constants and plain structs (`pollfd`, signal numbers) the safe API uses.
pub use libc;
pub use spawner::{Fate, Sandbox, SpawnError, Spawner};
pub use spec::{
    Assignment, Limits, MountIds, MountSpec, NetworkMode, RootSource, SandboxSpec, User,
};
