//! ZMTP 3.0/3.1 (the ZeroMQ wire protocol), client side, NULL security mechanism, sans-I/O.
//!
//! A [`Connection`] is a state machine over one byte stream (a TCP connection to one kernel
//! socket). The caller owns the socket: it writes whatever [`Connection::output`] holds, feeds what
//! it reads to [`Connection::receive`], and takes [`Event`]s from [`Connection::next_event`]. Nothing
//! here blocks, allocates a thread or reads a clock, so the agent's single-threaded poll(2) loop can
//! drive any number of these over non-blocking sockets.
//!
//! Everything the peer sends is treated as hostile: the kernel runs inside the sandbox, next to the
//! code it executes. Frames, messages and parts per message are bounded by [`Limits`], checked as
//! soon as a frame header is read (before its body is buffered), and any violation poisons the
//! connection: every later call returns the same error and the caller must close the socket.
//!
//! Spec: <https://rfc.zeromq.org/spec/23/> (ZMTP 3.0) and <https://rfc.zeromq.org/spec/37/> (3.1).

use std::collections::VecDeque;

/// Length of the ZMTP 3 greeting, each way.
pub const GREETING_LEN: usize = 64;

/// Frame flag: more frames of this message follow.
const FLAG_MORE: u8 = 0x01;
/// Frame flag: the size is an 8-byte big-endian integer rather than one byte.
const FLAG_LONG: u8 = 0x02;
/// Frame flag: the frame is a command, not part of a message.
const FLAG_COMMAND: u8 = 0x04;

/// Largest command body accepted. Commands are protocol, not payload (READY with a few properties,
/// PING, ERROR), so they get a fixed bound of their own rather than the message limits.
const MAX_COMMAND: u64 = 64 * 1024;

/// The ZeroMQ socket types this client can play (and so announce in its READY command).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketType {
    /// Shell, control and stdin channels (the kernel side is a ROUTER).
    Dealer,
    /// The iopub channel (the kernel side is a PUB or, since ipykernel 6, an XPUB).
    Sub,
    /// The heartbeat channel (the kernel side is a REP).
    Req,
}

impl SocketType {
    /// The name sent in the `Socket-Type` property.
    pub fn name(self) -> &'static str {
        match self {
            SocketType::Dealer => "DEALER",
            SocketType::Sub => "SUB",
            SocketType::Req => "REQ",
        }
    }

    /// Whether a peer announcing `peer` may talk to this socket type (ZMTP 3 requires the check;
    /// it also catches connecting a channel to the wrong port).
    fn accepts(self, peer: &[u8]) -> bool {
        let ok: &[&[u8]] = match self {
            SocketType::Dealer => &[b"ROUTER", b"DEALER", b"REP"],
            SocketType::Sub => &[b"PUB", b"XPUB"],
            SocketType::Req => &[b"REP", b"ROUTER"],
        };
        ok.contains(&peer)
    }

    /// Only sockets that can be routed to announce an identity (as libzmq does).
    fn sends_identity(self) -> bool {
        matches!(self, SocketType::Dealer | SocketType::Req)
    }
}

/// Bounds on what the peer may make this side buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest single frame body (message part or command), in bytes.
    pub max_frame: u64,
    /// Largest message: the sum of its parts' bodies, in bytes.
    pub max_message: u64,
    /// Most parts in one message. Needed beside `max_message`: a message of empty parts costs
    /// nothing in bytes but a `Vec` header each in memory.
    pub max_parts: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // 64 MiB fits any realistic plot or DataFrame a kernel publishes; 4096 parts is far more
        // than a Jupyter message (a few identities, 6 fixed parts, a handful of buffers) needs.
        Limits {
            max_frame: 64 << 20,
            max_message: 64 << 20,
            max_parts: 4096,
        }
    }
}

/// How this side introduces itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub socket_type: SocketType,
    /// Sent as the `Identity` property by DEALER and REQ sockets; empty lets the peer pick one.
    /// At most 255 bytes and must not start with a zero byte (libzmq reserves those).
    pub identity: Vec<u8>,
    pub limits: Limits,
}

impl Config {
    pub fn new(socket_type: SocketType) -> Self {
        Config {
            socket_type,
            identity: Vec::new(),
            limits: Limits::default(),
        }
    }
}

/// What the peer told us in its greeting and READY command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    /// ZMTP version from the greeting (major, minor); major is always 3.
    pub version: (u8, u8),
    /// The peer's `Socket-Type`, e.g. `ROUTER` or `XPUB`.
    pub socket_type: String,
    /// All metadata properties of the READY command, in order, names as sent.
    pub properties: Vec<(String, Vec<u8>)>,
}

/// Something the peer sent that the caller should act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The handshake is complete; queued messages and subscriptions have been released to
    /// [`Connection::output`].
    Ready(PeerInfo),
    /// One complete multipart message (for REQ sockets, without the empty delimiter part).
    Message(Vec<Vec<u8>>),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZmtpError {
    #[error("peer greeting is not ZMTP (bad signature)")]
    BadSignature,
    #[error("peer speaks ZMTP {0}.{1}; only 3.x is supported")]
    UnsupportedVersion(u8, u8),
    #[error("peer wants security mechanism {0:?}; only NULL is supported")]
    UnsupportedMechanism(String),
    #[error("frame has reserved flag bits set: {0:#04x}")]
    BadFlags(u8),
    #[error("frame of {size} bytes exceeds the limit of {limit}")]
    FrameTooLarge { size: u64, limit: u64 },
    #[error("message of at least {size} bytes exceeds the limit of {limit}")]
    MessageTooLarge { size: u64, limit: u64 },
    #[error("message of more than {limit} parts")]
    TooManyParts { limit: usize },
    #[error("malformed command: {0}")]
    BadCommand(&'static str),
    #[error("expected READY, peer sent {0:?}")]
    ExpectedReady(String),
    #[error("peer socket type {peer:?} cannot talk to {ours}")]
    IncompatibleSocket { peer: String, ours: &'static str },
    #[error("peer sent ERROR: {0}")]
    PeerError(String),
    #[error("REQ reply without the empty delimiter part")]
    MissingDelimiter,
    #[error("invalid identity: {0}")]
    BadIdentity(&'static str),
    #[error("message part sent before the handshake finished")]
    MessageBeforeReady,
    #[error("a message needs at least one part")]
    EmptyMessage,
    #[error("subscriptions are only for SUB sockets")]
    NotSub,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Waiting for the peer's 64-byte greeting.
    Greeting,
    /// Greeting done; the next frame must be the peer's READY (or ERROR) command.
    Handshake,
    /// Messages flow.
    Open,
}

/// Things the caller asked to send before the peer's READY arrived. They wait because a SUB's
/// subscription format depends on the peer's minor version, and because sending messages to a
/// peer that is about to reject the handshake is pointless.
#[derive(Debug)]
enum Pending {
    Message(Vec<Vec<u8>>),
    Subscribe(Vec<u8>),
    Cancel(Vec<u8>),
}

/// One ZMTP connection, client side. See the module documentation.
#[derive(Debug)]
pub struct Connection {
    config: Config,
    state: State,
    peer_version: (u8, u8),
    /// Unparsed input. Never holds more than one frame header plus one frame body beyond what the
    /// latest `receive` call handed in, because frames are consumed as soon as they are complete
    /// and their size is checked before their body is awaited.
    input: Vec<u8>,
    output: Vec<u8>,
    /// How much of `output` the caller has already written.
    output_sent: usize,
    /// Parts of a message still missing its last frame, and their total size.
    partial: Vec<Vec<u8>>,
    partial_size: u64,
    events: VecDeque<Event>,
    pending: Vec<Pending>,
    error: Option<ZmtpError>,
}

impl Connection {
    /// A connection that has queued its greeting and READY command in [`Self::output`].
    pub fn new(config: Config) -> Result<Self, ZmtpError> {
        if config.identity.len() > 255 {
            return Err(ZmtpError::BadIdentity("longer than 255 bytes"));
        }
        if config.identity.first() == Some(&0) {
            return Err(ZmtpError::BadIdentity("starts with a zero byte"));
        }
        let mut conn = Connection {
            config,
            state: State::Greeting,
            peer_version: (0, 0),
            input: Vec::new(),
            output: Vec::new(),
            output_sent: 0,
            partial: Vec::new(),
            partial_size: 0,
            events: VecDeque::new(),
            pending: Vec::new(),
            error: None,
        };
        conn.output.extend_from_slice(&greeting());
        // NULL mechanism: READY may follow the greeting straight away (no need to wait for the
        // peer's), which saves a round trip.
        let mut props: Vec<(&str, &[u8])> =
            vec![("Socket-Type", conn.config.socket_type.name().as_bytes())];
        let identity = conn.config.identity.clone();
        if conn.config.socket_type.sends_identity() {
            props.push(("Identity", &identity));
        }
        let ready = ready_body(&props);
        push_frame(&mut conn.output, FLAG_COMMAND, &ready);
        Ok(conn)
    }

    pub fn socket_type(&self) -> SocketType {
        self.config.socket_type
    }

    /// Whether the handshake has completed.
    pub fn is_ready(&self) -> bool {
        self.state == State::Open && self.error.is_none()
    }

    /// The error that poisoned this connection, if any.
    pub fn error(&self) -> Option<&ZmtpError> {
        self.error.as_ref()
    }

    /// Bytes waiting to be written to the socket.
    pub fn output(&self) -> &[u8] {
        &self.output[self.output_sent..]
    }

    /// Whether anything waits to be written (for choosing POLLOUT).
    pub fn wants_write(&self) -> bool {
        self.output_sent < self.output.len()
    }

    /// Marks the first `n` bytes of [`Self::output`] as written.
    pub fn consume_output(&mut self, n: usize) {
        self.output_sent = (self.output_sent + n).min(self.output.len());
        if self.output_sent == self.output.len() {
            self.output.clear();
            self.output_sent = 0;
        } else if self.output_sent > 64 * 1024 && self.output_sent * 2 > self.output.len() {
            // Compact now and then so a long-lived connection that never fully drains does not
            // keep its whole history.
            self.output.drain(..self.output_sent);
            self.output_sent = 0;
        }
    }

    /// The next event, if any.
    pub fn next_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Queues a multipart message. Before the handshake completes it is held back and released
    /// with [`Event::Ready`]. A REQ socket prepends the empty delimiter part itself.
    pub fn send(&mut self, parts: &[&[u8]]) -> Result<(), ZmtpError> {
        self.check()?;
        if parts.is_empty() {
            return Err(ZmtpError::EmptyMessage);
        }
        if self.state != State::Open {
            self.pending
                .push(Pending::Message(parts.iter().map(|p| p.to_vec()).collect()));
            return Ok(());
        }
        self.write_message(parts.iter().copied());
        Ok(())
    }

    /// Subscribes a SUB socket to messages whose first part starts with `topic` (empty: all).
    pub fn subscribe(&mut self, topic: &[u8]) -> Result<(), ZmtpError> {
        self.subscription(Pending::Subscribe(topic.to_vec()))
    }

    /// Withdraws a subscription made with [`Self::subscribe`].
    pub fn cancel(&mut self, topic: &[u8]) -> Result<(), ZmtpError> {
        self.subscription(Pending::Cancel(topic.to_vec()))
    }

    fn subscription(&mut self, what: Pending) -> Result<(), ZmtpError> {
        self.check()?;
        if self.config.socket_type != SocketType::Sub {
            return Err(ZmtpError::NotSub);
        }
        if self.state != State::Open {
            self.pending.push(what);
        } else {
            self.write_pending(what);
        }
        Ok(())
    }

    /// Feeds bytes read from the socket. Complete frames are parsed at once; what they mean
    /// becomes available from [`Self::next_event`], and replies (PONG) land in [`Self::output`].
    /// On error the connection is poisoned and the caller should close the socket.
    ///
    /// Memory: besides `data` itself, this side holds at most one incomplete frame and the
    /// finished parts of one incomplete message, so about twice [`Limits::max_message`] at
    /// worst. Events queue up until taken; drain them after each call (and stop reading while
    /// the consumer is behind) to keep that queue bounded too.
    pub fn receive(&mut self, data: &[u8]) -> Result<(), ZmtpError> {
        self.check()?;
        self.input.extend_from_slice(data);
        let result = self.parse();
        if let Err(e) = &result {
            self.error = Some(e.clone());
            self.input = Vec::new();
            self.partial = Vec::new();
        }
        result
    }

    fn check(&self) -> Result<(), ZmtpError> {
        match &self.error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn parse(&mut self) -> Result<(), ZmtpError> {
        // The input is taken out so frames can be parsed from a borrowed slice while the rest of
        // the state is updated; consumed bytes are dropped once, at the end.
        let input = std::mem::take(&mut self.input);
        let mut pos = 0;
        let result = loop {
            match self.step(&input[pos..]) {
                Ok(Some(n)) => pos += n,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        self.input = input;
        self.input.drain(..pos);
        if self.input.is_empty() && self.input.capacity() > 1 << 20 {
            // One large frame must not pin its buffer for the connection's lifetime.
            self.input = Vec::new();
        }
        result
    }

    /// Parses one greeting or frame from the front of `buf`: how many bytes it used, or `None`
    /// when more input is needed.
    fn step(&mut self, buf: &[u8]) -> Result<Option<usize>, ZmtpError> {
        if self.state == State::Greeting {
            return self.step_greeting(buf);
        }
        let Some(&flags) = buf.first() else {
            return Ok(None);
        };
        if flags & !(FLAG_MORE | FLAG_LONG | FLAG_COMMAND) != 0 {
            return Err(ZmtpError::BadFlags(flags));
        }
        let (header, size) = if flags & FLAG_LONG != 0 {
            let Some(bytes) = buf.get(1..9) else {
                return Ok(None);
            };
            let mut be = [0u8; 8];
            be.copy_from_slice(bytes);
            (9, u64::from_be_bytes(be))
        } else {
            match buf.get(1) {
                Some(&b) => (2, u64::from(b)),
                None => return Ok(None),
            }
        };
        // Every bound is checked here, from the header alone, so a hostile size never makes
        // this side wait for (and buffer) a body it would reject anyway.
        let limits = self.config.limits;
        let is_command = flags & FLAG_COMMAND != 0;
        let limit = if is_command {
            MAX_COMMAND
        } else {
            limits.max_frame
        };
        if size > limit {
            return Err(ZmtpError::FrameTooLarge { size, limit });
        }
        if !is_command {
            let total = self.partial_size.saturating_add(size);
            if total > limits.max_message {
                return Err(ZmtpError::MessageTooLarge {
                    size: total,
                    limit: limits.max_message,
                });
            }
            if self.partial.len() >= limits.max_parts {
                return Err(ZmtpError::TooManyParts {
                    limit: limits.max_parts,
                });
            }
        }
        // `size` is at most max_frame, which the caller chose to fit in memory.
        let end = header + size as usize;
        let Some(body) = buf.get(header..end) else {
            return Ok(None);
        };
        if is_command {
            if flags & FLAG_MORE != 0 {
                return Err(ZmtpError::BadCommand("command frame with the MORE flag"));
            }
            if !self.partial.is_empty() {
                return Err(ZmtpError::BadCommand("command inside a multipart message"));
            }
            self.command(body)?;
        } else {
            if self.state != State::Open {
                return Err(ZmtpError::MessageBeforeReady);
            }
            self.partial.push(body.to_vec());
            self.partial_size += size;
            if flags & FLAG_MORE == 0 {
                let mut parts = std::mem::take(&mut self.partial);
                self.partial_size = 0;
                if self.config.socket_type == SocketType::Req {
                    // A REP peer echoes the envelope: an empty delimiter, then the reply.
                    if parts.first().is_none_or(|p| !p.is_empty()) {
                        return Err(ZmtpError::MissingDelimiter);
                    }
                    parts.remove(0);
                }
                self.events.push_back(Event::Message(parts));
            }
        }
        Ok(Some(end))
    }

    fn step_greeting(&mut self, buf: &[u8]) -> Result<Option<usize>, ZmtpError> {
        // Checked byte by byte as it arrives, so a peer that is not ZMTP at all (an HTTP server
        // on the wrong port, say) is rejected without waiting for 64 bytes that may never come.
        if buf.first().is_some_and(|&b| b != 0xFF) || buf.get(9).is_some_and(|&b| b & 1 == 0) {
            return Err(ZmtpError::BadSignature);
        }
        if let Some(&major) = buf.get(10) {
            if major < 3 {
                return Err(ZmtpError::UnsupportedVersion(
                    major,
                    buf.get(11).copied().unwrap_or(0),
                ));
            }
        }
        let Some(greeting) = buf.get(..GREETING_LEN) else {
            return Ok(None);
        };
        let (major, minor) = (greeting[10], greeting[11]);
        // A newer major version would have downgraded to ours (the spec's rule for the side
        // with the higher version); treat it as the newest 3.x we know.
        self.peer_version = if major > 3 { (3, 1) } else { (3, minor) };
        let mechanism = &greeting[12..32];
        let name_len = mechanism
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(mechanism.len());
        if &mechanism[..name_len] != b"NULL" || mechanism[name_len..].iter().any(|&b| b != 0) {
            return Err(ZmtpError::UnsupportedMechanism(
                String::from_utf8_lossy(&mechanism[..name_len]).into_owned(),
            ));
        }
        self.state = State::Handshake;
        Ok(Some(GREETING_LEN))
    }

    fn command(&mut self, body: &[u8]) -> Result<(), ZmtpError> {
        let (&name_len, rest) = body
            .split_first()
            .ok_or(ZmtpError::BadCommand("empty command"))?;
        let name_len = usize::from(name_len);
        if rest.len() < name_len {
            return Err(ZmtpError::BadCommand("name longer than the command"));
        }
        let (name, data) = rest.split_at(name_len);
        if name == b"ERROR" {
            // ERROR: reason-size OCTET, reason. Shown lossily and clipped: it is for a log line.
            let reason = data.get(1..).unwrap_or_default();
            let reason = &reason[..reason
                .len()
                .min(usize::from(data.first().copied().unwrap_or(0)))];
            return Err(ZmtpError::PeerError(
                String::from_utf8_lossy(reason).into_owned(),
            ));
        }
        match self.state {
            State::Handshake => {
                if name != b"READY" {
                    return Err(ZmtpError::ExpectedReady(
                        String::from_utf8_lossy(name).into_owned(),
                    ));
                }
                let properties = parse_properties(data)?;
                let socket_type = properties
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case("Socket-Type"))
                    .map(|(_, v)| v.clone())
                    .ok_or(ZmtpError::BadCommand("READY without Socket-Type"))?;
                if !self.config.socket_type.accepts(&socket_type) {
                    return Err(ZmtpError::IncompatibleSocket {
                        peer: String::from_utf8_lossy(&socket_type).into_owned(),
                        ours: self.config.socket_type.name(),
                    });
                }
                self.state = State::Open;
                for pending in std::mem::take(&mut self.pending) {
                    self.write_pending(pending);
                }
                self.events.push_back(Event::Ready(PeerInfo {
                    version: self.peer_version,
                    socket_type: String::from_utf8_lossy(&socket_type).into_owned(),
                    properties,
                }));
            }
            State::Open => match name {
                b"READY" => return Err(ZmtpError::BadCommand("second READY")),
                b"PING" => {
                    // PING: TTL (2 octets) then up to 16 octets of context, echoed in PONG.
                    let context = data
                        .get(2..)
                        .ok_or(ZmtpError::BadCommand("PING shorter than its TTL"))?;
                    let context = &context[..context.len().min(16)];
                    push_frame(
                        &mut self.output,
                        FLAG_COMMAND,
                        &command_body(b"PONG", context),
                    );
                }
                // PONG answers a PING we never send; SUBSCRIBE/CANCEL are for publishers; other
                // commands are extensions this client has no use for. None changes our state.
                _ => {}
            },
            State::Greeting => unreachable!("frames are only parsed after the greeting"),
        }
        Ok(())
    }

    fn write_pending(&mut self, pending: Pending) {
        // ZMTP 3.1 peers take subscriptions as commands; 3.0 peers (libzmq before 4.3) as a
        // message whose first byte is 1 (subscribe) or 0 (cancel), the format XPUB exposes.
        let new_style = self.peer_version.1 >= 1;
        match pending {
            Pending::Message(parts) => self.write_message(parts.iter().map(Vec::as_slice)),
            Pending::Subscribe(topic) if new_style => {
                push_frame(
                    &mut self.output,
                    FLAG_COMMAND,
                    &command_body(b"SUBSCRIBE", &topic),
                );
            }
            Pending::Cancel(topic) if new_style => {
                push_frame(
                    &mut self.output,
                    FLAG_COMMAND,
                    &command_body(b"CANCEL", &topic),
                );
            }
            Pending::Subscribe(topic) => {
                push_frame(&mut self.output, 0, &[&[1u8][..], &topic].concat());
            }
            Pending::Cancel(topic) => {
                push_frame(&mut self.output, 0, &[&[0u8][..], &topic].concat());
            }
        }
    }

    fn write_message<'a>(&mut self, parts: impl ExactSizeIterator<Item = &'a [u8]>) {
        if self.config.socket_type == SocketType::Req {
            push_frame(&mut self.output, FLAG_MORE, &[]);
        }
        let last = parts.len().saturating_sub(1);
        for (i, part) in parts.enumerate() {
            push_frame(&mut self.output, if i < last { FLAG_MORE } else { 0 }, part);
        }
    }
}

/// This side's greeting: ZMTP 3.1, NULL mechanism, client.
fn greeting() -> [u8; GREETING_LEN] {
    let mut g = [0u8; GREETING_LEN];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = 1;
    g[12..16].copy_from_slice(b"NULL");
    // g[32] (as-server) stays 0; the rest is filler.
    g
}

/// Appends one frame, short or long as its size needs.
fn push_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    if body.len() > 255 {
        out.push(flags | FLAG_LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
}

/// A command's body: name-size OCTET, name, data.
fn command_body(name: &[u8], data: &[u8]) -> Vec<u8> {
    debug_assert!(!name.is_empty() && name.len() <= 255);
    let mut body = Vec::with_capacity(1 + name.len() + data.len());
    body.push(name.len() as u8);
    body.extend_from_slice(name);
    body.extend_from_slice(data);
    body
}

/// READY's body: the name, then properties (name-size OCTET, name, value-size 4 OCTETs, value).
fn ready_body(props: &[(&str, &[u8])]) -> Vec<u8> {
    let mut data = Vec::new();
    for (name, value) in props {
        data.push(name.len() as u8);
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&(value.len() as u32).to_be_bytes());
        data.extend_from_slice(value);
    }
    command_body(b"READY", &data)
}

fn parse_properties(mut data: &[u8]) -> Result<Vec<(String, Vec<u8>)>, ZmtpError> {
    let mut props = Vec::new();
    while let Some((&name_len, rest)) = data.split_first() {
        let name_len = usize::from(name_len);
        if name_len == 0 {
            return Err(ZmtpError::BadCommand("empty property name"));
        }
        let name = rest
            .get(..name_len)
            .ok_or(ZmtpError::BadCommand("truncated property name"))?;
        let rest = &rest[name_len..];
        let size = rest
            .get(..4)
            .ok_or(ZmtpError::BadCommand("truncated property size"))?;
        let size = u32::from_be_bytes([size[0], size[1], size[2], size[3]]) as usize;
        let value = rest[4..]
            .get(..size)
            .ok_or(ZmtpError::BadCommand("truncated property value"))?;
        props.push((String::from_utf8_lossy(name).into_owned(), value.to_vec()));
        data = &rest[4 + size..];
    }
    Ok(props)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's greeting with the given minor version and mechanism.
    fn peer_greeting(minor: u8, mechanism: &[u8]) -> Vec<u8> {
        let mut g = greeting().to_vec();
        g[11] = minor;
        g[12..32].fill(0);
        g[12..12 + mechanism.len()].copy_from_slice(mechanism);
        g[32] = 1;
        g
    }

    fn peer_ready(socket_type: &str) -> Vec<u8> {
        let mut out = Vec::new();
        push_frame(
            &mut out,
            FLAG_COMMAND,
            &ready_body(&[("Socket-Type", socket_type.as_bytes()), ("Identity", b"")]),
        );
        out
    }

    fn handshake(minor: u8, socket_type: &str) -> Vec<u8> {
        [peer_greeting(minor, b"NULL"), peer_ready(socket_type)].concat()
    }

    fn events(conn: &mut Connection) -> Vec<Event> {
        std::iter::from_fn(|| conn.next_event()).collect()
    }

    fn messages(conn: &mut Connection) -> Vec<Vec<Vec<u8>>> {
        events(conn)
            .into_iter()
            .filter_map(|e| match e {
                Event::Message(m) => Some(m),
                Event::Ready(_) => None,
            })
            .collect()
    }

    fn dealer() -> Connection {
        let mut config = Config::new(SocketType::Dealer);
        config.identity = b"husk".to_vec();
        Connection::new(config).unwrap()
    }

    /// Moves everything `from` wants to write into `to`.
    fn pump(from: &mut Connection, to: &mut Connection) -> Result<(), ZmtpError> {
        let bytes = from.output().to_vec();
        from.consume_output(bytes.len());
        to.receive(&bytes)
    }

    #[test]
    fn greeting_and_ready_are_queued_first() {
        let conn = dealer();
        let out = conn.output();
        assert_eq!(&out[..GREETING_LEN], &greeting());
        assert_eq!(out[GREETING_LEN], FLAG_COMMAND);
        let size = usize::from(out[GREETING_LEN + 1]);
        let body = &out[GREETING_LEN + 2..GREETING_LEN + 2 + size];
        assert_eq!(&body[..6], b"\x05READY");
        let props = parse_properties(&body[6..]).unwrap();
        assert_eq!(
            props,
            vec![
                ("Socket-Type".to_string(), b"DEALER".to_vec()),
                ("Identity".to_string(), b"husk".to_vec()),
            ]
        );
        assert_eq!(out.len(), GREETING_LEN + 2 + size);
    }

    #[test]
    fn sub_sends_no_identity() {
        let conn = Connection::new(Config::new(SocketType::Sub)).unwrap();
        let body = &conn.output()[GREETING_LEN + 2..];
        assert_eq!(
            parse_properties(&body[6..]).unwrap(),
            vec![("Socket-Type".to_string(), b"SUB".to_vec())]
        );
    }

    #[test]
    fn bad_identities_are_refused() {
        let mut config = Config::new(SocketType::Dealer);
        config.identity = vec![0, 1];
        assert!(matches!(
            Connection::new(config.clone()),
            Err(ZmtpError::BadIdentity(_))
        ));
        config.identity = vec![b'a'; 256];
        assert!(matches!(
            Connection::new(config),
            Err(ZmtpError::BadIdentity(_))
        ));
    }

    #[test]
    fn messages_wait_for_the_handshake_and_round_trip() {
        let mut a = dealer();
        let mut b = dealer();
        let big = vec![7u8; 300];
        a.send(&[b"", b"one", &big]).unwrap();
        // Only greeting + READY so far: the message waits for b's READY.
        assert_eq!(a.output().len(), conn_preamble_len(&a));
        pump(&mut a, &mut b).unwrap();
        assert!(
            matches!(events(&mut b).as_slice(), [Event::Ready(p)] if p.socket_type == "DEALER")
        );
        pump(&mut b, &mut a).unwrap();
        let ready = events(&mut a);
        let [Event::Ready(peer)] = ready.as_slice() else {
            panic!("{ready:?}")
        };
        assert_eq!(peer.version, (3, 1));
        assert!(peer
            .properties
            .contains(&("Identity".into(), b"husk".to_vec())));
        pump(&mut a, &mut b).unwrap();
        assert_eq!(
            messages(&mut b),
            vec![vec![b"".to_vec(), b"one".to_vec(), big.clone()]]
        );
        b.send(&[b"reply"]).unwrap();
        pump(&mut b, &mut a).unwrap();
        assert_eq!(messages(&mut a), vec![vec![b"reply".to_vec()]]);
        assert!(!a.wants_write());
    }

    fn conn_preamble_len(conn: &Connection) -> usize {
        let body_len = usize::from(conn.output()[GREETING_LEN + 1]);
        GREETING_LEN + 2 + body_len
    }

    /// The peer's whole byte stream for a few messages, and what they decode to.
    fn stream_and_messages() -> (Vec<u8>, Vec<Vec<Vec<u8>>>) {
        let msgs = vec![
            vec![b"id".to_vec(), b"<IDS|MSG>".to_vec(), vec![1u8; 1000]],
            vec![Vec::new()],
            vec![vec![2u8; 255], vec![3u8; 256]],
        ];
        let mut stream = handshake(1, "ROUTER");
        for msg in &msgs {
            for (i, part) in msg.iter().enumerate() {
                let flags = if i + 1 < msg.len() { FLAG_MORE } else { 0 };
                push_frame(&mut stream, flags, part);
            }
        }
        // A PING between messages must not disturb them.
        let mut ping = Vec::new();
        push_frame(
            &mut ping,
            FLAG_COMMAND,
            &command_body(b"PING", b"\x00\x0actx"),
        );
        let at = handshake(1, "ROUTER").len();
        stream.splice(at..at, ping);
        (stream, msgs)
    }

    #[test]
    fn every_split_point_decodes_the_same() {
        let (stream, msgs) = stream_and_messages();
        for k in 0..=stream.len() {
            let mut conn = dealer();
            conn.receive(&stream[..k]).unwrap();
            conn.receive(&stream[k..]).unwrap();
            assert_eq!(messages(&mut conn), msgs, "split at {k}");
        }
        let mut conn = dealer();
        for byte in &stream {
            conn.receive(std::slice::from_ref(byte)).unwrap();
        }
        assert_eq!(messages(&mut conn), msgs);
    }

    #[test]
    fn every_truncation_waits_without_error_or_event() {
        let (stream, _) = stream_and_messages();
        let ends: Vec<usize> = {
            // Offsets where a message has just completed, found by feeding byte by byte.
            let mut conn = dealer();
            let mut ends = Vec::new();
            for (i, byte) in stream.iter().enumerate() {
                conn.receive(std::slice::from_ref(byte)).unwrap();
                if messages(&mut conn).len() == 1 {
                    ends.push(i + 1);
                }
            }
            ends
        };
        assert_eq!(ends.len(), 3);
        for k in 0..stream.len() {
            let mut conn = dealer();
            conn.receive(&stream[..k]).unwrap();
            let expected = ends.iter().filter(|&&e| e <= k).count();
            assert_eq!(messages(&mut conn).len(), expected, "truncated at {k}");
        }
    }

    #[test]
    fn ping_gets_pong_with_its_context() {
        let (stream, _) = stream_and_messages();
        let mut conn = dealer();
        let preamble = conn_preamble_len(&conn);
        conn.consume_output(preamble);
        conn.receive(&stream).unwrap();
        let mut pong = Vec::new();
        push_frame(&mut pong, FLAG_COMMAND, &command_body(b"PONG", b"ctx"));
        assert_eq!(conn.output(), pong.as_slice());
    }

    #[test]
    fn sub_subscribes_with_a_command_on_3_1() {
        let mut conn = Connection::new(Config::new(SocketType::Sub)).unwrap();
        conn.subscribe(b"").unwrap();
        let preamble = conn_preamble_len(&conn);
        assert_eq!(
            conn.output().len(),
            preamble,
            "subscription waits for the peer"
        );
        conn.consume_output(preamble);
        conn.receive(&handshake(1, "XPUB")).unwrap();
        let mut expected = Vec::new();
        push_frame(
            &mut expected,
            FLAG_COMMAND,
            &command_body(b"SUBSCRIBE", b""),
        );
        assert_eq!(conn.output(), expected.as_slice());
        conn.consume_output(expected.len());
        conn.cancel(b"x").unwrap();
        let mut expected = Vec::new();
        push_frame(&mut expected, FLAG_COMMAND, &command_body(b"CANCEL", b"x"));
        assert_eq!(conn.output(), expected.as_slice());
    }

    #[test]
    fn sub_subscribes_with_a_message_on_3_0() {
        let mut conn = Connection::new(Config::new(SocketType::Sub)).unwrap();
        let preamble = conn_preamble_len(&conn);
        conn.consume_output(preamble);
        conn.receive(&handshake(0, "PUB")).unwrap();
        conn.subscribe(b"t").unwrap();
        conn.cancel(b"t").unwrap();
        assert_eq!(conn.output(), b"\x00\x02\x01t\x00\x02\x00t");
    }

    #[test]
    fn only_sub_subscribes() {
        assert_eq!(dealer().subscribe(b""), Err(ZmtpError::NotSub));
    }

    #[test]
    fn req_adds_and_strips_the_delimiter() {
        let mut conn = Connection::new(Config::new(SocketType::Req)).unwrap();
        let preamble = conn_preamble_len(&conn);
        conn.consume_output(preamble);
        conn.receive(&handshake(1, "REP")).unwrap();
        conn.send(&[b"ping"]).unwrap();
        assert_eq!(conn.output(), b"\x01\x00\x00\x04ping");
        conn.receive(b"\x01\x00\x00\x04ping").unwrap();
        assert_eq!(messages(&mut conn), vec![vec![b"ping".to_vec()]]);
        assert_eq!(
            conn.receive(b"\x00\x04ping"),
            Err(ZmtpError::MissingDelimiter)
        );
    }

    fn after_handshake(extra: &[u8]) -> Result<(), ZmtpError> {
        let mut conn = dealer();
        conn.receive(&[handshake(1, "ROUTER"), extra.to_vec()].concat())
    }

    #[test]
    fn garbage_is_rejected_early() {
        let mut conn = dealer();
        assert_eq!(
            conn.receive(b"GET / HTTP/1.1\r\n"),
            Err(ZmtpError::BadSignature)
        );
        // Poisoned: the same error from then on, whatever comes.
        assert_eq!(
            conn.receive(&handshake(1, "ROUTER")),
            Err(ZmtpError::BadSignature)
        );
        assert_eq!(conn.send(&[b"x"]), Err(ZmtpError::BadSignature));
        assert!(!conn.is_ready());

        let mut sig = greeting();
        sig[9] = 0x7E;
        assert_eq!(dealer().receive(&sig[..10]), Err(ZmtpError::BadSignature));
        let mut old = greeting();
        old[10] = 2;
        assert_eq!(
            dealer().receive(&old[..11]),
            Err(ZmtpError::UnsupportedVersion(2, 0))
        );
        assert_eq!(
            dealer().receive(&peer_greeting(1, b"CURVE")),
            Err(ZmtpError::UnsupportedMechanism("CURVE".into()))
        );
        assert!(matches!(
            dealer().receive(&peer_greeting(1, b"NUL\0L")),
            Err(ZmtpError::UnsupportedMechanism(_))
        ));
    }

    #[test]
    fn handshake_violations_are_rejected() {
        let greeting = peer_greeting(1, b"NULL");
        let mut conn = dealer();
        assert_eq!(
            conn.receive(&[greeting.clone(), b"\x00\x01x".to_vec()].concat()),
            Err(ZmtpError::MessageBeforeReady)
        );
        let mut hello = greeting.clone();
        push_frame(&mut hello, FLAG_COMMAND, &command_body(b"HELLO", b""));
        assert_eq!(
            dealer().receive(&hello),
            Err(ZmtpError::ExpectedReady("HELLO".into()))
        );
        let mut no_type = greeting.clone();
        push_frame(
            &mut no_type,
            FLAG_COMMAND,
            &ready_body(&[("Identity", b"")]),
        );
        assert!(matches!(
            dealer().receive(&no_type),
            Err(ZmtpError::BadCommand(_))
        ));
        let pub_peer = [greeting.clone(), peer_ready("PUB")].concat();
        assert!(matches!(
            dealer().receive(&pub_peer),
            Err(ZmtpError::IncompatibleSocket { .. })
        ));
        let mut error = greeting.clone();
        push_frame(
            &mut error,
            FLAG_COMMAND,
            &command_body(b"ERROR", b"\x06denied"),
        );
        assert_eq!(
            dealer().receive(&error),
            Err(ZmtpError::PeerError("denied".into()))
        );
        // Properties whose sizes overrun the command.
        for bad in [
            &b"\x05READY\x00"[..],
            b"\x05READY\x04Sock",
            b"\x05READY\x01S\x00\x00\x00\x09abc",
        ] {
            let mut stream = greeting.clone();
            push_frame(&mut stream, FLAG_COMMAND, bad);
            assert!(
                matches!(dealer().receive(&stream), Err(ZmtpError::BadCommand(_))),
                "{bad:?}"
            );
        }
        let mut stream = greeting.clone();
        push_frame(&mut stream, FLAG_COMMAND, b"\x09READY");
        assert!(matches!(
            dealer().receive(&stream),
            Err(ZmtpError::BadCommand(_))
        ));
    }

    #[test]
    fn frame_violations_are_rejected() {
        assert_eq!(after_handshake(b"\x08\x00"), Err(ZmtpError::BadFlags(0x08)));
        assert!(matches!(
            after_handshake(b"\x05\x00"),
            Err(ZmtpError::BadCommand(_))
        ));
        assert!(matches!(
            after_handshake(b"\x01\x01a\x04\x00"),
            Err(ZmtpError::BadCommand(_))
        ));
        assert!(matches!(
            after_handshake(b"\x04\x05\x05READY"),
            Err(ZmtpError::BadCommand(_))
        ));
        assert!(matches!(
            after_handshake(b"\x04\x05\x04PING"),
            Err(ZmtpError::BadCommand(_))
        ));
        // Unknown commands and stray PONGs are ignored.
        assert_eq!(after_handshake(b"\x04\x05\x04PONG\x04\x04\x03FOO"), Ok(()));
    }

    #[test]
    fn oversize_frames_fail_from_the_header_alone() {
        // Only the 9-byte header of an 8 EiB frame: refused without waiting for the body.
        let mut huge = vec![FLAG_LONG];
        huge.extend_from_slice(&(1u64 << 63).to_be_bytes());
        assert!(matches!(
            after_handshake(&huge),
            Err(ZmtpError::FrameTooLarge { .. })
        ));
        huge[0] |= FLAG_COMMAND;
        assert!(matches!(
            after_handshake(&huge),
            Err(ZmtpError::FrameTooLarge { .. })
        ));
        let mut command = vec![FLAG_COMMAND | FLAG_LONG];
        command.extend_from_slice(&(MAX_COMMAND + 1).to_be_bytes());
        assert!(matches!(
            after_handshake(&command),
            Err(ZmtpError::FrameTooLarge { .. })
        ));

        let limits = Limits {
            max_frame: 10,
            max_message: 15,
            max_parts: 3,
        };
        let conn = |extra: &[u8]| {
            let mut config = Config::new(SocketType::Dealer);
            config.limits = limits;
            let mut conn = Connection::new(config).unwrap();
            let result = conn.receive(&[handshake(1, "ROUTER"), extra.to_vec()].concat());
            (result, messages(&mut conn))
        };
        let ten = [b'x'; 10];
        let mut ok = vec![0x00, 10];
        ok.extend_from_slice(&ten);
        assert_eq!(conn(&ok), (Ok(()), vec![vec![ten.to_vec()]]));
        assert!(matches!(
            conn(b"\x00\x0b").0,
            Err(ZmtpError::FrameTooLarge {
                size: 11,
                limit: 10
            })
        ));
        // Two parts of 10 bytes: the second header already breaks the message limit.
        let mut two = vec![FLAG_MORE, 10];
        two.extend_from_slice(&ten);
        two.extend_from_slice(&[0x00, 10]);
        assert!(matches!(
            conn(&two).0,
            Err(ZmtpError::MessageTooLarge {
                size: 20,
                limit: 15
            })
        ));
        assert!(matches!(
            conn(b"\x01\x00\x01\x00\x01\x00\x00\x00").0,
            Err(ZmtpError::TooManyParts { limit: 3 })
        ));
        assert_eq!(conn(b"\x01\x00\x01\x00\x00\x00").0, Ok(()));
    }

    #[test]
    fn output_is_consumed_in_pieces() {
        let mut conn = dealer();
        let all = conn.output().to_vec();
        conn.consume_output(10);
        assert_eq!(conn.output(), &all[10..]);
        conn.consume_output(usize::MAX / 2);
        assert!(!conn.wants_write());
        assert!(conn.output().is_empty());
    }
}
