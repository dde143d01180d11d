//! File descriptors: pipes, sockets with fd passing, poll, reads and writes, stdio policy.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use super::{cvt_i, open};

/// A pipe with both ends close-on-exec: (read, write).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    cvt_i(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 returned two new fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Asks for a pipe buffer of `bytes` (`F_SETPIPE_SZ`); returns the size the kernel gave. An
/// unprivileged caller gets at most `/proc/sys/fs/pipe-max-size`, and nothing more once its
/// user holds `pipe-user-pages-soft` pages of pipes (`EPERM`).
pub fn set_pipe_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_SETPIPE_SZ takes an integer and touches no memory.
    let got = cvt_i(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, want) })?;
    Ok(usize::try_from(got).unwrap_or(0))
}

/// A connected pair of close-on-exec SOCK_SEQPACKET unix sockets.
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    cvt_i(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair returned two new fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A connected pair of close-on-exec SOCK_STREAM unix sockets.
pub fn stream_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    cvt_i(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: socketpair returned two new fds owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one datagram with optional fds attached (SCM_RIGHTS).
pub fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    const MAX_FDS: usize = 4;
    assert!(fds.len() <= MAX_FDS, "send_with_fds: at most {MAX_FDS} fds");
    // u64 storage keeps the control buffer aligned for cmsghdr.
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let fd_bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: the control buffer (64 bytes) holds one cmsghdr with up to MAX_FDS fds,
        // CMSG_FIRSTHDR points into it and CMSG_DATA has room for `fds`.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: msg points at live buffers for the duration of the call.
    retry_eintr(|| unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })?;
    Ok(())
}

/// Receives one datagram into `buf` and up to 4 fds. Returns (bytes, fds); 0 bytes = peer closed.
/// A datagram longer than `buf` is an error (the protocol bounds every message), and so are
/// descriptors that were sent but not received ([`recv_with_fds_lossy`]).
pub fn recv_with_fds(sock: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    match recv_with_fds_lossy(sock, buf)? {
        (n, fds, false) => Ok((n, fds)),
        (_, _, true) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "descriptors sent with a message were lost (this process is out of file \
             descriptors, or more came than expected)",
        )),
    }
}

/// [`recv_with_fds`], and whether descriptors that came with the datagram were lost
/// (`MSG_CTRUNC`: the receiver is at its `RLIMIT_NOFILE`, or more came than fit): the caller
/// still gets the datagram, to undo what it reports.
pub fn recv_with_fds_lossy(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
) -> io::Result<(usize, Vec<OwnedFd>, bool)> {
    let mut cbuf = [0u64; 8];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is a valid "empty" value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf);
    // SAFETY: msg points at live buffers for the duration of the call.
    let n = retry_eintr(|| unsafe {
        libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC)
    })?;
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`, with the CMSG_* macros
    // that bound every access by msg_controllen; each SCM_RIGHTS fd is new and owned by us.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let len = ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / size_of::<RawFd>();
                for i in 0..len {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message too long",
        ));
    }
    Ok((n, fds, msg.msg_flags & libc::MSG_CTRUNC != 0))
}

/// poll(2) over `fds`; fills each entry's `revents` and returns how many are ready. EINTR is
/// returned to the caller (its loop decides).
pub fn poll(fds: &mut [libc::pollfd], timeout_ms: libc::c_int) -> io::Result<usize> {
    // SAFETY: the slice is a valid array of pollfd of the given length.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    Ok(cvt_i(r)? as usize)
}

/// Takes an exclusive `flock` on `fd` if nobody holds one: `Ok(false)` when held elsewhere.
/// (std's `File::try_lock` does the same from Rust 1.89, above husk's minimum version.)
pub fn flock_try_exclusive(fd: BorrowedFd<'_>) -> io::Result<bool> {
    // SAFETY: no pointers; the fd is valid for the call.
    match cvt_i(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Releases a `flock` held on `fd`.
pub fn flock_unlock(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: no pointers; the fd is valid for the call.
    cvt_i(unsafe { libc::flock(fd.as_raw_fd(), libc::LOCK_UN) }).map(drop)
}

/// Writes all of `buf` to a raw fd, retrying on EINTR.
pub fn write_all(fd: BorrowedFd<'_>, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        let n = write_some(fd, buf)?;
        buf = &buf[n..];
    }
    Ok(())
}

/// read(2) once into `buf`, retrying on EINTR.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid writable slice of the length passed.
    retry_eintr(|| unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// dup2(2) (clears close-on-exec on `to`).
pub fn dup2(from: RawFd, to: RawFd) -> io::Result<()> {
    // SAFETY: no pointers; closing whatever `to` was is the intended effect.
    cvt_i(unsafe { libc::dup2(from, to) })?;
    Ok(())
}

/// dup3(2): `from` duplicated onto `to` (whatever `to` was is closed), with `flags`
/// (`O_CLOEXEC` or 0).
pub fn dup3(from: RawFd, to: RawFd, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: no pointers; replacing `to` is the intended effect.
    cvt_i(unsafe { libc::dup3(from, to, flags) })?;
    Ok(())
}

/// Whether `fd` is close-on-exec.
pub fn is_cloexec(fd: RawFd) -> io::Result<bool> {
    // SAFETY: F_GETFD takes no argument.
    let flags = cvt_i(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    Ok(flags & libc::FD_CLOEXEC != 0)
}

/// `close_range(lowest, ~0, CLOSE_RANGE_UNSHARE)`: a private descriptor table holding only
/// the descriptors below `lowest` (the kernel copies no more than those), in a process that
/// shared its table (`CLONE_FILES`).
pub fn close_range_unshare(lowest: RawFd) -> io::Result<()> {
    // SAFETY: no pointers; the descriptors closed are this process's copies only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            lowest as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_UNSHARE,
        )
    };
    cvt_i(r as libc::c_int)?;
    Ok(())
}

/// A nonblocking, close-on-exec eventfd starting at zero.
pub fn eventfd_nonblocking() -> io::Result<OwnedFd> {
    // SAFETY: no pointers.
    let fd = cvt_i(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    // SAFETY: a fresh descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds `n` to an eventfd's counter.
pub fn write_eventfd(fd: BorrowedFd<'_>, n: u64) -> io::Result<()> {
    let buf = n.to_ne_bytes();
    // SAFETY: `buf` is valid for 8 bytes.
    let r = retry_eintr(|| unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), 8) })?;
    if r != 8 {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            "short eventfd write",
        ));
    }
    Ok(())
}

/// Reads (and resets) an eventfd's counter; `WouldBlock` when it is zero (nonblocking fd).
pub fn read_eventfd(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: `buf` is valid for 8 bytes.
    let r = retry_eintr(|| unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), 8) })?;
    if r != 8 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "short eventfd read",
        ));
    }
    Ok(u64::from_ne_bytes(buf))
}

/// Sets or clears O_NONBLOCK.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL take integers only.
    unsafe {
        let flags = cvt_i(libc::fcntl(fd.as_raw_fd(), libc::F_GETFL))?;
        let flags = if on {
            flags | libc::O_NONBLOCK
        } else {
            flags & !libc::O_NONBLOCK
        };
        cvt_i(libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags))?;
    }
    Ok(())
}

/// Closes every fd >= `lowest` except those in `keep` (close_range where possible).
pub fn close_fds_from(lowest: RawFd, keep: &[RawFd]) {
    let mut keep: Vec<RawFd> = keep.iter().copied().filter(|&f| f >= lowest).collect();
    keep.sort_unstable();
    let mut start = lowest as u32;
    for k in keep {
        if k as u32 > start {
            // SAFETY: closing descriptors this forked child will not use again.
            unsafe { libc::syscall(libc::SYS_close_range, start, k as u32 - 1, 0) };
        }
        start = k as u32 + 1;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, start, u32::MAX, 0) };
}

/// Whether `fd` refers to a terminal.
pub fn isatty(fd: RawFd) -> bool {
    // SAFETY: isatty only inspects the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// write(2) once; returns how many bytes were written.
pub fn write_some(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid readable slice of the length passed.
    retry_eintr(|| unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) })
}

/// Runs a byte-count syscall until it is not interrupted; a negative result is the thread's
/// errno.
fn retry_eintr(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let r = call();
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The process's standard fd `i` (0, 1 or 2) for the life of the process.
pub fn stdio_fd(i: RawFd) -> BorrowedFd<'static> {
    assert!((0..3).contains(&i), "stdio_fd: {i} is not a standard fd");
    // SAFETY: fds 0-2 are open for the whole life of a process started normally, and the husk
    // process never closes them (a forked sandbox init replaces them only in its own copy).
    unsafe { BorrowedFd::borrow_raw(i) }
}

/// Whether `fd` may be handed to a sandbox as one of its stdio fds as it is: a pipe/FIFO or
/// `/dev/null`. Anything else must be relayed: a socket would give the sandbox the host's
/// network namespace (sendto on an unconnected socket), a terminal its ioctls, a regular file
/// its whole content and the power to rewrite it (pwrite, ftruncate, clearing O_APPEND), other
/// devices their own powers.
pub fn passable_stdio(fd: RawFd) -> bool {
    match file_type(fd) {
        Ok((libc::S_IFIFO, _)) => true,
        Ok((libc::S_IFCHR, rdev)) => rdev == libc::makedev(1, 3),
        _ => false,
    }
}

/// A new, non-blocking open file description for the same pipe or terminal as `fd`, opened with
/// `access` (O_RDONLY or O_WRONLY) through `/proc/self/fd` (so setting O_NONBLOCK on it does not
/// touch the description husk shares with the user's shell). `None` for anything else: regular
/// files never block (and reopening one would lose O_APPEND and the offset), sockets cannot be
/// reopened this way.
pub fn reopen_nonblocking(fd: RawFd, access: libc::c_int) -> io::Result<Option<OwnedFd>> {
    if !matches!(file_type(fd)?.0, libc::S_IFIFO | libc::S_IFCHR) {
        return Ok(None);
    }
    let path = CString::new(format!("/proc/self/fd/{fd}")).map_err(io::Error::other)?;
    open(&path, access | libc::O_NONBLOCK | libc::O_NOCTTY, 0).map(Some)
}

/// Writes to a socket without blocking (MSG_DONTWAIT); to anything else with plain write(2).
pub fn write_dontwait(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    // SAFETY: buf is a valid readable slice of the length passed.
    match retry_eintr(|| unsafe {
        libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), flags)
    }) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => write_some(fd, buf),
        other => other,
    }
}

/// Whether `fd` is a regular file (whose writes never block).
pub fn is_regular_file(fd: BorrowedFd<'_>) -> bool {
    file_type(fd.as_raw_fd()).is_ok_and(|(t, _)| t == libc::S_IFREG)
}

/// The file type bits (`S_IFMT` part of the mode) and device number of `fd`.
fn file_type(fd: RawFd) -> io::Result<(libc::mode_t, libc::dev_t)> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a valid out-buffer for one stat.
    cvt_i(unsafe { libc::fstat(fd, st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded and filled the buffer.
    let st = unsafe { st.assume_init() };
    Ok((st.st_mode & libc::S_IFMT, st.st_rdev))
}

/// Reads from a socket without blocking (MSG_DONTWAIT); from anything else with plain read(2).
pub fn read_dontwait(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let (ptr, len) = (buf.as_mut_ptr(), buf.len());
    // SAFETY: ptr/len describe `buf`, a valid writable slice, for the duration of the call.
    match retry_eintr(|| unsafe { libc::recv(fd.as_raw_fd(), ptr.cast(), len, libc::MSG_DONTWAIT) })
    {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSOCK) => read(fd, buf),
        other => other,
    }
}

/// Everything readable from `fd` until EOF (a helper child's answer on a pipe): at most `max`
/// bytes (else `InvalidData`), by `deadline` (else `TimedOut`).
pub fn read_to_eof_within(
    fd: BorrowedFd<'_>,
    deadline: std::time::Instant,
    max: usize,
) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = [libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        match poll(&mut pfd, left.as_millis().min(i32::MAX as u128) as i32) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::TimedOut)),
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        match read(fd, &mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) if out.len() + n <= max => out.extend_from_slice(&buf[..n]),
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "answer too large",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_a_full_process_cannot_take_are_reported_lost() {
        let (a, b) = crate::sys::seqpacket_pair().unwrap();
        let null = std::fs::File::open("/dev/null").unwrap();
        send_with_fds(a.as_fd(), b"x", &[null.as_raw_fd(), null.as_raw_fd()]).unwrap();
        // SAFETY: the child makes only system calls on descriptors it inherited, then exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            // Room for no new descriptor: fd 0 is taken and the limit is 1.
            let mut none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: valid rlimit out- and in-pointers; soft below hard needs no privilege.
            let limited = unsafe {
                libc::getrlimit(libc::RLIMIT_NOFILE, &mut none) == 0 && {
                    none.rlim_cur = 1;
                    libc::setrlimit(libc::RLIMIT_NOFILE, &none) == 0
                }
            };
            let mut buf = [0u8; 8];
            let code = match recv_with_fds_lossy(b.as_fd(), &mut buf) {
                Ok((1, fds, true)) if limited && fds.is_empty() => 0,
                _ => 1,
            };
            // SAFETY: _exit never returns.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: `status` is a valid out-pointer; `pid` is this test's child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the lost descriptors were not reported ({status})"
        );
        // With room, the same message reads whole.
        send_with_fds(a.as_fd(), b"y", &[null.as_raw_fd()]).unwrap();
        let mut buf = [0u8; 8];
        let (n, fds) = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!((n, fds.len()), (1, 1));
    }

    #[test]
    fn an_exclusive_flock_is_taken_once() {
        let path = std::env::temp_dir().join(format!("husk-flock-{}", std::process::id()));
        let open = || std::fs::File::create(&path).unwrap();
        let (a, b) = (open(), open());
        assert!(flock_try_exclusive(a.as_fd()).unwrap());
        // Another open file description sees it held; closing the holder frees it.
        assert!(!flock_try_exclusive(b.as_fd()).unwrap());
        drop(a);
        assert!(flock_try_exclusive(b.as_fd()).unwrap());
        let _ = std::fs::remove_file(&path);
    }
    use std::os::fd::AsFd;
    use std::time::{Duration, Instant};

    #[test]
    fn an_answer_is_read_to_its_end_within_its_bounds() {
        let soon = || Instant::now() + Duration::from_millis(200);
        let (r, w) = pipe().unwrap();
        write_all(w.as_fd(), b"answer").unwrap();
        drop(w);
        assert_eq!(
            read_to_eof_within(r.as_fd(), soon(), 64).unwrap(),
            b"answer"
        );
        // A writer that never closes: the deadline ends the wait.
        let (r, w) = pipe().unwrap();
        write_all(w.as_fd(), b"partial").unwrap();
        let err = read_to_eof_within(r.as_fd(), soon(), 64).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        drop(w);
        // More than the caller accepts.
        let (r, w) = pipe().unwrap();
        write_all(w.as_fd(), &[0u8; 100]).unwrap();
        drop(w);
        let err = read_to_eof_within(r.as_fd(), soon(), 64).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }
}
