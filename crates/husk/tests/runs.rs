//! One-shot runs and batches through a real `husk serve` (`/husk/v1/runs`, `/husk/v1/batches`):
//! workspaces mounted read-only unless `rw`, outputs saved with a correct manifest (no symlink
//! followed, quotas enforced), secrets only in the run's process and masked, no sandbox left
//! behind whatever way a run ends, batches in parallel, bad input refused without loss.

mod common;

use std::time::{Duration, Instant};

use common::server::Server;
use common::{wait_for, TempDir, HUSK};
use serde_json::{json, Value};

fn start(tag: &str) -> (TempDir, Server) {
    let state = TempDir::new(tag);
    let server = Server::start(state.path());
    (state, server)
}

/// Posts a run and reads every event to the end.
fn run(server: &Server, key: &str, spec: Value) -> Vec<Value> {
    server.post_events("/husk/v1/runs", key, &spec)
}

fn last(events: &[Value]) -> &Value {
    let end = events.last().expect("events");
    assert_eq!(end["type"], "end", "{events:#?}");
    &end["run"]
}

fn stdout_of(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["data"].as_str().unwrap())
        .collect()
}

fn no_sandbox_left(server: &Server, key: &str) {
    let gone = wait_for(Duration::from_secs(10), || {
        server.sandboxes(key).is_empty().then_some(())
    });
    assert!(
        gone.is_some(),
        "sandboxes left: {:?}",
        server.sandboxes(key)
    );
}

fn workspace(server: &Server, name: &str) {
    let r = server.admin("POST", "/husk/v1/workspaces", json!({ "name": name }));
    assert_eq!(r.status, 201, "{}", r.text());
}

fn upload(server: &Server, ws: &str, path: &str, bytes: &[u8]) {
    let r = server.request(
        "PUT",
        &format!("/husk/v1/workspaces/{ws}/files/{path}"),
        &server.admin_key,
        bytes,
    );
    assert!(r.status / 100 == 2, "{} {}", r.status, r.text());
}

fn download(server: &Server, ws: &str, path: &str) -> (u16, Vec<u8>) {
    let r = server.request(
        "GET",
        &format!("/husk/v1/workspaces/{ws}/files/{path}"),
        &server.admin_key,
        b"",
    );
    (r.status, r.body)
}

fn sha256(bytes: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[test]
fn a_run_streams_its_output_in_order_and_is_recorded() {
    let (_state, server) = start("runs-basic");
    let key = server.admin_key.clone();
    let events = run(
        &server,
        &key,
        json!({"shell": "echo one; echo two >&2; printf 'na\\303\\257ve\\n'; exit 3"}),
    );
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds.first(), Some(&"started"));
    assert_eq!(&kinds[kinds.len() - 2..], &["exited", "end"]);
    assert_eq!(stdout_of(&events), "one\nnaïve\n");
    let exited = &events[events.len() - 2];
    assert_eq!(exited["exit_code"], 3);
    assert_eq!(exited["status"], "failed");
    let rec = last(&events);
    assert_eq!(rec["status"], "failed");
    assert_eq!(rec["reason"], "exit status 3");
    assert_eq!(rec["stderr_tail"], "two\n");
    // The record stays queryable, for this team only.
    let id = rec["id"].as_str().unwrap();
    let got = server.admin("GET", &format!("/husk/v1/runs/{id}"), Value::Null);
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["exit_code"], 3);
    assert!(got.json()["duration_ms"].as_u64().is_some());
    let other = server.key_for("other");
    let hidden = server.request("GET", &format!("/husk/v1/runs/{id}"), &other, b"");
    assert_eq!(hidden.status, 404);
    let list = server.request("GET", "/husk/v1/runs", &other, b"");
    assert_eq!(list.json()["runs"], json!([]));
    // Code with a language, and inline files next to it.
    let events = run(
        &server,
        &key,
        json!({
            "code": "print(open('data/in.txt').read().upper(), end='')",
            "files": [{"path": "data/in.txt", "content": "aGVsbG8=", "encoding": "base64"}],
        }),
    );
    assert_eq!(stdout_of(&events), "HELLO");
    assert_eq!(last(&events)["status"], "succeeded");
    no_sandbox_left(&server, &key);
}

#[test]
fn workspaces_are_read_only_unless_rw_and_outputs_land_with_a_manifest() {
    let (_state, server) = start("runs-ws");
    let key = server.admin_key.clone();
    workspace(&server, "data");
    upload(&server, "data", "in/a.csv", b"x,y\n1,2\n");

    // Read-only by default: reading works, writing is refused by the kernel.
    let events = run(
        &server,
        &key,
        json!({
            "shell": "cat /workspace/data/in/a.csv; stat -c %U /workspace/data/in/a.csv; \
                      touch /workspace/data/new 2>&1 || echo refused",
            "workspaces": [{"name": "data"}],
        }),
    );
    let out = stdout_of(&events);
    assert!(out.starts_with("x,y\n1,2\nuser\n"), "{out}");
    assert!(
        out.contains("Read-only file system") && out.ends_with("refused\n"),
        "{out}"
    );
    assert_eq!(download(&server, "data", "new").0, 404);

    // rw: the write lands in the workspace, owned by the sandbox's user.
    let events = run(
        &server,
        &key,
        json!({
            "shell": "echo written > /mnt/d/new.txt && echo ok",
            "workspaces": [{"name": "data", "path": "/mnt/d", "mode": "rw"}],
        }),
    );
    assert_eq!(stdout_of(&events), "ok\n");
    assert_eq!(
        download(&server, "data", "new.txt"),
        (200, b"written\n".to_vec())
    );

    // Outputs: a tree (with a symlink to a host file, a fifo), a single file, a symlink as an
    // output path, a missing path.
    // 500 000 bytes: `yes 0123456789 | head -c 500000`.
    let big: String = "0123456789\n".repeat(45_455)[..500_000].to_owned();
    let events = run(
        &server,
        &key,
        json!({
            "shell": "mkdir -p out/sub && yes 0123456789 | head -c 500000 > out/big.txt \
                      && echo nested > out/sub/n.txt \
                      && ln -s /etc/passwd out/passwd && mkfifo out/pipe && echo r > result.txt \
                      && ln -s /etc /home/user/etc-link",
            "workspaces": [{"name": "data"}],
            "outputs": ["/home/user/out", "/home/user/result.txt", "/home/user/etc-link", "/nope"],
        }),
    );
    let rec = last(&events);
    assert_eq!(rec["status"], "succeeded", "{rec:#}");
    let id = rec["id"].as_str().unwrap();
    let outputs = &rec["outputs"];
    assert_eq!(outputs["workspace"], "data");
    assert_eq!(outputs["dir"], format!("runs/{id}"));
    let files: Vec<(String, u64, String)> = outputs["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_owned(),
                f["size"].as_u64().unwrap(),
                f["sha256"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expect = |p: &str, content: &[u8]| (p.to_owned(), content.len() as u64, sha256(content));
    assert_eq!(
        files,
        vec![
            expect("out/big.txt", big.as_bytes()),
            expect("out/sub/n.txt", b"nested\n"),
            expect("result.txt", b"r\n"),
        ]
    );
    let skipped: Vec<(&str, &str)> = outputs["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["path"].as_str().unwrap(), s["kind"].as_str().unwrap()))
        .collect();
    assert!(skipped.contains(&("out/passwd", "symlink")), "{skipped:?}");
    assert!(skipped.contains(&("out/pipe", "fifo")), "{skipped:?}");
    assert!(skipped.contains(&("etc-link", "symlink")), "{skipped:?}");
    assert_eq!(outputs["missing"], json!(["/nope"]));
    // The files in the workspace are what the manifest says; the manifest is there too.
    let base = format!("runs/{id}");
    for (path, _, digest) in &files {
        let (status, bytes) = download(&server, "data", &format!("{base}/{path}"));
        assert_eq!(status, 200, "{path}");
        assert_eq!(&sha256(&bytes), digest, "{path}");
    }
    let (status, manifest) = download(&server, "data", &format!("{base}/husk-manifest.json"));
    assert_eq!(status, 200);
    let manifest: Value = serde_json::from_slice(&manifest).unwrap();
    assert_eq!(&manifest, outputs);
    // Nothing was followed: no host file came out through the links.
    assert_eq!(
        download(&server, "data", &format!("{base}/out/passwd")).0,
        404
    );
    assert_eq!(
        download(&server, "data", &format!("{base}/etc-link")).0,
        404
    );
    let tar = server.request(
        "GET",
        &format!("/husk/v1/workspaces/data/tar?path={base}"),
        &key,
        b"",
    );
    assert_eq!(tar.status, 200);
    assert!(!tar.text().contains("root:x:0:0"), "a host file leaked");
    no_sandbox_left(&server, &key);
}

#[test]
fn output_quotas_are_enforced() {
    let (_state, server) = start("runs-quota");
    let key = server.admin_key.clone();
    workspace(&server, "out");
    let events = run(
        &server,
        &key,
        json!({
            "shell": "mkdir o && head -c 5000 /dev/zero > o/a && head -c 5000 /dev/zero > o/b",
            "output_workspace": "out",
            "outputs": ["/home/user/o"],
            "output_limit": {"bytes": 6000},
        }),
    );
    let rec = last(&events);
    assert_eq!(rec["status"], "error", "{rec:#}");
    let err = rec["error"].as_str().unwrap();
    assert!(
        err.contains("saving outputs failed") && err.contains("output limit exceeded"),
        "{err}"
    );
    assert!(events.iter().any(|e| e["type"] == "error"));
    // A file count bound as well.
    let events = run(
        &server,
        &key,
        json!({
            "shell": "mkdir o && for i in 1 2 3 4 5; do echo $i > o/$i; done",
            "output_workspace": "out",
            "outputs": ["/home/user/o"],
            "output_limit": {"files": 3},
        }),
    );
    assert_eq!(last(&events)["status"], "error");
    no_sandbox_left(&server, &key);
}

#[test]
fn secrets_reach_only_the_run_masked_and_other_teams_cannot_use_them() {
    let (state, server) = start("runs-secret");
    let key = server.admin_key.clone();
    let value = "sk-run-3f9a1c77e0b24d6a";
    let mut child = std::process::Command::new(HUSK)
        .args([
            "secret",
            "set",
            "API_KEY",
            "--team",
            "default",
            "--state-dir",
        ])
        .arg(state.path())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(value.as_bytes())
            .unwrap();
    }
    assert!(child.wait().unwrap().success());

    let events = run(
        &server,
        &key,
        json!({
            // The value itself is not in the command (the record shows the command).
            "shell": format!(
                "echo \"key=$API_KEY\"; test \"$(printf %s \"$API_KEY\" | sha256sum)\" = '{digest}  -' \
                 && echo match; \
                 if grep -rsqF \"$API_KEY\" /tmp /home /etc /var 2>/dev/null; then echo on-disk; fi; \
                 if tr '\\0' '\\n' < /proc/1/environ | grep -qF \"$API_KEY\"; then echo in-pid1; fi",
                digest = sha256(value.as_bytes())
            ),
            "secrets": ["API_KEY"],
        }),
    );
    assert_eq!(stdout_of(&events), "key=****\nmatch\n");
    let rec = last(&events);
    assert_eq!(rec["secrets"], json!(["API_KEY"]));
    assert!(!rec.to_string().contains(value));
    // Opting out of masking.
    let events = run(
        &server,
        &key,
        json!({"shell": "echo $API_KEY", "secrets": ["API_KEY"], "redact": false}),
    );
    assert_eq!(stdout_of(&events), format!("{value}\n"));

    // Another team has no such secret; a missing one is a clear error before any sandbox.
    let other = server.key_for("other");
    let body = json!({"shell": "true", "secrets": ["API_KEY"]}).to_string();
    let r = server.request("POST", "/husk/v1/runs", &other, body.as_bytes());
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(
        r.text().contains("secret 'API_KEY' not found"),
        "{}",
        r.text()
    );
    let body = json!({"shell": "true", "env": {"X": "husk-secret://NOPE"}}).to_string();
    let r = server.request("POST", "/husk/v1/runs", &key, body.as_bytes());
    assert_eq!(r.status, 404);
    no_sandbox_left(&server, &key);
    no_sandbox_left(&server, &other);
}

#[test]
fn no_sandbox_is_left_after_a_disconnect_a_timeout_a_crash_or_a_cancel() {
    let (_state, server) = start("runs-end");
    let key = server.admin_key.clone();

    // The client goes away mid-run: the run is cancelled and its sandbox destroyed.
    let mut s = server.stream(
        "POST",
        "/husk/v1/runs",
        &key,
        json!({"shell": "echo up; sleep 60"}).to_string().as_bytes(),
    );
    let first: Value = serde_json::from_str(&s.next_line().unwrap()).unwrap();
    assert_eq!(first["type"], "started");
    let id = first["run_id"].as_str().unwrap().to_owned();
    assert_eq!(server.sandboxes(&key).len(), 1);
    drop(s);
    let ended = wait_for(Duration::from_secs(10), || {
        let r = server.admin("GET", &format!("/husk/v1/runs/{id}"), Value::Null);
        (r.json()["status"] != "running").then(|| r.json())
    })
    .expect("the run ends when its client leaves");
    assert_eq!(ended["status"], "cancelled");
    no_sandbox_left(&server, &key);

    // Timeout.
    let t0 = Instant::now();
    let events = run(&server, &key, json!({"shell": "sleep 60", "timeout": 1}));
    assert!(t0.elapsed() < Duration::from_secs(20));
    let rec = last(&events);
    assert_eq!(rec["status"], "timed_out", "{rec:#}");
    no_sandbox_left(&server, &key);

    // The command crashes; and one runs out of memory.
    let events = run(&server, &key, json!({"shell": "kill -SEGV $$"}));
    let rec = last(&events);
    assert_eq!(rec["status"], "failed");
    assert_eq!(rec["reason"], "signal: segmentation fault");
    let events = run(
        &server,
        &key,
        json!({"code": "a = bytearray(256 << 20)\nprint('survived')", "limits": {"memory_mb": 64, "disk_mb": 8}}),
    );
    let rec = last(&events);
    assert_eq!(rec["status"], "failed", "{rec:#}");
    assert_eq!(rec["reason"], "out of memory");
    no_sandbox_left(&server, &key);

    // A detached run, cancelled by DELETE.
    let r = server.admin(
        "POST",
        "/husk/v1/runs?detach=true",
        json!({"shell": "sleep 60"}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    wait_for(Duration::from_secs(10), || {
        (server.sandboxes(&key).len() == 1).then_some(())
    })
    .expect("the detached run's sandbox");
    let r = server.admin("DELETE", &format!("/husk/v1/runs/{id}"), Value::Null);
    assert_eq!(r.status, 202, "{}", r.text());
    let ended = wait_for(Duration::from_secs(10), || {
        let r = server.admin("GET", &format!("/husk/v1/runs/{id}"), Value::Null);
        (r.json()["status"] != "running").then(|| r.json())
    })
    .expect("cancelled");
    assert_eq!(ended["status"], "cancelled");
    let again = server.admin("DELETE", &format!("/husk/v1/runs/{id}"), Value::Null);
    assert_eq!(again.status, 409);
    no_sandbox_left(&server, &key);
}

fn batch(server: &Server, spec: Value) -> Vec<Value> {
    server.post_events("/husk/v1/batches", &server.admin_key, &spec)
}

#[test]
fn a_failing_item_does_not_stop_the_others() {
    let (_state, server) = start("runs-batch");
    let key = server.admin_key.clone();
    // One item failing does not stop the others; `{}` is the item's argument.
    let events = batch(
        &server,
        json!({
            "run": {"shell": "test {} != bad && echo item-{}"},
            "items": [{"args": ["a"]}, {"args": ["bad"]}, {"args": ["c"]}],
            "parallel": 2,
        }),
    );
    let b = &events.last().unwrap()["batch"];
    assert_eq!(b["succeeded"], 2, "{b:#}");
    assert_eq!(b["failed"], 1);
    assert_eq!(b["items"][1]["status"], "failed");
    assert_eq!(b["items"][1]["exit_code"], 1);
    let id = b["id"].as_str().unwrap();
    let runs = server.admin("GET", &format!("/husk/v1/batches/{id}/runs"), Value::Null);
    let mut tails: Vec<String> = runs.json()["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["stdout_tail"].as_str().unwrap().to_owned())
        .collect();
    tails.sort();
    assert_eq!(tails, vec!["", "item-a\n", "item-c\n"]);
    no_sandbox_left(&server, &key);
}

#[test]
fn cancelling_a_batch_destroys_its_sandboxes() {
    let (_state, server) = start("runs-batch-cancel");
    let key = server.admin_key.clone();
    let r = server.admin(
        "POST",
        "/husk/v1/batches?detach=true",
        json!({"run": {"shell": "sleep 60"}, "items": [{}, {}, {}, {}], "parallel": 2}),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_owned();
    wait_for(Duration::from_secs(10), || {
        (server.sandboxes(&key).len() == 2).then_some(())
    })
    .expect("two items running");
    let r = server.admin("DELETE", &format!("/husk/v1/batches/{id}"), Value::Null);
    assert_eq!(r.status, 202, "{}", r.text());
    let b = wait_for(Duration::from_secs(15), || {
        let r = server.admin("GET", &format!("/husk/v1/batches/{id}"), Value::Null);
        (r.json()["status"] != "running").then(|| r.json())
    })
    .expect("the batch ends");
    assert_eq!(b["status"], "cancelled");
    assert_eq!(b["cancelled"], 4, "{b:#}");
    no_sandbox_left(&server, &key);
}

#[test]
fn bad_input_gets_clear_errors_and_loses_nothing() {
    let (_state, server) = start("runs-bad");
    let key = server.admin_key.clone();
    workspace(&server, "data");
    let cases = [
        (json!({}), 400, "exactly one of command"),
        (
            json!({"command": ["true"], "colour": "red"}),
            400,
            "unknown field `colour`",
        ),
        (
            json!({"command": ["true"], "workspaces": [{"name": "nope"}]}),
            404,
            "workspace 'nope' not found",
        ),
        (
            json!({"command": ["true"], "workspaces": [{"name": "data", "path": "/proc/x"}]}),
            400,
            "/proc",
        ),
        (
            json!({"command": ["true"], "workspaces": [{"name": "../data"}]}),
            400,
            "invalid",
        ),
        (
            json!({"command": ["true"], "outputs": ["/a/../../etc"], "output_workspace": "data"}),
            400,
            "..",
        ),
        (
            json!({"command": ["true"], "outputs": ["/a"]}),
            400,
            "need a workspace",
        ),
        (
            json!({"command": ["true"], "files": [{"path": "a\u{0}b", "content": ""}]}),
            400,
            "invalid file path",
        ),
        (
            json!({"command": ["true"], "template": "no-such-template"}),
            404,
            "no-such-template",
        ),
        (
            json!({"command": ["true"], "limits": {"memory_mb": 1_000_000}}),
            400,
            "more than this server allows",
        ),
        (
            json!({"run": {"command": ["true"]}, "items": []}),
            400,
            "unknown field",
        ),
    ];
    for (spec, status, text) in &cases {
        let r = server.request("POST", "/husk/v1/runs", &key, spec.to_string().as_bytes());
        assert_eq!(r.status, *status, "{spec}: {}", r.text());
        assert!(
            r.json()["message"].as_str().unwrap().contains(text),
            "{spec}: {}",
            r.text()
        );
    }
    let r = server.admin(
        "POST",
        "/husk/v1/batches",
        json!({"run": {"command": ["true"]}, "items": []}),
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("at least one item"), "{}", r.text());
    let r = server.admin(
        "POST",
        "/husk/v1/batches",
        json!({"run": {"command": ["true"]}, "items": [{}, {"files": [{"path": "x", "content": "!", "encoding": "base64"}]}]}),
    );
    assert_eq!(r.status, 400);
    assert!(r.text().contains("item 1"), "{}", r.text());
    // Oversize: inline files over their bound, and a body over the request bound.
    let big = "A".repeat(9 << 20);
    let spec = json!({"command": ["true"], "files": [{"path": "x", "content": big}]});
    let r = server.request("POST", "/husk/v1/runs", &key, spec.to_string().as_bytes());
    assert_eq!(r.status, 413, "{}", r.text());
    let huge = vec![b' '; 17 << 20];
    let r = server.request("POST", "/husk/v1/runs", &key, &huge);
    assert_eq!(r.status, 413);
    assert!(r.text().contains("workspace"), "{}", r.text());
    // Nothing was recorded or left running, and the server still works.
    assert_eq!(
        server.admin("GET", "/husk/v1/runs", Value::Null).json()["runs"],
        json!([])
    );
    let events = run(&server, &key, json!({"command": ["echo", "fine"]}));
    assert_eq!(stdout_of(&events), "fine\n");
    no_sandbox_left(&server, &key);
}
