//! The per-team workspace quota through a real `husk serve --workspace-quota 64M` (issue 15
//! M4): a sandbox filling a read-write workspace gets ENOSPC and lives on; the API answers 507
//! naming the quota; another team writes on; deleting gives the room back; a restart on the
//! same state directory keeps the quota (the mounts are adopted, not stacked); with
//! `--workspace-quota 0` nothing is mounted; a host that cannot mount falls back to plain
//! directories with one warning. Each test unmounts what the server left mounted (by design)
//! and checks that no mount and no loop device is left.

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::sandbox::Sandbox;
use common::server::{Reply, Server};
use common::{loop_devices_beneath, wait_for, TempDir, HUSK};
use husk_runtime::mountinfo::{mounts_beneath, unmount_beneath};
use serde_json::json;

const WS: &str = "/husk/v1/workspaces";
const MIB: u64 = 1 << 20;

fn create(server: &Server, key: &str, name: &str) {
    server
        .request("POST", WS, key, json!({ "name": name }).to_string())
        .expect(201);
}

fn upload(server: &Server, key: &str, ws: &str, path: &str, body: &[u8]) -> Reply {
    server.request_with(
        "PUT",
        &format!("{WS}/{ws}/files/{path}"),
        &[("X-API-KEY", key)],
        body,
    )
}

fn team_dir(state: &TempDir, team: &str) -> PathBuf {
    state.path().join("workspaces").join(team)
}

/// Unmounts what the servers left mounted and checks that nothing of it is left: no mount
/// beneath the state directory, no loop device backed by a file in it.
fn unmount_and_check(state: &Path) {
    unmount_beneath(state);
    wait_for(Duration::from_secs(10), || {
        (mounts_beneath(state).is_empty() && loop_devices_beneath(state).is_empty()).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "left behind: mounts {:?}, loop devices {:?}",
            mounts_beneath(state),
            loop_devices_beneath(state)
        )
    });
}

/// Fills `path` in 1 MiB writes until one fails; prints the errno and how many went in.
const FILL: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o644)
n = 0
try:
    while True:
        os.write(fd, bytes(1 << 20))
        n += 1
except OSError as e:
    print("errno", e.errno, e.strerror, "after", n)
"#;

#[test]
fn a_full_team_gets_enospc_in_sandboxes_and_507_over_the_api_and_others_write_on() {
    let state = TempDir::new("ws-quota");
    let server = Server::start_with(state.path(), &["--workspace-quota", "64M"]);
    server.wait_line("workspace quota: 64 MiB per team");
    let key = server.admin_key.clone();
    let other = server.key_for("other");
    create(&server, &key, "big");
    create(&server, &other, "data");
    let mine = team_dir(&state, "default");
    let theirs = team_dir(&state, "other");
    let mut mounted = mounts_beneath(state.path());
    mounted.sort();
    assert_eq!(mounted, [mine.clone(), theirs.clone()]);

    let sb = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "volumeMounts": [{"name": "big:rw", "path": "/mnt/big"}]}),
    );
    // What took 3 GiB of the host's disk in a second before.
    let r = sb.run(None, "fallocate", &["-l", "200M", "/mnt/big/huge"], &[]);
    assert_ne!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("No space left on device"), "{r:?}");
    // (What it allocated before it failed stays the file's.)
    let r = sb.run(None, "rm", &["/mnt/big/huge"], &[]);
    assert_eq!(r.code, 0, "{r:?}");
    // Plain writes, until the file system is full.
    let r = sb.run(None, "python3", &["-c", FILL, "/mnt/big/fill"], &[]);
    assert_eq!(r.code, 0, "{r:?}");
    let n: u64 = r
        .stdout
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{r:?}"));
    assert!(r.stdout.starts_with("errno 28 "), "{r:?}");
    assert!((40..64).contains(&n), "{n} MiB went into a 64 MiB quota");
    // The sandbox lives on.
    let r = sb.run(None, "echo", &["alive"], &[]);
    assert_eq!((r.code, r.stdout.as_str()), (0, "alive\n"), "{r:?}");
    // The host's disk holds no more than the quota for it.
    let image = state.path().join("workspace-images/default.ext4");
    assert!(fs::metadata(&image).unwrap().blocks() * 512 <= 64 * MIB);

    // The API: 507, naming the quota; nothing left of the upload.
    upload(&server, &key, "big", "more", &vec![7u8; 4 << 20]).error(507, "64 MiB");
    let list = server.request("GET", WS, &key, "").expect(200).json();
    assert_eq!(list["quota_bytes"], 64 * MIB, "{list}");
    assert!(list["used_bytes"].as_u64().unwrap() > 60 * MIB, "{list}");
    // Another team's workspaces are another file system.
    upload(&server, &other, "data", "f", &vec![1u8; 8 << 20]).expect(201);
    let theirs_list = server.request("GET", WS, &other, "").expect(200).json();
    assert!(
        theirs_list["used_bytes"].as_u64().unwrap() < 32 * MIB,
        "{theirs_list}"
    );

    // Deleting gives the room back.
    server
        .request("DELETE", &format!("{WS}/big/files/fill"), &key, "")
        .expect(204);
    upload(&server, &key, "big", "more", &vec![7u8; 8 << 20]).expect(201);
    let r = sb.run(
        None,
        "sh",
        &["-c", "head -c 4M /dev/zero > /mnt/big/x && echo ok"],
        &[],
    );
    assert_eq!(r.stdout, "ok\n", "{r:?}");
    drop(sb);

    // A restart keeps the quota: the file systems it left mounted are adopted, not stacked.
    drop(server);
    let mut left = mounts_beneath(state.path());
    left.sort();
    assert_eq!(
        left,
        [mine.clone(), theirs.clone()],
        "mounts kept for the next start"
    );
    let server = Server::start_with(state.path(), &["--workspace-quota", "64M"]);
    server.wait_line("workspace quota: 64 MiB per team");
    let mut again = mounts_beneath(state.path());
    again.sort();
    assert_eq!(again, [mine, theirs]);
    let sb = Sandbox::create(
        &server,
        &key,
        json!({"templateID": "base", "volumeMounts": [{"name": "big:rw", "path": "/mnt/big"}]}),
    );
    let r = sb.run(None, "fallocate", &["-l", "100M", "/mnt/big/huge2"], &[]);
    assert!(r.stderr.contains("No space left on device"), "{r:?}");
    assert_eq!(
        fs::read(state.path().join("workspaces/default/big/more"))
            .unwrap()
            .len(),
        8 << 20
    );
    // (What the failed fallocate allocated fills the rest.)
    upload(&server, &key, "big", "huge3", &vec![0u8; 4 << 20]).error(507, "64 MiB");
    let list = server.request("GET", WS, &key, "").expect(200).json();
    assert_eq!(list["quota_bytes"], 64 * MIB, "{list}");
    drop(sb);
    drop(server);
    unmount_and_check(state.path());
}

#[test]
fn run_outputs_past_the_quota_say_so() {
    let state = TempDir::new("ws-quota-runs");
    let server = Server::start_with(state.path(), &["--workspace-quota", "16M"]);
    let key = server.admin_key.clone();
    create(&server, &key, "out");
    let events = server.post_events(
        "/husk/v1/runs",
        &key,
        &json!({
            "shell": "mkdir o && head -c 40M /dev/zero > o/big",
            "output_workspace": "out",
            "outputs": ["/home/user/o"],
        }),
    );
    let end = events.last().expect("events");
    assert_eq!(end["type"], "end", "{events:#?}");
    let rec = &end["run"];
    assert_eq!(rec["status"], "error", "{rec:#}");
    let err = rec["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("saving outputs failed") && err.contains("are full") && err.contains("16 MiB"),
        "{err}"
    );
    drop(server);
    unmount_and_check(state.path());
}

#[test]
fn without_a_quota_nothing_is_mounted() {
    let state = TempDir::new("ws-quota-off");
    let server = Server::start_with(state.path(), &["--workspace-quota", "0"]);
    server.wait_line("workspace quota: none");
    let key = server.admin_key.clone();
    create(&server, &key, "data");
    upload(&server, &key, "data", "f", &vec![1u8; 1 << 20]).expect(201);
    assert!(mounts_beneath(state.path()).is_empty());
    assert!(!state.path().join("workspace-images/default.ext4").exists());
    let list = server.request("GET", WS, &key, "").expect(200).json();
    assert!(list.get("quota_bytes").is_none(), "{list}");
    drop(server);
    unmount_and_check(state.path());
}

/// Runs its arguments in a mount namespace of their own where `/dev/loop-control` and every
/// loop device are `/dev/null`: a host (or container) without loop devices.
const NO_LOOP: [&str; 6] = ["unshare", "-m", "--propagation", "private", "sh", "-c"];
const NO_LOOP_SCRIPT: &str = "for d in /dev/loop-control /dev/loop[0-9]*; do \
     mount --bind /dev/null $d || exit 1; done; exec \"$@\"";

#[test]
fn a_host_that_cannot_mount_falls_back_to_plain_directories_with_one_warning() {
    let state = TempDir::new("ws-quota-noloop");
    let mut wrapper: Vec<&str> = NO_LOOP.to_vec();
    wrapper.extend([NO_LOOP_SCRIPT, "sh"]);

    // The server starts, warns once (its files helper, while it starts), and workspaces work
    // (unbounded).
    let server = Server::start_wrapped(&wrapper, state.path(), &["--workspace-quota", "64M"]);
    let warnings: Vec<&String> = server
        .startup
        .iter()
        .filter(|l| l.contains("NOT enforced"))
        .collect();
    assert_eq!(warnings.len(), 1, "{:#?}", server.startup);
    assert!(warnings[0].contains("64 MiB"), "{}", warnings[0]);
    server.wait_line("workspace quota: 64 MiB per team NOT enforced");
    let key = server.admin_key.clone();
    create(&server, &key, "data");
    upload(&server, &key, "data", "f", &vec![1u8; 1 << 20]).expect(201);
    drop(server);
    assert!(mounts_beneath(state.path()).is_empty());
    assert!(!state.path().join("workspace-images/default.ext4").exists());

    // So do the command-line tools.
    let out = std::process::Command::new(wrapper[0])
        .args(&wrapper[1..])
        .arg(HUSK)
        .args(["workspace", "create", "more", "--team", "acme"])
        .args(["--workspace-quota", "64M", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("NOT enforced").count(), 1, "{stderr}");
    assert!(team_dir(&state, "acme").join("more").is_dir());
    assert!(mounts_beneath(state.path()).is_empty());
    unmount_and_check(state.path());
}
