//! Privileged helper processes of `husk serve`, and the channels to them.
//!
//! A helper does one kind of privileged work (the spawner: sandboxes; the network helper:
//! nftables, the router, sockets in sandboxes' namespaces) for a server that treats its own
//! input as hostile and should need no privilege for it. Each is forked while the server is
//! still single-threaded, keeps nothing of the server but its channels, and answers typed
//! requests: one postcard frame each way (a 4-byte little-endian length, at most
//! [`MAX_MESSAGE`], then the payload) over a `SOCK_STREAM` pair, with at most one descriptor
//! attached to its first bytes (`SCM_RIGHTS`), a failure answered as a typed [`Failure`].
//!
//! A helper is given several channels, each served by a thread of its own, so that one slow
//! request (an `nft` run) never holds up another (a socket for ingress). The server's side
//! ([`Channels`]) lends a free channel to each call for the time of its one request and
//! reply; calls are blocking, and take microseconds.

use std::io;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Condvar, Mutex};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::failure::{Failure, FailureKind};
use crate::sys;

/// Largest frame on a helper channel, either way (a list of templates with their sources is
/// the largest thing that crosses).
pub const MAX_MESSAGE: usize = 16 << 20;

/// Why a call to a helper failed.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The helper answered with a failure.
    #[error(transparent)]
    Failed(Failure),
    /// The helper is gone (it crashed, or was stopped).
    #[error("the {0} helper is gone")]
    Gone(&'static str),
    /// The helper's answer or the request itself broke the protocol.
    #[error("the {helper} helper: {message}")]
    Protocol {
        helper: &'static str,
        message: String,
    },
}

impl HelperError {
    /// The failure's kind (a helper gone, or a broken answer, is internal).
    pub fn kind(&self) -> FailureKind {
        match self {
            HelperError::Failed(f) => f.kind,
            HelperError::Gone(_) | HelperError::Protocol { .. } => FailureKind::Internal,
        }
    }
}

/// A forked helper as its server sees it: its pid and the server's ends of its channels.
#[derive(Debug)]
pub struct Forked {
    pub pid: libc::pid_t,
    pub channels: Vec<OwnedFd>,
}

/// Forks a helper named `name` with `channels` channels; the child runs `body` with its ends
/// and exits with what it returns. The calling process must be single-threaded (checked).
/// `keep` are descriptors of the server's that the helper keeps open (another helper's
/// channel it is given).
///
/// The child leaves the server's session (a Ctrl-C at the server's terminal is the server's
/// to handle), ignores the stop signals a service manager sends the whole group (the server
/// stops its helpers in order), dies with the server (`PR_SET_PDEATHSIG`), and closes every
/// descriptor but stdio and its channels: nothing of the server's (its listener, its
/// spawner's socket) stays open in it.
pub fn fork(
    name: &'static str,
    channels: usize,
    keep: &[RawFd],
    body: impl FnOnce(Vec<OwnedFd>) -> i32,
) -> Result<Forked, Failure> {
    let internal = |what: &str, e: io::Error| {
        Failure::new(
            FailureKind::Internal,
            format!("starting the {name} helper: {what}: {e}"),
        )
    };
    match sys::settled_thread_count() {
        Ok(1) => {}
        Ok(n) => {
            return Err(Failure::new(
                FailureKind::Internal,
                format!(
                    "the {name} helper must be started before any thread (this process has {n})"
                ),
            ))
        }
        Err(e) => return Err(internal("counting threads", e)),
    }
    let mut ours = Vec::with_capacity(channels);
    let mut theirs = Vec::with_capacity(channels);
    for _ in 0..channels.max(1) {
        let (a, b) = sys::stream_pair().map_err(|e| internal("socket pair", e))?;
        ours.push(a);
        theirs.push(b);
    }
    let parent = sys::getpid();
    // SAFETY: the process is single-threaded (checked just above).
    let pid = unsafe { sys::fork() }.map_err(|e| internal("fork", e))?;
    if pid == 0 {
        drop(ours);
        let _ = sys::setsid();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
            sys::ignore_signal(sig);
        }
        if sys::set_parent_death_signal(libc::SIGKILL).is_err() || sys::getppid() != parent {
            sys::exit_now(1);
        }
        let mut kept: Vec<RawFd> = theirs.iter().map(|c| c.as_raw_fd()).collect();
        kept.extend_from_slice(keep);
        sys::close_fds_from(3, &kept);
        let _ = sys::set_thread_name(name);
        // A panic must end the helper, never unwind into the server's code this child was
        // forked from (debug builds unwind; release builds abort).
        let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(theirs)));
        sys::exit_now(code.unwrap_or(101));
    }
    drop(theirs);
    Ok(Forked {
        pid,
        channels: ours,
    })
}

/// Encodes `msg` and sends it as one frame with `fd` attached, if any.
pub fn send<T: Serialize>(
    sock: BorrowedFd<'_>,
    msg: &T,
    fd: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let mut frame = vec![0u8; 4];
    postcard::to_io(msg, &mut frame).map_err(|e| io::Error::other(e.to_string()))?;
    let len = frame.len() - 4;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("message of {len} bytes (at most {MAX_MESSAGE})"),
        ));
    }
    frame[..4].copy_from_slice(&(len as u32).to_le_bytes());
    let fds: Vec<RawFd> = fd.iter().map(|f| f.as_raw_fd()).collect();
    // A blocking stream socket takes the whole frame in one sendmsg (the kernel waits for
    // room as it needs); the descriptor rides with its first bytes.
    sys::send_with_fds(sock, &frame, &fds)
}

/// One frame as received: `None` at end of file before a frame starts. A frame longer than
/// [`MAX_MESSAGE`] is refused before anything is allocated for it, and its connection must
/// be dropped (the rest of it is still unread); bytes that do not decode, or more than one
/// descriptor, are an `InvalidData` error after the whole frame was read (the channel stays
/// in step; the descriptors are closed).
pub fn recv<T: DeserializeOwned>(sock: BorrowedFd<'_>) -> io::Result<Option<(T, Option<OwnedFd>)>> {
    let mut head = [0u8; 4];
    let mut got = 0;
    let mut fds = Vec::new();
    while got < head.len() {
        let (n, more) = sys::recv_with_fds(sock, &mut head[got..])?;
        fds.extend(more);
        if n == 0 {
            if got == 0 && fds.is_empty() {
                return Ok(None);
            }
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        got += n;
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("a frame of {len} bytes (at most {MAX_MESSAGE})"),
        ));
    }
    let mut body = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match sys::read(sock, &mut body[got..])? {
            0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            n => got += n,
        }
    }
    if fds.len() > 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} descriptors with one message (at most 1)", fds.len()),
        ));
    }
    let msg = postcard::from_bytes(&body)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    Ok(Some((msg, fds.pop())))
}

/// Reads one frame and drops it unread (its descriptors closed); `false` at end of file.
fn skip(sock: BorrowedFd<'_>) -> io::Result<bool> {
    let mut head = [0u8; 4];
    let mut got = 0;
    while got < head.len() {
        let (n, _fds) = sys::recv_with_fds(sock, &mut head[got..])?;
        if n == 0 {
            return Ok(false);
        }
        got += n;
    }
    let len = u32::from_le_bytes(head) as usize;
    if len > MAX_MESSAGE {
        return Err(io::Error::from(io::ErrorKind::FileTooLarge));
    }
    let mut left = len;
    let mut buf = [0u8; 4096];
    while left > 0 {
        let want = left.min(buf.len());
        match sys::read(sock, &mut buf[..want])? {
            0 => return Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            n => left -= n,
        }
    }
    Ok(true)
}

/// Serves one channel on the calling thread until the server closes it: each request is
/// decoded and given to `handle` (with the channel, for a call that sends frames of its own
/// before its reply), whose reply (and descriptor) is sent back. A request that
/// does not decode is answered `bad(message)`, and the channel goes on.
pub fn serve_channel<Req, Rep>(
    sock: OwnedFd,
    mut handle: impl FnMut(Req, Option<OwnedFd>, BorrowedFd<'_>) -> (Rep, Option<OwnedFd>),
    bad: impl Fn(String) -> Rep,
) where
    Req: DeserializeOwned,
    Rep: Serialize,
{
    loop {
        let (reply, fd) = match recv::<Req>(sock.as_fd()) {
            Ok(None) => return,
            Ok(Some((req, fd))) => handle(req, fd, sock.as_fd()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => (bad(e.to_string()), None),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if send(sock.as_fd(), &reply, fd.as_ref().map(|f| f.as_fd())).is_err() {
            return;
        }
    }
}

/// In the helper, once it is set up: tells the server, on the first channel, that it is
/// ready (with what the server should know of it) or why it could not start. The first frame
/// of every helper is this `Result`.
pub fn ready<T: Serialize>(channels: &[OwnedFd], outcome: &Result<T, Failure>) -> io::Result<()> {
    match channels.first() {
        Some(first) => send(first.as_fd(), outcome, None),
        None => Err(io::Error::from(io::ErrorKind::NotConnected)),
    }
}

/// In the server, right after [`fork`]: waits for the helper's [`ready`]. A helper that failed
/// (or said nothing readable) is waited for, and its failure returned.
pub fn await_ready<T: DeserializeOwned>(name: &str, forked: &Forked) -> Result<T, Failure> {
    let outcome = match forked.channels.first() {
        Some(first) => recv::<Result<T, Failure>>(first.as_fd()),
        None => Err(io::Error::from(io::ErrorKind::NotConnected)),
    };
    let failure = match outcome {
        Ok(Some((Ok(ready), None))) => return Ok(ready),
        Ok(Some((Err(f), None))) => f,
        other => Failure::new(
            FailureKind::Internal,
            format!(
                "the {name} helper did not start: {}",
                match other {
                    Ok(None) => "it exited".to_string(),
                    Ok(Some(_)) => "a descriptor with its first frame".to_string(),
                    Err(e) => e.to_string(),
                }
            ),
        ),
    };
    let _ = sys::waitpid(forked.pid, 0);
    Err(failure)
}

/// In the helper: serves every channel on a thread of its own (named `thread`) until the
/// server has closed them all. A request that does not decode is answered `bad(message)`.
pub fn serve_channels<Req, Rep>(
    channels: Vec<OwnedFd>,
    thread: &str,
    handle: impl Fn(Req, Option<OwnedFd>, BorrowedFd<'_>) -> (Rep, Option<OwnedFd>) + Sync,
    bad: impl Fn(String) -> Rep + Sync,
) where
    Req: DeserializeOwned,
    Rep: Serialize,
{
    std::thread::scope(|s| {
        for ch in channels {
            let (handle, bad) = (&handle, &bad);
            // A thread that cannot start leaves its channel closed: the server drops it.
            let _ = std::thread::Builder::new()
                .name(thread.to_owned())
                .spawn_scoped(s, move || serve_channel(ch, handle, bad));
        }
    });
}

/// The channels free now, how many are lent, and whether they were closed.
#[derive(Debug, Default)]
struct Pool {
    free: Vec<OwnedFd>,
    lent: usize,
    closed: bool,
}

/// The server's ends of a helper's channels, lent one per call.
#[derive(Debug)]
pub struct Channels {
    name: &'static str,
    pool: Mutex<Pool>,
    returned: Condvar,
}

impl Channels {
    pub fn new(name: &'static str, channels: Vec<OwnedFd>) -> Channels {
        Channels {
            name,
            pool: Mutex::new(Pool {
                free: channels,
                ..Pool::default()
            }),
            returned: Condvar::new(),
        }
    }

    /// Sends `req` (with `fd`) on a free channel and waits for the reply. Blocking: call from
    /// a thread that may block (tokio's blocking pool).
    pub fn call<Req: Serialize, Rep: DeserializeOwned>(
        &self,
        req: &Req,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(Rep, Option<OwnedFd>), HelperError> {
        let mut lent = self.lend()?;
        lent.send(req, fd)?;
        lent.recv()
    }

    /// A free channel, for a call of several frames (a request, then a stream through a pipe,
    /// then one or two replies); it goes back to the pool when dropped. Blocking.
    pub fn lend(&self) -> Result<Lent<&Channels>, HelperError> {
        let sock = self.take()?;
        Ok(Lent::new(self, sock))
    }

    /// [`Self::lend`], for a call that outlives the borrow (a stream handed to another
    /// thread).
    pub fn lend_owned(self: Arc<Self>) -> Result<Lent<Arc<Channels>>, HelperError> {
        let sock = self.take()?;
        Ok(Lent::new(self, sock))
    }

    fn take(&self) -> Result<OwnedFd, HelperError> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if pool.closed {
                return Err(HelperError::Gone(self.name));
            }
            if let Some(sock) = pool.free.pop() {
                pool.lent += 1;
                return Ok(sock);
            }
            if pool.lent == 0 {
                // Every channel broke: none will come back.
                return Err(HelperError::Gone(self.name));
            }
            pool = self.returned.wait(pool).unwrap_or_else(|p| p.into_inner());
        }
    }

    fn give_back(&self, sock: OwnedFd, keep: bool) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.lent -= 1;
        if keep && !pool.closed {
            pool.free.push(sock);
        }
        drop(pool);
        self.returned.notify_all();
    }

    /// Closes every channel (those lent now when their call ends): the helper sees the end of
    /// each, and stops. Later calls fail with [`HelperError::Gone`].
    pub fn close(&self) {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.closed = true;
        pool.free.clear();
        drop(pool);
        self.returned.notify_all();
    }
}

/// A channel lent for one call ([`Channels::lend`]). Each [`Self::send`] owes a reply; a
/// channel dropped while replies are still owed reads them first (the helper finishes what it
/// was asked, e.g. an export whose pipe the caller closed), so the next call finds it in step.
/// A channel whose exchange broke (the helper gone, a reply that did not decode) is dropped,
/// never lent again.
pub struct Lent<C: Deref<Target = Channels>> {
    channels: C,
    sock: Option<OwnedFd>,
    /// Replies the helper still owes on this channel.
    owed: usize,
    broken: bool,
}

impl<C: Deref<Target = Channels>> Lent<C> {
    fn new(channels: C, sock: OwnedFd) -> Lent<C> {
        Lent {
            channels,
            sock: Some(sock),
            owed: 0,
            broken: false,
        }
    }

    /// Sends `req` (with `fd`): the helper owes one reply for it, and may send others before
    /// it (each read with [`Self::recv_more`]).
    pub fn send<Req: Serialize>(
        &mut self,
        req: &Req,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<(), HelperError> {
        let sock = self
            .sock
            .as_ref()
            .ok_or(HelperError::Gone(self.channels.name))?;
        match send(sock.as_fd(), req, fd) {
            Ok(()) => {
                self.owed += 1;
                Ok(())
            }
            Err(e) => Err(self.broke(e)),
        }
    }

    /// The reply a request owes (the last frame of its call).
    pub fn recv<Rep: DeserializeOwned>(&mut self) -> Result<(Rep, Option<OwnedFd>), HelperError> {
        let reply = self.recv_more()?;
        self.owed = self.owed.saturating_sub(1);
        Ok(reply)
    }

    /// A frame the helper sends before the reply it owes (e.g. "the export starts").
    pub fn recv_more<Rep: DeserializeOwned>(
        &mut self,
    ) -> Result<(Rep, Option<OwnedFd>), HelperError> {
        let sock = self
            .sock
            .as_ref()
            .ok_or(HelperError::Gone(self.channels.name))?;
        match recv(sock.as_fd()) {
            Ok(Some(reply)) => Ok(reply),
            Ok(None) => {
                self.broken = true;
                Err(HelperError::Gone(self.channels.name))
            }
            Err(e) => Err(self.broke(e)),
        }
    }

    /// The frame just read with [`Self::recv_more`] was the reply owed after all (a failure
    /// the helper answered before the stream began).
    pub fn settled(&mut self) {
        self.owed = self.owed.saturating_sub(1);
    }

    fn broke(&mut self, e: io::Error) -> HelperError {
        self.broken = true;
        match e.raw_os_error() {
            Some(libc::EPIPE) | Some(libc::ECONNRESET) => HelperError::Gone(self.channels.name),
            _ => HelperError::Protocol {
                helper: self.channels.name,
                message: e.to_string(),
            },
        }
    }
}

impl<C: Deref<Target = Channels>> Drop for Lent<C> {
    fn drop(&mut self) {
        let Some(sock) = self.sock.take() else {
            return;
        };
        // Frames still owed are read and dropped, whatever they are, until the last reply.
        // The helper sends them without waiting for anything of ours but pipes the caller
        // has closed by now.
        while self.owed > 0 && !self.broken {
            match skip(sock.as_fd()) {
                Ok(true) => self.owed -= 1,
                _ => self.broken = true,
            }
        }
        self.channels.give_back(sock, !self.broken);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    enum Req {
        Echo(String),
        WithFd,
    }

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    enum Rep {
        Echo(String),
        Fd,
        Bad(String),
    }

    fn serve_pair() -> (Channels, std::thread::JoinHandle<()>) {
        let (a, b) = sys::stream_pair().unwrap();
        let t = std::thread::spawn(move || {
            serve_channel::<Req, Rep>(
                b,
                |req, fd, _| match req {
                    Req::Echo(s) => (Rep::Echo(s), None),
                    Req::WithFd => (Rep::Fd, fd),
                },
                Rep::Bad,
            )
        });
        (Channels::new("test", vec![a]), t)
    }

    #[test]
    fn calls_carry_messages_and_descriptors() {
        let (ch, t) = serve_pair();
        let (rep, fd) = ch.call::<_, Rep>(&Req::Echo("hi".into()), None).unwrap();
        assert_eq!((rep, fd.is_none()), (Rep::Echo("hi".into()), true));
        let (r, _w) = sys::pipe().unwrap();
        let (rep, fd) = ch.call::<_, Rep>(&Req::WithFd, Some(r.as_fd())).unwrap();
        assert_eq!(rep, Rep::Fd);
        assert!(fd.is_some());
        drop(ch);
        t.join().unwrap();
    }

    /// Writes `body` as one frame (its length first) with `fds` attached.
    fn raw_frame(sock: BorrowedFd<'_>, body: &[u8], fds: &[RawFd]) {
        let frame = [&(body.len() as u32).to_le_bytes()[..], body].concat();
        sys::send_with_fds(sock, &frame, fds).unwrap();
    }

    #[test]
    fn hostile_frames_are_answered_and_the_channel_goes_on() {
        let (a, b) = sys::stream_pair().unwrap();
        let t = std::thread::spawn(move || {
            serve_channel::<Req, Rep>(b, |_, _, _| (Rep::Fd, None), Rep::Bad)
        });
        // Not a request.
        raw_frame(a.as_fd(), &[0xff, 0xff, 0xff], &[]);
        let (rep, _) = recv::<Rep>(a.as_fd()).unwrap().unwrap();
        assert!(matches!(rep, Rep::Bad(_)), "{rep:?}");
        // Two descriptors where one is allowed: refused, both closed.
        let (r1, _w1) = sys::pipe().unwrap();
        let (r2, _w2) = sys::pipe().unwrap();
        let bytes = postcard::to_stdvec(&Req::WithFd).unwrap();
        raw_frame(a.as_fd(), &bytes, &[r1.as_raw_fd(), r2.as_raw_fd()]);
        let (rep, fd) = recv::<Rep>(a.as_fd()).unwrap().unwrap();
        assert!(
            matches!(&rep, Rep::Bad(m) if m.contains("2 descriptors")),
            "{rep:?}"
        );
        assert!(fd.is_none());
        // Still serving, in step.
        send(a.as_fd(), &Req::Echo("x".into()), None).unwrap();
        let (rep, _) = recv::<Rep>(a.as_fd()).unwrap().unwrap();
        assert_eq!(rep, Rep::Fd);
        // A frame claiming more than the bound ends the channel, unread.
        sys::write_all(a.as_fd(), &(MAX_MESSAGE as u32 + 1).to_le_bytes()).unwrap();
        t.join().unwrap();
        assert!(recv::<Rep>(a.as_fd()).unwrap().is_none());
    }

    #[test]
    fn large_frames_cross_whole() {
        let (ch, t) = serve_pair();
        let big = "x".repeat(3 << 20);
        let (rep, _) = ch.call::<_, Rep>(&Req::Echo(big.clone()), None).unwrap();
        assert_eq!(rep, Rep::Echo(big));
        drop(ch);
        t.join().unwrap();
    }

    #[test]
    fn a_gone_helper_is_told_and_its_channel_dropped() {
        let (a, b) = sys::stream_pair().unwrap();
        drop(b);
        let ch = Channels::new("test", vec![a]);
        let err = ch.call::<_, Rep>(&Req::Echo("x".into()), None).unwrap_err();
        assert!(matches!(err, HelperError::Gone("test")), "{err}");
        assert!(ch.pool.lock().unwrap().free.is_empty());
        // And every later call is told at once, not left waiting for a channel.
        let err = ch.call::<_, Rep>(&Req::Echo("x".into()), None).unwrap_err();
        assert!(matches!(err, HelperError::Gone("test")), "{err}");
    }
}

/// Largest chunk of a [`ChunkWriter`] stream.
pub const MAX_CHUNK: usize = 1 << 20;

/// The pipe buffer a stream to or from a helper asks for: fewer wake-ups per megabyte than
/// the default 64 KiB.
const STREAM_PIPE: usize = 1 << 20;

/// A pipe for a stream to or from a helper (read end, write end), its buffer made larger where
/// the kernel allows (best effort: a user past its pipe allowance keeps the default).
pub fn stream_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = sys::pipe()?;
    let _ = sys::set_pipe_size(w.as_fd(), STREAM_PIPE);
    Ok((r, w))
}

/// What [`send_stream`] did.
#[derive(Debug)]
pub enum Sent {
    /// All of it, and the end mark.
    Whole,
    /// The helper stopped reading (a broken pipe): its answer says why.
    Refused,
    /// The reader failed: the stream was left without its end, which the helper takes as
    /// broken.
    ReaderFailed(io::Error),
}

/// The caller's side of a stream into a helper: copies `reader` into the pipe's write end as
/// [`ChunkWriter`] chunks of up to 128 KiB (filled before they are written, whatever sizes
/// the reader gives), then the end mark.
pub fn send_stream(mut reader: impl io::Read, pipe: OwnedFd) -> Sent {
    use io::Write;
    let mut out = ChunkWriter::new(std::fs::File::from(pipe));
    let mut buf = vec![0u8; 128 << 10];
    loop {
        let mut filled = 0;
        let mut ended = false;
        while filled < buf.len() {
            match reader.read(&mut buf[filled..]) {
                Ok(0) => {
                    ended = true;
                    break;
                }
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Sent::ReaderFailed(e),
            }
        }
        if filled > 0 && out.write_all(&buf[..filled]).is_err() {
            return Sent::Refused;
        }
        if ended {
            return match out.finish() {
                Ok(()) => Sent::Whole,
                Err(_) => Sent::Refused,
            };
        }
    }
}

/// How a helper reads a [`ChunkWriter`] stream from a pipe: through a buffer, so that the
/// small reads of a consumer (a tar reader's headers, `io::copy`'s 8 KiB) are not each a
/// system call.
pub fn chunk_reader(pipe: OwnedFd) -> ChunkReader<io::BufReader<std::fs::File>> {
    ChunkReader::new(io::BufReader::with_capacity(
        256 << 10,
        std::fs::File::from(pipe),
    ))
}

/// A byte stream for a helper, through a pipe passed with a request (an upload): chunks of a
/// 4-byte little-endian length and that many bytes, ended by a length of 0
/// ([`ChunkWriter::finish`]). A stream that stops without its end (the writer dropped after
/// its own source failed) is broken for the [`ChunkReader`]: the helper throws away what it
/// got, never keeps a shorter upload that looks whole.
pub struct ChunkWriter<W: io::Write> {
    inner: W,
}

impl<W: io::Write> ChunkWriter<W> {
    pub fn new(inner: W) -> ChunkWriter<W> {
        ChunkWriter { inner }
    }

    /// Writes the end of the stream.
    pub fn finish(mut self) -> io::Result<()> {
        self.inner.write_all(&0u32.to_le_bytes())?;
        self.inner.flush()
    }
}

impl<W: io::Write> io::Write for ChunkWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min(MAX_CHUNK);
        self.inner.write_all(&(n as u32).to_le_bytes())?;
        self.inner.write_all(&buf[..n])?;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The helper's side of a [`ChunkWriter`] stream: the bytes, then end of file at the end
/// mark; an `UnexpectedEof` error when the stream stops without it, `InvalidData` for a chunk
/// longer than [`MAX_CHUNK`]. Nothing after the end mark is read.
pub struct ChunkReader<R: io::Read> {
    inner: R,
    /// Bytes left of the current chunk.
    left: usize,
    ended: bool,
}

impl<R: io::Read> ChunkReader<R> {
    pub fn new(inner: R) -> ChunkReader<R> {
        ChunkReader {
            inner,
            left: 0,
            ended: false,
        }
    }
}

impl<R: io::Read> io::Read for ChunkReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.ended || buf.is_empty() {
            return Ok(0);
        }
        if self.left == 0 {
            let mut head = [0u8; 4];
            self.inner.read_exact(&mut head).map_err(|e| {
                if e.kind() == io::ErrorKind::UnexpectedEof {
                    io::Error::new(io::ErrorKind::UnexpectedEof, "the stream broke off")
                } else {
                    e
                }
            })?;
            let len = u32::from_le_bytes(head) as usize;
            if len == 0 {
                self.ended = true;
                return Ok(0);
            }
            if len > MAX_CHUNK {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("a chunk of {len} bytes (at most {MAX_CHUNK})"),
                ));
            }
            self.left = len;
        }
        let want = buf.len().min(self.left);
        match self.inner.read(&mut buf[..want])? {
            0 => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the stream broke off",
            )),
            n => {
                self.left -= n;
                Ok(n)
            }
        }
    }
}

#[cfg(test)]
mod chunk_tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn a_chunked_stream_reads_back_whole_and_a_cut_one_is_an_error() {
        let data: Vec<u8> = (0..(3 * MAX_CHUNK + 17)).map(|i| i as u8).collect();
        let mut framed = Vec::new();
        let mut w = ChunkWriter::new(&mut framed);
        w.write_all(&data).unwrap();
        w.finish().unwrap();
        // Bytes after the end mark are not part of the stream.
        framed.extend_from_slice(b"trailing");
        let mut got = Vec::new();
        ChunkReader::new(&framed[..]).read_to_end(&mut got).unwrap();
        assert_eq!(got, data);
        // Without the end mark (the writer dropped): broken, wherever it stops.
        let whole_len = framed.len() - b"trailing".len() - 4;
        for cut in [0, 2, 4, 100, whole_len] {
            let mut got = Vec::new();
            let e = ChunkReader::new(&framed[..cut])
                .read_to_end(&mut got)
                .unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}");
        }
        // A length beyond the bound is refused before anything is read for it.
        let mut bad = ((MAX_CHUNK + 1) as u32).to_le_bytes().to_vec();
        bad.extend_from_slice(&[0; 16]);
        let e = ChunkReader::new(&bad[..])
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        // An empty stream is just the end mark.
        let mut got = Vec::new();
        ChunkReader::new(&0u32.to_le_bytes()[..])
            .read_to_end(&mut got)
            .unwrap();
        assert!(got.is_empty());
    }
}
