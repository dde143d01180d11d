//! copy_in tests against a real fake sandbox root (run as root: they chown).

use std::fs;
use std::os::fd::AsFd;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

use super::tests::{mkfifo, mode_of, names, open_root, write, TempDir};
use super::*;

const OWNER: (u32, u32) = (1234, 5678);

fn cp_in(src: &Path, root: &TempDir, dest: &str) -> Result<CopyReport, TransferError> {
    copy_in(src, open_root(&root.0).as_fd(), Path::new(dest), OWNER)
}

fn owner_of(path: &Path) -> (u32, u32) {
    let meta = fs::symlink_metadata(path).unwrap();
    (meta.uid(), meta.gid())
}

#[test]
fn file_creates_parents_with_owner_and_modes() {
    let (host, root) = (TempDir::new("host"), TempDir::new("root"));
    write(&host.join("f.txt"), b"payload", 0o4750);

    let report = cp_in(&host.join("f.txt"), &root, "/home/u/data/f.txt").unwrap();

    assert_eq!(
        report,
        CopyReport {
            files: 1,
            dirs: 0,
            bytes: 7,
            skipped: vec![],
            skipped_more: 0,
            manifest: vec![],
        }
    );
    let file = root.join("home/u/data/f.txt");
    assert_eq!(fs::read(&file).unwrap(), b"payload");
    assert_eq!(mode_of(&file), 0o750, "setuid must be dropped");
    assert_eq!(owner_of(&file), OWNER);
    for dir in ["home", "home/u", "home/u/data"] {
        assert_eq!(owner_of(&root.join(dir)), OWNER, "{dir}");
        assert_eq!(mode_of(&root.join(dir)), 0o755, "{dir}");
    }
}

#[test]
fn file_into_existing_directory_keeps_its_basename() {
    let (host, root) = (TempDir::new("host"), TempDir::new("root"));
    write(&host.join("f.txt"), b"payload", 0o644);
    fs::create_dir(root.join("tmp")).unwrap();

    cp_in(&host.join("f.txt"), &root, "/tmp").unwrap();

    assert_eq!(fs::read(root.join("tmp/f.txt")).unwrap(), b"payload");
    assert_eq!(owner_of(&root.join("tmp/f.txt")), OWNER);
    assert_eq!(
        owner_of(&root.join("tmp")),
        (0, 0),
        "existing directories are left alone"
    );
}

#[test]
fn tree_copies_symlinks_as_symlinks_and_skips_fifos() {
    let (host, root) = (TempDir::new("host"), TempDir::new("root"));
    let src = host.join("tree");
    write(&src.join("a.txt"), b"a", 0o600);
    write(&src.join("sub/b.txt"), b"bb", 0o644);
    symlink("../a.txt", src.join("sub/link")).unwrap();
    symlink("/etc/passwd", src.join("abs")).unwrap();
    mkfifo(&src.join("pipe"));

    let report = cp_in(&src, &root, "/dst").unwrap();

    let skipped = vec![Skipped {
        path: "pipe".into(),
        kind: SkipKind::Fifo,
    }];
    assert_eq!(
        report,
        CopyReport {
            files: 4,
            dirs: 2,
            bytes: 3,
            skipped,
            skipped_more: 0,
            manifest: vec![],
        }
    );
    assert_eq!(fs::read(root.join("dst/sub/b.txt")).unwrap(), b"bb");
    assert_eq!(mode_of(&root.join("dst/a.txt")), 0o600);
    assert_eq!(
        fs::read_link(root.join("dst/sub/link")).unwrap(),
        Path::new("../a.txt")
    );
    assert_eq!(
        fs::read_link(root.join("dst/abs")).unwrap(),
        Path::new("/etc/passwd")
    );
    for entry in ["dst", "dst/sub", "dst/a.txt", "dst/sub/link", "dst/abs"] {
        assert_eq!(owner_of(&root.join(entry)), OWNER, "{entry}");
    }
    assert_eq!(names(&root.0), ["dst"], "no link was followed");
}

#[test]
fn sandbox_symlink_cannot_redirect_the_copy_out_of_the_root() {
    let (host, root, outside) = (
        TempDir::new("host"),
        TempDir::new("root"),
        TempDir::new("outside"),
    );
    write(&host.join("evil"), b"evil", 0o644);
    write(&host.join("tree/x/evil"), b"evil", 0o644);
    symlink(&outside.0, root.join("etc")).unwrap();
    symlink("/host-etc-outside-root", root.join("etc2")).unwrap();
    fs::create_dir(root.join("data")).unwrap();
    symlink(&outside.0, root.join("data/x")).unwrap();

    let attempts = [
        ("evil", "/etc/evil", "/etc"),
        ("evil", "/etc2/evil", "/etc2"),
        ("tree", "/etc/t", "/etc"),
    ];
    for (src, dest, link) in attempts {
        match cp_in(&host.join(src), &root, dest) {
            Err(TransferError::Symlink { path }) => assert_eq!(path, Path::new(link)),
            other => panic!("{dest}: expected a symlink refusal, got {other:?}"),
        }
    }
    // A link met while walking the tree (tree/x vs data/x) is refused too.
    let err = cp_in(&host.join("tree"), &root, "/data").unwrap_err();
    assert!(
        matches!(&err, TransferError::Symlink { path } if path == Path::new("/data/x")),
        "{err:?}"
    );

    assert!(
        names(&outside.0).is_empty(),
        "nothing may land outside the root"
    );
    assert!(!Path::new("/host-etc-outside-root").exists());
    assert_eq!(names(&root.0), ["data", "etc", "etc2"]);
}

#[test]
fn symlink_at_dest_is_replaced_not_written_through() {
    let (host, root, other) = (
        TempDir::new("host"),
        TempDir::new("root"),
        TempDir::new("victim"),
    );
    write(&host.join("f"), b"payload", 0o644);
    write(&other.join("victim"), b"original", 0o644);
    fs::create_dir(root.join("tmp")).unwrap();
    symlink(other.join("victim"), root.join("tmp/target")).unwrap();

    cp_in(&host.join("f"), &root, "/tmp/target").unwrap();

    assert_eq!(fs::read(other.join("victim")).unwrap(), b"original");
    let meta = fs::symlink_metadata(root.join("tmp/target")).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(fs::read(root.join("tmp/target")).unwrap(), b"payload");
}

#[test]
fn file_where_a_parent_directory_must_go_is_an_error() {
    let (host, root) = (TempDir::new("host"), TempDir::new("root"));
    write(&host.join("f"), b"payload", 0o644);
    write(&root.join("x"), b"file", 0o644);
    let err = cp_in(&host.join("f"), &root, "/x/y").unwrap_err();
    assert!(
        matches!(&err, TransferError::NotADirectory { side: Side::Sandbox, path } if path == Path::new("/x"))
    );
    assert!(err.to_string().contains("sandbox path /x"), "{err}");
}

#[test]
fn special_file_src_is_refused_and_root_dest_works() {
    let (host, root) = (TempDir::new("host"), TempDir::new("root"));
    mkfifo(&host.join("pipe"));
    let err = cp_in(&host.join("pipe"), &root, "/p").unwrap_err();
    assert!(
        matches!(err, TransferError::Unsupported { kind: "fifo", .. }),
        "{err:?}"
    );

    write(&host.join("f"), b"payload", 0o644);
    cp_in(&host.join("f"), &root, "/").unwrap();
    assert_eq!(names(&root.0), ["f"]);
}
