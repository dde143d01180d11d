//! Templates through `husk serve`'s HTTP API, as an operator and the E2B tools use it: a build
//! from an uploaded context streamed as NDJSON, listing and inspecting, a sandbox created from
//! the template, removal, E2B's `GET /templates`, admin-only changes, and hostile or broken
//! uploads refused with nothing written outside the server's context directory.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::templates::{busybox_context, State};
use common::{rand, TempDir, HUSK};
use serde_json::Value;

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
    fn expect(&self, status: u16) -> &Answer {
        assert_eq!(self.status, status, "{}", self.text());
        self
    }
}

impl Server {
    fn start(state: &Path) -> Server {
        let mut child = Command::new(HUSK)
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // The log stays visible for failing tests.
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

    /// One HTTP/1.1 request on a fresh connection.
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
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

    fn api(&self, method: &str, path: &str, key: &str, body: &str) -> Answer {
        self.request(
            method,
            path,
            &[("X-API-KEY", key), ("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    fn upload(&self, query: &str, key: &str, tar: &[u8]) -> Answer {
        self.request(
            "POST",
            &format!("/husk/v1/templates?{query}"),
            &[("X-API-KEY", key), ("Content-Type", "application/x-tar")],
            tar,
        )
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = b.windows(2).position(|w| w == b"\r\n").expect("chunk size");
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

fn admin_key(state: &Path) -> String {
    fs::read_to_string(state.join("admin.key"))
        .unwrap()
        .trim()
        .to_string()
}

fn user_key(state: &Path) -> String {
    let store = husk_core::store::Store::open(state).unwrap();
    store.create_key("users", false, Some("user")).unwrap().1
}

/// Entries of the server's build-context directory (each build's is removed when it ends).
fn contexts(state: &Path) -> Vec<String> {
    fs::read_dir(state.join("templates/contexts"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn name_in(list: &Value, key: &str, name: &str) -> bool {
    list.as_array()
        .unwrap()
        .iter()
        .any(|t| t[key].as_str() == Some(name))
}

#[test]
fn a_template_built_over_http_is_listed_used_and_removed() {
    let state = State::new("srv-tmpl");
    let server = Server::start(state.path());
    let (admin, user) = (admin_key(state.path()), user_key(state.path()));
    let name = format!("srv-{:08x}", rand() as u32);
    let ctx = TempDir::new("srv-ctx");
    busybox_context(ctx.path(), "RUN echo hi > /greeting\n");
    let archive = tar(ctx.path(), &["-czf", "-", "."]);

    // Only admin keys build.
    let denied = server.upload(&format!("name={name}"), &user, &archive);
    denied.expect(403);
    assert!(denied.text().contains("admin key"), "{}", denied.text());

    // The build streams NDJSON and ends with the template.
    let built = server.upload(&format!("name={name}"), &admin, &archive);
    built.expect(200);
    assert!(
        built.headers.contains("content-type: application/x-ndjson"),
        "{}",
        built.headers
    );
    let events: Vec<Value> = built
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let steps: Vec<&Value> = events.iter().filter(|e| e["type"] == "step").collect();
    assert!(steps.len() >= 5, "{kinds:?}");
    assert!(steps.iter().any(|s| s["display"]
        .as_str()
        .unwrap()
        .contains("echo hi > /greeting")));
    assert_eq!(steps[0]["index"], 1);
    assert_eq!(steps[0]["total"], steps.len());
    assert!(kinds.contains(&"step_done"), "{kinds:?}");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "done", "{}", built.text());
    assert_eq!(last["template"]["name"], name.as_str());
    assert!(
        contexts(state.path()).is_empty(),
        "build context left behind"
    );

    // Listed (with the built-in host template) and inspected by any key.
    let list = server.api("GET", "/husk/v1/templates", &user, "");
    let list = list.expect(200).json();
    let templates = &list["templates"];
    assert!(templates
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "host" && t["builtin"] == true));
    assert!(name_in(templates, "name", &name), "{list}");
    let one = server
        .api("GET", &format!("/husk/v1/templates/{name}"), &user, "")
        .expect(200)
        .json();
    assert_eq!(one["digest"], last["template"]["digest"]);
    let image = one["image"].as_str().unwrap().to_string();
    assert!(Path::new(&image).is_file(), "{image}");

    // E2B's list names it, and `base` (the host template while no base is built).
    let e2b = server
        .api("GET", "/templates", &user, "")
        .expect(200)
        .json();
    assert!(name_in(&e2b, "templateID", &name), "{e2b}");
    assert!(name_in(&e2b, "templateID", "base"), "{e2b}");
    let entry = e2b
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["templateID"] == name.as_str())
        .unwrap();
    assert_eq!(entry["buildStatus"], "ready");
    assert_eq!(entry["aliases"][0], name.as_str());
    assert_eq!(entry["memoryMB"], 512);
    assert_eq!(entry["buildID"].as_str().unwrap().len(), 36);

    // A sandbox from it sees what the build wrote.
    let sb = server
        .api(
            "POST",
            "/sandboxes",
            &user,
            &format!(r#"{{"templateID":"{name}"}}"#),
        )
        .expect(201)
        .json();
    assert_eq!(sb["templateID"], name.as_str());
    let id = sb["sandboxID"].as_str().unwrap();
    let token = sb["envdAccessToken"].as_str().unwrap_or("");
    let file = server.request(
        "GET",
        "/files?path=/greeting",
        &[("E2b-Sandbox-Id", id), ("X-Access-Token", token)],
        b"",
    );
    assert_eq!(file.expect(200).text(), "hi\n");
    server
        .api("DELETE", &format!("/sandboxes/{id}"), &user, "")
        .expect(204);

    // Only admin keys remove; `host` cannot be removed.
    let path = format!("/husk/v1/templates/{name}");
    server.api("DELETE", &path, &user, "").expect(403);
    server
        .api("DELETE", "/husk/v1/templates/host", &admin, "")
        .expect(400);
    server.api("DELETE", &path, &admin, "").expect(204);
    let gone = server.api("GET", &path, &user, "");
    gone.expect(404);
    assert!(gone
        .text()
        .contains(&format!("template '{name}' not found")));
    assert!(!Path::new(&image).exists(), "image {image} kept");
    server.api("DELETE", &path, &admin, "").expect(404);
    let e2b = server
        .api("GET", "/templates", &user, "")
        .expect(200)
        .json();
    assert!(!name_in(&e2b, "templateID", &name), "{e2b}");
}

#[test]
fn bad_and_hostile_uploads_are_refused() {
    let state = State::new("srv-bad");
    let server = Server::start(state.path());
    let admin = admin_key(state.path());
    let name = format!("bad-{:08x}", rand() as u32);
    let query = format!("name={name}");

    // A Dockerfile husk does not support: 400 naming the line.
    let ctx = TempDir::new("srv-bad-ctx");
    fs::write(ctx.path().join("Dockerfile"), "FROM scratch\nCMD [\"x\"]\n").unwrap();
    let r = server.upload(&query, &admin, &tar(ctx.path(), &["-cf", "-", "."]));
    r.expect(400);
    assert!(r.text().contains("Dockerfile:2"), "{}", r.text());

    // The spec named by `file=`, and its absence.
    fs::create_dir(ctx.path().join("sub")).unwrap();
    fs::write(ctx.path().join("sub/other"), "FROM scratch\nCMD [\"x\"]\n").unwrap();
    let archive = tar(ctx.path(), &["-cf", "-", "."]);
    let r = server.upload(&format!("{query}&file=sub/other"), &admin, &archive);
    assert!(r.expect(400).text().contains("other:2"), "{}", r.text());
    let r = server.upload(&format!("{query}&file=sub/none"), &admin, &archive);
    assert!(r.expect(400).text().contains("sub/none"), "{}", r.text());
    let r = server.upload(&format!("{query}&file=../x"), &admin, &archive);
    r.expect(400);
    let empty = TempDir::new("srv-empty");
    let r = server.upload(&query, &admin, &tar(empty.path(), &["-cf", "-", "."]));
    assert!(
        r.expect(400).text().contains("no husk.toml"),
        "{}",
        r.text()
    );

    // `..` in an entry: refused, and nothing written next to the context directory.
    let outer = TempDir::new("srv-evil");
    fs::create_dir(outer.path().join("ctx")).unwrap();
    fs::write(outer.path().join("evil"), "x").unwrap();
    let evil = tar(&outer.path().join("ctx"), &["-cPf", "-", "../evil"]);
    let r = server.upload(&query, &admin, &evil);
    assert!(r.expect(400).text().contains("'..'"), "{}", r.text());
    let templates = state.path().join("templates");
    assert!(!templates.join("evil").exists());
    assert!(!templates.join("contexts/evil").exists());

    // A symlink out of the context, and a device file.
    let links = TempDir::new("srv-links");
    std::os::unix::fs::symlink("/etc/shadow", links.path().join("Dockerfile")).unwrap();
    let r = server.upload(&query, &admin, &tar(links.path(), &["-cf", "-", "."]));
    assert!(r.expect(400).text().contains("outside"), "{}", r.text());
    let dev = TempDir::new("srv-dev");
    let ok = Command::new("mknod")
        .arg(dev.path().join("null"))
        .args(["c", "1", "3"])
        .status()
        .unwrap()
        .success();
    assert!(ok, "mknod");
    let r = server.upload(&query, &admin, &tar(dev.path(), &["-cf", "-", "."]));
    assert!(r.expect(400).text().contains("device"), "{}", r.text());

    // Not a tar archive, a bad name, the reserved name.
    let r = server.upload(&query, &admin, &[7u8; 4096]);
    r.expect(400);
    server.upload("name=Bad", &admin, &archive).expect(400);
    server.upload("name=host", &admin, &archive).expect(400);
    server.upload("", &admin, &archive).expect(400);
    // Without a key at all.
    let r = server.request("POST", "/husk/v1/templates?name=x", &[], &archive);
    r.expect(401);

    assert!(
        contexts(state.path()).is_empty(),
        "build contexts left behind"
    );
    let list = server.api("GET", "/husk/v1/templates", &admin, "").json();
    assert_eq!(list["templates"].as_array().unwrap().len(), 1, "{list}");
}

#[test]
fn one_build_at_a_time_and_a_client_that_leaves_does_not_stop_it() {
    let state = State::new("srv-leave");
    let server = Server::start(state.path());
    let admin = admin_key(state.path());
    let name = format!("leave-{:08x}", rand() as u32);
    let ctx = TempDir::new("srv-leave-ctx");
    busybox_context(ctx.path(), "RUN sleep 2 && echo slept > /slept\n");
    let archive = tar(ctx.path(), &["-cf", "-", "."]);

    // Start the build and read its stream until the slow step runs.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "POST /husk/v1/templates?name={name} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-KEY: {admin}\r\n\
         Content-Type: application/x-tar\r\nContent-Length: {}\r\n\r\n",
        archive.len()
    )
    .unwrap();
    s.write_all(&archive).unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("sleep 2") {
        let n = s.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }

    // A second build meanwhile is refused.
    let r = server.upload(&format!("name={name}-2"), &admin, &archive);
    assert!(
        r.expect(409).text().contains("already running"),
        "{}",
        r.text()
    );

    // The client goes away; the build still completes and cleans up after itself.
    drop(s);
    let path = format!("/husk/v1/templates/{name}");
    common::wait_for(Duration::from_secs(60), || {
        (server.api("GET", &path, &admin, "").status == 200).then_some(())
    })
    .expect("the build did not finish after its client left");
    common::wait_for(Duration::from_secs(10), || {
        contexts(state.path()).is_empty().then_some(())
    })
    .expect("build context left behind");
    // The slot is free again (it is released just after the context is removed).
    let again = common::wait_for(Duration::from_secs(10), || {
        let a = server.upload(&format!("name={name}"), &admin, &archive);
        (a.status != 409).then_some(a)
    })
    .expect("the build slot was never released");
    let text = again.expect(200).text();
    assert!(
        text.lines().last().unwrap().contains(r#""type":"done""#),
        "{text}"
    );
}
