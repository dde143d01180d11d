//! SOCK_SEQPACKET unix sockets in the abstract namespace, for the sandbox-internal sudo broker.
//!
//! Abstract names live in the caller's network namespace (each sandbox has its own) and, under
//! husk's Landlock fence, can only be reached from within the sandbox's own Landlock domain.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::cvt_i;

/// The address of abstract `name` (no leading NUL in `name`) and its length.
fn address(name: &[u8]) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid (empty) value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if name.is_empty() || name.len() + 1 > addr.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // sun_path[0] stays NUL: the abstract namespace.
    for (i, b) in name.iter().enumerate() {
        addr.sun_path[i + 1] = *b as libc::c_char;
    }
    let len = size_of::<libc::sa_family_t>() + 1 + name.len();
    Ok((addr, len as libc::socklen_t))
}

fn socket(nonblocking: bool) -> io::Result<OwnedFd> {
    let mut ty = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC;
    if nonblocking {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: socket takes integers only.
    let fd = cvt_i(unsafe { libc::socket(libc::AF_UNIX, ty, 0) })?;
    // SAFETY: socket returned a new fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A non-blocking listening socket bound to abstract `name`.
pub fn listen_abstract(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = socket(true)?;
    let (addr, len) = address(name)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    cvt_i(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    // SAFETY: listen takes integers only.
    cvt_i(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
    Ok(fd)
}

/// A blocking socket connected to abstract `name`.
pub fn connect_abstract(name: &[u8]) -> io::Result<OwnedFd> {
    let fd = socket(false)?;
    let (addr, len) = address(name)?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    cvt_i(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    })?;
    Ok(fd)
}

/// Accepts one connection (non-blocking, close-on-exec); `Ok(None)` when none is waiting.
pub fn accept(listener: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    // SAFETY: NULL address pointers are allowed (the peer's address is not wanted).
    let r = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    match cvt_i(r) {
        // SAFETY: accept4 returned a new fd owned by nobody else.
        Ok(fd) => Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) })),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_client_reaches_a_listener_and_passes_a_message() {
        let name = format!("husk-test-{:x}", crate::sys::random_u64().unwrap());
        let listener = listen_abstract(name.as_bytes()).unwrap();
        assert!(accept(listener.as_fd()).unwrap().is_none());
        let client = connect_abstract(name.as_bytes()).unwrap();
        let server = accept(listener.as_fd()).unwrap().expect("no connection");
        crate::sys::send_with_fds(client.as_fd(), b"hi", &[]).unwrap();
        let mut buf = [0u8; 8];
        let mut n = 0;
        for _ in 0..1000 {
            match crate::sys::recv_with_fds(server.as_fd(), &mut buf) {
                Ok((k, _)) => {
                    n = k;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(&buf[..n], b"hi");
        assert!(connect_abstract(b"husk-test-nobody-listens-here").is_err());
        assert!(listen_abstract(b"").is_err());
        assert!(listen_abstract(&[b'x'; 200]).is_err());
    }
}
