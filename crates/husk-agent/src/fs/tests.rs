//! Tests of the file operations on the host, as root, in temporary directories under /tmp.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use husk_proto::{Entry, ErrorKind, FileType, Reply, Request, User, CHUNK};

use super::entry::{encoded_size_bound, permissions};
use super::error::kind_of;
use super::handles::MAX_HANDLES;
use super::{resolve, Files};

/// A fresh directory under /tmp, removed (with everything in it) when dropped, so a failing
/// test cleans up too.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let n = COUNT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("husk-agent-test-{}-{tag}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// A path inside, as the string a client sends.
    pub(crate) fn join(&self, rel: &str) -> String {
        self.0
            .join(rel)
            .to_str()
            .expect("utf-8 temp path")
            .to_owned()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn call(files: &mut Files, req: Request) -> Result<Reply, husk_proto::AgentError> {
    files.handle(&req)
}

fn stat(files: &mut Files, path: &str) -> Entry {
    match call(
        files,
        Request::Stat {
            path: path.into(),
            user: User::Root,
        },
    ) {
        Ok(Reply::Entry(e)) => e,
        other => panic!("stat {path}: {other:?}"),
    }
}

fn err_kind(r: Result<Reply, husk_proto::AgentError>) -> ErrorKind {
    match r {
        Err(e) => e.kind,
        Ok(r) => panic!("expected an error, got {r:?}"),
    }
}

fn list(files: &mut Files, path: &str, depth: u32) -> Vec<String> {
    match call(
        files,
        Request::ListDir {
            path: path.into(),
            depth,
            user: User::Root,
        },
    ) {
        Ok(Reply::Entries(es)) => es.into_iter().map(|e| e.path).collect(),
        other => panic!("list {path}: {other:?}"),
    }
}

fn open_write(files: &mut Files, path: &str, user: User, md: &[(&str, &str)]) -> u32 {
    let metadata = md
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match call(
        files,
        Request::OpenWrite {
            path: path.into(),
            user,
            metadata,
        },
    ) {
        Ok(Reply::Opened { handle, .. }) => handle,
        other => panic!("open_write {path}: {other:?}"),
    }
}

fn write(files: &mut Files, handle: u32, data: &[u8]) {
    let r = call(
        files,
        Request::Write {
            handle,
            data: data.to_vec(),
        },
    );
    assert!(matches!(r, Ok(Reply::Done)), "{r:?}");
}

fn close(files: &mut Files, handle: u32) -> Entry {
    match call(files, Request::Close { handle }) {
        Ok(Reply::Entry(e)) => e,
        other => panic!("close: {other:?}"),
    }
}

/// Whether the file system of `dir` stores `user.*` xattrs (ext4 and tmpfs do; some
/// overlay set-ups don't). Only the metadata assertions depend on it.
fn user_xattrs_supported(dir: &Path) -> bool {
    let probe = dir.join(".xattr-probe");
    fs::write(&probe, b"").expect("probe file");
    let r = xattr::set(&probe, "user.e2b.probe", b"1");
    let _ = fs::remove_file(&probe);
    match r {
        Ok(()) => true,
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => false,
        Err(e) => panic!("xattr probe: {e}"),
    }
}

#[test]
fn resolve_cases() {
    let r = |p: &str, u: User| resolve(p, u).expect(p).to_str().unwrap().to_owned();
    assert_eq!(r("", User::User), "/home/user");
    assert_eq!(r("~", User::User), "/home/user");
    assert_eq!(r("~", User::Root), "/root");
    assert_eq!(r("~/a", User::User), "/home/user/a");
    assert_eq!(r("~/a/../b/./c/", User::User), "/home/user/b/c");
    assert_eq!(r("a/b", User::User), "/home/user/a/b");
    assert_eq!(r("a/b", User::Root), "/root/a/b");
    assert_eq!(r("../../etc", User::User), "/etc");
    assert_eq!(r("../../../../etc/passwd", User::User), "/etc/passwd");
    assert_eq!(r("/a/../../b", User::User), "/b");
    assert_eq!(r("/../../etc", User::User), "/etc");
    assert_eq!(r("/", User::User), "/");
    assert_eq!(r("/..", User::User), "/");
    assert_eq!(r("//x//y", User::User), "/x/y");
    assert_eq!(r(".", User::User), "/home/user");
    let bad = |p: &str| resolve(p, User::User).expect_err(p).kind;
    assert_eq!(bad("~other/x"), ErrorKind::InvalidArgument);
    assert_eq!(bad("a\0b"), ErrorKind::InvalidArgument);
    assert_eq!(bad(&"a".repeat(5000)), ErrorKind::InvalidArgument);
}

#[test]
fn errno_mapping() {
    let k = |errno| kind_of(&io::Error::from_raw_os_error(errno));
    assert_eq!(k(libc::ENOENT), ErrorKind::NotFound);
    assert_eq!(k(libc::EEXIST), ErrorKind::AlreadyExists);
    assert_eq!(k(libc::ENOTDIR), ErrorKind::InvalidArgument);
    assert_eq!(k(libc::EISDIR), ErrorKind::InvalidArgument);
    assert_eq!(k(libc::ENOSPC), ErrorKind::NoSpace);
    assert_eq!(k(libc::EDQUOT), ErrorKind::NoSpace);
    assert_eq!(k(libc::EACCES), ErrorKind::PermissionDenied);
    assert_eq!(k(libc::EPERM), ErrorKind::PermissionDenied);
    assert_eq!(k(libc::EMFILE), ErrorKind::ResourceExhausted);
    assert_eq!(k(libc::EIO), ErrorKind::Internal);
    let std_made = io::Error::new(io::ErrorKind::InvalidInput, "nul");
    assert_eq!(kind_of(&std_made), ErrorKind::InvalidArgument);
    let e = super::io_error(
        "write",
        Path::new("/x"),
        &io::Error::from_raw_os_error(libc::ENOSPC),
    );
    assert_eq!(e.kind, ErrorKind::NoSpace);
    let e = super::io_error(
        "open",
        Path::new("/x"),
        &io::Error::from_raw_os_error(libc::ENOENT),
    );
    assert_eq!(e.message, "path '/x' does not exist");
}

#[test]
fn permission_strings() {
    assert_eq!(permissions(libc::S_IFREG | 0o644), "-rw-r--r--");
    assert_eq!(permissions(libc::S_IFDIR | 0o755), "drwxr-xr-x");
    assert_eq!(permissions(libc::S_IFLNK | 0o777), "lrwxrwxrwx");
    assert_eq!(permissions(libc::S_IFDIR | 0o1777), "drwxrwxrwt");
    assert_eq!(permissions(libc::S_IFDIR | 0o1770), "drwxrwx--T");
    assert_eq!(permissions(libc::S_IFREG | 0o4755), "-rwsr-xr-x");
    assert_eq!(permissions(libc::S_IFREG | 0o4644), "-rwSr--r--");
    assert_eq!(permissions(libc::S_IFREG | 0o2644), "-rw-r-Sr--");
    assert_eq!(permissions(libc::S_IFIFO | 0o600), "prw-------");
    assert_eq!(permissions(libc::S_IFCHR | 0o666), "crw-rw-rw-");
}

#[test]
fn stat_file_dir_symlink() {
    let t = TempDir::new("stat");
    let mut files = Files::new();
    let file = t.path().join("f.txt");
    fs::write(&file, b"hello").unwrap();
    fs::set_permissions(&file, fs::Permissions::from_mode(0o640)).unwrap();
    let e = stat(&mut files, &t.join("f.txt"));
    assert_eq!(e.name, "f.txt");
    assert_eq!(e.path, t.join("f.txt"));
    assert_eq!(e.file_type, FileType::File);
    assert_eq!(e.size, 5);
    assert_eq!(e.mode, 0o640);
    assert_eq!(e.permissions, "-rw-r-----");
    assert_eq!((e.owner.as_str(), e.group.as_str()), ("root", "root"));
    assert_eq!(e.symlink_target, None);
    let mtime = fs::metadata(&file).unwrap().mtime();
    assert_eq!(e.mtime_secs, mtime);
    assert!(e.mtime_nanos < 1_000_000_000);

    std::os::unix::fs::chown(&file, Some(1000), Some(1000)).unwrap();
    let e = stat(&mut files, &t.join("f.txt"));
    assert_eq!((e.owner.as_str(), e.group.as_str()), ("user", "user"));
    std::os::unix::fs::chown(&file, Some(1234), Some(4321)).unwrap();
    let e = stat(&mut files, &t.join("f.txt"));
    assert_eq!((e.owner.as_str(), e.group.as_str()), ("1234", "4321"));

    let dir = t.path().join("d");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777)).unwrap();
    let e = stat(&mut files, &t.join("d"));
    assert_eq!(e.file_type, FileType::Dir);
    assert_eq!(e.mode, 0o1777);
    assert_eq!(e.permissions, "drwxrwxrwt");

    // A symlink, as envd describes one: the type and mode of what it leads to, its own
    // permissions string and size, and the absolute path it finally leads to.
    let real = fs::canonicalize(t.path()).unwrap();
    std::os::unix::fs::symlink("d", t.path().join("link")).unwrap();
    let e = stat(&mut files, &t.join("link"));
    assert_eq!(e.file_type, FileType::Dir);
    assert_eq!(e.mode, 0o1777);
    let target = real.join("d").display().to_string();
    assert_eq!(e.symlink_target.as_deref(), Some(target.as_str()));
    assert_eq!(e.permissions, "lrwxrwxrwx");
    assert_eq!(e.size, 1, "the link's own size (its target's length)");
    assert!(e.metadata.is_empty());
    // Through a chain of links to a file.
    std::os::unix::fs::symlink("link/../f.txt", t.path().join("chain")).unwrap();
    std::os::unix::fs::symlink("chain", t.path().join("chain2")).unwrap();
    let e = stat(&mut files, &t.join("chain2"));
    assert_eq!(e.file_type, FileType::File);
    let target = real.join("f.txt").display().to_string();
    assert_eq!(e.symlink_target.as_deref(), Some(target.as_str()));
    // A link that leads nowhere: no type, mode 0, itself as its target.
    for (name, to) in [("dangling", "nope"), ("loop", "loop")] {
        std::os::unix::fs::symlink(to, t.path().join(name)).unwrap();
        let e = stat(&mut files, &t.join(name));
        assert_eq!((e.file_type, e.mode), (FileType::Other, 0), "{name}");
        assert_eq!(
            e.symlink_target.as_deref(),
            Some(t.join(name).as_str()),
            "{name}"
        );
    }

    let root = stat(&mut files, "/");
    assert_eq!((root.name.as_str(), root.path.as_str()), ("/", "/"));

    let r = call(
        &mut files,
        Request::Stat {
            path: t.join("missing"),
            user: User::Root,
        },
    );
    let e = r.expect_err("missing");
    assert_eq!(e.kind, ErrorKind::NotFound);
    assert!(e.message.contains("does not exist"), "{}", e.message);
    // A file used as a directory.
    let r = call(
        &mut files,
        Request::Stat {
            path: t.join("f.txt/x"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(r), ErrorKind::InvalidArgument);
}

#[test]
fn list_depths_sorted_without_following_symlinks() {
    let t = TempDir::new("list");
    let mut files = Files::new();
    fs::create_dir_all(t.path().join("sub/deep")).unwrap();
    fs::write(t.path().join("b.txt"), b"").unwrap();
    fs::write(t.path().join("a.txt"), b"").unwrap();
    fs::write(t.path().join("sub/s.txt"), b"").unwrap();
    fs::write(t.path().join("sub/deep/d.txt"), b"").unwrap();
    // A symlink to a directory (its parent: a loop if followed).
    std::os::unix::fs::symlink(t.path(), t.path().join("sub/up")).unwrap();
    std::os::unix::fs::symlink("sub", t.path().join("link")).unwrap();

    let rel = |paths: Vec<String>| -> Vec<String> {
        let base = format!("{}/", t.path().display());
        paths
            .into_iter()
            .map(|p| p.strip_prefix(&base).unwrap().to_owned())
            .collect()
    };
    let one = ["a.txt", "b.txt", "link", "sub"];
    assert_eq!(rel(list(&mut files, &t.join(""), 1)), one);
    assert_eq!(rel(list(&mut files, &t.join(""), 0)), one);
    assert_eq!(
        rel(list(&mut files, &t.join(""), 2)),
        [
            "a.txt",
            "b.txt",
            "link",
            "sub",
            "sub/deep",
            "sub/s.txt",
            "sub/up"
        ]
    );
    assert_eq!(
        rel(list(&mut files, &t.join(""), 10)),
        [
            "a.txt",
            "b.txt",
            "link",
            "sub",
            "sub/deep",
            "sub/deep/d.txt",
            "sub/s.txt",
            "sub/up"
        ]
    );
    // Listing through a symlinked directory lists the target's entries under the link.
    assert_eq!(
        rel(list(&mut files, &t.join("link"), 1)),
        ["link/deep", "link/s.txt", "link/up"]
    );

    let not_dir = call(
        &mut files,
        Request::ListDir {
            path: t.join("a.txt"),
            depth: 1,
            user: User::Root,
        },
    );
    assert_eq!(err_kind(not_dir), ErrorKind::InvalidArgument);
    let missing = call(
        &mut files,
        Request::ListDir {
            path: t.join("nope"),
            depth: 1,
            user: User::Root,
        },
    );
    assert_eq!(err_kind(missing), ErrorKind::NotFound);
}

#[test]
fn size_bound_covers_the_encoding() {
    let t = TempDir::new("size");
    let mut files = Files::new();
    fs::write(t.path().join("x"), b"abc").unwrap();
    let mut e = stat(&mut files, &t.join("x"));
    e.metadata = vec![("k".into(), "v".repeat(300))];
    e.symlink_target = Some("t".repeat(200));
    let encoded = husk_proto::encode(&e).unwrap().len();
    assert!(encoded <= encoded_size_bound(&e), "{encoded} > bound");
}

#[test]
fn make_dir_parents_and_already_exists() {
    let t = TempDir::new("mkdir");
    let mut files = Files::new();
    let r = call(
        &mut files,
        Request::MakeDir {
            path: t.join("a/b/c"),
            user: User::Root,
        },
    );
    match r {
        Ok(Reply::Entry(e)) => {
            assert_eq!(e.file_type, FileType::Dir);
            assert_eq!(e.path, t.join("a/b/c"));
        }
        other => panic!("{other:?}"),
    }
    assert!(t.path().join("a/b/c").is_dir());
    let again = call(
        &mut files,
        Request::MakeDir {
            path: t.join("a/b"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(again), ErrorKind::AlreadyExists);
    fs::write(t.path().join("file"), b"").unwrap();
    let on_file = call(
        &mut files,
        Request::MakeDir {
            path: t.join("file"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(on_file), ErrorKind::AlreadyExists);
    let under_file = call(
        &mut files,
        Request::MakeDir {
            path: t.join("file/x/y"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(under_file), ErrorKind::InvalidArgument);
}

#[test]
fn created_entries_are_owned_by_user() {
    let t = TempDir::new("chown");
    let mut files = Files::new();
    let r = call(
        &mut files,
        Request::MakeDir {
            path: t.join("u1/u2"),
            user: User::User,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    let h = open_write(&mut files, &t.join("w1/w2/f.txt"), User::User, &[]);
    write(&mut files, h, b"x");
    let e = close(&mut files, h);
    assert_eq!((e.owner.as_str(), e.group.as_str()), ("user", "user"));
    for p in ["u1", "u1/u2", "w1", "w1/w2", "w1/w2/f.txt"] {
        let m = fs::metadata(t.path().join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), (1000, 1000), "{p}");
    }
    // The existing parent keeps its owner.
    assert_eq!(fs::metadata(t.path()).unwrap().uid(), 0);
    // Created for root: stays root's; an existing file keeps its owner.
    let h = open_write(&mut files, &t.join("r/f.txt"), User::Root, &[]);
    close(&mut files, h);
    let m = fs::metadata(t.path().join("r/f.txt")).unwrap();
    assert_eq!((m.uid(), m.gid()), (0, 0));
    let h = open_write(&mut files, &t.join("r/f.txt"), User::User, &[]);
    close(&mut files, h);
    assert_eq!(fs::metadata(t.path().join("r/f.txt")).unwrap().uid(), 0);
    // A moved file's created parents are the user's.
    let r = call(
        &mut files,
        Request::Move {
            from: t.join("r/f.txt"),
            to: t.join("m1/m2/f.txt"),
            user: User::User,
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(fs::metadata(t.path().join("m1/m2")).unwrap().uid(), 1000);
}

#[test]
fn move_creates_parents_and_maps_errors() {
    let t = TempDir::new("move");
    let mut files = Files::new();
    fs::write(t.path().join("src.txt"), b"data").unwrap();
    let r = call(
        &mut files,
        Request::Move {
            from: t.join("src.txt"),
            to: t.join("x/y/dst.txt"),
            user: User::Root,
        },
    );
    match r {
        Ok(Reply::Entry(e)) => {
            assert_eq!(e.path, t.join("x/y/dst.txt"));
            assert_eq!(e.name, "dst.txt");
            assert_eq!(e.size, 4);
        }
        other => panic!("{other:?}"),
    }
    assert!(!t.path().join("src.txt").exists());
    assert_eq!(fs::read(t.path().join("x/y/dst.txt")).unwrap(), b"data");
    let missing = call(
        &mut files,
        Request::Move {
            from: t.join("nope"),
            to: t.join("z/dst"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(missing), ErrorKind::NotFound);
    assert!(
        !t.path().join("z").exists(),
        "no parents made for a failed move"
    );
}

#[test]
fn remove_files_links_and_trees() {
    let t = TempDir::new("remove");
    let mut files = Files::new();
    fs::create_dir_all(t.path().join("tree/a/b")).unwrap();
    fs::write(t.path().join("tree/a/b/f"), b"").unwrap();
    fs::create_dir(t.path().join("keep")).unwrap();
    fs::write(t.path().join("keep/k"), b"").unwrap();
    std::os::unix::fs::symlink(t.path().join("keep"), t.path().join("tree/link")).unwrap();
    std::os::unix::fs::symlink(t.path().join("keep"), t.path().join("toplink")).unwrap();
    let rm = |files: &mut Files, p: &str| {
        call(
            files,
            Request::Remove {
                path: p.into(),
                user: User::Root,
            },
        )
    };
    assert!(matches!(
        rm(&mut files, &t.join("toplink")),
        Ok(Reply::Done)
    ));
    assert!(t.path().join("keep/k").exists(), "the link's target stays");
    assert!(matches!(rm(&mut files, &t.join("tree")), Ok(Reply::Done)));
    assert!(!t.path().join("tree").exists());
    assert!(
        t.path().join("keep/k").exists(),
        "links inside are not followed"
    );
    assert!(matches!(rm(&mut files, &t.join("keep/k")), Ok(Reply::Done)));
    // What is not there is removed already, as envd's `os.RemoveAll` answers.
    assert!(matches!(rm(&mut files, &t.join("keep/k")), Ok(Reply::Done)));
    assert!(matches!(
        rm(&mut files, &t.join("no/such/dir")),
        Ok(Reply::Done)
    ));
    // A path through a file is not missing but wrong: still an error.
    fs::write(t.path().join("keep/f"), b"").unwrap();
    assert!(rm(&mut files, &t.join("keep/f/x")).is_err());
    assert_eq!(err_kind(rm(&mut files, "/")), ErrorKind::InvalidArgument);
}

#[test]
fn read_in_chunks_to_eof() {
    let t = TempDir::new("read");
    let mut files = Files::new();
    let data: Vec<u8> = (0..CHUNK + 10_000).map(|i| (i % 251) as u8).collect();
    fs::write(t.path().join("big"), &data).unwrap();
    let (handle, entry) = match call(
        &mut files,
        Request::OpenRead {
            path: t.join("big"),
            user: User::Root,
        },
    ) {
        Ok(Reply::Opened { handle, entry }) => (handle, entry),
        other => panic!("{other:?}"),
    };
    assert_eq!(entry.size, data.len() as u64);
    let mut read = |offset: u64, len: u32| match call(
        &mut files,
        Request::Read {
            handle,
            offset,
            len,
        },
    ) {
        Ok(Reply::Data(d)) => d,
        other => panic!("{other:?}"),
    };
    // A length above CHUNK is capped.
    let first = read(0, u32::MAX);
    assert_eq!(first.len(), CHUNK);
    assert_eq!(first[..], data[..CHUNK]);
    let mut got = first;
    loop {
        let chunk = read(got.len() as u64, 4096);
        if chunk.is_empty() {
            break;
        }
        assert!(chunk.len() <= 4096);
        got.extend_from_slice(&chunk);
    }
    assert_eq!(got, data);
    assert!(read(data.len() as u64 + 100, 10).is_empty(), "past the end");
    let huge = call(
        &mut files,
        Request::Read {
            handle,
            offset: u64::MAX,
            len: 10,
        },
    );
    assert_eq!(err_kind(huge), ErrorKind::InvalidArgument);
    let e = close(&mut files, handle);
    assert_eq!(e.size, data.len() as u64);
    let r = call(&mut files, Request::Close { handle });
    assert_eq!(err_kind(r), ErrorKind::NotFound);

    let dir = call(
        &mut files,
        Request::OpenRead {
            path: t.join(""),
            user: User::Root,
        },
    );
    let e = dir.expect_err("dir");
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("is a directory"), "{}", e.message);
    let missing = call(
        &mut files,
        Request::OpenRead {
            path: t.join("nope"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(missing), ErrorKind::NotFound);
}

#[test]
fn write_and_metadata_round_trip() {
    let t = TempDir::new("write");
    let mut files = Files::new();
    let xattrs = user_xattrs_supported(t.path());
    let md: &[(&str, &str)] = if xattrs {
        &[("b", "two words"), ("a", "1")]
    } else {
        println!(
            "skipping metadata assertions: {} has no user xattrs",
            t.path().display()
        );
        &[]
    };
    let path = t.join("up/file.bin");
    let h = open_write(&mut files, &path, User::Root, md);
    write(&mut files, h, b"hello ");
    write(&mut files, h, b"world");
    // A write handle cannot be read.
    let r = call(
        &mut files,
        Request::Read {
            handle: h,
            offset: 0,
            len: 10,
        },
    );
    assert_eq!(err_kind(r), ErrorKind::InvalidArgument);
    let e = close(&mut files, h);
    assert_eq!(e.size, 11);
    assert_eq!(e.file_type, FileType::File);
    assert_eq!(e.mode & 0o777 & !0o022, 0o644 & !0o022);
    assert_eq!(
        fs::read(t.path().join("up/file.bin")).unwrap(),
        b"hello world"
    );
    if xattrs {
        let want = vec![
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "two words".to_owned()),
        ];
        assert_eq!(e.metadata, want);
        assert_eq!(stat(&mut files, &path).metadata, want);
        // Other xattrs are not metadata and survive a rewrite.
        xattr::set(t.path().join("up/file.bin"), "user.other", b"x").unwrap();
        // Overwriting replaces the metadata and truncates.
        let h = open_write(&mut files, &path, User::Root, &[("c", "3")]);
        let e = close(&mut files, h);
        assert_eq!(e.size, 0);
        assert_eq!(e.metadata, [("c".to_owned(), "3".to_owned())]);
        assert!(xattr::get(t.path().join("up/file.bin"), "user.other")
            .unwrap()
            .is_some());
        // Directories report metadata too.
        xattr::set(t.path().join("up"), "user.e2b.dir", b"yes").unwrap();
        assert_eq!(
            stat(&mut files, &t.join("up")).metadata,
            [("dir".to_owned(), "yes".to_owned())]
        );
    }

    let bad = |files: &mut Files, md: Vec<(String, String)>| {
        call(
            files,
            Request::OpenWrite {
                path: t.join("bad"),
                user: User::Root,
                metadata: md,
            },
        )
    };
    let s = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    assert_eq!(
        err_kind(bad(&mut files, vec![s("has space", "v")])),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err_kind(bad(&mut files, vec![s("ümlaut", "v")])),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err_kind(bad(&mut files, vec![s("", "v")])),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err_kind(bad(&mut files, vec![s(&"k".repeat(247), "")])),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err_kind(bad(
            &mut files,
            vec![s("a", &"v".repeat(4000)), s("b", &"v".repeat(100))]
        )),
        ErrorKind::InvalidArgument
    );
    assert!(!t.path().join("bad").exists(), "refused before creating");
    if xattrs {
        let h = open_write(
            &mut files,
            &t.join("ok"),
            User::Root,
            &[(&"k".repeat(246), "v")],
        );
        close(&mut files, h);
    }

    // Writing over a directory is refused.
    let r = call(
        &mut files,
        Request::OpenWrite {
            path: t.join("up"),
            user: User::Root,
            metadata: vec![],
        },
    );
    assert_eq!(err_kind(r), ErrorKind::InvalidArgument);
    // Unknown handles.
    assert_eq!(
        err_kind(call(
            &mut files,
            Request::Write {
                handle: 999,
                data: vec![1]
            }
        )),
        ErrorKind::NotFound
    );
}

#[test]
fn fifos_are_refused_without_blocking() {
    let t = TempDir::new("fifo");
    let mut files = Files::new();
    let fifo = t.path().join("pipe");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(status.success());
    let started = Instant::now();
    let r = call(
        &mut files,
        Request::OpenRead {
            path: t.join("pipe"),
            user: User::Root,
        },
    );
    let e = r.expect_err("fifo read");
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("not a regular file"), "{}", e.message);
    let r = call(
        &mut files,
        Request::OpenWrite {
            path: t.join("pipe"),
            user: User::Root,
            metadata: vec![],
        },
    );
    assert_eq!(err_kind(r), ErrorKind::InvalidArgument);
    // Through a symlink, too.
    std::os::unix::fs::symlink(&fifo, t.path().join("pipelink")).unwrap();
    let r = call(
        &mut files,
        Request::OpenRead {
            path: t.join("pipelink"),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(r), ErrorKind::InvalidArgument);
    assert!(started.elapsed() < Duration::from_secs(5));
    // Devices too (/dev/null is a character device).
    let r = call(
        &mut files,
        Request::OpenRead {
            path: "/dev/null".into(),
            user: User::Root,
        },
    );
    assert_eq!(err_kind(r), ErrorKind::InvalidArgument);
    // Stat describes a FIFO as Other.
    assert_eq!(stat(&mut files, &t.join("pipe")).file_type, FileType::Other);
    assert!(stat(&mut files, &t.join("pipe"))
        .permissions
        .starts_with('p'));
}

#[test]
fn handle_limit() {
    let t = TempDir::new("handles");
    let mut files = Files::new();
    fs::write(t.path().join("f"), b"x").unwrap();
    let open = |files: &mut Files| {
        call(
            files,
            Request::OpenRead {
                path: t.join("f"),
                user: User::Root,
            },
        )
    };
    let mut handles = Vec::new();
    for _ in 0..MAX_HANDLES {
        match open(&mut files) {
            Ok(Reply::Opened { handle, .. }) => handles.push(handle),
            other => panic!("{other:?}"),
        }
    }
    let mut sorted = handles.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), MAX_HANDLES, "distinct ids");
    assert_eq!(err_kind(open(&mut files)), ErrorKind::ResourceExhausted);
    let write = call(
        &mut files,
        Request::OpenWrite {
            path: t.join("g"),
            user: User::Root,
            metadata: vec![],
        },
    );
    assert_eq!(err_kind(write), ErrorKind::ResourceExhausted);
    assert!(!t.path().join("g").exists());
    close(&mut files, handles[0]);
    assert!(matches!(open(&mut files), Ok(Reply::Opened { .. })));
}

#[test]
fn disk_and_other_requests() {
    let mut files = Files::new();
    match files.handle(&Request::Disk) {
        Ok(Reply::Disk { used, total }) => {
            assert!(total > 0);
            assert!(used <= total);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err_kind(files.handle(&Request::List)),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        err_kind(files.handle(&Request::Env)),
        ErrorKind::InvalidArgument
    );
}

/// Writing where the disk is full is a NoSpace error (checked through /dev/full's ENOSPC
/// on the write path the handles use).
#[test]
fn no_space_from_a_full_device() {
    let mut full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let e = full.write_all(b"x").expect_err("/dev/full is full");
    let err = super::io_error("write", Path::new("/f"), &e);
    assert_eq!(err.kind, ErrorKind::NoSpace);
}
