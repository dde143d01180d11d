//! One server per state directory.
//!
//! Two `husk serve` on one state directory share its database but not their sandboxes: the
//! second one's spawner cannot take up the first's kept sandboxes (their slots are held), so
//! it reported them lost in the shared database while the first still ran them, and both
//! then wrote the same records. A server therefore holds a lock on `<state>/server.lock`
//! for as long as it runs, and a second one stops at start, before it touches anything.
//!
//! A classic POSIX record lock (`F_SETLK`), not `flock` or an OFD lock: those belong to the
//! open file description, which every process the server forks (spawners, helpers) shares,
//! and a spawner orphaned by a crash would hold the directory for a moment after its server
//! died. A POSIX lock is the server process's own: no child inherits it, the kernel drops it
//! when the process ends however it ends, and `F_GETLK` names the holder. (It is also dropped
//! when the process closes any descriptor of the file: this one is opened once, here.)
//! The tools that open the directory beside a running server (`husk key`, `husk template
//! build`, …) do not take it.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use husk_runtime::sys;

/// The lock file, in the state directory.
pub const LOCK_FILE: &str = "server.lock";

/// The state directory, held while this value lives.
#[derive(Debug)]
pub struct StateLock {
    _file: File,
}

#[derive(Debug, thiserror::Error)]
pub enum StateLockError {
    #[error(
        "the state directory {} is in use by another husk server{}: stop it first, or give \
         this one a --state-dir of its own",
        dir.display(),
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
    )]
    InUse {
        dir: PathBuf,
        /// The holder's pid, where it is visible from this PID namespace.
        holder: Option<libc::pid_t>,
    },
    #[error("locking the state directory {}: {source}", dir.display())]
    Io { dir: PathBuf, source: io::Error },
}

impl StateLock {
    /// Takes the lock of state directory `dir` (which exists), or says who holds it.
    pub fn take(dir: &Path) -> Result<StateLock, StateLockError> {
        let io = |source| StateLockError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        let file = sys::create_lock_file(&dir.join(LOCK_FILE)).map_err(io)?;
        let mut whole = sys::lock_range(libc::F_WRLCK, 0, 0);
        if sys::fcntl_lock(file.as_raw_fd(), libc::F_SETLK, &mut whole).map_err(io)? {
            return Ok(StateLock { _file: file });
        }
        let mut probe = sys::lock_range(libc::F_WRLCK, 0, 0);
        let holder = sys::fcntl_lock(file.as_raw_fd(), libc::F_GETLK, &mut probe)
            .ok()
            .filter(|_| probe.l_type != libc::F_UNLCK as libc::c_short && probe.l_pid > 0)
            .map(|_| probe.l_pid);
        Err(StateLockError::InUse {
            dir: dir.to_path_buf(),
            holder,
        })
    }
}
