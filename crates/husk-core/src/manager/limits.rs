//! What a team and a sandbox may have: quotas, resources, timeouts, the host's memory
//! reserve, workspace mounts and the egress policy of a request.

use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;

use husk_runtime::Limits;

use super::{check_mount_path, CoreError, Manager, WorkspaceMount, MAX_WORKSPACE_MOUNTS};

/// The host's `MemAvailable` (what can be allocated without swapping), in bytes; `None` when
/// `/proc/meminfo` does not say.
pub fn host_memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

/// The host's `MemTotal`, in bytes; `None` when `/proc/meminfo` does not say.
pub fn host_memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_meminfo(&text, "MemTotal:")
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    parse_meminfo(meminfo, "MemAvailable:")
}

fn parse_meminfo(meminfo: &str, key: &str) -> Option<u64> {
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// A place in a team's quota held while one of its sandboxes is being created (or resumed).
///
/// The place is given up either by dropping it (the create failed) or by [`Self::settle`]
/// (the sandbox now counts among the team's running ones). Settling makes the sandbox count
/// and gives up the place in one step under the lock [`Manager::reserve`] counts under, so no
/// create ever sees one sandbox twice, as being created and as running: a team at its quota
/// that kills one sandbox can always create the next.
pub(super) struct Reservation {
    pub(super) manager: Arc<Manager>,
    pub(super) team: String,
    settled: bool,
}

impl Reservation {
    /// Runs `admit`, which makes the reserved sandbox count among the team's running ones
    /// (inserts it into the live sandboxes, or un-pauses it), and gives up the place, both
    /// under the quota's lock. `admit` must not take that lock itself.
    pub(super) fn settle<T>(mut self, admit: impl FnOnce() -> T) -> T {
        let mut creating = self.manager.creating_lock();
        let out = admit();
        give_back(&mut creating, &self.team);
        self.settled = true;
        out
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if !self.settled {
            give_back(&mut self.manager.creating_lock(), &self.team);
        }
    }
}

/// Gives a place of `team`'s back in `creating` (the quota's lock, held).
fn give_back(creating: &mut HashMap<String, u32>, team: &str) {
    if let Some(n) = creating.get_mut(team) {
        *n = n.saturating_sub(1);
    }
}

impl Manager {
    /// The policy a create request gets: its own or the server's default; with no egress on
    /// this server, asking for any is an error (a sandbox never silently gets less isolation
    /// or less network than it asked for), and the default is no network.
    pub fn request_policy(
        &self,
        asked: Option<&husk_net::NetPolicy>,
    ) -> Result<husk_net::NetPolicy, CoreError> {
        match (self.egress(), asked) {
            (Some(_), Some(p)) => Ok(p.clone()),
            (Some(n), None) => Ok(n.default.clone()),
            (None, None) | (None, Some(husk_net::NetPolicy::None)) => Ok(husk_net::NetPolicy::None),
            (None, Some(_)) => Err(CoreError::Unsupported(
                "this server gives sandboxes no network (start husk serve with --egress host or \
                 --egress netns:...); ask for no network or leave it out"
                    .into(),
            )),
        }
    }

    /// Resolves workspace mounts of `team` to host bind mounts (id-mapped, so the workspace's
    /// files are the sandbox user's); every error names the workspace or path.
    pub(super) fn workspace_mounts(
        &self,
        team: &str,
        mounts: &[WorkspaceMount],
    ) -> Result<Vec<husk_runtime::MountSpec>, CoreError> {
        if mounts.is_empty() {
            return Ok(Vec::new());
        }
        if mounts.len() > MAX_WORKSPACE_MOUNTS {
            return Err(CoreError::InvalidArgument(format!(
                "at most {MAX_WORKSPACE_MOUNTS} workspaces per sandbox"
            )));
        }
        let Some(ws) = self.workspaces() else {
            return Err(CoreError::InvalidArgument(self.workspaces_off().into()));
        };
        let mut out: Vec<husk_runtime::MountSpec> = Vec::new();
        for m in mounts {
            check_mount_path(&m.path).map_err(CoreError::InvalidArgument)?;
            let sandbox = std::path::PathBuf::from(&m.path);
            if out.iter().any(|o| o.sandbox == sandbox) {
                return Err(CoreError::InvalidArgument(format!(
                    "two workspaces are mounted on {}",
                    m.path
                )));
            }
            let host = ws.dir(team, &m.name).map_err(|e| match e {
                crate::workspaces::WorkspaceError::NotFound(_) => {
                    CoreError::WorkspaceNotFound(m.name.clone())
                }
                other => CoreError::InvalidArgument(other.to_string()),
            })?;
            out.push(husk_runtime::MountSpec {
                host,
                sandbox,
                writable: m.writable,
                ids: husk_runtime::MountIds::Shared,
            });
        }
        Ok(out)
    }

    /// `req` within the server's limits (each resource at most the server's).
    pub fn request_limits(&self, req: Option<&Limits>) -> Result<Limits, CoreError> {
        let max = &self.config.limits;
        let Some(l) = req else {
            return Ok(max.clone());
        };
        let over = |what: &str, got: u64, max: u64| {
            Err(CoreError::InvalidArgument(format!(
                "{what} {got} is more than this server allows ({max})"
            )))
        };
        if l.memory_bytes > max.memory_bytes {
            return over("memory (bytes)", l.memory_bytes, max.memory_bytes);
        }
        if l.cpu_millis > max.cpu_millis {
            return over("cpu (millicpus)", l.cpu_millis, max.cpu_millis);
        }
        if l.disk_bytes > max.disk_bytes {
            return over("disk (bytes)", l.disk_bytes, max.disk_bytes);
        }
        if l.pids > max.pids {
            return over("pids", l.pids, max.pids);
        }
        Ok(l.clone())
    }

    pub(super) fn quota(&self, team: &str) -> u32 {
        self.store
            .team_quota(team)
            .ok()
            .flatten()
            .unwrap_or(self.config.default_quota)
    }

    /// Reserves a place in `team`'s quota of running sandboxes for the time of a creation (or
    /// a resume): running ones, paused-in-place ones excluded, and those being created count.
    pub(super) fn reserve(self: &Arc<Self>, team: &str) -> Result<Reservation, CoreError> {
        let limit = self.quota(team);
        // The running ones are counted under the quota's lock: a reservation settles (its
        // sandbox starts to count here, its place is given up) under that lock too.
        let mut creating = self.creating_lock();
        let live = super::read(&self.sandboxes)
            .values()
            .filter(|s| s.team == team && !s.is_paused())
            .count() as u32;
        let pending = creating.entry(team.to_owned()).or_default();
        if live + *pending >= limit {
            return Err(CoreError::QuotaExceeded {
                team: team.to_owned(),
                limit,
            });
        }
        *pending += 1;
        Ok(Reservation {
            manager: self.clone(),
            team: team.to_owned(),
            settled: false,
        })
    }

    /// The places held by creates under way, per team. Taken before the live sandboxes'
    /// lock where both are held.
    fn creating_lock(&self) -> MutexGuard<'_, HashMap<String, u32>> {
        self.creating.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Clamps a requested timeout to (0, max].
    pub(super) fn clamp_timeout(&self, t: Duration) -> Duration {
        t.clamp(Duration::from_secs(1), self.config.max_timeout)
    }

    /// Refuses a create while the host has less memory available than the reserve.
    pub(super) fn check_memory_reserve(&self) -> Result<(), CoreError> {
        let reserve = self.config.memory_reserve;
        if reserve == 0 {
            return Ok(());
        }
        match host_memory_available() {
            Some(available) if available < reserve => {
                Err(CoreError::HostMemoryLow { available, reserve })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(super) fn mem_available_is_read_from_meminfo() {
        let meminfo = "MemTotal:       24536320 kB\nMemFree:        1 kB\n\
                       MemAvailable:   23000000 kB\nBuffers: 5 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(23_000_000 * 1024));
        assert_eq!(parse_meminfo(meminfo, "MemTotal:"), Some(24_536_320 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots kB\n"), None);
        // This host's own, in a sane range.
        let here = host_memory_available().unwrap();
        assert!(here > 0 && here < 1 << 50);
    }
}
