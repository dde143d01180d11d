//! `husk serve`'s listener against clients without a key that open connections and never
//! finish a request head (slowloris), some of them with heads far over the bound: the server
//! still answers another client, closes every stalled connection, and its memory stays small.
//! Only loopback is used: the stalling peer is 127.0.0.1, the well-behaved one 127.0.0.2.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::server::Server;
use common::{wait_for, TempDir};

const STALLED: usize = 300;
const PER_IP: usize = 100;
/// Every other stalled head is this long and unfinished: over the 64 KiB bound.
const BIG_HEAD: usize = 300 << 10;

/// The server's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// A connection from the loopback address `from`.
fn connect_from(from: [u8; 4], port: u16) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap()
    });
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// One request with the admin key from 127.0.0.2, read to the end: its status.
fn admin_get(server: &Server, path: &str) -> u16 {
    let mut s = connect_from([127, 0, 0, 2], server.port);
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-API-Key: {}\r\nConnection: close\r\n\r\n",
        server.admin_key
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    String::from_utf8_lossy(&raw[..12])
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// Reads `s` until the server closes it (end of stream or reset), at most until `deadline`.
fn closed_by(s: &mut TcpStream, deadline: Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        s.set_read_timeout(Some(left)).unwrap();
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn stalled_heads_without_a_key_neither_starve_others_nor_stay_nor_cost_memory() {
    let state = TempDir::new("listener");
    let mut server = Server::start_with(
        state.path(),
        &[
            "--header-timeout",
            "2s",
            "--max-connections-per-ip",
            &PER_IP.to_string(),
        ],
    );
    let pid = server.child().id();
    assert_eq!(admin_get(&server, "/v2/sandboxes"), 200);
    let rss_before = rss_kib(pid);

    let mut stalled = Vec::new();
    for i in 0..STALLED {
        let mut s = connect_from([127, 0, 0, 1], server.port);
        s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = b"GET /v2/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ".to_vec();
        if i % 2 == 0 {
            head.resize(head.len() + BIG_HEAD, b'a');
        }
        // A connection over the cap, or a head over the bound, may be closed mid-write.
        let _ = s.write_all(&head);
        stalled.push(s);
    }

    // While they stall, another client is served.
    assert_eq!(admin_get(&server, "/v2/sandboxes"), 200);
    let rss_stalled = rss_kib(pid);
    eprintln!("server RSS: {rss_before} KiB idle, {rss_stalled} KiB with {STALLED} stalled");
    // Generous: held in full, the big heads alone would be ~45 MiB.
    assert!(
        rss_stalled < rss_before + (32 << 10),
        "RSS grew from {rss_before} to {rss_stalled} KiB"
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    let open: Vec<usize> = (0..STALLED)
        .filter(|&i| !closed_by(&mut stalled[i], deadline))
        .collect();
    assert!(
        open.is_empty(),
        "{} stalled connections still open",
        open.len()
    );

    // Their slots are free again: the stalling address is served too.
    let served = wait_for(Duration::from_secs(30), || {
        let mut s = connect_from([127, 0, 0, 1], server.port);
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        let mut raw = Vec::new();
        s.write_all(req).ok()?;
        s.read_to_end(&mut raw).ok()?;
        raw.starts_with(b"HTTP/1.1 204").then_some(())
    });
    assert!(served.is_some(), "127.0.0.1 is still refused");
}
