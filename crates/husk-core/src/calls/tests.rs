//! The core's call vocabulary: checked values refuse what the agent could not take, each call
//! becomes the agent request it names, and a reply of the wrong kind is refused (against a
//! fake agent over a socket pair).

use std::sync::Arc;
use std::time::Duration;

use husk_proto::{Reply, Request};

use super::*;
use crate::manager::{Config, CreateRequest, LiveSandbox, Manager};
use crate::store::{Principal, Store};
use crate::testing::{FakeHost, WRONG_KIND};

fn path(p: &str) -> SandboxPath {
    SandboxPath::new(p).unwrap()
}

#[test]
fn sandbox_paths_are_checked() {
    assert_eq!(path("~/a b").as_str(), "~/a b");
    assert_eq!(path("").as_str(), "", "empty is the user's home");
    assert_eq!(
        SandboxPath::new("x".repeat(MAX_PATH))
            .unwrap()
            .as_str()
            .len(),
        MAX_PATH
    );
    let err = SandboxPath::new("x".repeat(MAX_PATH + 1)).unwrap_err();
    assert_eq!(err.to_string(), "path is longer than 4096 bytes");
    let err = SandboxPath::named("source", "a\0b").unwrap_err();
    assert_eq!(err.to_string(), "source contains a NUL byte");
}

#[test]
fn terminal_sizes_fit_the_kernel() {
    let size = TerminalSize::new(80, 24).unwrap();
    assert_eq!((size.cols(), size.rows()), (80, 24));
    assert!(TerminalSize::new(65535, 1).is_ok());
    for (cols, rows) in [(0, 24), (80, 0), (65536, 24), (80, u32::MAX)] {
        let err = TerminalSize::new(cols, rows).unwrap_err();
        assert!(err.to_string().contains("between 1 and 65535"), "{err}");
    }
}

#[test]
fn process_specs_are_checked_and_carry_no_secrets() {
    for (cmd, args) in [
        ("", vec![]),
        ("a\0b", vec![]),
        ("x", vec!["ok".to_string(), "\0".to_string()]),
    ] {
        assert!(
            ProcessSpec::new(cmd, args.clone()).is_err(),
            "{cmd:?} {args:?}"
        );
    }
    let env = EnvVars::new(vec![("A".into(), "husk-secret://K".into())]).unwrap();
    let spec = ProcessSpec::new("/bin/sh", vec!["-c".into(), "true".into()])
        .unwrap()
        .env(env)
        .cwd(path("/w"))
        .user(User::Root)
        .pty(TerminalSize::new(100, 30).unwrap())
        .tag("")
        .stdin(false)
        .timeout_ms(Some(5));
    assert_eq!(spec.process_tag(), None, "an empty tag is none");
    assert_eq!(spec.clone().tag("t").process_tag(), Some("t"));
    let start = fuzzing::start(spec.clone());
    assert_eq!(start.cmd, "/bin/sh");
    assert_eq!(start.args, ["-c", "true"]);
    assert_eq!(
        start.envs,
        [("A".to_string(), "husk-secret://K".to_string())]
    );
    assert_eq!(start.cwd.as_deref(), Some("/w"));
    assert_eq!(start.user, User::Root);
    assert_eq!(start.pty, Some((100, 30)));
    assert!(!start.stdin);
    assert_eq!(start.timeout_ms, Some(5));
    assert!(start.secret_envs.is_empty(), "a caller never sets secrets");
    let defaults = fuzzing::start(ProcessSpec::new("true", vec![]).unwrap());
    assert_eq!(defaults.user, User::User);
    assert_eq!(
        (defaults.cwd, defaults.pty, defaults.tag),
        (None, None, None)
    );
}

#[test]
fn calls_become_their_agent_requests() {
    let u = User::User;
    let cases = [
        (
            Call::Stat {
                path: path("a"),
                user: u,
            },
            Request::Stat {
                path: "a".into(),
                user: u,
            },
        ),
        (
            Call::MakeDir {
                path: path("d"),
                user: u,
            },
            Request::MakeDir {
                path: "d".into(),
                user: u,
            },
        ),
        (
            Call::Move {
                from: path("a"),
                to: path("b"),
                user: u,
            },
            Request::Move {
                from: "a".into(),
                to: "b".into(),
                user: u,
            },
        ),
        (
            Call::ListDir {
                path: path("/"),
                depth: 0,
                user: u,
            },
            Request::ListDir {
                path: "/".into(),
                depth: 1,
                user: u,
            },
        ),
        (
            Call::ListDir {
                path: path("/"),
                depth: 3,
                user: u,
            },
            Request::ListDir {
                path: "/".into(),
                depth: 3,
                user: u,
            },
        ),
        (
            Call::Remove {
                path: path("r"),
                user: User::Root,
            },
            Request::Remove {
                path: "r".into(),
                user: User::Root,
            },
        ),
        (Call::ListProcesses, Request::List),
        (
            Call::FindProcess(Selector::Tag("t".into())),
            Request::Find(Selector::Tag("t".into())),
        ),
        (
            Call::SendInput {
                process: Selector::Pid(2),
                data: b"hi".to_vec(),
                pty: true,
            },
            Request::Input {
                sel: Selector::Pid(2),
                data: b"hi".to_vec(),
                pty: true,
            },
        ),
        (
            Call::CloseStdin(Selector::Pid(8)),
            Request::CloseStdin(Selector::Pid(8)),
        ),
        (
            Call::Signal {
                process: Selector::Pid(2),
                signal: Signal::Kill,
            },
            Request::Signal {
                sel: Selector::Pid(2),
                signal: 9,
            },
        ),
        (
            Call::Signal {
                process: Selector::Pid(2),
                signal: Signal::Terminate,
            },
            Request::Signal {
                sel: Selector::Pid(2),
                signal: 15,
            },
        ),
        (
            Call::Resize {
                process: Selector::Pid(3),
                size: TerminalSize::new(100, 30).unwrap(),
            },
            Request::Resize {
                sel: Selector::Pid(3),
                cols: 100,
                rows: 30,
            },
        ),
    ];
    for (call, req) in cases {
        assert_eq!(fuzzing::request(call), req);
    }
}

#[test]
fn each_call_takes_only_its_own_kind_of_reply() {
    let entry = Entry {
        name: "a".into(),
        path: "/a".into(),
        file_type: FileType::File,
        size: 0,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "user".into(),
        group: "user".into(),
        mtime_secs: 0,
        mtime_nanos: 0,
        symlink_target: None,
        metadata: Vec::new(),
    };
    let replies = [
        Reply::Done,
        Reply::Started { pid: 1 },
        Reply::Processes(Vec::new()),
        Reply::Entry(entry.clone()),
        Reply::Entries(vec![entry.clone()]),
        Reply::Watch { watch: 1 },
        Reply::Env(Vec::new()),
        Reply::Disk { used: 0, total: 0 },
    ];
    let u = User::User;
    let calls = [
        (
            Call::Stat {
                path: path("a"),
                user: u,
            },
            3,
        ),
        (
            Call::MakeDir {
                path: path("a"),
                user: u,
            },
            3,
        ),
        (
            Call::Move {
                from: path("a"),
                to: path("b"),
                user: u,
            },
            3,
        ),
        (
            Call::ListDir {
                path: path("a"),
                depth: 1,
                user: u,
            },
            4,
        ),
        (
            Call::Remove {
                path: path("a"),
                user: u,
            },
            0,
        ),
        (Call::ListProcesses, 2),
        (Call::FindProcess(Selector::Pid(1)), 1),
        (Call::CloseStdin(Selector::Pid(1)), 0),
        (
            Call::Signal {
                process: Selector::Pid(1),
                signal: Signal::Kill,
            },
            0,
        ),
    ];
    for (call, good) in calls {
        let what = format!("{call:?}");
        let (_, answer) = call.into_parts();
        for (i, reply) in replies.iter().enumerate() {
            assert_eq!(
                answer(reply.clone()).is_some(),
                i == good,
                "{what} ← {reply:?}"
            );
        }
    }
    assert_eq!(
        Call::FindProcess(Selector::Pid(1)).into_parts().1(Reply::Started { pid: 7 }),
        Some(Answer::Found { pid: 7 })
    );
}

async fn sandbox() -> (Arc<Manager>, Arc<LiveSandbox>) {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let config = Config {
        memory_reserve: 0,
        ..Config::default()
    };
    let m = Manager::new(store, FakeHost::new(), config).unwrap();
    let who = Principal {
        team: "a".into(),
        key_id: "k".into(),
        admin: false,
    };
    let req = CreateRequest {
        template: "host".into(),
        timeout: Duration::from_secs(300),
        ..CreateRequest::default()
    };
    let sb = m.create(&who, req).await.unwrap();
    (m, sb)
}

#[tokio::test]
async fn calls_reach_the_agent_and_a_wrong_reply_is_refused() {
    let (m, sb) = sandbox().await;
    let mut f = sb
        .write_file(&path("/f"), User::User, Vec::new())
        .await
        .unwrap();
    f.write(b"abc".to_vec()).await.unwrap();
    f.finish().await.unwrap();

    let stat = Call::Stat {
        path: path("/f"),
        user: User::User,
    };
    match sb.call(stat).await.unwrap() {
        Answer::Entry(e) => assert_eq!((e.path.as_str(), e.size), ("/f", 3)),
        other => panic!("{other:?}"),
    }
    let missing = sb
        .call(Call::Stat {
            path: path("/nope"),
            user: User::User,
        })
        .await;
    assert!(matches!(missing, Err(CallError::Agent(e)) if e.kind == ErrorKind::NotFound));

    let (pid, _events) = m
        .start_process(&sb, ProcessSpec::new("/bin/true", vec![]).unwrap())
        .await
        .unwrap();
    assert_eq!(
        sb.call(Call::FindProcess(Selector::Pid(pid)))
            .await
            .unwrap(),
        Answer::Found { pid }
    );
    match sb.call(Call::ListProcesses).await.unwrap() {
        Answer::Processes(list) => {
            assert_eq!(list.iter().map(|p| p.pid).collect::<Vec<_>>(), [pid])
        }
        other => panic!("{other:?}"),
    }
    let kill = Call::Signal {
        process: Selector::Pid(pid),
        signal: Signal::Kill,
    };
    assert_eq!(sb.call(kill).await.unwrap(), Answer::Done);
    let remove = Call::Remove {
        path: path("/f"),
        user: User::User,
    };
    assert_eq!(sb.call(remove).await.unwrap(), Answer::Done);

    // A broken agent's reply of the wrong kind is an internal error, not a wrong answer.
    let wrong = sb
        .call(Call::Stat {
            path: path(WRONG_KIND),
            user: User::User,
        })
        .await;
    match wrong {
        Err(CallError::Agent(e)) => {
            assert_eq!(e.kind, ErrorKind::Internal);
            assert!(e.message.contains("wrong kind"), "{}", e.message);
        }
        other => panic!("{other:?}"),
    }
    // The sandbox still answers.
    let again = sb
        .call(Call::Stat {
            path: path("/nope"),
            user: User::User,
        })
        .await;
    assert!(matches!(again, Err(CallError::Agent(e)) if e.kind == ErrorKind::NotFound));
}
