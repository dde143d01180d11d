//! Workspaces through `husk serve`'s HTTP API, against a real server on 127.0.0.1:0: every
//! endpoint, tenancy (another team's workspace is 404), the per-upload limit (413, nothing
//! left behind), hostile archives (400, nothing written outside) and symlinks planted in a
//! workspace on disk (never followed by a download or an export).

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{TempDir, HUSK};
use serde_json::Value;

/// The server's per-upload limit in these tests.
const LIMIT: usize = 4 << 20;

/// A running `husk serve`; killed on drop (a failing test must not leave it behind).
struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer.
struct Answer {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// Asserts the status; shows the body when it differs.
    fn expect(self, status: u16) -> Answer {
        assert_eq!(self.status, status, "{}", self.text());
        self
    }

    /// Asserts an error answer: the status, and a JSON `{code, message}` whose message holds
    /// `text`.
    fn error(self, status: u16, text: &str) -> Answer {
        let a = self.expect(status);
        let v = a.json();
        assert_eq!(v["code"], status, "{v}");
        let msg = v["message"].as_str().unwrap();
        assert!(msg.contains(text), "{text:?} not in {msg:?}");
        a
    }
}

impl Server {
    fn start(state: &Path) -> Server {
        let mut child = Command::new(HUSK)
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .args(["--workspace-upload-limit", &LIMIT.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("server: {line}");
                let _ = tx.send(line);
            }
        });
        let mut server = Server { child, port: 0 };
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("husk serve never said where it listens");
            if let Some(rest) = line.split("listening on http://127.0.0.1:").nth(1) {
                server.port = rest.split_whitespace().next().unwrap().parse().unwrap();
                return server;
            }
        }
    }

    /// One HTTP/1.1 request on a fresh connection; `chunked` sends the body without a length.
    fn send(&self, method: &str, path: &str, key: &str, body: &[u8], chunked: bool) -> Answer {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let length = if chunked {
            "Transfer-Encoding: chunked".to_string()
        } else {
            format!("Content-Length: {}", body.len())
        };
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-KEY: {key}\r\n{length}\r\nConnection: close\r\n\r\n"
        );
        s.write_all(head.as_bytes()).unwrap();
        if chunked {
            for chunk in body.chunks(64 << 10) {
                s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .unwrap();
                s.write_all(chunk).unwrap();
                s.write_all(b"\r\n").unwrap();
            }
            s.write_all(b"0\r\n\r\n").unwrap();
        } else {
            s.write_all(body).unwrap();
        }
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("no end of headers");
        let headers = String::from_utf8_lossy(&raw[..split]).to_lowercase();
        let mut body = raw[split + 4..].to_vec();
        if headers.contains("transfer-encoding: chunked") {
            body = dechunk(&body);
        }
        Answer {
            status: headers[9..12].parse().unwrap(),
            headers,
            body,
        }
    }

    fn call(&self, method: &str, path: &str, key: &str, body: &[u8]) -> Answer {
        self.send(method, path, key, body, false)
    }
}

/// A chunked body, put back together; panics on a body that ends without its last chunk
/// (a broken transfer must not pass for a complete one).
fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("truncated chunked body");
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&b[..eol])
                .split(';')
                .next()
                .unwrap()
                .trim(),
            16,
        )
        .unwrap();
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[eol + 4 + size..];
    }
}

/// `tar <args>` in `dir`, the archive on stdout.
fn tar(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run tar");
    assert!(out.status.success(), "tar {args:?}: {out:?}");
    out.stdout
}

/// Unpacks `archive` into `dir` with the system tar; the names it held.
fn untar(archive: &[u8], dir: &Path) -> Vec<String> {
    let mut child = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-xvf", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(archive).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "tar -x: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

/// A raw tar entry: path, type byte, data, link target.
type RawEntry<'a> = (&'a str, u8, &'a [u8], &'a str);

/// One raw tar entry (any path, `..` included), as a hostile client sends.
fn raw_entry(out: &mut Vec<u8>, path: &str, kind: u8, data: &[u8], link: &str) {
    let mut h = [0u8; 512];
    h[..path.len()].copy_from_slice(path.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn key_for(state: &Path, team: &str) -> String {
    let out = Command::new(HUSK)
        .args(["key", "create", "--team", team, "--state-dir"])
        .arg(state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

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
    let server = Server::start(state.path());
    let key = fs::read_to_string(state.path().join("admin.key"))
        .unwrap()
        .trim()
        .to_string();
    let other = key_for(state.path(), "other");
    let root = state.path().join("workspaces/default/data");

    // Keys are required.
    server.call("GET", WS, "", b"").expect(401);

    // Create: 201 with its info; taken → 409; bad names and bodies → 400.
    let made = server
        .call("POST", WS, &key, br#"{"name": "data"}"#)
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
        .call("POST", WS, &key, br#"{"name": "data"}"#)
        .error(409, "already exists");
    server
        .call("POST", WS, &key, br#"{"name": "../etc"}"#)
        .error(400, "invalid workspace name");
    server
        .call("POST", WS, &key, b"not json")
        .error(400, "expected a JSON body");

    // Files: up (201 new, 204 replaced), down byte for byte, listed.
    server
        .call("PUT", &format!("{WS}/data/files/dir/a.txt"), &key, b"hello")
        .expect(201);
    server
        .call(
            "PUT",
            &format!("{WS}/data/files/dir/a.txt"),
            &key,
            b"hello!",
        )
        .expect(204);
    let blob: Vec<u8> = (0..3_000_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    server
        .send(
            "PUT",
            &format!("{WS}/data/files/bin/blob"),
            &key,
            &blob,
            true,
        )
        .expect(201);
    let got = server
        .call("GET", &format!("{WS}/data/files/bin/blob"), &key, b"")
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
        .call("GET", &format!("{WS}/data/files/dir/a.txt"), &key, b"")
        .expect(200);
    assert_eq!(a.body, b"hello!");
    let listed = server
        .call(
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
        .call("GET", &format!("{WS}/data/files?depth=5"), &key, b"")
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
        .call("GET", &format!("{WS}/data"), &key, b"")
        .expect(200)
        .json();
    assert_eq!(info["files"], 2);
    assert_eq!(info["size_bytes"], blob.len() + 6);
    let list = server.call("GET", WS, &key, b"").expect(200).json();
    assert_eq!(list["workspaces"][0]["name"], "data", "{list}");
    assert_eq!(list["workspaces"].as_array().unwrap().len(), 1);

    // Missing and wrong things: 404 and 400, with messages naming them.
    server
        .call("GET", &format!("{WS}/data/files/nope"), &key, b"")
        .error(404, "\"nope\" not found in workspace 'data'");
    server
        .call("GET", &format!("{WS}/data/files/dir"), &key, b"")
        .error(400, "not a regular file");
    server
        .call("GET", &format!("{WS}/nope/files/x"), &key, b"")
        .error(404, "workspace 'nope' not found");
    server
        .call("GET", &format!("{WS}/data/files?path=../etc"), &key, b"")
        .error(400, "`..` is refused");
    server
        .call(
            "GET",
            &format!("{WS}/data/files/%2e%2e/%2e%2e/etc/passwd"),
            &key,
            b"",
        )
        .error(400, "`..` is refused");
    server
        .call("PUT", &format!("{WS}/data/files/dir/a.txt/x"), &key, b"x")
        .error(400, "not a directory");
    server
        .call("GET", &format!("{WS}/data/tar?path=/etc"), &key, b"")
        .error(400, "absolute paths are refused");

    // Another team: every endpoint answers as if the workspace did not exist.
    let theirs = server.call("GET", WS, &other, b"").expect(200).json();
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
            .call(method, &path, &other, b"")
            .error(404, "workspace 'data' not found");
    }
    assert_eq!(on_disk(&root), ["bin", "dir"]);
    assert!(!state.path().join("workspaces/other/data").exists());

    // Over the upload limit: 413 with a clear message, nothing left (with a length the
    // server refuses at once; chunked, after reading up to the limit).
    let big = vec![1u8; LIMIT + 1];
    for chunked in [false, true] {
        server
            .send(
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
    server
        .send(
            "PUT",
            &format!("{WS}/data/files/max"),
            &key,
            &big[..LIMIT],
            true,
        )
        .expect(201);
    server
        .call("DELETE", &format!("{WS}/data/files/max"), &key, b"")
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
        .call("PUT", &format!("{WS}/data/tar?path=imp"), &key, &plain)
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
        .call("PUT", &format!("{WS}/data/tar?path=imp2/deeper"), &key, &gz)
        .expect(200);
    for base in ["imp", "imp2/deeper"] {
        let two = server
            .call(
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
        .call("PUT", &format!("{WS}/data/tar?path=toobig"), &key, &over)
        .error(413, "larger than the limit");
    assert_eq!(on_disk(&root), ["bin", "dir", "imp", "imp2"]);

    // Tar out: streamed, a real archive of the subtree, symlinks as symlinks.
    let out = server
        .call("GET", &format!("{WS}/data/tar?path=imp"), &key, b"")
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
        .call("GET", &format!("{WS}/data/tar"), &key, b"")
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
            .call("PUT", &format!("{WS}/data/tar"), &key, &t)
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
        .call("GET", &format!("{WS}/data/files/evil"), &key, b"")
        .error(400, "is a symlink, not a regular file");
    server
        .call("GET", &format!("{WS}/data/files/evildir/secret"), &key, b"")
        .error(400, "symlink");
    server
        .call(
            "GET",
            &format!("{WS}/data/tar?path=evildir/secret"),
            &key,
            b"",
        )
        .error(400, "symlink");
    let listed = server
        .call(
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
        .call("GET", &format!("{WS}/data/tar"), &key, b"")
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
        .call("PUT", &format!("{WS}/data/files/evil"), &key, b"mine")
        .expect(204);
    server
        .call("PUT", &format!("{WS}/data/files/evildir/x"), &key, b"evil")
        .error(400, "symlink");
    host.intact();

    // Removal: a file, a tree, the workspace; gone for good, the link targets untouched.
    server
        .call("DELETE", &format!("{WS}/data/files/dir/a.txt"), &key, b"")
        .expect(204);
    server
        .call("GET", &format!("{WS}/data/files/dir/a.txt"), &key, b"")
        .expect(404);
    server
        .call("DELETE", &format!("{WS}/data/files/imp"), &key, b"")
        .expect(204);
    server
        .call("DELETE", &format!("{WS}/data/files/evildir"), &key, b"")
        .expect(204);
    host.intact();
    server
        .call("DELETE", &format!("{WS}/data"), &key, b"")
        .expect(204);
    server
        .call("GET", &format!("{WS}/data"), &key, b"")
        .error(404, "workspace 'data' not found");
    server
        .call("DELETE", &format!("{WS}/data"), &key, b"")
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
