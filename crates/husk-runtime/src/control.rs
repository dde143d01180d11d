//! The control channel between the spawner and a sandbox's PID 1 (husk's init).
//!
//! One SOCK_SEQPACKET socket pair per sandbox: every message is one datagram, bounded by
//! [`MAX_MESSAGE`], so the spawner never reads an unbounded or partial message from the
//! sandbox side. Encoding: a tag byte, then fixed little-endian fields, then (for text) UTF-8.
//! Everything init sends is treated as untrusted by the spawner: unknown tags and malformed
//! lengths are errors, text is truncated.
//!
//! This is the seed of the versioned host<->agent protocol that `husk serve` will speak.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd, RawFd};

use crate::sys::{self, ExitStatus};

/// Upper bound of one message, in bytes.
pub const MAX_MESSAGE: usize = 1024;

/// Messages from init to the spawner.
#[derive(Debug)]
pub enum FromInit {
    /// Init has unshared its user namespace and waits for its uid/gid maps.
    NeedIdMap,
    /// The sandbox's writable layer (the overlay's upper directory on its size-capped tmpfs),
    /// opened by init while it is still husk's own code, before anything of the sandbox runs:
    /// the spawner keeps it to copy the layer out later (pauses, snapshots). Sent at most
    /// once, before [`FromInit::NeedIdMap`].
    Layer { upper: OwnedFd },
    /// The sandbox is set up; when a PTY was asked for, its master end is attached.
    Ready { pty_master: Option<OwnedFd> },
    /// Set-up failed before the command could start.
    SetupFailed(String),
    /// The command could not be executed (errno of execve, e.g. ENOENT).
    ExecFailed { errno: i32 },
    /// The command ended.
    Exited(ExitStatus),
    /// The command outlived the spec's timeout (and PID 1 killed everything).
    TimedOut,
}

/// Messages from the spawner to init.
#[derive(Debug)]
pub enum ToInit {
    /// The uid/gid maps are written and the cgroups are complete; the attached fds are the v1
    /// `tasks` files init writes "0" to, to join them.
    IdMapDone { cgroup_tasks: Vec<OwnedFd> },
    /// The sandbox's network namespace (created by the spawner while init builds the root).
    NetNs { netns: OwnedFd },
    /// Start the command now.
    Start,
    /// Forward this signal to the command.
    Signal(i32),
}

const T_NEED_MAP: u8 = 1;
const T_READY: u8 = 2;
const T_SETUP_FAILED: u8 = 3;
const T_EXEC_FAILED: u8 = 4;
const T_EXITED: u8 = 5;
const T_SIGNALED: u8 = 6;
const T_TIMED_OUT: u8 = 7;
const T_LAYER: u8 = 8;
const T_MAP_DONE: u8 = 101;
const T_SIGNAL: u8 = 102;
const T_START: u8 = 103;
const T_NETNS: u8 = 104;

fn int(tag: u8, v: i32) -> [u8; 5] {
    let b = v.to_le_bytes();
    [tag, b[0], b[1], b[2], b[3]]
}

fn read_int(body: &[u8]) -> io::Result<i32> {
    let b: [u8; 4] = body
        .try_into()
        .map_err(|_| bad("integer field of wrong length"))?;
    Ok(i32::from_le_bytes(b))
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("control message: {what}"),
    )
}

/// The fd numbers to attach to a message (valid while the owners are borrowed).
fn raw<'a>(fds: impl IntoIterator<Item = &'a OwnedFd>) -> Vec<RawFd> {
    fds.into_iter()
        .map(std::os::fd::AsRawFd::as_raw_fd)
        .collect()
}

/// Sends a message from init.
pub fn send_from_init(sock: BorrowedFd<'_>, msg: &FromInit) -> io::Result<()> {
    match msg {
        FromInit::NeedIdMap => sys::send_with_fds(sock, &[T_NEED_MAP], &[]),
        FromInit::Layer { upper } => sys::send_with_fds(sock, &[T_LAYER], &raw([upper])),
        FromInit::Ready { pty_master } => sys::send_with_fds(sock, &[T_READY], &raw(pty_master)),
        FromInit::SetupFailed(text) => {
            let mut buf = vec![T_SETUP_FAILED];
            let mut end = text.len().min(MAX_MESSAGE - 1);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            buf.extend_from_slice(&text.as_bytes()[..end]);
            sys::send_with_fds(sock, &buf, &[])
        }
        FromInit::ExecFailed { errno } => {
            sys::send_with_fds(sock, &int(T_EXEC_FAILED, *errno), &[])
        }
        FromInit::Exited(ExitStatus::Exited(c)) => {
            sys::send_with_fds(sock, &int(T_EXITED, *c), &[])
        }
        FromInit::Exited(ExitStatus::Signaled(s)) => {
            sys::send_with_fds(sock, &int(T_SIGNALED, *s), &[])
        }
        FromInit::TimedOut => sys::send_with_fds(sock, &[T_TIMED_OUT], &[]),
    }
}

/// Receives one message from init; `Ok(None)` when init closed its end (it died).
pub fn recv_from_init(sock: BorrowedFd<'_>) -> io::Result<Option<FromInit>> {
    let mut buf = [0u8; MAX_MESSAGE];
    let (n, mut fds) = match sys::recv_with_fds(sock, &mut buf) {
        // Init exited without reading something we sent: the kernel reports that once as
        // ECONNRESET, but what init sent before exiting (its failure report) is still queued.
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => sys::recv_with_fds(sock, &mut buf)?,
        other => other?,
    };
    if n == 0 {
        return Ok(None);
    }
    let (tag, body) = (buf[0], &buf[1..n]);
    let msg = match tag {
        T_NEED_MAP => FromInit::NeedIdMap,
        T_READY => {
            if fds.len() > 1 {
                return Err(bad("too many fds"));
            }
            FromInit::Ready {
                pty_master: fds.pop(),
            }
        }
        T_SETUP_FAILED => FromInit::SetupFailed(String::from_utf8_lossy(body).into_owned()),
        T_EXEC_FAILED => FromInit::ExecFailed {
            errno: read_int(body)?,
        },
        T_EXITED => {
            let c = read_int(body)?;
            if !(0..=255).contains(&c) {
                return Err(bad("exit code out of range"));
            }
            FromInit::Exited(ExitStatus::Exited(c))
        }
        T_SIGNALED => {
            let s = read_int(body)?;
            if !(1..=64).contains(&s) {
                return Err(bad("signal out of range"));
            }
            FromInit::Exited(ExitStatus::Signaled(s))
        }
        T_TIMED_OUT => FromInit::TimedOut,
        T_LAYER => match (fds.pop(), fds.is_empty(), body.is_empty()) {
            (Some(upper), true, true) => FromInit::Layer { upper },
            _ => return Err(bad("a layer message carries exactly one fd and no body")),
        },
        _ => return Err(bad("unknown tag")),
    };
    if !fds.is_empty() && !matches!(msg, FromInit::Ready { .. }) {
        return Err(bad("unexpected fds"));
    }
    Ok(Some(msg))
}

/// Sends a message to init.
pub fn send_to_init(sock: BorrowedFd<'_>, msg: &ToInit) -> io::Result<()> {
    match msg {
        ToInit::IdMapDone { cgroup_tasks } => {
            sys::send_with_fds(sock, &[T_MAP_DONE], &raw(cgroup_tasks))
        }
        ToInit::Signal(s) => sys::send_with_fds(sock, &int(T_SIGNAL, *s), &[]),
        ToInit::Start => sys::send_with_fds(sock, &[T_START], &[]),
        ToInit::NetNs { netns } => sys::send_with_fds(sock, &[T_NETNS], &raw([netns])),
    }
}

/// Receives one message from the spawner; `Ok(None)` when the spawner is gone.
pub fn recv_to_init(sock: impl AsFd) -> io::Result<Option<ToInit>> {
    let mut buf = [0u8; 16];
    let (n, fds) = sys::recv_with_fds(sock.as_fd(), &mut buf)?;
    if n == 0 {
        return Ok(None);
    }
    match buf[0] {
        T_MAP_DONE => Ok(Some(ToInit::IdMapDone { cgroup_tasks: fds })),
        T_SIGNAL => Ok(Some(ToInit::Signal(read_int(&buf[1..n])?))),
        T_START => Ok(Some(ToInit::Start)),
        T_NETNS => match <[OwnedFd; 1]>::try_from(fds) {
            Ok([netns]) => Ok(Some(ToInit::NetNs { netns })),
            Err(_) => Err(bad("network namespace message without exactly one fd")),
        },
        _ => Err(bad("unknown tag")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn messages_round_trip_and_garbage_is_rejected() {
        let (a, b) = sys::seqpacket_pair().unwrap();
        send_from_init(a.as_fd(), &FromInit::Exited(ExitStatus::Signaled(9))).unwrap();
        match recv_from_init(b.as_fd()).unwrap() {
            Some(FromInit::Exited(ExitStatus::Signaled(9))) => {}
            other => panic!("unexpected {other:?}"),
        }
        let long = "x".repeat(5000);
        send_from_init(a.as_fd(), &FromInit::SetupFailed(long)).unwrap();
        match recv_from_init(b.as_fd()).unwrap() {
            Some(FromInit::SetupFailed(t)) => assert_eq!(t.len(), MAX_MESSAGE - 1),
            other => panic!("unexpected {other:?}"),
        }
        sys::send_with_fds(a.as_fd(), &[T_EXITED, 1, 2, 3, 4], &[]).unwrap();
        assert!(
            recv_from_init(b.as_fd()).is_err(),
            "exit code 0x04030201 accepted"
        );
        sys::send_with_fds(a.as_fd(), &[200], &[]).unwrap();
        assert!(recv_from_init(b.as_fd()).is_err(), "unknown tag accepted");
        send_to_init(b.as_fd(), &ToInit::Signal(15)).unwrap();
        assert!(matches!(
            recv_to_init(&a).unwrap(),
            Some(ToInit::Signal(15))
        ));
        drop(a);
        assert!(recv_from_init(b.as_fd()).unwrap().is_none());
    }

    #[test]
    fn a_report_sent_before_init_died_is_not_lost() {
        let (init, spawner) = sys::seqpacket_pair().unwrap();
        send_from_init(init.as_fd(), &FromInit::SetupFailed("mount failed".into())).unwrap();
        // The spawner's message is never read: init dies with it queued.
        send_to_init(spawner.as_fd(), &ToInit::Start).unwrap();
        drop(init);
        match recv_from_init(spawner.as_fd()).unwrap() {
            Some(FromInit::SetupFailed(t)) => assert_eq!(t, "mount failed"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(recv_from_init(spawner.as_fd()).unwrap().is_none());
    }
}
