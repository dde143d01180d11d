//! File systems and mounts, tried for real in a child process's own mount namespace: tmpfs,
//! overlayfs (also inside a user namespace), erofs from an image file (or through a loop device
//! where the kernel needs one), id-mapped mounts on each file system husk maps (erofs images,
//! tmpfs, the state directory's), and overlayfs over an id-mapped layer, as a built template's
//! sandbox has it. Whatever the child mounted vanishes with its namespace when it exits, and
//! it exits when the parent does (parent-death signal); a loop device it used is
//! auto-clearing, so it goes with the mount.
//!
//! The child answers with one errno per [`Step`]; [`checks`] turns those into verdicts, a pure
//! function tested on its own.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::modules::{self, Module};
use crate::sys::{self, cpath, Forked};

use super::kernel::{self, since};
use super::Check;

/// One thing the child tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The child itself, made with new mount, IPC and UTS namespaces.
    Namespaces,
    /// A PID namespace (for the child's children; the child stays in the host's, where its
    /// pids mean what `/proc` says).
    PidNs,
    /// The test image is an unnamed file on the state directory's file system (where
    /// template images live), not on tmpfs (which erofs cannot mount from directly).
    ImageOnStateFs,
    Tmpfs,
    Overlay,
    /// A user namespace with an id mapping (for the id-mapped mounts).
    UserNs,
    IdmapTmpfs,
    ErofsFile,
    ErofsLoop,
    IdmapErofs,
    OverlayIdmappedLower,
    IdmapStateDir,
    CgroupNs,
    TimeNs,
    OverlayUserNs,
}

const STEPS: usize = Step::OverlayUserNs as usize + 1;

/// Not tried (a step it needs failed first).
const NOT_RUN: i32 = i32::MIN;

/// The errno of each step: 0 when it worked, [`NOT_RUN`] when not tried.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Outcomes([i32; STEPS]);

impl Outcomes {
    pub fn new() -> Outcomes {
        Outcomes([NOT_RUN; STEPS])
    }

    /// Records `r` for `step`; whether it worked.
    pub fn set(&mut self, step: Step, r: &io::Result<()>) -> bool {
        self.0[step as usize] = match r {
            Ok(()) => 0,
            Err(e) => e.raw_os_error().unwrap_or(libc::EIO),
        };
        r.is_ok()
    }

    pub fn worked(&self, step: Step) -> bool {
        self.0[step as usize] == 0
    }

    fn errno(&self, step: Step) -> Option<i32> {
        Some(self.0[step as usize]).filter(|&e| e != 0 && e != NOT_RUN)
    }

    /// The error of `step`, if it was tried and failed.
    pub fn failed(&self, step: Step) -> Option<String> {
        self.errno(step)
            .map(|e| io::Error::from_raw_os_error(e).to_string())
    }

    fn to_bytes(&self) -> Vec<u8> {
        self.0.iter().flat_map(|e| e.to_le_bytes()).collect()
    }

    fn from_bytes(b: &[u8]) -> Option<Outcomes> {
        if b.len() != STEPS * 4 {
            return None;
        }
        let mut out = Outcomes::new();
        for (i, c) in b.chunks_exact(4).enumerate() {
            out.0[i] = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Some(out)
    }
}

/// The smallest erofs image: an empty root directory (what `mkfs.erofs -T0 --all-root` makes of
/// an empty directory, 4 KiB): these bytes at offset 1024, zeros elsewhere.
const EROFS_IMAGE_AT_1024: [u8; 192] = [
    0xe2, 0xe1, 0xf5, 0xe0, 0x78, 0xa0, 0x78, 0x88, 0x03, 0x00, 0x00, 0x00, 0x0c, 0x00, 0x24, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x13, 0x15, 0x74, 0x35, 0x33, 0x1c, 0x40, 0x5a, 0xb9, 0xc2, 0xca, 0x31, 0x43, 0xd0, 0x69, 0x25,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0xed, 0x41, 0x02, 0x00, 0x1b, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x24, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x18, 0x00, 0x02, 0x00, 0x24, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x19, 0x00, 0x02, 0x00, 0x2e, 0x2e, 0x2e, 0x00, 0x00, 0x00, 0x00, 0x00,
];

fn erofs_image() -> Vec<u8> {
    let mut img = vec![0u8; 4096];
    img[1024..1024 + EROFS_IMAGE_AT_1024.len()].copy_from_slice(&EROFS_IMAGE_AT_1024);
    img
}

/// Longest the child may take (it needs a few milliseconds; a loop device some more).
const CHILD_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the child and collects its outcomes. Needs root and a single-threaded caller.
pub(super) fn probe(state_dir: &Path) -> Result<Outcomes, String> {
    if sys::settled_thread_count().map_err(|e| format!("count threads: {e}"))? != 1 {
        return Err("needs a process with one thread".into());
    }
    // Load what is missing before forking (modprobe is a process of its own).
    for m in [Module::Overlay, Module::Erofs, Module::Loop] {
        let _ = modules::ensure(m);
    }
    let base = ["/tmp", "/run", "/mnt", "/var/tmp"]
        .into_iter()
        .map(Path::new)
        .find(|p| p.is_dir())
        .ok_or("no /tmp, /run or /mnt to mount on")?;
    let existing = state_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let (r, w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    let all = libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
    // SAFETY: the process has one thread (checked above), so the child's copy of memory is
    // consistent; the child only runs `child` and leaves through _exit.
    let (forked, namespaces) = match unsafe { sys::clone3_fork(all, None) } {
        Ok(f) => (f, Ok(())),
        // SAFETY: as above.
        Err(e) => match unsafe { sys::clone3_fork(libc::CLONE_NEWNS, None) } {
            Ok(f) => (f, Err(e)),
            Err(e) => return Err(format!("cannot make a mount namespace: {e}")),
        },
    };
    match forked {
        Forked::Child => {
            drop(r);
            let _ = sys::set_parent_death_signal(libc::SIGKILL);
            let mut out = Outcomes::new();
            child(base, existing, &mut out);
            let _ = sys::write_all(w.as_fd(), &out.to_bytes());
            sys::exit_now(0)
        }
        Forked::Parent { pidfd, .. } => {
            drop(w);
            let got = sys::read_to_eof_within(r.as_fd(), Instant::now() + CHILD_TIMEOUT, 64 << 10)
                .map_err(|e| match e.kind() {
                    io::ErrorKind::TimedOut => format!(
                        "the probing child did not answer within {} s",
                        CHILD_TIMEOUT.as_secs()
                    ),
                    _ => format!("read: {e}"),
                });
            if got.is_err() {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), libc::SIGKILL);
            }
            let _ = sys::waitid_pidfd(pidfd.as_fd(), false);
            let bytes = got?;
            let mut out =
                Outcomes::from_bytes(&bytes).ok_or("the probing child ended before it answered")?;
            out.set(Step::Namespaces, &namespaces);
            Ok(out)
        }
    }
}

fn c(p: &Path) -> io::Result<CString> {
    cpath(p)
}

fn overlay(target: &Path, lower: &Path, upper: &Path, work: &Path) -> io::Result<()> {
    let opts = CString::new(format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    ))?;
    sys::mount(
        Some(c"overlay"),
        &c(target)?,
        Some(c"overlay"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(&opts),
    )
}

fn tmpfs(target: &Path) -> io::Result<()> {
    sys::mount(
        Some(c"tmpfs"),
        &c(target)?,
        Some(c"tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some(c"size=8m,mode=0700"),
    )
}

fn mkdirs(base: &Path, names: &[&str]) -> io::Result<()> {
    for n in names {
        fs::create_dir(base.join(n))?;
    }
    Ok(())
}

/// The child's work, in its own mount namespace (made private first, so nothing propagates
/// back to the host).
fn child(base: &Path, state_dir: &Path, out: &mut Outcomes) {
    let private = sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None);
    // Opened here, in the child's mount namespace (a mount of another namespace cannot be
    // cloned), and before the tmpfs covers `base` (the state directory may be beneath it).
    let state = fs::File::open(state_dir).map(OwnedFd::from);
    if !out.set(Step::Tmpfs, &private.and_then(|()| tmpfs(base))) {
        return;
    }
    let p = |n: &str| base.join(n);
    let dirs = [
        "l", "u", "w", "m", "e", "il", "ie", "is", "u2", "w2", "m2", "uns",
    ];
    if let Err(e) = mkdirs(base, &dirs).and_then(|()| fs::write(p("l/probe"), b"husk")) {
        out.set(Step::Overlay, &Err(e));
        return;
    }
    out.set(Step::Overlay, &overlay(&p("m"), &p("l"), &p("u"), &p("w")));
    // SAFETY: this child has one thread (a fork of a single-threaded process).
    let userns = unsafe { sys::idmap_userns(100_000, 65_536) };
    out.set(Step::UserNs, &userns.as_ref().map(drop).map_err(clone_err));
    let ro = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    let idmap = |from: &Path, to: &Path| -> io::Result<()> {
        let ns = userns.as_ref().map_err(clone_err)?;
        sys::idmapped_mount(&c(from)?, ns.as_fd(), ro, &c(to)?)
    };
    if userns.is_ok() {
        out.set(Step::IdmapTmpfs, &idmap(&p("l"), &p("il")));
    }
    erofs(state.as_ref().ok(), &p("img"), &p("e"), out);
    if userns.is_ok() && (out.worked(Step::ErofsFile) || out.worked(Step::ErofsLoop)) {
        out.set(Step::IdmapErofs, &idmap(&p("e"), &p("ie")));
    }
    // A built template's root: overlayfs over an id-mapped image.
    let lower = if out.worked(Step::IdmapErofs) {
        Some(p("ie"))
    } else if out.worked(Step::IdmapTmpfs) {
        Some(p("il"))
    } else {
        None
    };
    if let Some(lower) = lower {
        let r = overlay(&p("m2"), &lower, &p("u2"), &p("w2"));
        out.set(Step::OverlayIdmappedLower, &r);
    }
    if userns.is_ok() {
        let r = state.as_ref().map_err(clone_err).and_then(|fd| {
            idmap(
                Path::new(&format!("/proc/self/fd/{}", fd.as_raw_fd())),
                &p("is"),
            )
        });
        out.set(Step::IdmapStateDir, &r);
    }
    out.set(Step::CgroupNs, &sys::unshare(libc::CLONE_NEWCGROUP));
    const CLONE_NEWTIME: libc::c_int = 0x80;
    out.set(Step::TimeNs, &sys::unshare(CLONE_NEWTIME));
    out.set(Step::PidNs, &sys::unshare(libc::CLONE_NEWPID));
    out.set(Step::OverlayUserNs, &overlay_in_userns(&p("uns")));
}

fn clone_err(e: &io::Error) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error().unwrap_or(libc::EIO))
}

/// Mounts a small erofs image on `at`: from the file, else (ENOTBLK: a kernel before
/// file-backed erofs) through a loop device, as [`crate::images`] does. The image is an
/// unnamed file (O_TMPFILE) in the state directory `state` (or its nearest existing parent),
/// which vanishes with its last descriptor; where that file system has no O_TMPFILE, a file at
/// `tmp_img` on the child's tmpfs.
fn erofs(state: Option<&OwnedFd>, tmp_img: &Path, at: &Path, out: &mut Outcomes) {
    let flags = libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
    let unnamed = state
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))
        .and_then(|dir| sys::openat2(dir.as_fd(), c".", libc::O_TMPFILE | libc::O_RDWR, 0o600, 0))
        .and_then(|fd| sys::write_all(fd.as_fd(), &erofs_image()).map(|()| fd));
    out.set(
        Step::ImageOnStateFs,
        &unnamed.as_ref().map(drop).map_err(clone_err),
    );
    let img = match &unnamed {
        Ok(fd) => PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd())),
        Err(_) => tmp_img.to_owned(),
    };
    let img = img.as_path();
    let written = match &unnamed {
        Ok(_) => Ok(()),
        Err(_) => fs::write(img, erofs_image()),
    };
    let from_file =
        written.and_then(|()| sys::mount(Some(&c(img)?), &c(at)?, Some(c"erofs"), flags, None));
    out.set(Step::ErofsFile, &from_file);
    if !matches!(&from_file, Err(e) if e.raw_os_error() == Some(libc::ENOTBLK)) {
        return;
    }
    let via_loop = fs::File::open(img).and_then(|f| {
        let (dev, _open_until_mounted) = sys::loop_attach_ro(f.as_fd())?;
        sys::mount(Some(&c(&dev)?), &c(at)?, Some(c"erofs"), flags, None)
    });
    out.set(Step::ErofsLoop, &via_loop);
}

/// overlayfs inside a new user namespace (mapping root to root), on a tmpfs of its own.
fn overlay_in_userns(at: &Path) -> io::Result<()> {
    sys::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS)?;
    fs::write("/proc/self/uid_map", "0 0 1")?;
    fs::write("/proc/self/setgroups", "deny")?;
    fs::write("/proc/self/gid_map", "0 0 1")?;
    tmpfs(at)?;
    mkdirs(at, &["l", "u", "w", "m"])?;
    overlay(&at.join("m"), &at.join("l"), &at.join("u"), &at.join("w"))
}

/// The name of the file system `path` is on, for messages.
pub(super) fn fs_type_name(path: &Path) -> String {
    let magic = cpath(path).and_then(|c| sys::statfs_type(&c)).unwrap_or(0);
    fs_name(magic)
}

fn fs_name(magic: i64) -> String {
    match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlay",
        0xE0F5_E1E2 => "erofs",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0x6969 => "nfs",
        0x6573_5546 => "fuse",
        _ => return format!("unknown (magic {magic:#x})"),
    }
    .to_owned()
}

/// The verdicts of the mount probe (or why it did not run).
pub(super) fn checks(probe: Result<Outcomes, String>, state_dir: &Path) -> Vec<Check> {
    let o = match probe {
        Ok(o) => o,
        Err(why) => {
            return [
                "fs.tmpfs",
                "fs.overlay",
                "fs.overlay_userns",
                "fs.erofs",
                "fs.loop",
                "idmap.erofs",
                "idmap.tmpfs",
                "idmap.state_dir",
                "overlay.idmapped_lower",
            ]
            .into_iter()
            .map(|n| Check::skipped(n, format!("not probed: {why}")))
            .collect()
        }
    };
    let existing = state_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let state_fs = fs_type_name(existing);
    decide(&o, &state_fs, Path::new("/dev/loop-control").exists())
}

/// The verdicts, from the outcomes alone (tested without root).
fn decide(o: &Outcomes, state_fs: &str, have_loop: bool) -> Vec<Check> {
    let mut out = Vec::new();
    let err = |s: Step| o.failed(s).unwrap_or_else(|| "not tried".into());
    out.push(if o.worked(Step::Tmpfs) {
        Check::ok("fs.tmpfs", "mounts")
    } else {
        Check::missing(
            "fs.tmpfs",
            format!("cannot mount tmpfs: {}", err(Step::Tmpfs)),
            "boot a kernel built with CONFIG_TMPFS",
        )
    });
    out.push(if o.worked(Step::Overlay) {
        Check::ok("fs.overlay", "mounts (every sandbox's root)")
    } else if o.errno(Step::Overlay) == Some(libc::ENODEV) {
        Check::missing(
            "fs.overlay",
            "this kernel has no overlayfs: no sandbox can get its root",
            "load the module: modprobe overlay (CONFIG_OVERLAY_FS)",
        )
    } else {
        Check::missing(
            "fs.overlay",
            format!("cannot mount overlayfs: {}", err(Step::Overlay)),
            "load the module: modprobe overlay (CONFIG_OVERLAY_FS)",
        )
    });
    out.push(if o.worked(Step::OverlayUserNs) {
        Check::ok("fs.overlay_userns", "mounts inside a user namespace")
    } else {
        Check::warning(
            "fs.overlay_userns",
            format!(
                "overlayfs cannot be mounted inside a user namespace ({}); husk mounts its \
                 overlays from the host's, so nothing needs it today",
                err(Step::OverlayUserNs)
            ),
            kernel::boot(since::OVERLAY_IN_USERNS),
        )
    });
    let erofs = if o.worked(Step::ErofsFile) {
        Check::ok(
            "fs.erofs",
            "template images mount from their file (file-backed erofs)",
        )
    } else if o.worked(Step::ErofsLoop) && state_fs == "tmpfs" {
        Check::ok(
            "fs.erofs",
            "template images mount through a loop device: the state directory is on tmpfs, \
             and erofs mounts image files directly only from disk file systems",
        )
    } else if o.worked(Step::ErofsLoop) {
        let on_tmpfs = if o.worked(Step::ImageOnStateFs) {
            ""
        } else {
            " (tried with an image on tmpfs, which erofs never mounts directly: the state \
             directory's file system has no O_TMPFILE)"
        };
        Check::ok(
            "fs.erofs",
            format!(
                "template images mount through a loop device (file-backed erofs mounts need \
                 Linux >= {} with CONFIG_EROFS_FS_BACKED_BY_FILE): a few ms more per image's \
                 first mount{on_tmpfs}",
                since::EROFS_FILE_BACKED
            ),
        )
    } else if o.errno(Step::ErofsFile) == Some(libc::ENODEV) {
        Check::missing(
            "fs.erofs",
            "this kernel has no erofs: built templates cannot be used (the host template can)",
            "load the module: modprobe erofs (CONFIG_EROFS_FS)",
        )
    } else if o.errno(Step::ErofsFile) == Some(libc::ENOTBLK) {
        Check::missing(
            "fs.erofs",
            format!(
                "this kernel mounts erofs only from a block device, and a loop device failed: \
                 {}; built templates cannot be used",
                err(Step::ErofsLoop)
            ),
            format!(
                "load the module: modprobe loop; or {}",
                kernel::boot(since::EROFS_FILE_BACKED)
            ),
        )
    } else {
        Check::missing(
            "fs.erofs",
            format!("cannot mount an erofs image: {}", err(Step::ErofsFile)),
            "load the module: modprobe erofs (CONFIG_EROFS_FS)",
        )
    };
    let erofs_needs_loop = !o.worked(Step::ErofsFile);
    out.push(erofs);
    out.push(match (have_loop, erofs_needs_loop) {
        (true, true) => Check::ok(
            "fs.loop",
            "loop devices (template images, workspace file systems)",
        ),
        (true, false) => Check::ok("fs.loop", "loop devices (workspace file systems)"),
        (false, true) => Check::missing(
            "fs.loop",
            "no /dev/loop-control: this kernel needs loop devices for template images",
            "load the module: modprobe loop (CONFIG_BLK_DEV_LOOP)",
        ),
        (false, false) => Check::warning(
            "fs.loop",
            "no /dev/loop-control: workspaces get no size quota of their own",
            "load the module: modprobe loop (CONFIG_BLK_DEV_LOOP)",
        ),
    });
    out.push(if o.worked(Step::IdmapErofs) {
        Check::ok(
            "idmap.erofs",
            "id-mapped erofs mounts (built templates' images)",
        )
    } else {
        Check::missing(
            "idmap.erofs",
            format!(
                "no id-mapped erofs mounts ({}): built templates cannot be used",
                err(Step::IdmapErofs)
            ),
            kernel::boot(since::IDMAPPED_EROFS),
        )
    });
    out.push(if o.worked(Step::IdmapTmpfs) {
        Check::ok("idmap.tmpfs", "id-mapped tmpfs mounts")
    } else {
        Check::warning(
            "idmap.tmpfs",
            format!(
                "no id-mapped tmpfs mounts ({}): host directories on tmpfs cannot be mounted \
                 id-mapped (workspaces of a state directory on tmpfs; `husk run -v` of a \
                 tmpfs path shows its files as nobody)",
                err(Step::IdmapTmpfs)
            ),
            format!(
                "{}, or keep the state directory on a disk file system",
                kernel::boot(since::IDMAPPED_TMPFS)
            ),
        )
    });
    out.push(if o.worked(Step::IdmapStateDir) {
        Check::ok(
            "idmap.state_dir",
            format!(
                "id-mapped mounts on the state directory's file system ({state_fs}): workspaces"
            ),
        )
    } else {
        let when = match state_fs {
            "tmpfs" => format!("; tmpfs has them from Linux {}", since::IDMAPPED_TMPFS),
            "btrfs" => format!("; btrfs has them from Linux {}", since::IDMAPPED_BTRFS),
            "ext4" | "xfs" => format!(
                "; {state_fs} has them from Linux {}",
                since::IDMAPPED_MOUNTS
            ),
            _ => String::new(),
        };
        Check::warning(
            "idmap.state_dir",
            format!(
                "no id-mapped mounts on the state directory's file system ({state_fs}: {}{when}): \
                 workspaces cannot be mounted into sandboxes",
                err(Step::IdmapStateDir)
            ),
            "put the state directory (--state-dir) on ext4, xfs or btrfs",
        )
    });
    out.push(if o.worked(Step::OverlayIdmappedLower) {
        Check::ok(
            "overlay.idmapped_lower",
            "overlayfs over id-mapped layers (built templates' roots)",
        )
    } else {
        Check::missing(
            "overlay.idmapped_lower",
            format!(
                "overlayfs cannot use an id-mapped layer ({}): built templates cannot be used",
                err(Step::OverlayIdmappedLower)
            ),
            kernel::boot(since::OVERLAY_IDMAPPED_LAYERS),
        )
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::Status;

    fn all_ok() -> Outcomes {
        let mut o = Outcomes::new();
        for s in [
            Step::Namespaces,
            Step::PidNs,
            Step::ImageOnStateFs,
            Step::Tmpfs,
            Step::Overlay,
            Step::UserNs,
            Step::IdmapTmpfs,
            Step::ErofsFile,
            Step::IdmapErofs,
            Step::OverlayIdmappedLower,
            Step::IdmapStateDir,
            Step::CgroupNs,
            Step::TimeNs,
            Step::OverlayUserNs,
        ] {
            o.set(s, &Ok(()));
        }
        o
    }

    fn status(checks: &[Check], name: &str) -> Status {
        checks.iter().find(|c| c.name == name).unwrap().status
    }

    #[test]
    fn outcomes_survive_the_pipe() {
        let mut o = all_ok();
        o.set(
            Step::ErofsFile,
            &Err(io::Error::from_raw_os_error(libc::ENOTBLK)),
        );
        assert_eq!(Outcomes::from_bytes(&o.to_bytes()), Some(o.clone()));
        assert_eq!(Outcomes::from_bytes(&[1, 2, 3]), None);
        assert!(!o.worked(Step::ErofsLoop));
        assert_eq!(o.failed(Step::ErofsLoop), None, "not run is not a failure");
    }

    #[test]
    fn a_new_kernel_passes_everything() {
        let checks = decide(&all_ok(), "ext4", true);
        for c in &checks {
            assert_eq!(c.status, Status::Ok, "{c:?}");
        }
    }

    #[test]
    fn debian_12s_kernel_uses_loop_devices_and_has_no_idmapped_tmpfs() {
        // 6.1: erofs wants a block device, tmpfs has no id-mapped mounts.
        let mut o = all_ok();
        o.set(
            Step::ErofsFile,
            &Err(io::Error::from_raw_os_error(libc::ENOTBLK)),
        );
        o.set(Step::ErofsLoop, &Ok(()));
        o.set(
            Step::IdmapTmpfs,
            &Err(io::Error::from_raw_os_error(libc::EINVAL)),
        );
        let checks = decide(&o, "ext4", true);
        assert_eq!(status(&checks, "fs.erofs"), Status::Ok);
        let erofs = checks.iter().find(|c| c.name == "fs.erofs").unwrap();
        assert!(erofs.detail.contains("loop device"), "{}", erofs.detail);
        assert!(erofs.detail.contains("6.12"), "{}", erofs.detail);
        let tmpfs = checks.iter().find(|c| c.name == "idmap.tmpfs").unwrap();
        assert_eq!(tmpfs.status, Status::Warning);
        assert!(tmpfs
            .remedy
            .as_deref()
            .unwrap()
            .starts_with("boot a kernel >= 6.3"));
        assert_eq!(status(&checks, "fs.loop"), Status::Ok);
    }

    #[test]
    fn a_kernel_without_erofs_or_loop_is_told_what_to_load() {
        let mut o = all_ok();
        o.set(
            Step::ErofsFile,
            &Err(io::Error::from_raw_os_error(libc::ENODEV)),
        );
        o.0[Step::IdmapErofs as usize] = NOT_RUN;
        let checks = decide(&o, "ext4", false);
        let erofs = checks.iter().find(|c| c.name == "fs.erofs").unwrap();
        assert_eq!(erofs.status, Status::Missing);
        assert_eq!(
            erofs.remedy.as_deref(),
            Some("load the module: modprobe erofs (CONFIG_EROFS_FS)")
        );
        assert_eq!(status(&checks, "fs.loop"), Status::Missing);
        assert_eq!(status(&checks, "idmap.erofs"), Status::Missing);

        let mut o = all_ok();
        o.set(
            Step::ErofsFile,
            &Err(io::Error::from_raw_os_error(libc::ENOTBLK)),
        );
        o.set(
            Step::ErofsLoop,
            &Err(io::Error::from_raw_os_error(libc::ENOENT)),
        );
        let checks = decide(&o, "ext4", false);
        let erofs = checks.iter().find(|c| c.name == "fs.erofs").unwrap();
        assert_eq!(erofs.status, Status::Missing);
        assert!(erofs.remedy.as_deref().unwrap().contains("modprobe loop"));
    }

    #[test]
    fn a_state_directory_on_tmpfs_before_6_3_names_the_version() {
        let mut o = all_ok();
        o.set(
            Step::IdmapStateDir,
            &Err(io::Error::from_raw_os_error(libc::EINVAL)),
        );
        let checks = decide(&o, "tmpfs", true);
        let c = checks.iter().find(|c| c.name == "idmap.state_dir").unwrap();
        assert_eq!(c.status, Status::Warning);
        assert!(
            c.detail.contains("tmpfs has them from Linux 6.3"),
            "{}",
            c.detail
        );
    }

    #[test]
    fn no_overlay_is_missing_with_modprobe() {
        let mut o = all_ok();
        o.set(
            Step::Overlay,
            &Err(io::Error::from_raw_os_error(libc::ENODEV)),
        );
        let checks = decide(&o, "ext4", true);
        let c = checks.iter().find(|c| c.name == "fs.overlay").unwrap();
        assert_eq!(c.status, Status::Missing);
        assert!(c.remedy.as_deref().unwrap().contains("modprobe overlay"));
    }

    #[test]
    fn skipped_probes_skip_every_mount_check() {
        let checks = checks(Err("needs root".into()), Path::new("/"));
        assert!(checks.len() >= 9);
        assert!(checks.iter().all(|c| c.status == Status::Skipped));
    }

    #[test]
    fn the_embedded_image_is_an_erofs_superblock() {
        let img = erofs_image();
        assert_eq!(img.len(), 4096);
        assert_eq!(&img[1024..1028], &0xE0F5_E1E2u32.to_le_bytes());
        assert_eq!(fs_name(0xEF53), "ext4");
        assert!(fs_name(1).starts_with("unknown"));
    }
}
