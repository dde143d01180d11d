//! One tenant's abuse of a real `husk serve` is bounded by its own limits, and another team's
//! work goes on meanwhile (issue 15: M1, M3, M4). Each test plays the abuse at a bounded scale
//! (a few hundred connections, not host exhaustion) and asserts the barrier that holds it, and
//! that another team is answered while it runs; how fast is the benchmark's business
//! (`husk bench --abuse`), never asserted here.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::sandbox::Sandbox;
use common::server::Server;
use common::{wait_for, TempDir};
use serde_json::json;

/// A raw connection that sent `head` (and `body`) and then stops sending.
fn stalled(server: &Server, head: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    s
}

/// The status of the answer on `s`, waiting at most `within`; `None` if the server closed the
/// connection without one.
fn answer(s: &mut TcpStream, within: Duration) -> Option<u16> {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 12];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    (got == buf.len())
        .then(|| std::str::from_utf8(&buf[9..12]).ok()?.parse().ok())
        .flatten()
}

/// Another team's everyday work: a sandbox created, a command run in it, a workspace made and
/// written. Panics if any of it fails.
fn another_team_works(server: &Server, key: &str, tag: &str) {
    let sb = Sandbox::create(server, key, json!({"templateID": "base"}));
    let ran = sb.run(None, "/bin/echo", &["alive"], &[]);
    assert_eq!(ran.stdout.trim(), "alive", "{ran:?}");
    let name = format!("b-{tag}");
    server
        .request(
            "POST",
            "/husk/v1/workspaces",
            key,
            json!({ "name": name }).to_string(),
        )
        .expect(201);
    let h = [("X-API-Key", key)];
    let r = server.request_with(
        "PUT",
        &format!("/husk/v1/workspaces/{name}/files/f.txt"),
        &h,
        b"hello",
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

/// M1: uploads that send one byte and stall, and downloads nobody reads, hold at most the
/// team's transfer slots (the rest are refused with 429), are cut once a body window passes
/// without data, and never stop another team's creates, commands and workspace calls.
#[test]
fn stalled_transfers_hold_only_their_teams_slots_and_are_cut() {
    let state = TempDir::new("abuse-transfers");
    let server = Server::start_with(
        state.path(),
        &["--body-timeout", "3s", "--max-transfers-per-team", "4"],
    );
    let a = server.key_for("tenant-a");
    let b = server.key_for("tenant-b");
    server
        .request("POST", "/husk/v1/workspaces", &a, r#"{"name": "w"}"#)
        .expect(201);

    // 200 uploads of a declared megabyte that send one byte.
    let mut uploads: Vec<TcpStream> = (0..200)
        .map(|i| {
            let head = format!(
                "PUT /husk/v1/workspaces/w/files/f{i} HTTP/1.1\r\nHost: x\r\n\
                 X-API-Key: {a}\r\nContent-Length: 1000000\r\n\r\n"
            );
            stalled(&server, &head, b"x")
        })
        .collect();
    // While they stall: team A's slots are taken (a small upload of its own is refused)...
    let ha = [("X-API-Key", a.as_str())];
    let refused = wait_for(Duration::from_secs(10), || {
        let r = server.request_with("PUT", "/husk/v1/workspaces/w/files/small", &ha, b"1");
        (r.status == 429).then_some(r)
    })
    .expect("team A's fifth transfer was not refused while four stalled");
    assert!(refused.text().contains("limit"), "{}", refused.text());
    assert_eq!(refused.header("retry-after").as_deref(), Some("1"));
    // ...and team B works as if nothing happened.
    another_team_works(&server, &b, "during-uploads");

    // Every stalled upload gets its answer once the window has passed: 408 for the four that
    // held a slot, 429 for the refused ones (their answer waited for their body, which the
    // window cut too).
    let mut statuses = std::collections::BTreeMap::<Option<u16>, usize>::new();
    for s in &mut uploads {
        *statuses
            .entry(answer(s, Duration::from_secs(30)))
            .or_default() += 1;
    }
    assert_eq!(statuses.get(&Some(408)).copied(), Some(4), "{statuses:?}");
    assert_eq!(statuses.get(&Some(429)).copied(), Some(196), "{statuses:?}");
    drop(uploads);
    // Nothing of the cut uploads is left in the workspace, and the slots are free again.
    let listed = server
        .request("GET", "/husk/v1/workspaces/w/files", &a, "")
        .expect(200)
        .json();
    assert_eq!(listed["entries"], json!([]), "{listed}");
    let r = server.request_with("PUT", "/husk/v1/workspaces/w/files/small", &ha, b"1");
    assert_eq!(r.status, 201, "{}", r.text());

    // Downloads nobody reads: 32 MiB each, four of them take every slot of team A's...
    let big = vec![7u8; 32 << 20];
    let r = server.request_with("PUT", "/husk/v1/workspaces/w/files/big", &ha, &big);
    assert_eq!(r.status, 201, "{}", r.text());
    let head = format!(
        "GET /husk/v1/workspaces/w/files/big HTTP/1.1\r\nHost: x\r\nX-API-Key: {a}\r\n\r\n"
    );
    let readers: Vec<TcpStream> = (0..4).map(|_| stalled(&server, &head, b"")).collect();
    wait_for(Duration::from_secs(10), || {
        let r = server.request_with("GET", "/husk/v1/workspaces/w", &ha, b"");
        (r.status == 429).then_some(())
    })
    .expect("unread downloads did not hold team A's slots");
    another_team_works(&server, &b, "during-downloads");
    // ...until the window cuts them: then team A works again (still not reading them).
    wait_for(Duration::from_secs(30), || {
        let r = server.request_with("GET", "/husk/v1/workspaces/w", &ha, b"");
        (r.status == 200).then_some(())
    })
    .expect("unread downloads kept their slots past the body window");
    drop(readers);
}
