//! End to end: a running sandbox given what a create would have given it
//! (`SpawnerService::assign`, what a claimed warm sandbox gets): host mounts (read-only and
//! writable, id-mapped, on mount points made inside its root), lower limits (its cgroups, the
//! size of its writable layer) and its hostname; and what is refused: limits below what the
//! sandbox already uses, a mount source outside the server's confinement, a mount point
//! through a symlink, an unknown sandbox. The sandbox's root can neither unmount nor remount
//! what was mounted, and nothing is mounted on the host. And a create whose reply's descriptors
//! the server has no room for fails with `OutOfDescriptors`, its sandbox destroyed again.
//!
//! Needs root (it creates sandboxes) and `nsenter` (util-linux), which looks from inside the
//! sandbox's namespaces as its user would. It has its own `main` (`harness = false`): the
//! spawner is forked before any thread exists. What it leaves is destroyed when it ends, also
//! when it fails.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use husk_core::agent::AgentClient;
use husk_proto::{Reply, Request, StartProc};
use husk_runtime::cgroup::CgroupOptions;
use husk_runtime::confine::Confinement;
use husk_runtime::failure::FailureKind;
use husk_runtime::service::{self, ServiceError, SpawnerService};
use husk_runtime::{Assignment, Limits, MountIds, MountSpec};

#[path = "support/kept.rs"]
mod kept;
use kept::{alive, hello_with, kept_spec, wait_gone, Cleanup};

/// A directory removed when the test ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The children of process `pid` (a spawner's: its sandboxes' PID 1s).
fn children(pid: i32) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .expect("children")
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A create whose reply's descriptors this process has no room for fails with
/// `OutOfDescriptors`, and the sandbox it made is destroyed again (not left in the spawner).
fn lost_descriptors(service: &SpawnerService) {
    let spawner = service.pid();
    let before = children(spawner);
    // The lowest free descriptor number: with the limit there, no new one can be made.
    let lowest = std::fs::File::open("/dev/null").expect("/dev/null");
    let free = std::os::fd::AsRawFd::as_raw_fd(&lowest) as u64;
    drop(lowest);
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid rlimit pointers; lowering the soft limit needs no privilege.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        let no_room = libc::rlimit {
            rlim_cur: free,
            rlim_max: lim.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &no_room), 0);
    }
    let got = service.create(&kept_spec());
    // SAFETY: as above, back to what it was.
    unsafe { assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0) };
    assert!(
        matches!(got, Err(ServiceError::OutOfDescriptors)),
        "{:?}",
        got.map(|c| c.id)
    );
    assert_eq!(children(spawner), before, "the sandbox made was left");
}

/// Runs `script` with `sh` inside the sandbox whose PID 1 is `pid`: in all its namespaces,
/// under its root, as its uid `uid`. Returns (exit code, stdout + stderr).
fn inside(pid: i32, uid: u32, script: &str) -> (i32, String) {
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-a", "-r", "-w"])
        .args(["-S", &uid.to_string(), "-G", &uid.to_string()])
        .args(["/bin/sh", "-c", script])
        .output()
        .expect("nsenter");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

fn refused(got: Result<(), ServiceError>, why: &str) {
    match got {
        Err(ServiceError::Failed(f)) => {
            assert_eq!(f.kind, FailureKind::InvalidSpec, "{f:?}");
            assert!(f.message.contains(why), "{why:?} not in {:?}", f.message);
        }
        other => panic!("not refused ({why}): {other:?}"),
    }
}

fn mount(host: &Path, at: &str, writable: bool) -> MountSpec {
    MountSpec {
        host: host.to_path_buf(),
        sandbox: at.into(),
        writable,
        ids: MountIds::Shared,
    }
}

fn main() {
    let pid = std::process::id();
    let owner = format!("/husk-assign-test/{pid}");
    let _cleanup = Cleanup(owner.clone());
    let dir = TempDir(std::env::temp_dir().join(format!("husk-assign-test-{pid}")));
    let roots = dir.0.join("workspaces");
    let ws = roots.join("team/w");
    std::fs::create_dir_all(&ws).expect("workspace dir");
    std::fs::write(ws.join("data.txt"), "hello\n").expect("a workspace file");
    for p in [&ws, &ws.join("data.txt")] {
        std::os::unix::fs::chown(p, Some(1000), Some(1000)).expect("chown");
    }
    let confinement = Confinement {
        mount_roots: vec![roots.clone()],
        ..Confinement::default()
    };
    let service = service::start_owned(
        husk_agent::main,
        CgroupOptions::default(),
        Some(confinement),
        Some(owner),
    )
    .expect("start a spawner (needs root)");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(cases(&service, &ws));
    lost_descriptors(&service);
    service.shutdown().expect("stop the spawner");
    drop(rt);
    println!("assign end to end: ok");
}

async fn cases(service: &SpawnerService, ws: &Path) {
    let c = service.create(&kept_spec()).expect("create");
    let (id, pid) = (c.id.clone(), c.init_pid);
    let agent = AgentClient::connect(c.agent, hello_with(Vec::new()))
        .await
        .expect("hello");
    let made_with = Limits::default();
    assert_eq!(inside(pid, 1000, "ls /work").0, 2, "no /work yet");

    // Lower limits, two mounts of the workspace (one on a path that does not exist yet), a
    // name.
    let limits = Limits {
        memory_bytes: 256 << 20,
        cpu_millis: 500,
        pids: 64,
        disk_bytes: 64 << 20,
    };
    assert!(limits.disk_bytes < made_with.disk_bytes && limits.pids < made_with.pids);
    let given = Assignment {
        hostname: "claimed-a".into(),
        limits: Some(limits.clone()),
        mounts: vec![
            mount(ws, "/work/ro", false),
            mount(ws, "/home/user/rw", true),
        ],
    };
    service.assign(&id, &given).expect("assign");

    // The mounts, as the sandbox's user sees them: its files, read-only or writable.
    let (code, out) = inside(
        pid,
        1000,
        "cat /work/ro/data.txt; stat -c %u /work/ro/data.txt; \
         touch /work/ro/new 2>/dev/null && echo wrote || echo read-only; \
         echo out > /home/user/rw/out.txt && echo written",
    );
    assert_eq!(
        (code, out.as_str()),
        (0, "hello\n1000\nread-only\nwritten\n")
    );
    let written = std::fs::metadata(ws.join("out.txt")).expect("written through the mount");
    assert_eq!((written.uid(), written.gid()), (1000, 1000));
    assert!(!ws.join("new").exists());
    // The sandbox's root can neither unmount it nor make it writable.
    let (code, _) = inside(pid, 0, "umount /work/ro");
    assert_ne!(code, 0, "the sandbox's root unmounted a given mount");
    let (code, _) = inside(pid, 0, "mount -o remount,bind,rw /work/ro");
    assert_ne!(code, 0, "the sandbox's root remounted a given mount");
    assert_eq!(
        inside(pid, 0, "touch /work/ro/new 2>/dev/null || echo read-only").1,
        "read-only\n"
    );
    // Nothing of it on the host.
    let host_mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!host_mounts.contains(ws.to_str().expect("utf-8")));

    // The name, the layer's size and the cgroups' limits.
    let out = Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-u", "hostname"])
        .output()
        .expect("nsenter");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "claimed-a");
    assert_eq!(
        inside(pid, 1000, "df -B1 --output=size / | tail -n 1")
            .1
            .trim(),
        limits.disk_bytes.to_string()
    );
    let read = |file: &str| {
        c.cgroup.paths().iter().find_map(|d| {
            std::fs::read_to_string(d.join(file))
                .ok()
                .map(|s| s.trim().to_string())
        })
    };
    assert_eq!(read("pids.max").as_deref(), Some("64"));
    let memory = (limits.memory_bytes + limits.disk_bytes).to_string();
    let memory_max = read("memory.max").or_else(|| read("memory.limit_in_bytes"));
    assert_eq!(memory_max.as_deref(), Some(memory.as_str()));
    let cpu = read("cpu.max").or_else(|| read("cpu.cfs_quota_us"));
    assert!(
        cpu.as_deref()
            .is_some_and(|c| c == "50000 100000" || c == "50000"),
        "{cpu:?}"
    );

    // Refused: limits below what it uses (files, tasks), a source outside the confinement, a
    // mount point through a symlink, over the root, an unknown sandbox.
    let mut again = given.clone();
    again.mounts.clear();
    let (code, out) = inside(pid, 1000, "head -c 3145728 /dev/zero > /tmp/big && echo ok");
    assert_eq!((code, out.as_str()), (0, "ok\n"));
    again.limits = Some(Limits {
        disk_bytes: 1 << 20,
        ..limits.clone()
    });
    refused(service.assign(&id, &again), "files take more");
    // PID 1 (the agent) and two processes it started: three tasks.
    for _ in 0..2 {
        let p = StartProc::new("/bin/sh", vec!["-c".into(), "sleep 1000".into()]);
        match agent.call(Request::Start(p)).await.expect("start") {
            Reply::Started { .. } => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    again.limits = Some(Limits {
        pids: 3,
        ..limits.clone()
    });
    refused(service.assign(&id, &again), "tasks");
    again.limits = None;
    again.mounts = vec![mount(Path::new("/etc"), "/hostetc", false)];
    refused(
        service.assign(&id, &again),
        "outside what this server may use",
    );
    let (code, _) = inside(pid, 1000, "ln -s /etc /home/user/link");
    assert_eq!(code, 0);
    again.mounts = vec![mount(ws, "/home/user/link/x", false)];
    refused(service.assign(&id, &again), "mount point");
    again.mounts = vec![mount(ws, "/", false)];
    assert!(service.assign(&id, &again).is_err());
    assert_eq!(inside(pid, 1000, "ls /hostetc /etc/x 2>/dev/null").0, 2);
    match service.assign("s999999-000000000000", &given) {
        Err(ServiceError::Failed(f)) => assert_eq!(f.kind, FailureKind::NotFound),
        other => panic!("an unknown sandbox: {other:?}"),
    }
    // It still runs, with what it was given.
    assert!(alive(pid));
    assert_eq!(inside(pid, 1000, "cat /work/ro/data.txt").1, "hello\n");

    service.destroy(&id).expect("destroy");
    assert!(wait_gone(pid, Duration::from_secs(5)));
    // The workspace keeps what was written.
    assert_eq!(
        std::fs::read_to_string(ws.join("out.txt")).expect("kept"),
        "out\n"
    );
}
