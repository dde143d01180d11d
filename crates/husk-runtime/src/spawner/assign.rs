//! A live sandbox made into what a create would have made: a warm sandbox claimed gets its
//! hostname, its limits (lower than those it was made with) and its host mounts (workspaces)
//! after it booted.
//!
//! The request comes from the server, which parses tenants' input: it is checked as a
//! create's spec is (hostname, limits' floors, mount sources; the service adds the
//! confinement of mount sources), and a sandbox's own state is never trusted either:
//! - Mount points are made inside the sandbox's root as a create makes them
//!   ([`crate::transfer::mount_point`]: no symlink followed, parents owned by the sandbox's
//!   user), from the root of the running PID 1, whose pidfd is checked to be alive after the
//!   root was opened (its pid was not reused).
//! - A mount is made detached here, in the spawner's namespace (the host path resolved as
//!   the host's), with its flags and id map set before it is attached; a short-lived child
//!   enters the sandbox's mount namespace and attaches it, so the spawner itself never
//!   leaves its own. The namespace belongs to the host's user namespace (see `init`), so the
//!   sandbox's root can neither unmount nor remount what is attached.
//! - Lower limits are refused where the sandbox already uses more (its memory, its tasks, its
//!   writable layer): a create with those limits would not have booted, and a claim must not
//!   kill what it takes over. The caller then makes a fresh sandbox.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use super::{
    io_ctx, single_threaded, valid_hostname, validate_limits, validate_mounts, Sandbox, SpawnError,
};
use crate::spec::{Assignment, Limits, MountIds, MountSpec};
use crate::sys;

/// The checks of an assignment that need no sandbox: as a create's spec's.
pub(crate) fn validate_assignment(a: &Assignment) -> Result<(), SpawnError> {
    if !valid_hostname(&a.hostname) {
        return Err(SpawnError::InvalidSpec(format!(
            "invalid hostname {:?}: use 1-64 letters, digits, '-' and '.'",
            a.hostname
        )));
    }
    if let Some(l) = &a.limits {
        validate_limits(l)?;
    }
    validate_mounts(&a.mounts)?;
    Ok(())
}

impl super::Spawner {
    /// Gives `sb` what `a` says, in this order: limits, mounts, hostname. On an error the
    /// sandbox may have part of it; the caller destroys it.
    pub fn assign(&self, sb: &mut Sandbox, a: &Assignment) -> Result<(), SpawnError> {
        validate_assignment(a)?;
        if let Some(l) = &a.limits {
            sb.set_limits(l)?;
        }
        if !a.mounts.is_empty() {
            self.mount_into(sb, &a.mounts)?;
        }
        sb.set_hostname(&a.hostname)
    }

    /// Attaches `mounts` inside the running sandbox `sb`.
    fn mount_into(&self, sb: &Sandbox, mounts: &[MountSpec]) -> Result<(), SpawnError> {
        if mounts
            .iter()
            .any(|m| matches!(m.ids, MountIds::Owner { .. }))
        {
            return Err(SpawnError::InvalidSpec(
                "a mount owned by the sandbox's user is made only when the sandbox is".into(),
            ));
        }
        // The id-map namespace is made by forking, and so is the attaching child.
        single_threaded()?;
        let base = sb.host_uid_base();
        let idmap = if mounts.iter().any(|m| m.ids == MountIds::Shared) {
            Some(self.idmap(sb.uids.as_ref().map_or(0, |u| u.slot()), base)?)
        } else {
            None
        };
        let pidfd = sb.own_pidfd().map_err(io_ctx("the sandbox's pidfd"))?;
        let root = sb.root_dir().map_err(io_ctx("the sandbox's root"))?;
        // Opened through its pid: alive now, the pid was its own when the root was opened.
        sys::pidfd_send_signal(pidfd.as_fd(), 0).map_err(io_ctx("the sandbox's PID 1"))?;
        let owner = (base + 1000, base + 1000);
        for m in mounts {
            let what = || format!("mount {} on {}", m.host.display(), m.sandbox.display());
            let host = sys::cpath(&m.host).map_err(io_ctx(what()))?;
            let is_dir = std::fs::metadata(&m.host)
                .map_err(io_ctx(format!("mount source {}", m.host.display())))?
                .is_dir();
            let at = crate::transfer::mount_point(root.as_fd(), &m.sandbox, is_dir, owner)
                .map_err(|e| SpawnError::InvalidSpec(format!("mount point: {e}")))?;
            let mut attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
            if !m.writable {
                attrs |= sys::MOUNT_ATTR_RDONLY;
            }
            let userns = match m.ids {
                // SAFETY: the id-map namespace's fd stays open in `self.idmaps` for this call
                // (nothing here asks for another, which could evict it).
                MountIds::Shared => idmap.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) }),
                _ => None,
            };
            let tree = sys::detached_clone(&host, attrs, userns).map_err(io_ctx(what()))?;
            attach_in(&pidfd, &tree, &at).map_err(io_ctx(what()))?;
        }
        Ok(())
    }
}

/// Attaches the detached `tree` onto `at` from a child that entered the mount namespace of
/// the process behind `pidfd`.
fn attach_in(pidfd: &OwnedFd, tree: &OwnedFd, at: &OwnedFd) -> io::Result<()> {
    // SAFETY: the process is single-threaded (checked by the caller); the child makes only
    // system calls on descriptors it inherited and exits.
    let pid = unsafe { sys::fork() }?;
    if pid == 0 {
        let done = sys::setns(pidfd.as_fd(), libc::CLONE_NEWNS)
            .and_then(|()| sys::attach_tree(tree.as_fd(), at.as_fd()));
        let code = match done {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO).clamp(1, 255),
        };
        sys::exit_now(code);
    }
    match sys::waitpid(pid, 0)? {
        Some((_, sys::ExitStatus::Exited(0))) => Ok(()),
        Some((_, sys::ExitStatus::Exited(errno))) => Err(io::Error::from_raw_os_error(errno)),
        other => Err(io::Error::other(format!(
            "the attaching process ended with {other:?}"
        ))),
    }
}

impl Sandbox {
    /// Lowers the sandbox's limits to `l`: the writable layer's size first (its tmpfs, whose
    /// pages the memory cgroup counts), then the cgroups.
    fn set_limits(&mut self, l: &Limits) -> Result<(), SpawnError> {
        // Only sandboxes with a layer in RAM hold its directory (crate::rootfs::build).
        let in_ram = self.upper.is_some();
        let memory = l.memory_cgroup_bytes(in_ram);
        let (used, tasks) = self.cgroup.usage();
        if let Some(used) = used.filter(|u| *u > memory) {
            return Err(SpawnError::InvalidSpec(format!(
                "the sandbox already uses {used} bytes of memory, more than {memory}"
            )));
        }
        if let Some(tasks) = tasks.filter(|t| *t >= l.pids) {
            return Err(SpawnError::InvalidSpec(format!(
                "the sandbox already runs {tasks} tasks, not fewer than {}",
                l.pids
            )));
        }
        if let Some(upper) = &self.upper {
            // The upper directory's parent is the root of the layer's tmpfs (the staging
            // directory init mounted it on); the layer is husk's, no symlink there.
            let tmpfs = sys::openat2(
                upper.as_fd(),
                c"..",
                libc::O_PATH | libc::O_DIRECTORY,
                0,
                libc::RESOLVE_NO_XDEV | libc::RESOLVE_NO_SYMLINKS,
            )
            .map_err(io_ctx("the writable layer's file system"))?;
            let size = std::ffi::CString::new(l.disk_bytes.to_string()).unwrap_or_default();
            let inodes =
                std::ffi::CString::new(crate::rootfs::layer_inodes(l.disk_bytes).to_string())
                    .unwrap_or_default();
            sys::reconfigure(tmpfs.as_fd(), &[(c"size", &size), (c"nr_inodes", &inodes)]).map_err(
                |e| match e.raw_os_error() {
                    // tmpfs refuses a size below what it holds.
                    Some(libc::EINVAL) => SpawnError::InvalidSpec(format!(
                        "the sandbox's files take more than a disk of {} bytes",
                        l.disk_bytes
                    )),
                    _ => io_ctx("resizing the writable layer")(e),
                },
            )?;
        }
        self.cgroup.write_limits(l, memory)?;
        self.limits_memory = l.memory_bytes;
        self.files_in_memory = l.files_in_memory(in_ram);
        Ok(())
    }

    /// A pidfd of PID 1 (its own, or one opened now for a sandbox taken up from an earlier
    /// spawner).
    fn own_pidfd(&self) -> io::Result<OwnedFd> {
        match &self.pidfd {
            Some(fd) => fd.try_clone(),
            None => sys::pidfd_open(self.pid),
        }
    }
}
