//! Pseudo-terminals: the sandbox side (a PTY from the sandbox's own devpts) and the host side
//! (raw mode and window size of the terminal `husk run -t` is attached to).

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Opens a new PTY pair from `/dev/ptmx` of the caller's root: (master, slave).
/// The slave is opened through the master (TIOCGPTPEER), never by a path name the sandbox
/// could have replaced.
pub fn open_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let master = crate::sys::open(c"/dev/ptmx", libc::O_RDWR | libc::O_NOCTTY, 0)?;
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads an int through the valid pointer.
    cvt(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    // SAFETY: TIOCGPTPEER takes open flags and returns a new fd.
    let slave = cvt(unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: the ioctl returned a new fd owned by nobody else.
    Ok((master, unsafe { OwnedFd::from_raw_fd(slave) }))
}

/// Makes `fd` the controlling terminal of the calling session leader.
pub fn set_controlling(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) })?;
    Ok(())
}

/// Terminal size (rows, cols) of `fd`, if it is a terminal.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<(u16, u16)> {
    let mut ws = MaybeUninit::<libc::winsize>::zeroed();
    // SAFETY: TIOCGWINSZ writes one winsize into the valid buffer.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, ws.as_mut_ptr()) };
    if r < 0 {
        return None;
    }
    // SAFETY: the ioctl succeeded and filled the struct.
    let ws = unsafe { ws.assume_init() };
    Some((ws.ws_row, ws.ws_col))
}

/// Sets the terminal size of `fd`.
pub fn set_window_size(fd: BorrowedFd<'_>, rows: u16, cols: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize from the valid pointer.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) })?;
    Ok(())
}

/// Puts a terminal into raw mode; the previous mode is restored when the guard drops.
pub struct RawMode {
    fd: libc::c_int,
    saved: libc::termios,
}

impl RawMode {
    /// Turns off echo on terminal `fd` (line editing stays), for reading a secret typed at a
    /// prompt; restored when the guard drops.
    pub fn without_echo(fd: BorrowedFd<'_>) -> io::Result<RawMode> {
        let mut t = MaybeUninit::<libc::termios>::zeroed();
        // SAFETY: tcgetattr fills the valid termios buffer.
        cvt(unsafe { libc::tcgetattr(fd.as_raw_fd(), t.as_mut_ptr()) })?;
        // SAFETY: tcgetattr succeeded, so the struct is initialised.
        let saved = unsafe { t.assume_init() };
        let mut quiet = saved;
        quiet.c_lflag &= !(libc::ECHO | libc::ECHONL);
        // SAFETY: `quiet` is a valid termios.
        cvt(unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &quiet) })?;
        Ok(RawMode {
            fd: fd.as_raw_fd(),
            saved,
        })
    }

    /// Enables raw mode on `fd` (which must stay open while the guard lives).
    pub fn enable(fd: BorrowedFd<'_>) -> io::Result<RawMode> {
        let mut t = MaybeUninit::<libc::termios>::zeroed();
        // SAFETY: tcgetattr fills the valid termios buffer.
        cvt(unsafe { libc::tcgetattr(fd.as_raw_fd(), t.as_mut_ptr()) })?;
        // SAFETY: tcgetattr succeeded, so the struct is initialised.
        let saved = unsafe { t.assume_init() };
        let mut raw = saved;
        // SAFETY: cfmakeraw only modifies the struct it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        // SAFETY: `raw` is a valid termios.
        cvt(unsafe { libc::tcsetattr(fd.as_raw_fd(), libc::TCSANOW, &raw) })?;
        Ok(RawMode {
            fd: fd.as_raw_fd(),
            saved,
        })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the saved, valid termios on the fd the caller keeps open.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}
