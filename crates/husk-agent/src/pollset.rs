//! The agent's poll set: each descriptor is registered with a token saying what it belongs to,
//! so readiness is dispatched by token, never by an index computed from how many descriptors
//! came before it.

use std::os::fd::RawFd;

use crate::sudo::Slot;

/// What a polled descriptor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The connection to the server.
    Conn,
    /// The spawner's control socket: readable (closed) when the spawner is gone.
    Control,
    /// A kept sandbox's rendezvous: a new connection sent by a spawner.
    Rendezvous,
    /// SIGCHLD.
    Signals,
    /// The inotify descriptor of every watch.
    Watches,
    /// A process's output or stdin: (pid, which of its streams).
    Proc(u32, usize),
    /// A `sudo` client or the `sudo` listener.
    Sudo(Slot),
    /// A kernel's descriptor.
    Kernel(u32, RawFd),
}

/// Descriptors to poll, each with its token.
#[derive(Default)]
pub struct PollSet {
    fds: Vec<libc::pollfd>,
    tokens: Vec<Token>,
}

impl PollSet {
    /// Registers `fd` for `events` as `token`.
    pub fn add(&mut self, token: Token, fd: RawFd, events: i16) {
        self.fds.push(libc::pollfd {
            fd,
            events,
            revents: 0,
        });
        self.tokens.push(token);
    }

    /// Waits for readiness (see `husk_runtime::sys::poll`; EINTR is the caller's).
    pub fn poll(&mut self, timeout_ms: i32) -> std::io::Result<()> {
        husk_runtime::sys::poll(&mut self.fds, timeout_ms).map(|_| ())
    }

    /// The ready descriptors' tokens and events, in the order they were added.
    pub fn ready(&self) -> Vec<(Token, i16)> {
        self.tokens
            .iter()
            .zip(&self.fds)
            .filter(|(_, p)| p.revents != 0)
            .map(|(t, p)| (*t, p.revents))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn readiness_is_told_by_token_whatever_came_before() {
        let (r1, w1) = husk_runtime::sys::pipe().unwrap();
        let (r2, w2) = husk_runtime::sys::pipe().unwrap();
        let mut set = PollSet::default();
        set.add(Token::Conn, r1.as_raw_fd(), libc::POLLIN);
        for pid in 0..5 {
            // Descriptors of processes that come and go between rounds.
            set.add(Token::Proc(pid, 0), r1.as_raw_fd(), 0);
        }
        set.add(
            Token::Kernel(7, r2.as_raw_fd()),
            r2.as_raw_fd(),
            libc::POLLIN,
        );
        husk_runtime::sys::write_all(std::os::fd::AsFd::as_fd(&w2), b"x").unwrap();
        set.poll(1000).unwrap();
        assert_eq!(
            set.ready(),
            vec![(Token::Kernel(7, r2.as_raw_fd()), libc::POLLIN)]
        );
        drop((w1, w2));
    }
}
