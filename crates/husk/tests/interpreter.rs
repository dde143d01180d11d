//! The code interpreter through a real `husk serve`: port 49999's `/execute` (NDJSON),
//! `/contexts` and `/health` on real ipykernel 7.4.0 kernels run by the agent, and `code` runs
//! on the same path.
//!
//! The kernel comes from a venv made by `scripts/jupyter-test-venv` with the host's
//! `/usr/bin/python3` (the host template shows `/usr`), copied into a workspace that the
//! sandboxes mount read-only at the venv's own path; `JUPYTER_PATH` and `PATH` in the
//! sandbox's environment point into it. (The stock SDK suites in `tests/compat` use the real
//! `code-interpreter` template instead.)

mod common;
#[path = "../../husk-agent/tests/support/sandbox_venv.rs"]
mod sandbox_venv;

use std::process::Command;
use std::time::{Duration, Instant};

use common::sandbox::Sandbox;
use common::server::{Server, Streaming};
use common::{wait_for, TempDir};
use sandbox_venv::{venv, VENV};
use serde_json::{json, Value};

/// The sandbox environment that finds the venv's kernel.
fn kernel_env() -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert(
        "JUPYTER_PATH".into(),
        json!(format!("{VENV}/share/jupyter")),
    );
    m.insert(
        "PATH".into(),
        json!(format!("{VENV}/bin:/usr/local/bin:/usr/bin:/bin")),
    );
    m
}

/// A server with the venv in its team's workspace `kvenv`.
fn server_with_venv(state: &TempDir) -> Server {
    let venv = venv();
    let server = Server::start(state.path());
    server
        .request(
            "POST",
            "/husk/v1/workspaces",
            &server.admin_key,
            br#"{"name": "kvenv"}"#,
        )
        .expect(201);
    let ws = state.path().join("workspaces/default/kvenv");
    let st = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", venv.display()))
        .arg(&ws)
        .status()
        .unwrap();
    assert!(st.success(), "copying the venv into the workspace failed");
    server
}

fn create(server: &Server, extra: Value) -> Sandbox<'_> {
    let mut env = kernel_env();
    if let Some(more) = extra.get("envVars").and_then(Value::as_object) {
        env.extend(more.clone());
    }
    let mut body = json!({
        "templateID": "base",
        "timeout": 300,
        "envVars": env,
        "volumeMounts": [{"name": "kvenv", "path": VENV}],
    });
    for (k, v) in extra.as_object().unwrap() {
        if k != "envVars" {
            body[k] = v.clone();
        }
    }
    Sandbox::create(server, &server.admin_key, body)
}

/// The credential a call carries.
#[derive(Clone, Copy)]
enum Cred {
    None,
    /// `X-Access-Token` (what the SDKs send with `/execute`).
    Access,
    /// `E2B-Traffic-Access-Token` (what they send with every call when they have one).
    Traffic,
}

fn headers(sb: &Sandbox<'_>, cred: Cred) -> Vec<(&'static str, String)> {
    let mut h = vec![
        ("Content-Type", "application/json".to_owned()),
        ("E2b-Sandbox-Id", sb.id.clone()),
        ("E2b-Sandbox-Port", "49999".to_owned()),
    ];
    match cred {
        Cred::None => {}
        Cred::Access => h.push(("X-Access-Token", sb.token.clone())),
        Cred::Traffic => h.push(("E2B-Traffic-Access-Token", traffic_token(sb))),
    }
    h
}

fn traffic_token(sb: &Sandbox<'_>) -> String {
    sb.created["trafficAccessToken"]
        .as_str()
        .unwrap_or_else(|| panic!("no traffic token: {}", sb.created))
        .to_owned()
}

fn start_exec(sb: &Sandbox<'_>, body: Value) -> Streaming {
    let h = headers(sb, Cred::Access);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    sb.server
        .stream_with("POST", "/execute", &h, body.to_string().as_bytes())
}

/// Runs code; the NDJSON lines (keepalives dropped). Asserts 200 and the final
/// `end_of_execution`.
fn exec(sb: &Sandbox<'_>, body: Value) -> Vec<Value> {
    exec_within(sb, body, Duration::from_secs(300))
}

/// [`exec`], failing once `limit` has passed (keepalives keep a stuck execution's stream
/// going).
fn exec_within(sb: &Sandbox<'_>, body: Value, limit: Duration) -> Vec<Value> {
    let s = start_exec(sb, body.clone());
    assert_eq!(s.status, 200, "{body}: {}", s.headers);
    let events = s.events_within(limit);
    assert_eq!(
        events.last().map(|e| e["type"].clone()),
        Some(json!("end_of_execution")),
        "{events:?}"
    );
    events
}

fn call(sb: &Sandbox<'_>, method: &str, path: &str, body: &str, cred: Cred) -> (u16, String) {
    let h = headers(sb, cred);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let r = sb.server.request_with(method, path, &h, body.as_bytes());
    (r.status, r.text())
}

fn of_type<'e>(events: &'e [Value], t: &str) -> Vec<&'e Value> {
    events.iter().filter(|e| e["type"] == t).collect()
}

fn main_text(events: &[Value]) -> Option<String> {
    of_type(events, "result")
        .into_iter()
        .find(|r| r["is_main_result"] == true)
        .and_then(|r| r["text"].as_str().map(str::to_owned))
}

fn stdout(events: &[Value]) -> String {
    of_type(events, "stdout")
        .iter()
        .map(|e| e["text"].as_str().unwrap())
        .collect()
}

#[test]
fn execute_and_contexts_on_real_kernels() {
    let state = TempDir::new("interp");
    let server = server_with_venv(&state);
    server
        .request(
            "PUT",
            "/husk/v1/secrets/KERNEL_SECRET",
            &server.admin_key,
            "s3cr3t-value",
        )
        .expect(204);
    let sb = create(
        &server,
        json!({"envVars": {"GLOBAL_V": "g", "SECRET_V": "husk-secret://KERNEL_SECRET"}}),
    );

    // Health needs nothing; the default Python context starts on first use.
    assert_eq!(
        call(&sb, "GET", "/health", "", Cred::None),
        (200, "\"OK\"".into())
    );

    // State persists across calls; counts go up; stdout carries the kernel's timestamps.
    let first = exec(&sb, json!({"code": "x = 41"}));
    assert_eq!(
        of_type(&first, "number_of_executions")[0]["execution_count"],
        1
    );
    let second = exec(
        &sb,
        json!({"code": "print(x + 1)\nx + 1", "language": "python"}),
    );
    assert_eq!(second[0]["type"], "number_of_executions", "{second:?}");
    assert_eq!(second[0]["execution_count"], 2);
    assert_eq!(stdout(&second), "42\n");
    let ts = of_type(&second, "stdout")[0]["timestamp"].as_str().unwrap();
    assert!(ts.starts_with("20") && ts.contains('T'), "{ts}");
    assert_eq!(main_text(&second).as_deref(), Some("42"));

    // Errors: name, value, traceback.
    let err = exec(&sb, json!({"code": "1 / 0"}));
    let e = of_type(&err, "error")[0];
    assert_eq!(e["name"], "ZeroDivisionError");
    assert_eq!(e["value"], "division by zero");
    assert!(
        e["traceback"]
            .as_str()
            .unwrap()
            .contains("ZeroDivisionError"),
        "{e}"
    );

    // Display data is a non-main result; MIME types map onto E2B's fields; quotes of a
    // string's repr are stripped once.
    let shown = exec(
        &sb,
        json!({"code": "from IPython.display import display, HTML\n\
                        display(HTML('<b>hi</b>'))\n'done'"}),
    );
    let results = of_type(&shown, "result");
    assert_eq!(results.len(), 2, "{shown:?}");
    assert_eq!(results[0]["is_main_result"], false);
    assert_eq!(results[0]["html"], "<b>hi</b>");
    assert_eq!(main_text(&shown).as_deref(), Some("done"));

    // Per-call env vars are set for that call only; the sandbox's are always there.
    let code = "import os; print(os.environ.get('PER_CALL'), os.environ.get('GLOBAL_V'))";
    let with = exec(
        &sb,
        json!({"code": code, "env_vars": {"PER_CALL": "p'\"\\"}}),
    );
    assert_eq!(stdout(&with), "p'\"\\ g\n");
    assert_eq!(stdout(&exec(&sb, json!({"code": code}))), "None g\n");
    // A secret the sandbox was created with is in the kernel's environment (compared inside,
    // so the value itself never crosses).
    let secret = exec(
        &sb,
        json!({"code": "import os; os.environ.get('SECRET_V') == 's3cr3t-value'"}),
    );
    assert_eq!(main_text(&secret).as_deref(), Some("True"), "{secret:?}");
    // Printed, returned or raised, its value is masked in what the client gets.
    let leak = exec(
        &sb,
        json!({"code": "import os, sys\nv = os.environ['SECRET_V']\nprint('out', v)\nsys.stdout.write(v[:4]); sys.stdout.flush(); print(v[4:])\nv"}),
    );
    let all = serde_json::to_string(&leak).unwrap();
    assert!(!all.contains("s3cr3t-value"), "{all}");
    assert_eq!(stdout(&leak), "out ****\n****\n", "{leak:?}");
    assert!(
        main_text(&leak).is_some_and(|t| t.contains("****")),
        "{leak:?}"
    );
    let raised = exec(
        &sb,
        json!({"code": "import os\nraise ValueError(os.environ['SECRET_V'])"}),
    );
    let all = serde_json::to_string(&raised).unwrap();
    assert!(
        !all.contains("s3cr3t-value") && all.contains("ValueError"),
        "{all}"
    );

    // Large output arrives whole, in order.
    let big = exec(&sb, json!({"code": "print('a' * 3_000_000)"}));
    assert_eq!(stdout(&big).len(), 3_000_001);

    // Contexts: created with a cwd, listed (with the default), isolated, restarted, removed.
    let (st, made) = call(
        &sb,
        "POST",
        "/contexts",
        r#"{"cwd": "/tmp"}"#,
        Cred::Traffic,
    );
    assert_eq!(st, 200, "{made}");
    let made: Value = serde_json::from_str(&made).unwrap();
    let ctx = made["id"].as_str().unwrap().to_owned();
    assert_eq!(made["language"], "python");
    assert_eq!(made["cwd"], "/tmp");
    let (st, list) = call(&sb, "GET", "/contexts", "", Cred::Traffic);
    assert_eq!(st, 200);
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    // Listed with the default context the calls above started, as E2B lists its defaults.
    assert_eq!(list.len(), 2, "{list:?}");
    assert!(list.contains(&made), "{list:?}");
    assert!(
        list.iter()
            .any(|c| c["id"] != made["id"] && c["language"] == "python"),
        "the default Python context: {list:?}"
    );
    let cwd = exec(
        &sb,
        json!({"code": "import os; os.getcwd()", "context_id": ctx}),
    );
    assert_eq!(main_text(&cwd).as_deref(), Some("/tmp"));
    let isolated = exec(&sb, json!({"code": "x", "context_id": ctx}));
    assert_eq!(of_type(&isolated, "error")[0]["name"], "NameError");
    exec(&sb, json!({"code": "y = 1", "context_id": ctx}));
    let (st, _) = call(
        &sb,
        "POST",
        &format!("/contexts/{ctx}/restart"),
        "",
        Cred::Traffic,
    );
    assert_eq!(st, 200);
    let after = exec(&sb, json!({"code": "y", "context_id": ctx}));
    assert_eq!(of_type(&after, "error")[0]["name"], "NameError");

    // Bad requests: plain-text errors the SDKs map.
    let both = start_exec(
        &sb,
        json!({"code": "1", "context_id": ctx, "language": "python"}),
    );
    assert_eq!(both.status, 400);
    let mut both = both;
    assert_eq!(
        both.next_line().as_deref(),
        Some("Only one of context_id or language can be provided")
    );
    let mut missing = start_exec(&sb, json!({"code": "1", "context_id": "nope"}));
    assert_eq!(missing.status, 404);
    assert_eq!(
        missing.next_line().as_deref(),
        Some("Context nope not found")
    );
    let mut cobol = start_exec(&sb, json!({"code": "1", "language": "cobol"}));
    assert_eq!(cobol.status, 400);
    let msg = cobol.next_line().unwrap();
    assert!(
        msg.contains("no kernel for language 'cobol'") && msg.contains("python"),
        "{msg}"
    );
    let mut huge = start_exec(&sb, json!({"code": format!("# {}", "x".repeat(2 << 20))}));
    assert_eq!(huge.status, 400);
    let msg = huge.next_line().unwrap();
    assert!(msg.contains("more than the limit"), "{msg}");
    assert_eq!(
        call(&sb, "DELETE", "/contexts/nope", "", Cred::Traffic).0,
        404
    );
    assert_eq!(
        call(
            &sb,
            "DELETE",
            &format!("/contexts/{ctx}"),
            "",
            Cred::Traffic
        )
        .0,
        200
    );
    assert_eq!(
        start_exec(&sb, json!({"code": "1", "context_id": ctx})).status,
        404
    );

    // An interrupt that lands as the code is about to run: ipykernel 7 then sends no reply
    // (an input transformer raising KeyboardInterrupt makes it certain). The execution still
    // ends, with an error saying so, and the context keeps its kernel and its state.
    let setup = exec(
        &sb,
        json!({"code": "def _interrupt_once(lines):\n    \
            get_ipython().input_transformers_cleanup.remove(_interrupt_once)\n    \
            raise KeyboardInterrupt\n\
            get_ipython().input_transformers_cleanup.append(_interrupt_once)"}),
    );
    assert!(of_type(&setup, "error").is_empty(), "{setup:?}");
    let aborted = exec_within(&sb, json!({"code": "x = 0"}), Duration::from_secs(30));
    let e = of_type(&aborted, "error");
    assert_eq!(e.len(), 1, "{aborted:?}");
    assert_eq!(e[0]["name"], "ExecutionAborted", "{aborted:?}");
    assert!(of_type(&aborted, "stderr").is_empty(), "{aborted:?}");
    assert_eq!(of_type(&aborted, "end_of_execution").len(), 1);
    let kept = exec(&sb, json!({"code": "x"}));
    assert_eq!(main_text(&kept).as_deref(), Some("41"), "{kept:?}");

    // A client that goes away interrupts its execution; the context keeps its state and the
    // next call runs at once.
    let mut slow = start_exec(&sb, json!({"code": "import time\ntime.sleep(120)"}));
    assert_eq!(slow.status, 200);
    let first = slow.next_line().unwrap();
    assert!(first.contains("number_of_executions"), "{first}");
    drop(slow);
    let t = Instant::now();
    let again = exec(&sb, json!({"code": "x"}));
    assert_eq!(main_text(&again).as_deref(), Some("41"), "{again:?}");
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "the abandoned execution held the context for {:?}",
        t.elapsed()
    );

    // A kernel that dies is reported, and a restart brings the context back.
    let (st, made) = call(&sb, "POST", "/contexts", "{}", Cred::Traffic);
    assert_eq!(st, 200);
    let ctx: Value = serde_json::from_str(&made).unwrap();
    let ctx = ctx["id"].as_str().unwrap().to_owned();
    let died = exec(
        &sb,
        json!({"code": "import os; os._exit(3)", "context_id": ctx}),
    );
    let e = of_type(&died, "error")[0];
    assert_eq!(e["name"], "KernelDied", "{died:?}");
    assert!(
        e["value"].as_str().unwrap().contains("exit status 3"),
        "{e}"
    );
    let still = exec(&sb, json!({"code": "1", "context_id": ctx}));
    assert_eq!(of_type(&still, "error")[0]["name"], "KernelDied");
    assert_eq!(
        call(
            &sb,
            "POST",
            &format!("/contexts/{ctx}/restart"),
            "",
            Cred::Traffic
        )
        .0,
        200
    );
    let back = exec(&sb, json!({"code": "2 + 2", "context_id": ctx}));
    assert_eq!(main_text(&back).as_deref(), Some("4"));

    // Killing the sandbox ends a running execution's stream.
    let mut running = start_exec(&sb, json!({"code": "import time\ntime.sleep(120)"}));
    assert!(running
        .next_line()
        .unwrap()
        .contains("number_of_executions"));
    server
        .request("DELETE", &format!("/sandboxes/{}", sb.id), &sb.key, "")
        .expect(204);
    let t = Instant::now();
    while running.next_line().is_some() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the stream outlived the sandbox"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(20));
    // And the port answers like the SDKs expect of a gone sandbox.
    assert_eq!(call(&sb, "GET", "/contexts", "", Cred::Traffic).0, 502);
}

#[test]
fn private_sandboxes_and_code_runs() {
    let state = TempDir::new("interp-runs");
    let server = server_with_venv(&state);

    // A private sandbox's interpreter admits its access token or traffic token, not strangers.
    let private = create(&server, json!({"network": {"allowPublicTraffic": false}}));
    assert_eq!(call(&private, "GET", "/contexts", "", Cred::None).0, 401);
    for cred in [Cred::Access, Cred::Traffic] {
        assert_eq!(
            call(&private, "GET", "/contexts", "", cred),
            (200, "[]".into())
        );
    }
    drop(private);

    // The code-interpreter SDKs' default template, on a server without the preset built: a
    // clear answer that says what to build.
    let r = server.request(
        "POST",
        "/sandboxes",
        &server.admin_key,
        json!({"templateID": "code-interpreter-v1"}).to_string(),
    );
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("scripts/build-templates"), "{}", r.text());

    // `code` runs go through the kernel: results, output, errors with their name.
    let mut env = kernel_env();
    env.insert("RUN_V".into(), json!("r"));
    let spec = |code: &str| {
        json!({
            "template": "base",
            "code": code,
            "language": "python",
            "env": env,
            "workspaces": [{"name": "kvenv", "path": VENV}],
            "timeout": 60,
        })
    };
    let events = server.post_events(
        "/husk/v1/runs",
        &server.admin_key,
        &spec("import os\nprint('hi', os.environ['RUN_V'])\n6 * 7"),
    );
    let out: String = events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .map(|e| e["data"].as_str().unwrap())
        .collect();
    assert_eq!(out, "hi r\n", "{events:?}");
    let result = events
        .iter()
        .find(|e| e["type"] == "result")
        .unwrap_or_else(|| panic!("no result: {events:?}"));
    assert_eq!(result["is_main"], true);
    assert_eq!(result["data"]["text/plain"], "42");
    let end = events.last().unwrap();
    assert_eq!(end["type"], "end", "{events:?}");
    assert_eq!(end["run"]["status"], "succeeded", "{end}");
    assert_eq!(end["run"]["exit_code"], 0);
    assert_eq!(end["run"]["result"], "42");

    let events = server.post_events("/husk/v1/runs", &server.admin_key, &spec("y = 1\ny / 0"));
    let end = &events.last().unwrap()["run"];
    assert_eq!(end["status"], "failed", "{end}");
    assert_eq!(end["exit_code"], 1);
    assert_eq!(end["reason"], "ZeroDivisionError: division by zero");
    let stderr = end["stderr_tail"].as_str().unwrap();
    assert!(
        stderr.contains("ZeroDivisionError") && !stderr.contains('\u{1b}'),
        "{stderr:?}"
    );

    // A secret reaches the kernel and is masked in its output (`redact` defaults to on).
    server
        .request(
            "PUT",
            "/husk/v1/secrets/RUN_SECRET",
            &server.admin_key,
            "kernel-run-value",
        )
        .expect(204);
    let mut with_secret =
        spec("import os\nprint(os.environ['RUN_SECRET'])\nlen(os.environ['RUN_SECRET'])");
    with_secret["secrets"] = json!(["RUN_SECRET"]);
    let events = server.post_events("/husk/v1/runs", &server.admin_key, &with_secret);
    let end = &events.last().unwrap()["run"];
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["stdout_tail"], "****\n", "{end}");
    assert_eq!(end["result"], "16");
    assert_eq!(end["secrets"], json!(["RUN_SECRET"]));

    // Code too large for one kernel request runs as a file instead (no rich result then).
    let big = format!("# {}\nprint('big ok')", "a".repeat(1_100_000));
    let events = server.post_events("/husk/v1/runs", &server.admin_key, &spec(&big));
    let end = &events.last().unwrap()["run"];
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["stdout_tail"], "big ok\n");
    assert!(end.get("result").is_none(), "{end}");

    // A timeout interrupts the kernel and says so.
    let mut slow = spec("import time\ntime.sleep(60)");
    slow["timeout"] = json!(2);
    let t = Instant::now();
    let events = server.post_events("/husk/v1/runs", &server.admin_key, &slow);
    let end = &events.last().unwrap()["run"];
    assert_eq!(end["status"], "timed_out", "{end}");
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());

    // Every run's sandbox is gone.
    assert!(
        wait_for(Duration::from_secs(10), || server
            .sandboxes(&server.admin_key)
            .is_empty()
            .then_some(()))
        .is_some(),
        "run sandboxes left behind"
    );
}

/// Issue 15 H1: port 49999 of a public sandbox runs code as its user (with its secrets, and
/// root through sudo), so naming the sandbox is not enough: without a credential of the
/// sandbox's team, every route is refused, by header routing and by Host routing, and so is a
/// browser's cross-origin "simple" request; nothing of what was refused happened.
#[test]
fn port_49999_wants_a_credential_of_the_sandboxs_team() {
    let state = TempDir::new("interp-auth");
    let server = server_with_venv(&state);
    let sb = create(&server, json!({}));
    // Another team with a sandbox of its own: its key and tokens are credentials of nothing here.
    let other_key = server.key_for("other");
    let theirs = Sandbox::create(&server, &other_key, json!({"templateID": "base"}));
    let (their_access, their_traffic) = (theirs.token.clone(), traffic_token(&theirs));
    assert_ne!(their_traffic, traffic_token(&sb));

    // The team's own context, made with the traffic token as the SDKs do.
    let (st, made) = call(&sb, "POST", "/contexts", "{}", Cred::Traffic);
    assert_eq!(st, 200, "{made}");
    let ctx = serde_json::from_str::<Value>(&made).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let pwn = json!({"code": "open('/tmp/pwned', 'w').write('x')"}).to_string();
    let routes = [
        ("POST", "/execute".to_owned(), pwn.clone()),
        (
            "POST",
            "/contexts".to_owned(),
            r#"{"cwd": "/tmp"}"#.to_owned(),
        ),
        ("GET", "/contexts".to_owned(), String::new()),
        ("DELETE", format!("/contexts/{ctx}"), String::new()),
        ("POST", format!("/contexts/{ctx}/restart"), String::new()),
    ];
    let wrong = "0".repeat(40);
    let ours_cut = traffic_token(&sb)[..39].to_owned();
    let strangers: Vec<Vec<(&str, &str)>> = vec![
        vec![],
        vec![("X-API-Key", other_key.as_str())],
        vec![("X-Access-Token", their_access.as_str())],
        vec![("E2B-Traffic-Access-Token", their_traffic.as_str())],
        vec![("X-Access-Token", wrong.as_str())],
        vec![("E2B-Traffic-Access-Token", wrong.as_str())],
        vec![("X-Access-Token", "")],
        vec![("X-API-Key", "e2b_0000000000000000000000000000000000000000")],
        // Another team's key with this sandbox's token cut short is still nobody.
        vec![
            ("X-API-Key", other_key.as_str()),
            ("E2B-Traffic-Access-Token", ours_cut.as_str()),
        ],
    ];
    let host = format!("49999-{}.husk.example", sb.id);
    for (method, path, body) in &routes {
        for extra in &strangers {
            // By the SDKs' headers...
            let mut h = vec![
                ("Content-Type", "application/json"),
                ("E2b-Sandbox-Id", sb.id.as_str()),
                ("E2b-Sandbox-Port", "49999"),
            ];
            h.extend_from_slice(extra);
            let r = server.request_with(method, path, &h, body.as_bytes());
            assert_eq!(r.status, 401, "{method} {path} {extra:?}: {}", r.text());
            assert!(r.text().contains("needs a credential"), "{}", r.text());
            // ...and by Host, as a preview URL names it.
            let mut h = vec![
                ("Host", host.as_str()),
                ("Content-Type", "application/json"),
            ];
            h.extend_from_slice(extra);
            let r = server.request_with(method, path, &h, body.as_bytes());
            assert_eq!(
                r.status,
                401,
                "{method} {path} {extra:?} by Host: {}",
                r.text()
            );
        }
        // What a web page can make a visitor's browser send without a CORS preflight: a
        // simple POST (text/plain, form or no content type) with no credential header.
        for ct in ["text/plain", "application/x-www-form-urlencoded"] {
            let h = [("Host", host.as_str()), ("Content-Type", ct)];
            let r = server.request_with(method, path, &h, body.as_bytes());
            assert_eq!(r.status, 401, "{method} {path} as {ct}: {}", r.text());
        }
    }

    // With a credential, a POST body must still be declared JSON: 415, and nothing runs.
    for ct in [Some("text/plain"), Some("application/jsonx"), None] {
        let mut h = vec![
            ("E2b-Sandbox-Id", sb.id.as_str()),
            ("E2b-Sandbox-Port", "49999"),
            ("X-Access-Token", sb.token.as_str()),
        ];
        if let Some(ct) = ct {
            h.push(("Content-Type", ct));
        }
        let r = server.request_with("POST", "/execute", &h, pwn.as_bytes());
        assert_eq!(r.status, 415, "{ct:?}: {}", r.text());
    }

    // Nothing of it happened: the context is still there, alone, its kernel never restarted
    // (its state holds), and no code ran. Any credential of the team works: the access token,
    // the traffic token, a key of the team (by Host routing too).
    let events = exec(&sb, json!({"code": "x = 7", "context_id": ctx}));
    assert!(of_type(&events, "error").is_empty(), "{events:?}");
    let (st, list) = call(&sb, "GET", "/contexts", "", Cred::Traffic);
    assert_eq!(st, 200);
    let list: Vec<Value> = serde_json::from_str(&list).unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["id"], ctx.as_str());
    let own_key = server.key_for("default");
    let h = [
        ("Host", host.as_str()),
        ("Content-Type", "application/json; charset=utf-8"),
        ("X-API-Key", own_key.as_str()),
    ];
    let code =
        json!({"code": "import os; print(os.path.exists('/tmp/pwned'), x)", "context_id": ctx});
    let s = server.stream_with("POST", "/execute", &h, code.to_string().as_bytes());
    assert_eq!(s.status, 200, "{}", s.headers);
    assert_eq!(stdout(&s.events()), "False 7\n");
    // GET /health answers without a credential, and says nothing but that.
    assert_eq!(
        call(&sb, "GET", "/health", "", Cred::None),
        (200, "\"OK\"".into())
    );
}
