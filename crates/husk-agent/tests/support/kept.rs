//! What the kept-sandbox tests share (`keep.rs`, `spawners.rs`; included with `#[path]`):
//! the spec of a sandbox that outlives its spawner, a hello, whether a process still runs,
//! and the clean-up that destroys whatever a test's owner left.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use husk_proto::{Hello, User, VERSION};
use husk_runtime::cgroup::CgroupOptions;
use husk_runtime::service;
use husk_runtime::{sys, SandboxSpec};

/// Destroys what the test's owner left, when dropped (a spawner of that owner takes it up).
pub struct Cleanup(pub String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Ok(s) = service::start_owned(
            husk_agent::main,
            CgroupOptions::default(),
            None,
            Some(self.0.clone()),
        ) {
            for a in s.adopted().to_vec() {
                let _ = s.destroy(&a.id);
            }
            let _ = s.shutdown();
        }
    }
}

/// The agent's hello, with `env` for every process.
pub fn hello_with(env: Vec<(String, String)>) -> Hello {
    Hello {
        version: VERSION,
        env,
        default_user: User::User,
        default_workdir: None,
    }
}

/// An idle agent sandbox that outlives its spawner.
pub fn kept_spec() -> SandboxSpec {
    let mut spec = SandboxSpec::idle();
    spec.agent = true;
    spec.die_with_parent = false;
    spec
}

pub fn alive(pid: i32) -> bool {
    sys::pidfd_open(pid)
        .is_ok_and(|fd| !sys::pidfd_wait_exit(fd.as_fd(), Duration::ZERO).expect("poll a pidfd"))
}

/// Whether process `pid` is gone within `within` (polled).
pub fn wait_gone(pid: i32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !alive(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    !alive(pid)
}
