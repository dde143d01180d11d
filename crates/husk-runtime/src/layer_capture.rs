//! Capturing a sandbox's writable layer as a durable overlay lower layer.
//!
//! What a sandbox's processes write lands in its overlay's upper directory, on the staging
//! tmpfs that vanishes with the sandbox. To pause a sandbox (or snapshot it), that directory
//! is copied here into a layer directory on the host's disk, in the format overlayfs reads
//! (deleted entries as 0/0 character-device whiteouts, replacing directories marked with
//! `trusted.overlay.opaque`, see [`crate::layerfs`]), so that a later sandbox mounts it as
//! its topmost lower layer and sees what the paused one saw. A sandbox paused a second time
//! had the first capture as that lower layer; its new capture is the merge of both
//! ([`capture_layer`]'s `below`), so layers do not pile up.
//!
//! Threat model: everything in the upper directory is the sandbox's and hostile: names (any
//! bytes but `/`), symlinks anywhere, file types (a fifo, a socket, a device), counts, sizes,
//! nesting. Every lookup in it is one name from getdents, resolved relative to its directory
//! fd by `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV` and `O_NOFOLLOW`, so a symlink is read as a link and never followed; a
//! regular file is opened `O_NONBLOCK` and checked with `fstat` to be the very inode `lstat`
//! described (else [`CaptureError::Raced`]); devices and sockets are never opened. The
//! sandbox is frozen while it is captured, but safety does not depend on that. Entries,
//! bytes and depth are bounded. `dest` and `below` are trusted (ours): everything is written
//! through `*at` calls relative to dest's directory fds, with names that came from getdents.
//!
//! What the caller must provide:
//! - The sandbox's overlay was mounted without `redirect_dir`, `metacopy` and `index` (the
//!   kernel's defaults, and `rootfs.rs`'s mounts): a redirected directory or a metacopy file
//!   keeps part of what it shows in a lower layer, which is not captured.
//! - `dest` lies in a directory only root can enter. The layer keeps the set-id bits of files
//!   whose owners are shifted down to sandbox ids `0..65536`, which on the host are real ids:
//!   a set-uid file of the sandbox's root is set-uid host root there. (A sandbox mounts its
//!   layers id-mapped, `rootfs.rs`, where they are owned by its own ids again.)
//! - Up to three file descriptors per directory level ([`MAX_DEPTH`] levels): `husk serve`
//!   raises `RLIMIT_NOFILE` ([`crate::sys::raise_nofile_limit`]); past the limit the capture
//!   fails with `EMFILE`, it does not go wrong.
//! - The result is used only if this returns `Ok`: on an error, `dest` holds a partial
//!   layer, which the caller deletes.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::layerfs::OPAQUE_XATTR;
use crate::sys;

#[cfg(test)]
mod tests;

/// Deepest directory nesting captured (the layer root is depth 0): a sandbox can nest
/// directories without end (PATH_MAX bounds a path string, not a tree), and each level we
/// descend holds up to three fds.
pub const MAX_DEPTH: usize = 1024;

/// Host ids `base..base + ID_RANGE` are the sandbox's ids `0..ID_RANGE`.
const ID_RANGE: u32 = 65536;

/// Owner of captured entries whose host owner was outside the sandbox's id range.
pub const NOBODY: u32 = 65534;

/// The kernel's own bounds (`XATTR_LIST_MAX`, `XATTR_SIZE_MAX`): the whole list of an
/// inode's xattr names, and one value. A larger answer (`ERANGE`) is refused, not truncated.
const XATTR_LIST_MAX: usize = 64 * 1024;
const XATTR_VALUE_MAX: usize = 64 * 1024;

/// Copy buffer: large enough for throughput, small enough to bound memory.
const BUF_SIZE: usize = 128 * 1024;

/// How every name is looked up, in the source and in dest: the name itself, never a symlink
/// (`O_NOFOLLOW` is added for the last component), never out of the directory, never into a
/// mount on top of it.
const RESOLVE: u64 = libc::RESOLVE_BENEATH
    | libc::RESOLVE_NO_SYMLINKS
    | libc::RESOLVE_NO_MAGICLINKS
    | libc::RESOLVE_NO_XDEV;

/// The xattr prefix copied (besides the opaque marker on directories); `security.*` (file
/// capabilities), `trusted.*` (overlayfs's bookkeeping), `system.*` (ACLs) are dropped.
const USER_XATTR_PREFIX: &[u8] = b"user.";

/// Upper bounds for one [`capture_layer`], so a sandbox cannot fill the host disk or memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureLimits {
    /// Bytes of file content and of `user.*` xattr values written (files hard-linked from
    /// `below` write none).
    pub max_bytes: u64,
    /// Entries handled below the layer root, of every kind, from the upper layer and from
    /// `below` (a name both have counts once); also bounds the names held in memory.
    pub max_entries: u64,
}

/// What a capture put into the layer. An entry hard-linked from `below` counts under its
/// kind and in `from_below`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CaptureReport {
    /// Regular files (a hard-linked group once).
    pub files: u64,
    /// Directories, the layer root not included.
    pub dirs: u64,
    pub symlinks: u64,
    /// Whiteouts copied or linked (not those standing in for skipped entries).
    pub whiteouts: u64,
    /// Names that are further hard links of an inode already captured from the upper layer.
    pub hardlinks: u64,
    /// Bytes written: file content and `user.*` xattr values.
    pub bytes: u64,
    /// Devices and sockets, which are not captured: a whiteout takes their place, so the name
    /// stays hidden rather than showing what a lower layer has under it.
    pub skipped: u64,
    pub fifos: u64,
    /// Non-directories hard-linked from `below` rather than copied.
    pub from_below: u64,
}

/// Why a capture failed. Paths are relative to the layer root (`.` is the root), except for
/// failures to open `dest` or `below` themselves, which name the path given.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// A system call failed.
    #[error("cannot {op} {}", shown(.path))]
    Io {
        /// What we were doing ("open", "create", "read", ...), and where.
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A [`CaptureLimits`] bound (or the kernel's xattr sizes) would be exceeded.
    #[error("layer capture limit exceeded: more than {limit} {what}")]
    LimitExceeded {
        /// `"entries"`, `"bytes"`, `"xattr name bytes"` or `"xattr value bytes"`.
        what: &'static str,
        limit: u64,
    },
    /// A directory nested deeper than [`MAX_DEPTH`].
    #[error("directory nesting deeper than {} levels at {}", MAX_DEPTH, shown(.path))]
    TooDeep {
        /// The first directory past the limit.
        path: PathBuf,
    },
    /// An entry changed between inspection and open (a frozen sandbox cannot do that).
    #[error("{} changed while it was captured", shown(.path))]
    Raced { path: PathBuf },
    /// `dest` already had entries: a layer is captured into a fresh directory.
    #[error("capture destination {} is not empty", .path.display())]
    DestNotEmpty { path: PathBuf },
}

/// A layer-relative path for messages: the root as `.`.
fn shown(path: &Path) -> String {
    match path.as_os_str().is_empty() {
        true => ".".to_owned(),
        false => path.display().to_string(),
    }
}

/// Where an entry is, for errors: its directory's path relative to the layer root, and its
/// name (none for that directory itself). The full path is built only when an error names
/// it; built for every entry, it would cost each entry its directory's depth (a hostile tree
/// can be [`MAX_DEPTH`] names of 255 bytes deep).
#[derive(Clone, Copy)]
struct At<'a> {
    dir: &'a Path,
    name: Option<&'a CStr>,
}

impl<'a> At<'a> {
    /// Entry `name` of `dir` (`dir` itself if `name` is empty: the layer root).
    fn new(dir: &'a Path, name: &'a CStr) -> At<'a> {
        let name = (!name.is_empty()).then_some(name);
        At { dir, name }
    }

    /// Directory `dir` itself (or a path given to [`capture_layer`]).
    fn dir(dir: &'a Path) -> At<'a> {
        At { dir, name: None }
    }

    fn path(self) -> PathBuf {
        match self.name {
            Some(name) => self.dir.join(name_path(name)),
            None => self.dir.to_path_buf(),
        }
    }
}

/// Builds the `map_err` closure for a failed syscall on the entry `at`.
fn io_err<'a>(op: &'static str, at: At<'a>) -> impl FnOnce(io::Error) -> CaptureError + 'a {
    move |source| CaptureError::Io {
        op,
        path: at.path(),
        source,
    }
}

/// A directory entry name as a path component.
fn name_path(name: &CStr) -> &Path {
    Path::new(OsStr::from_bytes(name.to_bytes()))
}

/// Host id `id` as the sandbox's id: `id - base` inside the sandbox's range, else `other`.
pub fn shift_id(id: u32, base: u32, other: u32) -> u32 {
    match id.checked_sub(base) {
        Some(sandbox_id) if sandbox_id < ID_RANGE => sandbox_id,
        _ => other,
    }
}

/// Copies `upper` (an `O_PATH` or `O_RDONLY` directory fd of the sandbox's upper layer:
/// hostile content) into `dest` (an existing, empty directory on the host, trusted), shifting
/// owners from host ids `base..base+65536` to `0..65536` (other owners become 0 for
/// whiteouts, [`NOBODY`] otherwise).
///
/// With `below` (an earlier layer this function produced for the same sandbox, which the
/// sandbox had as its top lower layer, on dest's filesystem), the result is the merge of the
/// two: what `upper` has over what `below` has, as overlayfs would show it, so that the
/// overlay `[dest, X]` shows exactly what `[upper, below, X]` showed for any `X` beneath
/// (devices and sockets excepted, which become whiteouts). Non-directories taken from
/// `below` are hard-linked, not copied: a layer is never written once captured.
///
/// Kept: directories, regular files (content), symlinks (target bytes), fifos, whiteouts,
/// hard links among them; mode bits including set-id bits, owners, access and modification
/// times to the nanosecond; `user.*` xattrs of files and directories and the opaque marker of
/// directories. Dropped: every other xattr (file capabilities, overlayfs's bookkeeping, ACLs).
/// Xattrs are read through fds opened for reading (`flistxattr` refuses `O_PATH` ones); the
/// kernel allows `user.*` on regular files and directories only, so symlinks and fifos, which
/// are never opened, have none to lose.
///
/// See the module documentation for what the caller must provide.
pub fn capture_layer(
    upper: BorrowedFd<'_>,
    dest: &Path,
    base: u32,
    below: Option<&Path>,
    limits: &CaptureLimits,
) -> Result<CaptureReport, CaptureError> {
    let root = At::dir(Path::new(""));
    // A readable fd of the upper root (the caller's may be O_PATH, which cannot be listed).
    let src = sys::openat2(upper, c".", libc::O_RDONLY | libc::O_DIRECTORY, 0, RESOLVE)
        .map_err(io_err("open", root))?;
    let src_st = fstat(src.as_fd()).map_err(io_err("inspect", root))?;
    let dest_root = open_trusted_dir(dest)?;
    let dest_st = fstat(dest_root.as_fd()).map_err(io_err("inspect", At::dir(dest)))?;
    let (names, _) =
        sys::read_dir_names(dest_root.as_fd(), 1).map_err(io_err("list", At::dir(dest)))?;
    if !names.is_empty() {
        return Err(CaptureError::DestNotEmpty {
            path: dest.to_path_buf(),
        });
    }
    let under = match below {
        None => Under::Nothing,
        Some(path) => {
            let fd = open_trusted_dir(path)?;
            let st = fstat(fd.as_fd()).map_err(io_err("inspect", At::dir(path)))?;
            // Its files are hard-linked into dest: say so now rather than at the first link.
            if st.st_dev != dest_st.st_dev {
                return Err(CaptureError::Io {
                    op: "hard-link into the destination from",
                    path: path.to_path_buf(),
                    source: io::Error::from_raw_os_error(libc::EXDEV),
                });
            }
            Under::Dir(fd)
        }
    };
    let root_dest = dest_root
        .try_clone()
        .map_err(io_err("duplicate the fd of", At::dir(dest)))?;
    let mut job = Job {
        base,
        dest_root,
        limits,
        report: CaptureReport::default(),
        entries: 0,
        buf: vec![0; BUF_SIZE],
        xattr_names: vec![0; XATTR_LIST_MAX],
        xattr_value: vec![0; XATTR_VALUE_MAX],
        links: HashMap::new(),
        stash: None,
        root_names: Vec::new(),
    };
    let top = DirTop::Upper {
        fd: src,
        st: src_st,
        under,
    };
    let frame = job.dir_frame(Path::new(""), CString::default(), 0, root_dest, top)?;
    // The hard-link stash is made in the root under a name the root will not have.
    job.root_names = frame
        .items
        .as_slice()
        .iter()
        .map(|i| i.name().to_owned())
        .collect();
    job.root_names.sort_unstable();
    job.run(frame)?;
    Ok(job.report)
}

/// Opens a trusted host directory given by path (`dest`, `below`) for listing and `*at` calls.
fn open_trusted_dir(path: &Path) -> Result<OwnedFd, CaptureError> {
    let cpath = sys::cpath(path).map_err(io_err("open", At::dir(path)))?;
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    sys::open(&cpath, flags, 0).map_err(io_err("open", At::dir(path)))
}

/// Where an entry of the result is taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// The sandbox's upper layer: hostile, owners shifted.
    Upper,
    /// The earlier capture: ours, owners already shifted.
    Below,
}

/// One name of a result directory, from a merged listing.
enum Item {
    /// The upper directory has it; `in_below`: the merged-with below directory has it too.
    Upper { name: CString, in_below: bool },
    /// Only the below directory has it.
    Below { name: CString },
}

impl Item {
    fn name(&self) -> &CStr {
        match self {
            Item::Upper { name, .. } | Item::Below { name } => name,
        }
    }
}

/// What `below` has under the name of an upper directory.
enum Under {
    /// Nothing: what is beneath `below` shows through (the result is not opaque).
    Nothing,
    /// A non-directory (a file, a whiteout): overlayfs stops there, hiding what is beneath.
    NonDir,
    /// A directory to merge with, open for reading.
    Dir(OwnedFd),
}

/// The source of a result directory.
enum DirTop {
    /// A directory of the upper layer, over what `below` has under its name.
    Upper {
        fd: OwnedFd,
        st: libc::stat,
        under: Under,
    },
    /// A directory only `below` has (the upper layer has nothing under its name).
    Below { fd: OwnedFd, st: libc::stat },
}

/// Final owner, mode and times of a result entry.
#[derive(Clone, Copy)]
struct Attrs {
    uid: u32,
    gid: u32,
    mode: u32,
    /// Access and modification time, as `futimens` takes them.
    times: [libc::timespec; 2],
}

/// A result directory being filled: the walk's explicit stack holds one per level (no
/// recursion, so depth costs heap and fds, never the thread's stack).
struct Frame {
    /// Its name in its parent (empty for the root): the walk keeps the path of the
    /// directory it is in, adding a frame's name as it enters, removing it as it leaves.
    name: CString,
    depth: usize,
    /// The upper directory, when there is one.
    upper: Option<OwnedFd>,
    /// The below directory merged in, when there is one (never under an opaque upper one).
    below: Option<OwnedFd>,
    /// The result directory in dest.
    dest: OwnedFd,
    /// Names still to handle.
    items: std::vec::IntoIter<Item>,
    /// Applied once the content is in (which would otherwise change the mtime).
    attrs: Attrs,
}

/// A directory in dest's root holding one extra link of every multiply-linked inode captured
/// from upper, named by a counter, so that later names of the inode are linked to it in O(1)
/// and with memory bounded by the entry count (a path per inode could be 1024 levels long).
/// Removed before the root gets its final times.
struct Stash {
    name: CString,
    fd: OwnedFd,
    count: u64,
}

/// State of one capture.
struct Job<'a> {
    base: u32,
    /// dest's root directory (where the stash is made).
    dest_root: OwnedFd,
    limits: &'a CaptureLimits,
    report: CaptureReport,
    /// Entries listed so far (every listed name is handled, or the capture fails).
    entries: u64,
    buf: Vec<u8>,
    xattr_names: Vec<u8>,
    xattr_value: Vec<u8>,
    /// Upper inode (`st_dev`, `st_ino`) → its link's name in the stash.
    links: HashMap<(u64, u64), u64>,
    stash: Option<Stash>,
    /// The result root's names, sorted.
    root_names: Vec<CString>,
}

impl Job<'_> {
    /// Walks the tree whose root frame is `root`.
    fn run(&mut self, root: Frame) -> Result<(), CaptureError> {
        // The path of the top frame's directory, relative to the layer root.
        let mut path = PathBuf::new();
        let mut stack = vec![root];
        while let Some(frame) = stack.last_mut() {
            let Some(item) = frame.items.next() else {
                if let Some(done) = stack.pop() {
                    if stack.is_empty() {
                        self.remove_stash()?;
                    }
                    set_fd_attrs(done.dest.as_fd(), &done.attrs, At::dir(&path))?;
                }
                // A name holds no `/`: this removes exactly the name that was added.
                path.pop();
                continue;
            };
            if let Some(child) = self.entry(frame, &path, item)? {
                path.push(name_path(&child.name));
                stack.push(child);
            }
        }
        Ok(())
    }

    /// Handles one name of `frame`, the directory at `dir`; returns the frame of a directory
    /// to descend into.
    fn entry(
        &mut self,
        frame: &Frame,
        dir: &Path,
        item: Item,
    ) -> Result<Option<Frame>, CaptureError> {
        match item {
            Item::Upper { name, in_below } => {
                let Some(upper) = frame.upper.as_ref() else {
                    unreachable!("upper names are listed from an upper directory");
                };
                let under = frame.below.as_ref().filter(|_| in_below);
                self.upper_entry(frame, dir, upper.as_fd(), under.map(AsFd::as_fd), name)
            }
            Item::Below { name } => {
                let Some(below) = frame.below.as_ref() else {
                    unreachable!("below names are listed from a below directory");
                };
                self.below_entry(frame, dir, below.as_fd(), name)
            }
        }
    }

    /// Entry `name` of the upper directory `src`; `under`: the below directory that has the
    /// same name, if the result directory merges with one.
    fn upper_entry(
        &mut self,
        frame: &Frame,
        dir: &Path,
        src: BorrowedFd<'_>,
        under: Option<BorrowedFd<'_>>,
        owned_name: CString,
    ) -> Result<Option<Frame>, CaptureError> {
        let name = owned_name.as_c_str();
        let at = At::new(dir, name);
        let st = lstat_at(src, name).map_err(io_err("inspect", at))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
            self.non_dir(src, name, &st, frame.dest.as_fd(), at, Origin::Upper)?;
            return Ok(None);
        }
        if frame.depth >= MAX_DEPTH {
            return Err(CaptureError::TooDeep { path: at.path() });
        }
        let flags = libc::O_RDONLY | libc::O_DIRECTORY;
        let fd = open_checked(src, name, flags, &st, at)?;
        let under = match under {
            None => Under::Nothing,
            Some(below) => {
                let bst = lstat_at(below, name).map_err(io_err("inspect below's", at))?;
                if bst.st_mode & libc::S_IFMT == libc::S_IFDIR {
                    let bfd = sys::openat2(below, name, flags | libc::O_NOFOLLOW, 0, RESOLVE)
                        .map_err(io_err("open below's", at))?;
                    Under::Dir(bfd)
                } else {
                    Under::NonDir
                }
            }
        };
        let dest = make_dir(frame.dest.as_fd(), name, at)?;
        self.report.dirs += 1;
        let top = DirTop::Upper { fd, st, under };
        let depth = frame.depth + 1;
        Ok(Some(self.dir_frame(dir, owned_name, depth, dest, top)?))
    }

    /// Entry `name` that only the below directory `below` has.
    fn below_entry(
        &mut self,
        frame: &Frame,
        dir: &Path,
        below: BorrowedFd<'_>,
        owned_name: CString,
    ) -> Result<Option<Frame>, CaptureError> {
        let name = owned_name.as_c_str();
        let at = At::new(dir, name);
        let st = lstat_at(below, name).map_err(io_err("inspect below's", at))?;
        let kind = st.st_mode & libc::S_IFMT;
        if kind == libc::S_IFDIR {
            // `below` obeyed the bound when it was captured; checked again all the same.
            if frame.depth >= MAX_DEPTH {
                return Err(CaptureError::TooDeep { path: at.path() });
            }
            let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
            let fd =
                sys::openat2(below, name, flags, 0, RESOLVE).map_err(io_err("open below's", at))?;
            // Directories are made anew: the result's content differs from below's deeper
            // down only if the upper layer had the directory, but dest must be all dest's.
            let dest = make_dir(frame.dest.as_fd(), name, at)?;
            self.report.dirs += 1;
            let top = DirTop::Below { fd, st };
            let depth = frame.depth + 1;
            return Ok(Some(self.dir_frame(dir, owned_name, depth, dest, top)?));
        }
        // Below is never written again, so its inodes can be shared (owner, mode, times and
        // xattrs are already the layer's).
        match linkat(below, name, frame.dest.as_fd(), name) {
            Ok(()) => {
                match kind {
                    libc::S_IFREG => self.report.files += 1,
                    libc::S_IFLNK => self.report.symlinks += 1,
                    libc::S_IFIFO => self.report.fifos += 1,
                    libc::S_IFCHR if st.st_rdev == 0 => self.report.whiteouts += 1,
                    _ => {}
                }
                self.report.from_below += 1;
            }
            // The inode has as many links as its filesystem allows (one per layer that
            // shares it, and the sandbox's own): a copy is as good.
            Err(e) if e.raw_os_error() == Some(libc::EMLINK) => {
                self.non_dir(below, name, &st, frame.dest.as_fd(), at, Origin::Below)?;
            }
            Err(e) => return Err(io_err("link from below", at)(e)),
        }
        Ok(None)
    }

    /// Copies non-directory `name` of `src` (described by `st`) to `name` in `dest`.
    fn non_dir(
        &mut self,
        src: BorrowedFd<'_>,
        name: &CStr,
        st: &libc::stat,
        dest: BorrowedFd<'_>,
        at: At<'_>,
        origin: Origin,
    ) -> Result<(), CaptureError> {
        let kind = st.st_mode & libc::S_IFMT;
        let times = times_of(st);
        // Whiteouts are not linked: overlayfs shares one whiteout inode among many names, a
        // detail not worth keeping.
        let key = (st.st_dev, st.st_ino);
        let linkable =
            st.st_nlink > 1 && matches!(kind, libc::S_IFREG | libc::S_IFLNK | libc::S_IFIFO);
        if linkable {
            if let Some(&index) = self.links.get(&key) {
                self.link_from_stash(index, dest, name, at)?;
                self.report.hardlinks += 1;
                return Ok(());
            }
        }
        match kind {
            libc::S_IFREG => {
                self.file(src, name, st, dest, at, origin)?;
                self.report.files += 1;
            }
            libc::S_IFLNK => {
                // EINVAL: no longer a symlink.
                let target = sys::readlinkat(src, name).map_err(|e| match e.raw_os_error() {
                    Some(libc::EINVAL) => CaptureError::Raced { path: at.path() },
                    _ => io_err("read link", at)(e),
                })?;
                // readlink never returns a NUL byte; were it to, the target would be cut.
                let target =
                    CString::new(target).map_err(|_| CaptureError::Raced { path: at.path() })?;
                sys::symlinkat(&target, dest, name).map_err(io_err("create", at))?;
                let (uid, gid) = self.owner(st, origin, NOBODY);
                sys::fchownat_nofollow(dest, name, uid, gid)
                    .map_err(io_err("set the owner of", at))?;
                utimensat_nofollow(dest, name, &times).map_err(io_err("set the times of", at))?;
                self.report.symlinks += 1;
            }
            libc::S_IFIFO => {
                let (uid, gid) = self.owner(st, origin, NOBODY);
                let attrs = Attrs {
                    uid,
                    gid,
                    mode: st.st_mode & 0o7777,
                    times,
                };
                make_node(dest, name, libc::S_IFIFO, &attrs, at)?;
                self.report.fifos += 1;
            }
            libc::S_IFCHR if st.st_rdev == 0 => {
                // overlayfs makes its whiteouts as the mounter, host root: they stay root's.
                let (uid, gid) = self.owner(st, origin, 0);
                let attrs = Attrs {
                    uid,
                    gid,
                    mode: st.st_mode & 0o777,
                    times,
                };
                make_node(dest, name, libc::S_IFCHR, &attrs, at)?;
                self.report.whiteouts += 1;
            }
            _ => {
                // A device or socket is not captured, and must not let the entry below it
                // show through either: it is replaced by what it hid, nothing.
                let attrs = Attrs {
                    uid: 0,
                    gid: 0,
                    mode: 0,
                    times,
                };
                make_node(dest, name, libc::S_IFCHR, &attrs, at)?;
                self.report.skipped += 1;
            }
        }
        if linkable {
            self.stash_link(key, dest, name, at)?;
        }
        Ok(())
    }

    /// Copies regular file `name` of `src` to a new file `name` in `dest`.
    fn file(
        &mut self,
        src: BorrowedFd<'_>,
        name: &CStr,
        st: &libc::stat,
        dest: BorrowedFd<'_>,
        at: At<'_>,
        origin: Origin,
    ) -> Result<(), CaptureError> {
        // O_NONBLOCK and O_NOCTTY: what is opened is checked to be a regular file only after
        // the open, which must not block on a fifo or take a terminal.
        let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
        let mut input = File::from(open_checked(src, name, flags, st, at)?);
        // What the file takes, not its size: holes are kept as holes (below), so a sparse
        // file costs the host's disk what it cost the sandbox's.
        let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
        self.admit_bytes(allocated.min(u64::try_from(st.st_size).unwrap_or(0)))?;
        let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW;
        let mut output = File::from(
            sys::openat2(dest, name, flags, 0o600, RESOLVE).map_err(io_err("create", at))?,
        );
        let max = self.limits.max_bytes;
        copy_bounded(
            &mut input,
            &mut output,
            &mut self.buf,
            &mut self.report.bytes,
            max,
            at,
        )?;
        self.copy_xattrs(input.as_fd(), output.as_fd(), at)?;
        let (uid, gid) = self.owner(st, origin, NOBODY);
        let attrs = Attrs {
            uid,
            gid,
            mode: st.st_mode & 0o7777,
            times: times_of(st),
        };
        set_fd_attrs(output.as_fd(), &attrs, at)
    }

    /// Makes the frame of result directory `name` in `dir` (the root: an empty name),
    /// already created and open at `dest`: copies its xattrs, marks it opaque where overlayfs
    /// would hide what lies beneath it, lists its names.
    fn dir_frame(
        &mut self,
        dir: &Path,
        name: CString,
        depth: usize,
        dest: OwnedFd,
        top: DirTop,
    ) -> Result<Frame, CaptureError> {
        let at = At::new(dir, &name);
        let (upper, below, opaque, attrs) = match top {
            DirTop::Upper { fd, st, under } => {
                let upper_opaque = self.copy_xattrs(fd.as_fd(), dest.as_fd(), at)?;
                let attrs = self.attrs(&st, Origin::Upper);
                // How overlayfs looks a directory up through [upper, below, X]: an opaque
                // upper one ends the lookup; otherwise a below directory merges in (and ends
                // it if opaque itself); a below non-directory ends it (it is ignored under a
                // directory, and so is everything beneath it); nothing lets X show through.
                let (below, opaque) = match under {
                    _ if upper_opaque => (None, true),
                    Under::Nothing => (None, false),
                    Under::NonDir => (None, true),
                    Under::Dir(bfd) => {
                        let below_opaque =
                            is_opaque(bfd.as_fd()).map_err(io_err("read xattrs of below's", at))?;
                        (Some(bfd), below_opaque)
                    }
                };
                (Some(fd), below, opaque, attrs)
            }
            DirTop::Below { fd, st } => {
                let opaque = self.copy_xattrs(fd.as_fd(), dest.as_fd(), at)?;
                (None, Some(fd), opaque, self.attrs(&st, Origin::Below))
            }
        };
        if opaque {
            let marker =
                CString::new(OPAQUE_XATTR).map_err(|e| io_err("mark opaque", at)(e.into()))?;
            fsetxattr(dest.as_fd(), &marker, b"y").map_err(io_err("mark opaque", at))?;
        }
        let items = self.list(
            upper.as_ref().map(AsFd::as_fd),
            below.as_ref().map(AsFd::as_fd),
            at,
        )?;
        Ok(Frame {
            name,
            depth,
            upper,
            below,
            dest,
            items: items.into_iter(),
            attrs,
        })
    }

    /// The sorted union of the names in `upper` and `below`, counted against `max_entries`
    /// before anything is held: a hostile directory cannot make this read more names than
    /// the entries left.
    fn list(
        &mut self,
        upper: Option<BorrowedFd<'_>>,
        below: Option<BorrowedFd<'_>>,
        at: At<'_>,
    ) -> Result<Vec<Item>, CaptureError> {
        let max = self.limits.max_entries;
        let left = max.saturating_sub(self.entries);
        let over = || CaptureError::LimitExceeded {
            what: "entries",
            limit: max,
        };
        // One more name than fits tells "too many" from "exactly the rest".
        let bound = |extra: usize| {
            usize::try_from(left)
                .unwrap_or(usize::MAX)
                .saturating_add(extra)
                .saturating_add(1)
        };
        let mut up = match upper {
            Some(fd) => {
                sys::read_dir_names(fd, bound(0))
                    .map_err(io_err("list", at))?
                    .0
            }
            None => Vec::new(),
        };
        if up.len() as u64 > left {
            return Err(over());
        }
        // A name both have counts once: below may have as many more as upper has.
        let mut down = match below {
            Some(fd) => {
                sys::read_dir_names(fd, bound(up.len()))
                    .map_err(io_err("list below's", at))?
                    .0
            }
            None => Vec::new(),
        };
        up.sort_unstable();
        down.sort_unstable();
        let mut items = Vec::with_capacity(up.len().max(down.len()));
        let mut down = down.into_iter().peekable();
        for name in up {
            while let Some(only_below) = down.next_if(|d| *d < name) {
                items.push(Item::Below { name: only_below });
            }
            let in_below = down.next_if(|d| *d == name).is_some();
            items.push(Item::Upper { name, in_below });
        }
        items.extend(down.map(|name| Item::Below { name }));
        if items.len() as u64 > left {
            return Err(over());
        }
        self.entries += items.len() as u64;
        Ok(items)
    }

    /// Copies the `user.*` xattrs of `src` (a readable fd) to `dst`; returns whether `src`
    /// carries overlayfs's opaque marker (which the caller decides about).
    fn copy_xattrs(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        at: At<'_>,
    ) -> Result<bool, CaptureError> {
        let len = match flistxattr(src, &mut self.xattr_names) {
            Ok(len) => len,
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => 0,
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
                return Err(CaptureError::LimitExceeded {
                    what: "xattr name bytes",
                    limit: XATTR_LIST_MAX as u64,
                })
            }
            Err(e) => return Err(io_err("list xattrs of", at)(e)),
        };
        let mut opaque = false;
        let names = self.xattr_names.get(..len).unwrap_or_default();
        for raw in names.split(|&b| b == 0) {
            let user = raw.starts_with(USER_XATTR_PREFIX);
            let marker = raw == OPAQUE_XATTR.as_bytes();
            if !user && !marker {
                continue;
            }
            // The list is NUL-separated, so a name holds none.
            let Ok(name) = CString::new(raw) else {
                continue;
            };
            let len = match fgetxattr(src, &name, &mut self.xattr_value) {
                Ok(len) => len,
                // Removed since it was listed.
                Err(e) if e.raw_os_error() == Some(libc::ENODATA) => continue,
                Err(e) if e.raw_os_error() == Some(libc::ERANGE) => {
                    return Err(CaptureError::LimitExceeded {
                        what: "xattr value bytes",
                        limit: XATTR_VALUE_MAX as u64,
                    })
                }
                Err(e) => return Err(io_err("read xattrs of", at)(e)),
            };
            let value = self.xattr_value.get(..len).unwrap_or_default();
            if marker {
                // "y" only: overlayfs reads other values ("x") as something else.
                opaque = value == b"y";
                continue;
            }
            let total = self.report.bytes.saturating_add(len as u64);
            if total > self.limits.max_bytes {
                return Err(CaptureError::LimitExceeded {
                    what: "bytes",
                    limit: self.limits.max_bytes,
                });
            }
            fsetxattr(dst, &name, value).map_err(io_err("set xattrs on", at))?;
            self.report.bytes = total;
        }
        Ok(opaque)
    }

    /// Checks that `more` bytes of content fit the limit (before a file is copied; the copy
    /// checks again as it goes, whatever the file's size said).
    fn admit_bytes(&self, more: u64) -> Result<(), CaptureError> {
        if self.report.bytes.saturating_add(more) > self.limits.max_bytes {
            return Err(CaptureError::LimitExceeded {
                what: "bytes",
                limit: self.limits.max_bytes,
            });
        }
        Ok(())
    }

    /// The result's owner of an entry described by `st`; `other` for ids outside the range.
    fn owner(&self, st: &libc::stat, origin: Origin, other: u32) -> (u32, u32) {
        match origin {
            Origin::Below => (st.st_uid, st.st_gid),
            Origin::Upper => (
                shift_id(st.st_uid, self.base, other),
                shift_id(st.st_gid, self.base, other),
            ),
        }
    }

    /// Final attributes of a result directory.
    fn attrs(&self, st: &libc::stat, origin: Origin) -> Attrs {
        let (uid, gid) = self.owner(st, origin, NOBODY);
        Attrs {
            uid,
            gid,
            mode: st.st_mode & 0o7777,
            times: times_of(st),
        }
    }

    /// Records `name` in `dest` (just captured from upper inode `key`) in the stash.
    fn stash_link(
        &mut self,
        key: (u64, u64),
        dest: BorrowedFd<'_>,
        name: &CStr,
        at: At<'_>,
    ) -> Result<(), CaptureError> {
        if self.stash.is_none() {
            self.stash = Some(self.make_stash(at)?);
        }
        let Some(stash) = self.stash.as_mut() else {
            unreachable!("the stash was just made");
        };
        let index = stash.count;
        let link = index_name(index);
        linkat(dest, name, stash.fd.as_fd(), &link).map_err(io_err("link", at))?;
        stash.count += 1;
        self.links.insert(key, index);
        Ok(())
    }

    /// Creates the stash in dest's root, under a name the root has no entry of.
    fn make_stash(&self, at: At<'_>) -> Result<Stash, CaptureError> {
        let mut n = 0u64;
        let name = loop {
            let name = match n {
                0 => CString::from(c".husk-capture-links"),
                _ => CString::new(format!(".husk-capture-links-{n}")).unwrap_or_default(),
            };
            if self.root_names.binary_search(&name).is_err() {
                break name;
            }
            n += 1;
        };
        sys::mkdirat(self.dest_root.as_fd(), &name, 0o700).map_err(io_err(
            "create a directory in the layer root to hard-link",
            at,
        ))?;
        let stash_at = At::new(Path::new(""), &name);
        let fd =
            open_dir_beneath(self.dest_root.as_fd(), &name).map_err(io_err("open", stash_at))?;
        Ok(Stash { name, fd, count: 0 })
    }

    /// Links stash entry `index` as `name` in `dest`.
    fn link_from_stash(
        &self,
        index: u64,
        dest: BorrowedFd<'_>,
        name: &CStr,
        at: At<'_>,
    ) -> Result<(), CaptureError> {
        let Some(stash) = self.stash.as_ref() else {
            unreachable!("an inode is in the map only once it is in the stash");
        };
        linkat(stash.fd.as_fd(), &index_name(index), dest, name).map_err(io_err("link", at))
    }

    /// Removes the stash (its links are the extra ones: every name keeps its inode).
    fn remove_stash(&mut self) -> Result<(), CaptureError> {
        let Some(stash) = self.stash.take() else {
            return Ok(());
        };
        let at = At::new(Path::new(""), &stash.name);
        for index in 0..stash.count {
            sys::unlinkat(stash.fd.as_fd(), &index_name(index), false)
                .map_err(io_err("remove links in", at))?;
        }
        sys::unlinkat(self.dest_root.as_fd(), &stash.name, true).map_err(io_err("remove", at))
    }
}

/// A stash entry's name.
fn index_name(index: u64) -> CString {
    // Digits hold no NUL.
    CString::new(index.to_string()).unwrap_or_default()
}

/// Opens entry `name` of source directory `dir` (described by `st`) with `flags` (plus
/// `O_NOFOLLOW`), and checks that what was opened is the inode `st` described, of the same
/// type: between the `lstat` and the open, a name can come to be a symlink, a fifo, another
/// file.
fn open_checked(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: libc::c_int,
    st: &libc::stat,
    at: At<'_>,
) -> Result<OwnedFd, CaptureError> {
    let raced = || CaptureError::Raced { path: at.path() };
    let fd = sys::openat2(dir, name, flags | libc::O_NOFOLLOW, 0, RESOLVE).map_err(|e| {
        match e.raw_os_error() {
            // Now a symlink (O_NOFOLLOW), a non-directory (O_DIRECTORY), gone.
            Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT) => raced(),
            _ => io_err("open", at)(e),
        }
    })?;
    let now = fstat(fd.as_fd()).map_err(io_err("inspect", at))?;
    let same = now.st_mode & libc::S_IFMT == st.st_mode & libc::S_IFMT
        && now.st_ino == st.st_ino
        && now.st_dev == st.st_dev;
    if !same {
        return Err(raced());
    }
    Ok(fd)
}

/// Opens directory `name` of trusted directory `dir` (in dest or below) for reading.
fn open_dir_beneath(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<OwnedFd> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
    sys::openat2(dir, name, flags, 0, RESOLVE)
}

/// Creates directory `name` in dest directory `dir` and opens it. Owner-only until its
/// final mode is set, after its content.
fn make_dir(dir: BorrowedFd<'_>, name: &CStr, at: At<'_>) -> Result<OwnedFd, CaptureError> {
    sys::mkdirat(dir, name, 0o700).map_err(io_err("create", at))?;
    open_dir_beneath(dir, name).map_err(io_err("open", at))
}

/// Creates node `name` (`kind`: `S_IFIFO`, or `S_IFCHR` for a 0/0 whiteout) in dest
/// directory `dir` with `attrs`.
fn make_node(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: u32,
    attrs: &Attrs,
    at: At<'_>,
) -> Result<(), CaptureError> {
    mknodat(dir, name, kind, 0).map_err(io_err("create", at))?;
    sys::fchownat_nofollow(dir, name, attrs.uid, attrs.gid)
        .map_err(io_err("set the owner of", at))?;
    // After the chown, which clears set-id bits. The node was just made here, in dest, so
    // the name is not a symlink (fchmodat cannot be told not to follow one).
    fchmodat(dir, name, attrs.mode).map_err(io_err("set the mode of", at))?;
    utimensat_nofollow(dir, name, &attrs.times).map_err(io_err("set the times of", at))
}

/// Gives the open dest file or directory `fd` its final owner, then mode (a chown clears
/// set-id bits, so they are set after it), then times (last: the others change no mtime, but
/// nothing may come after it).
fn set_fd_attrs(fd: BorrowedFd<'_>, attrs: &Attrs, at: At<'_>) -> Result<(), CaptureError> {
    sys::fchown(fd, attrs.uid, attrs.gid).map_err(io_err("set the owner of", at))?;
    fchmod(fd, attrs.mode).map_err(io_err("set the mode of", at))?;
    futimens(fd, &attrs.times).map_err(io_err("set the times of", at))
}

/// Access and modification times of `st`, as `futimens` takes them.
fn times_of(st: &libc::stat) -> [libc::timespec; 2] {
    [
        libc::timespec {
            tv_sec: st.st_atime,
            tv_nsec: st.st_atime_nsec,
        },
        libc::timespec {
            tv_sec: st.st_mtime,
            tv_nsec: st.st_mtime_nsec,
        },
    ]
}

/// Copies `input` to `output` until end of file, adding to `bytes`, which must stay at most
/// `max` (a file may hold more than its size said when it was inspected).
/// Copies `input` to the empty `output` extent by extent (`SEEK_DATA`/`SEEK_HOLE`): holes stay
/// holes, only data is read, written and counted against `max`. A file system that cannot
/// tell (`EINVAL`) is copied whole.
fn copy_bounded(
    input: &mut File,
    output: &mut File,
    buf: &mut [u8],
    bytes: &mut u64,
    max: u64,
    at: At<'_>,
) -> Result<(), CaptureError> {
    use std::io::{Seek, SeekFrom};
    let size = input.metadata().map_err(io_err("stat", at))?.len();
    let mut pos = 0;
    while pos < size {
        let data = match sys::seek_extent(input.as_fd(), pos, libc::SEEK_DATA) {
            Ok(Some(d)) => d,
            // Only a hole up to the end.
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && pos == 0 => {
                input.rewind().map_err(io_err("seek in", at))?;
                return copy_stream(input, output, buf, bytes, max, u64::MAX, at);
            }
            Err(e) => return Err(io_err("seek in", at)(e)),
        };
        let hole = sys::seek_extent(input.as_fd(), data, libc::SEEK_HOLE)
            .map_err(io_err("seek in", at))?
            .unwrap_or(size)
            .min(size);
        if hole <= data {
            break;
        }
        input
            .seek(SeekFrom::Start(data))
            .map_err(io_err("seek in", at))?;
        output
            .seek(SeekFrom::Start(data))
            .map_err(io_err("seek in", at))?;
        copy_stream(input, output, buf, bytes, max, hole - data, at)?;
        pos = hole;
    }
    // A hole at the end is no extent: the size says where the file ends.
    output.set_len(size).map_err(io_err("write", at))
}

/// Copies up to `len` bytes from `input`'s offset to `output`'s, counting them in `bytes`.
fn copy_stream(
    input: &mut File,
    output: &mut File,
    buf: &mut [u8],
    bytes: &mut u64,
    max: u64,
    mut len: u64,
    at: At<'_>,
) -> Result<(), CaptureError> {
    while len > 0 {
        let want = buf.len().min(usize::try_from(len).unwrap_or(usize::MAX));
        let n = match input.read(buf.get_mut(..want).unwrap_or_default()) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err("read", at)(e)),
        };
        len -= n as u64;
        let total = bytes.saturating_add(n as u64);
        if total > max {
            return Err(CaptureError::LimitExceeded {
                what: "bytes",
                limit: max,
            });
        }
        let chunk = buf.get(..n).unwrap_or_default();
        output.write_all(chunk).map_err(io_err("write", at))?;
        *bytes = total;
    }
    Ok(())
}

/// Whether directory `fd` (readable) carries overlayfs's opaque marker.
fn is_opaque(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let name = CString::new(OPAQUE_XATTR)?;
    let mut value = [0u8; 2];
    match fgetxattr(fd, &name, &mut value) {
        Ok(len) => Ok(value.get(..len) == Some(b"y".as_slice())),
        // Not set; or longer than "y", so not "y".
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENODATA | libc::ERANGE)) => Ok(false),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Maps a `-1` return to the thread's errno.
fn check(ret: libc::c_int) -> io::Result<()> {
    match ret {
        -1 => Err(io::Error::last_os_error()),
        _ => Ok(()),
    }
}

/// Maps a negative length return to the thread's errno.
fn check_len(ret: libc::ssize_t) -> io::Result<usize> {
    usize::try_from(ret).map_err(|_| io::Error::last_os_error())
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the entry itself, with its device number
/// (which [`sys::FileStat`] leaves out, and a whiteout is told by).
fn lstat_at(dir: BorrowedFd<'_>, name: &CStr) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `name` is a valid C string and `st` a valid out-buffer for one stat;
    // AT_SYMLINK_NOFOLLOW describes a symlink, never its target.
    check(unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            name.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })?;
    // SAFETY: fstatat succeeded and filled the buffer (which was zeroed before, too).
    Ok(unsafe { st.assume_init() })
}

/// `fstat(2)` of an open fd (of any kind, `O_PATH` too).
fn fstat(fd: BorrowedFd<'_>) -> io::Result<libc::stat> {
    let mut st = MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: `st` is a valid out-buffer for one stat.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded and filled the buffer (which was zeroed before, too).
    Ok(unsafe { st.assume_init() })
}

/// `flistxattr(2)` into `buf`: NUL-terminated names; `ERANGE` when they do not fit.
/// Needs an fd opened for reading (or writing): `O_PATH` fds are refused (`EBADF`).
fn flistxattr(fd: BorrowedFd<'_>, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes, the most the kernel writes.
    check_len(unsafe { libc::flistxattr(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) })
}

/// `fgetxattr(2)` of `name` into `value`: its length; `ERANGE` when it does not fit.
fn fgetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &mut [u8]) -> io::Result<usize> {
    // SAFETY: `name` is a valid C string; `value` is valid for writes of `value.len()`
    // bytes, the most the kernel writes.
    check_len(unsafe {
        libc::fgetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    })
}

/// `fsetxattr(2)`: creates or replaces xattr `name` of `fd`.
fn fsetxattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> io::Result<()> {
    // SAFETY: `name` is a valid C string; `value` is valid for reads of `value.len()` bytes.
    check(unsafe {
        libc::fsetxattr(
            fd.as_raw_fd(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// `mknodat(2)` of a `kind` node (no permission bits: they are set after the chown) with
/// device number `dev`; an existing `name` is `EEXIST`.
fn mknodat(dir: BorrowedFd<'_>, name: &CStr, kind: u32, dev: libc::dev_t) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    check(unsafe { libc::mknodat(dir.as_raw_fd(), name.as_ptr(), kind, dev) })
}

/// `linkat(2)` without `AT_SYMLINK_FOLLOW`: links the entry itself (a symlink, not its
/// target); an existing `new` is `EEXIST`.
fn linkat(
    old_dir: BorrowedFd<'_>,
    old: &CStr,
    new_dir: BorrowedFd<'_>,
    new: &CStr,
) -> io::Result<()> {
    // SAFETY: both names are valid C strings.
    check(unsafe {
        libc::linkat(
            old_dir.as_raw_fd(),
            old.as_ptr(),
            new_dir.as_raw_fd(),
            new.as_ptr(),
            0,
        )
    })
}

/// `fchmod(2)`: the mode bits, set-id and sticky bits included.
fn fchmod(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    // SAFETY: no pointers.
    check(unsafe { libc::fchmod(fd.as_raw_fd(), mode) })
}

/// `fchmodat(2)` of `name` in `dir` (follows a final symlink: callers name non-links only).
fn fchmodat(dir: BorrowedFd<'_>, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: `name` is a valid C string.
    check(unsafe { libc::fchmodat(dir.as_raw_fd(), name.as_ptr(), mode, 0) })
}

/// `futimens(2)`: access and modification times of `fd`, to the nanosecond.
fn futimens(fd: BorrowedFd<'_>, times: &[libc::timespec; 2]) -> io::Result<()> {
    // SAFETY: `times` points to the two timespecs futimens reads.
    check(unsafe { libc::futimens(fd.as_raw_fd(), times.as_ptr()) })
}

/// `utimensat(dir, name, times, AT_SYMLINK_NOFOLLOW)`: times of the entry itself.
fn utimensat_nofollow(
    dir: BorrowedFd<'_>,
    name: &CStr,
    times: &[libc::timespec; 2],
) -> io::Result<()> {
    // SAFETY: `name` is a valid C string; `times` points to the two timespecs read.
    check(unsafe {
        libc::utimensat(
            dir.as_raw_fd(),
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}
