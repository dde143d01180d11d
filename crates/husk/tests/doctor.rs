//! `husk doctor` on this host kind (root, kernel 6.18, hybrid cgroups, Landlock ABI 7,
//! file-backed erofs, nftables and iproute2 installed): a complete report that says ok for
//! what the host has, exit code 0, and nothing left behind. As an unprivileged user: root is
//! missing, the checks that need it are skipped, and `husk run` points to the doctor.

mod common;
use common::*;

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

/// Every check the report must have.
const CHECKS: &[&str] = &[
    "kernel",
    "root",
    "systemd",
    "cgroup.mode",
    "cgroup.controllers",
    "cgroup.kill",
    "clone_into_cgroup",
    "namespace.user",
    "namespace.pid",
    "namespace.net",
    "namespace.mnt",
    "namespace.ipc",
    "namespace.uts",
    "namespace.cgroup",
    "namespace.time",
    "fs.tmpfs",
    "fs.overlay",
    "fs.overlay_userns",
    "fs.erofs",
    "fs.loop",
    "idmap.erofs",
    "idmap.tmpfs",
    "idmap.state_dir",
    "overlay.idmapped_lower",
    "pidfd",
    "seccomp",
    "seccomp.user_notif",
    "landlock",
    "state_dir",
    "memory",
    "net.ip",
    "net.nft",
    "net.veth",
    "net.nftables",
];

fn doctor_json(state_dir: &std::path::Path, as_nobody: bool) -> (i32, serde_json::Value) {
    let mut cmd = Command::new(HUSK);
    cmd.args(["doctor", "--json", "--state-dir"])
        .arg(state_dir)
        .stdin(Stdio::null());
    if as_nobody {
        cmd.uid(65534).gid(65534);
    }
    let out = cmd.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

fn check<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {report:#}"))
}

#[test]
fn this_host_passes_every_check_and_nothing_is_left() {
    let dir = TempDir::new("doctor");
    let state = dir.path().join("state");
    let v2 = std::path::Path::new("/sys/fs/cgroup/unified");
    let probe_cgroups = || {
        std::fs::read_dir(v2)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with("husk-probe"))
                    .count()
            })
            .unwrap_or(0)
    };
    let (code, report) = doctor_json(&state, false);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["usable"], true);
    let names: Vec<&str> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, CHECKS, "the report's checks changed");
    for name in CHECKS {
        let c = check(&report, name);
        assert_eq!(c["status"], "ok", "{name} on this host: {c:#}");
        assert!(!c["detail"].as_str().unwrap().is_empty(), "{c:#}");
    }
    assert!(check(&report, "cgroup.mode")["detail"]
        .as_str()
        .unwrap()
        .starts_with("hybrid"));
    assert!(check(&report, "fs.erofs")["detail"]
        .as_str()
        .unwrap()
        .contains("file-backed"));
    let landlock = check(&report, "landlock")["detail"].as_str().unwrap();
    let abi: i32 = landlock
        .strip_prefix("ABI ")
        .and_then(|s| s.split(':').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{landlock}"));
    assert!(abi >= 7, "{landlock}");
    let ms = report["elapsed_ms"].as_f64().unwrap();
    assert!(ms < 1000.0, "probing took {ms} ms");
    // The probes' mounts lived in a namespace of their own; the image was an unnamed file;
    // the cgroup and the network namespace were removed.
    assert!(
        loop_devices_beneath(dir.path()).is_empty(),
        "a loop device stayed"
    );
    assert!(
        husk_runtime::mountinfo::mounts_beneath(dir.path()).is_empty(),
        "a mount stayed"
    );
    assert_eq!(probe_cgroups(), 0, "a probe cgroup stayed");
    assert!(!state.exists(), "the doctor created the state directory");
}

#[test]
fn the_text_report_has_one_line_per_check_and_a_verdict() {
    let dir = TempDir::new("doctor-text");
    let out = husk(&["doctor", "--state-dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    for name in CHECKS {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().nth(1) == Some(name)),
            "no line for {name}:\n{text}"
        );
    }
    assert!(
        text.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("husk can run on this host (34 ok, 0 warnings, 0 missing, 0 skipped"),
        "{text}"
    );
}

#[test]
fn an_unprivileged_user_is_told_root_is_missing_and_run_points_to_the_doctor() {
    let dir = TempDir::new("doctor-nobody");
    let (code, report) = doctor_json(&dir.path().join("state"), true);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["usable"], false);
    let root = check(&report, "root");
    assert_eq!(root["status"], "missing");
    assert!(root["detail"]
        .as_str()
        .unwrap()
        .starts_with("not root: husk needs root"));
    for name in [
        "fs.overlay",
        "fs.erofs",
        "idmap.erofs",
        "net.veth",
        "net.nftables",
    ] {
        let c = check(&report, name);
        assert_eq!(c["status"], "skipped", "{c:#}");
        assert!(
            c["detail"].as_str().unwrap().contains("needs root"),
            "{c:#}"
        );
    }
    // What needs no root is still told.
    for name in ["kernel", "landlock", "seccomp", "pidfd", "namespace.user"] {
        assert_eq!(check(&report, name)["status"], "ok", "{name}");
    }

    let out = Command::new(HUSK)
        .args(["run", "--", "true"])
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(err.contains("must run as root"), "{err}");
    assert!(
        err.contains("run `husk doctor` for what this host lacks"),
        "{err}"
    );
}
