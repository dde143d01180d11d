//! `husk run --server` and `husk batch` against a real `husk serve`: the command's output and
//! exit code come back as from a local run, timeouts and Ctrl-C leave no sandbox on the
//! server, secrets arrive masked, batches fan out over local files and report each item, and
//! outputs saved into a workspace can be read back (over HTTP and from a local run that mounts
//! the workspace).

mod common;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::Server;
use common::{signal_process, wait_for, TempDir, HUSK};

/// What a CLI process did.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `husk ARGS` with the server's admin key in the environment (and nothing else of the
/// caller's husk or E2B settings), in `cwd`.
fn cli(server: &Server, args: &[&str], cwd: Option<&Path>) -> Command {
    let mut c = Command::new(HUSK);
    c.args(args)
        .env_remove("HUSK_SERVER")
        .env_remove("E2B_API_KEY")
        .env("HUSK_API_KEY", &server.admin_key)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    c
}

/// Reads a child's output to its end, killing it if it runs past `limit`.
fn finish(mut child: Child, limit: Duration) -> Out {
    let start = Instant::now();
    let so = child.stdout.take();
    let mut se = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut so) = so {
            let _ = so.read_to_string(&mut s);
        }
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let status = wait_for(limit, || child.try_wait().unwrap());
    let status = match status {
        Some(s) => s,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "husk did not exit within {limit:?}; stderr so far: {}",
                t_err.join().unwrap()
            );
        }
    };
    Out {
        code: status.code().unwrap_or(-1),
        stdout: t_out.join().unwrap(),
        stderr: t_err.join().unwrap(),
        elapsed: start.elapsed(),
    }
}

fn husk(server: &Server, args: &[&str], cwd: Option<&Path>) -> Out {
    finish(
        cli(server, args, cwd).spawn().unwrap(),
        Duration::from_secs(120),
    )
}

/// `husk run --server URL FLAGS -- CMD`.
fn run(server: &Server, flags: &[&str], cmd: &[&str]) -> Out {
    let url = server.url();
    let mut args = vec!["run", "--server", &url];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(cmd);
    husk(server, &args, None)
}

/// The newest run record of the admin's team.
fn last_run(server: &Server) -> serde_json::Value {
    let r = server.admin("GET", "/husk/v1/runs?limit=1", serde_json::Value::Null);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["runs"][0].clone()
}

fn assert_no_sandboxes(server: &Server) {
    let left = wait_for(Duration::from_secs(10), || {
        let s = server.sandboxes(&server.admin_key);
        s.is_empty().then_some(())
    });
    assert!(
        left.is_some(),
        "sandboxes left on the server: {:?}",
        server.sandboxes(&server.admin_key)
    );
}

#[test]
fn run_on_a_server_streams_output_and_keeps_exit_codes() {
    let state = TempDir::new("run-server");
    let server = Server::start(state.path());

    let out = run(
        &server,
        &[],
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
    );
    assert_eq!(out.code, 3, "{out:?}");
    assert_eq!(out.stdout, "out\n", "{out:?}");
    assert_eq!(out.stderr, "err\n", "{out:?}");
    let rec = last_run(&server);
    assert_eq!(rec["status"], "failed");
    assert_eq!(rec["exit_code"], 3);

    // Flags map onto the spec: env, workdir, user, limits.
    let out = run(
        &server,
        &[
            "-e",
            "GREETING=hi there",
            "-w",
            "/tmp",
            "-u",
            "root",
            "--memory",
            "256M",
        ],
        &["sh", "-c", "echo \"$GREETING\"; pwd; id -u"],
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "hi there\n/tmp\n0\n", "{out:?}");
    let rec = last_run(&server);
    assert_eq!(rec["status"], "succeeded");

    // As a local run: 127 for a command that is not there.
    let out = run(&server, &[], &["no-such-command-here"]);
    assert_eq!(out.code, 127, "{out:?}");
    assert!(out.stderr.contains("command not found"), "{out:?}");
    // Killed by a signal: 128+n, named.
    let out = run(&server, &[], &["sh", "-c", "kill -SEGV $$"]);
    assert_eq!(out.code, 128 + 11, "{out:?}");
    assert!(out.stderr.contains("SIGSEGV"), "{out:?}");

    // Local-only flags are refused with a reason; husk's own errors are 125.
    let out = run(&server, &["-t"], &["true"]);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(
        out.stderr.contains("--tty is not supported with --server"),
        "{out:?}"
    );
    let out = run(&server, &["--copy", "/etc/hostname:/tmp/h"], &["true"]);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.stderr.contains("--file"), "{out:?}");
    let out = run(&server, &["--secret", "NOT_THERE"], &["true"]);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(
        out.stderr.contains("secret 'NOT_THERE' not found"),
        "{out:?}"
    );
    // A bad key: the server's message, and where the key comes from.
    let out = finish(
        cli(
            &server,
            &["run", "--server", &server.url(), "--", "true"],
            None,
        )
        .env(
            "HUSK_API_KEY",
            "e2b_0000000000000000000000000000000000000000",
        )
        .spawn()
        .unwrap(),
        Duration::from_secs(60),
    );
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.stderr.contains("HUSK_API_KEY"), "{out:?}");
    // No key in the environment: the state directory's admin key.
    let out = finish(
        cli(
            &server,
            &["run", "--server", &server.url(), "--state-dir"],
            None,
        )
        .arg(state.path())
        .args(["--", "echo", "from-admin-key"])
        .env_remove("HUSK_API_KEY")
        .spawn()
        .unwrap(),
        Duration::from_secs(60),
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "from-admin-key\n");
    // Server-only flags without --server: a clear error, no sandbox.
    let out = husk(&server, &["run", "--secret", "X", "--", "true"], None);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.stderr.contains("--secret needs --server"), "{out:?}");
    assert_no_sandboxes(&server);
}

#[test]
fn a_timeout_is_124_and_leaves_no_sandbox() {
    let state = TempDir::new("run-server-timeout");
    let server = Server::start(state.path());
    let out = run(&server, &["--timeout", "1s"], &["sleep", "30"]);
    assert_eq!(out.code, 124, "{out:?}");
    assert!(
        out.stderr.contains("husk: killed: timeout after 1s"),
        "{out:?}"
    );
    assert!(out.elapsed < Duration::from_secs(20), "{:?}", out.elapsed);
    assert_eq!(last_run(&server)["status"], "timed_out");
    assert!(server.sandboxes(&server.admin_key).is_empty());
}

#[test]
fn a_secret_reaches_the_command_and_is_masked() {
    let state = TempDir::new("run-server-secret");
    let server = Server::start(state.path());
    const VALUE: &str = "sk-run-server-7c1d9e2f4a-never-shown";
    let mut set = Command::new(HUSK)
        .args(["secret", "set", "TOKEN", "--team", "default", "--state-dir"])
        .arg(state.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        set.stdin
            .take()
            .unwrap()
            .write_all(VALUE.as_bytes())
            .unwrap();
    }
    let set = finish(set, Duration::from_secs(30));
    assert_eq!(set.code, 0, "{set:?}");

    let script = format!("echo \"token=$TOKEN\"; [ \"$TOKEN\" = {VALUE} ] && echo same");
    let out = run(&server, &["--secret", "TOKEN"], &["sh", "-c", &script]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "token=****\nsame\n", "{out:?}");
    assert!(!out.stderr.contains(VALUE));
    assert_eq!(last_run(&server)["secrets"], serde_json::json!(["TOKEN"]));
}

#[test]
fn ctrl_c_cancels_the_run_on_the_server() {
    let state = TempDir::new("run-server-cancel");
    let server = Server::start(state.path());
    let url = server.url();
    let mut child = cli(
        &server,
        &[
            "run",
            "--server",
            &url,
            "--",
            "sh",
            "-c",
            "echo started; sleep 60",
        ],
        None,
    )
    .spawn()
    .unwrap();
    // Signalled once the command is known to run: its first line came back.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            let _ = tx.send(line.clone());
            lines.push(line);
        }
        lines
    });
    let first = rx.recv_timeout(Duration::from_secs(60));
    if first.is_err() {
        let _ = child.kill();
    }
    assert_eq!(first.as_deref(), Ok("started"));
    assert_eq!(server.sandboxes(&server.admin_key).len(), 1);
    signal_process(&child, "INT");
    let out = finish(child, Duration::from_secs(30));
    assert_eq!(out.code, 130, "{out:?}");
    assert_eq!(reader.join().unwrap(), vec!["started".to_string()]);
    assert!(out.elapsed < Duration::from_secs(20), "{:?}", out.elapsed);
    assert_eq!(last_run(&server)["status"], "cancelled");
    assert_no_sandboxes(&server);
}

/// Writes `n` files `dir/fK.txt` of K+1 bytes (K from 0) under `base`.
fn inputs(base: &Path, n: usize) {
    std::fs::create_dir_all(base.join("dir")).unwrap();
    for k in 0..n {
        std::fs::write(base.join(format!("dir/f{k}.txt")), "x".repeat(k + 1)).unwrap();
    }
    // Not matched by the pattern.
    std::fs::write(base.join("dir/other.csv"), "nope").unwrap();
}

#[test]
fn a_batch_runs_every_local_file_and_summarises() {
    let state = TempDir::new("batch");
    let server = Server::start(state.path());
    let work = TempDir::new("batch-work");
    inputs(work.path(), 5);
    let url = server.url();
    let out = husk(
        &server,
        &[
            "batch",
            "--server",
            &url,
            "--parallel",
            "3",
            "--input",
            "dir/*.txt",
            "--",
            "sh",
            "-c",
            "wc -c < {}",
        ],
        Some(work.path()),
    );
    assert_eq!(out.code, 0, "{out:?}");
    for k in 0..5 {
        let row = out
            .stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&format!("dir/f{k}.txt")))
            .unwrap_or_else(|| panic!("no row for f{k}: {out:?}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[2], "ok", "{row}");
        assert_eq!(cols[3], "0", "{row}");
        assert!(cols.last().unwrap().starts_with("run_"), "{row}");
    }
    assert!(!out.stdout.contains("other.csv"), "{out:?}");
    assert!(
        out.stdout
            .contains("5 items: 5 ok, 0 failed, 0 timed out (wall "),
        "{out:?}"
    );
    // Without a terminal: one progress line per finished item.
    assert_eq!(
        out.stderr
            .lines()
            .filter(|l| l.contains(": ok (exit 0"))
            .count(),
        5,
        "{out:?}"
    );
    // Each item got its own file at the same relative path: wc counted its bytes.
    let batches = server.admin("GET", "/husk/v1/batches?limit=1", serde_json::Value::Null);
    let batch = &batches.json()["batches"][0];
    assert_eq!(batch["parallel"], 3);
    assert_eq!(batch["succeeded"], 5);
    let id = batch["id"].as_str().unwrap();
    let runs = server.admin(
        "GET",
        &format!("/husk/v1/batches/{id}/runs"),
        serde_json::Value::Null,
    );
    let runs = runs.json()["runs"].as_array().unwrap().clone();
    assert_eq!(runs.len(), 5);
    for r in &runs {
        let k = r["index"].as_u64().unwrap();
        assert_eq!(
            r["stdout_tail"].as_str().unwrap().trim(),
            (k + 1).to_string(),
            "{r}"
        );
    }
    assert_no_sandboxes(&server);
}

#[test]
fn a_failing_item_fails_the_batch_but_not_the_others() {
    let state = TempDir::new("batch-fail");
    let server = Server::start(state.path());
    let url = server.url();
    let cmd = "if [ \"$1\" = bad ]; then echo \"broke on $1\" >&2; exit 7; fi; echo \"fine $1\"";
    let out = husk(
        &server,
        &[
            "batch",
            "--server",
            &url,
            "--parallel",
            "2",
            "--arg",
            "a",
            "--arg",
            "bad",
            "--arg",
            "c",
            "--",
            "sh",
            "-c",
            cmd,
            "sh",
            "{}",
        ],
        None,
    );
    assert_eq!(out.code, 1, "{out:?}");
    let rows: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .skip(1)
        .filter(|l| l.starts_with(|c: char| c.is_ascii_digit()) && l.contains("run_"))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 3, "{out:?}");
    assert_eq!((rows[0][1], rows[0][2]), ("a", "ok"), "{out:?}");
    assert_eq!((rows[1][1], rows[1][2], rows[1][3]), ("bad", "failed", "7"));
    assert_eq!((rows[2][1], rows[2][2]), ("c", "ok"), "{out:?}");
    // The failed item's stderr is shown under its row, only there.
    assert!(out.stdout.contains("│ broke on bad"), "{out:?}");
    assert_eq!(out.stdout.matches('│').count(), 1, "{out:?}");
    assert!(
        out.stdout.contains("3 items: 2 ok, 1 failed, 0 timed out"),
        "{out:?}"
    );

    // --json: the batch's record instead of the table.
    let out = husk(
        &server,
        &[
            "batch", "--server", &url, "--json", "--arg", "bad", "--arg", "x", "--", "sh", "-c",
            cmd, "sh", "{}",
        ],
        None,
    );
    assert_eq!(out.code, 1, "{out:?}");
    let rec: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON on stdout");
    assert_eq!(rec["total"], 2);
    assert_eq!(rec["succeeded"], 1);
    assert_eq!(rec["failed"], 1);
    assert_eq!(rec["items"][0]["exit_code"], 7);
    // Bad input: husk's error, nothing started.
    let out = husk(
        &server,
        &[
            "batch",
            "--server",
            &url,
            "--input",
            "no-such-dir/*.txt",
            "--",
            "cat",
            "{}",
        ],
        None,
    );
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.stderr.contains("no file matches"), "{out:?}");
    assert_no_sandboxes(&server);
}

#[test]
fn ctrl_c_cancels_a_batch_and_prints_its_summary() {
    let state = TempDir::new("batch-cancel");
    let server = Server::start(state.path());
    let url = server.url();
    let child = cli(
        &server,
        &[
            "batch",
            "--server",
            &url,
            "--parallel",
            "2",
            "--arg",
            "1",
            "--arg",
            "2",
            "--arg",
            "3",
            "--",
            "sleep",
            "60",
        ],
        None,
    )
    .spawn()
    .unwrap();
    wait_for(Duration::from_secs(30), || {
        (server.sandboxes(&server.admin_key).len() == 2).then_some(())
    })
    .expect("the batch's sandboxes never appeared");
    signal_process(&child, "INT");
    let out = finish(child, Duration::from_secs(60));
    assert_eq!(out.code, 130, "{out:?}");
    assert!(
        out.stdout
            .contains("3 items: 0 ok, 0 failed, 0 timed out, 3 cancelled"),
        "{out:?}"
    );
    assert_no_sandboxes(&server);
}

#[test]
fn outputs_are_saved_into_a_workspace_and_a_local_run_mounts_it() {
    let state = TempDir::new("run-server-ws");
    let server = Server::start(state.path());
    let r = server.admin(
        "POST",
        "/husk/v1/workspaces",
        serde_json::json!({"name": "results"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let work = TempDir::new("run-server-ws-in");
    let local = work.path().join("words.txt");
    std::fs::write(&local, "hello workspace\n").unwrap();
    let file_flag = format!("{}:in/words.txt", local.display());

    let out = run(
        &server,
        &[
            "--workspace",
            "results:rw",
            "--save",
            "/home/user/out",
            "--file",
            &file_flag,
        ],
        &[
            "sh",
            "-c",
            "mkdir -p out && tr a-z A-Z < in/words.txt > out/upper.txt && ls /workspace/results",
        ],
    );
    assert_eq!(out.code, 0, "{out:?}");
    let rec = last_run(&server);
    let id = rec["id"].as_str().unwrap().to_owned();
    assert!(
        out.stderr.contains(&format!(
            "husk: saved 1 file (16 B) to workspace results at runs/{id}/"
        )),
        "{out:?}"
    );
    assert_eq!(rec["outputs"]["files"][0]["path"], "out/upper.txt");
    assert_eq!(rec["outputs"]["files"][0]["size"], 16);
    let got = server.admin(
        "GET",
        &format!("/husk/v1/workspaces/results/files/runs/{id}/out/upper.txt"),
        serde_json::Value::Null,
    );
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.text(), "HELLO WORKSPACE\n");

    // --save without a workspace to go to: refused before anything runs.
    let out = run(&server, &["--save", "/home/user/out"], &["true"]);
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.stderr.contains("--save-to"), "{out:?}");

    // A local run mounts the same workspace from the state directory: read-only by default,
    // its files the sandbox user's (id-mapped), writable with :rw.
    let state_dir = state.path().to_str().unwrap();
    let path = format!("/workspace/results/runs/{id}/out/upper.txt");
    let out = husk(
        &server,
        &[
            "run", "--state-dir", state_dir, "--workspace", "results", "--", "sh", "-c",
            &format!("cat {path}; stat -c %u {path}; touch /workspace/results/x 2>/dev/null || echo read-only"),
        ],
        None,
    );
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "HELLO WORKSPACE\n1000\nread-only\n", "{out:?}");
    let out = husk(
        &server,
        &[
            "run",
            "--state-dir",
            state_dir,
            "--workspace",
            "results:rw@/data",
            "--",
            "sh",
            "-c",
            "echo local > /data/from-local.txt",
        ],
        None,
    );
    assert_eq!(out.code, 0, "{out:?}");
    let got = server.admin(
        "GET",
        "/husk/v1/workspaces/results/files/from-local.txt",
        serde_json::Value::Null,
    );
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.text(), "local\n");
    // An unknown workspace: a clear error.
    let out = husk(
        &server,
        &[
            "run",
            "--state-dir",
            state_dir,
            "--workspace",
            "nope",
            "--",
            "true",
        ],
        None,
    );
    assert_eq!(out.code, 125, "{out:?}");
    assert!(out.stderr.contains("nope"), "{out:?}");
    assert_no_sandboxes(&server);
}
