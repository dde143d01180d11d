//! End to end: kept sandboxes (`husk_runtime::keep`) outlive their spawner, and a later
//! spawner of the same owner takes them up: a real agent as PID 1 of real sandboxes, spawners
//! killed with SIGKILL, connections made again through the rendezvous.
//!
//! Needs root (it creates sandboxes). It has its own `main` (`harness = false`): spawners are
//! forked before any thread exists (the async runtime is current-thread, so forks later on
//! are too). Whatever it leaves is destroyed when it ends, also when it fails: a spawner of
//! the test's owner takes up what is left and destroys it.

use std::os::fd::AsFd;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use husk_core::agent::AgentClient;
use std::io::{Read, Write};

use husk_proto::{FromAgent, Hello, Reply, Request, Selector, StartProc, ToAgent};
use husk_runtime::cgroup::CgroupOptions;
use husk_runtime::service::{self, Created, SpawnerService};
use husk_runtime::sys;

#[path = "support/kept.rs"]
mod kept;
use kept::{alive, hello_with, kept_spec, wait_gone, Cleanup};

fn spawner(owner: &str) -> SpawnerService {
    service::start_owned(
        husk_agent::main,
        CgroupOptions::default(),
        None,
        Some(owner.to_string()),
    )
    .expect("start a spawner (needs root)")
}

/// Kills a spawner as a crash would, and waits for it to be gone.
fn kill(spawner: SpawnerService) {
    sys::kill(spawner.pid(), libc::SIGKILL).expect("kill the spawner");
    let _ = sys::waitpid(spawner.pid(), 0);
}

/// A process that takes the uid slot lock of sandbox `id` (`s<slot>-…`), as another husk's
/// reaper does for a moment, and lets it go after `hold`: its pid, once the lock is held. It
/// exits 0 if it held the lock until then, 1 if it could not take it.
fn hold_slot_lock(id: &str, hold: Duration) -> libc::pid_t {
    let slot: u32 = id
        .split('-')
        .next()
        .and_then(|s| s.strip_prefix('s'))
        .and_then(|s| s.parse().ok())
        .expect("a sandbox id names its slot");
    let locks = std::path::Path::new(husk_runtime::spawner::DEFAULT_RUN_DIR).join("uid-slots");
    let (r, w) = sys::pipe().expect("a pipe");
    // SAFETY: the test is single-threaded (its async runtime is current-thread); the child
    // only takes a lock, writes, sleeps and exits.
    let pid = unsafe { sys::fork() }.expect("fork");
    if pid == 0 {
        drop(r);
        let held = husk_runtime::uidrange::try_take(&locks, slot);
        let Ok(Some(_lock)) = held else {
            sys::exit_now(1)
        };
        let _ = sys::write_all(w.as_fd(), b"+");
        std::thread::sleep(hold);
        sys::exit_now(0)
    }
    drop(w);
    let mut byte = [0u8; 1];
    assert_eq!(
        sys::read(r.as_fd(), &mut byte).expect("read the holder's pipe"),
        1,
        "another process takes the free slot lock of a kept sandbox"
    );
    pid
}

fn hello() -> Hello {
    hello_with(vec![("KEPT".into(), "yes".into())])
}

async fn processes(agent: &AgentClient) -> Vec<(u32, Option<String>)> {
    match agent.call(Request::List).await.expect("list processes") {
        Reply::Processes(p) => p.into_iter().map(|p| (p.pid, p.tag)).collect(),
        other => panic!("unexpected {other:?}"),
    }
}

async fn start_tagged(agent: &AgentClient, tag: &str) -> u32 {
    let mut p = StartProc::new("/bin/sh", vec!["-c".into(), "sleep 1000".into()]);
    p.tag = Some(tag.into());
    match agent
        .call(Request::Start(p))
        .await
        .expect("start a process")
    {
        Reply::Started { pid } => pid,
        other => panic!("unexpected {other:?}"),
    }
}

fn send(conn: &mut std::os::unix::net::UnixStream, msg: &ToAgent) {
    let frame = husk_proto::encode(msg).expect("encode");
    conn.write_all(&frame).expect("send a frame");
}

fn receive(conn: &mut std::os::unix::net::UnixStream) -> FromAgent {
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut header = [0u8; 4];
    conn.read_exact(&mut header).expect("a frame's header");
    let mut body = vec![0u8; husk_proto::frame_len(header).expect("a frame's length")];
    conn.read_exact(&mut body).expect("a frame");
    husk_proto::decode(&body).expect("a message")
}

fn main() {
    let owner = format!("/husk-keep-test/{}", std::process::id());
    let _cleanup = Cleanup(owner.clone());
    let first = spawner(&owner);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(cases(first, &owner));
    drop(rt);
    println!("kept sandboxes end to end: ok");
}

async fn cases(first: SpawnerService, owner: &str) {
    let a: Created = first.create(&kept_spec()).expect("create kept sandbox a");
    let b: Created = first.create(&kept_spec()).expect("create kept sandbox b");
    let (a_pid, b_pid) = (a.init_pid, b.init_pid);
    let agent_a = AgentClient::connect(a.agent, hello())
        .await
        .expect("hello a");
    let agent_b = AgentClient::connect(b.agent, hello())
        .await
        .expect("hello b");
    let sleeper = start_tagged(&agent_a, "sleeper").await;
    start_tagged(&agent_b, "other").await;

    // A spawner that crashes leaves kept sandboxes running, and their first connections too.
    kill(first);
    assert!(
        alive(a_pid) && alive(b_pid),
        "kept sandboxes outlive their spawner"
    );
    assert!(processes(&agent_a)
        .await
        .contains(&(sleeper, Some("sleeper".into()))));

    // A spawner of another owner takes up nothing, and removes nothing alive.
    let stranger = spawner(&format!("{owner}-other"));
    assert!(stranger.adopted().is_empty());
    stranger.shutdown().expect("stop the other owner's spawner");
    assert!(alive(a_pid) && alive(b_pid));

    // The owner's next spawner takes both up, also while another process holds a's slot lock
    // when it starts (another husk's reaper or create probing the slot, or the previous
    // spawner still exiting): it tries again rather than leave a live sandbox behind. A new
    // connection replaces the old one, and the sandbox kept its processes (same pid, same tag)
    // and its environment.
    let holder = hold_slot_lock(&a.id, Duration::from_millis(1500));
    let second = spawner(owner);
    assert_eq!(
        sys::waitpid(holder, 0)
            .ok()
            .flatten()
            .map(|(_, status)| status.code()),
        Some(0),
        "the slot's other holder held it while the spawner started"
    );
    let mut ids: Vec<String> = second.adopted().iter().map(|x| x.id.clone()).collect();
    ids.sort();
    let mut want = vec![a.id.clone(), b.id.clone()];
    want.sort();
    assert_eq!(ids, want, "the owner's spawner takes up its kept sandboxes");
    let again = second.reconnect(&a.id).expect("reconnect to a");
    assert_eq!(again.init_pid, a_pid);
    let agent_a2 = AgentClient::connect(again.agent, hello())
        .await
        .expect("hello a again");
    tokio::time::timeout(Duration::from_secs(10), agent_a.closed())
        .await
        .expect("the agent drops the connection it had");
    assert!(processes(&agent_a2)
        .await
        .contains(&(sleeper, Some("sleeper".into()))));
    match agent_a2.call(Request::Env).await.expect("env") {
        Reply::Env(env) => assert!(env.contains(&("KEPT".into(), "yes".into()))),
        other => panic!("unexpected {other:?}"),
    }
    match agent_a2
        .call(Request::Find(Selector::Tag("sleeper".into())))
        .await
        .expect("find by tag")
    {
        Reply::Started { pid } => assert_eq!(pid, sleeper),
        other => panic!("unexpected {other:?}"),
    }
    // The network namespace that comes with it is the sandbox's own.
    let ns_of = |pid: i32| {
        std::fs::metadata(format!("/proc/{pid}/ns/net")).map(|m| {
            use std::os::unix::fs::MetadataExt;
            m.ino()
        })
    };
    let passed = {
        use std::os::unix::fs::MetadataExt;
        std::fs::File::from(again.netns)
            .metadata()
            .expect("netns")
            .ino()
    };
    assert_eq!(Some(passed), ns_of(a_pid).ok());

    // An adopted sandbox is destroyed like any other: PID 1 gone, its entry removed.
    second.destroy(&b.id).expect("destroy adopted b");
    assert!(wait_gone(b_pid, Duration::from_secs(5)));
    assert!(matches!(
        second.reconnect(&b.id),
        Err(service::ServiceError::Failed(_))
    ));

    // The backstop: with no connection and no spawner, a kept sandbox ends at its deadline.
    // (A plain socket this time, so that the test closes it when it says.)
    let raw = second.reconnect(&a.id).expect("reconnect to a once more");
    tokio::time::timeout(Duration::from_secs(10), agent_a2.closed())
        .await
        .expect("the agent drops the connection it had");
    let mut conn = std::os::unix::net::UnixStream::from(raw.agent);
    let soon = SystemTime::now() + Duration::from_millis(700);
    let ms = soon.duration_since(UNIX_EPOCH).expect("clock").as_millis() as u64;
    send(&mut conn, &ToAgent::Hello(hello()));
    assert!(matches!(receive(&mut conn), FromAgent::Hello { .. }));
    let req = Request::Deadline { unix_ms: Some(ms) };
    send(&mut conn, &ToAgent::Call { id: 1, req });
    assert!(matches!(
        receive(&mut conn),
        FromAgent::Reply {
            id: 1,
            result: Ok(Reply::Done)
        }
    ));
    kill(second);
    // Still connected: the deadline is the server's to enforce.
    std::thread::sleep(Duration::from_millis(900));
    assert!(
        alive(a_pid),
        "a connected agent leaves the timeout to its server"
    );
    drop(conn);
    assert!(
        wait_gone(a_pid, Duration::from_secs(10)),
        "a detached agent ends the sandbox at its deadline"
    );
    // What it left (cgroups, registry entry, uid slot) is a leftover to the next spawner.
    let third = spawner(owner);
    assert!(third.adopted().is_empty());
    assert!(third.reaped_at_start() >= 1, "the ended sandbox is reaped");
    third.shutdown().expect("stop the last spawner");
}
