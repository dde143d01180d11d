//! Copying bytes between the host's stdio and a sandbox's pipes or PTY, driven by one poll loop.
//! Writes towards the sandbox are non-blocking and buffered, so a sandbox that stops reading its
//! stdin cannot stall husk; reads from the sandbox are bounded by one buffer per turn.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use husk_runtime::libc;
use husk_runtime::sys;

const BUF: usize = 64 * 1024;

/// One direction: bytes read from `src` are written to `dst`.
pub struct Pump {
    src: Fd,
    /// `None` once closed.
    dst: Option<Fd>,
    buf: Vec<u8>,
    pending: std::ops::Range<usize>,
    eof: bool,
    /// Close `dst` once `src` hits EOF and everything is written (a sandbox's stdin pipe).
    close_dst_on_eof: bool,
    closed: bool,
}

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

impl Pump {
    /// A pump from `src` to `dst`; `src` is made non-blocking when it is husk's own end.
    pub fn new(src: Fd, dst: Fd, close_dst_on_eof: bool) -> io::Result<Pump> {
        if let Fd::Owned(f) = &dst {
            sys::set_nonblocking(f.as_fd(), true)?;
        }
        if let Fd::Owned(f) = &src {
            sys::set_nonblocking(f.as_fd(), true)?;
        }
        Ok(Pump {
            src,
            dst: Some(dst),
            buf: vec![0; BUF],
            pending: 0..0,
            eof: false,
            close_dst_on_eof,
            closed: false,
        })
    }

    /// Whether this pump has finished for good.
    pub fn done(&self) -> bool {
        self.closed || (self.eof && self.pending.is_empty())
    }

    /// The poll entries this pump wants: read `src` when the buffer is empty, else write `dst`.
    pub fn interest(&self) -> Option<libc::pollfd> {
        if self.done() {
            return None;
        }
        Some(if self.pending.is_empty() {
            libc::pollfd {
                fd: self.src.fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }
        } else {
            libc::pollfd {
                fd: self.dst.as_ref()?.fd().as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            }
        })
    }

    /// Moves bytes after poll reported `revents` for this pump's entry.
    pub fn step(&mut self, revents: libc::c_short) {
        if revents == 0 || self.done() {
            return;
        }
        if self.pending.is_empty() {
            match sys::read(self.src.fd(), &mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(n) => self.pending = 0..n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // EIO is how a PTY master reports that the slave side closed.
                Err(_) => self.eof = true,
            }
        }
        self.flush();
        if self.eof && self.pending.is_empty() && self.close_dst_on_eof {
            self.closed = true;
            // Dropping husk's end delivers EOF to the sandbox.
            self.dst = None;
        }
    }

    fn flush(&mut self) {
        while !self.pending.is_empty() {
            let Some(dst) = &self.dst else {
                self.pending = 0..0;
                return;
            };
            let chunk = &self.buf[self.pending.clone()];
            match sys::write_some(dst.fd(), chunk) {
                Ok(n) => self.pending.start += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // The reader is gone (EPIPE): drop what it will never read.
                    self.pending = 0..0;
                    self.closed = true;
                    return;
                }
            }
        }
    }

    /// After the command ended: moves whatever is already readable, without waiting.
    pub fn drain(&mut self) {
        if let Fd::Owned(f) = &self.src {
            let _ = sys::set_nonblocking(f.as_fd(), true);
        } else {
            return; // never wait on the host's stdin once the command is gone
        }
        for _ in 0..4096 {
            if self.done() {
                return;
            }
            match sys::read(self.src.fd(), &mut self.buf) {
                Ok(0) => self.eof = true,
                Ok(n) => {
                    if let Some(Fd::Host(h)) = &self.dst {
                        let _ = sys::write_all(*h, &self.buf[..n]);
                    }
                }
                Err(_) => return,
            }
        }
    }
}
