//! copy_out tests against a real fake sandbox root (run as root), plus the
//! helpers shared with `tests_in`.

use std::ffi::CString;
use std::fs::{self, OpenOptions};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::ops::{self, Ends, MAX_DEPTH};
use super::*;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A unique temporary directory, removed on drop (also when a test panics).
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(tag: &str) -> TempDir {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let name = format!("husk-transfer-{tag}-{}-{n}-{nanos}", std::process::id());
        let path = std::env::temp_dir().join(name);
        fs::create_dir(&path).unwrap();
        TempDir(path)
    }

    pub(super) fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // remove_dir_all does not follow symlinks, so test links are safe.
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Opens `path` the way the runtime opens `/proc/<pid>/root`.
pub(super) fn open_root(path: &Path) -> OwnedFd {
    let flags = libc::O_PATH | libc::O_DIRECTORY;
    OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .unwrap()
        .into()
}

/// Writes `contents` to `path` (creating parents) and sets `mode`.
pub(super) fn write(path: &Path, contents: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

pub(super) fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

/// Sorted names in host directory `dir`.
pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

pub(super) fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    let ret = unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    assert_eq!(ret, 0, "mkfifo {}", path.display());
}

fn out(
    root: &TempDir,
    src: &str,
    dest: &Path,
    limits: &OutputLimits,
) -> Result<CopyReport, TransferError> {
    let dest = HostDest::open(dest)?;
    copy_out(open_root(&root.0).as_fd(), Path::new(src), &dest, limits)
}

fn symlink_skip(path: &str, target: &str) -> Skipped {
    Skipped {
        path: path.into(),
        kind: SkipKind::Symlink {
            target: target.into(),
        },
    }
}

#[test]
fn copies_tree_with_contents_sizes_and_modes() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    write(&root.join("out/a.txt"), b"hello", 0o640);
    write(&root.join("out/sub/big.bin"), &big, 0o755);
    write(&root.join("out/sub/deeper/empty"), b"", 0o600);
    fs::set_permissions(root.join("out/sub"), fs::Permissions::from_mode(0o750)).unwrap();
    let dest = host.join("new/nested");

    let report = out(&root, "/out", &dest, &OutputLimits::default()).unwrap();

    assert_eq!(
        report,
        CopyReport {
            files: 3,
            dirs: 2,
            bytes: 300_005,
            skipped: vec![],
            skipped_more: 0,
            manifest: vec![],
        }
    );
    assert_eq!(fs::read(dest.join("a.txt")).unwrap(), b"hello");
    assert_eq!(fs::read(dest.join("sub/big.bin")).unwrap(), big);
    assert_eq!(fs::read(dest.join("sub/deeper/empty")).unwrap(), b"");
    assert_eq!(mode_of(&dest.join("a.txt")), 0o640);
    assert_eq!(mode_of(&dest.join("sub/big.bin")), 0o755);
    assert_eq!(mode_of(&dest.join("sub/deeper/empty")), 0o600);
    assert_eq!(mode_of(&dest.join("sub")), 0o750);
}

#[test]
fn manifest_lists_each_copied_file_with_its_digest_and_owner_is_set() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/a.txt"), b"hello", 0o644);
    write(&root.join("out/sub/b.bin"), b"", 0o600);
    std::os::unix::fs::symlink("/etc/passwd", root.join("out/link")).unwrap();
    let dest = host.join("runs/r1");
    let hd = HostDest::open(&dest)
        .unwrap()
        .owned_by((1000, 1001))
        .unwrap()
        .with_manifest();
    let report = copy_out(
        open_root(&root.0).as_fd(),
        Path::new("/out"),
        &hd,
        &OutputLimits::default(),
    )
    .unwrap();
    let mut m = report.manifest.clone();
    m.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(
        m,
        vec![
            ManifestEntry {
                path: "a.txt".into(),
                size: 5,
                // sha256("hello")
                sha256: "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824".into(),
            },
            ManifestEntry {
                path: "sub/b.bin".into(),
                size: 0,
                sha256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855".into(),
            },
        ]
    );
    assert_eq!(report.skipped, vec![symlink_skip("link", "/etc/passwd")]);
    for p in [
        dest.clone(),
        dest.join("a.txt"),
        dest.join("sub"),
        dest.join("sub/b.bin"),
    ] {
        let meta = fs::symlink_metadata(&p).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1001), "{}", p.display());
    }
    assert!(fs::symlink_metadata(dest.join("link")).is_err());
}

#[test]
fn single_file_goes_to_dest_basename() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/a.txt"), b"hello", 0o644);
    let report = out(&root, "/out/a.txt", &host.0, &OutputLimits::default()).unwrap();
    assert_eq!((report.files, report.bytes), (1, 5));
    assert_eq!(names(&host.0), ["a.txt"]);
    assert_eq!(fs::read(host.join("a.txt")).unwrap(), b"hello");
}

#[test]
fn symlinks_are_skipped_never_followed_and_reported() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/ok.txt"), b"ok", 0o644);
    std::os::unix::fs::symlink("/etc/shadow", root.join("out/leak")).unwrap();
    std::os::unix::fs::symlink("/", root.join("out/dir")).unwrap();
    std::os::unix::fs::symlink("x".repeat(1000), root.join("out/long")).unwrap();

    let report = out(&root, "/out", &host.0, &OutputLimits::default()).unwrap();

    assert_eq!(
        names(&host.0),
        ["ok.txt"],
        "nothing from /etc or / may appear"
    );
    let long = symlink_skip("long", &"x".repeat(256));
    assert_eq!(
        report.skipped,
        [
            symlink_skip("dir", "/"),
            symlink_skip("leak", "/etc/shadow"),
            long
        ]
    );
    assert_eq!((report.files, report.dirs), (1, 0));
}

#[test]
fn symlink_in_the_middle_of_src_is_refused() {
    let (root, host, outside) = (
        TempDir::new("root"),
        TempDir::new("host"),
        TempDir::new("outside"),
    );
    // Both a resolve-in-root follower and a host-path follower would find an x.
    write(&root.join("etc/x"), b"inside", 0o644);
    write(&outside.join("x"), b"outside", 0o644);
    std::os::unix::fs::symlink("/etc", root.join("work")).unwrap();
    std::os::unix::fs::symlink(&outside.0, root.join("abs")).unwrap();

    for (src, link) in [("/work/x", "/work"), ("/abs/x", "/abs"), ("/work", "/work")] {
        match out(&root, src, &host.0, &OutputLimits::default()) {
            Err(TransferError::Symlink { path }) => assert_eq!(path, Path::new(link)),
            other => panic!("{src}: expected a symlink refusal, got {other:?}"),
        }
    }
    assert!(names(&host.0).is_empty());
}

#[test]
fn missing_src_is_not_found_naming_the_path() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    fs::create_dir(root.join("out")).unwrap();
    for src in ["/nope/x", "/out/missing"] {
        let err = out(&root, src, &host.join("d"), &OutputLimits::default()).unwrap_err();
        assert!(
            matches!(&err, TransferError::NotFound { path } if path == Path::new(src)),
            "{err:?}"
        );
        assert!(err.to_string().contains(src), "{err}");
        // The destination was opened (and created) before the copy, and stays empty.
        assert_eq!(fs::read_dir(host.join("d")).unwrap().count(), 0);
    }
}

#[test]
fn special_files_are_skipped_without_blocking() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/ok.txt"), b"ok", 0o644);
    mkfifo(&root.join("out/pipe"));
    let _sock = std::os::unix::net::UnixListener::bind(root.join("out/sock")).unwrap();
    let dev = CString::new(root.join("out/null").as_os_str().as_bytes()).unwrap();
    let mode = libc::S_IFCHR | 0o666;
    // SAFETY: `dev` is a valid NUL-terminated path; this makes a /dev/null node.
    let ret = unsafe { libc::mknod(dev.as_ptr(), mode, libc::makedev(1, 3)) };
    assert_eq!(ret, 0, "mknod");

    // Opening the FIFO for reading would block forever; run in a thread.
    let (tx, rx) = std::sync::mpsc::channel();
    let (root_path, dest) = (root.0.clone(), host.0.clone());
    std::thread::spawn(move || {
        let fd = open_root(&root_path);
        let dest = HostDest::open(&dest).unwrap();
        let _ = tx.send(copy_out(
            fd.as_fd(),
            Path::new("/out"),
            &dest,
            &OutputLimits::default(),
        ));
    });
    let report = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("copy_out blocked")
        .unwrap();

    let kinds: Vec<_> = report
        .skipped
        .iter()
        .map(|s| (s.path.to_str().unwrap(), s.kind.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("null", SkipKind::Device),
            ("pipe", SkipKind::Fifo),
            ("sock", SkipKind::Socket)
        ]
    );
    assert_eq!(names(&host.0), ["ok.txt"]);
}

#[test]
fn setuid_setgid_and_sticky_bits_are_stripped() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/suid"), b"#!", 0o4755);
    write(&root.join("out/d/sgid"), b"#!", 0o2711);
    fs::set_permissions(root.join("out/d"), fs::Permissions::from_mode(0o3777)).unwrap();
    assert_eq!(mode_of(&root.join("out/suid")), 0o4755, "test setup");

    out(&root, "/out", &host.0, &OutputLimits::default()).unwrap();

    assert_eq!(mode_of(&host.join("suid")), 0o755);
    assert_eq!(mode_of(&host.join("d/sgid")), 0o711);
    // No group/other write on the host either.
    assert_eq!(mode_of(&host.join("d")), 0o755);
}

#[test]
fn the_report_of_skipped_entries_is_bounded() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    fs::create_dir_all(root.join("out")).unwrap();
    for i in 0..(MAX_SKIPPED_LISTED + 50) {
        std::os::unix::fs::symlink("/etc/shadow", root.join(&format!("out/l{i}"))).unwrap();
    }
    let report = out(&root, "/out", &host.0, &OutputLimits::default()).unwrap();
    assert_eq!(report.skipped.len(), MAX_SKIPPED_LISTED);
    assert_eq!(report.skipped_more, 50);
}

#[test]
fn existing_host_directories_keep_their_mode() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/.ssh/authorized_keys"), b"attacker", 0o777);
    fs::set_permissions(root.join("out/.ssh"), fs::Permissions::from_mode(0o777)).unwrap();
    fs::create_dir(host.join(".ssh")).unwrap();
    fs::set_permissions(host.join(".ssh"), fs::Permissions::from_mode(0o700)).unwrap();

    out(&root, "/out", &host.0, &OutputLimits::default()).unwrap();

    assert_eq!(
        mode_of(&host.join(".ssh")),
        0o700,
        "an existing host dir was chmod'ed"
    );
    assert_eq!(mode_of(&host.join(".ssh/authorized_keys")), 0o755);
}

#[test]
fn max_files_is_enforced() {
    let root = TempDir::new("root");
    for i in 0..5 {
        write(&root.join(&format!("many/f{i}")), b"x", 0o644);
    }
    let files = |max_files| OutputLimits {
        max_files,
        ..OutputLimits::default()
    };
    // A directory listing that alone exceeds the limit fails before copying.
    let err = out(&root, "/many", &TempDir::new("host").0, &files(3)).unwrap_err();
    assert!(matches!(
        err,
        TransferError::LimitExceeded {
            what: "files",
            limit: 3,
            copied_files: 0,
            ..
        }
    ));
    assert_eq!(err.to_string(), "output limit exceeded: more than 3 files");
    // Exactly at the limit is fine.
    assert_eq!(
        out(&root, "/many", &TempDir::new("host").0, &files(5))
            .unwrap()
            .files,
        5
    );

    // Entries spread over directories: d, d/a, d/b, d/c fit in 4; e does not.
    for name in ["d/a", "d/b", "d/c", "e"] {
        write(&root.join(&format!("tree/{name}")), b"x", 0o644);
    }
    let host = TempDir::new("host");
    let err = out(&root, "/tree", &host.0, &files(4)).unwrap_err();
    assert!(matches!(
        err,
        TransferError::LimitExceeded {
            what: "files",
            limit: 4,
            copied_files: 3,
            ..
        }
    ));
    assert_eq!(names(&host.0), ["d"], "e must not be copied");
}

#[test]
fn max_bytes_is_enforced_before_copying() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&root.join("out/a.bin"), &[1; 600], 0o644);
    write(&root.join("out/b.bin"), &[2; 600], 0o644);
    let limits = OutputLimits {
        max_bytes: 1000,
        ..OutputLimits::default()
    };

    let err = out(&root, "/out", &host.0, &limits).unwrap_err();

    let expected = TransferError::LimitExceeded {
        what: "bytes",
        limit: 1000,
        copied_files: 1,
        copied_bytes: 600,
    };
    assert_eq!(format!("{err:?}"), format!("{expected:?}"));
    assert_eq!(names(&host.0), ["a.bin"], "b.bin must not be started");
    let limits = OutputLimits {
        max_bytes: 1200,
        ..OutputLimits::default()
    };
    assert_eq!(
        out(&root, "/out", &TempDir::new("host").0, &limits)
            .unwrap()
            .bytes,
        1200
    );
}

#[test]
fn limit_messages_and_defaults() {
    let limits = OutputLimits::default();
    assert_eq!((limits.max_bytes, limits.max_files), (1 << 30, 10_000));
    let err = |what, limit| TransferError::LimitExceeded {
        what,
        limit,
        copied_files: 0,
        copied_bytes: 0,
    };
    assert_eq!(
        err("bytes", 1 << 30).to_string(),
        "output limit exceeded: more than 1.0 GiB"
    );
    assert_eq!(
        err("bytes", 1000).to_string(),
        "output limit exceeded: more than 1000 bytes"
    );
    assert_eq!(
        err("files", 10_000).to_string(),
        "output limit exceeded: more than 10000 files"
    );
}

#[test]
fn existing_symlink_in_dest_is_not_written_through() {
    let (root, host, other) = (
        TempDir::new("root"),
        TempDir::new("host"),
        TempDir::new("victim"),
    );
    let victim = other.join("victim");
    write(&victim, b"original", 0o644);
    std::os::unix::fs::symlink(&victim, host.join("a")).unwrap();
    write(&root.join("out/a"), b"evil", 0o644);

    let err = out(&root, "/out", &host.0, &OutputLimits::default()).unwrap_err();

    assert!(
        matches!(
            err,
            TransferError::Exists {
                side: Side::Host,
                kind: "symlink",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(fs::read(&victim).unwrap(), b"original");
    assert!(fs::symlink_metadata(host.join("a"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn existing_regular_file_is_replaced_not_truncated_in_place() {
    let (root, host, other) = (
        TempDir::new("root"),
        TempDir::new("host"),
        TempDir::new("other"),
    );
    // A hard link elsewhere must keep the old content: we unlink, not truncate.
    write(&other.join("old"), b"old", 0o644);
    fs::hard_link(other.join("old"), host.join("b")).unwrap();
    write(&root.join("out/b"), b"new", 0o600);

    out(&root, "/out", &host.0, &OutputLimits::default()).unwrap();

    assert_eq!(fs::read(host.join("b")).unwrap(), b"new");
    assert_eq!(fs::read(other.join("old")).unwrap(), b"old");
}

#[test]
fn non_directory_where_a_directory_must_go_is_an_error() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    write(&host.join("sub"), b"file", 0o644);
    write(&root.join("out/sub/x"), b"x", 0o644);
    let err = out(&root, "/out", &host.0, &OutputLimits::default()).unwrap_err();
    assert!(
        matches!(&err, TransferError::NotADirectory { side: Side::Host, path } if *path == host.join("sub"))
    );
    assert_eq!(fs::read(host.join("sub")).unwrap(), b"file");
}

#[test]
fn recursion_depth_is_bounded() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    let ok = root.join(&format!("ok{}", "/d".repeat(MAX_DEPTH)));
    let deep = root.join(&format!("deep{}", "/d".repeat(MAX_DEPTH + 1)));
    fs::create_dir_all(&ok).unwrap();
    fs::create_dir_all(&deep).unwrap();

    assert_eq!(
        out(&root, "/ok", &host.join("ok"), &OutputLimits::default())
            .unwrap()
            .dirs,
        MAX_DEPTH as u64
    );
    let err = out(&root, "/deep", &host.join("deep"), &OutputLimits::default()).unwrap_err();
    assert!(
        matches!(err, TransferError::TooDeep { max: MAX_DEPTH, .. }),
        "{err:?}"
    );
}

#[test]
fn invalid_src_paths_are_rejected() {
    let (root, host) = (TempDir::new("root"), TempDir::new("host"));
    for src in ["out", "/out/../etc"] {
        let err = out(&root, src, &host.0, &OutputLimits::default()).unwrap_err();
        assert!(
            matches!(err, TransferError::InvalidPath { .. }),
            "{src}: {err:?}"
        );
    }
}

#[test]
fn copy_never_exceeds_the_size_checked_at_open() {
    // Stands in for a file that grows after fstat: only `size` bytes are copied.
    let dir = TempDir::new("bound");
    write(&dir.join("src"), &[7; 1000], 0o644);
    let mut src = fs::File::open(dir.join("src")).unwrap();
    let mut dst = fs::File::create(dir.join("dst")).unwrap();
    let (s, d) = (dir.join("src"), dir.join("dst"));
    let ends = Ends {
        src: (Side::Host, &s),
        dst: (Side::Host, &d),
    };
    let copied = ops::copy_bounded(&mut src, &mut dst, 100, &mut [0; 64], &ends).unwrap();
    assert_eq!(copied, 100);
    assert_eq!(fs::read(&d).unwrap().len(), 100);
}
