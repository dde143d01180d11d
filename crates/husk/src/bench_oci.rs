//! The one-shot's second kind of peer: an OCI runtime (`crun`, `runc`: what Docker, Podman and
//! Kubernetes start containers with) running `true` from a bundle this module writes.
//!
//! bubblewrap, the first peer, does less than `husk run`: no cgroups, no limits. An OCI
//! runtime here is given what husk does by default: PID, network, IPC, UTS, mount, cgroup and
//! user namespaces (container root mapped to a range of its own, outside husk's uid slots),
//! `husk run`'s default limits (512 MiB of memory plus 1 GiB of disk, no swap; 256 tasks; one
//! CPU), `/usr` bound read-only, `/proc`, `/dev`, `/tmp`, and no new privileges. It does not
//! get a seccomp filter, Landlock or an overlay root (the root is a directory of empty mount
//! points), so it still does somewhat less than husk.
//!
//! The bundle lives in a directory of the temporary directory, removed when the peer is
//! dropped; each run's container has a name of its own, which `<runtime> run` deletes (its
//! state and cgroups) when `true` exits.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::Command;

/// Container root's first host uid and gid: above husk's uid slots (`uidrange`: from
/// 0x4000_0000, 16,384 ranges of 65,536).
const HOST_ID: u32 = 0x9000_0000;

/// An OCI runtime with a bundle ready to run `true`.
pub(crate) struct OciPeer {
    pub(crate) runtime: &'static str,
    bundle: PathBuf,
    runs: u64,
}

/// What became of a runtime asked to take part.
pub(crate) enum Found {
    Ready(OciPeer),
    /// Not on this machine (`--version` failed to run).
    Missing,
    /// Installed, but its first run failed: its message (crun, for one, refuses a hybrid
    /// cgroup host whose v2 hierarchy holds any controller).
    Failed(String),
}

impl OciPeer {
    /// Writes a bundle for `runtime` and runs it once (a warm-up that also says whether the
    /// runtime works on this host).
    pub(crate) fn find(runtime: &'static str) -> Found {
        if !crate::bench::installed(runtime) {
            return Found::Missing;
        }
        // Random, so that a directory left by an earlier process of the same pid is never
        // written into.
        let bundle = std::env::temp_dir().join(format!(
            "husk-bench-{runtime}-{}-{:x}",
            std::process::id(),
            husk_runtime::sys::random_u64().unwrap_or_default()
        ));
        let mut peer = OciPeer {
            runtime,
            bundle,
            runs: 0,
        };
        if let Err(e) = peer.write_bundle() {
            return Found::Failed(format!("writing its bundle: {e}"));
        }
        match crate::bench::time_cmd(&mut peer.command()) {
            Ok(_) => Found::Ready(peer),
            // Its first line: the runtime's own error, without what it logged around it.
            Err(e) => Found::Failed(e.lines().next().unwrap_or("no message").to_owned()),
        }
    }

    /// `<runtime> run` of the next container name.
    pub(crate) fn command(&mut self) -> Command {
        self.runs += 1;
        let mut c = Command::new(self.runtime);
        c.arg("run")
            .arg("--bundle")
            .arg(&self.bundle)
            .arg(self.container(self.runs));
        c
    }

    /// Deletes the last run's container, in whatever state a failed run left it (best
    /// effort: a run that failed before the runtime recorded it leaves nothing to delete).
    pub(crate) fn delete_last(&self) {
        let _ = Command::new(self.runtime)
            .args(["delete", "--force"])
            .arg(self.container(self.runs))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }

    fn container(&self, run: u64) -> String {
        format!("husk-bench-{}-{run}", std::process::id())
    }

    fn write_bundle(&self) -> io::Result<()> {
        let root = self.bundle.join("rootfs");
        for dir in ["usr", "proc", "dev", "tmp"] {
            fs::create_dir_all(root.join(dir))?;
        }
        for (link, target) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            symlink(target, root.join(link))?;
        }
        fs::write(
            self.bundle.join("config.json"),
            serde_json::to_vec_pretty(&config())?,
        )
    }
}

impl Drop for OciPeer {
    fn drop(&mut self) {
        // Empty mount points and symlinks only: the container's mounts were its own.
        let _ = fs::remove_dir_all(&self.bundle);
    }
}

/// The container's configuration (OCI runtime spec 1.0): `true` with husk's isolation and
/// default limits, as described in the module's documentation.
fn config() -> serde_json::Value {
    let caps = ["CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"];
    let memory: i64 = (512 + 1024) << 20;
    let map = serde_json::json!([{ "containerID": 0, "hostID": HOST_ID, "size": 65536 }]);
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": ["/usr/bin/true"],
            "env": ["PATH=/usr/local/bin:/usr/bin:/bin"],
            "cwd": "/",
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
            },
            "rlimits": [{ "type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024 }],
            "noNewPrivileges": true
        },
        "root": { "path": "rootfs", "readonly": true },
        "hostname": "husk-bench",
        "mounts": [
            { "destination": "/usr", "type": "bind", "source": "/usr",
              "options": ["rbind", "ro", "nosuid", "nodev"] },
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "strictatime", "mode=755", "size=65536k"] },
            { "destination": "/dev/pts", "type": "devpts", "source": "devpts",
              "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"] },
            { "destination": "/dev/shm", "type": "tmpfs", "source": "shm",
              "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"] },
            { "destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
              "options": ["nosuid", "noexec", "nodev"] },
            { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
              "options": ["nosuid", "nodev", "mode=1777", "size=1g"] }
        ],
        "linux": {
            "uidMappings": map,
            "gidMappings": map,
            "resources": {
                "devices": [{ "allow": false, "access": "rwm" }],
                "memory": { "limit": memory, "swap": memory },
                "pids": { "limit": 256 },
                "cpu": { "quota": 100000, "period": 100000 }
            },
            "namespaces": [
                { "type": "pid" }, { "type": "network" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "mount" }, { "type": "cgroup" },
                { "type": "user" }
            ],
            "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"],
            "readonlyPaths": [
                "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"
            ]
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_asks_for_husks_namespaces_and_default_limits() {
        let c = config();
        let kinds: Vec<&str> = c["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        for k in ["pid", "network", "ipc", "uts", "mount", "cgroup", "user"] {
            assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
        }
        let r = &c["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 1536 << 20);
        assert_eq!(r["memory"]["swap"], r["memory"]["limit"], "no swap on top");
        assert_eq!(r["pids"]["limit"], 256);
        assert_eq!(r["cpu"]["quota"], r["cpu"]["period"], "one CPU");
        let host = c["linux"]["uidMappings"][0]["hostID"].as_u64().unwrap();
        let slots_end = u64::from(husk_runtime::uidrange::BASE)
            + u64::from(husk_runtime::uidrange::SLOTS) * u64::from(husk_runtime::uidrange::RANGE);
        assert!(
            host >= slots_end,
            "the container's uids overlap husk's slots"
        );
        assert!(host + 65536 < u64::from(u32::MAX));
    }
}
