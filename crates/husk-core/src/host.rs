//! The seam between the core and the operating system: what the core needs of whatever makes
//! sandboxes. In `husk serve` it is the spawner process ([`SpawnerService`]); in unit tests a
//! fake (`crate::testing::FakeHost`), so the manager's logic (quotas, tenancy, timeouts,
//! clean-up after failures) is tested without root or a kernel's namespaces.
//!
//! Both calls block for the few milliseconds they take: the core calls them off the async
//! threads (`spawn_blocking`).

use std::os::fd::BorrowedFd;

use husk_runtime::service::{Created, ServiceError, SpawnerService};
use husk_runtime::{Assignment, SandboxSpec};

/// Makes and destroys sandboxes for the core.
pub trait SandboxHost: Send + Sync + 'static {
    /// Creates a sandbox for `spec` (which has `agent` set), joining `netns` when given.
    fn create(
        &self,
        spec: &SandboxSpec,
        netns: Option<BorrowedFd<'_>>,
    ) -> Result<Created, ServiceError>;

    /// Destroys a sandbox the host created: every process, mount, cgroup and its uid range.
    fn destroy(&self, runtime_id: &str) -> Result<(), ServiceError>;

    /// Freezes every process of a sandbox (a pause that keeps its memory).
    fn freeze(&self, runtime_id: &str) -> Result<(), ServiceError>;

    /// Lets a frozen sandbox run again.
    fn thaw(&self, runtime_id: &str) -> Result<(), ServiceError>;

    /// Gives a live sandbox its hostname, lower limits and mounts (a warm sandbox claimed).
    fn assign(&self, runtime_id: &str, assignment: &Assignment) -> Result<(), ServiceError>;

    /// The sandboxes an earlier server left running that the host took up at its start
    /// (runtime ids): each to be reconnected to or destroyed.
    fn adopted(&self) -> Vec<String>;

    /// A new agent connection (and namespace, cgroups) of a sandbox the host took up.
    fn reconnect(&self, runtime_id: &str) -> Result<Created, ServiceError>;
}

impl SandboxHost for SpawnerService {
    fn create(
        &self,
        spec: &SandboxSpec,
        netns: Option<BorrowedFd<'_>>,
    ) -> Result<Created, ServiceError> {
        self.create_in(spec, netns)
    }

    fn destroy(&self, runtime_id: &str) -> Result<(), ServiceError> {
        SpawnerService::destroy(self, runtime_id)
    }

    fn freeze(&self, runtime_id: &str) -> Result<(), ServiceError> {
        SpawnerService::freeze(self, runtime_id)
    }

    fn thaw(&self, runtime_id: &str) -> Result<(), ServiceError> {
        SpawnerService::thaw(self, runtime_id)
    }

    fn assign(&self, runtime_id: &str, assignment: &Assignment) -> Result<(), ServiceError> {
        SpawnerService::assign(self, runtime_id, assignment)
    }

    fn adopted(&self) -> Vec<String> {
        SpawnerService::adopted(self)
            .iter()
            .map(|a| a.id.clone())
            .collect()
    }

    fn reconnect(&self, runtime_id: &str) -> Result<Created, ServiceError> {
        SpawnerService::reconnect(self, runtime_id)
    }
}
