//! End to end against a real ipykernel: the sans-I/O codecs driven by blocking std sockets.
//!
//! Needs the pinned venv that `scripts/jupyter-test-venv` creates (it is run from here, and
//! reuses the venv when it exists). If it cannot be created, this test FAILS: a code interpreter
//! whose kernel protocol was never exercised must not pass silently.

mod common;

use common::{start_kernel, venv_python};
use husk_jupyter::connection::{Channel, ConnectionInfo};
use husk_jupyter::wire::{ExecuteReply, ExecutionState, Iopub, KernelInfoReply, Message, Session};
use husk_jupyter::zmtp::{Config, Connection, Event, PeerInfo, SocketType};
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One kernel socket: a blocking TCP stream driving the sans-I/O codec.
struct Socket {
    name: &'static str,
    stream: TcpStream,
    conn: Connection,
    /// What the kernel said in its handshake, once it has.
    peer: Option<PeerInfo>,
}

impl Socket {
    /// Connects, retrying while the kernel has not bound its ports yet.
    fn connect(
        name: &'static str,
        info: &ConnectionInfo,
        channel: Channel,
        socket_type: SocketType,
        deadline: Instant,
    ) -> Socket {
        let addr = info.addr(channel).unwrap();
        let stream = loop {
            match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                Ok(s) => break s,
                Err(e) if Instant::now() < deadline => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => panic!("{name}: kernel never listened on {addr}: {e}"),
            }
        };
        stream.set_nodelay(true).unwrap();
        let mut config = Config::new(socket_type);
        config.identity = format!("husk-{name}").into_bytes();
        let mut socket = Socket {
            name,
            stream,
            conn: Connection::new(config).unwrap(),
            peer: None,
        };
        socket.flush();
        socket
    }

    fn flush(&mut self) {
        while self.conn.wants_write() {
            let n = self.stream.write(self.conn.output()).unwrap();
            self.conn.consume_output(n);
        }
    }

    fn send(&mut self, session: &Session, msg: &Message) {
        let frames = session.encode(msg);
        let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        self.conn.send(&parts).unwrap();
        self.flush();
    }

    /// The next message; the handshake's Ready event is checked and skipped.
    fn recv_frames(&mut self, deadline: Instant) -> Vec<Vec<u8>> {
        let mut buf = [0u8; 64 * 1024];
        loop {
            while let Some(event) = self.conn.next_event() {
                match event {
                    Event::Ready(peer) => {
                        // Pending sends (subscriptions) are released on Ready.
                        self.flush();
                        self.peer = Some(peer);
                    }
                    Event::Message(parts) => return parts,
                }
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("{}: timed out waiting for a message", self.name));
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.stream.read(&mut buf) {
                Ok(0) => panic!("{}: kernel closed the connection", self.name),
                Ok(n) => {
                    self.conn.receive(&buf[..n]).unwrap();
                    // Replies the codec makes itself (PONG) go out at once.
                    self.flush();
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("{}: read: {e}", self.name),
            }
        }
    }

    fn recv(&mut self, session: &Session, deadline: Instant) -> Message {
        let frames = self.recv_frames(deadline);
        session
            .decode(frames)
            .unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }
}

struct Client {
    session: Session,
    shell: Socket,
    iopub: Socket,
    control: Socket,
}

impl Client {
    /// iopub messages caused by `request`, up to and including its `idle` status.
    fn iopub_until_idle(&mut self, request: &Message, timeout: Duration) -> Vec<Iopub> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let msg = self.iopub.recv(&self.session, deadline);
            if msg.parent_msg_id() != Some(request.header.msg_id.as_str()) {
                continue;
            }
            let parsed = Iopub::parse(&msg).unwrap();
            let idle = parsed == Iopub::Status(ExecutionState::Idle);
            out.push(parsed);
            if idle {
                return out;
            }
        }
    }

    fn shell_reply(&mut self, request: &Message, timeout: Duration) -> Message {
        let deadline = Instant::now() + timeout;
        loop {
            let msg = self.shell.recv(&self.session, deadline);
            if msg.parent_msg_id() == Some(request.header.msg_id.as_str()) {
                return msg;
            }
        }
    }

    fn execute(&mut self, code: &str, timeout: Duration) -> (Message, Vec<Iopub>, ExecuteReply) {
        let request = self.session.execute_request(code);
        self.shell.send(&self.session, &request);
        let iopub = self.iopub_until_idle(&request, timeout);
        let reply = self.shell_reply(&request, timeout);
        let reply = ExecuteReply::parse(&reply).unwrap();
        (request, iopub, reply)
    }
}

/// Joins consecutive stream chunks: ipykernel may split one print across messages.
fn merge_streams(events: Vec<Iopub>) -> Vec<Iopub> {
    let mut out: Vec<Iopub> = Vec::new();
    for event in events {
        if let (
            Some(Iopub::Stream { name, text }),
            Iopub::Stream {
                name: new_name,
                text: new_text,
            },
        ) = (out.last_mut(), &event)
        {
            if name == new_name {
                text.push_str(new_text);
                continue;
            }
        }
        out.push(event);
    }
    out
}

#[test]
fn ipykernel_end_to_end() {
    let python = venv_python();
    let info = ConnectionInfo::localhost("python3").unwrap();
    let kernel = start_kernel(&python, &info, "e2e");
    let start = Instant::now() + Duration::from_secs(60);

    let session = Session::new(info.key.as_bytes(), "husk").unwrap();
    let shell = Socket::connect("shell", &info, Channel::Shell, SocketType::Dealer, start);
    let mut iopub = Socket::connect("iopub", &info, Channel::Iopub, SocketType::Sub, start);
    let control = Socket::connect(
        "control",
        &info,
        Channel::Control,
        SocketType::Dealer,
        start,
    );
    iopub.conn.subscribe(b"").unwrap();
    let mut client = Client {
        session,
        shell,
        iopub,
        control,
    };

    // ipykernel's iopub is an XPUB that answers each subscription with `iopub_welcome`: once it
    // arrives, the subscription is in place and no output of ours can be lost (PUB/SUB drops
    // whatever is published before the subscription lands).
    // Startup output the kernel publishes may come first (the subscription can land while it is
    // still starting); it belongs to no request of ours.
    while client.iopub.recv(&client.session, start).msg_type() != "iopub_welcome" {}
    assert!(client.iopub.conn.is_ready());
    // pyzmq's libzmq 4.3.5 speaks ZMTP 3.1, so the subscription above went out as a SUBSCRIBE
    // command (3.0 peers get the message form, covered by the unit tests).
    let peer = client.iopub.peer.as_ref().unwrap();
    assert_eq!((peer.version, peer.socket_type.as_str()), ((3, 1), "XPUB"));

    let request = client.session.kernel_info_request();
    client.shell.send(&client.session, &request);
    let reply = client.shell_reply(&request, Duration::from_secs(60));
    let kernel_info = KernelInfoReply::parse(&reply).unwrap();
    assert_eq!(kernel_info.status, "ok");
    assert_eq!(kernel_info.language_info.name, "python");
    assert!(kernel_info.protocol_version.starts_with("5."));
    assert_eq!(kernel_info.implementation, "ipython");
    assert_eq!(client.shell.peer.as_ref().unwrap().socket_type, "ROUTER");

    // The heartbeat echoes (ipykernel runs a ROUTER-to-itself queue; REQ adds and strips the
    // empty delimiter).
    let mut hb = Socket::connect("hb", &info, Channel::Heartbeat, SocketType::Req, start);
    hb.conn.send(&[b"ping"]).unwrap();
    hb.flush();
    assert_eq!(hb.recv_frames(start), vec![b"ping".to_vec()]);

    // A statement with output and a value.
    let timeout = Duration::from_secs(30);
    let (request, events, reply) = client.execute("x = 1+1\nprint('hi')\nx", timeout);
    assert_eq!(reply, ExecuteReply::Ok { execution_count: 1 });
    let events = merge_streams(events);
    let [Iopub::Status(ExecutionState::Busy), Iopub::ExecuteInput {
        code,
        execution_count: 1,
    }, Iopub::Stream { name, text }, Iopub::ExecuteResult {
        execution_count: 1,
        data,
        ..
    }, Iopub::Status(ExecutionState::Idle)] = events.as_slice()
    else {
        panic!("unexpected iopub sequence: {events:#?}");
    };
    assert_eq!(code, &request.content["code"]);
    assert_eq!((name.as_str(), text.as_str()), ("stdout", "hi\n"));
    assert_eq!(data["text/plain"], "2");

    // State persists, and an error comes back with its traceback on both channels.
    let (_, events, reply) = client.execute("y = x\n1/0", timeout);
    let ExecuteReply::Error {
        execution_count: Some(2),
        error,
    } = &reply
    else {
        panic!("unexpected reply: {reply:?}");
    };
    assert_eq!(error.ename, "ZeroDivisionError");
    assert_eq!(error.evalue, "division by zero");
    let errors: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Iopub::Error(e) => Some(e),
            _ => None,
        })
        .collect();
    assert_eq!(errors.len(), 1, "{events:#?}");
    assert_eq!(errors[0].ename, "ZeroDivisionError");
    assert!(
        errors[0]
            .traceback
            .iter()
            .any(|line| line.contains("1/0") || line.contains("ZeroDivisionError")),
        "{:?}",
        errors[0].traceback
    );
    assert!(matches!(
        events.as_slice(),
        [
            Iopub::Status(ExecutionState::Busy),
            ..,
            Iopub::Status(ExecutionState::Idle)
        ]
    ));
    let (_, _, reply) = client.execute("y", timeout);
    assert_eq!(reply, ExecuteReply::Ok { execution_count: 3 });

    // A long sleep, interrupted on the control channel.
    let request = client
        .session
        .execute_request("import time; time.sleep(30)");
    client.shell.send(&client.session, &request);
    let deadline = Instant::now() + timeout;
    loop {
        let msg = client.iopub.recv(&client.session, deadline);
        if msg.parent_msg_id() == Some(request.header.msg_id.as_str())
            && msg.msg_type() == "execute_input"
        {
            break;
        }
    }
    // Let the code reach the sleep; an earlier interrupt would also raise KeyboardInterrupt,
    // but this exercises the interesting case: a kernel blocked in a system call.
    std::thread::sleep(Duration::from_millis(500));
    let interrupted_at = Instant::now();
    let interrupt = client.session.interrupt_request();
    client.control.send(&client.session, &interrupt);
    let reply = client.control.recv(&client.session, deadline);
    assert_eq!(reply.msg_type(), "interrupt_reply");
    assert_eq!(reply.content["status"], "ok");
    let events = client.iopub_until_idle(&request, timeout);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Iopub::Error(e) if e.ename == "KeyboardInterrupt")),
        "{events:#?}"
    );
    let reply = ExecuteReply::parse(&client.shell_reply(&request, timeout)).unwrap();
    assert!(
        matches!(&reply, ExecuteReply::Error { error, .. } if error.ename == "KeyboardInterrupt"),
        "{reply:?}"
    );
    assert!(
        interrupted_at.elapsed() < Duration::from_secs(10),
        "the interrupt took {:?}",
        interrupted_at.elapsed()
    );

    // The kernel survives the interrupt.
    let (_, _, reply) = client.execute("y + 1", timeout);
    assert_eq!(reply, ExecuteReply::Ok { execution_count: 5 });

    // A clean shutdown, then the guard kills the process whatever happened.
    let shutdown = client.session.shutdown_request(false);
    client.control.send(&client.session, &shutdown);
    let reply = client.control.recv(&client.session, deadline);
    assert_eq!(reply.msg_type(), "shutdown_reply");
    drop(kernel);
}
