//! Workspaces through `husk serve`'s HTTP API, against a real server on 127.0.0.1:0: every
//! endpoint, tenancy (another team's workspace is 404), the per-upload limit (413, nothing
//! left behind), hostile archives (400, nothing written outside) and symlinks planted in a
//! workspace on disk (never followed by a download or an export).

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use common::server::{Reply, Server};
use common::tarball::{raw_entry, tar, untar};
use common::TempDir;

/// The server's per-upload limit in these tests.
const LIMIT: usize = 4 << 20;

/// A request with `key` (and no content type); the body goes chunked, without a length, when
/// `chunked`.
fn send(server: &Server, method: &str, path: &str, key: &str, body: &[u8], chunked: bool) -> Reply {
    let mut headers = vec![("X-API-KEY", key)];
    if chunked {
        headers.push(("Transfer-Encoding", "chunked"));
    }
    server.request_with(method, path, &headers, body)
}

/// A raw tar entry: path, type byte, data, link target.
type RawEntry<'a> = (&'a str, u8, &'a [u8], &'a str);

/// Names at the root of a workspace on disk.
fn on_disk(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A host directory outside the state directory whose content must survive.
struct Host(TempDir);

impl Host {
    fn new() -> Host {
        let dir = TempDir::new("ws-http-host");
        fs::write(dir.path().join("secret"), b"host data").unwrap();
        Host(dir)
    }

    fn path(&self) -> PathBuf {
        self.0.path().to_path_buf()
    }

    fn intact(&self) {
        assert_eq!(fs::read(self.path().join("secret")).unwrap(), b"host data");
        assert_eq!(
            fs::read_dir(self.path()).unwrap().count(),
            1,
            "written into"
        );
    }
}

const WS: &str = "/husk/v1/workspaces";

#[test]
fn workspaces_over_http() {
    let state = TempDir::new("ws-http");
    let server = Server::start_with(
        state.path(),
        &["--workspace-upload-limit", &LIMIT.to_string()],
    );
    let key = server.admin_key.clone();
    let other = server.key_for("other");
    let root = state.path().join("workspaces/default/data");

    // Keys are required.
    server.request("GET", WS, "", b"").expect(401);

    // Create: 201 with its info; taken → 409; bad names and bodies → 400.
    let made = server
        .request("POST", WS, &key, br#"{"name": "data"}"#)
        .expect(201)
        .json();
    assert_eq!(made["name"], "data");
    assert_eq!(
        (made["size_bytes"].as_u64(), made["files"].as_u64()),
        (Some(0), Some(0))
    );
    time::OffsetDateTime::parse(
        made["created_at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    server
        .request("POST", WS, &key, br#"{"name": "data"}"#)
        .error(409, "already exists");
    server
        .request("POST", WS, &key, br#"{"name": "../etc"}"#)
        .error(400, "invalid workspace name");
    server
        .request("POST", WS, &key, b"not json")
        .error(400, "expected a JSON body");

    // Files: up (201 new, 204 replaced), down byte for byte, listed.
    server
        .request("PUT", &format!("{WS}/data/files/dir/a.txt"), &key, b"hello")
        .expect(201);
    server
        .request(
            "PUT",
            &format!("{WS}/data/files/dir/a.txt"),
            &key,
            b"hello!",
        )
        .expect(204);
    let blob: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    send(
        &server,
        "PUT",
        &format!("{WS}/data/files/bin/blob"),
        &key,
        &blob,
        true,
    )
    .expect(201);
    let got = server
        .request("GET", &format!("{WS}/data/files/bin/blob"), &key, b"")
        .expect(200);
    assert!(
        got.headers
            .contains("content-type: application/octet-stream"),
        "{}",
        got.headers
    );
    assert!(got
        .headers
        .contains(&format!("content-length: {}", blob.len())));
    assert!(got.body == blob, "the download differs from the upload");
    let a = server
        .request("GET", &format!("{WS}/data/files/dir/a.txt"), &key, b"")
        .expect(200);
    assert_eq!(a.body, b"hello!");
    let listed = server
        .request(
            "GET",
            &format!("{WS}/data/files?path=dir&depth=1"),
            &key,
            b"",
        )
        .expect(200)
        .json();
    let entries = listed["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 1, "{listed}");
    assert_eq!(entries[0]["path"], "dir/a.txt");
    assert_eq!(entries[0]["kind"], "file");
    assert_eq!(entries[0]["size"], 6);
    assert_eq!(entries[0]["mode"], 0o644);
    assert_eq!(listed["truncated"], false);
    let all = server
        .request("GET", &format!("{WS}/data/files?depth=5"), &key, b"")
        .expect(200)
        .json();
    let paths: Vec<&str> = all["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["bin", "bin/blob", "dir", "dir/a.txt"]);
    let info = server
        .request("GET", &format!("{WS}/data"), &key, b"")
        .expect(200)
        .json();
    assert_eq!(info["files"], 2);
    assert_eq!(info["size_bytes"], blob.len() + 6);
    let list = server.request("GET", WS, &key, b"").expect(200).json();
    assert_eq!(list["workspaces"][0]["name"], "data", "{list}");
    assert_eq!(list["workspaces"].as_array().unwrap().len(), 1);

    // Missing and wrong things: 404 and 400, with messages naming them.
    server
        .request("GET", &format!("{WS}/data/files/nope"), &key, b"")
        .error(404, "\"nope\" not found in workspace 'data'");
    server
        .request("GET", &format!("{WS}/data/files/dir"), &key, b"")
        .error(400, "not a regular file");
    server
        .request("GET", &format!("{WS}/nope/files/x"), &key, b"")
        .error(404, "workspace 'nope' not found");
    server
        .request("GET", &format!("{WS}/data/files?path=../etc"), &key, b"")
        .error(400, "`..` is refused");
    server
        .request(
            "GET",
            &format!("{WS}/data/files/%2e%2e/%2e%2e/etc/passwd"),
            &key,
            b"",
        )
        .error(400, "`..` is refused");
    server
        .request("PUT", &format!("{WS}/data/files/dir/a.txt/x"), &key, b"x")
        .error(400, "not a directory");
    server
        .request("GET", &format!("{WS}/data/tar?path=/etc"), &key, b"")
        .error(400, "absolute paths are refused");

    // Another team: every endpoint answers as if the workspace did not exist.
    let theirs = server.request("GET", WS, &other, b"").expect(200).json();
    assert_eq!(
        theirs["workspaces"].as_array().unwrap().len(),
        0,
        "{theirs}"
    );
    for (method, path) in [
        ("GET", format!("{WS}/data")),
        ("DELETE", format!("{WS}/data")),
        ("GET", format!("{WS}/data/files")),
        ("GET", format!("{WS}/data/files/dir/a.txt")),
        ("PUT", format!("{WS}/data/files/planted")),
        ("DELETE", format!("{WS}/data/files/dir/a.txt")),
        ("GET", format!("{WS}/data/tar")),
        ("PUT", format!("{WS}/data/tar")),
    ] {
        server
            .request(method, &path, &other, b"")
            .error(404, "workspace 'data' not found");
    }
    assert_eq!(on_disk(&root), ["bin", "dir"]);
    assert!(!state.path().join("workspaces/other/data").exists());

    // Over the upload limit: 413 with a clear message, nothing left (with a length the
    // server refuses at once; chunked, after reading up to the limit).
    let big = vec![1u8; LIMIT + 1];
    for chunked in [false, true] {
        send(
            &server,
            "PUT",
            &format!("{WS}/data/files/new/big"),
            &key,
            &big,
            chunked,
        )
        .error(413, "larger than the limit of 4 MiB");
        assert_eq!(on_disk(&root), ["bin", "dir"], "chunked: {chunked}");
    }
    // Exactly at the limit is fine.
    send(
        &server,
        "PUT",
        &format!("{WS}/data/files/max"),
        &key,
        &big[..LIMIT],
        true,
    )
    .expect(201);
    server
        .request("DELETE", &format!("{WS}/data/files/max"), &key, b"")
        .expect(204);

    // Tar in: plain and gzipped, under a path; the report counts what it unpacked.
    let local = TempDir::new("ws-http-local");
    let src = local.path().join("src");
    fs::create_dir_all(src.join("sub")).unwrap();
    fs::write(src.join("one.txt"), b"one").unwrap();
    fs::write(src.join("sub/two.txt"), b"two!").unwrap();
    symlink("one.txt", src.join("link")).unwrap();
    let plain = tar(&src, &["-cf", "-", "."]);
    let r = server
        .request("PUT", &format!("{WS}/data/tar?path=imp"), &key, &plain)
        .expect(200)
        .json();
    assert_eq!(
        (r["files"].as_u64(), r["bytes"].as_u64()),
        (Some(2), Some(7)),
        "{r}"
    );
    assert_eq!(r["symlinks"], 1);
    let gz = tar(&src, &["-czf", "-", "."]);
    server
        .request("PUT", &format!("{WS}/data/tar?path=imp2/deeper"), &key, &gz)
        .expect(200);
    for base in ["imp", "imp2/deeper"] {
        let two = server
            .request(
                "GET",
                &format!("{WS}/data/files/{base}/sub/two.txt"),
                &key,
                b"",
            )
            .expect(200);
        assert_eq!(two.body, b"two!");
        assert_eq!(
            fs::read_link(root.join(base).join("link")).unwrap(),
            Path::new("one.txt")
        );
    }
    // An archive over the limit: 413, nothing left.
    let huge = TempDir::new("ws-http-huge");
    fs::write(huge.path().join("big"), &big).unwrap();
    let over = tar(huge.path(), &["-cf", "-", "big"]);
    server
        .request("PUT", &format!("{WS}/data/tar?path=toobig"), &key, &over)
        .error(413, "larger than the limit");
    assert_eq!(on_disk(&root), ["bin", "dir", "imp", "imp2"]);

    // Tar out: streamed, a real archive of the subtree, symlinks as symlinks.
    let out = server
        .request("GET", &format!("{WS}/data/tar?path=imp"), &key, b"")
        .expect(200);
    assert!(
        out.headers.contains("content-type: application/x-tar"),
        "{}",
        out.headers
    );
    let back = TempDir::new("ws-http-back");
    let mut names = untar(&out.body, back.path());
    names.sort();
    assert_eq!(names, ["link", "one.txt", "sub", "sub/two.txt"]);
    assert_eq!(fs::read(back.path().join("sub/two.txt")).unwrap(), b"two!");
    assert!(fs::symlink_metadata(back.path().join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    let whole = server
        .request("GET", &format!("{WS}/data/tar"), &key, b"")
        .expect(200);
    let all = TempDir::new("ws-http-all");
    untar(&whole.body, all.path());
    assert!(fs::read(all.path().join("bin/blob")).unwrap() == blob);

    // Hostile archives: 400, nothing written outside the workspace, nothing left in it.
    let host = Host::new();
    let before = on_disk(&root);
    let target = host.path();
    let cases: Vec<(&str, Vec<RawEntry>)> = vec![
        (
            "`..` is refused",
            vec![("ok", b'0', b"fine", ""), ("../../x", b'0', b"evil", "")],
        ),
        (
            "absolute paths are refused",
            vec![("/tmp/husk-ws-evil", b'0', b"evil", "")],
        ),
        (
            "is a symlink",
            vec![
                ("l", b'2', b"", target.to_str().unwrap()),
                ("l/planted", b'0', b"evil", ""),
            ],
        ),
    ];
    for (why, entries) in cases {
        let mut t = Vec::new();
        for (path, kind, data, link) in entries {
            raw_entry(&mut t, path, kind, data, link);
        }
        t.extend_from_slice(&[0; 1024]);
        server
            .request("PUT", &format!("{WS}/data/tar"), &key, &t)
            .error(400, why);
        assert_eq!(on_disk(&root), before, "{why}");
        host.intact();
        assert!(!state.path().join("workspaces/default/x").exists());
        assert!(!state.path().join("workspaces/x").exists());
        assert!(!Path::new("/tmp/husk-ws-evil").exists());
    }

    // Symlinks planted on disk (as a sandbox with the workspace mounted could): never
    // followed by a download, a listing or an export.
    symlink(host.path().join("secret"), root.join("evil")).unwrap();
    symlink(host.path(), root.join("evildir")).unwrap();
    server
        .request("GET", &format!("{WS}/data/files/evil"), &key, b"")
        .error(400, "is a symlink, not a regular file");
    server
        .request("GET", &format!("{WS}/data/files/evildir/secret"), &key, b"")
        .error(400, "symlink");
    server
        .request(
            "GET",
            &format!("{WS}/data/tar?path=evildir/secret"),
            &key,
            b"",
        )
        .error(400, "symlink");
    let listed = server
        .request(
            "GET",
            &format!("{WS}/data/files?path=evildir&depth=3"),
            &key,
            b"",
        )
        .expect(200)
        .json();
    assert_eq!(listed["entries"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["entries"][0]["kind"], "symlink");
    assert_eq!(
        listed["entries"][0]["target"],
        host.path().to_str().unwrap()
    );
    let out = server
        .request("GET", &format!("{WS}/data/tar"), &key, b"")
        .expect(200);
    assert!(
        !out.body.windows(9).any(|w| w == b"host data"),
        "the export followed a planted symlink"
    );
    let planted = TempDir::new("ws-http-planted");
    untar(&out.body, planted.path());
    for name in ["evil", "evildir"] {
        let m = fs::symlink_metadata(planted.path().join(name)).unwrap();
        assert!(m.file_type().is_symlink(), "{name}");
    }
    // Uploading to the link's path replaces the link, never writes through it.
    server
        .request("PUT", &format!("{WS}/data/files/evil"), &key, b"mine")
        .expect(204);
    server
        .request("PUT", &format!("{WS}/data/files/evildir/x"), &key, b"evil")
        .error(400, "symlink");
    host.intact();

    // Removal: a file, a tree, the workspace; gone for good, the link targets untouched.
    server
        .request("DELETE", &format!("{WS}/data/files/dir/a.txt"), &key, b"")
        .expect(204);
    server
        .request("GET", &format!("{WS}/data/files/dir/a.txt"), &key, b"")
        .expect(404);
    server
        .request("DELETE", &format!("{WS}/data/files/imp"), &key, b"")
        .expect(204);
    server
        .request("DELETE", &format!("{WS}/data/files/evildir"), &key, b"")
        .expect(204);
    host.intact();
    server
        .request("DELETE", &format!("{WS}/data"), &key, b"")
        .expect(204);
    server
        .request("GET", &format!("{WS}/data"), &key, b"")
        .error(404, "workspace 'data' not found");
    server
        .request("DELETE", &format!("{WS}/data"), &key, b"")
        .expect(404);
    assert!(!root.exists());
    assert_eq!(
        fs::read_dir(state.path().join("workspaces/default"))
            .unwrap()
            .count(),
        0,
        "trash left behind"
    );
    host.intact();
}
