//! Per-team workspace quotas: a size-capped file system for each team.
//!
//! A team's directory `STATE_DIR/workspaces/<team>` is the mount point of the team's own ext4
//! file system, kept in a sparse image file `STATE_DIR/workspace-images/<team>.ext4` (root's,
//! 0600) as large as the quota, loop-mounted `nodev,nosuid,discard`. Everything a team's
//! workspaces hold lives in it, whoever writes: the API, a tar import, a run's outputs, or a
//! sandbox writing straight into a read-write mount, which the host cannot intercept, and
//! which is why the bound is a file system and not accounting: past the quota every write
//! fails with `ENOSPC` and the host's disk is untouched. `discard` makes the loop driver punch
//! holes into the image for freed blocks, so deleted files give the disk back.
//!
//! The image is made with the team's first workspace and mounted (again) by every
//! [`super::Workspaces::open`]; a mount left by a server that stopped is adopted as it is
//! (sandboxes that outlive a server keep using it). `mount -o loop` sets up an
//! auto-clearing loop device, so unmounting (nothing in husk does; tests and operators do)
//! frees it and a crash leaves no device behind. A larger quota grows the file system
//! online at open (`resize2fs`); a smaller one never shrinks it.
//!
//! The pure decisions ([`plan`], [`resize`], [`WorkspaceQuota::from_bytes`]) are separate
//! from [`TeamFs`], which runs the e2fsprogs and util-linux tools.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use husk_runtime::libc;

use super::size_text;

/// The directory of the teams' images in the state directory.
pub const IMAGES_DIR: &str = "workspace-images";

/// The default per-team quota of `husk serve`: room for real data sets and repositories; the
/// images are sparse, so a team costs the disk only what it stores.
pub const DEFAULT_QUOTA: u64 = 10 << 30;

/// The smallest quota: ext4 with a journal needs a few MiB of its own.
pub const MIN_QUOTA: u64 = 16 << 20;

/// Quotas are whole MiB.
const QUOTA_UNIT: u64 = 1 << 20;

/// The last quota a server was configured with, for the command-line tools that open the
/// same state directory without being told.
const RECORD_FILE: &str = "quota";

/// Serializes making and mounting images, across threads and processes (an OFD lock).
const LOCK_FILE: &str = ".lock";

/// The throw-away image and mount point of [`TeamFs::trial`].
const TRIAL_NAME: &str = ".trial";

/// How team file systems are mounted. `noinit_itable`: the inode tables were never written
/// (lazy init on a sparse file reads as zeroes), so the kernel need not zero them either.
const MOUNT_OPTIONS: &str = "loop,nodev,nosuid,discard,noinit_itable";

/// The per-team quota husk is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkspaceQuota {
    /// No size-capped file systems for new teams: their workspaces are plain directories.
    /// Existing images are still mounted (their data lives in them).
    Off,
    /// Each team's workspaces share a file system of this many bytes.
    PerTeam(u64),
}

impl WorkspaceQuota {
    /// From a byte count (`--workspace-quota`): 0 is [`WorkspaceQuota::Off`]; anything else
    /// at least [`MIN_QUOTA`], rounded up to a whole MiB.
    pub fn from_bytes(bytes: u64) -> Result<WorkspaceQuota, String> {
        if bytes == 0 {
            return Ok(WorkspaceQuota::Off);
        }
        if bytes < MIN_QUOTA {
            return Err(format!(
                "a workspace quota of {} is too small: use 0 (no quota) or at least {}",
                size_text(bytes),
                size_text(MIN_QUOTA)
            ));
        }
        Ok(WorkspaceQuota::PerTeam(
            bytes.div_ceil(QUOTA_UNIT) * QUOTA_UNIT,
        ))
    }

    fn bytes(self) -> Option<u64> {
        match self {
            WorkspaceQuota::Off => None,
            WorkspaceQuota::PerTeam(b) => Some(b),
        }
    }

    fn record_text(self) -> String {
        format!("{}\n", self.bytes().unwrap_or(0))
    }

    fn from_record(text: &str) -> Option<WorkspaceQuota> {
        WorkspaceQuota::from_bytes(text.trim().parse().ok()?).ok()
    }
}

/// Whether quotas are in force.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum QuotaState {
    /// Configured off: new teams get plain directories.
    Off,
    /// New teams get a file system of this many bytes.
    PerTeam(u64),
    /// Configured, but this host cannot mount team file systems: new teams get plain
    /// directories, unbounded.
    Unavailable { quota: u64, reason: String },
}

/// What is on disk for one team.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Found {
    /// The size of the team's image, when it has one.
    pub image: Option<u64>,
    /// The team directory is a mount point.
    pub mounted: bool,
    pub dir: DirState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DirState {
    Missing,
    Empty,
    NotEmpty,
}

/// What makes a team's directory usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Plan {
    /// Use it as it is: mounted, a plain directory, or missing.
    AsIs,
    /// Mount the team's image (making the mount point if it is missing).
    Mount,
    /// Make an image of this size and mount it.
    Create(u64),
    /// A plain directory with workspaces made before the team had a quota: used as it is,
    /// unbounded.
    Legacy,
    /// The team has an image, but its directory holds files that a mount would hide.
    Blocked,
}

/// The plan for a team, given what is on disk, the quota for new file systems (`None`: off
/// or unavailable) and whether the caller is about to create a workspace.
pub(super) fn plan(found: Found, quota: Option<u64>, create: bool) -> Plan {
    if found.mounted {
        return Plan::AsIs;
    }
    match (found.image, found.dir) {
        (Some(_), DirState::NotEmpty) => Plan::Blocked,
        (Some(_), _) => Plan::Mount,
        (None, DirState::NotEmpty) => Plan::Legacy,
        (None, _) => match quota {
            Some(size) if create => Plan::Create(size),
            _ => Plan::AsIs,
        },
    }
}

/// What to do with a mounted image of `image` bytes under the quota `quota`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Resize {
    Keep,
    Grow(u64),
    /// Larger than the quota: never shrunk (that could fail half-way, or not fit the data).
    Larger,
}

pub(super) fn resize(image: u64, quota: Option<u64>) -> Resize {
    match quota {
        Some(q) if q > image => Resize::Grow(q),
        Some(q) if q < image => Resize::Larger,
        _ => Resize::Keep,
    }
}

/// Errors that mean "the file system is full": the team's quota, on a team file system.
pub(super) fn is_no_space(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The image file's name for `team` (validated: `[a-z0-9_-]`).
pub(super) fn image_name(team: &str) -> String {
    format!("{team}.ext4")
}

/// The team a file of the images directory belongs to.
pub(super) fn team_of_image(file: &str) -> Option<&str> {
    file.strip_suffix(".ext4")
        .filter(|t| crate::store::validate_team(t).is_ok())
}

/// The quota the last server recorded in `state_dir` ([`WorkspaceQuota::Off`] if none).
pub(super) fn recorded(state_dir: &Path) -> WorkspaceQuota {
    fs::read_to_string(state_dir.join(IMAGES_DIR).join(RECORD_FILE))
        .ok()
        .and_then(|t| WorkspaceQuota::from_record(&t))
        .unwrap_or(WorkspaceQuota::Off)
}

/// The tools that make, mount and grow team file systems.
#[derive(Debug)]
struct Tools {
    mkfs: PathBuf,
    resize2fs: PathBuf,
    e2fsck: PathBuf,
    mount: PathBuf,
    losetup: PathBuf,
}

/// Finds the tools and the loop devices, or says what is missing and how to get it.
fn probe() -> Result<Tools, String> {
    let mut missing = Vec::new();
    if !Path::new("/dev/loop-control").exists() {
        missing.push(
            "/dev/loop-control (no loop devices; in a container, pass the host's loop \
             devices in, or run it privileged)",
        );
    }
    let mut find = |name: &str, package: &'static str| {
        let found = find_tool(name);
        if found.is_none() {
            missing.push(package);
        }
        found.unwrap_or_default()
    };
    let tools = Tools {
        mkfs: find("mkfs.ext4", "mkfs.ext4 (install e2fsprogs)"),
        resize2fs: find("resize2fs", "resize2fs (install e2fsprogs)"),
        e2fsck: find("e2fsck", "e2fsck (install e2fsprogs)"),
        mount: find("mount", "mount (install util-linux)"),
        losetup: find("losetup", "losetup (install util-linux)"),
    };
    missing.dedup();
    if missing.is_empty() {
        Ok(tools)
    } else {
        Err(format!("missing {}", missing.join(", ")))
    }
}

/// `name` in `$PATH` or the usual system directories (root's tools live in `sbin`).
fn find_tool(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Runs a tool; its error output is the error.
fn run(tool: &Path, args: &[&std::ffi::OsStr]) -> Result<(), String> {
    run_ok(tool, args, &[0])
}

/// Runs a tool whose exit codes in `ok` mean success.
fn run_ok(tool: &Path, args: &[&std::ffi::OsStr], ok: &[i32]) -> Result<(), String> {
    let out = Command::new(tool)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", tool.display()))?;
    if out.status.code().is_some_and(|c| ok.contains(&c)) {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(format!(
        "{} failed ({}): {}",
        tool.display(),
        out.status,
        stderr.trim()
    ))
}

/// The teams' images and the tools that handle them.
#[derive(Debug)]
pub(super) struct TeamFs {
    /// `STATE_DIR/workspace-images`, absolute.
    images: PathBuf,
    state: QuotaState,
    /// Or what is missing.
    tools: Result<Tools, String>,
}

impl TeamFs {
    /// Takes stock: the images directory (made when a quota is configured), the tools, and
    /// records `quota` for the command-line tools
    /// when `record`. Returns what the operator should know.
    pub fn prepare(
        state_dir: &Path,
        quota: WorkspaceQuota,
        record: bool,
    ) -> io::Result<(TeamFs, Option<String>)> {
        let images = state_dir.join(IMAGES_DIR);
        if quota != WorkspaceQuota::Off || record {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&images)?;
        }
        let images = fs::canonicalize(&images).unwrap_or(images);
        if record {
            let tmp = images.join(format!(".{RECORD_FILE}.new"));
            fs::write(&tmp, quota.record_text())?;
            fs::rename(&tmp, images.join(RECORD_FILE))?;
        }
        let tools = probe();
        let mut notice = None;
        let state = match (quota, &tools) {
            (WorkspaceQuota::Off, _) => QuotaState::Off,
            (WorkspaceQuota::PerTeam(q), Ok(_)) => QuotaState::PerTeam(q),
            (WorkspaceQuota::PerTeam(q), Err(reason)) => {
                notice = Some(unavailable_text(q, reason));
                QuotaState::Unavailable {
                    quota: q,
                    reason: reason.clone(),
                }
            }
        };
        Ok((
            TeamFs {
                images,
                state,
                tools,
            },
            notice,
        ))
    }

    pub fn state(&self) -> &QuotaState {
        &self.state
    }

    /// The size of the file systems new teams get (`None`: plain directories).
    pub fn quota(&self) -> Option<u64> {
        match self.state {
            QuotaState::PerTeam(q) => Some(q),
            _ => None,
        }
    }

    /// Quotas were configured but do not work here after all: says so, and new teams get
    /// plain directories.
    pub fn disable(&mut self, reason: String) -> String {
        let quota = self.quota().unwrap_or_default();
        let text = unavailable_text(quota, &reason);
        self.state = QuotaState::Unavailable { quota, reason };
        text
    }

    pub fn image(&self, team: &str) -> PathBuf {
        self.images.join(image_name(team))
    }

    /// The size of the team's image; `None` when it has none.
    pub fn image_size(&self, team: &str) -> io::Result<Option<u64>> {
        match fs::symlink_metadata(self.image(team)) {
            Ok(m) if m.is_file() => Ok(Some(m.len())),
            Ok(_) => Err(io::Error::other(format!(
                "{} is not a regular file",
                self.image(team).display()
            ))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The teams that have an image.
    pub fn teams(&self) -> Vec<String> {
        let Ok(rd) = fs::read_dir(&self.images) else {
            return Vec::new();
        };
        rd.flatten()
            .filter_map(|e| team_of_image(&e.file_name().to_string_lossy()).map(str::to_owned))
            .collect()
    }

    /// Holds the lock of image changes until dropped (blocks while another thread or process
    /// holds it).
    pub fn lock(&self) -> io::Result<File> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.images)?;
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(self.images.join(LOCK_FILE))?;
        // A write lock of the whole file.
        let mut fl = husk_runtime::sys::lock_range(libc::F_WRLCK, 0, 0);
        husk_runtime::sys::fcntl_lock(file.as_raw_fd(), libc::F_OFD_SETLKW, &mut fl)?;
        Ok(file)
    }

    fn tools(&self) -> Result<&Tools, String> {
        self.tools.as_ref().map_err(Clone::clone)
    }

    /// Makes the team's image: a sparse file of `size` bytes with an empty ext4 in it, made
    /// under a temporary name and renamed into place, so a crash leaves no half-made image.
    pub fn make_image(&self, team: &str, size: u64) -> Result<(), String> {
        let tools = self.tools()?;
        let dest = self.image(team);
        let tmp = self.images.join(format!(".{}.new", image_name(team)));
        let made = make_ext4(tools, &tmp, size).and_then(|()| {
            fs::rename(&tmp, &dest).map_err(|e| format!("rename {}: {e}", tmp.display()))
        });
        if made.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        made
    }

    /// Mounts the team's image on `target` (an existing, empty directory).
    pub fn mount(&self, team: &str, target: &Path) -> Result<(), String> {
        mount_image(self.tools()?, &self.image(team), target)
    }

    /// Grows the team's image, mounted on `target`, from `from` to `to` bytes. Online first:
    /// the file, the loop device's idea of its size, then the mounted file system. Where the
    /// kernel refuses that (online resizing needs `CAP_SYS_RESOURCE`, which some hosts and
    /// containers withhold even from root), offline: unmounted, checked, grown, mounted again;
    /// but only when nothing else uses it (a sandbox that outlived a server keeps its own
    /// mount of it; then it grows at a later start).
    pub fn grow(&self, team: &str, target: &Path, from: u64, to: u64) -> Result<(), String> {
        let tools = self.tools()?;
        let image = self.image(team);
        let dev = loop_device_of(target, &image)?;
        let online = set_len(&image, to)
            .and_then(|()| run(&tools.losetup, &["-c".as_ref(), dev.as_os_str()]))
            .and_then(|()| run(&tools.resize2fs, &[dev.as_os_str()]));
        let Err(online) = online else {
            return Ok(());
        };
        // Back to the size of the file system in it, which did not change.
        set_len(&image, from)?;
        let _ = run(&tools.losetup, &["-c".as_ref(), dev.as_os_str()]);
        self.grow_offline(team, target, from, to)
            .map_err(|offline| format!("online: {online}; offline: {offline}"))
    }

    fn grow_offline(&self, team: &str, target: &Path, from: u64, to: u64) -> Result<(), String> {
        let tools = self.tools()?;
        let image = self.image(team);
        let c = husk_runtime::sys::cpath(target).map_err(|e| e.to_string())?;
        husk_runtime::sys::umount2(&c, 0)
            .map_err(|e| format!("unmount {}: {e}", target.display()))?;
        // Its auto-clearing loop device goes with the file system's last user.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !husk_runtime::mountinfo::loop_devices(|f| f == image).is_empty() {
            if std::time::Instant::now() > deadline {
                // `mount -o loop` reuses the device that is still there: the same file system.
                self.mount(team, target)?;
                return Err(
                    "it is in use outside this process (sandboxes of an earlier \
                            server?); it grows at a start when it is not"
                        .into(),
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let checked = set_len(&image, to).and_then(|()| {
            // 0: clean, 1: errors fixed; beyond: not safe to resize.
            run_ok(
                &tools.e2fsck,
                &["-f".as_ref(), "-p".as_ref(), image.as_os_str()],
                &[0, 1],
            )
        });
        let grown = match checked {
            Ok(()) => run(&tools.resize2fs, &[image.as_os_str()]),
            Err(e) => {
                // resize2fs did not run: the file system still ends where it did.
                let _ = set_len(&image, from);
                Err(e)
            }
        };
        let mounted = self.mount(team, target);
        grown.and(mounted)
    }

    /// Makes, mounts and unmounts a small file system: whether this host can do it at all
    /// (tools are not enough: a container may lack the right to mount).
    pub fn trial(&self) -> Result<(), String> {
        let tools = self.tools()?;
        let image = self.images.join(format!("{TRIAL_NAME}.ext4"));
        let mp = self.images.join(TRIAL_NAME);
        // What a trial cut short by a crash left.
        if let Ok(c) = husk_runtime::sys::cpath(&mp) {
            let _ = husk_runtime::sys::umount2(&c, libc::MNT_DETACH);
        }
        let _ = fs::remove_file(&image);
        let result = (|| {
            make_ext4(tools, &image, MIN_QUOTA)?;
            fs::create_dir_all(&mp).map_err(|e| format!("create {}: {e}", mp.display()))?;
            mount_image(tools, &image, &mp)?;
            let c = husk_runtime::sys::cpath(&mp).map_err(|e| e.to_string())?;
            husk_runtime::sys::umount2(&c, 0)
                .or_else(|_| husk_runtime::sys::umount2(&c, libc::MNT_DETACH))
                .map_err(|e| format!("unmount {}: {e}", mp.display()))
        })();
        let _ = fs::remove_dir(&mp);
        let _ = fs::remove_file(&image);
        result
    }
}

/// A sparse file of `size` bytes at `path` (replacing one there), root's 0600, with an empty
/// ext4: 4 KiB blocks (whatever the size, so it grows the same way), no blocks reserved for
/// root (the quota is the team's), a root directory of root's, and lazy inode-table and
/// journal initialization (a sparse file reads back zeroes: nothing to write up front). The
/// journal stays: the image lives on the host's disk through host crashes.
fn make_ext4(tools: &Tools, path: &Path, size: u64) -> Result<(), String> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    file.set_len(size)
        .map_err(|e| format!("size {}: {e}", path.display()))?;
    drop(file);
    run(
        &tools.mkfs,
        &[
            "-q".as_ref(),
            "-F".as_ref(),
            "-b".as_ref(),
            "4096".as_ref(),
            "-m".as_ref(),
            "0".as_ref(),
            "-E".as_ref(),
            "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard".as_ref(),
            path.as_os_str(),
        ],
    )
}

/// Mounts an image's ext4 on `target` through an auto-clearing loop device.
fn mount_image(tools: &Tools, image: &Path, target: &Path) -> Result<(), String> {
    run(
        &tools.mount,
        &[
            "-t".as_ref(),
            "ext4".as_ref(),
            "-o".as_ref(),
            MOUNT_OPTIONS.as_ref(),
            image.as_os_str(),
            target.as_os_str(),
        ],
    )
}

/// The loop device (`/dev/loopN`) that the file system mounted on `target` is on, checked to
/// be backed by `image`.
fn loop_device_of(target: &Path, image: &Path) -> Result<PathBuf, String> {
    let dev = fs::metadata(target)
        .map_err(|e| format!("stat {}: {e}", target.display()))?
        .dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = format!("/sys/dev/block/{major}:{minor}");
    let name = fs::read_link(&sys)
        .map_err(|e| format!("{sys}: {e}"))?
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !name.starts_with("loop") {
        return Err(format!("{} is not on a loop device", target.display()));
    }
    let backing = husk_runtime::mountinfo::loop_backing_file(&name)
        .ok_or_else(|| format!("/dev/{name} has no backing file"))?;
    if backing != image {
        return Err(format!(
            "{} is on /dev/{name}, backed by {}, not by {}",
            target.display(),
            backing.display(),
            image.display()
        ));
    }
    Ok(PathBuf::from(format!("/dev/{name}")))
}

/// Sets the length of an image file.
fn set_len(image: &Path, size: u64) -> Result<(), String> {
    OpenOptions::new()
        .write(true)
        .open(image)
        .and_then(|f| f.set_len(size))
        .map_err(|e| format!("resize {}: {e}", image.display()))
}

/// The warning when a configured quota cannot be enforced.
fn unavailable_text(quota: u64, reason: &str) -> String {
    format!(
        "the workspace quota of {} per team is NOT enforced: team file systems cannot be \
         made here ({reason}); new teams' workspaces are plain directories, unbounded. Fix \
         that and restart, or set --workspace-quota 0 to run without quotas knowingly",
        size_text(quota)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn found(image: Option<u64>, mounted: bool, dir: DirState) -> Found {
        Found {
            image,
            mounted,
            dir,
        }
    }

    #[test]
    fn quota_sizes_are_checked_and_rounded() {
        assert_eq!(WorkspaceQuota::from_bytes(0), Ok(WorkspaceQuota::Off));
        assert!(WorkspaceQuota::from_bytes(MIN_QUOTA - 1)
            .unwrap_err()
            .contains("too small"));
        assert_eq!(
            WorkspaceQuota::from_bytes(MIN_QUOTA),
            Ok(WorkspaceQuota::PerTeam(MIN_QUOTA))
        );
        assert_eq!(
            WorkspaceQuota::from_bytes(64 * MIB + 1),
            Ok(WorkspaceQuota::PerTeam(65 * MIB))
        );
        assert_eq!(
            WorkspaceQuota::from_bytes(DEFAULT_QUOTA),
            Ok(WorkspaceQuota::PerTeam(10 << 30))
        );
    }

    #[test]
    fn the_record_round_trips_and_garbage_is_off() {
        for q in [WorkspaceQuota::Off, WorkspaceQuota::PerTeam(64 * MIB)] {
            assert_eq!(WorkspaceQuota::from_record(&q.record_text()), Some(q));
        }
        assert_eq!(WorkspaceQuota::from_record("lots"), None);
        assert_eq!(WorkspaceQuota::from_record("5"), None);
        let dir = std::env::temp_dir().join(format!("husk-quota-rec-{}", super::super::random()));
        assert_eq!(recorded(&dir), WorkspaceQuota::Off);
    }

    #[test]
    fn a_mounted_team_is_used_as_it_is() {
        for dir in [DirState::Empty, DirState::NotEmpty] {
            let f = found(Some(64 * MIB), true, dir);
            assert_eq!(plan(f, Some(64 * MIB), true), Plan::AsIs);
            assert_eq!(plan(f, None, false), Plan::AsIs);
        }
    }

    #[test]
    fn an_image_is_mounted_whatever_the_quota_unless_files_would_be_hidden() {
        for quota in [None, Some(64 * MIB)] {
            for create in [false, true] {
                for dir in [DirState::Missing, DirState::Empty] {
                    let f = found(Some(64 * MIB), false, dir);
                    assert_eq!(plan(f, quota, create), Plan::Mount);
                }
                let f = found(Some(64 * MIB), false, DirState::NotEmpty);
                assert_eq!(plan(f, quota, create), Plan::Blocked);
            }
        }
    }

    #[test]
    fn a_new_team_gets_an_image_only_when_a_workspace_is_created_under_a_quota() {
        for dir in [DirState::Missing, DirState::Empty] {
            let f = found(None, false, dir);
            assert_eq!(plan(f, Some(64 * MIB), true), Plan::Create(64 * MIB));
            assert_eq!(plan(f, Some(64 * MIB), false), Plan::AsIs);
            assert_eq!(plan(f, None, true), Plan::AsIs);
        }
    }

    #[test]
    fn workspaces_from_before_quotas_stay_where_they_are() {
        let f = found(None, false, DirState::NotEmpty);
        assert_eq!(plan(f, Some(64 * MIB), true), Plan::Legacy);
        assert_eq!(plan(f, None, true), Plan::Legacy);
    }

    #[test]
    fn images_grow_to_a_larger_quota_and_never_shrink() {
        assert_eq!(resize(64 * MIB, Some(128 * MIB)), Resize::Grow(128 * MIB));
        assert_eq!(resize(64 * MIB, Some(64 * MIB)), Resize::Keep);
        assert_eq!(resize(128 * MIB, Some(64 * MIB)), Resize::Larger);
        assert_eq!(resize(128 * MIB, None), Resize::Keep);
    }

    #[test]
    fn no_space_and_disk_quota_errors_are_quota_errors() {
        assert!(is_no_space(&io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(is_no_space(&io::Error::from_raw_os_error(libc::EDQUOT)));
        assert!(!is_no_space(&io::Error::from_raw_os_error(libc::EIO)));
        assert!(!is_no_space(&io::Error::other("full")));
    }

    #[test]
    fn image_names_map_to_teams() {
        assert_eq!(image_name("acme"), "acme.ext4");
        assert_eq!(team_of_image("acme.ext4"), Some("acme"));
        assert_eq!(team_of_image("-x_1.ext4"), Some("-x_1"));
        for other in [
            ".lock",
            "quota",
            ".trial.ext4",
            ".acme.ext4.new",
            "Acme.ext4",
            ".ext4",
        ] {
            assert_eq!(team_of_image(other), None, "{other}");
        }
    }

    #[test]
    fn the_warning_names_what_is_missing_and_the_way_out() {
        let text = unavailable_text(10 << 30, "missing mkfs.ext4 (install e2fsprogs)");
        for part in ["10 GiB", "NOT enforced", "e2fsprogs", "--workspace-quota 0"] {
            assert!(text.contains(part), "{part} not in {text}");
        }
    }
}
