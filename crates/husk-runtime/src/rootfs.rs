//! Builds a sandbox's root filesystem. Runs in the sandbox's first process while it is still
//! host root in its new (private) mount namespace, before it enters its user namespace: the
//! mount namespace stays owned by the host's user namespace, so nothing inside the sandbox,
//! not even its root, can unmount, remount or move any of these mounts.
//!
//! Layout: a size-capped tmpfs holds the overlay's upper and work directories and the per-sandbox
//! skeleton (owned by the sandbox's own uids), and `/dev` and `/dev/shm`, bound from it; the
//! template is the overlay's read-only lower layer; `/proc` is fresh with the files that
//! describe the host masked; `/dev` is minimal, with a private devpts.
//!
//! Superblocks are counted: each one costs every memory cgroup on the host a slot in its
//! shrinker maps, so a sandbox's cgroup costs more to create, and a new superblock beyond the
//! host's highest count walks every cgroup, the more sandboxes are alive (design.md §15). A
//! sandbox has five: the overlay, the tmpfs, devpts, `/proc` and its IPC namespace's mqueue.
//!
//! Templates ([`RootSource`]):
//! - host: the lower layer is the host template's copy of a few `/etc` files, and the host's
//!   `/usr` is bind-mounted read-only, nosuid, nodev (with husk's `sudo` layer over it for
//!   agent sandboxes);
//! - image: the lower layer is an id-mapped view of the template's erofs image (mounted once
//!   on the host, see [`crate::images`]), so files the image's root owns are owned by the
//!   sandbox's root; husk's `sudo` layer is the top lower layer for agent sandboxes;
//! - layers (build steps): id-mapped views of the given layers under the skeleton (a lower
//!   layer of its own, so it never lands in the result), and the upper directory is the
//!   step's result on the host's disk.

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};

use crate::host_template::{HostTemplate, TopEntry};
use crate::spec::{MountIds, NetworkMode, RootSource, SandboxSpec};
use crate::sys::{self, cpath};

/// Files of a fresh /proc that describe the host rather than the sandbox (the host's tasks
/// and timers, kernel memory) or act on it; each present one is covered by a read-only
/// /dev/null. The rest of /proc is either per-namespace or refused to the sandbox's uids.
pub const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "sched_debug",
    "timer_list",
    "latency_stats",
    "sysrq-trigger",
];

/// Character devices of the minimal /dev: (name, major, minor).
pub const DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// Inputs of [`build`].
pub struct RootfsPlan<'a> {
    pub spec: &'a SandboxSpec,
    pub template: &'a HostTemplate,
    /// Empty host directory the staging tmpfs is mounted on (inside the private namespace).
    pub staging: &'a Path,
    /// Host uid/gid that sandbox id 0 maps to.
    pub base: u32,
    /// husk's `sudo` layer (see [`crate::usr_layer`]); `None`: none (not an agent sandbox).
    pub usr_layer: Option<&'a Path>,
    /// Where the template image is mounted on the host ([`RootSource::Image`]).
    pub image: Option<&'a Path>,
    /// The user namespace whose mapping id-mapped layers get ([`RootSource::Image`] and
    /// [`RootSource::Layers`]): the sandbox's own mapping.
    pub idmap: Option<std::os::fd::BorrowedFd<'a>>,
    /// Per mount of the spec: its owner mapping ([`crate::MountIds::Owner`]), else `None`.
    pub mount_maps: &'a [Option<std::os::fd::BorrowedFd<'a>>],
}

fn c(p: &Path) -> io::Result<CString> {
    cpath(p)
}

fn ctx(what: impl std::fmt::Display) -> impl FnOnce(io::Error) -> io::Error {
    move |e| io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn mount_fs(fstype: &str, target: &Path, flags: libc::c_ulong, data: &str) -> io::Result<()> {
    let t = CString::new(fstype)?;
    let d = CString::new(data)?;
    sys::mount(Some(&t), &c(target)?, Some(&t), flags, Some(&d))
        .map_err(ctx(format_args!("mount {fstype} on {}", target.display())))
}

fn bind(src: &Path, target: &Path, writable: bool) -> io::Result<()> {
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if !writable {
        flags |= libc::MS_RDONLY;
    }
    bind_as(src, target, flags)
}

/// A bind mount of `src` on `target` with exactly the per-mount flags `flags` (besides
/// `MS_BIND`): the bind inherits its source's, which a remount replaces.
fn bind_as(src: &Path, target: &Path, flags: libc::c_ulong) -> io::Result<()> {
    let t = c(target)?;
    sys::mount(Some(&c(src)?), &t, None, libc::MS_BIND, None).map_err(ctx(format_args!(
        "bind {} on {}",
        src.display(),
        target.display()
    )))?;
    sys::mount(
        None,
        &t,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | flags,
        None,
    )
    .map_err(ctx(format_args!("remount {}", target.display())))
}

/// mkdir with an exact mode (the caller runs with umask 0); the owner is the caller's fsuid.
fn mkdir(path: &Path, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(ctx(format_args!("mkdir {}", path.display())))
}

/// Writes a new file with mode 0644; the owner is the caller's fsuid.
fn write_file(path: &Path, content: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(path)
        .and_then(|mut f| f.write_all(content.as_bytes()))
        .map_err(ctx(format_args!("write {}", path.display())))
}

/// The relative form of an absolute sandbox path, refusing `..` (the operator's input, but a
/// `..` would point outside the new root before pivot_root).
pub fn relative(sandbox_path: &Path) -> io::Result<PathBuf> {
    let mut out = PathBuf::new();
    for comp in sandbox_path.components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(p) => out.push(p),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: sandbox paths must be absolute without `..`",
                        sandbox_path.display()
                    ),
                ))
            }
        }
    }
    if !sandbox_path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: sandbox paths must be absolute", sandbox_path.display()),
        ));
    }
    Ok(out)
}

/// Sets up the network namespace the caller just entered: loopback up, and sandbox root may
/// bind low ports and ping inside it (both per-namespace settings). Called after `pivot_root`,
/// so `/proc` is the sandbox's own.
pub fn network() -> io::Result<()> {
    sys::loopback_up().map_err(ctx("bring up loopback"))?;
    let _ = sys::write_file(
        Path::new("/proc/sys/net/ipv4/ip_unprivileged_port_start"),
        b"0",
    );
    let _ = sys::write_file(
        Path::new("/proc/sys/net/ipv4/ping_group_range"),
        b"0 2147483647",
    );
    Ok(())
}

/// Builds the root under `plan.staging/root` and pivots into it. On return the process's root
/// is the sandbox root and the host's tree is detached.
///
/// Returns the writable layer's directory, open (the overlay's upper directory on the
/// sandbox's tmpfs), for roots that have one (not build steps, whose upper directory is on the
/// host already): the spawner keeps it to copy the layer out (see [`crate::layer_capture`]).
pub fn build(plan: &RootfsPlan<'_>) -> io::Result<Option<std::os::fd::OwnedFd>> {
    let spec = plan.spec;
    let user_ids = (plan.base + 1000, plan.base + 1000);
    // Nothing done in this namespace may propagate back to the host.
    sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .map_err(ctx("make / private"))?;

    let stage = plan.staging;
    // Everything the sandbox writes into RAM: its writable layer (but a build step's, which is
    // on the host's disk), `/dev` and `/dev/shm`, under one cap.
    let size = spec.files_in_memory();
    let inodes = layer_inodes(size);
    let base = plan.base;
    mount_fs(
        "tmpfs",
        stage,
        libc::MS_NOSUID | libc::MS_NODEV,
        &format!("size={size},nr_inodes={inodes},mode=0755,uid={base},gid={base}"),
    )?;
    let root = stage.join("root");
    sys::umask(0);
    let upper = match &spec.rootfs {
        RootSource::Host => Some(host_root(plan, &root)?),
        RootSource::Image { .. } => Some(image_root(plan, &root)?),
        RootSource::Layers { lower, upper, work } => {
            layers_root(plan, &root, lower, upper, work)?;
            None
        }
    };
    if !spec.mounts.is_empty() {
        // Mount points are resolved inside the new root (a template's symlinks must not send
        // them onto the host), and mounted onto through the fd that resolution returned.
        let root_fd: std::os::fd::OwnedFd = fs::File::open(&root)?.into();
        for (i, m) in spec.mounts.iter().enumerate() {
            let is_dir = fs::metadata(&m.host)
                .map_err(ctx(format_args!("mount source {}", m.host.display())))?
                .is_dir();
            let at = crate::transfer::mount_point(root_fd.as_fd(), &m.sandbox, is_dir, user_ids)
                .map_err(|e| io::Error::other(format!("mount point: {e}")))?;
            let mut attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
            if !m.writable {
                attrs |= sys::MOUNT_ATTR_RDONLY;
            }
            let idmap = match (m.ids, plan.idmap, plan.mount_maps.get(i).copied().flatten()) {
                (MountIds::Unmapped, _, _) => None,
                (MountIds::Shared, Some(map), _) | (MountIds::Owner { .. }, _, Some(map)) => {
                    Some(map)
                }
                _ => return Err(io::Error::other("id-mapped mount without an id map")),
            };
            let host = c(&m.host)?;
            let mounted = match sys::bind_onto_fd(&host, at.as_fd(), attrs, idmap) {
                // The operator's own directory on a file system this kernel cannot id-map
                // (tmpfs before Linux 6.3, say): mounted unmapped, as the `-v` help says.
                Err(e)
                    if e.raw_os_error() == Some(libc::EINVAL)
                        && matches!(m.ids, MountIds::Owner { .. }) =>
                {
                    sys::bind_onto_fd(&host, at.as_fd(), attrs, None)
                }
                other => other,
            };
            mounted.map_err(ctx(format_args!(
                "mount {} on {}",
                m.host.display(),
                m.sandbox.display()
            )))?;
        }
    }
    dev(stage, &root.join("dev"), plan.base)?;
    proc(&root.join("proc"))?;

    sys::sethostname(&spec.hostname).map_err(ctx("sethostname"))?;

    std::env::set_current_dir(&root).map_err(ctx("chdir new root"))?;
    sys::pivot_root(c".", c".").map_err(ctx("pivot_root"))?;
    sys::umount2(c".", libc::MNT_DETACH).map_err(ctx("detach old root"))?;
    std::env::set_current_dir("/")?;
    Ok(upper)
}

/// The inodes of a writable layer of `disk` bytes: bounded too, so a sandbox cannot exhaust
/// memory with empty files.
pub(crate) fn layer_inodes(disk: u64) -> u64 {
    (disk / 4096).clamp(4096, 1 << 20)
}

/// The writable layer's directory, opened before the sandbox's processes exist (not followed
/// if it were a link: it is one this process just made). `O_PATH`: its users open what they
/// read beneath it, and a path fd costs nothing at a close. The spawner holds one per live
/// sandbox, and each new sandbox's first process inherits and closes them all: a readable
/// directory fd's close looks up the directory's dnotify marks, a cache miss each.
fn open_upper(upper: &Path) -> io::Result<std::os::fd::OwnedFd> {
    sys::open(
        &c(upper)?,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        0,
    )
    .map_err(ctx("open the writable layer"))
}

/// The root of a host-template sandbox: the host template's `/etc` copy under a tmpfs upper
/// layer, the host's `/usr` and top-level directories bound read-only.
fn host_root(plan: &RootfsPlan<'_>, root: &Path) -> io::Result<std::os::fd::OwnedFd> {
    let (upper, work) = tmpfs_upper(plan, root, Skeleton::Host)?;
    let mut lowers = saved_layers(plan)?;
    lowers.push(plan.template.lower.display().to_string());
    overlay(root, &lowers.join(":"), &upper, &work)?;
    match plan.usr_layer {
        // A read-only overlay (two lower layers, no upper): the host's /usr with husk's layer
        // on top.
        Some(layer) => mount_fs(
            "overlay",
            &root.join("usr"),
            libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
            &format!("lowerdir={}:/usr", layer.join("usr").display()),
        )
        .map_err(ctx("mount /usr"))?,
        None => bind(Path::new("/usr"), &root.join("usr"), false)?,
    }
    for (name, entry) in &plan.template.top {
        if *entry == TopEntry::Dir {
            bind(&Path::new("/").join(name), &root.join(name), false)?;
        }
    }
    open_upper(&upper)
}

/// The root of a sandbox of a built template: the image (id-mapped) under a tmpfs upper layer.
fn image_root(plan: &RootfsPlan<'_>, root: &Path) -> io::Result<std::os::fd::OwnedFd> {
    let (image, idmap) = match (plan.image, plan.idmap) {
        (Some(i), Some(m)) => (i, m),
        _ => {
            return Err(io::Error::other(
                "image sandbox without its image or id map",
            ))
        }
    };
    let (upper, work) = tmpfs_upper(plan, root, Skeleton::Image)?;
    let lower = id_mapped_layer(plan.staging, 0, image, idmap)?;
    let mut lowers: Vec<String> = plan
        .usr_layer
        .iter()
        .map(|l| l.display().to_string())
        .collect();
    lowers.extend(saved_layers(plan)?);
    lowers.push(lower.display().to_string());
    overlay(root, &lowers.join(":"), &upper, &work)?;
    open_upper(&upper)
}

/// Id-mapped, read-only views of the spec's saved layers (what an earlier sandbox of the same
/// lineage changed: a paused sandbox's files, a snapshot's), top first, as overlay lower
/// layers between husk's own layer and the template. Their ids are image ids (0..65536),
/// which the sandbox's mapping shows as its own.
fn saved_layers(plan: &RootfsPlan<'_>) -> io::Result<Vec<String>> {
    if plan.spec.layers.is_empty() {
        return Ok(Vec::new());
    }
    let Some(idmap) = plan.idmap else {
        return Err(io::Error::other(
            "saved layers without the sandbox's id map",
        ));
    };
    plan.spec
        .layers
        .iter()
        .enumerate()
        .map(|(i, layer)| {
            // `l0` is the image's view; saved layers take the numbers after the template's.
            id_mapped_layer(plan.staging, i + 1, layer, idmap).map(|p| p.display().to_string())
        })
        .collect()
}

/// Mounts an id-mapped, read-only view of `layer` at `<stage>/l<i>`; returns that path.
fn id_mapped_layer(
    stage: &Path,
    i: usize,
    layer: &Path,
    idmap: std::os::fd::BorrowedFd<'_>,
) -> io::Result<PathBuf> {
    let at = stage.join(format!("l{i}"));
    mkdir(&at, 0o755)?;
    let attrs = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
    sys::idmapped_mount(&c(layer)?, idmap, attrs, &c(&at)?)
        .map_err(ctx(format_args!("id-mapped view of {}", layer.display())))?;
    Ok(at)
}

/// The sandbox's root overlay: `lowers` (top first, `:`-separated) under `upper`.
fn overlay(root: &Path, lowers: &str, upper: &Path, work: &Path) -> io::Result<()> {
    let opts = format!(
        "lowerdir={lowers},upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    mount_fs("overlay", root, libc::MS_NOSUID | libc::MS_NODEV, &opts)
}

/// The root of a build step: the skeleton and the id-mapped layers as lower layers, the step's
/// upper directory on the host's disk (handed to the sandbox's root, so what the step creates
/// is owned by sandbox ids; the builder shifts them back to image ids afterwards).
fn layers_root(
    plan: &RootfsPlan<'_>,
    root: &Path,
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
) -> io::Result<()> {
    let Some(idmap) = plan.idmap else {
        return Err(io::Error::other("build sandbox without its id map"));
    };
    let stage = plan.staging;
    let skel = stage.join("skel");
    {
        let _as_sandbox_root = sys::FsIds::enter(plan.base, plan.base)?;
        mkdir(root, 0o755)?;
        mkdir(&skel, 0o755)?;
        skeleton(&skel, plan, Skeleton::Build)?;
    }
    sys::lchown(&c(upper)?, plan.base, plan.base)?;
    let mut lowers = skel.display().to_string();
    for (i, layer) in lower.iter().enumerate() {
        let at = id_mapped_layer(stage, i, layer, idmap)?;
        lowers.push(':');
        lowers.push_str(&at.display().to_string());
    }
    overlay(root, &lowers, upper, work)
}

/// Makes the tmpfs upper and work directories (and the root mount point) in the staging
/// tmpfs, with the skeleton in the upper layer.
fn tmpfs_upper(
    plan: &RootfsPlan<'_>,
    root: &Path,
    kind: Skeleton,
) -> io::Result<(PathBuf, PathBuf)> {
    let upper = plan.staging.join("upper");
    let work = plan.staging.join("work");
    {
        // Everything of the skeleton is created as the sandbox's root (fsuid), so it is owned
        // by the sandbox without a chown per entry.
        let _as_sandbox_root = sys::FsIds::enter(plan.base, plan.base)?;
        for d in [&upper, &work, &root.to_path_buf()] {
            mkdir(d, 0o755)?;
        }
        skeleton(&upper, plan, kind)?;
    }
    sys::lchown(
        &c(&upper.join("home/user"))?,
        plan.base + 1000,
        plan.base + 1000,
    )?;
    Ok((upper, work))
}

/// What the skeleton layer holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Skeleton {
    /// Every top-level directory, generated users, the host's `/bin` etc. as symlinks.
    Host,
    /// Directories a sandbox needs whatever the image has, and the directories of husk's
    /// `sudo` layer (so that they are owned by the sandbox's root, not by the host's); users
    /// are the image's own.
    Image,
    /// Only mount points and the generated `/etc` files (it is a lower layer of a build step).
    Build,
}

/// Creates the per-sandbox skeleton in `upper`. Runs with the sandbox root's fsuid and umask 0,
/// so every entry is owned by the sandbox with exactly the mode given.
fn skeleton(upper: &Path, plan: &RootfsPlan<'_>, kind: Skeleton) -> io::Result<()> {
    let etc = upper.join("etc");
    if kind == Skeleton::Build {
        for d in ["dev", "proc", "etc"] {
            mkdir(&upper.join(d), 0o755)?;
        }
        return etc_files(&etc, plan);
    }
    for (d, mode) in [
        ("usr", 0o755),
        ("etc", 0o755),
        ("dev", 0o755),
        ("proc", 0o755),
        ("home", 0o755),
        ("root", 0o700),
        ("var", 0o755),
        ("var/tmp", 0o1777),
        ("run", 0o755),
        ("mnt", 0o755),
        ("opt", 0o755),
        ("srv", 0o755),
        ("tmp", 0o1777),
    ] {
        mkdir(&upper.join(d), mode)?;
    }
    // Handed to the user by the caller (a chown needs the file-system capabilities that a
    // non-zero fsuid clears).
    mkdir(&upper.join("home/user"), 0o750)?;
    if kind == Skeleton::Image {
        for d in ["usr/local", "usr/local/bin"] {
            mkdir(&upper.join(d), 0o755)?;
        }
        return etc_files(&etc, plan);
    }
    for (name, entry) in &plan.template.top {
        let p = upper.join(name);
        match entry {
            TopEntry::Symlink(target) => symlink(target, &p)?,
            TopEntry::Dir => mkdir(&p, 0o755)?,
        }
    }
    write_file(
        &etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/bash\n\
         user:x:1000:1000:user:/home/user:/bin/bash\n\
         nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    write_file(
        &etc.join("group"),
        "root:x:0:\ntty:x:5:\nuser:x:1000:\nnogroup:x:65534:\n",
    )?;
    etc_files(&etc, plan)
}

/// The generated `/etc` files every sandbox gets: its hostname, hosts and resolver.
fn etc_files(etc: &Path, plan: &RootfsPlan<'_>) -> io::Result<()> {
    let hostname = &plan.spec.hostname;
    write_file(&etc.join("hostname"), &format!("{hostname}\n"))?;
    write_file(
        &etc.join("hosts"),
        &format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"),
    )?;
    let resolv = match plan.spec.network {
        // The sandbox has no network beyond loopback, hence no name server.
        NetworkMode::Loopback => "# husk: this sandbox has no network access\n".to_string(),
        // A build step on the host's network uses the host's resolvers.
        NetworkMode::Host => fs::read_to_string("/etc/resolv.conf").unwrap_or_default(),
        // Its only name server is husk's resolver on the router (which also answers whatever
        // address a program sends DNS to).
        NetworkMode::Joined { nameserver } => format!("nameserver {nameserver}\n"),
    };
    write_file(&etc.join("resolv.conf"), &resolv)
}

/// The minimal `/dev` and its `/dev/shm`: directories of the staging tmpfs (`stage`), not file
/// systems of their own (see the module documentation), so their files count against the
/// sandbox's disk.
fn dev(stage: &Path, dev: &Path, base: u32) -> io::Result<()> {
    let (staged_dev, staged_shm) = (stage.join("dev"), stage.join("shm"));
    {
        let _as_sandbox_root = sys::FsIds::enter(base, base)?;
        mkdir(&staged_dev, 0o755)?;
        mkdir(&staged_shm, 0o1777)?;
    }
    // Devices work here (the tmpfs is mounted nodev); nothing executes from it.
    bind_as(&staged_dev, dev, libc::MS_NOSUID | libc::MS_NOEXEC)?;
    for (name, major, minor) in DEVICES {
        let p = c(&dev.join(name))?;
        sys::mknod_char(&p, 0o666, *major, *minor).map_err(ctx(format_args!("mknod {name}")))?;
        // Owned by the sandbox's root like the rest of its tree (mknod needs CAP_MKNOD, which
        // a non-zero fsuid would clear, so this is a chown afterwards).
        sys::lchown(&p, base, base)?;
    }
    let _as_sandbox_root = sys::FsIds::enter(base, base)?;
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        symlink(target, dev.join(link))?;
    }
    let pts = dev.join("pts");
    let shm = dev.join("shm");
    mkdir(&pts, 0o755)?;
    mkdir(&shm, 0o1777)?;
    // devpts options are read in the host's user namespace: the tty group is the host gid that
    // sandbox gid 5 maps to.
    mount_fs(
        "devpts",
        &pts,
        libc::MS_NOSUID | libc::MS_NOEXEC,
        &format!("newinstance,ptmxmode=0666,mode=0620,gid={}", base + 5),
    )?;
    bind_as(&staged_shm, &shm, libc::MS_NOSUID | libc::MS_NODEV)?;
    Ok(())
}

fn proc(proc: &Path) -> io::Result<()> {
    mount_fs(
        "proc",
        proc,
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        "",
    )?;
    for name in PROC_MASKED_FILES {
        let p = proc.join(name);
        if fs::symlink_metadata(&p).is_ok() {
            bind(Path::new("/dev/null"), &p, false)?;
        }
    }
    Ok(())
}
