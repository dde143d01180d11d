use super::*;

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::sync::Arc;

/// A state directory under /tmp, removed on drop (even when the test fails), team file
/// systems mounted in it unmounted first.
pub(super) struct State(pub PathBuf);

impl State {
    pub fn new(tag: &str) -> State {
        let p = std::env::temp_dir().join(format!("husk-ws-{tag}-{:016x}", random()));
        fs::create_dir_all(&p).unwrap();
        State(p)
    }

    /// A workspace on disk, for planting what a sandbox could leave.
    fn ws(&self, team: &str, name: &str) -> PathBuf {
        self.0.join(WORKSPACES_DIR).join(team).join(name)
    }
}

impl Drop for State {
    fn drop(&mut self) {
        unmount_beneath(&self.0);
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(super) use husk_runtime::mountinfo::{mounts_beneath, unmount_beneath};

fn setup(tag: &str) -> (State, Workspaces) {
    let state = State::new(tag);
    let ws = Workspaces::open(&state.0).unwrap();
    ws.create("acme", "data").unwrap();
    (state, ws)
}

/// Names at a workspace's root, as the host sees them.
fn root_names(state: &State) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(state.ws("acme", "data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn paths(listing: &Listing) -> Vec<(&str, EntryKind)> {
    listing
        .entries
        .iter()
        .map(|e| (e.path.as_str(), e.kind))
        .collect()
}

fn read_all(mut f: File) -> Vec<u8> {
    let mut v = Vec::new();
    f.read_to_end(&mut v).unwrap();
    v
}

/// A host directory outside the state directory, with a file whose content must survive.
struct HostDir(PathBuf);

impl HostDir {
    fn new() -> HostDir {
        let p = std::env::temp_dir().join(format!("husk-ws-host-{:016x}", random()));
        fs::create_dir_all(&p).unwrap();
        fs::write(p.join("secret"), b"host data").unwrap();
        HostDir(p)
    }

    fn intact(&self) {
        assert_eq!(fs::read(self.0.join("secret")).unwrap(), b"host data");
        let names: Vec<_> = fs::read_dir(&self.0).unwrap().collect();
        assert_eq!(
            names.len(),
            1,
            "something was written into the host directory"
        );
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// One raw tar entry: any path bytes (`..`, absolute), as a hostile client would send.
fn raw_entry(out: &mut Vec<u8>, path: &[u8], kind: tar::EntryType, data: &[u8], link: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    if !link.is_empty() {
        h.set_link_name_literal(link).unwrap();
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn raw_end(out: &mut Vec<u8>) {
    out.extend_from_slice(&[0; 1024]);
}

/// A well-formed archive built with the tar crate: (path, mode, content or symlink target).
fn archive(entries: &[(&str, u32, &[u8])], symlinks: &[(&str, &str)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, mode, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, path, *data).unwrap();
    }
    for (path, target) in symlinks {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_size(0);
        b.append_link(&mut h, path, target).unwrap();
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[test]
fn names_are_validated() {
    for ok in ["data", "a", "A.b_c-1", "x.", &"n".repeat(64)] {
        assert!(validate_name(ok).is_ok(), "{ok}");
    }
    for bad in [
        "",
        ".",
        "..",
        ".x",
        "-x",
        "a/b",
        "a b",
        "ü",
        "a\0b",
        &"n".repeat(65),
    ] {
        assert!(
            matches!(validate_name(bad), Err(WorkspaceError::InvalidName(_))),
            "{bad:?}"
        );
    }
    let state = State::new("names");
    let ws = Workspaces::open(&state.0).unwrap();
    assert!(matches!(
        ws.create("acme", "../x"),
        Err(WorkspaceError::InvalidName(_))
    ));
    assert!(matches!(
        ws.create("Bad Team", "x"),
        Err(WorkspaceError::InvalidTeam(_))
    ));
    assert!(matches!(
        ws.create("../x", "x"),
        Err(WorkspaceError::InvalidTeam(_))
    ));
    let msg = ws.create("acme", ".hidden").unwrap_err().to_string();
    assert!(msg.contains("\".hidden\""), "{msg}");
}

#[test]
fn workspaces_are_created_listed_and_deleted_per_team() {
    let state = State::new("crud");
    let ws = Workspaces::open(&state.0).unwrap();
    let top = state.0.join(WORKSPACES_DIR);
    assert_eq!(fs::metadata(&top).unwrap().mode() & 0o777, 0o700);
    let info = ws.create("acme", "data").unwrap();
    assert_eq!(
        (info.name.as_str(), info.size_bytes, info.files),
        ("data", 0, 0)
    );
    let age = OffsetDateTime::now_utc() - info.created_at;
    assert!(age.whole_seconds().abs() < 60, "{:?}", info.created_at);
    ws.create("acme", "b-other").unwrap();
    let meta = fs::metadata(state.ws("acme", "data")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), WORKSPACE_OWNER);
    assert_eq!(meta.mode() & 0o7777, 0o755);
    assert_eq!(
        fs::metadata(top.join("acme")).unwrap().mode() & 0o777,
        0o700
    );
    assert_eq!(ws.dir("acme", "data").unwrap(), state.ws("acme", "data"));
    assert!(matches!(
        ws.create("acme", "data"),
        Err(WorkspaceError::AlreadyExists(n)) if n == "data"
    ));
    let names: Vec<_> = ws
        .list("acme")
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(names, ["b-other", "data"]);
    // Another team sees nothing of it.
    assert!(ws.list("other").unwrap().is_empty());
    for r in [
        ws.info("other", "data").map(|_| ()),
        ws.dir("other", "data").map(|_| ()),
        ws.delete("other", "data"),
        ws.write_file("other", "data", "f", &b"x"[..], 10)
            .map(|_| ()),
    ] {
        assert!(matches!(r, Err(WorkspaceError::NotFound(_))), "{r:?}");
    }
    ws.delete("acme", "data").unwrap();
    assert!(matches!(
        ws.delete("acme", "data"),
        Err(WorkspaceError::NotFound(_))
    ));
    assert!(matches!(
        ws.dir("acme", "data"),
        Err(WorkspaceError::NotFound(_))
    ));
    let left: Vec<_> = fs::read_dir(top.join("acme"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["b-other"], "trash left behind");
    // The name can be used again, afresh.
    ws.create("acme", "data").unwrap();
}

#[test]
fn files_are_written_read_listed_and_removed() {
    let (state, ws) = setup("files");
    let r = ws
        .write_file("acme", "data", "a/b/c.txt", &b"hello"[..], 100)
        .unwrap();
    assert_eq!(
        r,
        WriteReport {
            bytes: 5,
            created: true
        }
    );
    let root = state.ws("acme", "data");
    for (p, mode) in [("a", 0o755), ("a/b", 0o755), ("a/b/c.txt", 0o644)] {
        let m = fs::symlink_metadata(root.join(p)).unwrap();
        assert_eq!((m.uid(), m.gid()), WORKSPACE_OWNER, "{p}");
        assert_eq!(m.mode() & 0o7777, mode, "{p}");
    }
    assert_eq!(
        read_all(ws.read_file("acme", "data", "a/b/c.txt").unwrap()),
        b"hello"
    );
    // Leading `./` and doubled slashes are the same path.
    assert_eq!(
        read_all(ws.read_file("acme", "data", "./a//b/c.txt").unwrap()),
        b"hello"
    );
    let r = ws
        .write_file("acme", "data", "a/b/c.txt", &b"bye"[..], 100)
        .unwrap();
    assert_eq!(
        r,
        WriteReport {
            bytes: 3,
            created: false
        }
    );
    assert_eq!(fs::read(root.join("a/b/c.txt")).unwrap(), b"bye");
    ws.write_file("acme", "data", "top", &b"0123456789"[..], 100)
        .unwrap();
    let info = ws.info("acme", "data").unwrap();
    assert_eq!((info.size_bytes, info.files), (13, 2));

    let one = ws.entries("acme", "data", "", 1).unwrap();
    assert_eq!(
        paths(&one),
        [("a", EntryKind::Dir), ("top", EntryKind::File)]
    );
    assert!(!one.truncated);
    let all = ws.entries("acme", "data", "", 10).unwrap();
    assert_eq!(
        paths(&all),
        [
            ("a", EntryKind::Dir),
            ("a/b", EntryKind::Dir),
            ("a/b/c.txt", EntryKind::File),
            ("top", EntryKind::File)
        ]
    );
    let file = &all.entries[2];
    assert_eq!(
        (file.name.as_str(), file.size, file.mode),
        ("c.txt", 3, 0o644)
    );
    let sub = ws.entries("acme", "data", "a", 1).unwrap();
    assert_eq!(paths(&sub), [("a/b", EntryKind::Dir)]);
    // A file lists as itself.
    let itself = ws.entries("acme", "data", "top", 1).unwrap();
    assert_eq!(paths(&itself), [("top", EntryKind::File)]);
    assert_eq!(ws.stat("acme", "data", "a").unwrap().kind, EntryKind::Dir);
    assert_eq!(ws.stat("acme", "data", "").unwrap().kind, EntryKind::Dir);

    // Wrong kinds and missing paths: clear errors naming the path.
    let e = ws.read_file("acme", "data", "a").unwrap_err();
    assert!(
        matches!(
            &e,
            WorkspaceError::NotAFile {
                kind: "directory",
                ..
            }
        ),
        "{e:?}"
    );
    let e = ws.read_file("acme", "data", "nope/x").unwrap_err();
    assert!(matches!(&e, WorkspaceError::PathNotFound { .. }), "{e:?}");
    assert!(e.to_string().contains("\"nope\""), "{e}");
    let e = ws
        .write_file("acme", "data", "a/b", &b"x"[..], 10)
        .unwrap_err();
    assert!(matches!(&e, WorkspaceError::NotAFile { .. }), "{e:?}");
    let e = ws
        .write_file("acme", "data", "top/x", &b"x"[..], 10)
        .unwrap_err();
    assert!(matches!(&e, WorkspaceError::NotADirectory { .. }), "{e:?}");
    assert!(matches!(
        ws.remove("acme", "data", ""),
        Err(WorkspaceError::InvalidPath { .. })
    ));

    ws.remove("acme", "data", "top").unwrap();
    ws.remove("acme", "data", "a").unwrap();
    assert!(matches!(
        ws.remove("acme", "data", "a"),
        Err(WorkspaceError::PathNotFound { .. })
    ));
    assert!(root_names(&state).is_empty(), "{:?}", root_names(&state));
}

#[test]
fn an_oversized_upload_leaves_nothing_behind() {
    let (state, ws) = setup("too-large");
    let e = ws
        .write_file("acme", "data", "new/dir/big", &[7u8; 11][..], 10)
        .unwrap_err();
    assert!(
        matches!(e, WorkspaceError::TooLarge { limit: 10, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("10 bytes"), "{e}");
    assert!(root_names(&state).is_empty(), "{:?}", root_names(&state));
    // Exactly at the limit is fine.
    ws.write_file("acme", "data", "new/ok", &[7u8; 10][..], 10)
        .unwrap();
}

#[test]
fn paths_that_escape_are_refused() {
    let (state, ws) = setup("escape");
    ws.write_file("acme", "data", "d/f", &b"x"[..], 10).unwrap();
    for bad in ["../x", "/etc/passwd", "d/../../x", "..", "a/\0b"] {
        let results = [
            ws.read_file("acme", "data", bad).map(|_| ()),
            ws.write_file("acme", "data", bad, &b"x"[..], 10)
                .map(|_| ()),
            ws.remove("acme", "data", bad),
            ws.entries("acme", "data", bad, 1).map(|_| ()),
            ws.stat("acme", "data", bad).map(|_| ()),
            ws.export_tar("acme", "data", bad, Vec::new()).map(|_| ()),
            ws.import_tar(
                "acme",
                "data",
                bad,
                &archive(&[], &[])[..],
                ImportLimits::default(),
            )
            .map(|_| ()),
        ];
        for r in results {
            assert!(
                matches!(r, Err(WorkspaceError::InvalidPath { .. })),
                "{bad:?}: {r:?}"
            );
        }
    }
    assert!(!state.0.join(WORKSPACES_DIR).join("acme").join("x").exists());
    assert_eq!(
        fs::read(state.ws("acme", "data").join("d/f")).unwrap(),
        b"x"
    );
}

#[test]
fn planted_symlinks_are_never_followed() {
    let (state, ws) = setup("symlinks");
    let host = HostDir::new();
    let root = state.ws("acme", "data");
    symlink(&host.0, root.join("dirlink")).unwrap();
    symlink(host.0.join("secret"), root.join("filelink")).unwrap();
    symlink("/etc", root.join("etc")).unwrap();
    fs::create_dir(root.join("d")).unwrap();
    symlink(&host.0, root.join("d/inner")).unwrap();

    // Read: neither the link nor through it.
    let e = ws.read_file("acme", "data", "filelink").unwrap_err();
    assert!(
        matches!(
            &e,
            WorkspaceError::NotAFile {
                kind: "symlink",
                ..
            }
        ),
        "{e:?}"
    );
    for through in ["dirlink/secret", "etc/passwd", "d/inner/secret"] {
        let e = ws.read_file("acme", "data", through).unwrap_err();
        assert!(
            matches!(&e, WorkspaceError::InvalidPath { .. }),
            "{through}: {e:?}"
        );
        assert!(e.to_string().contains("symlink"), "{e}");
    }
    // Write: never through a link; a link at the path itself is replaced, not written through.
    for through in [
        "dirlink/new",
        "dirlink/secret",
        "etc/husk-test",
        "d/inner/x/y",
    ] {
        let e = ws
            .write_file("acme", "data", through, &b"evil"[..], 10)
            .unwrap_err();
        assert!(
            matches!(&e, WorkspaceError::InvalidPath { .. }),
            "{through}: {e:?}"
        );
    }
    assert!(!Path::new("/etc/husk-test").exists());
    ws.write_file("acme", "data", "filelink", &b"mine"[..], 10)
        .unwrap();
    host.intact();
    assert!(fs::symlink_metadata(root.join("filelink"))
        .unwrap()
        .is_file());
    assert_eq!(fs::read(root.join("filelink")).unwrap(), b"mine");

    // List: links are links, with their target, never listed through.
    let all = ws.entries("acme", "data", "", 5).unwrap();
    let link = all.entries.iter().find(|e| e.path == "dirlink").unwrap();
    assert_eq!(link.kind, EntryKind::Symlink);
    assert_eq!(link.target.as_deref(), Some(host.0.to_str().unwrap()));
    assert!(!all
        .entries
        .iter()
        .any(|e| e.name == "secret" || e.name == "passwd"));
    let itself = ws.entries("acme", "data", "etc", 3).unwrap();
    assert_eq!(paths(&itself), [("etc", EntryKind::Symlink)]);
    assert!(matches!(
        ws.entries("acme", "data", "etc/ssl", 1),
        Err(WorkspaceError::InvalidPath { .. })
    ));

    // Export: links as symlink entries, nothing of what they point to.
    let mut tar = Vec::new();
    let report = ws.export_tar("acme", "data", "", &mut tar).unwrap();
    assert_eq!(report.symlinks, 3);
    let mut a = tar::Archive::new(&tar[..]);
    for entry in a.entries().unwrap() {
        let entry = entry.unwrap();
        let path = entry.path().unwrap().into_owned();
        if path.ends_with("dirlink") || path.ends_with("etc") || path.ends_with("inner") {
            assert_eq!(
                entry.header().entry_type(),
                tar::EntryType::Symlink,
                "{path:?}"
            );
        }
    }
    assert!(
        !tar.windows(9).any(|w| w == b"host data"),
        "a host file was exported"
    );
    assert!(
        !tar.windows(5).any(|w| w == b"root:"),
        "/etc/passwd was exported"
    );
    // Exporting the link itself: one symlink entry.
    let mut one = Vec::new();
    let r = ws.export_tar("acme", "data", "dirlink", &mut one).unwrap();
    assert_eq!((r.symlinks, r.files, r.dirs), (1, 0, 0));
    assert!(matches!(
        ws.export_tar("acme", "data", "dirlink/secret", Vec::new()),
        Err(WorkspaceError::InvalidPath { .. })
    ));

    // Remove: the link goes, its target stays; a tree holding links is removed around them.
    ws.remove("acme", "data", "dirlink").unwrap();
    ws.remove("acme", "data", "d").unwrap();
    assert!(matches!(
        ws.remove("acme", "data", "etc/passwd"),
        Err(WorkspaceError::InvalidPath { .. })
    ));
    host.intact();
    assert!(Path::new("/etc/passwd").exists());
    // Deleting the workspace leaves the targets alone too.
    ws.delete("acme", "data").unwrap();
    host.intact();
    assert!(Path::new("/etc/passwd").exists());
}

#[test]
fn special_files_are_never_opened() {
    let (state, ws) = setup("special");
    let root = state.ws("acme", "data");
    let status = std::process::Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(status.success());
    // Each of these would block forever if the fifo were opened for reading.
    let e = ws.read_file("acme", "data", "fifo").unwrap_err();
    assert!(
        matches!(&e, WorkspaceError::NotAFile { kind: "fifo", .. }),
        "{e:?}"
    );
    let listed = ws.entries("acme", "data", "", 1).unwrap();
    assert_eq!(paths(&listed), [("fifo", EntryKind::Other)]);
    let r = ws.export_tar("acme", "data", "", Vec::new()).unwrap();
    assert_eq!((r.skipped, r.files), (1, 0));
    assert!(matches!(
        ws.export_tar("acme", "data", "fifo", Vec::new()),
        Err(WorkspaceError::NotAFile { kind: "fifo", .. })
    ));
    ws.write_file("acme", "data", "fifo", &b"x"[..], 10)
        .unwrap();
    assert!(fs::symlink_metadata(root.join("fifo")).unwrap().is_file());
}

#[test]
fn archives_unpack_with_owners_modes_and_symlinks() {
    let (state, ws) = setup("import");
    let tar = archive(
        &[
            ("bin/run.sh", 0o4777, b"#!/bin/sh\necho hi\n"),
            ("data/a.txt", 0o600, b"alpha"),
            ("data/deep/b.txt", 0o644, b"beta"),
            (&format!("long/{}", "n".repeat(150)), 0o644, b"long name"),
        ],
        &[("data/link", "/etc/passwd"), ("rel", "../outside")],
    );
    for (dest, input) in [("", tar.clone()), ("sub/dir", gzip(&tar))] {
        let r = ws
            .import_tar("acme", "data", dest, &input[..], ImportLimits::default())
            .unwrap();
        assert_eq!((r.files, r.symlinks, r.skipped), (4, 2, 0), "{dest}");
        assert_eq!(r.bytes, 18 + 5 + 4 + 9);
        let base = state.ws("acme", "data").join(dest);
        assert_eq!(fs::read(base.join("data/deep/b.txt")).unwrap(), b"beta");
        let run = fs::metadata(base.join("bin/run.sh")).unwrap();
        assert_eq!(run.mode() & 0o7777, 0o755, "exec bit kept, set-id dropped");
        assert_eq!((run.uid(), run.gid()), WORKSPACE_OWNER);
        let a = fs::metadata(base.join("data/a.txt")).unwrap();
        assert_eq!(a.mode() & 0o7777, 0o644);
        let d = fs::metadata(base.join("data/deep")).unwrap();
        assert_eq!((d.mode() & 0o7777, d.uid()), (0o755, WORKSPACE_OWNER.0));
        let link = fs::symlink_metadata(base.join("data/link")).unwrap();
        assert!(link.file_type().is_symlink());
        assert_eq!(link.uid(), WORKSPACE_OWNER.0);
        assert_eq!(
            fs::read_link(base.join("rel")).unwrap(),
            Path::new("../outside")
        );
        assert_eq!(
            fs::read(base.join("long").join("n".repeat(150))).unwrap(),
            b"long name"
        );
    }
    let names = root_names(&state);
    assert_eq!(
        names,
        ["bin", "data", "long", "rel", "sub"],
        "leftovers: {names:?}"
    );
}

#[test]
fn hostile_archives_are_refused_and_leave_nothing() {
    let (state, ws) = setup("hostile");
    let host = HostDir::new();
    let outside = state.0.join(WORKSPACES_DIR).join("acme").join("x");
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    let mut t = Vec::new();
    raw_entry(&mut t, b"ok", tar::EntryType::Regular, b"fine", b"");
    raw_entry(&mut t, b"../x", tar::EntryType::Regular, b"evil", b"");
    raw_end(&mut t);
    cases.push(("`..`", t));
    let mut t = Vec::new();
    raw_entry(
        &mut t,
        b"ok/a/../../../x",
        tar::EntryType::Regular,
        b"evil",
        b"",
    );
    raw_end(&mut t);
    cases.push(("`..`", t));
    let mut t = Vec::new();
    raw_entry(
        &mut t,
        b"/tmp/husk-evil",
        tar::EntryType::Regular,
        b"evil",
        b"",
    );
    raw_end(&mut t);
    cases.push(("absolute", t));
    let mut t = Vec::new();
    let target = host.0.as_os_str().as_bytes();
    raw_entry(&mut t, b"l", tar::EntryType::Symlink, b"", target);
    raw_entry(&mut t, b"l/secret", tar::EntryType::Regular, b"evil", b"");
    raw_end(&mut t);
    cases.push(("symlink", t));
    let mut t = Vec::new();
    raw_entry(&mut t, b"l", tar::EntryType::Symlink, b"", target);
    raw_entry(&mut t, b"l/", tar::EntryType::Directory, b"", b"");
    raw_end(&mut t);
    cases.push(("symlink", t));
    let mut t = Vec::new();
    raw_entry(&mut t, b"f", tar::EntryType::Regular, b"x", b"");
    raw_entry(&mut t, b"f/g", tar::EntryType::Regular, b"x", b"");
    raw_end(&mut t);
    cases.push(("not a directory", t));
    let mut t = Vec::new();
    raw_entry(&mut t, b"f", tar::EntryType::Regular, b"truncated", b"");
    t.truncate(600);
    cases.push(("cannot read", t));
    cases.push((
        "cannot read",
        b"this is not a tar archive at all".repeat(20),
    ));
    for (why, tar) in cases {
        for input in [tar.clone(), gzip(&tar)] {
            let e = ws
                .import_tar("acme", "data", "", &input[..], ImportLimits::default())
                .unwrap_err();
            assert!(
                matches!(&e, WorkspaceError::BadArchive { .. }),
                "{why}: {e:?}"
            );
            assert!(e.to_string().contains(why), "{why}: {e}");
            assert!(
                root_names(&state).is_empty(),
                "{why}: {:?}",
                root_names(&state)
            );
            assert!(!outside.exists() && !Path::new("/tmp/husk-evil").exists());
            host.intact();
        }
    }
    // Hard links, devices and fifos are skipped and counted; the rest is unpacked.
    let mut t = Vec::new();
    raw_entry(&mut t, b"real", tar::EntryType::Regular, b"data", b"");
    raw_entry(&mut t, b"hard", tar::EntryType::Link, b"", b"/etc/shadow");
    raw_entry(&mut t, b"hard2", tar::EntryType::Link, b"", b"real");
    raw_entry(&mut t, b"dev", tar::EntryType::Char, b"", b"");
    raw_entry(&mut t, b"blk", tar::EntryType::Block, b"", b"");
    raw_entry(&mut t, b"fifo", tar::EntryType::Fifo, b"", b"");
    raw_end(&mut t);
    let r = ws
        .import_tar("acme", "data", "", &t[..], ImportLimits::default())
        .unwrap();
    assert_eq!((r.files, r.skipped), (1, 5));
    assert_eq!(root_names(&state), ["real"]);
}

#[test]
fn import_limits_leave_nothing_behind() {
    let (state, ws) = setup("limits");
    let tar = archive(
        &[
            ("a", 0o644, &[1; 60]),
            ("b/c", 0o644, &[2; 60]),
            ("d", 0o644, b""),
        ],
        &[],
    );
    let bytes = ImportLimits {
        max_bytes: 100,
        max_entries: 100,
    };
    for input in [tar.clone(), gzip(&tar)] {
        let e = ws
            .import_tar("acme", "data", "", &input[..], bytes)
            .unwrap_err();
        assert!(
            matches!(e, WorkspaceError::TooLarge { limit: 100, .. }),
            "{e:?}"
        );
        assert!(root_names(&state).is_empty(), "{:?}", root_names(&state));
    }
    let entries = ImportLimits {
        max_bytes: 1000,
        max_entries: 2,
    };
    let e = ws
        .import_tar("acme", "data", "new", &tar[..], entries)
        .unwrap_err();
    assert!(
        matches!(e, WorkspaceError::TooManyEntries { limit: 2, .. }),
        "{e:?}"
    );
    assert!(root_names(&state).is_empty(), "{:?}", root_names(&state));
    // A gzip bomb of zeros ends as an archive (zero blocks), bounded either way.
    let bomb = gzip(&vec![0u8; 8 << 20]);
    let r = ws.import_tar("acme", "data", "", &bomb[..], bytes).unwrap();
    assert_eq!(r, TarReport::default());
    // An entry claiming more than the limit is refused before its data is read.
    let mut t = Vec::new();
    let mut h = tar::Header::new_gnu();
    h.set_path("huge").unwrap();
    h.set_size(1 << 40);
    h.set_cksum();
    t.extend_from_slice(h.as_bytes());
    let e = ws
        .import_tar("acme", "data", "", &t[..], bytes)
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::TooLarge { .. }), "{e:?}");
    assert!(root_names(&state).is_empty());
}

#[test]
fn imports_merge_into_existing_directories() {
    let (state, ws) = setup("merge");
    ws.write_file("acme", "data", "d/keep", &b"kept"[..], 10)
        .unwrap();
    ws.write_file("acme", "data", "d/a", &b"old"[..], 10)
        .unwrap();
    ws.write_file("acme", "data", "d/x/file", &b"old"[..], 10)
        .unwrap();
    ws.write_file("acme", "data", "d/was-file", &b"old"[..], 10)
        .unwrap();
    let tar = archive(
        &[
            ("a", 0o644, b"new"),
            ("b", 0o644, b"added"),
            ("x/other", 0o644, b"added"),
            ("was-file/inside", 0o644, b"dir now"),
        ],
        &[],
    );
    ws.import_tar("acme", "data", "d", &tar[..], ImportLimits::default())
        .unwrap();
    let d = state.ws("acme", "data").join("d");
    assert_eq!(fs::read(d.join("keep")).unwrap(), b"kept");
    assert_eq!(fs::read(d.join("a")).unwrap(), b"new");
    assert_eq!(fs::read(d.join("b")).unwrap(), b"added");
    assert_eq!(fs::read(d.join("x/file")).unwrap(), b"old");
    assert_eq!(fs::read(d.join("x/other")).unwrap(), b"added");
    assert_eq!(fs::read(d.join("was-file/inside")).unwrap(), b"dir now");
    // A file of the archive where the workspace has a directory: refused, nothing changed.
    let tar = archive(
        &[("new", 0o644, b"n"), ("x", 0o644, b"file over a dir")],
        &[],
    );
    let e = ws
        .import_tar("acme", "data", "d", &tar[..], ImportLimits::default())
        .unwrap_err();
    assert!(matches!(&e, WorkspaceError::Conflict { .. }), "{e:?}");
    assert!(e.to_string().contains("\"d/x\" is a directory"), "{e}");
    assert!(!d.join("new").exists());
    assert_eq!(root_names(&state), ["d"]);
    // Into a file: refused before reading.
    let e = ws
        .import_tar("acme", "data", "d/a", &tar[..], ImportLimits::default())
        .unwrap_err();
    assert!(matches!(&e, WorkspaceError::NotADirectory { .. }), "{e:?}");
}

#[test]
fn export_and_import_round_trip() {
    let (state, ws) = setup("round-trip");
    ws.create("acme", "copy").unwrap();
    let root = state.ws("acme", "data");
    ws.write_file("acme", "data", "src/main.rs", &b"fn main() {}"[..], 100)
        .unwrap();
    ws.write_file("acme", "data", "src/empty", &b""[..], 100)
        .unwrap();
    ws.write_file("acme", "data", "run", &b"#!/bin/sh"[..], 100)
        .unwrap();
    fs::set_permissions(root.join("run"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(root.join("empty-dir")).unwrap();
    symlink("src/main.rs", root.join("link")).unwrap();
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    ws.write_file("acme", "data", "big.bin", &big[..], 1 << 20)
        .unwrap();
    let mut tar = Vec::new();
    let out = ws.export_tar("acme", "data", "", &mut tar).unwrap();
    assert_eq!((out.files, out.dirs, out.symlinks), (4, 2, 1));
    let back = ws
        .import_tar("acme", "copy", "", &tar[..], ImportLimits::default())
        .unwrap();
    assert_eq!((back.files, back.symlinks, back.bytes), (4, 1, out.bytes));
    let view = |name: &str| -> BTreeMap<String, (EntryKind, u64, u32, Option<String>)> {
        ws.entries("acme", name, "", 10)
            .unwrap()
            .entries
            .into_iter()
            .map(|e| {
                let mode = if e.kind == EntryKind::Symlink {
                    0
                } else {
                    e.mode
                };
                let size = if e.kind == EntryKind::Dir { 0 } else { e.size };
                (e.path, (e.kind, size, mode, e.target))
            })
            .collect()
    };
    assert_eq!(view("data"), view("copy"));
    assert_eq!(
        read_all(ws.read_file("acme", "copy", "big.bin").unwrap()),
        big
    );
    // A subtree exports relative to itself; a file as one entry of its name.
    let mut sub = Vec::new();
    ws.export_tar("acme", "data", "src", &mut sub).unwrap();
    let names: Vec<String> = tar::Archive::new(&sub[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["empty", "main.rs"]);
    let mut one = Vec::new();
    ws.export_tar("acme", "data", "src/main.rs", &mut one)
        .unwrap();
    let mut a = tar::Archive::new(&one[..]);
    let mut e = a.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(e.path().unwrap(), Path::new("main.rs"));
    let mut body = String::new();
    e.read_to_string(&mut body).unwrap();
    assert_eq!(body, "fn main() {}");
}

#[test]
fn local_directories_round_trip() {
    let src = HostDir::new();
    fs::create_dir(src.0.join("sub")).unwrap();
    fs::write(src.0.join("sub/f"), b"content").unwrap();
    symlink("sub/f", src.0.join("l")).unwrap();
    let mut tar = Vec::new();
    let r = export_local(&src.0, &mut tar).unwrap();
    assert_eq!((r.files, r.dirs, r.symlinks), (2, 1, 1));
    let dst = HostDir::new();
    let r = import_local(&dst.0, &tar[..], ImportLimits::default()).unwrap();
    assert_eq!((r.files, r.symlinks), (2, 1));
    assert_eq!(fs::read(dst.0.join("sub/f")).unwrap(), b"content");
    assert_eq!(fs::read_link(dst.0.join("l")).unwrap(), Path::new("sub/f"));
    let mut names: Vec<_> = fs::read_dir(&dst.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["l", "secret", "sub"]);
}

#[test]
fn deep_trees_are_removed() {
    let (state, ws) = setup("deep");
    // Deeper than any walk holds directories open for; built fd-relative, as a sandbox can.
    let mut dir = File::open(state.ws("acme", "data")).unwrap();
    for i in 0..(MAX_DEPTH * 2 + 7) {
        mkdirat(dir.as_fd(), c"d", 0o755).unwrap();
        dir = tree::open_dir(dir.as_fd(), c"d").unwrap();
        if i % 10 == 0 {
            fs::write(format!("/proc/self/fd/{}/f", dir.as_raw_fd()), b"x").unwrap();
        }
    }
    drop(dir);
    let info = ws.info("acme", "data").unwrap();
    assert!(info.files > 0);
    let e = ws.export_tar("acme", "data", "", Vec::new()).unwrap_err();
    assert!(matches!(e, WorkspaceError::TooDeep { .. }), "{e:?}");
    ws.remove("acme", "data", "d").unwrap();
    assert!(root_names(&state).is_empty(), "{:?}", root_names(&state));
    // And a whole workspace of it.
    let mut dir = File::open(state.ws("acme", "data")).unwrap();
    for _ in 0..(MAX_DEPTH + 50) {
        mkdirat(dir.as_fd(), c"d", 0o755).unwrap();
        dir = tree::open_dir(dir.as_fd(), c"d").unwrap();
    }
    drop(dir);
    ws.delete("acme", "data").unwrap();
    assert!(!state.ws("acme", "data").exists());
    let left: Vec<_> = fs::read_dir(state.0.join(WORKSPACES_DIR).join("acme"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn concurrent_creates_and_deletes_of_one_name() {
    let state = State::new("race");
    let ws = Arc::new(Workspaces::open(&state.0).unwrap());
    for round in 0..5 {
        let run = |op: fn(&Workspaces) -> Result<(), WorkspaceError>| {
            let threads: Vec<_> = (0..8)
                .map(|_| {
                    let ws = ws.clone();
                    std::thread::spawn(move || op(&ws))
                })
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap())
                .collect::<Vec<_>>()
        };
        let created = run(|ws| ws.create("acme", "same").map(|_| ()));
        let ok = created.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: {created:?}");
        assert!(created
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(WorkspaceError::AlreadyExists(_)))));
        ws.write_file("acme", "same", "f", &b"x"[..], 10).unwrap();
        let deleted = run(|ws| ws.delete("acme", "same"));
        let ok = deleted.iter().filter(|r| r.is_ok()).count();
        assert_eq!(ok, 1, "round {round}: {deleted:?}");
        assert!(deleted
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(WorkspaceError::NotFound(_)))));
        assert!(ws.list("acme").unwrap().is_empty());
    }
    let left: Vec<_> = fs::read_dir(state.0.join(WORKSPACES_DIR).join("acme"))
        .unwrap()
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn trash_of_an_interrupted_delete_is_removed_on_open() {
    let state = State::new("trash");
    let team = state.0.join(WORKSPACES_DIR).join("acme");
    fs::create_dir_all(team.join(".trash-0123/a/b")).unwrap();
    fs::write(team.join(".trash-0123/a/b/f"), b"x").unwrap();
    let host = HostDir::new();
    symlink(&host.0, team.join(".trash-0123/a/link")).unwrap();
    let ws = Workspaces::open(&state.0).unwrap();
    assert!(!team.join(".trash-0123").exists());
    host.intact();
    assert!(ws.list("acme").unwrap().is_empty());
}

#[test]
fn directories_are_made_with_owners_and_modes() {
    let (state, ws) = setup("mkdir");
    let none = Attrs::default();
    // Without parents: the parent must exist, and nothing may be there.
    let e = ws
        .make_dir("acme", "data", "a/b", false, &none)
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::PathNotFound { .. }), "{e:?}");
    let made = ws.make_dir("acme", "data", "a", false, &none).unwrap();
    assert_eq!(
        (made.kind, made.mode, made.uid, made.gid),
        (EntryKind::Dir, 0o755, 1000, 1000)
    );
    let e = ws.make_dir("acme", "data", "a", false, &none).unwrap_err();
    assert!(matches!(e, WorkspaceError::Conflict { .. }), "{e:?}");
    // With parents: `mkdir -p`, the client's owner and mode on the last one.
    let attrs = Attrs {
        uid: Some(0),
        gid: Some(1234),
        mode: Some(0o1770),
    };
    let deep = ws.make_dir("acme", "data", "a/x/y", true, &attrs).unwrap();
    assert_eq!(
        (deep.path.as_str(), deep.mode, deep.uid, deep.gid),
        ("a/x/y", 0o1770, 0, 1234)
    );
    let meta = fs::metadata(state.ws("acme", "data").join("a/x/y")).unwrap();
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (0, 1234, 0o1770)
    );
    let again = ws.make_dir("acme", "data", "a/x/y", true, &none).unwrap();
    assert_eq!(again.mode, 0o1770, "an existing directory is left as it is");
    // A file in the way.
    ws.write_file("acme", "data", "f", &b"x"[..], 10).unwrap();
    let e = ws.make_dir("acme", "data", "f", true, &none).unwrap_err();
    assert!(matches!(e, WorkspaceError::NotADirectory { .. }), "{e:?}");
    // Attributes husk never sets.
    for bad in [
        Attrs {
            uid: Some(65_536),
            ..none
        },
        Attrs {
            gid: Some(u32::MAX),
            ..none
        },
        Attrs {
            mode: Some(0o4755),
            ..none
        },
        Attrs {
            mode: Some(0o2755),
            ..none
        },
        Attrs {
            mode: Some(0o10755),
            ..none
        },
    ] {
        let e = ws.make_dir("acme", "data", "bad", false, &bad).unwrap_err();
        assert!(
            matches!(e, WorkspaceError::InvalidPath { .. }),
            "{bad:?}: {e:?}"
        );
    }
    assert!(!state.ws("acme", "data").join("bad").exists());
}

#[test]
fn writes_that_must_not_replace_and_their_attributes() {
    let (state, ws) = setup("writeopts");
    let keep = WriteOptions {
        replace: false,
        attrs: Attrs {
            uid: Some(1001),
            gid: Some(1002),
            mode: Some(0o600),
        },
    };
    ws.write_file_with("acme", "data", "n/f", &b"one"[..], 10, &keep)
        .unwrap();
    let e = ws
        .write_file_with("acme", "data", "n/f", &b"two"[..], 10, &keep)
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::Conflict { .. }), "{e:?}");
    assert!(e.to_string().contains("force"), "{e}");
    let entry = ws.stat("acme", "data", "n/f").unwrap();
    assert_eq!(
        (entry.size, entry.uid, entry.gid, entry.mode),
        (3, 1001, 1002, 0o600)
    );
    // The parent husk made has husk's owner, not the file's.
    let parent = ws.stat("acme", "data", "n").unwrap();
    assert_eq!((parent.uid, parent.mode), (1000, 0o755));
    // Replacing is the default; the default owner and mode come back.
    ws.write_file("acme", "data", "n/f", &b"two"[..], 10)
        .unwrap();
    let entry = ws.stat("acme", "data", "n/f").unwrap();
    assert_eq!((entry.size, entry.uid, entry.mode), (3, 1000, 0o644));
    assert!(entry.ctime >= entry.mtime - time::Duration::seconds(1));
    // Nothing of the refused write is left (no temporary file).
    assert_eq!(root_names(&state), vec!["n".to_string()]);
    let bad = WriteOptions {
        replace: true,
        attrs: Attrs {
            mode: Some(0o4755),
            ..Attrs::default()
        },
    };
    let e = ws
        .write_file_with("acme", "data", "suid", &b"x"[..], 10, &bad)
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::InvalidPath { .. }), "{e:?}");
    assert!(!state.ws("acme", "data").join("suid").exists());
}

#[test]
fn attributes_change_through_no_symlink() {
    let (state, ws) = setup("setattrs");
    let host = HostDir::new();
    let root = state.ws("acme", "data");
    ws.write_file("acme", "data", "f", &b"x"[..], 10).unwrap();
    let changed = ws
        .set_attrs(
            "acme",
            "data",
            "f",
            &Attrs {
                uid: Some(1001),
                gid: None,
                mode: Some(0o755),
            },
        )
        .unwrap();
    assert_eq!(
        (changed.uid, changed.gid, changed.mode),
        (1001, 1000, 0o755)
    );
    // The root itself.
    let r = ws
        .set_attrs(
            "acme",
            "data",
            "",
            &Attrs {
                mode: Some(0o700),
                ..Attrs::default()
            },
        )
        .unwrap();
    assert_eq!((r.kind, r.mode), (EntryKind::Dir, 0o700));
    // A planted link: its own owner may change, never its target's; no mode; never through it.
    symlink(host.0.join("secret"), root.join("link")).unwrap();
    let l = ws
        .set_attrs(
            "acme",
            "data",
            "link",
            &Attrs {
                uid: Some(1001),
                ..Attrs::default()
            },
        )
        .unwrap();
    assert_eq!((l.kind, l.uid), (EntryKind::Symlink, 1001));
    let e = ws
        .set_attrs(
            "acme",
            "data",
            "link",
            &Attrs {
                mode: Some(0o777),
                ..Attrs::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::InvalidPath { .. }), "{e:?}");
    symlink(&host.0, root.join("dirlink")).unwrap();
    let e = ws
        .set_attrs(
            "acme",
            "data",
            "dirlink/secret",
            &Attrs {
                mode: Some(0o777),
                ..Attrs::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::InvalidPath { .. }), "{e:?}");
    let secret = fs::symlink_metadata(host.0.join("secret")).unwrap();
    assert_eq!((secret.uid(), secret.mode() & 0o777), (0, 0o644));
    host.intact();
    // A fifo is never opened.
    let status = std::process::Command::new("mkfifo")
        .arg(root.join("fifo"))
        .status()
        .unwrap();
    assert!(status.success());
    let e = ws
        .set_attrs(
            "acme",
            "data",
            "fifo",
            &Attrs {
                mode: Some(0o600),
                ..Attrs::default()
            },
        )
        .unwrap_err();
    assert!(
        matches!(e, WorkspaceError::NotAFile { kind: "fifo", .. }),
        "{e:?}"
    );
    let e = ws
        .set_attrs("acme", "data", "missing", &Attrs::default())
        .unwrap_err();
    assert!(matches!(e, WorkspaceError::PathNotFound { .. }), "{e:?}");
}
