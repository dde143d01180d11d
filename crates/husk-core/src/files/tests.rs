//! The file door against a fake agent with in-memory files: whole files and ranges round-trip
//! in chunks, a file read stops at a shrunk end, and handles are closed however a transfer
//! ends. (No other call can open a handle: [`crate::calls::Call`] has no such call.)

use std::sync::Arc;
use std::time::Duration;

use husk_proto::{User, CHUNK};

use crate::agent::CallError;
use crate::calls::SandboxPath;
use crate::manager::{Config, CreateRequest, LiveSandbox, Manager};
use crate::store::{Principal, Store};
use crate::testing::FakeHost;

fn p(path: &str) -> SandboxPath {
    SandboxPath::new(path).unwrap()
}

async fn sandbox() -> (Arc<Manager>, Arc<FakeHost>, Arc<LiveSandbox>) {
    let store = Arc::new(Store::open_in_memory().unwrap());
    let host = FakeHost::new();
    let config = Config {
        memory_reserve: 0,
        ..Config::default()
    };
    let m = Manager::new(store, host.clone(), config).unwrap();
    let who = Principal {
        team: "a".into(),
        key_id: "k".into(),
        admin: false,
    };
    let req = CreateRequest {
        template: "host".into(),
        timeout: Duration::from_secs(300),
        ..CreateRequest::default()
    };
    let sb = m.create(&who, req).await.unwrap();
    (m, host, sb)
}

/// Two and a half chunks of bytes that say where they are.
fn content() -> Vec<u8> {
    (0..CHUNK * 5 / 2).map(|i| (i % 251) as u8).collect()
}

async fn write(sb: &LiveSandbox, path: &str, data: &[u8]) {
    let mut w = sb
        .write_file(&p(path), User::User, Vec::new())
        .await
        .unwrap();
    for chunk in data.chunks(CHUNK) {
        w.write(chunk.to_vec()).await.unwrap();
    }
    let entry = w.finish().await.unwrap();
    assert_eq!(entry.size, data.len() as u64);
}

async fn read(sb: &LiveSandbox, path: &str, start: u64, end: u64) -> Vec<u8> {
    let file = sb.read_file(&p(path), User::User).await.unwrap();
    let mut rx = file.bytes(start, end);
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        let chunk = chunk.unwrap();
        assert!(chunk.len() <= CHUNK);
        out.extend(chunk);
    }
    out
}

#[tokio::test]
async fn files_and_ranges_round_trip_in_chunks_and_close_their_handles() {
    let (_m, host, sb) = sandbox().await;
    let data = content();
    write(&sb, "/home/user/a.bin", &data).await;
    let size = data.len() as u64;
    assert_eq!(read(&sb, "/home/user/a.bin", 0, size).await, data);
    let (start, end) = (CHUNK as u64 - 7, 2 * CHUNK as u64 + 9);
    assert_eq!(
        read(&sb, "/home/user/a.bin", start, end).await,
        &data[start as usize..end as usize]
    );
    // Past the end of a file that shrank: what there is, no gap, no error.
    assert_eq!(read(&sb, "/home/user/a.bin", 0, size + 5000).await, data);
    // Every handle is closed (the reader's close runs in its task: poll for it).
    let runtime_id = sb.runtime_id.clone();
    assert!(
        host.until(Duration::from_secs(5), |h| h.open_handles(&runtime_id) == 0)
            .await
    );
}

#[tokio::test]
async fn a_transfer_abandoned_midway_closes_its_handle() {
    let (_m, host, sb) = sandbox().await;
    write(&sb, "/f", &content()).await;
    let runtime_id = sb.runtime_id.clone();
    // A reader that takes one chunk and goes away.
    let file = sb.read_file(&p("/f"), User::User).await.unwrap();
    let mut rx = file.bytes(0, content().len() as u64);
    rx.recv().await.unwrap().unwrap();
    drop(rx);
    // A writer dropped before it finished.
    let mut w = sb
        .write_file(&p("/g"), User::User, Vec::new())
        .await
        .unwrap();
    w.write(vec![1; 10]).await.unwrap();
    drop(w);
    assert!(
        host.until(Duration::from_secs(5), |h| h.open_handles(&runtime_id) == 0)
            .await,
        "handles left open: {}",
        host.open_handles(&runtime_id)
    );
}

#[tokio::test]
async fn a_failed_write_has_closed_its_file_when_it_returns() {
    let (_m, host, sb) = sandbox().await;
    let mut w = sb
        .write_file(&p("/full/big"), User::User, Vec::new())
        .await
        .unwrap();
    let mut failed = None;
    for _ in 0..4 {
        if let Err(e) = w.write(vec![0; CHUNK / 2]).await {
            failed = Some(e);
            break;
        }
    }
    match failed {
        Some(CallError::Agent(e)) => assert_eq!(e.kind, husk_proto::ErrorKind::NoSpace),
        other => panic!("expected the disk to fill up, got {other:?}"),
    }
    // No waiting: a client told of the failure may remove the file and expect its space back.
    assert_eq!(host.open_handles(&sb.runtime_id), 0);
}

#[tokio::test]
async fn a_missing_file_is_the_agents_not_found() {
    let (_m, _host, sb) = sandbox().await;
    match sb.read_file(&p("/nope"), User::User).await {
        Err(CallError::Agent(e)) => assert_eq!(e.kind, husk_proto::ErrorKind::NotFound),
        other => panic!("expected not found, got {:?}", other.map(|f| f.entry)),
    }
}
