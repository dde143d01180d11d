//! The poll-driven [`KernelClient`] end to end against a real ipykernel, driven the way the
//! agent will drive it: its fds in a poll(2) set, readiness handed back, events drained.
//!
//! Needs the pinned venv of `scripts/jupyter-test-venv`, and FAILS without it (see
//! `tests/ipykernel.rs`). Kernels are killed by PID whenever a test ends, passing or not.

mod common;

use common::{start_kernel, venv_python};
use husk_jupyter::client::{
    ClientError, ExecEvent, ExecId, KernelClient, KernelEvent, ABORTED_ERROR, REPLY_AFTER_IDLE,
};
use husk_jupyter::connection::ConnectionInfo;
use husk_jupyter::wire::ExecuteReply;
use husk_runtime::libc;
use husk_runtime::sys;
use std::time::{Duration, Instant};

/// The next event, polling the client's fds until one comes or `deadline` passes.
fn next(client: &mut KernelClient, deadline: Instant) -> KernelEvent {
    next_by(client, deadline).expect("timed out waiting for a kernel event")
}

/// The next event, or None once `deadline` has passed.
fn next_by(client: &mut KernelClient, deadline: Instant) -> Option<KernelEvent> {
    loop {
        client.tick(Instant::now());
        if let Some(event) = client.next_event() {
            return Some(event);
        }
        let kfds = client.fds();
        assert!(!kfds.is_empty(), "a live client polls its three sockets");
        let mut pfds: Vec<libc::pollfd> = kfds
            .iter()
            .map(|k| libc::pollfd {
                fd: k.fd,
                events: (if k.read { libc::POLLIN } else { 0 })
                    | (if k.write { libc::POLLOUT } else { 0 }),
                revents: 0,
            })
            .collect();
        let left = deadline.checked_duration_since(Instant::now())?;
        // The client's own timer (a reply waited for after idle) wakes the loop too.
        let timer = client
            .deadline()
            .map_or(left, |t| t.saturating_duration_since(Instant::now()));
        let timeout = left.min(timer).as_millis().min(1000) as i32 + 1;
        match sys::poll(&mut pfds, timeout) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("poll: {e}"),
        }
        for (k, p) in kfds.iter().zip(&pfds) {
            if p.revents != 0 {
                let readable = p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0;
                let writable = p.revents & libc::POLLOUT != 0;
                client.on_ready(k.fd, readable, writable);
            }
        }
    }
}

/// Connects (retrying while the kernel starts) and waits for Ready.
fn connect(info: &ConnectionInfo, deadline: Instant) -> KernelClient {
    let mut client = loop {
        match KernelClient::connect(info) {
            Ok(c) => break c,
            Err(ClientError::Connect(_, e)) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    assert!(!client.is_ready());
    let KernelEvent::Ready(info) = next(&mut client, deadline) else {
        panic!("the first event is Ready");
    };
    assert_eq!(info.language_info.name, "python");
    assert_eq!(info.implementation, "ipython");
    assert!(client.is_ready());
    client
}

/// The events of execution `id` up to and including Done; other events go to `others`.
fn collect(
    client: &mut KernelClient,
    id: ExecId,
    timeout: Duration,
    others: &mut Vec<KernelEvent>,
) -> Vec<ExecEvent> {
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    loop {
        match next(client, deadline) {
            KernelEvent::Exec { id: got, event } => {
                assert_eq!(got, id, "an event of another execution: {event:?}");
                let done = matches!(event, ExecEvent::Done { .. });
                out.push(event);
                if done {
                    assert_eq!(client.running(), None);
                    return out;
                }
            }
            KernelEvent::Dead(reason) => panic!("kernel died: {reason}; so far {out:#?}"),
            other => others.push(other),
        }
    }
}

fn run(client: &mut KernelClient, code: &str) -> Vec<ExecEvent> {
    let id = client.execute(code).unwrap();
    let mut others = Vec::new();
    let events = collect(client, id, Duration::from_secs(30), &mut others);
    assert!(others.is_empty(), "{others:#?}");
    merge_streams(events.into_iter().map(checked_date).collect())
}

/// What [`checked_date`] leaves of a header date.
const DATE: &str = "<date>";

/// Checks that an output event carries its message's header date (ipykernel writes ISO 8601
/// UTC with microseconds, e.g. `2026-01-02T03:04:05.678901Z`) and replaces it with [`DATE`],
/// so events compare equal across runs.
fn checked_date(mut event: ExecEvent) -> ExecEvent {
    if let ExecEvent::Stdout { date, .. }
    | ExecEvent::Stderr { date, .. }
    | ExecEvent::Result { date, .. } = &mut event
    {
        let ok = date.len() >= 20
            && date.as_bytes()[4] == b'-'
            && date.as_bytes()[10] == b'T'
            && (date.ends_with('Z') || date.ends_with("+00:00"));
        assert!(ok, "not an ISO 8601 UTC date: {date:?}");
        *date = DATE.into();
    }
    event
}

/// Joins consecutive chunks of one stream: ipykernel may split a print across messages.
fn merge_streams(events: Vec<ExecEvent>) -> Vec<ExecEvent> {
    let mut out: Vec<ExecEvent> = Vec::new();
    for event in events {
        match (out.last_mut(), &event) {
            (Some(ExecEvent::Stdout { text, .. }), ExecEvent::Stdout { text: more, .. })
            | (Some(ExecEvent::Stderr { text, .. }), ExecEvent::Stderr { text: more, .. }) => {
                text.push_str(more)
            }
            _ => out.push(event),
        }
    }
    out
}

fn plain(text: &str) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    m.insert("text/plain".into(), text.into());
    m
}

#[test]
fn kernel_client_end_to_end() {
    let python = venv_python();
    let info = ConnectionInfo::localhost("python3").unwrap();
    // Before the kernel listens, connecting fails at once (the caller retries), never hangs.
    // (Checked here rather than in a test of its own: a parallel test could pick the same free
    // ports for its kernel.)
    let started = Instant::now();
    let result = KernelClient::connect(&info);
    assert!(
        matches!(result, Err(ClientError::Connect(..))),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let mut kernel = start_kernel(&python, &info, "client");
    let mut client = connect(&info, Instant::now() + Duration::from_secs(60));

    // Not busy: nothing else happens on its own.
    assert_eq!(client.next_event(), None);

    // State persists across executions; counts go 1, 2; the value is the main result.
    assert_eq!(
        run(&mut client, "x = 41"),
        [
            ExecEvent::ExecutionCount(1),
            ExecEvent::Done {
                reply: ExecuteReply::Ok { execution_count: 1 }
            }
        ]
    );
    assert_eq!(
        run(&mut client, "x + 1"),
        [
            ExecEvent::ExecutionCount(2),
            ExecEvent::Result {
                is_main: true,
                data: plain("42"),
                date: DATE.into()
            },
            ExecEvent::Done {
                reply: ExecuteReply::Ok { execution_count: 2 }
            }
        ]
    );

    // stdout and stderr in the order they were written.
    let events = run(
        &mut client,
        "import sys\nprint('out 1', flush=True)\nprint('err', file=sys.stderr, flush=True)\n\
         print('out 2', flush=True)",
    );
    assert_eq!(
        events,
        [
            ExecEvent::ExecutionCount(3),
            ExecEvent::Stdout {
                text: "out 1\n".into(),
                date: DATE.into()
            },
            ExecEvent::Stderr {
                text: "err\n".into(),
                date: DATE.into()
            },
            ExecEvent::Stdout {
                text: "out 2\n".into(),
                date: DATE.into()
            },
            ExecEvent::Done {
                reply: ExecuteReply::Ok { execution_count: 3 }
            }
        ]
    );

    // An error, with its traceback, once (not again from the reply).
    let events = run(&mut client, "1/0");
    let [ExecEvent::ExecutionCount(4), ExecEvent::Error {
        name,
        value,
        traceback,
    }, ExecEvent::Done {
        reply: ExecuteReply::Error { error, .. },
    }] = events.as_slice()
    else {
        panic!("unexpected events: {events:#?}");
    };
    assert_eq!(
        (name.as_str(), value.as_str()),
        ("ZeroDivisionError", "division by zero")
    );
    // IPython colours its tracebacks with ANSI escapes; the frames and the last line are there.
    assert!(traceback.len() >= 2, "{traceback:?}");
    assert!(
        traceback.iter().any(|l| l.contains("Traceback")),
        "{traceback:?}"
    );
    assert!(
        traceback.last().unwrap().contains("ZeroDivisionError"),
        "{traceback:?}"
    );
    assert_eq!(error.ename, "ZeroDivisionError");

    // display() is a result, not the main one.
    let events = run(
        &mut client,
        "from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))",
    );
    let [ExecEvent::ExecutionCount(5), ExecEvent::Result {
        is_main: false,
        data,
        ..
    }, ExecEvent::Done {
        reply: ExecuteReply::Ok { execution_count: 5 },
    }] = events.as_slice()
    else {
        panic!("unexpected events: {events:#?}");
    };
    assert_eq!(data["text/html"], "<b>hi</b>");
    assert!(data.contains_key("text/plain"), "{data:?}");

    // One execution at a time; a sleep is interrupted on control; the context lives on.
    let id = client.execute("import time\ntime.sleep(30)").unwrap();
    assert!(matches!(
        client.execute("1"),
        Err(ClientError::Busy(busy)) if busy == id
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    let KernelEvent::Exec {
        event: ExecEvent::ExecutionCount(6),
        ..
    } = next(&mut client, deadline)
    else {
        panic!("expected the execution count first");
    };
    // Let the code reach the sleep: a kernel blocked in a system call is the case that matters.
    std::thread::sleep(Duration::from_millis(500));
    let interrupted_at = Instant::now();
    client.interrupt().unwrap();
    let mut others = Vec::new();
    let events = collect(&mut client, id, Duration::from_secs(30), &mut others);
    assert!(
        interrupted_at.elapsed() < Duration::from_secs(10),
        "the interrupt took {:?}",
        interrupted_at.elapsed()
    );
    assert!(
        matches!(events.as_slice(), [.., ExecEvent::Error { name, .. }, ExecEvent::Done {
            reply: ExecuteReply::Error { .. }
        }] if name == "KeyboardInterrupt"),
        "{events:#?}"
    );
    // The control reply may come before or after Done; take it if it is not in yet.
    if others.is_empty() {
        others.push(next(&mut client, Instant::now() + Duration::from_secs(10)));
    }
    assert_eq!(others, [KernelEvent::InterruptReply { ok: true }]);
    assert_eq!(
        run(&mut client, "x"),
        [
            ExecEvent::ExecutionCount(7),
            ExecEvent::Result {
                is_main: true,
                data: plain("41"),
                date: DATE.into()
            },
            ExecEvent::Done {
                reply: ExecuteReply::Ok { execution_count: 7 }
            }
        ]
    );

    // A killed kernel is reported dead, mid-execution too, and refuses further work.
    let id = client.execute("time.sleep(30)").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    assert!(matches!(
        next(&mut client, deadline),
        KernelEvent::Exec {
            id: got,
            event: ExecEvent::ExecutionCount(8)
        } if got == id
    ));
    kernel.child.kill().unwrap();
    let died_at = Instant::now();
    let reason = loop {
        match next(&mut client, deadline) {
            KernelEvent::Dead(reason) => break reason,
            KernelEvent::Exec {
                event: ExecEvent::Done { .. },
                ..
            } => panic!("a killed execution must not end with Done"),
            _ => {}
        }
    };
    assert!(
        died_at.elapsed() < Duration::from_secs(5),
        "{:?}",
        died_at.elapsed()
    );
    eprintln!("dead: {reason}");
    assert!(client.is_dead());
    assert!(client.fds().is_empty());
    assert_eq!(client.next_event(), None);
    assert!(matches!(client.execute("1"), Err(ClientError::Dead)));
    assert!(matches!(client.interrupt(), Err(ClientError::Dead)));
    drop(kernel);
}

/// ipykernel 7 sends no `execute_reply` when a `KeyboardInterrupt` is raised after its handler
/// began but before the code runs (an interrupt that lands just as an execution starts; it
/// then goes idle). The execution still ends, and the kernel keeps its state.
#[test]
fn an_interrupt_before_the_code_runs_ends_the_execution() {
    let python = venv_python();
    let info = ConnectionInfo::localhost("python3").unwrap();
    let kernel = start_kernel(&python, &info, "early-interrupt");
    let mut client = connect(&info, Instant::now() + Duration::from_secs(60));
    let pid = kernel.child.id() as i32;
    assert!(matches!(
        run(&mut client, "x = 41").last(),
        Some(ExecEvent::Done {
            reply: ExecuteReply::Ok { .. }
        })
    ));

    // Made certain: an input transformer (run by IPython before the code) raises it once.
    run(
        &mut client,
        "def _interrupt_once(lines):\n\
         \x20   get_ipython().input_transformers_cleanup.remove(_interrupt_once)\n\
         \x20   raise KeyboardInterrupt\n\
         get_ipython().input_transformers_cleanup.append(_interrupt_once)",
    );
    let started = Instant::now();
    let events = run(&mut client, "x = 0");
    assert!(
        matches!(events.as_slice(), [
            ExecEvent::ExecutionCount(_),
            ExecEvent::Error { name, .. },
            ExecEvent::Done { reply: ExecuteReply::Aborted },
        ] if name == ABORTED_ERROR),
        "{events:#?}"
    );
    assert!(
        started.elapsed() < REPLY_AFTER_IDLE + Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(
        run(&mut client, "x").as_slice(),
        [_, ExecEvent::Result { data, .. }, _] if data["text/plain"] == "41"
    ));

    // As it happens: SIGINT (the agent's interrupt for ipykernel) as soon as the execution
    // count is in, and again every second as the server does (ipykernel can swallow one that
    // lands outside the code), many times; every execution ends, interrupted or aborted.
    let (mut interrupted, mut aborted, mut again) = (0, 0, 0);
    for i in 0..20 {
        let id = client.execute("import time\ntime.sleep(30)").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        assert!(matches!(
            next(&mut client, deadline),
            KernelEvent::Exec {
                event: ExecEvent::ExecutionCount(_),
                ..
            }
        ));
        // Spread over the window between the input's publication and the code.
        std::thread::sleep(Duration::from_micros(250 * (i % 8)));
        sys::kill(pid, libc::SIGINT).unwrap();
        let reply = loop {
            let event = next_by(&mut client, Instant::now() + Duration::from_secs(1));
            match event {
                Some(KernelEvent::Exec { id: got, event }) => {
                    assert_eq!(got, id);
                    if let ExecEvent::Done { reply } = event {
                        break reply;
                    }
                }
                Some(other) => panic!("{other:?}"),
                None if deadline > Instant::now() => {
                    again += 1;
                    sys::kill(pid, libc::SIGINT).unwrap();
                }
                None => panic!("execution {i} did not end"),
            }
        };
        match reply {
            ExecuteReply::Error { .. } => interrupted += 1,
            ExecuteReply::Aborted => aborted += 1,
            other => panic!("{other:?}"),
        }
    }
    eprintln!(
        "interrupted in the code: {interrupted}; before it (no reply): {aborted}; \
         interrupts sent again: {again}"
    );
    assert!(matches!(
        run(&mut client, "x").as_slice(),
        [_, ExecEvent::Result { data, .. }, _] if data["text/plain"] == "41"
    ));
    drop(kernel);
}
