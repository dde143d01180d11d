//! A poll(2)-friendly client for one kernel: the codecs of [`crate::zmtp`] and [`crate::wire`]
//! over three non-blocking TCP streams, turned into the events a code interpreter reports.
//!
//! The caller owns the loop: it puts [`KernelClient::fds`] into its poll set, hands readiness to
//! [`KernelClient::on_ready`], and takes [`KernelEvent`]s from [`KernelClient::next_event`].
//! Nothing blocks except [`KernelClient::connect`] (a loopback connect, which is accepted or
//! refused at once; it is bounded by a short timeout all the same), and no thread or signal is
//! used. The client's timers run when the caller calls [`KernelClient::tick`], by
//! [`KernelClient::deadline`].
//!
//! Channels: shell (DEALER) carries `kernel_info` and `execute` requests and their replies; iopub
//! (SUB, subscribed to everything) carries the output; control (DEALER) carries `interrupt` and
//! `shutdown`. stdin is not connected (requests are sent with `allow_stdin: false`) and the
//! heartbeat is not needed: the agent supervises the kernel process itself, and a closed socket
//! is reported as [`KernelEvent::Dead`].
//!
//! Execution: one at a time (the interpreter's rule, enforced here). Its events come in the order
//! `ExecutionCount`, output (`Stdout`, `Stderr`, `Result`, `Error` as the kernel published them),
//! then `Done` once both the shell `execute_reply` and the iopub `status: idle` of the request
//! have arrived: Jupyter orders messages within a channel only, so the reply may overtake the last
//! output or follow the idle status. A kernel that goes idle and sends no reply within
//! [`REPLY_AFTER_IDLE`] ended the request without one: ipykernel 7 does when a `KeyboardInterrupt`
//! lands after its handler began but before the code runs (an interrupt sent just as the
//! execution starts, a third of the time in a tight loop). The execution then ends with an
//! [`ABORTED_ERROR`] and `Done { reply: Aborted }`, instead of waiting for a reply that never
//! comes.
//!
//! Memory is bounded: frames and messages by the ZMTP [`Limits`](crate::zmtp::Limits); queued
//! events by [`ClientLimits`]. Above the high-water marks the client stops reading (the kernel's
//! own buffers then fill up, and its iopub drops messages as Jupyter kernels do for slow
//! subscribers); past the hard caps, which the high-water marks keep out of reach for a caller
//! that polls with [`KernelClient::fds`], the kernel is declared dead rather than buffered.
//!
//! Everything the kernel sends is treated as hostile (it runs next to the code it executes): any
//! framing, signature or protocol error ends the client with [`KernelEvent::Dead`].

use crate::connection::{Channel, ConnectionError, ConnectionInfo};
use crate::wire::{
    ExecuteReply, ExecuteRequest, ExecutionState, Iopub, KernelInfoReply, Message, MimeBundle,
    Session, WireError,
};
use crate::zmtp::{self, Config, Connection, SocketType, ZmtpError};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// How long [`KernelClient::connect`] may block per socket. Loopback connects complete or are
/// refused immediately; this only bounds a pathological case (a full accept backlog).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// How long an execution whose kernel has gone idle waits for its `execute_reply` before it is
/// taken as lost. The kernel sends the reply before it publishes its idle status, on another
/// socket of the same process, so a reply still on its way arrives within milliseconds.
pub const REPLY_AFTER_IDLE: Duration = Duration::from_secs(2);

/// The error's name that ends an execution whose kernel went idle without a reply.
pub const ABORTED_ERROR: &str = "ExecutionAborted";

/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 * 1024;

/// What one queued event is charged on top of the bytes of the message that caused it.
const EVENT_OVERHEAD: usize = 128;

/// Identifies one [`KernelClient::execute`] call in the events it causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExecId(pub u64);

/// What one execution reports, in order (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub enum ExecEvent {
    /// The execution count the kernel gave the request (from `execute_input`, or from the reply
    /// for kernels that do not publish their input). Always first, at most once.
    ExecutionCount(u64),
    /// `date` (here and in `Stderr` and `Result`) is the message header's, as the kernel wrote
    /// it (ISO 8601 by the spec; unchecked).
    Stdout {
        text: String,
        date: String,
    },
    Stderr {
        text: String,
        date: String,
    },
    /// `execute_result` (the main result, `is_main`) or `display_data`.
    Result {
        is_main: bool,
        data: MimeBundle,
        date: String,
    },
    /// The iopub `error`; or, for a kernel that published none, the error of the reply.
    Error {
        name: String,
        value: String,
        traceback: Vec<String>,
    },
    /// The last event of the execution: the shell reply, with the iopub `idle` also seen.
    Done {
        reply: ExecuteReply,
    },
}

/// Everything a [`KernelClient`] reports.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelEvent {
    /// The kernel answered `kernel_info` and iopub is known to be subscribed (it delivered a
    /// message: `iopub_welcome` or a status). Once per client; executions may start.
    Ready(Box<KernelInfoReply>),
    Exec {
        id: ExecId,
        event: ExecEvent,
    },
    /// The control channel's answer to [`KernelClient::interrupt`].
    InterruptReply {
        ok: bool,
    },
    /// The control channel's answer to [`KernelClient::shutdown`].
    ShutdownReply {
        ok: bool,
    },
    /// The last event: a socket closed or failed, or the kernel broke the protocol. A running
    /// execution gets no `Done`. The caller drops the client (and deals with the process).
    Dead(DeadReason),
}

/// Why a client is dead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeadReason {
    #[error("the kernel closed its {0:?} socket")]
    Closed(Channel),
    #[error("{0:?} socket: {1}")]
    Io(Channel, String),
    #[error("{0:?} socket: {1}")]
    Zmtp(Channel, ZmtpError),
    #[error("{0:?} socket: {1}")]
    Wire(Channel, String),
    #[error("more than {events} events or {bytes} bytes of events queued")]
    Overflow { events: usize, bytes: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connection file: {0}")]
    Connection(#[from] ConnectionError),
    #[error("cannot connect to the kernel's {0:?} socket: {1}")]
    Connect(Channel, std::io::Error),
    #[error(transparent)]
    Zmtp(#[from] ZmtpError),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("execution {0:?} is still running; one execution at a time")]
    Busy(ExecId),
    #[error("the kernel is not ready yet")]
    NotReady,
    #[error("the kernel is dead")]
    Dead,
}

/// Bounds on what the client queues for its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// Per-socket ZMTP bounds (frame, message, parts).
    pub zmtp: zmtp::Limits,
    /// Reading stops while at least this many bytes of events are queued...
    pub high_water_bytes: usize,
    /// ...or at least this many events.
    pub high_water_events: usize,
    /// Past this many queued bytes the kernel is declared dead. Must leave room above the high
    /// water for what one read can complete: a message of up to `zmtp.max_message` bytes.
    pub max_bytes: usize,
    /// Past this many queued events the kernel is declared dead.
    pub max_events: usize,
}

impl Default for ClientLimits {
    fn default() -> Self {
        let zmtp = zmtp::Limits::default();
        let high_water_bytes = 16 << 20;
        let high_water_events = 4096;
        ClientLimits {
            zmtp,
            high_water_bytes,
            high_water_events,
            // One read of READ_CHUNK bytes completes at most one large message plus as many
            // small ones as fit in the chunk.
            max_bytes: high_water_bytes + zmtp.max_message as usize + 2 * READ_CHUNK,
            max_events: high_water_events + READ_CHUNK,
        }
    }
}

/// One fd to poll, with what the client wants of it. Poll it for POLLIN when `read`, POLLOUT
/// when `write`; leave an entry with neither out of the poll set (a hung-up socket would
/// otherwise wake poll at once, again and again, while the events are not drained).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelFd {
    pub fd: RawFd,
    pub read: bool,
    pub write: bool,
}

const SHELL: usize = 0;
const IOPUB: usize = 1;
const CONTROL: usize = 2;

#[derive(Debug)]
struct Link {
    channel: Channel,
    stream: TcpStream,
    conn: Connection,
}

#[derive(Debug)]
struct Execution {
    id: ExecId,
    msg_id: String,
    reply: Option<ExecuteReply>,
    idle: bool,
    count_sent: bool,
    error_sent: bool,
    /// An `execute_result` or `display_data` of it was seen.
    result_seen: bool,
    /// Reply and idle are in, but results may still come until then (see
    /// [`KernelClient::set_settle`]).
    settle_until: Option<Instant>,
    /// Idle is in but the reply is not: it is taken as lost at this time ([`REPLY_AFTER_IDLE`]).
    reply_until: Option<Instant>,
}

/// A client of one kernel. See the module documentation.
#[derive(Debug)]
pub struct KernelClient {
    session: Session,
    links: [Link; 3],
    limits: ClientLimits,
    events: VecDeque<(KernelEvent, usize)>,
    queued_bytes: usize,
    kernel_info: Option<KernelInfoReply>,
    iopub_seen: bool,
    ready: bool,
    current: Option<Execution>,
    next_exec: u64,
    dead: bool,
    /// How long an execution without a result yet waits after its reply and idle.
    settle: Duration,
    /// Read buffer, kept between calls.
    buf: Vec<u8>,
}

impl KernelClient {
    /// Connects shell, iopub and control, subscribes iopub to everything and sends a
    /// `kernel_info_request`; [`KernelEvent::Ready`] follows once the kernel has answered.
    ///
    /// Fails (typically with `ConnectionRefused`) while the kernel has not bound its ports yet:
    /// the caller retries on its own timer.
    pub fn connect(info: &ConnectionInfo) -> Result<Self, ClientError> {
        Self::connect_with(info, ClientLimits::default())
    }

    pub fn connect_with(info: &ConnectionInfo, limits: ClientLimits) -> Result<Self, ClientError> {
        info.validate()?;
        let session = Session::new(info.key.as_bytes(), "husk")?;
        let link = |channel: Channel, socket_type: SocketType| -> Result<Link, ClientError> {
            let addr = info.addr(channel)?;
            let stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                .map_err(|e| ClientError::Connect(channel, e))?;
            let setup = stream
                .set_nodelay(true)
                .and_then(|()| stream.set_nonblocking(true));
            setup.map_err(|e| ClientError::Connect(channel, e))?;
            // No identity: the ROUTER picks one. A fixed one would be refused while a previous
            // connection with it lingers (libzmq drops duplicate identities).
            let mut config = Config::new(socket_type);
            config.limits = limits.zmtp;
            Ok(Link {
                channel,
                stream,
                conn: Connection::new(config)?,
            })
        };
        let links = [
            link(Channel::Shell, SocketType::Dealer)?,
            link(Channel::Iopub, SocketType::Sub)?,
            link(Channel::Control, SocketType::Dealer)?,
        ];
        let mut client = KernelClient {
            session,
            links,
            limits,
            events: VecDeque::new(),
            queued_bytes: 0,
            kernel_info: None,
            iopub_seen: false,
            ready: false,
            current: None,
            next_exec: 1,
            dead: false,
            settle: Duration::ZERO,
            buf: vec![0; READ_CHUNK],
        };
        client.links[IOPUB].conn.subscribe(b"")?;
        client.kernel_info()?;
        for i in 0..client.links.len() {
            client.flush(i);
        }
        Ok(client)
    }

    /// The fds to poll and what for; empty once dead.
    pub fn fds(&self) -> Vec<KernelFd> {
        if self.dead {
            return Vec::new();
        }
        let read = self.queued_bytes < self.limits.high_water_bytes
            && self.events.len() < self.limits.high_water_events;
        self.links
            .iter()
            .map(|l| KernelFd {
                fd: l.stream.as_raw_fd(),
                read,
                write: l.conn.wants_write(),
            })
            .collect()
    }

    /// Handles readiness of one of [`Self::fds`]: `readable` for POLLIN, POLLHUP or POLLERR,
    /// `writable` for POLLOUT. Never blocks. Unknown fds are ignored.
    pub fn on_ready(&mut self, fd: RawFd, readable: bool, writable: bool) {
        let Some(i) = self.links.iter().position(|l| l.stream.as_raw_fd() == fd) else {
            return;
        };
        if writable {
            self.flush(i);
        }
        if readable {
            self.read(i);
            // Handshake replies, PONGs and subscriptions released by the handshake.
            self.flush(i);
        }
    }

    /// The next event, if any.
    pub fn next_event(&mut self) -> Option<KernelEvent> {
        let (event, cost) = self.events.pop_front()?;
        self.queued_bytes -= cost;
        Some(event)
    }

    /// Runs `code` with the interpreter's defaults (see [`ExecuteRequest::new`]).
    pub fn execute(&mut self, code: &str) -> Result<ExecId, ClientError> {
        self.execute_request(&ExecuteRequest::new(code))
    }

    /// Sends an `execute_request`; its events carry the returned id.
    pub fn execute_request(&mut self, request: &ExecuteRequest) -> Result<ExecId, ClientError> {
        if self.dead {
            return Err(ClientError::Dead);
        }
        if !self.ready {
            // Before iopub is known to be subscribed, output could be lost.
            return Err(ClientError::NotReady);
        }
        if let Some(current) = &self.current {
            return Err(ClientError::Busy(current.id));
        }
        let msg = self.session.execute(request);
        self.send(SHELL, &msg)?;
        let id = ExecId(self.next_exec);
        self.next_exec += 1;
        self.current = Some(Execution {
            id,
            msg_id: msg.header.msg_id,
            reply: None,
            idle: false,
            count_sent: false,
            error_sent: false,
            result_seen: false,
            settle_until: None,
            reply_until: None,
        });
        Ok(id)
    }

    /// Lets an execution that has no result yet wait `settle` after its reply and idle
    /// before it ends, for a result the kernel publishes after its idle status (which the
    /// protocol forbids; Deno's kernel does it in about one execution in twenty). An
    /// execution that has a result ends at once. Zero (the default) waits for nothing.
    pub fn set_settle(&mut self, settle: Duration) {
        self.settle = settle;
    }

    /// Ends an execution whose settle time is over ([`Self::set_settle`]), or whose kernel went
    /// idle and sent no reply within [`REPLY_AFTER_IDLE`].
    pub fn tick(&mut self, now: Instant) {
        let Some(current) = &mut self.current else {
            return;
        };
        if current.settle_until.is_some_and(|t| now >= t) {
            self.finish(EVENT_OVERHEAD);
        } else if current.reply.is_none() && current.reply_until.is_some_and(|t| now >= t) {
            // The kernel ended the request without a reply (see the module documentation).
            current.reply = Some(ExecuteReply::Aborted);
            let (id, error_sent) = (current.id, current.error_sent);
            if !error_sent {
                let event = ExecEvent::Error {
                    name: ABORTED_ERROR.into(),
                    value: "the kernel went idle without replying to this execution: it was \
                            interrupted before its code ran, or the kernel failed"
                        .into(),
                    traceback: Vec::new(),
                };
                self.push_exec(id, event, EVENT_OVERHEAD);
            }
            self.finish(EVENT_OVERHEAD);
        }
    }

    /// When [`Self::tick`] has something to do.
    pub fn deadline(&self) -> Option<Instant> {
        let current = self.current.as_ref()?;
        let lost = current.reply_until.filter(|_| current.reply.is_none());
        match (current.settle_until, lost) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The running execution, if any.
    pub fn running(&self) -> Option<ExecId> {
        self.current.as_ref().map(|c| c.id)
    }

    /// Sends `interrupt_request` on control ([`KernelEvent::InterruptReply`] answers it). The
    /// running execution then ends as usual, typically with a `KeyboardInterrupt` error.
    pub fn interrupt(&mut self) -> Result<(), ClientError> {
        let msg = self.session.interrupt_request();
        self.send(CONTROL, &msg)
    }

    /// Sends `shutdown_request` on control ([`KernelEvent::ShutdownReply`] answers it).
    pub fn shutdown(&mut self, restart: bool) -> Result<(), ClientError> {
        let msg = self.session.shutdown_request(restart);
        self.send(CONTROL, &msg)
    }

    /// Sends another `kernel_info_request`. [`Self::connect`] sends one; a kernel whose iopub
    /// does not greet subscribers (no `iopub_welcome`, unlike ipykernel 6+) publishes a status
    /// for each request, so re-sending on a timer until [`KernelEvent::Ready`] makes it ready.
    pub fn kernel_info(&mut self) -> Result<(), ClientError> {
        let msg = self.session.kernel_info_request();
        self.send(SHELL, &msg)
    }

    /// The latest `kernel_info_reply`.
    pub fn kernel_info_reply(&self) -> Option<&KernelInfoReply> {
        self.kernel_info.as_ref()
    }

    pub fn is_ready(&self) -> bool {
        self.ready && !self.dead
    }

    pub fn is_dead(&self) -> bool {
        self.dead
    }

    fn send(&mut self, i: usize, msg: &Message) -> Result<(), ClientError> {
        if self.dead {
            return Err(ClientError::Dead);
        }
        let frames = self.session.encode(msg);
        let parts: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        self.links[i].conn.send(&parts)?;
        self.flush(i);
        Ok(())
    }

    /// Writes what the codec holds until the socket would block.
    fn flush(&mut self, i: usize) {
        while !self.dead && self.links[i].conn.wants_write() {
            let link = &mut self.links[i];
            let reason = match link.stream.write(link.conn.output()) {
                Ok(0) => DeadReason::Closed(link.channel),
                Ok(n) => {
                    link.conn.consume_output(n);
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => DeadReason::Io(link.channel, e.to_string()),
            };
            self.die(reason);
        }
    }

    /// Reads until the socket would block or the event queue reaches its high water.
    fn read(&mut self, i: usize) {
        while !self.dead
            && self.queued_bytes < self.limits.high_water_bytes
            && self.events.len() < self.limits.high_water_events
        {
            let channel = self.links[i].channel;
            let n = match self.links[i].stream.read(&mut self.buf) {
                Ok(0) => return self.die(DeadReason::Closed(channel)),
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return self.die(DeadReason::Io(channel, e.to_string())),
            };
            if let Err(e) = self.links[i].conn.receive(&self.buf[..n]) {
                return self.die(DeadReason::Zmtp(channel, e));
            }
            while let Some(event) = self.links[i].conn.next_event() {
                if self.dead {
                    return;
                }
                let zmtp::Event::Message(frames) = event else {
                    // Ready: the codec has released what waited for the handshake.
                    continue;
                };
                let cost = frames.iter().map(Vec::len).sum::<usize>() + EVENT_OVERHEAD;
                let msg = match self.session.decode(frames) {
                    Ok(msg) => msg,
                    Err(e) => return self.die(DeadReason::Wire(channel, e.to_string())),
                };
                let handled = match i {
                    SHELL => self.on_shell(msg, cost),
                    IOPUB => self.on_iopub(msg, cost),
                    _ => self.on_control(msg, cost),
                };
                if let Err(e) = handled {
                    return self.die(DeadReason::Wire(channel, e.to_string()));
                }
            }
        }
    }

    fn is_current(&self, msg: &Message) -> bool {
        match (&self.current, msg.parent_msg_id()) {
            (Some(c), Some(parent)) => c.msg_id == parent,
            _ => false,
        }
    }

    fn on_shell(&mut self, msg: Message, cost: usize) -> Result<(), WireError> {
        match msg.msg_type() {
            "kernel_info_reply" => {
                let ours = msg
                    .parent_header
                    .as_ref()
                    .is_some_and(|h| h.session == self.session.id());
                if ours {
                    self.kernel_info = Some(KernelInfoReply::parse(&msg)?);
                    self.check_ready(cost);
                }
            }
            "execute_reply" if self.is_current(&msg) => {
                let reply = ExecuteReply::parse(&msg)?;
                let count = match &reply {
                    ExecuteReply::Ok { execution_count } => Some(*execution_count),
                    ExecuteReply::Error {
                        execution_count, ..
                    } => *execution_count,
                    ExecuteReply::Aborted => None,
                };
                let current = self.current.as_mut().expect("is_current");
                let id = current.id;
                let send_count = !current.count_sent && count.is_some();
                current.count_sent |= send_count;
                current.reply = Some(reply);
                if let (true, Some(n)) = (send_count, count) {
                    self.push_exec(id, ExecEvent::ExecutionCount(n), EVENT_OVERHEAD);
                }
                self.maybe_done(cost);
            }
            // Replies to requests of an earlier execution or another client.
            _ => {}
        }
        Ok(())
    }

    fn on_iopub(&mut self, msg: Message, cost: usize) -> Result<(), WireError> {
        if !self.iopub_seen {
            self.iopub_seen = true;
            self.check_ready(EVENT_OVERHEAD);
        }
        if !self.is_current(&msg) {
            // Startup output, iopub_welcome, other clients' requests.
            return Ok(());
        }
        let current = self.current.as_mut().expect("is_current");
        let id = current.id;
        let date = msg.header.date.clone();
        let event = match Iopub::parse(&msg)? {
            Iopub::ExecuteInput {
                execution_count, ..
            } => {
                if current.count_sent {
                    return Ok(());
                }
                current.count_sent = true;
                ExecEvent::ExecutionCount(execution_count)
            }
            Iopub::Stream { name, text } => match name.as_str() {
                "stdout" => ExecEvent::Stdout { text, date },
                "stderr" => ExecEvent::Stderr { text, date },
                _ => return Ok(()),
            },
            Iopub::ExecuteResult { data, .. } => {
                current.result_seen = true;
                ExecEvent::Result {
                    is_main: true,
                    data,
                    date,
                }
            }
            Iopub::DisplayData { data, .. } => {
                current.result_seen = true;
                ExecEvent::Result {
                    is_main: false,
                    data,
                    date,
                }
            }
            Iopub::Error(e) => {
                current.error_sent = true;
                ExecEvent::Error {
                    name: e.ename,
                    value: e.evalue,
                    traceback: e.traceback,
                }
            }
            Iopub::Status(ExecutionState::Idle) => {
                current.idle = true;
                // From the first idle: a kernel that repeats it does not push the end out.
                if current.reply.is_none() && current.reply_until.is_none() {
                    current.reply_until = Some(Instant::now() + REPLY_AFTER_IDLE);
                }
                self.maybe_done(cost);
                return Ok(());
            }
            // Busy, clear_output and update_display_data (nothing in the interpreter's stream
            // maps onto them), comms.
            _ => return Ok(()),
        };
        let settling = current.settle_until.is_some();
        self.push_exec(id, event, cost);
        if settling {
            // What it waited for came.
            self.finish(EVENT_OVERHEAD);
        }
        Ok(())
    }

    fn on_control(&mut self, msg: Message, cost: usize) -> Result<(), WireError> {
        let ok = msg.content.get("status").and_then(|s| s.as_str()) == Some("ok");
        match msg.msg_type() {
            "interrupt_reply" => self.push(KernelEvent::InterruptReply { ok }, cost),
            "shutdown_reply" => self.push(KernelEvent::ShutdownReply { ok }, cost),
            _ => {}
        }
        Ok(())
    }

    fn check_ready(&mut self, cost: usize) {
        if self.ready || !self.iopub_seen {
            return;
        }
        if let Some(info) = &self.kernel_info {
            self.ready = true;
            let event = KernelEvent::Ready(Box::new(info.clone()));
            self.push(event, cost);
        }
    }

    /// Ends the current execution once both its reply and its idle status are in.
    fn maybe_done(&mut self, cost: usize) {
        let Some(current) = &self.current else {
            return;
        };
        if !current.idle || current.reply.is_none() || current.settle_until.is_some() {
            return;
        }
        let ok = matches!(current.reply, Some(ExecuteReply::Ok { .. }));
        if ok && !current.result_seen && !self.settle.is_zero() {
            let until = Instant::now() + self.settle;
            self.current.as_mut().expect("checked").settle_until = Some(until);
            return;
        }
        self.finish(cost);
    }

    /// Ends the current execution (its reply is in).
    fn finish(&mut self, cost: usize) {
        let Some(current) = self.current.take() else {
            return;
        };
        let Some(reply) = current.reply else {
            self.current = Some(current);
            return;
        };
        if let (false, ExecuteReply::Error { error, .. }) = (current.error_sent, &reply) {
            let event = ExecEvent::Error {
                name: error.ename.clone(),
                value: error.evalue.clone(),
                traceback: error.traceback.clone(),
            };
            self.push_exec(current.id, event, cost);
        }
        self.push_exec(current.id, ExecEvent::Done { reply }, cost);
    }

    fn push_exec(&mut self, id: ExecId, event: ExecEvent, cost: usize) {
        self.push(KernelEvent::Exec { id, event }, cost);
    }

    fn push(&mut self, event: KernelEvent, cost: usize) {
        if self.dead {
            return;
        }
        if self.events.len() >= self.limits.max_events
            || self.queued_bytes + cost > self.limits.max_bytes
        {
            self.die(DeadReason::Overflow {
                events: self.limits.max_events,
                bytes: self.limits.max_bytes,
            });
            return;
        }
        self.queued_bytes += cost;
        self.events.push_back((event, cost));
    }

    /// Queues the final `Dead` (outside the caps: it is one small event) and stops all I/O.
    fn die(&mut self, reason: DeadReason) {
        if self.dead {
            return;
        }
        self.dead = true;
        self.current = None;
        self.events
            .push_back((KernelEvent::Dead(reason), EVENT_OVERHEAD));
        self.queued_bytes += EVENT_OVERHEAD;
    }
}

#[cfg(test)]
mod tests {
    //! The event logic, fed decoded messages directly (the sockets are idle local listeners);
    //! the wire and the poll loop are covered end to end in `tests/client.rs`.
    use super::*;
    use crate::wire::Header;
    use serde_json::json;
    use std::net::TcpListener;

    struct Fake {
        client: KernelClient,
        kernel: Session,
        // Held so the client's connections stay queued (never accepted).
        listeners: Vec<TcpListener>,
    }

    fn fake(limits: ClientLimits) -> Fake {
        let listeners: Vec<TcpListener> = (0..5)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let port = |i: usize| listeners[i].local_addr().unwrap().port();
        let info = ConnectionInfo {
            transport: "tcp".into(),
            ip: "127.0.0.1".into(),
            shell_port: port(0),
            iopub_port: port(1),
            stdin_port: port(2),
            control_port: port(3),
            hb_port: port(4),
            key: "k".into(),
            signature_scheme: "hmac-sha256".into(),
            kernel_name: String::new(),
        };
        let client = KernelClient::connect_with(&info, limits).unwrap();
        Fake {
            client,
            kernel: Session::with_id(b"k", "kernel", "kernel"),
            listeners,
        }
    }

    impl Fake {
        fn parent(&self, msg_id: &str) -> Header {
            Header {
                msg_id: msg_id.into(),
                session: self.client.session.id().into(),
                username: "husk".into(),
                date: String::new(),
                msg_type: "x".into(),
                version: "5.3".into(),
            }
        }

        fn reply(&mut self, parent: &str, msg_type: &str, content: serde_json::Value) -> Message {
            let mut msg = self.kernel.message(msg_type, content);
            msg.header.date = DATE.into();
            msg.parent_header = Some(self.parent(parent));
            msg
        }

        fn shell(&mut self, parent: &str, msg_type: &str, content: serde_json::Value) {
            let msg = self.reply(parent, msg_type, content);
            self.client.on_shell(msg, 100).unwrap();
        }

        fn iopub(&mut self, parent: &str, msg_type: &str, content: serde_json::Value) {
            let msg = self.reply(parent, msg_type, content);
            self.client.on_iopub(msg, 100).unwrap();
        }

        fn ready(&mut self) {
            self.shell(
                &format!("{}_1", self.client.session.id()),
                "kernel_info_reply",
                json!({"status": "ok", "protocol_version": "5.3",
                       "language_info": {"name": "python"}}),
            );
            assert!(!self.client.is_ready(), "iopub not seen yet");
            self.iopub("", "iopub_welcome", json!({}));
            assert!(self.client.is_ready());
            assert!(matches!(
                self.client.next_event(),
                Some(KernelEvent::Ready(i)) if i.language_info.name == "python"
            ));
        }

        fn current(&self) -> String {
            self.client.current.as_ref().unwrap().msg_id.clone()
        }

        /// [`Self::drain`] without the execution counts.
        fn drain_no_count(&mut self) -> Vec<ExecEvent> {
            let mut all = self.drain();
            all.retain(|e| !matches!(e, ExecEvent::ExecutionCount(_)));
            all
        }

        fn drain(&mut self) -> Vec<ExecEvent> {
            std::iter::from_fn(|| self.client.next_event())
                .map(|e| match e {
                    KernelEvent::Exec { event, .. } => event,
                    other => panic!("{other:?}"),
                })
                .collect()
        }
    }

    /// The header date of every message the fake kernel sends.
    const DATE: &str = "2026-01-02T03:04:05.678901Z";

    fn ok(n: u64) -> serde_json::Value {
        json!({"status": "ok", "execution_count": n})
    }

    #[test]
    fn execute_needs_ready_and_runs_one_at_a_time() {
        let mut f = fake(ClientLimits::default());
        assert!(matches!(f.client.execute("1"), Err(ClientError::NotReady)));
        f.ready();
        let id = f.client.execute("1").unwrap();
        assert!(matches!(f.client.execute("2"), Err(ClientError::Busy(b)) if b == id));
        assert_eq!(f.client.running(), Some(id));
    }

    #[test]
    fn an_execution_the_kernel_idles_without_replying_to_ends_aborted() {
        let mut f = fake(ClientLimits::default());
        f.ready();
        f.client.execute("x = 41").unwrap();
        let m = f.current();
        // No deadline while the kernel is busy: an execution may run for ever.
        f.iopub(&m, "status", json!({"execution_state": "busy"}));
        f.iopub(
            &m,
            "execute_input",
            json!({"execution_count": 1, "code": "x = 41"}),
        );
        assert_eq!(f.client.deadline(), None);
        // Idle, and the reply still on its way: it is waited for.
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        let at = f.client.deadline().expect("waiting for the reply");
        f.client.tick(at - Duration::from_millis(1));
        assert_eq!(f.drain(), [ExecEvent::ExecutionCount(1)]);
        f.shell(&m, "execute_reply", ok(1));
        assert_eq!(
            f.drain(),
            [ExecEvent::Done {
                reply: ExecuteReply::Ok { execution_count: 1 }
            }]
        );
        assert_eq!(f.client.deadline(), None);

        // Idle and no reply by the deadline (ipykernel 7 interrupted before the code ran):
        // the execution ends, and the next one runs.
        f.client.execute("time.sleep(30)").unwrap();
        let m = f.current();
        f.iopub(
            &m,
            "execute_input",
            json!({"execution_count": 2, "code": ""}),
        );
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        let at = f.client.deadline().expect("waiting for the reply");
        assert!(at <= Instant::now() + REPLY_AFTER_IDLE);
        // Idle again (a hostile kernel): the end is not pushed out.
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        assert_eq!(f.client.deadline(), Some(at));
        f.client.tick(at);
        let events = f.drain();
        assert!(
            matches!(events.as_slice(), [
                ExecEvent::ExecutionCount(2),
                ExecEvent::Error { name, traceback, .. },
                ExecEvent::Done { reply: ExecuteReply::Aborted },
            ] if name == ABORTED_ERROR && traceback.is_empty()),
            "{events:?}"
        );
        assert_eq!(f.client.running(), None);
        // Its reply, should it come after all, belongs to no execution.
        f.shell(&m, "execute_reply", ok(2));
        assert_eq!(f.drain(), []);
        f.client.execute("x").unwrap();
        let m = f.current();
        // An error the kernel published is not repeated.
        f.iopub(
            &m,
            "error",
            json!({"ename": "KeyboardInterrupt", "evalue": "", "traceback": []}),
        );
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        f.client.tick(f.client.deadline().unwrap());
        let events = f.drain();
        assert!(
            matches!(events.as_slice(), [
                ExecEvent::Error { name, .. },
                ExecEvent::Done { reply: ExecuteReply::Aborted },
            ] if name == "KeyboardInterrupt"),
            "{events:?}"
        );
    }

    #[test]
    fn a_result_after_idle_is_waited_for_when_the_kernel_settles() {
        let mut f = fake(ClientLimits::default());
        f.ready();
        f.client.set_settle(Duration::from_millis(50));
        // The result comes after reply and idle (Deno's kernel): still this execution's.
        f.client.execute("1 + 1").unwrap();
        let m = f.current();
        f.shell(&m, "execute_reply", ok(1));
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        let early = f.drain_no_count();
        assert!(
            !early.iter().any(|e| matches!(e, ExecEvent::Done { .. })),
            "not done: it may still publish: {early:?}"
        );
        assert!(f.client.deadline().is_some());
        f.iopub(
            &m,
            "execute_result",
            json!({"execution_count": 1, "data": {"text/plain": "2"}}),
        );
        let events = f.drain_no_count();
        assert!(
            matches!(
                events.as_slice(),
                [ExecEvent::Result { .. }, ExecEvent::Done { .. }]
            ),
            "{events:?}"
        );
        assert_eq!(f.client.running(), None);
        // No result at all: done once the settle time is over.
        f.client.execute("let x = 1").unwrap();
        let m = f.current();
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        f.shell(&m, "execute_reply", ok(2));
        let at = f.client.deadline().expect("settling");
        f.client.tick(at - Duration::from_millis(1));
        let early = f.drain_no_count();
        assert!(
            !early.iter().any(|e| matches!(e, ExecEvent::Done { .. })),
            "{early:?}"
        );
        f.client.tick(at);
        assert!(matches!(
            f.drain_no_count().as_slice(),
            [ExecEvent::Done { .. }]
        ));
        // A result before idle: done at once.
        f.client.execute("3").unwrap();
        let m = f.current();
        f.iopub(
            &m,
            "execute_result",
            json!({"execution_count": 3, "data": {"text/plain": "3"}}),
        );
        f.shell(&m, "execute_reply", ok(3));
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        assert!(matches!(
            f.drain_no_count().as_slice(),
            [ExecEvent::Result { .. }, ExecEvent::Done { .. }]
        ));
        assert_eq!(f.client.deadline(), None);
    }

    #[test]
    fn done_waits_for_both_reply_and_idle_in_either_order() {
        let mut f = fake(ClientLimits::default());
        f.ready();
        // The reply first, then output, then idle.
        f.client.execute("print(1)").unwrap();
        let m = f.current();
        f.iopub(&m, "status", json!({"execution_state": "busy"}));
        f.iopub(
            &m,
            "execute_input",
            json!({"code": "", "execution_count": 1}),
        );
        f.shell(&m, "execute_reply", ok(1));
        f.iopub(&m, "stream", json!({"name": "stdout", "text": "1\n"}));
        assert_eq!(f.client.running().map(|_| ()), Some(()));
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        assert_eq!(
            f.drain(),
            [
                ExecEvent::ExecutionCount(1),
                ExecEvent::Stdout {
                    text: "1\n".into(),
                    date: DATE.into()
                },
                ExecEvent::Done {
                    reply: ExecuteReply::Ok { execution_count: 1 }
                }
            ]
        );
        assert_eq!(f.client.running(), None);

        // Idle first, then the reply; messages of other requests are ignored.
        f.client.execute("2").unwrap();
        let m = f.current();
        f.iopub("other", "stream", json!({"name": "stdout", "text": "x"}));
        f.iopub(
            &m,
            "execute_input",
            json!({"code": "", "execution_count": 2}),
        );
        f.iopub(
            &m,
            "execute_result",
            json!({"execution_count": 2, "data": {"text/plain": "2"}}),
        );
        f.iopub(&m, "display_data", json!({"data": {"text/html": "<b>"}}));
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        f.shell("other", "execute_reply", ok(9));
        assert_eq!(f.drain().len(), 3);
        f.shell(&m, "execute_reply", ok(2));
        assert!(matches!(f.drain().as_slice(), [ExecEvent::Done { .. }]));
    }

    #[test]
    fn an_error_only_in_the_reply_is_reported_once_and_the_count_comes_from_the_reply() {
        let mut f = fake(ClientLimits::default());
        f.ready();
        f.client.execute("boom").unwrap();
        let m = f.current();
        f.iopub(&m, "status", json!({"execution_state": "idle"}));
        f.shell(
            &m,
            "execute_reply",
            json!({"status": "error", "execution_count": 3, "ename": "E", "evalue": "v",
                   "traceback": ["t"]}),
        );
        let events = f.drain();
        assert!(
            matches!(
                events.as_slice(),
                [
                    ExecEvent::ExecutionCount(3),
                    ExecEvent::Error { name, .. },
                    ExecEvent::Done { .. }
                ] if name == "E"
            ),
            "{events:#?}"
        );
    }

    #[test]
    fn queued_events_stop_reading_then_overflow_kills() {
        let limits = ClientLimits {
            high_water_events: 2,
            max_events: 4,
            ..ClientLimits::default()
        };
        let mut f = fake(limits);
        f.ready();
        f.client.execute("spam").unwrap();
        let m = f.current();
        let stream = json!({"name": "stdout", "text": "x"});
        f.iopub(&m, "stream", stream.clone());
        assert!(f.client.fds().iter().all(|k| k.read));
        f.iopub(&m, "stream", stream.clone());
        // At the high water the client stops asking to read.
        assert!(f.client.fds().iter().all(|k| !k.read));
        // A caller that reads anyway hits the cap: the kernel is dead, not buffered.
        for _ in 0..3 {
            f.iopub(&m, "stream", stream.clone());
        }
        assert!(f.client.is_dead());
        assert!(f.client.fds().is_empty());
        let events: Vec<_> = std::iter::from_fn(|| f.client.next_event()).collect();
        assert_eq!(events.len(), 5);
        assert!(matches!(
            events.last(),
            Some(KernelEvent::Dead(DeadReason::Overflow { events: 4, .. }))
        ));
        assert_eq!(f.client.queued_bytes, 0);
        assert!(matches!(f.client.execute("1"), Err(ClientError::Dead)));
    }

    #[test]
    fn a_closed_socket_is_dead() {
        let mut f = fake(ClientLimits::default());
        let fd = f.client.fds()[0].fd;
        f.listeners.clear();
        // The listeners' closing resets the accepted-but-unaccepted connections.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !f.client.is_dead() {
            assert!(std::time::Instant::now() < deadline);
            f.client.on_ready(fd, true, false);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(matches!(
            f.client.next_event(),
            Some(KernelEvent::Dead(
                DeadReason::Closed(Channel::Shell) | DeadReason::Io(..)
            ))
        ));
    }
}
