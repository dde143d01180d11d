//! End to end: a real agent (PID 1 of a real host-template sandbox) launches and drives a real
//! ipykernel 7.4.0, talked to through the server's own agent client (which also checks every
//! message against the protocol's bounds, and drops the connection at the first violation).
//!
//! The kernel comes from a venv made by `scripts/jupyter-test-venv` with the host's
//! `/usr/bin/python3` (not whatever `python3` is first on `PATH`: the venv's `bin/python` links
//! to its interpreter, which must be under `/usr`, the part of the host the host template
//! shows), bind-mounted read-only into the sandbox at the same path, with `JUPYTER_PATH` and
//! `PATH` pointing into it.
//!
//! Needs root (it creates sandboxes); without it, or without the venv, it fails. It has its own
//! `main` (`harness = false`): the spawner is forked before any thread exists. The sandbox and
//! the spawner are destroyed when the test ends, also when it fails.

use std::time::Duration;

use husk_core::agent::{AgentClient, CallError, KernelStream};
use husk_proto::{
    ErrorKind, ExecEvent, Execute, Hello, KernelEvent, KernelStart, Reply, Request, User, CHUNK,
    VERSION,
};
use husk_runtime::service::SpawnerService;
use husk_runtime::{MountSpec, SandboxSpec};

#[path = "support/sandbox_venv.rs"]
mod sandbox_venv;
use sandbox_venv::{venv, VENV};

/// Destroys the sandbox, then shuts the spawner down, when dropped.
struct Guard {
    service: Option<SpawnerService>,
    sandbox: Option<String>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(service) = self.service.take() {
            if let Some(id) = self.sandbox.take() {
                let _ = service.destroy(&id);
            }
            let _ = service.shutdown();
        }
    }
}

fn main() {
    // Before anything else: no thread may exist when the spawner is forked.
    let service =
        husk_runtime::service::start(husk_agent::main).expect("start the spawner (needs root)");
    let mut guard = Guard {
        service: Some(service),
        sandbox: None,
    };
    let venv = venv();
    let mut spec = SandboxSpec::idle();
    spec.agent = true;
    spec.mounts.push(MountSpec {
        host: venv.clone(),
        sandbox: venv.clone(),
        writable: false,
        ids: husk_runtime::MountIds::Unmapped,
    });
    let created = guard
        .service
        .as_ref()
        .expect("service")
        .create(&spec)
        .expect("create a sandbox");
    guard.sandbox = Some(created.id.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async {
        let hello = Hello {
            version: VERSION,
            env: vec![
                (
                    "JUPYTER_PATH".into(),
                    venv.join("share/jupyter").display().to_string(),
                ),
                (
                    "PATH".into(),
                    format!(
                        "{}:{}",
                        venv.join("bin").display(),
                        husk_runtime::exec::DEFAULT_PATH
                    ),
                ),
            ],
            default_user: User::User,
            default_workdir: None,
        };
        let agent = AgentClient::connect(created.agent, hello)
            .await
            .expect("agent hello");
        cases(&agent).await;
    });
    drop(rt);
    drop(guard);
    println!("kernels end to end: ok");
}

const READY_WITHIN: Duration = Duration::from_secs(60);
const EVENT_WITHIN: Duration = Duration::from_secs(30);

fn start_req(kernel: u32, spec: &str) -> KernelStart {
    KernelStart {
        kernel,
        spec: spec.into(),
        cwd: None,
        user: User::User,
        envs: Vec::new(),
        secret_envs: Vec::new(),
    }
}

async fn next(stream: &mut KernelStream, within: Duration) -> KernelEvent {
    match tokio::time::timeout(within, stream.next()).await {
        Ok(Some(e)) => e,
        Ok(None) => panic!("the kernel stream ended without Dead (the agent connection broke)"),
        Err(_) => panic!("no kernel event within {within:?}"),
    }
}

async fn start(agent: &AgentClient, k: KernelStart) -> KernelStream {
    let mut stream = agent.kernel_start(k).await.expect("kernel start");
    match next(&mut stream, READY_WITHIN).await {
        KernelEvent::Ready {
            language,
            implementation,
        } => {
            assert_eq!(language, "python");
            assert!(implementation.starts_with("ipython "), "{implementation}");
        }
        other => panic!("expected Ready, got {other:?}"),
    }
    stream
}

async fn submit(agent: &AgentClient, kernel: u32, exec: u64, code: &str) {
    let req = Request::Execute(Execute {
        kernel,
        exec,
        code: code.into(),
        silent: false,
    });
    assert_eq!(agent.call(req).await.expect("execute"), Reply::Done);
}

/// The events of execution `exec` up to its Done.
async fn collect(stream: &mut KernelStream, exec: u64) -> Vec<ExecEvent> {
    let mut events = Vec::new();
    loop {
        match next(stream, EVENT_WITHIN).await {
            KernelEvent::Exec { exec: e, event } => {
                assert_eq!(e, exec, "{event:?}");
                let done = matches!(event, ExecEvent::Done { .. });
                events.push(event);
                if done {
                    return events;
                }
            }
            other => panic!("during execution {exec}: {other:?}"),
        }
    }
}

async fn run(
    agent: &AgentClient,
    stream: &mut KernelStream,
    kernel: u32,
    exec: u64,
    code: &str,
) -> Vec<ExecEvent> {
    submit(agent, kernel, exec, code).await;
    collect(stream, exec).await
}

/// What an execution said, put together: stdout, stderr, results (is_main, MIME → JSON value),
/// the error name, the Done status.
#[derive(Debug, Default)]
struct Outcome {
    count: Option<u64>,
    stdout: String,
    stderr: String,
    results: Vec<(bool, Vec<(String, serde_json::Value)>)>,
    error: Option<(String, String, Vec<String>)>,
    status: String,
    /// Largest piece of text or JSON seen.
    largest_piece: usize,
    pieces: usize,
}

fn outcome(events: &[ExecEvent]) -> Outcome {
    let mut o = Outcome::default();
    let mut parts: Vec<(String, Vec<u8>)> = Vec::new();
    for e in events {
        match e {
            ExecEvent::Count(n) => {
                assert!(o.count.is_none() && o.stdout.is_empty(), "Count not first");
                o.count = Some(*n);
            }
            ExecEvent::Stdout { text, date } | ExecEvent::Stderr { text, date } => {
                assert!(
                    date.len() >= 20 && date.as_bytes()[10] == b'T',
                    "not an ISO 8601 date: {date:?}"
                );
                o.largest_piece = o.largest_piece.max(text.len());
                o.pieces += 1;
                match e {
                    ExecEvent::Stdout { .. } => o.stdout.push_str(text),
                    _ => o.stderr.push_str(text),
                }
            }
            ExecEvent::ResultPart { mime, json } => {
                o.largest_piece = o.largest_piece.max(json.len());
                o.pieces += 1;
                match parts.last_mut() {
                    Some((m, j)) if m == mime => j.extend_from_slice(json),
                    _ => parts.push((mime.clone(), json.clone())),
                }
            }
            ExecEvent::Result { is_main, date } => {
                assert!(date.len() >= 20, "{date:?}");
                let values = parts
                    .drain(..)
                    .map(|(m, j)| {
                        let v = serde_json::from_slice(&j)
                            .unwrap_or_else(|e| panic!("{m}: not JSON: {e}"));
                        (m, v)
                    })
                    .collect();
                o.results.push((*is_main, values));
            }
            ExecEvent::Error {
                name,
                value,
                traceback,
            } => o.error = Some((name.clone(), value.clone(), traceback.clone())),
            ExecEvent::Done { status } => o.status = status.clone(),
        }
    }
    assert!(parts.is_empty(), "result parts without their Result");
    o
}

fn plain(o: &Outcome) -> Vec<(bool, String)> {
    o.results
        .iter()
        .map(|(main, values)| {
            let text = values
                .iter()
                .find(|(m, _)| m == "text/plain")
                .and_then(|(_, v)| v.as_str())
                .unwrap_or_default();
            (*main, text.to_owned())
        })
        .collect()
}

async fn expect_err(agent: &AgentClient, req: Request, kind: ErrorKind) -> String {
    match agent.call(req).await {
        Err(CallError::Agent(e)) if e.kind == kind => e.message,
        other => panic!("expected {kind:?}, got {other:?}"),
    }
}

async fn expect_dead(stream: &mut KernelStream, within: Duration) -> String {
    loop {
        match next(stream, within).await {
            KernelEvent::Dead { message } => {
                // Dead is the last event: the stream ends with it.
                assert!(stream.next().await.is_none());
                return message;
            }
            KernelEvent::Exec { .. } => {}
            other => panic!("expected Dead, got {other:?}"),
        }
    }
}

/// Names in /tmp of connection files (as the agent sees them).
async fn connection_files(agent: &AgentClient) -> Vec<String> {
    let req = Request::ListDir {
        path: "/tmp".into(),
        depth: 1,
        user: User::Root,
    };
    match agent.call(req).await.expect("list /tmp") {
        Reply::Entries(entries) => entries
            .into_iter()
            .map(|e| e.name)
            .filter(|n| n.starts_with(".husk-kernel-"))
            .collect(),
        other => panic!("{other:?}"),
    }
}

async fn write_file(agent: &AgentClient, path: &str, data: &[u8]) {
    let open = Request::OpenWrite {
        path: path.into(),
        user: User::User,
        metadata: Vec::new(),
    };
    let Reply::Opened { handle, .. } = agent.call(open).await.expect("open") else {
        panic!("open");
    };
    let write = Request::Write {
        handle,
        data: data.to_vec(),
    };
    agent.call(write).await.expect("write");
    agent.call(Request::Close { handle }).await.expect("close");
}

async fn cases(agent: &AgentClient) {
    // The image's specs: the venv's python3, found through JUPYTER_PATH.
    let Reply::KernelSpecs(specs) = agent.call(Request::KernelSpecs).await.expect("specs") else {
        panic!("specs");
    };
    let py = specs.iter().find(|s| s.name == "python3").expect("python3");
    assert_eq!(py.language, "python");

    // Refusals before anything runs.
    let msg = expect_err(
        agent,
        Request::KernelStart(start_req(9, "cobol")),
        ErrorKind::NotFound,
    )
    .await;
    assert!(msg.contains("python3"), "{msg}");
    let mut bad_cwd = start_req(9, "python3");
    bad_cwd.cwd = Some("/etc/hostname".into());
    expect_err(
        agent,
        Request::KernelStart(bad_cwd),
        ErrorKind::InvalidArgument,
    )
    .await;
    let exec = |kernel| {
        Request::Execute(Execute {
            kernel,
            exec: 99,
            code: "1".into(),
            silent: false,
        })
    };
    expect_err(agent, exec(9), ErrorKind::NotFound).await;
    expect_err(
        agent,
        Request::KernelStop { kernel: 9 },
        ErrorKind::NotFound,
    )
    .await;

    // Start, with the request's environment, a secret and a working directory.
    let mut k = start_req(1, "python3");
    k.cwd = Some("/tmp".into());
    k.envs = vec![("HUSK_PLAIN".into(), "plain".into())];
    k.secret_envs = vec![("HUSK_SECRET".into(), "s3cret".into())];
    let t0 = std::time::Instant::now();
    let mut s1 = start(agent, k).await;
    println!("python3 ready in {:?}", t0.elapsed());
    assert!(
        connection_files(agent).await.is_empty(),
        "the connection file outlived Ready"
    );
    expect_err(
        agent,
        Request::KernelStart(start_req(1, "python3")),
        ErrorKind::AlreadyExists,
    )
    .await;

    // Stateful, with output, result and dates.
    let o = outcome(&run(agent, &mut s1, 1, 1, "x = 41").await);
    assert_eq!(
        (o.count, o.status.as_str(), o.stdout.as_str()),
        (Some(1), "ok", "")
    );
    let o = outcome(&run(agent, &mut s1, 1, 2, "print(x+1); x+1").await);
    assert_eq!(o.count, Some(2));
    assert_eq!(o.stdout, "42\n");
    assert_eq!(plain(&o), [(true, "42".to_owned())]);
    assert_eq!(o.status, "ok");
    let code = "import os; print(os.getcwd(), os.getuid(), os.environ['HUSK_PLAIN'], \
                os.environ['HUSK_SECRET'])";
    let o = outcome(&run(agent, &mut s1, 1, 3, code).await);
    assert_eq!(o.stdout, "/tmp 1000 plain s3cret\n");

    // An error.
    let o = outcome(&run(agent, &mut s1, 1, 4, "1/0").await);
    let (name, value, traceback) = o.error.clone().expect("an error");
    assert_eq!(name, "ZeroDivisionError");
    assert!(value.contains("division by zero"), "{value}");
    assert!(!traceback.is_empty());
    assert_eq!(o.status, "error");

    // Large output and a large result arrive in pieces, intact.
    let code = "s = 'a' * (3 << 20); print(s); 'b' * (2 << 20)";
    let o = outcome(&run(agent, &mut s1, 1, 5, code).await);
    assert_eq!(o.stdout.len(), (3 << 20) + 1);
    assert!(o.stdout.bytes().take(3 << 20).all(|b| b == b'a') && o.stdout.ends_with('\n'));
    let results = plain(&o);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].1.len(), (2 << 20) + 2);
    assert!(results[0].1.starts_with("'bbb") && results[0].1.ends_with("bb'"));
    assert!(
        o.largest_piece <= CHUNK && o.pieces >= 6,
        "{} pieces",
        o.pieces
    );

    // Interrupt a sleep: KeyboardInterrupt, Done, and the kernel still works. Busy meanwhile.
    submit(agent, 1, 6, "import time; time.sleep(30)").await;
    match next(&mut s1, EVENT_WITHIN).await {
        KernelEvent::Exec {
            exec: 6,
            event: ExecEvent::Count(_),
        } => {}
        other => panic!("{other:?}"),
    }
    expect_err(agent, exec(1), ErrorKind::ResourceExhausted).await;
    // The count comes with execute_input, just before the code runs: give it a moment to be
    // inside the sleep (an interrupt before that is still an interrupt, but of less).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = std::time::Instant::now();
    let reply = agent.call(Request::KernelInterrupt { kernel: 1 }).await;
    assert_eq!(reply.expect("interrupt"), Reply::Done);
    let o = outcome(&collect(&mut s1, 6).await);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(o.error.expect("an error").0, "KeyboardInterrupt");
    assert_eq!(o.status, "error");
    let o = outcome(&run(agent, &mut s1, 1, 7, "x").await);
    assert_eq!(plain(&o), [(true, "41".to_owned())]);

    // Stop: Dead, and the id can be started again, fresh.
    let reply = agent.call(Request::KernelStop { kernel: 1 }).await;
    assert_eq!(reply.expect("stop"), Reply::Done);
    assert_eq!(expect_dead(&mut s1, EVENT_WITHIN).await, "stopped");
    expect_err(agent, exec(1), ErrorKind::NotFound).await;
    let mut s1 = start(agent, start_req(1, "python3")).await;
    let o = outcome(&run(agent, &mut s1, 1, 8, "x").await);
    assert_eq!(o.error.expect("x is gone").0, "NameError");

    // A kernel that exits by itself.
    submit(agent, 1, 9, "import os; os._exit(3)").await;
    let msg = expect_dead(&mut s1, EVENT_WITHIN).await;
    assert!(msg.contains("exit status 3"), "{msg}");

    // A spec whose kernel fails at once: Dead, quickly, with the end of its output.
    let broken = br#"{"argv": ["/bin/sh", "-c", "echo the broken kernel says no >&2; exit 7",
        "{connection_file}"], "display_name": "Broken", "language": "sh"}"#;
    write_file(
        agent,
        "/home/user/.local/share/jupyter/kernels/broken/kernel.json",
        broken,
    )
    .await;
    let Reply::KernelSpecs(specs) = agent.call(Request::KernelSpecs).await.expect("specs") else {
        panic!("specs");
    };
    assert!(specs
        .iter()
        .any(|s| s.name == "broken" && s.language == "sh"));
    let t0 = std::time::Instant::now();
    let mut s2 = agent
        .kernel_start(start_req(2, "broken"))
        .await
        .expect("start broken");
    let msg = expect_dead(&mut s2, Duration::from_secs(10)).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(msg.contains("exit status 7"), "{msg}");
    assert!(msg.contains("the broken kernel says no"), "{msg}");

    // A spec of the image's own: interrupted by message, with an environment of its own.
    let python = VENV.to_owned() + "/bin/python";
    let by_message = serde_json::json!({
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (interrupt by message)",
        "language": "python",
        "interrupt_mode": "message",
        "env": {"HUSK_SPEC_ENV": "from the spec"},
    });
    write_file(
        agent,
        "/home/user/.local/share/jupyter/kernels/py-message/kernel.json",
        by_message.to_string().as_bytes(),
    )
    .await;
    let mut s3 = start(agent, start_req(3, "py-message")).await;
    let code = "import os; print(os.environ['HUSK_SPEC_ENV'])";
    let o = outcome(&run(agent, &mut s3, 3, 10, code).await);
    assert_eq!(o.stdout, "from the spec\n");
    submit(agent, 3, 11, "import time; time.sleep(30)").await;
    assert!(matches!(
        next(&mut s3, EVENT_WITHIN).await,
        KernelEvent::Exec {
            exec: 11,
            event: ExecEvent::Count(_)
        }
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = std::time::Instant::now();
    let reply = agent.call(Request::KernelInterrupt { kernel: 3 }).await;
    assert_eq!(reply.expect("interrupt"), Reply::Done);
    let o = outcome(&collect(&mut s3, 11).await);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(o.error.expect("an error").0, "KeyboardInterrupt");
    let reply = agent.call(Request::KernelStop { kernel: 3 }).await;
    assert_eq!(reply.expect("stop"), Reply::Done);
    assert_eq!(expect_dead(&mut s3, EVENT_WITHIN).await, "stopped");

    // Nothing is left behind.
    assert!(connection_files(agent).await.is_empty());
    expect_err(
        agent,
        Request::KernelStop { kernel: 2 },
        ErrorKind::NotFound,
    )
    .await;
}
