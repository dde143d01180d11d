//! A failure of the runtime as it crosses a process boundary (the spawner's socket): what kind
//! of failure it is, so the caller can answer its own client precisely (a bad request, a
//! broken template, a host that lacks something, a resource that ran out), and the whole
//! chain of causes as text.

use std::io;

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupError;
use crate::spawner::SpawnError;

/// What kind of failure the runtime reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureKind {
    /// The request was invalid: the caller's mistake, the same request fails again.
    InvalidSpec,
    /// The sandbox's template cannot be used (its image is missing or damaged).
    Template,
    /// The host lacks what husk needs (root, a kernel feature, a cgroup controller, a
    /// delegated cgroup); `husk doctor` says what.
    Host,
    /// A resource ran out (sandbox uid ranges, memory, processes, descriptors, disk): the
    /// same request may succeed later.
    Exhausted,
    /// No sandbox of that id.
    NotFound,
    /// Anything else: setting up or tearing down the sandbox failed.
    Internal,
}

/// A failure, typed by kind, with its message (the error's whole chain of causes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            message: message.into(),
        }
    }
}

impl From<&SpawnError> for Failure {
    fn from(e: &SpawnError) -> Failure {
        Failure::new(kind_of(e), chain(e))
    }
}

/// An error and its causes on one line (`outer: cause: root cause`), since the text is all
/// that crosses the socket.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        // Transparent wrappers repeat their source's text; say it once.
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn kind_of(e: &SpawnError) -> FailureKind {
    match e {
        SpawnError::NotRoot | SpawnError::KernelFeature(_) | SpawnError::Fences(_) => {
            FailureKind::Host
        }
        SpawnError::InvalidSpec(_) => FailureKind::InvalidSpec,
        SpawnError::Template(_) => FailureKind::Template,
        SpawnError::Cgroup(c) => cgroup_kind(c),
        SpawnError::Setup(_) => FailureKind::Internal,
        SpawnError::Io { source, .. } => io_kind(source),
    }
}

fn cgroup_kind(e: &CgroupError) -> FailureKind {
    match e {
        CgroupError::MissingController { .. }
        | CgroupError::Discover(_)
        | CgroupError::Systemd(_)
        | CgroupError::Busy { .. }
        | CgroupError::NotWritable { .. } => FailureKind::Host,
        CgroupError::Io { source, .. } => io_kind(source),
        CgroupError::NotEmpty(_) => FailureKind::Internal,
    }
}

/// Errors that say a resource ran out (and may not have later).
fn io_kind(e: &io::Error) -> FailureKind {
    let exhausted = matches!(
        e.raw_os_error(),
        Some(
            libc::ENOMEM
                | libc::EAGAIN
                | libc::ENOSPC
                | libc::EMFILE
                | libc::ENFILE
                | libc::EUSERS
                | libc::ENOBUFS
                | libc::EDQUOT
        )
    ) || e.kind() == io::ErrorKind::QuotaExceeded;
    if exhausted {
        FailureKind::Exhausted
    } else {
        FailureKind::Internal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn io(what: &str, source: io::Error) -> SpawnError {
        SpawnError::Io {
            what: what.into(),
            source,
        }
    }

    #[test]
    fn each_error_has_the_kind_a_caller_can_act_on() {
        let cases = [
            (SpawnError::NotRoot, FailureKind::Host),
            (
                SpawnError::InvalidSpec("no".into()),
                FailureKind::InvalidSpec,
            ),
            (
                SpawnError::Template("damaged".into()),
                FailureKind::Template,
            ),
            (SpawnError::Setup("mount".into()), FailureKind::Internal),
            (
                io(
                    "allocate uid range",
                    io::Error::from_raw_os_error(libc::ENOMEM),
                ),
                FailureKind::Exhausted,
            ),
            (
                io(
                    "allocate uid range",
                    io::Error::new(io::ErrorKind::QuotaExceeded, "all in use"),
                ),
                FailureKind::Exhausted,
            ),
            (
                io("open", io::Error::from_raw_os_error(libc::EACCES)),
                FailureKind::Internal,
            ),
            (
                SpawnError::Cgroup(CgroupError::NotEmpty(PathBuf::from("/x"))),
                FailureKind::Internal,
            ),
            (
                SpawnError::Cgroup(CgroupError::Io {
                    path: PathBuf::from("/sys/fs/cgroup/x/pids.max"),
                    source: io::Error::from_raw_os_error(libc::ENOSPC),
                }),
                FailureKind::Exhausted,
            ),
        ];
        for (e, kind) in cases {
            assert_eq!(Failure::from(&e).kind, kind, "{e:?}");
        }
    }

    #[test]
    fn the_message_carries_every_cause_once() {
        let e = SpawnError::Cgroup(CgroupError::Io {
            path: PathBuf::from("/sys/fs/cgroup/husk/cgroup.subtree_control"),
            source: io::Error::from_raw_os_error(libc::EBUSY),
        });
        let f = Failure::from(&e);
        // The bare path alone (what a to_string() gave) said nothing of the cause.
        assert!(
            f.message
                .starts_with("cgroup /sys/fs/cgroup/husk/cgroup.subtree_control: "),
            "{}",
            f.message
        );
        assert!(f.message.contains("busy"), "{}", f.message);
        assert_eq!(f.message.matches("subtree_control").count(), 1);
    }

    #[test]
    fn a_failure_round_trips_through_the_wire_encoding() {
        let f = Failure::new(FailureKind::Template, "template 'x' is damaged");
        let bytes = postcard::to_stdvec(&f).unwrap();
        assert_eq!(postcard::from_bytes::<Failure>(&bytes).unwrap(), f);
    }
}
