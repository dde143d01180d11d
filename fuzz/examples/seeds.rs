//! Writes the seed corpus (`fuzz/corpus/<target>/seed-*`): a few real inputs per target, made
//! with husk's own encoders and in each target's input layout (its leading mode bytes and
//! length-prefixed fields, see `husk_fuzz::field`), so the fuzzer starts from messages that
//! get past the first checks.
//!
//!     cargo +nightly run --manifest-path fuzz/Cargo.toml --example seeds
//!
//! Seeds the fuzzer found later live beside these under other names; this only rewrites its
//! own `seed-*` files.

use std::fs;
use std::io::Write;
use std::path::Path;

use husk_jupyter::wire::{Session, Signer, DELIMITER};
use husk_proto::sudo::{SudoRequest, SudoToAgent};
use husk_proto::{
    AgentError, Entry, ErrorKind, ExecEvent, FileType, FromAgent, FsEvent, FsOp, Hello,
    KernelEvent, ProcEnd, ProcEvent, ProcInfo, Reply, Request, Selector, StartProc, ToAgent, User,
    VERSION,
};
use husk_runtime::SandboxSpec;
use husk_server::connect::encode_envelope;

/// An input under construction, with the targets' field encoding.
#[derive(Default)]
struct Input(Vec<u8>);

impl Input {
    fn byte(mut self, b: u8) -> Self {
        self.0.push(b);
        self
    }

    /// What `husk_fuzz::field(u, max)` reads back as `data` (cut to the nearest length the
    /// one-byte prefix can express).
    fn field(mut self, data: &[u8], max: usize) -> Self {
        let (b, len) = (0..=255u8)
            .map(|b| (b, usize::from(b) * max / 255))
            .filter(|&(_, len)| len <= data.len())
            .max_by_key(|&(_, len)| len)
            .expect("length 0 is always expressible");
        self.0.push(b);
        self.0.extend_from_slice(&data[..len]);
        self
    }

    fn bytes(mut self, data: &[u8]) -> Self {
        self.0.extend_from_slice(data);
        self
    }
}

struct Corpus<'a> {
    root: &'a Path,
}

impl Corpus<'_> {
    fn write(&self, target: &str, name: &str, input: Input) {
        let dir = self.root.join(target);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(format!("seed-{name}")), input.0).unwrap();
    }
}

fn frame<T: serde::Serialize>(msg: &T) -> Vec<u8> {
    husk_proto::encode(msg).unwrap()
}

fn start_proc() -> StartProc {
    StartProc {
        cmd: "/bin/bash".into(),
        args: vec!["-l".into(), "-c".into(), "echo hi".into()],
        envs: vec![("A".into(), "b".into())],
        cwd: Some("/tmp".into()),
        user: User::User,
        pty: Some((80, 24)),
        tag: Some("t".into()),
        stdin: true,
        timeout_ms: Some(60_000),
        secret_envs: Vec::new(),
    }
}

fn entry() -> Entry {
    Entry {
        name: "a.txt".into(),
        path: "/home/user/a.txt".into(),
        file_type: FileType::File,
        size: 3,
        mode: 0o644,
        permissions: "-rw-r--r--".into(),
        owner: "user".into(),
        group: "user".into(),
        mtime_secs: 1_700_000_000,
        mtime_nanos: 5,
        symlink_target: None,
        metadata: vec![("k".into(), "v".into())],
    }
}

fn connect(c: &Corpus) {
    let sdk = br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}"#;
    let mut body = encode_envelope(0, sdk).to_vec();
    body.extend_from_slice(&encode_envelope(0, br#"{"start":{"process":{"pid":"7"}}}"#));
    body.extend_from_slice(&encode_envelope(0, b""));
    body.extend_from_slice(&husk_server::connect::encode_end_stream(None));
    c.write(
        "connect_envelope",
        "stream",
        Input::default().byte(0).bytes(&[7, 8, 9]).bytes(&body),
    );
    c.write(
        "connect_envelope",
        "small-limit",
        Input::default()
            .byte(1)
            .byte(40)
            .bytes(&[1, 2, 3])
            .bytes(&body),
    );

    let messages: [(u8, &str, &[u8]); 15] = [
        (0, "start", br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"b"},"cwd":"/tmp"},"pty":{"size":{"cols":80,"rows":24}},"tag":"t","stdin":false}"#),
        (1, "connect", br#"{"process":{"pid":"12"}}"#),
        (2, "list", b"{}"),
        (3, "update", br#"{"process":{"tag":"x"},"pty":{"size":{"cols":100,"rows":30}}}"#),
        (4, "send-input", br#"{"process":{"pid":1},"input":{"stdin":"aGVsbG8="}}"#),
        (5, "send-signal", br#"{"process":{"pid":1},"signal":"SIGNAL_SIGKILL"}"#),
        (6, "close-stdin", br#"{"process":{"tag":"t"}}"#),
        (7, "stat", br#"{"path":"/home/user"}"#),
        (8, "make-dir", br#"{"path":"~/a/b"}"#),
        (9, "remove", br#"{"path":"x"}"#),
        (10, "move", br#"{"source":"a","destination":"/tmp/b"}"#),
        (11, "list-dir", br#"{"path":"~","depth":2}"#),
        (12, "watch-dir", br#"{"path":"/tmp","recursive":true,"includeEntry":true}"#),
        (13, "watcher-id", br#"{"watcherId":"w1"}"#),
        (14, "stream-input", br#"{"data":{"input":{"pty":"AA=="}}}"#),
    ];
    for (kind, name, json) in messages {
        // Unary, with the right content type and nothing else.
        c.write(
            "connect_request",
            name,
            Input::default().byte(kind).byte(0).bytes(json),
        );
    }
    // Server streaming, with a timeout, Basic auth for root and an access token.
    let start = messages[0].2;
    c.write(
        "connect_request",
        "start-stream-headers",
        Input::default()
            .byte(0)
            .byte(0x01 | 0x10 | 0x40 | 0x80)
            .field(b"1", 8)
            .field(b"60000", 16)
            .field(b"Basic cm9vdDo=", 64)
            .field(b"token", 16)
            .bytes(start),
    );
}

fn multipart(c: &Corpus) {
    let part = |name: &str, file: &str, data: &str| {
        format!("--husk-fuzz-7f3a\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{file}\"\r\nContent-Type: application/octet-stream\r\n\r\n{data}\r\n")
    };
    let body = [
        part("file", "/home/user/a.txt", "alpha"),
        "--husk-fuzz-7f3a\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nignored\r\n"
            .into(),
        part("file", "b/c.txt", "beta\r\nwith lines"),
        "--husk-fuzz-7f3a--\r\n".into(),
    ]
    .concat();
    c.write(
        "multipart",
        "form",
        Input::default()
            .byte(0)
            .byte(1)
            .byte(7)
            .bytes(body.as_bytes()),
    );
    c.write(
        "multipart",
        "form-query-path",
        Input::default()
            .byte(8)
            .byte(1)
            .byte(3)
            .field(b"/tmp/t.txt", 32)
            .bytes(body.as_bytes()),
    );
    // A built form: three parts (a file, a field, a file).
    let built = Input::default()
        .byte(1)
        .byte(0)
        .byte(5)
        .byte(3)
        .byte(1)
        .field(b"dir/a.txt", 40)
        .field(b"hello", 512)
        .byte(0)
        .field(b"note", 8)
        .field(b"", 40)
        .field(b"x", 512)
        .byte(2)
        .field(b"b", 40)
        .field(b"\r\n--husk", 512);
    c.write("multipart", "built", built);
}

fn files(c: &Corpus) {
    let sig = husk_server::files::sign(
        "/home/user/a.txt",
        husk_server::files::Operation::Read,
        Some("user"),
        "tok_fuzz",
        Some(1_900_000_000),
    );
    let query = format!(
        "path=%2Fhome%2Fuser%2Fa.txt&username=user&signature={sig}&signature_expiration=1900000000"
    );
    let mut gz_data = b"hello husk\n".repeat(60);
    gz_data.extend((0..700u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let input = Input::default()
        .field(query.as_bytes(), 200)
        // Read, no token header, a genuine signature of our own a minute back.
        .byte(0)
        .field(b"", 12)
        .byte(1)
        .byte(0)
        .byte(100)
        // Range of a 10 000-byte file.
        .field(b"bytes=100-199", 48)
        .bytes(&[0x10, 0x27, 0])
        .byte(0)
        // Two Accept-Encoding headers, then Content-Encoding.
        .byte(2)
        .field(b"gzip;q=0.5, identity", 48)
        .field(b"*;q=0", 48)
        .field(b"gzip", 16)
        // Two metadata headers.
        .byte(2)
        .field(b"owner", 24)
        .byte(1)
        .field(b"team a", 64)
        .field(b"a.b_c", 24)
        .byte(1)
        .field(b"1", 64)
        .byte(0)
        .byte(9)
        .bytes(&gz_data);
    c.write("files_request", "signed-download", input);
    let input = Input::default()
        .field(
            b"path=..%2F..%2Fetc%2F%E2%82%AC+x&username=root&junk=%FF",
            200,
        )
        .byte(1)
        .field(b"tok_fuzz", 12)
        .byte(0)
        .byte(1)
        .field(b"bytes=-500", 48)
        .bytes(&[0xff, 0xff, 0xff])
        .byte(1)
        .byte(1)
        .field(b"x-gzip, br", 48)
        .field(b"identity", 16)
        .byte(0)
        .byte(1)
        .byte(3)
        .bytes(b"\x00\x01\x02");
    c.write("files_request", "token-and-traversal", input);
}

fn agent(c: &Corpus) {
    let hello = Hello {
        version: VERSION,
        env: vec![("PATH".into(), "/usr/bin".into())],
        default_user: User::User,
        default_workdir: Some("/home/user".into()),
    };
    let calls = [
        Request::Start(start_proc()),
        Request::Find(Selector::Tag("t".into())),
        Request::Input {
            sel: Selector::Pid(3),
            data: b"ls\n".to_vec(),
            pty: true,
        },
        Request::Resize {
            sel: Selector::Pid(3),
            cols: 120,
            rows: 40,
        },
        Request::ListDir {
            path: "/home/user".into(),
            depth: 2,
            user: User::Root,
        },
        Request::Write {
            handle: 1,
            data: vec![0; 100],
        },
        Request::Read {
            handle: 1,
            offset: 0,
            len: 4096,
        },
        Request::Deadline {
            unix_ms: Some(1_800_000_000_000),
        },
        Request::KernelAttach { kernel: 1 },
    ];
    let mut stream = frame(&ToAgent::Hello(hello));
    for (id, req) in calls.into_iter().enumerate() {
        stream.extend(frame(&ToAgent::Call {
            id: id as u64 + 1,
            req,
        }));
    }
    c.write(
        "agent_frames",
        "calls",
        Input::default().byte(0).bytes(&stream),
    );
    c.write(
        "agent_frames",
        "calls-then-close",
        Input::default().byte(2).bytes(&stream[..stream.len() - 3]),
    );
    let replies = [
        FromAgent::Hello { version: VERSION },
        FromAgent::Reply {
            id: 1,
            result: Ok(Reply::Entries(vec![entry()])),
        },
        FromAgent::Reply {
            id: 2,
            result: Err(AgentError::new(ErrorKind::NotFound, "no such file")),
        },
        FromAgent::Proc {
            pid: 3,
            event: ProcEvent::Stdout(b"out".to_vec()),
        },
    ];
    let stream: Vec<u8> = replies.iter().flat_map(frame).collect();
    c.write(
        "agent_frames",
        "replies",
        Input::default().byte(0).bytes(&stream),
    );
    let sudo = SudoToAgent::Run(SudoRequest {
        argv: vec!["id".into()],
        user: User::Root,
        env: vec![("TERM".into(), "xterm".into())],
        preserve_env: false,
        cwd: "/home/user".into(),
        login: true,
        shell: false,
    });
    c.write(
        "agent_frames",
        "sudo",
        Input::default()
            .byte(1)
            .bytes(&postcard::to_stdvec(&sudo).unwrap()),
    );

    // The server's client: ids 1 (List), 2 (Start), 3 (watch), 4 (kernel start).
    let events = [
        FromAgent::Reply {
            id: 2,
            result: Ok(Reply::Started { pid: 5 }),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::Stdout(b"token=hunt".to_vec()),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::Stderr(b"er2 and more".to_vec()),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::Pty(b"hunter".to_vec()),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::End(ProcEnd {
                exit_code: 0,
                exited: true,
                status: "exit status 0".into(),
                error: None,
            }),
        },
        FromAgent::Reply {
            id: 1,
            result: Ok(Reply::Processes(vec![ProcInfo {
                pid: 5,
                tag: None,
                cmd: "sh".into(),
                args: vec![],
                envs: vec![],
                cwd: None,
            }])),
        },
        FromAgent::Reply {
            id: 3,
            result: Ok(Reply::Watch { watch: 9 }),
        },
        FromAgent::Watch {
            watch: 9,
            events: vec![FsEvent {
                name: "a".into(),
                op: FsOp::Create,
            }],
        },
        FromAgent::Reply {
            id: 4,
            result: Ok(Reply::Done),
        },
        FromAgent::Kernel {
            kernel: 7,
            event: KernelEvent::Ready {
                language: "python".into(),
                implementation: "ipython 9".into(),
            },
        },
        FromAgent::Kernel {
            kernel: 7,
            event: KernelEvent::Exec {
                exec: 1,
                event: ExecEvent::Stdout {
                    text: "hi".into(),
                    date: "d".into(),
                },
            },
        },
        FromAgent::Kernel {
            kernel: 7,
            event: KernelEvent::Dead {
                message: "exited".into(),
            },
        },
    ];
    let stream: Vec<u8> = events.iter().flat_map(frame).collect();
    let input = Input::default()
        .byte(0)
        .byte(1)
        .field(b"hunter2", 12)
        .bytes(&stream);
    c.write("agent_client", "everything", input);
    c.write(
        "agent_client",
        "no-secrets",
        Input::default().byte(0).byte(0).bytes(&stream),
    );
    // Two secrets, one inside the other, and output that ends in a prefix of the longer.
    let events = [
        FromAgent::Reply {
            id: 2,
            result: Ok(Reply::Started { pid: 5 }),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::Stdout(b"pass: hunt".to_vec()),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::Stdout(b"er".to_vec()),
        },
        FromAgent::Proc {
            pid: 5,
            event: ProcEvent::End(ProcEnd {
                exit_code: 1,
                exited: true,
                status: "exit status 1".into(),
                error: None,
            }),
        },
    ];
    let stream: Vec<u8> = events.iter().flat_map(frame).collect();
    let input = Input::default()
        .byte(0)
        .byte(2)
        .field(b"hunter2", 12)
        .field(b"nt", 12)
        .bytes(&stream);
    c.write("agent_client", "overlapping-secrets", input);
}

fn spawner(c: &Corpus) {
    let mut spec = SandboxSpec::new(vec!["/bin/echo".into(), "hi".into()]);
    spec.env = vec![("A".into(), "b".into())];
    spec.workdir = Some("/home/user".into());
    spec.tty = true;
    spec.tty_size = Some((24, 80));
    spec.timeout = Some(std::time::Duration::from_secs(5));
    spec.mounts.push(husk_runtime::MountSpec {
        host: "/tmp".into(),
        sandbox: "/mnt/x".into(),
        writable: false,
        ids: Default::default(),
    });
    // `Request::Create(Box<SandboxSpec>)` is variant 0; postcard writes the box's contents.
    let create = [vec![0u8], postcard::to_stdvec(&spec).unwrap()].concat();
    c.write(
        "spawner_protocol",
        "create",
        Input::default().byte(1).bytes(&create),
    );
    c.write(
        "spawner_protocol",
        "create-idle",
        Input::default().byte(1).bytes(
            &[
                vec![0u8],
                postcard::to_stdvec(&SandboxSpec::idle()).unwrap(),
            ]
            .concat(),
        ),
    );
    c.write(
        "spawner_protocol",
        "destroy",
        Input::default().byte(1).bytes(b"\x01\x0ds3-0123456789a"),
    );
    // Shutdown (2), keeping kept sandboxes or not.
    for (name, keep) in [("shutdown", 0u8), ("shutdown-keep", 1)] {
        c.write(
            "spawner_protocol",
            name,
            Input::default().byte(1).bytes(&[2, keep]),
        );
    }
    // Freeze (4), Thaw (5), FrozenLayer (6), Reconnect (7) of a sandbox by its runtime id.
    for (name, tag) in [
        ("freeze", 4u8),
        ("thaw", 5),
        ("frozen-layer", 6),
        ("reconnect", 7),
    ] {
        let mut req = vec![tag, 13];
        req.extend_from_slice(b"s3-0123456789a");
        c.write("spawner_protocol", name, Input::default().byte(1).bytes(&req));
    }
    // Control messages from init: tag, little-endian fields (mode's upper bits: descriptors).
    let control: [(&str, u8, &[u8]); 8] = [
        ("need-map", 0, &[1]),
        ("ready-pty", 2, &[2]),
        ("setup-failed", 0, b"\x03mount /proc: permission denied"),
        ("exec-failed", 0, &[4, 2, 0, 0, 0]),
        ("exited", 0, &[5, 1, 0, 0, 0]),
        ("signaled", 0, &[6, 9, 0, 0, 0]),
        ("timed-out", 0, &[7]),
        ("layer", 2, &[8]),
    ];
    for (name, mode, msg) in control {
        c.write(
            "spawner_protocol",
            name,
            Input::default().byte(mode).bytes(msg),
        );
    }
}

/// The server's requests to its network and state helpers (frames' payloads).
fn helpers(c: &Corpus) {
    use husk_core::store::remote::StateRequest;
    use husk_net::helper::{Request, WirePolicy};
    use husk_net::rules::{HeaderRules, HostRule, SecretValue};
    let net = [
        ("attach-none", Request::Attach { policy: WirePolicy::None, rules: None }),
        (
            "attach-allow",
            Request::Attach {
                policy: husk_net::NetPolicy::from_flags(&["allow=example.com,10.0.0.0/8".into()])
                    .unwrap()
                    .into(),
                rules: None,
            },
        ),
        (
            "attach-rules",
            Request::Attach {
                policy: WirePolicy::None,
                rules: Some(HeaderRules {
                    hosts: vec![HostRule {
                        host: "*.example.com".into(),
                        headers: vec![("authorization".into(), SecretValue::new(b"Bearer k".to_vec()))],
                    }],
                }),
            },
        ),
        (
            "set-policy-rules",
            Request::SetPolicy {
                link: 1,
                policy: WirePolicy::None,
                rules: HeaderRules {
                    hosts: vec![HostRule { host: "api.example.com".into(), headers: Vec::new() }],
                },
            },
        ),
        ("denials", Request::Denials { link: 1, sync: true }),
        ("detach", Request::Detach { link: 1 }),
        ("socket", Request::Socket { v6: true }),
        (
            "reattach",
            Request::Reattach {
                index: 7,
                policy: husk_net::NetPolicy::from_flags(&["allow=example.com".into()])
                    .unwrap()
                    .into(),
                rules: None,
            },
        ),
        ("prune-links", Request::PruneLinks),
    ];
    for (name, req) in net {
        let bytes = postcard::to_stdvec(&req).unwrap();
        c.write("net_helper", name, Input::default().byte(0).bytes(&bytes));
        c.write("net_helper", &format!("{name}-fd"), Input::default().byte(1).bytes(&bytes));
    }
    let state = [
        ("create-key", StateRequest::CreateKey { team: "t".into(), admin: false, label: None }),
        ("authenticate", StateRequest::Authenticate { presented: "e2b_0123".into() }),
        ("open-secret", StateRequest::OpenSecret { team: "t".into(), name: "N".into() }),
        ("open-other", StateRequest::OpenSecret { team: "u".into(), name: "N".into() }),
        (
            "seal",
            StateRequest::SealSecret {
                team: "t".into(),
                name: "M".into(),
                value: b"v".to_vec(),
                mode: husk_core::store::PutMode::Create,
                metadata: Some([("k".to_string(), "v".to_string())].into()),
            },
        ),
        ("run-records", StateRequest::RunRecords {
            table: husk_core::store::RunTable::Runs,
            team: "t".into(),
            batch: None,
            limit: 10,
        }),
        ("templates", StateRequest::Templates),
        ("snapshots", StateRequest::Snapshots),
        ("lost-sandboxes", StateRequest::LostSandboxes { team: Some("t".into()), id: Some("abc".into()) }),
        ("delete-snapshot", StateRequest::DeleteSnapshot { id: "snap123".into() }),
        ("volume-token", StateRequest::VolumeToken { id: "vol_0123".into() }),
        ("volumes", StateRequest::Volumes { team: "t".into() }),
        ("cluster-token-file", StateRequest::ClusterTokenFile),
        ("tls-files", StateRequest::TlsFiles),
    ];
    for (name, req) in state {
        c.write("state_helper", name, Input::default().bytes(&postcard::to_stdvec(&req).unwrap()));
    }
    use husk_core::workspaces::remote::FilesRequest as F;
    let t = || "t".to_string();
    let w = || "w".to_string();
    let files = [
        ("list", F::List { team: t() }, &b""[..]),
        ("read", F::ReadFile { team: t(), name: w(), path: "dir/f.txt".into() }, b""),
        ("read-link", F::ReadFile { team: t(), name: w(), path: "out".into() }, b""),
        ("entries", F::Entries { team: t(), name: w(), path: "".into(), depth: 3 }, b""),
        (
            "write",
            F::WriteFile {
                team: t(),
                name: w(),
                path: "new/f".into(),
                max_bytes: 100,
                options: husk_core::workspaces::WriteOptions::default(),
            },
            b"\x05\0\0\0hello\0\0\0\0",
        ),
        (
            "write-keep",
            F::WriteFile {
                team: t(),
                name: w(),
                path: "dir/f.txt".into(),
                max_bytes: 100,
                options: husk_core::workspaces::WriteOptions {
                    replace: false,
                    attrs: husk_core::workspaces::Attrs { uid: Some(0), gid: None, mode: Some(0o600) },
                },
            },
            b"\x05\0\0\0hello\0\0\0\0",
        ),
        (
            "mkdir",
            F::MakeDir {
                team: t(),
                name: w(),
                path: "a/b/c".into(),
                parents: true,
                attrs: husk_core::workspaces::Attrs { uid: Some(1000), gid: Some(1000), mode: Some(0o755) },
            },
            b"",
        ),
        (
            "set-attrs-link",
            F::SetAttrs {
                team: t(),
                name: w(),
                path: "out".into(),
                attrs: husk_core::workspaces::Attrs { uid: Some(1), gid: None, mode: Some(0o777) },
            },
            b"",
        ),
        ("export", F::Export { team: t(), name: w(), path: "".into() }, b""),
        ("remove", F::Remove { team: t(), name: w(), path: "dir".into() }, b""),
        ("delete-other", F::Delete { team: "u".into(), name: w() }, b""),
        (
            "capture-layer",
            F::CaptureLayer {
                runtime_id: "s3-0123456789a".into(),
                into: husk_core::saved_layers::Home::Paused,
                owner: "abc123".into(),
                below: Some(husk_core::saved_layers::LayerRef {
                    home: husk_core::saved_layers::Home::Paused,
                    owner: "abc123".into(),
                    layer: "0123456789abcdef".into(),
                }),
            },
            b"",
        ),
        (
            "capture-snapshot-below-traversal",
            F::CaptureLayer {
                runtime_id: "s3-0123456789a".into(),
                into: husk_core::saved_layers::Home::Snapshot,
                owner: "snap123".into(),
                below: Some(husk_core::saved_layers::LayerRef {
                    home: husk_core::saved_layers::Home::Paused,
                    owner: "..".into(),
                    layer: "../../workspaces".into(),
                }),
            },
            b"",
        ),
        (
            "drop-layer",
            F::DropLayers {
                home: husk_core::saved_layers::Home::Paused,
                owner: "abc123".into(),
                layer: Some("0123456789abcdef".into()),
            },
            b"",
        ),
        (
            "drop-layers-traversal",
            F::DropLayers { home: husk_core::saved_layers::Home::Paused, owner: "../workspaces".into(), layer: None },
            b"",
        ),
        (
            "drop-snapshot",
            F::DropLayers { home: husk_core::saved_layers::Home::Snapshot, owner: "snap123".into(), layer: None },
            b"",
        ),
        (
            "prune-snapshots",
            F::PruneLayers { home: husk_core::saved_layers::Home::Snapshot, keep: vec![("snap123".into(), String::new())] },
            b"",
        ),
    ];
    for (name, req, stream) in files {
        let frame = postcard::to_stdvec(&req).unwrap();
        let mut input = (frame.len() as u16).to_le_bytes().to_vec();
        input.extend_from_slice(&frame);
        input.extend_from_slice(stream);
        c.write("files_helper", name, Input::default().bytes(&input));
    }
    use husk_build::helper::BuildRequest as B;
    let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let builds = [
        ("build", B::Build { query: pairs(&[("name", "py"), ("no_cache", "true")]), key: "k".into() }),
        (
            "build-file",
            B::Build {
                query: pairs(&[("name", "py"), ("file", "sub/Dockerfile"), ("build_arg", "A=1")]),
                key: "k".into(),
            },
        ),
        ("build-escape", B::Build { query: pairs(&[("name", "py"), ("file", "../x")]), key: "k".into() }),
        ("remove", B::Remove { name: "py".into() }),
        ("has-files", B::HasFiles { hash: "ab".repeat(32) }),
        ("put-files", B::PutFiles { hash: "../etc".into() }),
        (
            "e2b-build",
            B::E2bBuild {
                name: "my-env".into(),
                template: husk_build::e2b::E2bTemplate {
                    from_template: Some("base".into()),
                    steps: [
                        ("ENV", vec!["A", "1"]),
                        ("RUN", vec!["echo hi", "root"]),
                        ("WORKDIR", vec!["app"]),
                        ("USER", vec!["user"]),
                        ("RUN", vec!["pwd"]),
                    ]
                    .into_iter()
                    .map(|(k, a)| husk_build::e2b::E2bStep {
                        kind: k.into(),
                        args: a.into_iter().map(String::from).collect(),
                        files_hash: None,
                        force: k == "WORKDIR",
                    })
                    .collect(),
                    start_cmd: Some("sleep infinity".into()),
                    ..Default::default()
                },
                key: "k".into(),
            },
        ),
    ];
    for (name, req) in builds {
        c.write("build_helper", name, Input::default().bytes(&postcard::to_stdvec(&req).unwrap()));
    }
}

fn zmtp_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | 2);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

fn zmtp(c: &Corpus) {
    let mut greeting = vec![0u8; 64];
    greeting[0] = 0xff;
    greeting[9] = 0x7f;
    greeting[10] = 3;
    greeting[11] = 1;
    greeting[12..16].copy_from_slice(b"NULL");
    greeting[32] = 1;
    let ready = |socket_type: &[u8]| {
        let mut body = vec![5];
        body.extend_from_slice(b"READY");
        for (name, value) in [(&b"Socket-Type"[..], socket_type), (b"Identity", b"")] {
            body.push(name.len() as u8);
            body.extend_from_slice(name);
            body.extend_from_slice(&(value.len() as u32).to_be_bytes());
            body.extend_from_slice(value);
        }
        body
    };
    for (name, socket, peer) in [
        ("dealer", 0u8, &b"ROUTER"[..]),
        ("sub", 1, b"XPUB"),
        ("req", 2, b"REP"),
    ] {
        let mut s = greeting.clone();
        zmtp_frame(&mut s, 4, &ready(peer));
        if socket == 2 {
            zmtp_frame(&mut s, 1, b"");
        }
        zmtp_frame(&mut s, 1, b"kernel.x.status");
        zmtp_frame(&mut s, 1, DELIMITER);
        zmtp_frame(&mut s, 0, &[b'x'; 300]);
        zmtp_frame(&mut s, 4, b"\x04PING\x00\x10ctx");
        zmtp_frame(&mut s, 4, b"\x05ERROR\x04oops");
        c.write(
            "zmtp",
            name,
            Input::default()
                .byte(1)
                .byte(socket)
                .byte(0)
                .byte(5)
                .bytes(&s),
        );
    }
    let loopback = Input::default()
        .byte(0)
        .byte(3)
        .byte(1)
        .byte(3)
        .byte(1)
        .field(b"<IDS|MSG>", 300)
        .field(b"{}", 300)
        .byte(0)
        .field(&[7; 280], 300)
        .byte(2)
        .field(b"", 300)
        .field(b"a", 300)
        .field(b"b", 300);
    c.write("zmtp", "loopback", loopback);
}

fn jupyter(c: &Corpus) {
    let key = b"a0436f6c-1916-498b-8eb9-e81ab9368e84";
    let mut client = Session::with_id(key, "husk", "client-session");
    let mut parent = client.execute_request("print(1)");
    parent.header.date = "2026-12-01T11:59:59.000000Z".into();
    let mut kernel = Session::with_id(key, "kernel", "kernel-session");
    let messages = [
        ("status", serde_json::json!({"execution_state": "busy"})),
        (
            "stream",
            serde_json::json!({"name": "stdout", "text": "1\n"}),
        ),
        (
            "execute_result",
            serde_json::json!({"execution_count": 1, "data": {"text/plain": "1", "application/json": {"a": [1.5, 2e300]}}, "metadata": {}}),
        ),
        (
            "error",
            serde_json::json!({"ename": "ValueError", "evalue": "x", "traceback": ["a", "b"]}),
        ),
        (
            "execute_reply",
            serde_json::json!({"status": "ok", "execution_count": 1}),
        ),
        (
            "kernel_info_reply",
            serde_json::json!({"protocol_version": "5.3", "implementation": "ipython", "language_info": {"name": "python"}}),
        ),
    ];
    for (msg_type, content) in messages {
        let mut m = kernel.message(msg_type, content);
        m.identities = vec![format!("kernel.x.{msg_type}").into_bytes()];
        m.parent_header = Some(parent.header.clone());
        m.buffers = vec![b"buf".to_vec()];
        // A fixed date, so the seeds are the same each time they are written.
        m.header.date = "2026-12-01T12:00:00.000000Z".into();
        let frames = m.encode(&Signer::new(key));
        let at = frames.iter().position(|f| f == DELIMITER).unwrap();
        let mut input = Input::default()
            .field(key, 40)
            .byte(0)
            .byte(1)
            .field(&frames[0], 16);
        for part in &frames[at + 2..at + 6] {
            input = input.field(part, 255);
        }
        input = input.byte(1).field(&frames[at + 6], 32);
        c.write("jupyter_wire", msg_type, input);
    }
}

fn dns(c: &Corpus) {
    use husk_net::dns::wire;
    let q = wire::query(0x1234, "Example.COM", wire::TYPE_A).unwrap();
    c.write("dns", "query", Input::default().byte(1).bytes(&q));
    // An answer: a CNAME to a compressed name, then two A records and an AAAA.
    let mut r = q.clone();
    r[2] |= 0x80;
    r[7] = 4;
    let name_ptr = [0xc0, 12];
    let mut rr = |name: &[u8], rtype: u16, data: &[u8]| {
        r.extend_from_slice(name);
        r.extend_from_slice(&rtype.to_be_bytes());
        r.extend_from_slice(&1u16.to_be_bytes());
        r.extend_from_slice(&300u32.to_be_bytes());
        r.extend_from_slice(&(data.len() as u16).to_be_bytes());
        r.extend_from_slice(data);
    };
    let cname_at = q.len() + 12;
    rr(&name_ptr, wire::TYPE_CNAME, b"\x03www\xc0\x0c");
    let target = [0xc0, cname_at as u8];
    rr(&target, wire::TYPE_A, &[93, 184, 216, 34]);
    rr(&target, wire::TYPE_A, &[10, 0, 0, 1]);
    rr(
        &target,
        wire::TYPE_AAAA,
        &[0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
    );
    c.write("dns", "answer", Input::default().byte(1).bytes(&r));
    let mut odd = wire::query(7, "a-b_c.d", wire::TYPE_AAAA).unwrap();
    odd[2] = 0x28; // opcode 5 (UPDATE)
    c.write("dns", "update-query", Input::default().byte(1).bytes(&odd));
    c.write(
        "dns",
        "build",
        Input::default()
            .byte(0)
            .byte(0x12)
            .byte(0x34)
            .byte(1)
            .field(b"Sub.Example.org.", 300),
    );
}

/// E2B's `network.rules` as a create sends them (after the byte that picks the secrets' value).
fn net_rules(c: &Corpus) {
    let seeds: [(&str, &[u8]); 3] = [
        (
            "secret",
            br#"{"api.example.com":[{"transform":{"headers":{"Authorization":"Bearer ${e2b.secrets.openai}"}}}]}"#,
        ),
        (
            "wildcard-two-rules",
            br#"{"*.Example.org.":[{"transform":{"headers":{"X-A":"1"}}},{"transform":{"headers":{"x-a":"2${e2b.secrets.k}"}}}],"b.example":[{}]}"#,
        ),
        ("bad", br#"{"10.0.0.1":[{"transform":{"headers":{"Host":"x","y":"${e2b.identity.tokens.t}"}}}]}"#),
    ];
    for (name, json) in seeds {
        c.write("net_rules", name, Input::default().byte(0).bytes(json));
        c.write("net_rules", &format!("{name}-crlf"), Input::default().byte(2).bytes(json));
    }
}

fn sniff(c: &Corpus) {
    c.write(
        "sniff",
        "http",
        Input::default().byte(1).byte(2).bytes(
            b"GET /x HTTP/1.1\r\nUser-Agent: t\r\nHost: Example.COM:8080\r\nAccept: */*\r\n\r\n",
        ),
    );
    c.write(
        "sniff",
        "http-v6",
        Input::default()
            .byte(3)
            .byte(4)
            .bytes(b"POST / HTTP/1.0\r\nhost: [2001:DB8::1]:443\r\n\r\nbody"),
    );
    // A ClientHello with an SNI among other extensions, in two records.
    let mut exts = vec![0x00, 0x2b, 0x00, 0x03, 0x02, 0x03, 0x04];
    let name = b"api.example.com";
    let mut list = vec![0];
    list.extend_from_slice(&(name.len() as u16).to_be_bytes());
    list.extend_from_slice(name);
    exts.extend_from_slice(&[0, 0]);
    exts.extend_from_slice(&((list.len() + 2) as u16).to_be_bytes());
    exts.extend_from_slice(&(list.len() as u16).to_be_bytes());
    exts.extend_from_slice(&list);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7; 32]);
    body.push(32);
    body.extend_from_slice(&[9; 32]);
    body.extend_from_slice(&[0, 4, 0x13, 1, 0x13, 2, 1, 0]);
    body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
    body.extend_from_slice(&exts);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut records = Vec::new();
    for chunk in hs.chunks(60) {
        records.extend_from_slice(&[0x16, 3, 1]);
        records.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
        records.extend_from_slice(chunk);
    }
    c.write(
        "sniff",
        "tls",
        Input::default().byte(5).byte(6).bytes(&records),
    );
}

/// A PAX record: `<length> <key>=<value>\n`, the length counting itself.
fn pax(key: &str, value: &str) -> String {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while len.to_string().len() + body.len() != len {
        len = len.to_string().len() + body.len();
    }
    format!("{len}{body}")
}

fn add(
    b: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    path: &str,
    link: Option<&str>,
    data: &[u8],
    mode: u32,
) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_mtime(1_700_000_000);
    if let Some(l) = link {
        h.set_link_name(l).unwrap();
    }
    b.append_data(&mut h, path, data).unwrap();
}

fn tars(c: &Corpus) {
    use tar::EntryType as T;
    let mut b = tar::Builder::new(Vec::new());
    add(&mut b, T::Directory, "dir/", None, b"", 0o755);
    add(&mut b, T::Regular, "dir/a.txt", None, b"alpha\n", 0o644);
    add(
        &mut b,
        T::Regular,
        "run.sh",
        None,
        b"#!/bin/sh\necho hi\n",
        0o4755,
    );
    add(&mut b, T::Symlink, "dir/link", Some("a.txt"), b"", 0o777);
    add(&mut b, T::Symlink, "up", Some("../dir"), b"", 0o777);
    add(&mut b, T::Link, "dir/hard", Some("dir/a.txt"), b"", 0o644);
    add(
        &mut b,
        T::Regular,
        &format!("long/{}", "n".repeat(150)),
        None,
        b"long name",
        0o600,
    );
    add(&mut b, T::Regular, "dir/.wh.gone", None, b"", 0o644);
    add(&mut b, T::Regular, ".wh..wh..opq", None, b"", 0o644);
    add(&mut b, T::Fifo, "fifo", None, b"", 0o644);
    let records = [
        pax("path", "dir/from-pax-record.txt"),
        pax("SCHILY.xattr.user.k", "v"),
    ]
    .concat();
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(T::XHeader);
    h.set_size(records.len() as u64);
    b.append_data(&mut h, "PaxHeaders/x", records.as_bytes())
        .unwrap();
    add(&mut b, T::Regular, "short", None, b"renamed by PAX", 0o644);
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar).unwrap();
    let gz = gz.finish().unwrap();
    for target in ["tar_import", "oci_layer", "build_context"] {
        c.write(target, "raw", Input::default().byte(1).bytes(&tar));
        if target != "oci_layer" {
            // The raw gzip goes through the importers' own detection.
            c.write(target, "raw-gzip", Input::default().byte(1).bytes(&gz));
        }
        c.write(
            target,
            "built",
            Input::default().bytes(&[0, 6, 0, 0, 1, 2, 2, 0, 3, 0, 1, 1, 7, 0, 4, 3, 1, 2]),
        );
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let c = Corpus { root: &root };
    connect(&c);
    multipart(&c);
    files(&c);
    agent(&c);
    spawner(&c);
    helpers(&c);
    zmtp(&c);
    jupyter(&c);
    dns(&c);
    sniff(&c);
    net_rules(&c);
    tars(&c);
    println!("seeds written under {}", root.display());
}
