//! Copying bytes between the host's stdio and a sandbox's pipes or PTY, driven by one poll loop.
//!
//! Nothing here may block: the poll loop also enforces the timeout and handles signals. Writes
//! towards the sandbox go to non-blocking pipes, buffered. The host's own fds are shared with
//! the user's shell, so husk never sets O_NONBLOCK on them: a host pipe or terminal is written
//! through a non-blocking reopening of it, a socket with MSG_DONTWAIT, a regular file (which does
//! not block) directly; and only after poll reported it writable, at most `PIPE_BUF` bytes at a
//! time.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use husk_runtime::libc;
use husk_runtime::sys;

const BUF: usize = 64 * 1024;
/// Largest write to a host fd after POLLOUT (a pipe with room has at least this much).
const HOST_WRITE: usize = libc::PIPE_BUF;

/// An fd a pump reads or writes: the host's own stdio (borrowed for the process lifetime) or
/// a sandbox-side pipe/PTY end it owns.
pub enum Fd {
    Host(BorrowedFd<'static>),
    Owned(std::rc::Rc<OwnedFd>),
}

impl Fd {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            Fd::Host(f) => *f,
            Fd::Owned(f) => f.as_fd(),
        }
    }
}

/// What a pump does when its source ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum OnEof {
    /// Close the destination (a sandbox's stdin pipe: the command sees end of file).
    Close,
    /// Write this byte (VEOF, ^D, to a PTY: the command's terminal reports end of file).
    Send(u8),
    /// Nothing.
    Keep,
}

/// One direction: bytes read from `src` are written to `dst`.
pub struct Pump {
    src: Fd,
    /// `None` once closed.
    dst: Option<Fd>,
    buf: Vec<u8>,
    pending: std::ops::Range<usize>,
    eof: bool,
    on_eof: OnEof,
    closed: bool,
    /// Writing to `dst` failed (its reader is gone).
    broken: bool,
    /// `dst` is one of the host's fds (husk's stdout or stderr).
    to_host: bool,
    /// `dst` is a host fd that must be written in bounded steps after POLLOUT (a socket, or
    /// anything that could not be reopened non-blocking); `false` for fds whose writes never
    /// block: husk's non-blocking ends and regular files.
    careful: bool,
}

impl Pump {
    /// A pump from `src` to `dst`; husk's own (sandbox-side) ends are made non-blocking, and a
    /// host pipe or terminal as `dst` is written through a non-blocking reopening of it (a
    /// terminal's POLLOUT does not promise room for a whole write).
    pub fn new(src: Fd, dst: Fd, on_eof: OnEof) -> io::Result<Pump> {
        let to_host = matches!(dst, Fd::Host(_));
        let dst = match dst {
            Fd::Host(host) => match sys::reopen_nonblocking(host.as_raw_fd(), libc::O_WRONLY) {
                Ok(Some(own)) => Fd::Owned(std::rc::Rc::new(own)),
                _ => Fd::Host(host),
            },
            owned => owned,
        };
        // The same for a host source: a read after POLLIN can still block when another
        // process shares the fd and took the bytes first.
        let src = match src {
            Fd::Host(host) => match sys::reopen_nonblocking(host.as_raw_fd(), libc::O_RDONLY) {
                Ok(Some(own)) => Fd::Owned(std::rc::Rc::new(own)),
                _ => Fd::Host(host),
            },
            owned => owned,
        };
        for end in [&src, &dst] {
            if let Fd::Owned(f) = end {
                sys::set_nonblocking(f.as_fd(), true)?;
            }
        }
        let careful = match &dst {
            Fd::Host(h) => !sys::is_regular_file(h.as_fd()),
            Fd::Owned(_) => false,
        };
        Ok(Pump {
            careful,
            src,
            dst: Some(dst),
            buf: vec![0; BUF],
            pending: 0..0,
            eof: false,
            on_eof,
            closed: false,
            broken: false,
            to_host,
        })
    }

    /// Whether this pump writes to the host and its reader went away (like SIGPIPE for a
    /// pipeline: the output has nowhere to go).
    pub fn host_reader_gone(&self) -> bool {
        self.to_host && self.broken
    }

    /// Whether this pump has finished for good.
    pub fn done(&self) -> bool {
        self.closed || (self.eof && self.pending.is_empty())
    }

    /// The poll entry this pump waits on: `src` readable when nothing is pending, else `dst`
    /// writable.
    pub fn interest(&self) -> Option<libc::pollfd> {
        if self.done() {
            return None;
        }
        let (fd, events) = if self.pending.is_empty() {
            (self.src.fd().as_raw_fd(), libc::POLLIN)
        } else {
            (self.dst.as_ref()?.fd().as_raw_fd(), libc::POLLOUT)
        };
        Some(libc::pollfd {
            fd,
            events,
            revents: 0,
        })
    }

    /// Moves bytes after poll reported `revents` for this pump's entry.
    pub fn step(&mut self, revents: libc::c_short) {
        if revents == 0 || self.done() {
            return;
        }
        if self.pending.is_empty() {
            match sys::read_dontwait(self.src.fd(), &mut self.buf) {
                Ok(0) => {
                    // The source is finished; an end-of-file byte still goes out.
                    self.eof = true;
                    if let OnEof::Send(byte) = self.on_eof {
                        self.buf[0] = byte;
                        self.pending = 0..1;
                    }
                }
                Ok(n) => self.pending = 0..n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // EIO is how a PTY master reports that the slave side closed.
                Err(_) => self.eof = true,
            }
            // A careful destination is written only once poll says it is writable.
            if !self.careful {
                self.flush();
            }
        } else {
            self.flush();
        }
        if self.eof && self.pending.is_empty() && self.on_eof == OnEof::Close {
            self.closed = true;
            // Dropping husk's end delivers EOF to the sandbox.
            self.dst = None;
        }
    }

    fn flush(&mut self) {
        let Some(dst) = &self.dst else {
            self.pending = 0..0;
            return;
        };
        let careful = self.careful;
        while !self.pending.is_empty() {
            let end = if careful {
                self.pending.end.min(self.pending.start + HOST_WRITE)
            } else {
                self.pending.end
            };
            match sys::write_dontwait(dst.fd(), &self.buf[self.pending.start..end]) {
                Ok(n) => self.pending.start += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // The reader is gone (EPIPE): drop what it will never read.
                    self.pending = 0..0;
                    self.closed = true;
                    self.broken = true;
                    return;
                }
            }
            if careful {
                return; // one bounded write per POLLOUT
            }
        }
    }

    /// After the command ended: moves what the sandbox already wrote, until nothing more is
    /// readable right now or `deadline` passes (a host reader that stopped reading cannot hold
    /// husk). Never reads the host's stdin.
    pub fn drain(&mut self, deadline: Instant) {
        if matches!(self.src, Fd::Host(_)) {
            return;
        }
        while let Some(mut pfd) = self.interest() {
            let reading = pfd.events == libc::POLLIN;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let timeout = if reading {
                0
            } else {
                left.as_millis().max(1) as i32
            };
            match sys::poll(std::slice::from_mut(&mut pfd), timeout) {
                Ok(1) => self.step(pfd.revents),
                _ => return,
            }
        }
    }
}
