//! Captures of real trees built under /tmp (run as root: the trees have foreign owners,
//! whiteouts, devices and `trusted.*` xattrs), checked entry by entry, and against what
//! overlayfs itself shows.

use std::ffi::{CString, OsStr};
use std::fs::{self, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;

/// The sandbox's host id range starts here (a slot's base, as `uidrange.rs` makes them).
const BASE: u32 = 0x5001_0000;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A unique temporary directory under /tmp, removed on drop (also when a test panics).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        TempDir::under(Path::new("/tmp"), tag)
    }

    /// One in `parent` (another filesystem than /tmp's).
    fn under(parent: &Path, tag: &str) -> TempDir {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let rand = crate::sys::random_u64().unwrap();
        let name = format!("husk-capture-{tag}-{}-{n}-{rand:x}", std::process::id());
        let path = parent.join(name);
        fs::create_dir(&path).unwrap();
        TempDir(path)
    }

    /// `rel` inside, created as an empty directory.
    fn dir(&self, rel: &str) -> PathBuf {
        let p = self.0.join(rel);
        fs::create_dir_all(&p).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // remove_dir_all does not follow symlinks, and copes with deep trees.
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn limits() -> CaptureLimits {
    CaptureLimits {
        max_bytes: 1 << 30,
        max_entries: 100_000,
    }
}

/// Opens `dir` the way the spawner hands over an upper directory (O_PATH), or readable.
fn open_upper(dir: &Path, o_path: bool) -> OwnedFd {
    let flags = match o_path {
        true => libc::O_PATH | libc::O_DIRECTORY,
        false => libc::O_DIRECTORY,
    };
    OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(dir)
        .unwrap()
        .into()
}

fn capture(
    upper: &Path,
    dest: &Path,
    below: Option<&Path>,
    limits: &CaptureLimits,
) -> Result<CaptureReport, CaptureError> {
    let fd = open_upper(upper, true);
    capture_layer(fd.as_fd(), dest, BASE, below, limits)
}

/// Writes file `path` with `contents`, owner (`uid`, `gid`) and `mode` (set after the chown,
/// which clears set-id bits).
fn file(path: &Path, contents: &[u8], owner: (u32, u32), mode: u32) {
    fs::write(path, contents).unwrap();
    chown(path, owner);
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A directory at `path` owned by `owner`, mode `mode`.
fn dir(path: &Path, owner: (u32, u32), mode: u32) {
    fs::create_dir(path).unwrap();
    chown(path, owner);
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(path: &Path, (uid, gid): (u32, u32)) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

fn symlink(target: &str, path: &Path, owner: (u32, u32)) {
    std::os::unix::fs::symlink(target, path).unwrap();
    chown(path, owner);
}

fn mknod(path: &Path, mode: u32, dev: libc::dev_t) {
    let p = c(path);
    // SAFETY: `p` is a valid C string.
    let r = unsafe { libc::mknod(p.as_ptr(), mode, dev) };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        path.display(),
        io::Error::last_os_error()
    );
}

/// Sets the access and modification times of `path` itself (never a symlink's target).
fn set_times(path: &Path, sec: i64, nsec: i64) {
    let p = c(path);
    let t = libc::timespec {
        tv_sec: sec,
        tv_nsec: nsec,
    };
    let times = [t, t];
    // SAFETY: `p` is a valid C string and `times` the two timespecs utimensat reads.
    let r = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            p.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(r, 0, "utimensat {}", path.display());
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    crate::sys::lsetxattr(&c(path), name, value)
        .unwrap_or_else(|e| panic!("setxattr {name} on {}: {e}", path.display()));
}

/// Every xattr of `path` itself, sorted by name.
fn xattrs(path: &Path) -> Vec<(String, Vec<u8>)> {
    let p = c(path);
    let mut names = vec![0u8; 65536];
    // SAFETY: `p` is a valid C string; `names` is writable for its length.
    let n = unsafe { libc::llistxattr(p.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(n >= 0, "llistxattr {}", path.display());
    names.truncate(n as usize);
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let cname = CString::new(name).unwrap();
        let mut value = vec![0u8; 65536];
        // SAFETY: both strings are valid C strings; `value` is writable for its length.
        let len = unsafe {
            libc::lgetxattr(
                p.as_ptr(),
                cname.as_ptr(),
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        assert!(len >= 0, "lgetxattr {}", path.display());
        value.truncate(len as usize);
        out.push((String::from_utf8_lossy(name).into_owned(), value));
    }
    out.sort();
    out
}

fn xattr(name: &str, value: &[u8]) -> (String, Vec<u8>) {
    (name.to_owned(), value.to_vec())
}

fn meta(path: &Path) -> fs::Metadata {
    fs::symlink_metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn owner(path: &Path) -> (u32, u32) {
    let m = meta(path);
    (m.uid(), m.gid())
}

fn mode(path: &Path) -> u32 {
    meta(path).mode() & 0o7777
}

fn mtime(path: &Path) -> (i64, i64) {
    let m = meta(path);
    (m.mtime(), m.mtime_nsec())
}

fn is_whiteout(path: &Path) -> bool {
    crate::layerfs::is_whiteout(&meta(path))
}

fn is_opaque(dir: &Path) -> bool {
    xattrs(dir)
        .iter()
        .any(|(n, v)| n == OPAQUE_XATTR && v == b"y")
}

/// Every entry under `root`, never following symlinks: "<type> <path>", sorted.
fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<String>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let rel = rel.join(e.file_name());
            let t = e.file_type().unwrap();
            let kind = match () {
                _ if t.is_dir() => "d",
                _ if t.is_file() => "f",
                _ if t.is_symlink() => "l",
                _ if t.is_fifo() => "p",
                _ if t.is_char_device() => "c",
                _ => "?",
            };
            out.push(format!("{kind} {}", rel.to_string_lossy()));
            if t.is_dir() {
                walk(root, &rel, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, Path::new(""), &mut out);
    out.sort();
    out
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn ino(path: &Path) -> u64 {
    meta(path).ino()
}

/// A `security.capability` value (VFS_CAP_REVISION_2, CAP_NET_RAW permitted).
fn file_capability() -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&0x0200_0000u32.to_le_bytes());
    v.extend_from_slice(&(1u32 << 13).to_le_bytes());
    v.extend_from_slice(&[0; 12]);
    v
}

#[test]
fn every_kind_is_captured_with_owners_shifted_and_no_symlink_followed() {
    let t = TempDir::new("kinds");
    let up = t.dir("upper");
    let dest = t.dir("dest");
    // What the symlinks point at: nothing of it may land in dest.
    let outside = t.dir("outside/secret-dir");
    fs::write(outside.join("secret"), "secret").unwrap();

    let sb = |id: u32| (BASE + id, BASE + id);
    file(
        &up.join("file"),
        b"hello",
        (BASE + 1000, BASE + 1000),
        0o640,
    );
    set_xattr(&up.join("file"), "user.note", b"kept");
    set_xattr(&up.join("file"), "trusted.other", b"dropped");
    set_xattr(&up.join("file"), "security.capability", &file_capability());
    assert_eq!(
        xattrs(&up.join("file")).len(),
        3,
        "the source has all three"
    );
    file(&up.join("suid"), b"#!/bin/sh\n", sb(0), 0o4755);
    file(&up.join("sgid"), b"g", (BASE + 3, BASE + 50), 0o2711);
    file(&up.join("foreign"), b"f", (1234, 5678), 0o644);
    file(&up.join("empty"), b"", sb(1000), 0o600);
    // The name the hard-link stash would take first: it takes another.
    file(&up.join(".husk-capture-links"), b"mine", sb(1000), 0o644);
    let odd = up.join(OsStr::from_bytes(b"we\xffird\nname"));
    file(&odd, b"odd", sb(1000), 0o644);
    symlink("/etc", &up.join("etc"), (BASE + 7, BASE + 8));
    symlink(outside.to_str().unwrap(), &up.join("dirlink"), sb(0));
    dir(&up.join("d"), (BASE + 1000, BASE + 100), 0o2775);
    set_xattr(&up.join("d"), "user.dir", b"v");
    dir(&up.join("d/e"), sb(0), 0o700);
    file(&up.join("d/e/f"), b"deep", sb(0), 0o644);
    symlink("../../outside/secret-dir", &up.join("d/escape"), sb(0));
    mknod(&up.join("fifo"), libc::S_IFIFO, 0);
    chown(&up.join("fifo"), sb(2));
    fs::set_permissions(up.join("fifo"), fs::Permissions::from_mode(0o620)).unwrap();
    // overlayfs's own whiteout (host root's) and one the sandbox made with mknod.
    mknod(&up.join("gone"), libc::S_IFCHR, 0);
    mknod(&up.join("gone2"), libc::S_IFCHR, 0);
    chown(&up.join("gone2"), sb(5));
    dir(&up.join("opq"), sb(0), 0o755);
    set_xattr(&up.join("opq"), OPAQUE_XATTR, b"y");
    set_xattr(&up.join("opq"), "trusted.overlay.origin", b"junk");
    file(&up.join("opq/inner"), b"i", sb(0), 0o644);
    // "x" marks something else than opacity.
    dir(&up.join("notopq"), sb(0), 0o755);
    set_xattr(&up.join("notopq"), OPAQUE_XATTR, b"x");
    file(&up.join("h1"), b"linked", sb(9), 0o644);
    fs::hard_link(up.join("h1"), up.join("d/h2")).unwrap();
    fs::hard_link(up.join("h1"), up.join("h3")).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(up.join("sock")).unwrap();
    drop(listener);
    mknod(&up.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3));
    // Times last: creating entries changes their directory's.
    set_times(&up.join("file"), 1_600_000_000, 123_456_789);
    set_times(&up.join("etc"), 1_500_000_000, 987_654_321);
    set_times(&up.join("fifo"), 1_400_000_000, 5);
    set_times(&up.join("d"), 1_300_000_000, 42);
    chown(&up, sb(0));
    fs::set_permissions(&up, fs::Permissions::from_mode(0o751)).unwrap();
    set_times(&up, 1_200_000_000, 999_999_999);

    let report = capture(&up, &dest, None, &limits()).unwrap();

    let content_bytes = [5, 10, 1, 1, 0, 3, 4, 1, 6, 4].iter().sum::<u64>();
    let xattr_bytes = "kept".len() as u64 + "v".len() as u64;
    let expected = CaptureReport {
        files: 10,
        dirs: 4,
        symlinks: 3,
        whiteouts: 2,
        hardlinks: 2,
        bytes: content_bytes + xattr_bytes,
        skipped: 2,
        fifos: 1,
        from_below: 0,
    };
    assert_eq!(report, expected);
    // Exactly these entries: nothing from outside, no hard-link stash left behind.
    let want = [
        "c gone",
        "c gone2",
        "c null",
        "c sock",
        "d d",
        "d d/e",
        "d notopq",
        "d opq",
        "f .husk-capture-links",
        "f d/e/f",
        "f d/h2",
        "f empty",
        "f file",
        "f foreign",
        "f h1",
        "f h3",
        "f opq/inner",
        "f sgid",
        "f suid",
        "f we\u{fffd}ird\nname",
        "l d/escape",
        "l dirlink",
        "l etc",
        "p fifo",
    ];
    assert_eq!(tree(&dest), want);

    let f = dest.join("file");
    assert_eq!(fs::read(&f).unwrap(), b"hello");
    assert_eq!(
        (mode(&f), owner(&f), mtime(&f)),
        (0o640, (1000, 1000), (1_600_000_000, 123_456_789))
    );
    assert_eq!(
        xattrs(&f),
        [xattr("user.note", b"kept")],
        "only user.* xattrs are kept"
    );
    assert_eq!(
        (mode(&dest.join("suid")), owner(&dest.join("suid"))),
        (0o4755, (0, 0))
    );
    assert_eq!(
        (mode(&dest.join("sgid")), owner(&dest.join("sgid"))),
        (0o2711, (3, 50))
    );
    let foreign = dest.join("foreign");
    assert_eq!((owner(&foreign), mode(&foreign)), ((NOBODY, NOBODY), 0o644));
    assert_eq!(fs::read(dest.join("empty")).unwrap(), b"");
    assert_eq!(
        fs::read(dest.join(OsStr::from_bytes(b"we\xffird\nname"))).unwrap(),
        b"odd"
    );

    let etc = dest.join("etc");
    assert_eq!(fs::read_link(&etc).unwrap(), Path::new("/etc"));
    assert_eq!(
        (owner(&etc), mtime(&etc)),
        ((7, 8), (1_500_000_000, 987_654_321))
    );
    assert_eq!(fs::read_link(dest.join("dirlink")).unwrap(), outside);
    let escape = fs::read_link(dest.join("d/escape")).unwrap();
    assert_eq!(escape, Path::new("../../outside/secret-dir"));

    let d = dest.join("d");
    assert_eq!(
        (mode(&d), owner(&d), mtime(&d)),
        (0o2775, (1000, 100), (1_300_000_000, 42))
    );
    assert_eq!(xattrs(&d), [xattr("user.dir", b"v")]);
    assert_eq!(
        (mode(&d.join("e")), fs::read(d.join("e/f")).unwrap()),
        (0o700, b"deep".to_vec())
    );

    let fifo = dest.join("fifo");
    assert!(meta(&fifo).file_type().is_fifo());
    assert_eq!(
        (mode(&fifo), owner(&fifo), mtime(&fifo)),
        (0o620, (2, 2), (1_400_000_000, 5))
    );
    assert!(is_whiteout(&dest.join("gone")) && owner(&dest.join("gone")) == (0, 0));
    assert!(is_whiteout(&dest.join("gone2")) && owner(&dest.join("gone2")) == (5, 5));
    // A socket and a device are not captured, and hide what lower layers have of the name.
    for skipped in ["sock", "null"] {
        let p = dest.join(skipped);
        assert!(is_whiteout(&p), "{skipped} is a whiteout");
        assert_eq!((owner(&p), mode(&p)), ((0, 0), 0));
    }

    assert_eq!(xattrs(&dest.join("opq")), [xattr(OPAQUE_XATTR, b"y")]);
    assert!(xattrs(&dest.join("notopq")).is_empty());

    let (h1, h2, h3) = (dest.join("h1"), dest.join("d/h2"), dest.join("h3"));
    assert_eq!(ino(&h1), ino(&h2));
    assert_eq!(ino(&h1), ino(&h3));
    assert_eq!(meta(&h1).nlink(), 3, "the stash's extra link is gone");
    assert_eq!(
        (fs::read(&h2).unwrap(), owner(&h2)),
        (b"linked".to_vec(), (9, 9))
    );

    assert_eq!(
        (mode(&dest), owner(&dest), mtime(&dest)),
        (0o751, (0, 0), (1_200_000_000, 999_999_999))
    );
    // The source is as it was.
    assert_eq!(fs::read(outside.join("secret")).unwrap(), b"secret");
    assert_eq!(owner(&up.join("file")), (BASE + 1000, BASE + 1000));
}

#[test]
fn a_readable_upper_fd_works_too_and_dest_must_be_empty() {
    let t = TempDir::new("fd");
    let up = t.dir("upper");
    let dest = t.dir("dest");
    file(&up.join("a"), b"a", (BASE, BASE), 0o644);
    let fd = open_upper(&up, false);
    let report = capture_layer(fd.as_fd(), &dest, BASE, None, &limits()).unwrap();
    assert_eq!((report.files, report.bytes), (1, 1));
    assert_eq!(tree(&dest), ["f a"]);
    // A second capture into the same (now not empty) directory is refused.
    let err = capture_layer(fd.as_fd(), &dest, BASE, None, &limits()).unwrap_err();
    assert!(matches!(err, CaptureError::DestNotEmpty { .. }), "{err}");
}

#[test]
fn nesting_deeper_than_the_limit_is_refused() {
    // Each level holds two fds here; the default soft limit of 1024 would not do.
    crate::sys::raise_nofile_limit().unwrap();
    let t = TempDir::new("deep");
    let ok = t.dir(&format!("ok{}", "/d".repeat(MAX_DEPTH)));
    fs::write(ok.join("leaf"), "x").unwrap();
    let dest = t.dir("dest-ok");
    let report = capture(&t.0.join("ok"), &dest, None, &limits()).unwrap();
    assert_eq!((report.dirs, report.files), (MAX_DEPTH as u64, 1));
    let leaf = PathBuf::from(format!("{}{}/leaf", dest.display(), "/d".repeat(MAX_DEPTH)));
    assert_eq!(fs::read(leaf).unwrap(), b"x");

    // A sibling first (the walk goes in name order), then z/d/d/...: MAX_DEPTH + 1 levels.
    t.dir("deep/a/b");
    t.dir(&format!("deep/z{}", "/d".repeat(MAX_DEPTH)));
    let dest = t.dir("dest-deep");
    let err = capture(&t.0.join("deep"), &dest, None, &limits()).unwrap_err();
    let CaptureError::TooDeep { path } = &err else {
        panic!("expected TooDeep, got {err}");
    };
    // The path names the first directory past the limit, relative to the layer root.
    assert_eq!(*path, PathBuf::from(format!("z{}", "/d".repeat(MAX_DEPTH))));
}

#[test]
fn byte_and_entry_limits_are_enforced() {
    let t = TempDir::new("limits");
    let up = t.dir("upper");
    // 4 entries; 200 bytes of content and 10 of xattr value.
    file(&up.join("a"), &[b'a'; 100], (BASE, BASE), 0o644);
    set_xattr(&up.join("a"), "user.ten", b"0123456789");
    file(&up.join("b"), &[b'b'; 100], (BASE, BASE), 0o644);
    dir(&up.join("c"), (BASE, BASE), 0o755);
    file(&up.join("c/d"), b"", (BASE, BASE), 0o644);
    let run = |max_entries: u64, max_bytes: u64| {
        let dest = t.dir(&format!("dest-{max_entries}-{max_bytes}"));
        let limits = CaptureLimits {
            max_bytes,
            max_entries,
        };
        capture(&up, &dest, None, &limits)
    };
    let limit = |r: Result<CaptureReport, CaptureError>| match r {
        Err(CaptureError::LimitExceeded { what, limit }) => (what, limit),
        other => panic!("expected a limit error, got {other:?}"),
    };
    // Over at the root's listing, and (3) at c's.
    assert_eq!(limit(run(2, 1000)), ("entries", 2));
    assert_eq!(limit(run(3, 1000)), ("entries", 3));
    assert_eq!(limit(run(4, 209)), ("bytes", 209));
    assert_eq!(limit(run(4, 150)), ("bytes", 150));
    let report = run(4, 210).unwrap();
    assert_eq!((report.files, report.dirs, report.bytes), (3, 1, 210));
}

#[test]
fn below_must_be_on_the_destination_filesystem() {
    let t = TempDir::new("xdev");
    let up = t.dir("upper");
    let dest = t.dir("dest");
    let shm = Path::new("/dev/shm");
    if crate::sys::statfs_type(&c(shm)).ok() != Some(libc::TMPFS_MAGIC) {
        return; // no second filesystem at hand
    }
    let below = TempDir::under(shm, "below");
    let err = capture(&up, &dest, Some(&below.0), &limits()).unwrap_err();
    match err {
        CaptureError::Io { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::EXDEV)),
        other => panic!("expected EXDEV, got {other}"),
    }
}

/// The two sandbox upper layers of the merge tests: `first` (captured alone as `below`) and
/// `second` (captured over it as `result`), and a template for beneath them.
struct MergeCase {
    _t: TempDir,
    below: PathBuf,
    second: PathBuf,
    result: PathBuf,
    template: PathBuf,
}

fn merge_case() -> MergeCase {
    let t = TempDir::new("merge");
    let sb = (BASE + 1000, BASE + 1000);
    let (first, below, second, result, template) = (
        t.dir("first"),
        t.dir("below"),
        t.dir("second"),
        t.dir("result"),
        t.dir("template"),
    );
    // The template: what every layer hides or shows.
    for d in ["d", "e", "f", "o", "p", "g2"] {
        fs::create_dir(template.join(d)).unwrap();
    }
    for f in [
        "a", "d/x", "d/t", "e/t", "f/t", "o/t", "p/t", "g", "g2/tm", "k2", "hide",
    ] {
        fs::write(template.join(f), format!("template {f}")).unwrap();
    }

    // First pause: a, d/x, e/y, f/{q}, o/ opaque {k}, p (a file), k2, g2/{m}.
    file(&first.join("a"), b"old a", sb, 0o644);
    dir(&first.join("d"), sb, 0o755);
    file(&first.join("d/x"), b"x", sb, 0o644);
    dir(&first.join("e"), sb, 0o755);
    file(&first.join("e/y"), b"y", sb, 0o644);
    set_xattr(&first.join("e/y"), "user.kept", b"yes");
    dir(&first.join("f"), sb, 0o755);
    file(&first.join("f/q"), b"q", sb, 0o644);
    dir(&first.join("o"), sb, 0o750);
    set_xattr(&first.join("o"), OPAQUE_XATTR, b"y");
    file(&first.join("o/k"), b"k", sb, 0o644);
    file(&first.join("p"), b"p was a file", sb, 0o644);
    file(&first.join("k2"), b"k2", sb, 0o600);
    dir(&first.join("s"), sb, 0o755);
    file(&first.join("s/in"), b"in", sb, 0o644);
    dir(&first.join("g2"), sb, 0o700);
    file(&first.join("g2/m"), b"m", sb, 0o644);
    set_times(&first.join("g2"), 1_000_000_000, 7);
    capture(&first, &below, None, &limits()).unwrap();

    // Second pause, over the first: a anew, f deleted, d/ replaced (opaque) by {z}, e/ merged
    // with {w}, o/ merged (not opaque here) with {n}, p a directory now {q}; and some more.
    file(&second.join("a"), b"new a", sb, 0o600);
    mknod(&second.join("f"), libc::S_IFCHR, 0);
    dir(&second.join("d"), sb, 0o755);
    set_xattr(&second.join("d"), OPAQUE_XATTR, b"y");
    file(&second.join("d/z"), b"z", sb, 0o644);
    dir(&second.join("e"), sb, 0o775);
    file(&second.join("e/w"), b"w", sb, 0o644);
    dir(&second.join("o"), sb, 0o755);
    file(&second.join("o/n"), b"n", sb, 0o644);
    dir(&second.join("p"), sb, 0o755);
    file(&second.join("p/q"), b"pq", sb, 0o644);
    mknod(&second.join("hide"), libc::S_IFCHR, 0);
    symlink("/etc", &second.join("ln"), sb);
    // A symlink where below has a directory: it replaces it, and is never followed.
    symlink("/etc", &second.join("s"), sb);
    mknod(&second.join("fifo"), libc::S_IFIFO | 0o644, 0);
    chown(&second.join("fifo"), sb);
    file(&second.join("h1"), b"h", sb, 0o644);
    fs::hard_link(second.join("h1"), second.join("e/h2")).unwrap();
    // A sandbox's upper root is its root's.
    chown(&second, (BASE, BASE));
    for (p, n) in [
        ("e", 11),
        ("o", 12),
        ("p", 13),
        ("d", 14),
        ("a", 15),
        ("", 16),
    ] {
        set_times(&second.join(p), 1_100_000_000 + n, n);
    }
    MergeCase {
        _t: t,
        below,
        second,
        result,
        template,
    }
}

#[test]
fn a_capture_over_an_earlier_one_is_their_merge() {
    let m = merge_case();
    let below_before = tree(&m.below);
    let report = capture(&m.second, &m.result, Some(&m.below), &limits()).unwrap();
    let (r, b) = (&m.result, &m.below);

    assert_eq!(fs::read(r.join("a")).unwrap(), b"new a");
    assert_ne!(ino(&r.join("a")), ino(&b.join("a")));
    assert!(is_whiteout(&r.join("f")), "a whiteout stays one");
    // An opaque directory replaces below's.
    assert!(is_opaque(&r.join("d")));
    assert_eq!(names(&r.join("d")), ["z"]);
    // A plain one merges, sharing below's files.
    assert!(!is_opaque(&r.join("e")));
    assert_eq!(names(&r.join("e")), ["h2", "w", "y"]);
    assert_eq!(ino(&r.join("e/y")), ino(&b.join("e/y")));
    assert_eq!(xattrs(&r.join("e/y")), [xattr("user.kept", b"yes")]);
    assert_eq!(
        (mode(&r.join("e")), mtime(&r.join("e"))),
        (0o775, (1_100_000_011, 11))
    );
    // Merged over an opaque one, it hides what is beneath as that one did.
    assert!(is_opaque(&r.join("o")));
    assert_eq!(names(&r.join("o")), ["k", "n"]);
    assert_eq!(ino(&r.join("o/k")), ino(&b.join("o/k")));
    // A directory over a file: nothing beneath shows through either.
    assert!(is_opaque(&r.join("p")));
    assert_eq!(names(&r.join("p")), ["q"]);
    // What only below has: files linked, directories made anew with below's attributes.
    assert_eq!(ino(&r.join("k2")), ino(&b.join("k2")));
    assert_ne!(ino(&r.join("g2")), ino(&b.join("g2")));
    assert_eq!(ino(&r.join("g2/m")), ino(&b.join("g2/m")));
    let g2 = r.join("g2");
    assert_eq!(
        (mode(&g2), owner(&g2), mtime(&g2)),
        (0o700, (1000, 1000), (1_000_000_000, 7))
    );
    assert!(!is_opaque(&g2));
    assert_eq!(ino(&r.join("h1")), ino(&r.join("e/h2")));
    assert_eq!(
        names(r),
        ["a", "d", "e", "f", "fifo", "g2", "h1", "hide", "k2", "ln", "o", "p", "s"]
    );
    let expected = CaptureReport {
        files: 6 + 4, // a d/z e/w o/n p/q h1; e/y o/k k2 g2/m
        dirs: 5,      // d e o p g2
        symlinks: 2,
        whiteouts: 2,
        hardlinks: 1,
        bytes: 5 + 1 + 1 + 1 + 2 + 1,
        skipped: 0,
        fifos: 1,
        from_below: 4,
    };
    assert_eq!(report, expected);
    assert_eq!(tree(&m.below), below_before, "below is not changed");
    assert_eq!(fs::read(b.join("a")).unwrap(), b"old a");
    assert_eq!(
        meta(&b.join("k2")).nlink(),
        2,
        "below's file and the result's name"
    );
}

/// Runs `script` with the overlay of `layers` (top first) mounted read-only at each of
/// `mounts`, in a private mount namespace of the child (nothing is mounted on the host).
fn with_overlays(mounts: &[(&Path, Vec<&Path>)], script: &str) -> String {
    use std::os::unix::process::CommandExt;
    let prepared: Vec<(CString, CString)> = mounts
        .iter()
        .map(|(at, layers)| {
            let lowers: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
            let opts = CString::new(format!("lowerdir={}", lowers.join(":"))).unwrap();
            (c(at), opts)
        })
        .collect();
    let mut cmd = std::process::Command::new("/bin/sh");
    cmd.arg("-c").arg(script).arg("sh");
    cmd.args(mounts.iter().map(|(at, _)| at.as_os_str()));
    // SAFETY: the closure runs in the forked child before exec and only makes raw syscalls on
    // data prepared before the fork (no allocation, no locks).
    unsafe {
        cmd.pre_exec(move || {
            crate::sys::unshare(libc::CLONE_NEWNS)?;
            crate::sys::mount(None, c"/", None, libc::MS_REC | libc::MS_PRIVATE, None)?;
            for (at, opts) in &prepared {
                crate::sys::mount(
                    Some(c"overlay"),
                    at,
                    Some(c"overlay"),
                    libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
                    Some(opts),
                )?;
            }
            Ok(())
        });
    }
    let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}: {stderr}", out.status);
    String::from_utf8(out.stdout).unwrap()
}

/// Lists everything in the mount given as `$N`: type, mode, owner, size (not of
/// directories, whose sizes are the filesystem's business), time, path, link target; then
/// a digest of every file's content.
const SHOW: &str = r#"
show() {
  cd "$1" || exit 1
  find . ! -type d -printf '%y %m %U %G %s %T@ %p %l\n' | LC_ALL=C sort
  find . -type d -printf '%y %m %U %G - %T@ %p\n' | LC_ALL=C sort
  find . -type f -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
}
show "$1"; echo '==='; show "$2"; echo '==='; cd "$1" && cat a d/z e/t e/w e/y g g2/m g2/tm o/k o/n p/q
"#;

#[test]
fn overlayfs_shows_the_capture_as_it_showed_the_layers_it_merges() {
    let m = merge_case();
    capture(&m.second, &m.result, Some(&m.below), &limits()).unwrap();
    let t = TempDir::new("mnt");
    let (captured, original) = (t.dir("captured"), t.dir("original"));
    let out = with_overlays(
        &[
            (&captured, vec![&m.result, &m.template]),
            (&original, vec![&m.second, &m.below, &m.template]),
        ],
        SHOW,
    );
    let parts: Vec<&str> = out.split("===\n").collect();
    let [ours, theirs, contents] = parts[..] else {
        panic!("unexpected output: {out}");
    };
    // The original's upper layer is owned by host ids, the capture by the sandbox's: compare
    // with the ids shifted (which changes the order of lines sorted by owner).
    let normalized = |text: &str| {
        let mut lines: Vec<String> = text
            .lines()
            .map(|line| {
                let mut f: Vec<String> = line.split(' ').map(str::to_owned).collect();
                if f.first().is_some_and(|t| t.len() == 1) && f.len() > 3 {
                    for i in [2, 3] {
                        let id: u32 = f[i].parse().unwrap();
                        f[i] = shift_id(id, BASE, id).to_string();
                    }
                }
                f.join(" ")
            })
            .collect();
        lines.sort();
        lines
    };
    assert_eq!(
        normalized(ours),
        normalized(theirs),
        "[result, template] differs from [second, below, template]"
    );

    // And what that view is: whiteouts and opaque directories hide the template's entries.
    let listed: Vec<&str> = ours
        .lines()
        .filter(|l| l.len() > 2 && l.as_bytes()[1] == b' ')
        .filter_map(|l| l.split(' ').nth(6))
        .collect();
    for shown in [
        "./a", "./d/z", "./e/t", "./e/w", "./e/y", "./e/h2", "./g", "./g2/m", "./g2/tm", "./k2",
        "./o/k", "./o/n", "./p/q", "./ln", "./fifo", "./h1",
    ] {
        assert!(listed.contains(&shown), "{shown} is shown: {listed:?}");
    }
    for hidden in [
        "./f", "./f/t", "./f/q", "./d/x", "./d/t", "./o/t", "./p/t", "./hide",
    ] {
        assert!(!listed.contains(&hidden), "{hidden} is hidden: {listed:?}");
    }
    assert_eq!(
        contents,
        "new az\
         template e/t\
         wy\
         template g\
         m\
         template g2/tm\
         knpq"
    );
}

#[test]
fn an_entry_that_is_not_what_was_inspected_is_refused() {
    let t = TempDir::new("raced");
    let d = t.dir("d");
    fs::write(d.join("f"), "x").unwrap();
    let dir = open_upper(&d, false);
    let st = lstat_at(dir.as_fd(), c"f").unwrap();
    let at = At::new(Path::new("d"), c"f");
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY;
    assert!(open_checked(dir.as_fd(), c"f", flags, &st, at).is_ok());
    let raced = |what: &str| match open_checked(dir.as_fd(), c"f", flags, &st, at) {
        Err(CaptureError::Raced { path }) => assert_eq!(path, Path::new("d/f"), "{what}"),
        other => panic!("{what}: expected Raced, got {other:?}"),
    };
    // Swapped for a symlink (to the very file, even), for a fifo (opened without blocking,
    // then refused), for another file.
    fs::rename(d.join("f"), d.join("g")).unwrap();
    std::os::unix::fs::symlink("g", d.join("f")).unwrap();
    raced("symlink");
    fs::remove_file(d.join("f")).unwrap();
    mknod(&d.join("f"), libc::S_IFIFO | 0o644, 0);
    raced("fifo");
    fs::remove_file(d.join("f")).unwrap();
    fs::write(d.join("f"), "y").unwrap();
    raced("another file");
}

#[test]
fn holes_stay_holes_and_only_data_counts() {
    use std::io::{Read, Seek, SeekFrom, Write};
    // The upper layer on tmpfs, as a sandbox's is; the result on /tmp's file system.
    let shm = TempDir::under(Path::new("/dev/shm"), "sparse");
    let up = shm.dir("upper");
    let t = TempDir::new("sparse");
    let dest = t.dir("dest");
    const GIB: u64 = 1 << 30;
    let mut f = fs::File::create(up.join("sparse")).unwrap();
    f.write_all(&[b'a'; 4096]).unwrap();
    f.seek(SeekFrom::Start(GIB / 2)).unwrap();
    f.write_all(&[b'b'; 4096]).unwrap();
    f.set_len(GIB).unwrap();
    drop(f);
    fs::File::create(up.join("all-hole"))
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    file(&up.join("dense"), &[b'c'; 10_000], (BASE, BASE), 0o644);
    // 1 MiB of content allowed: a copy that filled the holes would be refused.
    let limits = CaptureLimits {
        max_bytes: 1 << 20,
        max_entries: 100,
    };
    let report = capture(&up, &dest, None, &limits).unwrap();
    assert_eq!(report.bytes, 2 * 4096 + 10_000);
    let sparse = dest.join("sparse");
    assert_eq!(meta(&sparse).len(), GIB);
    assert!(
        meta(&sparse).blocks() * 512 <= 1 << 20,
        "{} blocks",
        meta(&sparse).blocks()
    );
    let mut out = fs::File::open(&sparse).unwrap();
    let mut buf = vec![0u8; 8192];
    out.read_exact(&mut buf).unwrap();
    assert!(buf[..4096].iter().all(|b| *b == b'a') && buf[4096..].iter().all(|b| *b == 0));
    out.seek(SeekFrom::Start(GIB / 2 - 4096)).unwrap();
    out.read_exact(&mut buf).unwrap();
    assert!(buf[..4096].iter().all(|b| *b == 0) && buf[4096..].iter().all(|b| *b == b'b'));
    out.seek(SeekFrom::Start(GIB - 4096)).unwrap();
    out.read_exact(&mut buf[..4096]).unwrap();
    assert!(buf[..4096].iter().all(|b| *b == 0));
    assert_eq!(meta(&dest.join("all-hole")).len(), 100 << 20);
    assert_eq!(meta(&dest.join("all-hole")).blocks(), 0);
    assert_eq!(fs::read(dest.join("dense")).unwrap(), vec![b'c'; 10_000]);
}
