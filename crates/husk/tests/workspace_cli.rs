//! `husk workspace` as an operator uses it, with the real binary on a temporary state
//! directory: create, put a tree, list, get it back byte for byte, export and import, remove;
//! and the errors: unknown workspace, bad name, path escapes, an existing local file without
//! `--force`, another team's view, symlinks planted in a workspace.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::process::Command;

use common::tarball::raw_entry;
use common::{husk_state, TempDir};

/// `husk workspace ARGS --state-dir STATE`: (exit code, stdout, stderr).
fn ws(state: &TempDir, args: &[&str]) -> (i32, String, String) {
    ws_stdin(state, args, None)
}

fn ws_stdin(state: &TempDir, args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    husk_state("workspace", args, state.path(), stdin)
}

/// Runs and expects success; returns stdout.
fn ok(state: &TempDir, args: &[&str]) -> String {
    let (code, out, err) = ws(state, args);
    assert_eq!(code, 0, "husk workspace {args:?} failed:\n{err}");
    out
}

/// Runs and expects `code`; returns stderr.
fn fails(state: &TempDir, args: &[&str], code: i32) -> String {
    let (got, _, err) = ws(state, args);
    assert_eq!(got, code, "husk workspace {args:?}: {err}");
    err
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// What a tree holds: path → (kind, content or symlink target, executable).
fn snapshot(root: &Path) -> BTreeMap<String, (char, Vec<u8>, bool)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (char, Vec<u8>, bool)>) {
        for e in fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.insert(rel, ('l', t.to_str().unwrap().as_bytes().to_vec(), false));
            } else if m.is_dir() {
                out.insert(rel, ('d', Vec::new(), false));
                walk(root, &p, out);
            } else {
                let exec = m.permissions().mode() & 0o111 != 0;
                out.insert(rel, ('f', fs::read(&p).unwrap(), exec));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

/// A local tree with text, binary, executable, nested, empty and symlinked entries.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir_all(root.join("deep/x/y")).unwrap();
    fs::create_dir_all(root.join("empty")).unwrap();
    fs::write(root.join("a.txt"), b"alpha\n").unwrap();
    fs::write(root.join("bin/run.sh"), b"#!/bin/sh\necho run\n").unwrap();
    fs::set_permissions(root.join("bin/run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    let blob: Vec<u8> = (0..700_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(root.join("deep/x/y/z.bin"), &blob).unwrap();
    symlink("a.txt", root.join("link")).unwrap();
    symlink("/etc/passwd", root.join("abs")).unwrap();
}

#[test]
fn a_tree_goes_in_and_comes_back_identical() {
    let state = TempDir::new("ws-cli");
    let local = TempDir::new("ws-cli-local");
    let src = local.path().join("src");
    make_tree(&src);

    ok(&state, &["create", "data", "--team", "acme"]);
    let err = fails(&state, &["create", "data", "--team", "acme"], 1);
    assert!(err.contains("workspace 'data' already exists"), "{err}");
    // A directory's tree into the root (`.`), a single file to a path of its own.
    ok(&state, &["put", "data", "--team", "acme", s(&src), "."]);
    let note = local.path().join("note.txt");
    fs::write(&note, b"a note").unwrap();
    ok(
        &state,
        &["put", "data", "--team", "acme", s(&note), "docs/readme.txt"],
    );
    // A directory as the destination: the file goes in under its name.
    ok(
        &state,
        &["put", "data", "--team", "acme", s(&note), "docs/"],
    );
    let docs = ok(&state, &["ls", "data:docs", "--team", "acme"]);
    assert!(docs.contains("docs/note.txt"), "{docs}");
    fs::remove_file(state.path().join("workspaces/acme/data/docs/note.txt")).unwrap();

    // ls: the first level, then the whole tree, symlinks shown as such.
    let top = ok(&state, &["ls", "data", "--team", "acme"]);
    for name in ["a.txt", "bin", "deep", "docs", "empty", "link -> a.txt"] {
        assert!(
            top.lines().any(|l| l.ends_with(name)),
            "{name} missing:\n{top}"
        );
    }
    assert!(!top.contains("z.bin"), "{top}");
    let all = ok(&state, &["ls", "data", "--team", "acme", "-r"]);
    assert!(all.contains("deep/x/y/z.bin"), "{all}");
    assert!(all.contains("abs -> /etc/passwd"), "{all}");
    assert!(
        all.lines()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with("bin/run.sh")),
        "{all}"
    );
    let sub = ok(&state, &["ls", "data:deep/x", "--team", "acme"]);
    assert!(sub.contains("deep/x/y") && !sub.contains("z.bin"), "{sub}");

    // get: a file, byte for byte; an existing local file only with --force.
    let out = local.path().join("z.bin");
    ok(
        &state,
        &["get", "data:deep/x/y/z.bin", "--team", "acme", s(&out)],
    );
    assert_eq!(
        fs::read(&out).unwrap(),
        fs::read(src.join("deep/x/y/z.bin")).unwrap()
    );
    let err = fails(
        &state,
        &["get", "data:a.txt", "--team", "acme", s(&out)],
        125,
    );
    assert!(err.contains("exists; use --force"), "{err}");
    assert_eq!(
        fs::read(&out).unwrap(),
        fs::read(src.join("deep/x/y/z.bin")).unwrap()
    );
    ok(
        &state,
        &["get", "data:a.txt", "--team", "acme", s(&out), "--force"],
    );
    assert_eq!(fs::read(&out).unwrap(), b"alpha\n");
    // Into an existing directory: under the file's name.
    ok(
        &state,
        &[
            "get",
            "data:docs/readme.txt",
            "--team",
            "acme",
            local.path().to_str().unwrap(),
        ],
    );
    assert_eq!(
        fs::read(local.path().join("readme.txt")).unwrap(),
        b"a note"
    );

    // get: the whole workspace as a tree, identical to what went in.
    let back = local.path().join("back");
    ok(&state, &["get", "data", "--team", "acme", s(&back)]);
    let mut expected = snapshot(&src);
    expected.insert("docs".into(), ('d', Vec::new(), false));
    expected.insert("docs/readme.txt".into(), ('f', b"a note".to_vec(), false));
    assert_eq!(snapshot(&back), expected);
    let err = fails(&state, &["get", "data", "--team", "acme", s(&back)], 125);
    assert!(err.contains("use --force"), "{err}");
    // A subtree.
    let deep = local.path().join("deep");
    ok(&state, &["get", "data:deep", "--team", "acme", s(&deep)]);
    assert_eq!(
        fs::read(deep.join("x/y/z.bin")).unwrap(),
        fs::read(src.join("deep/x/y/z.bin")).unwrap()
    );

    // export → import into another workspace: the same tree; the archive is a real tar.
    let archive = local.path().join("data.tar");
    ok(
        &state,
        &["export", "data", "--team", "acme", "-o", s(&archive)],
    );
    let listed = Command::new("tar")
        .arg("-tf")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    let names = String::from_utf8_lossy(&listed.stdout);
    assert!(
        names.contains("deep/x/y/z.bin") && names.contains("bin/run.sh"),
        "{names}"
    );
    ok(&state, &["create", "copy", "--team", "acme"]);
    ok(&state, &["import", "copy", "--team", "acme", s(&archive)]);
    let copy = local.path().join("copy");
    ok(&state, &["get", "copy", "--team", "acme", s(&copy)]);
    assert_eq!(snapshot(&copy), expected);
    // From stdin, gzipped, under a path.
    let gz = Command::new("gzip")
        .arg("-c")
        .arg(&archive)
        .output()
        .unwrap()
        .stdout;
    let (code, _, err) = ws_stdin(
        &state,
        &["import", "copy", "--team", "acme", "-", "--path", "again"],
        Some(&gz),
    );
    assert_eq!(code, 0, "{err}");
    let again = local.path().join("again");
    ok(&state, &["get", "copy:again", "--team", "acme", s(&again)]);
    assert_eq!(snapshot(&again), expected);

    // list: both, with sizes; JSON as the HTTP API's.
    let table = ok(&state, &["list", "--team", "acme"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(table.contains("copy") && table.contains("data"), "{table}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&state, &["list", "--team", "acme", "--json"])).unwrap();
    let data = json["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "data")
        .unwrap();
    assert_eq!(data["files"], 4);
    assert_eq!(data["size_bytes"], 6 + 19 + 700_000 + 6);

    ok(&state, &["rm", "copy", "--team", "acme"]);
    let table = ok(&state, &["list", "--team", "acme"]);
    assert!(!table.contains("copy") && table.contains("data"), "{table}");
    let err = fails(&state, &["rm", "copy", "--team", "acme"], 1);
    assert!(err.contains("workspace 'copy' not found"), "{err}");
    assert!(!state.path().join("workspaces/acme/copy").exists());
}

#[test]
fn errors_are_clear_and_nothing_escapes() {
    let state = TempDir::new("ws-cli-err");
    let local = TempDir::new("ws-cli-err-local");
    ok(&state, &["create", "data", "--team", "acme"]);
    let file = local.path().join("f");
    fs::write(&file, b"x").unwrap();

    let err = fails(&state, &["ls", "nope", "--team", "acme"], 1);
    assert!(err.contains("workspace 'nope' not found"), "{err}");
    for bad in ["bad name", ".hidden", "a/b", "..", "ü"] {
        let err = fails(&state, &["create", bad, "--team", "acme"], 125);
        assert!(err.contains("invalid workspace name"), "{bad}: {err}");
    }
    let err = fails(&state, &["create", "x", "--team", "Bad Team"], 125);
    assert!(err.contains("invalid team name"), "{err}");

    // Path escapes, every way in and out.
    let err = fails(&state, &["ls", "data:../..", "--team", "acme"], 125);
    assert!(err.contains("`..` is refused"), "{err}");
    let err = fails(
        &state,
        &["put", "data", "--team", "acme", s(&file), "../escaped"],
        125,
    );
    assert!(err.contains("invalid path"), "{err}");
    let err = fails(
        &state,
        &[
            "get",
            "data:/etc/passwd",
            "--team",
            "acme",
            s(&local.path().join("p")),
        ],
        125,
    );
    assert!(err.contains("absolute paths are refused"), "{err}");
    assert!(!local.path().join("p").exists());
    assert!(!state.path().join("workspaces/acme/escaped").exists());
    let mut evil = Vec::new();
    raw_entry(&mut evil, "../../escaped", b'0', b"evil", "");
    evil.extend_from_slice(&[0; 1024]);
    let tar = local.path().join("evil.tar");
    fs::write(&tar, &evil).unwrap();
    let err = fails(&state, &["import", "data", "--team", "acme", s(&tar)], 125);
    assert!(err.contains("`..` is refused"), "{err}");
    let mut evil = Vec::new();
    let target = local.path().join("target");
    fs::create_dir(&target).unwrap();
    raw_entry(&mut evil, "l", b'2', b"", s(&target));
    raw_entry(&mut evil, "l/planted", b'0', b"evil", "");
    evil.extend_from_slice(&[0; 1024]);
    fs::write(&tar, &evil).unwrap();
    let err = fails(&state, &["import", "data", "--team", "acme", s(&tar)], 125);
    assert!(err.contains("symlink"), "{err}");
    assert!(!target.join("planted").exists());
    assert!(!state.path().join("workspaces/escaped").exists());
    assert_eq!(
        ok(&state, &["ls", "data", "--team", "acme"])
            .lines()
            .count(),
        1
    );

    // Another team sees nothing and changes nothing.
    ok(&state, &["put", "data", "--team", "acme", s(&file), "mine"]);
    let table = ok(&state, &["list", "--team", "other"]);
    assert!(!table.contains("data"), "{table}");
    for args in [
        vec!["ls", "data"],
        vec!["rm", "data"],
        vec!["get", "data:mine", s(&local.path().join("stolen"))],
        vec!["put", "data", s(&file), "planted"],
        vec!["export", "data", "-o", s(&local.path().join("stolen.tar"))],
    ] {
        let mut args = args.clone();
        args.extend(["--team", "other"]);
        let err = fails(&state, &args, 1);
        assert!(
            err.contains("workspace 'data' not found"),
            "{args:?}: {err}"
        );
    }
    assert!(!local.path().join("stolen").exists());
    assert!(!local.path().join("stolen.tar").exists());
    let mine = ok(&state, &["ls", "data", "--team", "acme"]);
    assert!(mine.contains("mine") && !mine.contains("planted"), "{mine}");

    // Symlinks a sandbox planted: never followed on the way out.
    let root = state.path().join("workspaces/acme/data");
    let host = local.path().join("host-secret");
    fs::write(&host, b"host data").unwrap();
    symlink(&host, root.join("evil")).unwrap();
    symlink(local.path(), root.join("evildir")).unwrap();
    let out = local.path().join("got");
    let err = fails(
        &state,
        &["get", "data:evil", "--team", "acme", s(&out)],
        125,
    );
    assert!(err.contains("symlink"), "{err}");
    let err = fails(
        &state,
        &["get", "data:evildir/host-secret", "--team", "acme", s(&out)],
        125,
    );
    assert!(err.contains("symlink"), "{err}");
    assert!(!out.exists());
    ok(&state, &["get", "data", "--team", "acme", s(&out)]);
    assert!(fs::symlink_metadata(out.join("evil"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(out.join("evil")).unwrap(), host);
    // Writing to the link's path replaces the link; the host file is untouched.
    ok(&state, &["put", "data", "--team", "acme", s(&file), "evil"]);
    assert_eq!(fs::read(&host).unwrap(), b"host data");
    assert!(fs::symlink_metadata(root.join("evil")).unwrap().is_file());
    // Deleting the workspace removes the links, not what they point to.
    ok(&state, &["rm", "data", "--team", "acme"]);
    assert_eq!(fs::read(&host).unwrap(), b"host data");
    assert!(file.exists() && out.join("mine").exists());
    assert!(!root.exists());
}
