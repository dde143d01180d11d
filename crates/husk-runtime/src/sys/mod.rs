//! Thin, safe wrappers over the raw syscalls the runtime needs. Every `unsafe` in the runtime's
//! sandbox set-up lives here, so the invariants are reviewed in one place; the functions take
//! and return std types (`CStr`, `OwnedFd`, `io::Result`).

use std::ffi::CString;
use std::io;
use std::path::Path;

mod abstract_socket;
mod dirfd;
mod fdio;
mod fs;
mod netlink;
pub mod probe;
mod process;

pub use abstract_socket::*;
pub use dirfd::*;
pub use fdio::*;
pub use fs::*;
pub use netlink::*;
pub use probe::kernel_release;
pub use process::*;

fn cvt(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_i(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A path as a C string; paths with interior NULs are rejected, not truncated.
pub fn cpath(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}
