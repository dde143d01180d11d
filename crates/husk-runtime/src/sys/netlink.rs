//! Netlink sockets (husk-net reads what nftables logs through `NETLINK_NETFILTER`), socket
//! options, and the type of a namespace file.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::cvt_i;

/// A `sockaddr_nl` of `pid` (0: the kernel, or "assign one" when binding).
fn sockaddr_nl(pid: u32) -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    addr.nl_pid = pid;
    addr
}

/// A non-blocking raw netlink socket of `protocol`, bound (the kernel assigns its port), in the
/// calling thread's network namespace.
pub fn netlink_socket(protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall with constant arguments.
    let raw = cvt_i(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            protocol,
        )
    })?;
    // SAFETY: `raw` is a descriptor just opened and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let addr = sockaddr_nl(0);
    // SAFETY: `addr` is a valid sockaddr_nl of the length given.
    cvt_i(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&raw const addr).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    })?;
    Ok(fd)
}

/// Sends `msg` to the kernel in one datagram; a short send is an error.
pub fn netlink_send(fd: BorrowedFd<'_>, msg: &[u8]) -> io::Result<()> {
    let to = sockaddr_nl(0);
    // SAFETY: `msg` is readable for its length and `to` is a valid sockaddr_nl.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&raw const to).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != msg.len() {
        return Err(io::Error::other("netlink: short send"));
    }
    Ok(())
}

/// One datagram into `buf` without waiting: its length (at most `buf.len()`, the rest of a
/// longer one is lost) and the sender's port (0: the kernel). `WouldBlock` when none is
/// queued; `ENOBUFS` when the kernel dropped some (the caller counts and goes on).
pub fn netlink_recv(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, u32)> {
    let mut from = sockaddr_nl(0);
    let mut from_len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
    // SAFETY: `buf` is writable for its length, `from` for `from_len` bytes; the kernel writes
    // no more than those.
    let n = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            (&raw mut from).cast(),
            &mut from_len,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(((n as usize).min(buf.len()), from.nl_pid))
}

/// setsockopt(2) of an `int` option at `SOL_SOCKET`.
pub fn set_socket_int(fd: BorrowedFd<'_>, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: `value` is a c_int readable for the length given.
    cvt_i(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw const value).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })?;
    Ok(())
}

/// The kind of namespace a namespace file (`/proc/PID/ns/*`) is: a `CLONE_NEW*` constant.
pub fn namespace_type(fd: BorrowedFd<'_>) -> io::Result<libc::c_int> {
    // NS_GET_NSTYPE (linux/nsfs.h: _IO(0xb7, 0x3)).
    const NS_GET_NSTYPE: libc::c_ulong = 0xb703;
    // SAFETY: an ioctl without arguments on a valid descriptor.
    cvt_i(unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_namespace_file_says_its_type_and_another_file_is_refused() {
        let net = std::fs::File::open("/proc/self/ns/net").unwrap();
        assert_eq!(namespace_type(net.as_fd()).unwrap(), libc::CLONE_NEWNET);
        let uts = std::fs::File::open("/proc/self/ns/uts").unwrap();
        assert_eq!(namespace_type(uts.as_fd()).unwrap(), libc::CLONE_NEWUTS);
        let plain = std::fs::File::open("/proc/self/status").unwrap();
        assert!(namespace_type(plain.as_fd()).is_err());
    }

    #[test]
    fn a_netlink_socket_talks_to_the_kernel() {
        // NETLINK_ROUTE needs no privilege: ask for the links, expect the kernel's answer.
        let fd = netlink_socket(libc::NETLINK_ROUTE).unwrap();
        set_socket_int(fd.as_fd(), libc::SO_RCVBUF, 1 << 16).unwrap();
        // RTM_GETLINK dump request: nlmsghdr (16 bytes) + ifinfomsg (16 bytes).
        let mut msg = vec![0u8; 32];
        msg[0..4].copy_from_slice(&32u32.to_ne_bytes());
        msg[4..6].copy_from_slice(&libc::RTM_GETLINK.to_ne_bytes());
        let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
        msg[6..8].copy_from_slice(&flags.to_ne_bytes());
        netlink_send(fd.as_fd(), &msg).unwrap();
        let mut pfd = [libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        assert_eq!(super::super::poll(&mut pfd, 5000).unwrap(), 1);
        let mut buf = vec![0u8; 64 << 10];
        let (n, from) = netlink_recv(fd.as_fd(), &mut buf).unwrap();
        assert!(n >= 16, "{n}");
        assert_eq!(from, 0, "not from the kernel");
    }
}
