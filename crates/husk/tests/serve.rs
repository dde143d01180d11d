//! `husk serve` as an operator runs it: first start, an orderly stop (SIGTERM) and a crash
//! (SIGKILL) followed by a restart, checked from the host: no process, cgroup, uid slot,
//! registry entry or mount of any of its sandboxes may survive.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::server::Server;
use common::{
    assert_gone, sandbox_pids, server_helpers, signal_pid, signal_process, wait_for, TempDir, HUSK,
};

fn create(server: &Server, key: &str) {
    let r = server.request("POST", "/v2/sandboxes", key, r#"{"templateID":"base"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
}

/// The runtime ids of the sandboxes the server has recorded.
fn runtime_ids(state: &TempDir) -> Vec<String> {
    husk_core::store::Store::open(state.path())
        .unwrap()
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .map(|r| r.runtime_id)
        .collect()
}

/// SIGTERM, then the server's own word that it stopped, and a zero exit.
fn stop_in_order(server: &mut Server) {
    signal_process(server.child(), "TERM");
    server.wait_line("husk: stopped");
    let status = wait_for(Duration::from_secs(30), || {
        server.child().try_wait().unwrap()
    })
    .expect("husk serve did not exit after SIGTERM");
    assert!(status.success(), "{status}");
}

#[test]
fn serve_recovers_from_a_crash_and_stops_cleanly() {
    let state = TempDir::new("serve");
    let server = Server::start(state.path());
    let key_file = state.path().join("admin.key");
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_string();
    assert_eq!(
        server
            .request("GET", "/v2/sandboxes", "e2b_wrong", "")
            .status,
        401
    );
    create(&server, &key);
    create(&server, &key);
    let crashed = runtime_ids(&state);
    assert_eq!(crashed.len(), 2);
    for id in &crashed {
        assert!(!sandbox_pids(id).is_empty(), "sandbox {id} has no process");
    }

    // A crash: the spawner and every sandbox's PID 1 die with the server (parent-death
    // signals); what they leave on the host is cleaned up at the next start.
    server.kill_hard();
    for id in &crashed {
        wait_for(Duration::from_secs(10), || {
            sandbox_pids(id).is_empty().then_some(())
        })
        .unwrap_or_else(|| panic!("processes of {id} outlived the server"));
    }
    let mut server = Server::start(state.path());
    for id in &crashed {
        assert_gone(id);
    }
    assert!(
        runtime_ids(&state).is_empty(),
        "records of crashed sandboxes kept"
    );

    // An orderly stop destroys everything before the server exits.
    create(&server, &key);
    let live = runtime_ids(&state);
    assert_eq!(live.len(), 1);
    stop_in_order(&mut server);
    assert_gone(&live[0]);
    assert!(runtime_ids(&state).is_empty());
}

#[test]
fn secrets_api_stores_lists_and_removes_without_ever_returning_a_value() {
    let state = TempDir::new("serve-secrets");
    let server = Server::start(state.path());
    let admin = server.admin_key.clone();
    let other = server.key_for("other");
    const VALUE: &str = "sk-http-9f8e7d6c5b4a-never-returned";
    assert_eq!(
        server
            .request("PUT", "/husk/v1/secrets/API_KEY", &admin, VALUE)
            .status,
        204
    );
    let r = server.request("GET", "/husk/v1/secrets", &admin, "");
    let body = r.text();
    assert_eq!(r.status, 200, "{body}");
    assert!(
        body.contains("\"API_KEY\"") && !body.contains(VALUE),
        "{body}"
    );
    // Another team: not listed, not removable.
    let body = server.request("GET", "/husk/v1/secrets", &other, "").text();
    assert!(!body.contains("API_KEY"), "{body}");
    assert_eq!(
        server
            .request("DELETE", "/husk/v1/secrets/API_KEY", &other, "")
            .status,
        404
    );
    // Bad input: clear errors, nothing stored.
    let r = server.request("PUT", "/husk/v1/secrets/bad%20name", &admin, "v");
    let body = r.text();
    assert_eq!(r.status, 400, "{body}");
    assert!(body.contains("invalid secret name"), "{body}");
    let big = "x".repeat(64 * 1024 + 1);
    assert_eq!(
        server
            .request("PUT", "/husk/v1/secrets/BIG", &admin, &big)
            .status,
        413
    );
    assert_eq!(
        server
            .request("PUT", "/husk/v1/secrets/EMPTY", &admin, "")
            .status,
        400
    );
    assert_eq!(
        server
            .request("GET", "/husk/v1/secrets", "e2b_bogus", "")
            .status,
        401
    );
    // The CLI sees what the API stored (one database, one master key).
    let out = Command::new(HUSK)
        .args(["secret", "list", "--team", "default", "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("API_KEY") && !listed.contains("BIG"),
        "{listed}"
    );
    // Nothing in the state directory holds the value in clear.
    for e in std::fs::read_dir(state.path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            let bytes = std::fs::read(&p).unwrap();
            assert!(
                !bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
                "{} holds the secret in clear",
                p.display()
            );
        }
    }
    assert_eq!(
        server
            .request("DELETE", "/husk/v1/secrets/API_KEY", &admin, "")
            .status,
        204
    );
    assert_eq!(
        server
            .request("DELETE", "/husk/v1/secrets/API_KEY", &admin, "")
            .status,
        404
    );
}

/// The database and the master key are held by the state helper, the router and sockets in
/// sandboxes' namespaces by the network helper: the server's own process has neither file
/// open. When a helper dies, the server stops and says why (a service manager restarts it),
/// rather than answering every request with an error.
#[test]
fn the_server_holds_no_state_files_and_stops_when_a_helper_dies() {
    let open_files = |pid: u32| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|p| p.display().to_string())
            .collect()
    };
    for (victim, label) in [
        ("husk-state", "state"),
        ("husk-files", "files"),
        ("husk-build", "build"),
    ] {
        let state = TempDir::new("helpers");
        let mut server = Server::start(state.path());
        let key = server.key_for("helpers");
        create(&server, &key);
        let found = server_helpers(server.child().id());
        let names: Vec<&str> = found.iter().map(|(n, _)| n.as_str()).collect();
        for helper in ["husk-state", "husk-net", "husk-files", "husk-build"] {
            assert!(names.contains(&helper), "{helper}: {found:?}");
        }
        let state_dir = state.path().display().to_string();
        let workspaces = state.path().join("workspaces").display().to_string();
        let server_files = open_files(server.child().id());
        assert!(
            !server_files.iter().any(|f| f.ends_with("husk.db")
                || f.ends_with("master.key")
                || f.contains("husk.db-")
                || f.starts_with(&workspaces)),
            "the server holds state files: {server_files:?}"
        );
        let pid_of = |name: &str| found.iter().find(|(n, _)| n == name).unwrap().1;
        assert!(
            open_files(pid_of("husk-state"))
                .iter()
                .any(|f| f.starts_with(&state_dir) && f.ends_with("husk.db")),
            "the state helper does not hold the database"
        );
        assert!(
            open_files(pid_of("husk-files")).contains(&workspaces),
            "the files helper does not hold the workspaces"
        );
        // A helper dies: the server says which and stops, not zero.
        signal_pid(pid_of(victim), "KILL");
        server.wait_line(&format!("husk: the {label} helper"));
        let status = wait_for(Duration::from_secs(30), || {
            server.child().try_wait().unwrap()
        })
        .expect("husk serve did not exit after a helper died");
        assert!(!status.success(), "{victim}: {status}");
    }
}

/// A field of /proc/<pid>/status.
fn status_field(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default()
}

#[test]
fn the_server_runs_unprivileged_under_its_fences() {
    let state = TempDir::new("unprivileged");
    let mut server = Server::start(state.path());
    let said = server
        .startup
        .iter()
        .find(|l| l.contains("the server runs as"))
        .cloned()
        .unwrap_or_else(|| panic!("no line about the drop in {:#?}", server.startup));
    assert!(
        said.contains("nobody (uid 65534") && said.contains("no capabilities"),
        "{said}"
    );
    let pid = server.child().id();
    assert_eq!(status_field(pid, "Uid"), "65534\t65534\t65534\t65534");
    assert_eq!(status_field(pid, "Gid"), "65534\t65534\t65534\t65534");
    for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, set), "0000000000000000", "{set}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");
    // Every thread (the runtime's, started after the drop) is the same.
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap();
        assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
        assert!(status.contains("Seccomp:\t2"), "{status}");
    }
    // Its helpers keep root, and do the work: a sandbox, a command in it, a workspace file.
    for (name, helper) in server_helpers(pid) {
        assert_eq!(status_field(helper, "Uid"), "0\t0\t0\t0", "{name}");
        // The state helper needs no privilege once the database and the key are open.
        if name == "husk-state" {
            assert_eq!(status_field(helper, "CapEff"), "0000000000000000", "{name}");
            assert_eq!(status_field(helper, "CapBnd"), "0000000000000000", "{name}");
            assert_eq!(status_field(helper, "Seccomp"), "2", "{name}");
        }
    }
    let key = server.admin_key.clone();
    let r = server.request("POST", "/v2/sandboxes", &key, r#"{"templateID":"base"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = server.request("POST", "/husk/v1/workspaces", &key, r#"{"name":"w"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = server.request("PUT", "/husk/v1/workspaces/w/files/a.txt", &key, "hello");
    assert_eq!(r.status, 201, "{}", r.text());
    let r = server.request("GET", "/husk/v1/workspaces/w/files/a.txt", &key, "");
    assert_eq!((r.status, r.text().as_str()), (200, "hello"));
    drop(server);

    // A port taken by another listener: said, and the helpers already started are stopped in
    // order (none is left behind).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(HUSK)
        .args(["serve", "--egress", "off", "--listen", &addr, "--state-dir"])
        .arg(state.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("listen on {addr}")), "{stderr}");
    // (Helpers whose channels closed end on their own: polled, bounded.)
    let left = || {
        let out = Command::new("pgrep")
            .args(["-f", &state.path().display().to_string()])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    };
    let gone = wait_for(Duration::from_secs(10), || left().is_empty().then_some(()));
    assert!(gone.is_some(), "processes left: {}", left());
    drop(taken);

    // Root is not a user to drop to, and a user that does not exist is said to be missing:
    // the server does not start.
    for (user, says) in [
        ("root", "unprivileged user"),
        ("0:5", "unprivileged user"),
        ("ghost-user", "no user"),
    ] {
        let out = serve_command(state.path())
            .args(["--server-user", user])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{user}: {stderr}");
        assert!(stderr.contains(says), "{user}: {stderr}");
    }
}

/// The runtime id of the sandbox recorded as `id`.
fn runtime_id_of(state: &TempDir, id: &str) -> String {
    husk_core::store::Store::open(state.path())
        .unwrap()
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .find(|r| r.id == id)
        .unwrap_or_else(|| panic!("no record of {id}"))
        .runtime_id
}

/// The server's spawner: its child that is none of the named helpers.
fn spawner_of(server_pid: u32) -> u32 {
    let helpers: Vec<u32> = server_helpers(server_pid)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let children =
        std::fs::read_to_string(format!("/proc/{server_pid}/task/{server_pid}/children")).unwrap();
    let spawners: Vec<u32> = children
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|p| !helpers.contains(p))
        .collect();
    assert_eq!(
        spawners.len(),
        1,
        "children {children}, helpers {helpers:?}"
    );
    spawners[0]
}

/// `husk serve` on `state`, on a free loopback port, without egress (a command to add to).
fn serve_command(state: &std::path::Path) -> Command {
    let mut cmd = Command::new(HUSK);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--egress",
        "off",
        "--state-dir",
    ])
    .arg(state);
    cmd
}

/// What `husk serve` on `state` printed and how it ended, killed if it still ran after 30 s.
fn second_server_on(state: &std::path::Path) -> std::process::Output {
    let mut child = serve_command(state)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    if wait_for(Duration::from_secs(30), || child.try_wait().unwrap()).is_none() {
        let _ = child.kill();
    }
    child.wait_with_output().unwrap()
}

/// Sandboxes outlive their server (`husk serve` by default): an orderly stop, a crash of the
/// server and a crash of its spawner leave their processes running, and the next server takes
/// them up (same id, credentials, processes, files), and so does another binary (an upgrade).
/// One whose deadline passes while no server runs ends by its own backstop and is forgotten,
/// not lost. A second server on the same state directory refuses to start while the first
/// runs. The last server (`--destroy-on-exit`) takes everything with it: nothing of any
/// sandbox remains.
#[test]
fn sandboxes_outlive_stops_and_crashes_of_their_server() {
    use common::sandbox::Sandbox;
    let state = TempDir::new("serve-keep");
    let mut server = Server::start_keeping(state.path(), &[]);
    let key = server.admin_key.clone();
    let (id, token, sleeper) = {
        let sb = Sandbox::create(
            &server,
            &key,
            serde_json::json!({"templateID": "base", "timeout": 600}),
        );
        let pid = sb.spawn("/bin/sleep", &["1000"], &[]);
        let ran = sb.run(None, "/bin/sh", &["-c", "echo kept > /home/user/f"], &[]);
        assert_eq!(ran.code, 0, "{}", ran.output);
        let out = (sb.id.clone(), sb.token.clone(), pid);
        std::mem::forget(sb);
        out
    };
    let rid = runtime_id_of(&state, &id);
    // The same sandbox, as a handle of `server`'s.
    let check = |server: &Server| {
        let sb = Sandbox {
            server,
            key: key.clone(),
            id: id.clone(),
            token: token.clone(),
            created: serde_json::Value::Null,
        };
        let info = server.request("GET", &format!("/sandboxes/{id}"), &key, "");
        assert_eq!(info.status, 200, "{}", info.text());
        let ran = sb.run(
            None,
            "/bin/sh",
            &["-c", "cat /home/user/f; pgrep -x sleep"],
            &[],
        );
        assert_eq!(ran.stdout, format!("kept\n{sleeper}\n"), "{}", ran.output);
        std::mem::forget(sb);
    };
    let alive = |what: &str| {
        assert!(
            !sandbox_pids(&rid).is_empty(),
            "{what}: the sandbox's processes are gone"
        );
    };

    // A second server on the same state directory stops at start, names the first, and
    // changes nothing: the sandbox is still the first's, and its record is not reported lost
    // (the next server takes it up, below).
    let second = second_server_on(state.path());
    assert_eq!(second.status.code(), Some(1), "{second:?}");
    let said = String::from_utf8_lossy(&second.stderr);
    let first = server.child().id();
    assert!(
        said.contains(&format!("is in use by another husk server (pid {first})")),
        "{said}"
    );
    check(&server);

    // An orderly stop.
    stop_in_order(&mut server);
    alive("after a stop");
    let server = Server::start_keeping(state.path(), &[]);
    check(&server);

    // A crash of the server.
    server.kill_hard();
    alive("after a crash");
    let mut server = Server::start_keeping(state.path(), &[]);
    check(&server);

    // A crash of its spawner: the server stops, not zero, and the sandbox runs on.
    let spawner = spawner_of(server.child().id());
    signal_pid(spawner, "KILL");
    let status = wait_for(Duration::from_secs(30), || {
        server.child().try_wait().unwrap()
    })
    .expect("husk serve did not exit after its spawner died");
    assert!(!status.success(), "{status}");
    alive("after a crash of the spawner");
    let server = Server::start_keeping(state.path(), &[]);
    check(&server);

    // A short-lived sandbox whose deadline passes while no server runs: its PID 1 ends it.
    let short = {
        let r = server.request(
            "POST",
            "/sandboxes",
            &key,
            r#"{"templateID":"base","timeout":2}"#,
        );
        assert_eq!(r.status, 201, "{}", r.text());
        r.json()["sandboxID"].as_str().unwrap().to_owned()
    };
    let short_rid = runtime_id_of(&state, &short);
    server.kill_hard();
    wait_for(Duration::from_secs(15), || {
        sandbox_pids(&short_rid).is_empty().then_some(())
    })
    .expect("the backstop did not end the sandbox at its deadline");
    alive("beside the one that timed out");

    // The last server is another binary (a copy, as an upgrade installs a new file): it takes
    // the first up and destroys it as it stops; the other is forgotten (it ended at its
    // timeout) and its leftovers reaped.
    let bin = TempDir::new("serve-keep-bin");
    let copy = bin.path().join("husk-upgraded");
    std::fs::copy(HUSK, &copy).unwrap();
    let script = format!("shift; exec {} \"$@\"", copy.display());
    let server = Server::start_wrapped(&["/bin/sh", "-c", &script, "sh"], state.path(), &[]);
    check(&server);
    assert_gone(&short_rid);
    let lost = server.request("GET", "/v2/sandboxes?state=lost", &key, "");
    assert_eq!(lost.status, 200, "{}", lost.text());
    assert!(!lost.text().contains(&short), "{}", lost.text());
    let gone = server.request("GET", &format!("/sandboxes/{short}"), &key, "");
    assert_eq!(gone.status, 404, "{}", gone.text());
    drop(server);
    assert_gone(&rid);
    assert!(runtime_ids(&state).is_empty());
}
