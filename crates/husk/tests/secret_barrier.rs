//! A secret given to one command stays with that command, through a real `husk serve` and its
//! in-sandbox API (Connect-JSON, as the E2B SDKs speak it): another command of the same sandbox
//! cannot read it from `/proc/PID/environ` (as the user, as root, through `sudo`), while the
//! command itself can and `kill` across commands still works; the process list shows the
//! `husk-secret://` reference, never the value; PID 1's environment does not hold it.

mod common;

use std::time::Duration;

use common::sandbox::{pairs, Sandbox};
use common::server::{Reply, Server};
use common::{sandbox_pids, wait_for, TempDir};
use serde_json::json;

const SECRET: &str = "BARRIER_KEY";
const VALUE: &str = "sk-barrier-5e1d7c0a9b-not-for-siblings";
/// `sh -c script` and `List` for this test.
impl Sandbox<'_> {
    fn sh(&self, user: Option<&str>, script: &str) -> (i64, String) {
        let ran = self.run(user, "/bin/sh", &["-c", script], &[]);
        (ran.code, ran.output)
    }

    fn list(&self) -> Reply {
        self.server
            .request_with(
                "POST",
                "/process.Process/List",
                &pairs(&self.headers(None, "application/json")),
                b"{}",
            )
            .expect(200)
    }
}

/// Host pid of the process with pid `ns_pid` in the sandbox with runtime id `runtime_id`.
fn host_pid(runtime_id: &str, ns_pid: u32) -> Option<i32> {
    sandbox_pids(runtime_id).into_iter().find_map(|(pid, _)| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let nspid = status.lines().find(|l| l.starts_with("NSpid:"))?;
        (nspid.split_whitespace().last()? == ns_pid.to_string()).then_some(pid)
    })
}

#[test]
fn a_commands_secret_is_out_of_reach_of_the_other_commands() {
    let state = TempDir::new("secret-barrier");
    let server = Server::start(state.path());
    let key = server.admin_key.clone();
    server
        .request("PUT", &format!("/husk/v1/secrets/{SECRET}"), &key, VALUE)
        .expect(204);
    let sb = Sandbox::create(
        &server,
        &key,
        json!({
            "templateID": "base",
            "envVars": {"FROM_SANDBOX": format!("husk-secret://{SECRET}")},
        }),
    );
    let runtime_id = husk_core::store::Store::open(state.path())
        .unwrap()
        .list_sandboxes()
        .unwrap()
        .into_iter()
        .map(|r| r.runtime_id)
        .next()
        .expect("no sandbox record");

    // Command A holds the secret (its own env and the sandbox's reference).
    let reference = format!("husk-secret://{SECRET}");
    let a = sb.spawn("/bin/sleep", &["60"], &[("S", &reference)]);
    // From the host: A's environment does hold the value (so the checks below mean
    // something); PID 1's (the agent's) does not.
    let a_host = wait_for(Duration::from_secs(10), || host_pid(&runtime_id, a))
        .expect("command A not found on the host");
    let a_env = std::fs::read(format!("/proc/{a_host}/environ")).unwrap();
    let a_env = String::from_utf8_lossy(&a_env);
    assert!(
        a_env.contains(&format!("S={VALUE}\0")),
        "A's environment: {a_env:?}"
    );
    assert!(
        a_env.contains(&format!("FROM_SANDBOX={VALUE}\0")),
        "{a_env:?}"
    );
    let pid1 = host_pid(&runtime_id, 1).expect("no PID 1 on the host");
    let pid1_env = std::fs::read(format!("/proc/{pid1}/environ")).unwrap();
    assert!(
        !String::from_utf8_lossy(&pid1_env).contains(VALUE),
        "the agent's environment holds the secret"
    );

    // The process list shows the reference, never the value.
    let list = sb.list();
    assert!(
        !list.text().contains(VALUE),
        "List returns the secret: {}",
        list.text()
    );
    let listed = list.json()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"].as_u64() == Some(u64::from(a)))
        .cloned()
        .unwrap_or_else(|| panic!("A ({a}) not listed: {}", list.text()));
    assert_eq!(
        listed["config"]["envs"],
        json!({ "S": reference }),
        "{listed}"
    );

    // Command B cannot read A's environment: as the user, as root, through sudo. Nor PID 1's.
    let environ = format!("/proc/{a}/environ");
    for (who, user, cmd) in [
        ("user", None, format!("cat {environ}")),
        ("root", Some("root"), format!("cat {environ}")),
        ("sudo", None, format!("sudo cat {environ}")),
        ("user, mem", None, format!("head -c1 /proc/{a}/mem")),
        ("root, maps", Some("root"), format!("cat /proc/{a}/maps")),
        (
            "root, fds",
            Some("root"),
            format!("readlink -v /proc/{a}/fd/1"),
        ),
        ("root, fd", Some("root"), format!("cat /proc/{a}/fd/0")),
        (
            "root, PID 1",
            Some("root"),
            "cat /proc/1/environ".to_string(),
        ),
    ] {
        let (code, output) = sb.sh(user, &cmd);
        assert_ne!(code, 0, "{who}: `{cmd}` succeeded: {output}");
        assert!(output.contains("Permission denied"), "{who}: {output}");
        assert!(!output.contains(VALUE), "{who}: {output}");
    }

    // A command reads its own environment (and its children's): same command, same domain.
    let script = format!(
        "grep -qzx 'S={VALUE}' /proc/$$/environ && grep -qzx 'S={VALUE}' /proc/self/environ"
    );
    let ran = sb.run(None, "/bin/sh", &["-c", &script], &[("S", &reference)]);
    let (code, output) = (ran.code, ran.output);
    assert_eq!(
        code, 0,
        "a command cannot read its own environment: {output}"
    );

    // Signals still cross commands: B kills A.
    let (code, output) = sb.sh(None, &format!("kill {a}"));
    assert_eq!(code, 0, "kill from another command failed: {output}");
    wait_for(Duration::from_secs(10), || {
        let list = sb.list().json();
        // An empty list has no `processes` at all (proto3 JSON).
        let running = list["processes"]
            .as_array()
            .is_some_and(|l| l.iter().any(|p| p["pid"].as_u64() == Some(u64::from(a))));
        (!running).then_some(())
    })
    .expect("A still runs after kill");

    drop(sb);
    server
        .request("DELETE", &format!("/husk/v1/secrets/{SECRET}"), &key, "")
        .expect(204);
    wait_for(Duration::from_secs(10), || {
        sandbox_pids(&runtime_id).is_empty().then_some(())
    })
    .expect("the sandbox's processes outlived it");
}
