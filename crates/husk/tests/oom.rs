//! A full disk and the OOM killer in server sandboxes (issue 15, L1 and M3): a full disk is
//! ENOSPC and 507, never an OOM kill; an OOM kills the process that ran out, not the agent; and
//! in the kernel's order of victims sandbox processes come first, then agents, husk last.

mod common;

use std::fs;
use std::time::Duration;

use common::sandbox::{Ran, Sandbox};
use common::server::Server;
use common::{sandbox_pids, wait_for, TempDir};
use husk_runtime::cgroup::CgroupLayout;
use husk_runtime::oom;
use serde_json::json;

fn create(server: &Server) -> Sandbox<'_> {
    Sandbox::create(server, &server.admin_key, json!({"templateID": "base"}))
}

fn sh(sb: &Sandbox<'_>, script: &str) -> Ran {
    sb.run(None, "/bin/sh", &["-c", script], &[])
}

/// The runtime id of the server's only sandbox.
fn runtime_id(state: &TempDir) -> String {
    let records = husk_core::store::Store::open(state.path())
        .unwrap()
        .list_sandboxes()
        .unwrap();
    assert_eq!(records.len(), 1);
    records[0].runtime_id.clone()
}

/// The sandbox's memory cgroup limits, read on the host: v1's limit and memory+swap limit
/// (where swap is accounted), or v2's `memory.max`.
fn memory_limits(runtime_id: &str) -> Vec<u64> {
    let layout = CgroupLayout::discover().unwrap();
    let name = husk_runtime::spawner::cgroup_name(common::slot_of(runtime_id));
    let mut out = Vec::new();
    for dir in layout.handle(&name).paths() {
        for file in [
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            "memory.max",
        ] {
            if let Ok(v) = fs::read_to_string(dir.join(file)) {
                out.push(v.trim().parse().unwrap());
            }
        }
    }
    assert!(!out.is_empty(), "no memory cgroup for {runtime_id}");
    out
}

/// The host pid of the sandbox's PID 1 (the agent).
fn agent_pid(runtime_id: &str) -> i32 {
    wait_for(Duration::from_secs(10), || {
        sandbox_pids(runtime_id).into_iter().find_map(|(pid, _)| {
            let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let nspid = status.lines().find(|l| l.starts_with("NSpid:"))?;
            (nspid.split_whitespace().last() == Some("1")).then_some(pid)
        })
    })
    .expect("the sandbox's PID 1")
}

fn parent_of(pid: i32) -> i32 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Whether husk (started by this test, with its capabilities) may lower an `oom_score_adj`:
/// that takes CAP_SYS_RESOURCE, which some hosts' root lacks (in a container, or a VM that
/// drops it from the bounding set, as this project's development machines do).
fn can_lower_oom_score_adj() -> bool {
    const CAP_SYS_RESOURCE: u32 = 24;
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap();
    eff & (1 << CAP_SYS_RESOURCE) != 0
}

fn upload(server: &Server, sb: &Sandbox<'_>, path: &str, body: &[u8]) -> u16 {
    let headers = sb.headers(None, "application/octet-stream");
    let pairs = common::sandbox::pairs(&headers);
    server
        .request_with("POST", &format!("/files?path={path}"), &pairs, body)
        .status
}

/// Issue 15, L1, through the E2B API with the server's defaults (512 MiB of memory, a 1 GiB
/// disk held in RAM): filling the disk used to take the agent's memory, the OOM killer took
/// the agent and the sandbox ended. Now the disk ends in ENOSPC and 507, and the sandbox lives.
#[test]
fn a_full_disk_is_507_and_the_sandbox_goes_on() {
    let state = TempDir::new("oom-disk");
    let server = Server::start(state.path());
    let sb = create(&server);
    let id = runtime_id(&state);
    // The cgroup holds the processes' 512 MiB and the 1 GiB disk, /dev and /dev/shm included
    // (v1 also its memory+swap limit: the same figure).
    for limit in memory_limits(&id) {
        assert_eq!(limit, (512 << 20) + (1 << 30));
    }
    // The API still reports the memory the processes were given.
    let info = server
        .request("GET", &format!("/sandboxes/{}", sb.id), &sb.key, "")
        .expect(200)
        .json();
    assert_eq!(info["memoryMB"], 512, "{info}");

    // More than the disk holds: a command sees ENOSPC.
    let fill = sh(
        &sb,
        "head -c 1200M /dev/zero > /home/user/fill; echo rc=$?; du -m /home/user/fill",
    );
    assert!(fill.stderr.contains("No space left on device"), "{fill:?}");
    assert!(fill.stdout.starts_with("rc=1\n"), "{fill:?}");
    let mib: u64 = fill
        .stdout
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1000..=1024).contains(&mib), "{fill:?}");

    // The files API answers 507 on the full disk.
    assert_eq!(
        upload(&server, &sb, "/home/user/more", &[7u8; 64 << 10]),
        507
    );
    // And the sandbox goes on: commands, memory for its processes, and the disk once freed.
    let alive = sh(
        &sb,
        "python3 -c 'a = bytearray(400 << 20); print(len(a) >> 20)'; rm /home/user/fill; echo alive",
    );
    assert_eq!(alive.stdout, "400\nalive\n", "{alive:?}");
    assert_eq!(
        upload(&server, &sb, "/home/user/more", &[7u8; 64 << 10]),
        200
    );
    let back = server.request_with(
        "GET",
        "/files?path=/home/user/more",
        &[("E2b-Sandbox-Id", &sb.id), ("X-Access-Token", &sb.token)],
        b"",
    );
    assert_eq!(back.expect(200).body.len(), 64 << 10);
}

/// The order of the OOM killer's victims: the server and its spawner last (-999), agents before
/// them (-900), sandbox processes first (0): commands, `sudo`'s, and what they start.
#[test]
fn the_oom_killer_takes_processes_then_agents_then_husk() {
    let state = TempDir::new("oom-order");
    let mut server = Server::start(state.path());
    let server_pid = server.child().id() as i32;
    let sb = create(&server);
    let id = runtime_id(&state);
    let agent = agent_pid(&id);
    let spawner = parent_of(agent);
    assert_eq!(parent_of(spawner), server_pid);

    // What a sandbox's processes get, whatever PID 1 got: the default.
    let own = sh(
        &sb,
        "cat /proc/self/oom_score_adj; sudo cat /proc/self/oom_score_adj; \
         sh -c 'cat /proc/self/oom_score_adj'",
    );
    assert_eq!(own.stdout, "0\n0\n0\n", "{own:?}");

    let lowered = can_lower_oom_score_adj();
    let expect = |protected: i32| if lowered { protected } else { 0 };
    if !lowered {
        eprintln!(
            "no CAP_SYS_RESOURCE here: husk cannot lower oom_score_adj (it warns and goes on); \
             checking that nothing else changes"
        );
    }
    let value = |pid: i32| oom::get(Some(pid)).unwrap();
    assert_eq!(value(server_pid), expect(oom::SERVER), "husk serve");
    assert_eq!(value(spawner), expect(oom::SERVER), "the spawner");
    assert_eq!(value(agent), expect(oom::SANDBOX_INIT), "the agent");
    let pid1 = sh(&sb, "cat /proc/1/oom_score_adj");
    assert_eq!(
        pid1.stdout.trim(),
        expect(oom::SANDBOX_INIT).to_string(),
        "{pid1:?}"
    );

    // A process may lower itself back to PID 1's value (the kernel's `oom_score_adj_min` is
    // inherited), never below it, as user or as root.
    let floor = expect(oom::SANDBOX_INIT);
    for user in ["user", "root"] {
        let r = sb.run(
            Some(user),
            "/bin/sh",
            &[
                "-c",
                &format!(
                    "echo {floor} > /proc/self/oom_score_adj && echo ok; \
                     echo {} > /proc/self/oom_score_adj 2>/dev/null || echo refused",
                    floor - 1
                ),
            ],
            &[],
        );
        assert_eq!(r.stdout, "ok\nrefused\n", "{user}: {r:?}");
    }
}

/// An OOM inside a server sandbox kills the process that ran out of memory (137), and the
/// agent, which holds the sandbox, goes on.
#[test]
fn an_oom_kills_the_process_and_the_agent_goes_on() {
    let state = TempDir::new("oom-kill");
    let server = Server::start_with(state.path(), &["--memory", "64M", "--disk", "16M"]);
    let sb = create(&server);
    let id = runtime_id(&state);
    for limit in memory_limits(&id) {
        assert_eq!(limit, (64 << 20) + (16 << 20));
    }
    let agent = agent_pid(&id);
    // 512 MiB is past the processes' 64 MiB and the files' 16 MiB together.
    let r = sh(
        &sb,
        "python3 -c 'a = bytearray(512 << 20); print(\"survived\")'; echo rc=$?",
    );
    assert_eq!(r.stdout, "rc=137\n", "{r:?}");
    let again = sh(&sb, "echo alive");
    assert_eq!(again.stdout, "alive\n", "{again:?}");
    assert_eq!(agent_pid(&id), agent, "the agent was replaced");
}
