//! Resource limits for the sandboxed command.

use super::FenceError;

/// The type of `RLIMIT_*` constants (glibc uses an enum typedef, musl a plain int).
#[cfg(target_env = "gnu")]
type Resource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
type Resource = libc::c_int;

/// Per-process resource limits. Each one sets both the soft and the hard limit (so sandboxed
/// code cannot raise it again), clamped to the current hard limit: a limit can only be lowered
/// without `CAP_SYS_RESOURCE`, and lowering is the point.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rlimits {
    /// `RLIMIT_NOFILE`: open file descriptors.
    pub nofile: u64,
    /// `RLIMIT_NPROC`: processes of the (real) uid; `None` leaves it unchanged (the cgroup's
    /// pids controller is the real bound).
    pub nproc: Option<u64>,
    /// `RLIMIT_FSIZE`: largest file the process may write, in bytes; `None` leaves it unchanged.
    pub fsize: Option<u64>,
    /// `RLIMIT_CORE`: core dump size in bytes (0: no core dumps).
    pub core: u64,
    /// `RLIMIT_MEMLOCK`: lockable memory in bytes.
    pub memlock: u64,
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits {
            nofile: 4096,
            nproc: None,
            fsize: None,
            core: 0,
            memlock: 64 << 10,
        }
    }
}

impl Rlimits {
    /// Applies the limits to the calling process. Does not allocate.
    pub(super) fn apply(&self) -> Result<(), FenceError> {
        set(libc::RLIMIT_NOFILE, "NOFILE", Some(self.nofile))?;
        set(libc::RLIMIT_NPROC, "NPROC", self.nproc)?;
        set(libc::RLIMIT_FSIZE, "FSIZE", self.fsize)?;
        set(libc::RLIMIT_CORE, "CORE", Some(self.core))?;
        set(libc::RLIMIT_MEMLOCK, "MEMLOCK", Some(self.memlock))
    }
}

fn set(resource: Resource, name: &'static str, value: Option<u64>) -> Result<(), FenceError> {
    let Some(value) = value else {
        return Ok(());
    };
    let err = |error| FenceError::Rlimit {
        resource: name,
        error,
    };
    let mut current = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct rlimit into `current`.
    if unsafe { libc::getrlimit(resource, &mut current) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    let v = value.min(current.rlim_max);
    let new = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: setrlimit reads one struct rlimit from `new`.
    if unsafe { libc::setrlimit(resource, &new) } != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::in_child;
    use super::*;

    fn get(resource: Resource) -> (u64, u64) {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one struct rlimit.
        assert_eq!(unsafe { libc::getrlimit(resource, &mut r) }, 0);
        (r.rlim_cur, r.rlim_max)
    }

    #[test]
    fn limits_are_set_soft_and_hard_and_none_is_left_alone() {
        let limits = Rlimits {
            nofile: 123,
            nproc: None,
            fsize: Some(1 << 20),
            core: 0,
            memlock: 64 << 10,
        };
        let nproc_before = get(libc::RLIMIT_NPROC);
        let child = in_child(|out| {
            if limits.apply().is_err() {
                return 2;
            }
            for r in [
                libc::RLIMIT_NOFILE,
                libc::RLIMIT_NPROC,
                libc::RLIMIT_FSIZE,
                libc::RLIMIT_CORE,
                libc::RLIMIT_MEMLOCK,
            ] {
                let (cur, max) = get(r);
                out.send(&cur.to_ne_bytes());
                out.send(&max.to_ne_bytes());
            }
            0
        });
        assert!(child.exited(0), "{child:?}");
        let got: Vec<u64> = child
            .output
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        let want = [
            123,
            123,
            nproc_before.0,
            nproc_before.1,
            1 << 20,
            1 << 20,
            0,
            0,
            64 << 10,
            64 << 10,
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn limits_above_the_hard_limit_are_clamped() {
        let child = in_child(|out| {
            // Lower the hard limit first, then ask for more than it.
            let low = libc::rlimit {
                rlim_cur: 100,
                rlim_max: 200,
            };
            // SAFETY: setrlimit reads one struct rlimit.
            if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) } != 0 {
                return 3;
            }
            let limits = Rlimits {
                nofile: 10_000,
                ..Rlimits::default()
            };
            if limits.apply().is_err() {
                return 2;
            }
            let (cur, max) = get(libc::RLIMIT_NOFILE);
            out.send(&cur.to_ne_bytes());
            out.send(&max.to_ne_bytes());
            0
        });
        assert!(child.exited(0), "{child:?}");
        assert_eq!(
            child.output,
            [200u64.to_ne_bytes(), 200u64.to_ne_bytes()].concat()
        );
    }
}
