//! Turning OS errors into the protocol's error kinds.

use std::io;
use std::path::Path;

use husk_proto::{AgentError, ErrorKind};

/// The protocol's kind for an OS error. The SDKs act on kinds (NOT_FOUND becomes
/// `FileNotFoundException`, ALREADY_EXISTS makes `make_dir()` return False, no space
/// becomes HTTP 507), so the mapping looks at the errno, not only at `io::ErrorKind`.
pub(crate) fn kind_of(err: &io::Error) -> ErrorKind {
    match err.raw_os_error() {
        Some(libc::ENOENT) => ErrorKind::NotFound,
        Some(libc::EEXIST | libc::ENOTEMPTY) => ErrorKind::AlreadyExists,
        Some(
            libc::ENOTDIR
            | libc::EISDIR
            | libc::EINVAL
            | libc::ELOOP
            | libc::ENAMETOOLONG
            | libc::ENXIO
            | libc::EXDEV,
        ) => ErrorKind::InvalidArgument,
        Some(libc::ENOSPC | libc::EDQUOT) => ErrorKind::NoSpace,
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => ErrorKind::PermissionDenied,
        Some(libc::EMFILE | libc::ENFILE) => ErrorKind::ResourceExhausted,
        Some(_) => ErrorKind::Internal,
        // Errors std makes up itself (e.g. a path with a NUL byte, a short write).
        None => match err.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            io::ErrorKind::InvalidInput => ErrorKind::InvalidArgument,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            _ => ErrorKind::Internal,
        },
    }
}

/// The error of operation `op` (a verb: "open", "rename", ...) on `path`. A missing path gets
/// envd's message (`path '/x' does not exist`); others keep the OS message, which says what
/// went wrong better than anything made up here.
pub(crate) fn io_error(op: &str, path: &Path, err: &io::Error) -> AgentError {
    let kind = kind_of(err);
    let message = match kind {
        ErrorKind::NotFound => format!("path '{}' does not exist", path.display()),
        ErrorKind::NoSpace => format!("{op} '{}': not enough disk space", path.display()),
        _ => format!("{op} '{}': {err}", path.display()),
    };
    AgentError::new(kind, message)
}

/// An `InvalidArgument` error.
pub(crate) fn invalid(message: impl Into<String>) -> AgentError {
    AgentError::new(ErrorKind::InvalidArgument, message)
}
