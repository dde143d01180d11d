//! Templates through `husk serve`'s HTTP API, as an operator and the E2B tools use it: a build
//! from an uploaded context streamed as NDJSON, listing and inspecting, a sandbox created from
//! the template, removal, E2B's `GET /templates`, admin-only changes, and hostile or broken
//! uploads refused with nothing written outside the server's context directory.

mod common;

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::server::{Reply, Server};
use common::tarball::tar;
use common::templates::{busybox_context, State};
use common::{rand, TempDir};
use serde_json::Value;

/// A build context uploaded with `key`: `POST /husk/v1/templates?QUERY`.
fn upload(server: &Server, query: &str, key: &str, tar: &[u8]) -> Reply {
    server.request_with(
        "POST",
        &format!("/husk/v1/templates?{query}"),
        &[("X-API-KEY", key), ("Content-Type", "application/x-tar")],
        tar,
    )
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
    let (admin, user) = (server.admin_key.clone(), user_key(state.path()));
    let name = format!("srv-{:08x}", rand() as u32);
    let ctx = TempDir::new("srv-ctx");
    busybox_context(ctx.path(), "RUN echo hi > /greeting\n");
    let archive = tar(ctx.path(), &["-czf", "-", "."]);

    // Only admin keys build.
    let denied = upload(&server, &format!("name={name}"), &user, &archive).expect(403);
    assert!(denied.text().contains("admin key"), "{}", denied.text());

    // The build streams NDJSON and ends with the template.
    let built = upload(&server, &format!("name={name}"), &admin, &archive).expect(200);
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
    let list = server.request("GET", "/husk/v1/templates", &user, "");
    let list = list.expect(200).json();
    let templates = &list["templates"];
    assert!(templates
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "host" && t["builtin"] == true));
    assert!(name_in(templates, "name", &name), "{list}");
    let one = server
        .request("GET", &format!("/husk/v1/templates/{name}"), &user, "")
        .expect(200)
        .json();
    assert_eq!(one["digest"], last["template"]["digest"]);
    let image = one["image"].as_str().unwrap().to_string();
    assert!(Path::new(&image).is_file(), "{image}");

    // E2B's list names it, and `base` (the host template while no base is built).
    let e2b = server
        .request("GET", "/templates", &user, "")
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
        .request(
            "POST",
            "/sandboxes",
            &user,
            format!(r#"{{"templateID":"{name}"}}"#),
        )
        .expect(201)
        .json();
    assert_eq!(sb["templateID"], name.as_str());
    let id = sb["sandboxID"].as_str().unwrap();
    let token = sb["envdAccessToken"].as_str().unwrap_or("");
    let file = server.request_with(
        "GET",
        "/files?path=/greeting",
        &[("E2b-Sandbox-Id", id), ("X-Access-Token", token)],
        b"",
    );
    assert_eq!(file.expect(200).text(), "hi\n");
    server
        .request("DELETE", &format!("/sandboxes/{id}"), &user, "")
        .expect(204);

    // Only admin keys remove; `host` cannot be removed.
    let path = format!("/husk/v1/templates/{name}");
    server.request("DELETE", &path, &user, "").expect(403);
    server
        .request("DELETE", "/husk/v1/templates/host", &admin, "")
        .expect(400);
    server.request("DELETE", &path, &admin, "").expect(204);
    let gone = server.request("GET", &path, &user, "").expect(404);
    assert!(gone
        .text()
        .contains(&format!("template '{name}' not found")));
    assert!(!Path::new(&image).exists(), "image {image} kept");
    server.request("DELETE", &path, &admin, "").expect(404);
    let e2b = server
        .request("GET", "/templates", &user, "")
        .expect(200)
        .json();
    assert!(!name_in(&e2b, "templateID", &name), "{e2b}");
}

#[test]
fn bad_and_hostile_uploads_are_refused() {
    let state = State::new("srv-bad");
    let server = Server::start(state.path());
    let admin = server.admin_key.clone();
    let name = format!("bad-{:08x}", rand() as u32);
    let query = format!("name={name}");
    // Every upload here is the admin's.
    let up = |query: &str, archive: &[u8]| upload(&server, query, &admin, archive);

    // A Dockerfile husk does not support: 400 naming the line.
    let ctx = TempDir::new("srv-bad-ctx");
    fs::write(ctx.path().join("Dockerfile"), "FROM scratch\nCMD [\"x\"]\n").unwrap();
    let r = up(&query, &tar(ctx.path(), &["-cf", "-", "."])).expect(400);
    assert!(r.text().contains("Dockerfile:2"), "{}", r.text());

    // The spec named by `file=`, and its absence.
    fs::create_dir(ctx.path().join("sub")).unwrap();
    fs::write(ctx.path().join("sub/other"), "FROM scratch\nCMD [\"x\"]\n").unwrap();
    let archive = tar(ctx.path(), &["-cf", "-", "."]);
    let r = up(&format!("{query}&file=sub/other"), &archive).expect(400);
    assert!(r.text().contains("other:2"), "{}", r.text());
    let r = up(&format!("{query}&file=sub/none"), &archive).expect(400);
    assert!(r.text().contains("sub/none"), "{}", r.text());
    up(&format!("{query}&file=../x"), &archive).expect(400);
    let empty = TempDir::new("srv-empty");
    let r = up(&query, &tar(empty.path(), &["-cf", "-", "."])).expect(400);
    assert!(r.text().contains("no husk.toml"), "{}", r.text());

    // `..` in an entry: refused, and nothing written next to the context directory.
    let outer = TempDir::new("srv-evil");
    fs::create_dir(outer.path().join("ctx")).unwrap();
    fs::write(outer.path().join("evil"), "x").unwrap();
    let evil = tar(&outer.path().join("ctx"), &["-cPf", "-", "../evil"]);
    let r = up(&query, &evil).expect(400);
    assert!(r.text().contains("'..'"), "{}", r.text());
    let templates = state.path().join("templates");
    assert!(!templates.join("evil").exists());
    assert!(!templates.join("contexts/evil").exists());

    // A symlink out of the context, and a device file.
    let links = TempDir::new("srv-links");
    std::os::unix::fs::symlink("/etc/shadow", links.path().join("Dockerfile")).unwrap();
    let r = up(&query, &tar(links.path(), &["-cf", "-", "."])).expect(400);
    assert!(r.text().contains("outside"), "{}", r.text());
    let dev = TempDir::new("srv-dev");
    let ok = Command::new("mknod")
        .arg(dev.path().join("null"))
        .args(["c", "1", "3"])
        .status()
        .unwrap()
        .success();
    assert!(ok, "mknod");
    let r = up(&query, &tar(dev.path(), &["-cf", "-", "."])).expect(400);
    assert!(r.text().contains("device"), "{}", r.text());

    // Not a tar archive, a bad name, the reserved name.
    up(&query, &[7u8; 4096]).expect(400);
    up("name=Bad", &archive).expect(400);
    up("name=host", &archive).expect(400);
    up("", &archive).expect(400);
    // Without a key at all.
    server
        .request_with("POST", "/husk/v1/templates?name=x", &[], &archive)
        .expect(401);

    assert!(
        contexts(state.path()).is_empty(),
        "build contexts left behind"
    );
    let list = server
        .request("GET", "/husk/v1/templates", &admin, "")
        .json();
    assert_eq!(list["templates"].as_array().unwrap().len(), 1, "{list}");
}

#[test]
fn one_build_at_a_time_and_a_client_that_leaves_does_not_stop_it() {
    let state = State::new("srv-leave");
    let server = Server::start(state.path());
    let admin = server.admin_key.clone();
    let name = format!("leave-{:08x}", rand() as u32);
    let ctx = TempDir::new("srv-leave-ctx");
    busybox_context(ctx.path(), "RUN sleep 2 && echo slept > /slept\n");
    let archive = tar(ctx.path(), &["-cf", "-", "."]);

    // Start the build and read its stream until the slow step runs.
    let mut s = server.stream_with(
        "POST",
        &format!("/husk/v1/templates?name={name}"),
        &[
            ("X-API-KEY", admin.as_str()),
            ("Content-Type", "application/x-tar"),
        ],
        &archive,
    );
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
    let r = upload(&server, &format!("name={name}-2"), &admin, &archive).expect(409);
    assert!(r.text().contains("already running"), "{}", r.text());

    // The client goes away; the build still completes and cleans up after itself.
    drop(s);
    let path = format!("/husk/v1/templates/{name}");
    common::wait_for(Duration::from_secs(60), || {
        (server.request("GET", &path, &admin, "").status == 200).then_some(())
    })
    .expect("the build did not finish after its client left");
    common::wait_for(Duration::from_secs(10), || {
        contexts(state.path()).is_empty().then_some(())
    })
    .expect("build context left behind");
    // The slot is free again (it is released just after the context is removed).
    let again = common::wait_for(Duration::from_secs(10), || {
        let a = upload(&server, &format!("name={name}"), &admin, &archive);
        (a.status != 409).then_some(a)
    })
    .expect("the build slot was never released");
    let text = again.expect(200).text();
    assert!(
        text.lines().last().unwrap().contains(r#""type":"done""#),
        "{text}"
    );
}
