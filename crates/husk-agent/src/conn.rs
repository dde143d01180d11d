//! The agent's end of its connection to the server: a non-blocking stream socket carrying
//! husk-proto frames, with an outgoing queue so a slow server never blocks the agent's loop.
//! The queue's size is the agent's back-pressure signal: while it is above [`HIGH_WATER`],
//! the loop stops reading process output, so a process that writes faster than the server
//! reads ends up blocked in its own `write`, not growing the agent's memory.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use husk_proto::{AgentError, ErrorKind, FromAgent, ProtoError, Reply, ToAgent, MAX_FRAME};
use husk_runtime::sys;

/// Above this many queued bytes the loop stops reading process output.
pub const HIGH_WATER: usize = 4 << 20;

/// The framed connection. A kept sandbox's agent may be without one for a while (its server
/// restarting): then it is *detached*, and what would be sent is dropped.
pub struct Conn {
    fd: Option<OwnedFd>,
    inbuf: Vec<u8>,
    out: VecDeque<Vec<u8>>,
    /// Bytes of `out[0]` already written.
    out_pos: usize,
    queued: usize,
    /// The server closed its end.
    pub closed: bool,
}

impl Conn {
    pub fn new(fd: OwnedFd) -> io::Result<Conn> {
        sys::set_nonblocking(fd.as_fd(), true)?;
        Ok(Conn {
            fd: Some(fd),
            inbuf: Vec::with_capacity(64 << 10),
            out: VecDeque::new(),
            out_pos: 0,
            queued: 0,
            closed: false,
        })
    }

    /// The socket; `None` while detached.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// Drops the connection and everything queued for it or read from it.
    pub fn detach(&mut self) {
        self.fd = None;
        self.inbuf.clear();
        self.out.clear();
        self.out_pos = 0;
        self.queued = 0;
        self.closed = false;
    }

    /// Serves `fd` from now on, in place of the connection there was (dropped as by
    /// [`Conn::detach`]).
    pub fn attach(&mut self, fd: OwnedFd) -> io::Result<()> {
        sys::set_nonblocking(fd.as_fd(), true)?;
        self.detach();
        self.fd = Some(fd);
        Ok(())
    }

    /// Bytes waiting to be written.
    pub fn queued(&self) -> usize {
        self.queued
    }

    /// Queues an unsolicited message (hello, process output and exits, watch events). These
    /// are bounded by construction (an output read is at most 64 KiB, a watch batch 256 KiB),
    /// far below a frame's limit, so encoding them cannot fail.
    pub fn event(&mut self, msg: &FromAgent) {
        let _ = self.send(msg);
    }

    fn send(&mut self, msg: &FromAgent) -> Result<(), ProtoError> {
        let frame = husk_proto::encode(msg)?;
        if self.fd.is_none() {
            return Ok(());
        }
        self.queued += frame.len();
        self.out.push_back(frame);
        Ok(())
    }

    /// Queues the reply to call `id`. Every call is answered: a reply too large for one frame
    /// (a huge listing, say) becomes a `ResourceExhausted` error instead.
    pub fn reply(&mut self, id: u64, result: Result<Reply, AgentError>) {
        if let Err(e) = self.send(&FromAgent::Reply { id, result }) {
            let result = Err(AgentError::new(
                ErrorKind::ResourceExhausted,
                format!("the reply does not fit in one message: {e}"),
            ));
            // A short error always encodes.
            let _ = self.send(&FromAgent::Reply { id, result });
        }
    }

    /// Writes as much of the queue as the socket takes now.
    pub fn flush(&mut self) -> io::Result<()> {
        let Some(fd) = &self.fd else { return Ok(()) };
        while let Some(front) = self.out.front() {
            match sys::write_some(fd.as_fd(), &front[self.out_pos..]) {
                Ok(n) => {
                    self.out_pos += n;
                    self.queued -= n;
                    if self.out_pos == front.len() {
                        self.out.pop_front();
                        self.out_pos = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads what is available and returns the complete messages received. Sets `closed` at
    /// end of stream.
    pub fn receive(&mut self) -> Result<Vec<ToAgent>, ProtoError> {
        let Some(fd) = &self.fd else {
            return Ok(Vec::new());
        };
        let mut buf = [0u8; 64 << 10];
        loop {
            match sys::read(fd.as_fd(), &mut buf) {
                Ok(0) => {
                    self.closed = true;
                    break;
                }
                Ok(n) => {
                    self.inbuf.extend_from_slice(&buf[..n]);
                    // Never buffer more than one maximal frame plus a read.
                    if self.inbuf.len() > MAX_FRAME + 4 + buf.len() {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let mut msgs = Vec::new();
        let mut pos = 0;
        while self.inbuf.len() - pos >= 4 {
            let header: [u8; 4] = self.inbuf[pos..pos + 4].try_into().unwrap_or([0xff; 4]);
            let len = husk_proto::frame_len(header)?;
            if self.inbuf.len() - pos - 4 < len {
                break;
            }
            msgs.push(husk_proto::decode(&self.inbuf[pos + 4..pos + 4 + len])?);
            pos += 4 + len;
        }
        self.inbuf.drain(..pos);
        Ok(msgs)
    }
}
