//! End to end: a server's several spawner processes (`husk_runtime::service::start_spawners`).
//! Creates spread over them, each sandbox is made by (and is the child of) one of them, every
//! later request about a sandbox reaches that one (freeze, thaw, assign, reconnect, the files
//! helper's roots, destroy), concurrent creates in different spawners get different uid slots,
//! and kept sandboxes are taken up by a later service with another number of spawners.
//!
//! Needs root (it creates sandboxes). It has its own `main` (`harness = false`): spawners are
//! forked before any thread exists (the async runtime is current-thread, and the threads
//! that create side by side end before the next spawner is forked). Whatever it leaves is
//! destroyed when it ends, also when it fails: a spawner of the test's owner takes up what
//! is left and destroys it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use husk_core::agent::AgentClient;
use husk_proto::{Hello, Reply, Request};
use husk_runtime::cgroup::CgroupOptions;
use husk_runtime::failure::FailureKind;
use husk_runtime::service::{self, Created, ServiceError, SpawnerService};
use husk_runtime::spawner::worker_of;

#[path = "support/kept.rs"]
mod kept;
use kept::{alive, hello_with, kept_spec, wait_gone, Cleanup};

fn spawners(owner: &str, n: usize) -> SpawnerService {
    service::start_spawners(
        husk_agent::main,
        CgroupOptions::default(),
        None,
        Some(owner.to_string()),
        n,
    )
    .expect("start the spawners (needs root)")
}

fn hello() -> Hello {
    hello_with(Vec::new())
}

/// The parent of process `pid` (its spawner, for a sandbox's PID 1 the spawner made).
fn parent_of(pid: i32) -> i32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("PPid")
}

fn slot_of(id: &str) -> u32 {
    id.split('-')
        .next()
        .and_then(|s| s.strip_prefix('s'))
        .and_then(|s| s.parse().ok())
        .expect("a slot in the id")
}

fn hostname_of(pid: i32) -> String {
    // The UTS namespace's hostname, read through a process in it.
    let out = std::process::Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-u", "hostname"])
        .output()
        .expect("nsenter");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn main() {
    let owner = format!("/husk-spawners-test/{}", std::process::id());
    let _cleanup = Cleanup(owner.clone());
    let first = spawners(&owner, 3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio");
    let made = rt.block_on(spread(&first));
    // A stop that keeps them: a later service with two spawners takes all of them up.
    first
        .shutdown_keeping()
        .expect("stop the spawners, keeping");
    for c in &made {
        assert!(
            alive(c.init_pid),
            "kept sandbox {} outlives its spawner",
            c.id
        );
    }
    let second = spawners(&owner, 2);
    rt.block_on(taken_up(&second, &made));
    second.shutdown().expect("stop the second spawners");
    drop(rt);
    println!("several spawners end to end: ok");
}

/// A sandbox the test made: its id, PID 1 and agent connection.
struct Made {
    id: String,
    init_pid: i32,
    agent: std::os::fd::OwnedFd,
}

impl From<Created> for Made {
    fn from(c: Created) -> Made {
        Made {
            id: c.id,
            init_pid: c.init_pid,
            agent: c.agent,
        }
    }
}

/// Six creates one after the other, then twelve from four threads at once.
async fn spread(service: &SpawnerService) -> Vec<Made> {
    let pids = service.pids();
    assert_eq!(pids.len(), 3, "three spawner processes");
    assert_eq!(pids.iter().collect::<BTreeSet<_>>().len(), 3);
    assert!(pids.iter().all(|p| alive(*p)));

    // Creates one at a time find every spawner idle: they take turns.
    let made: Vec<Created> = (0..6)
        .map(|_| service.create(&kept_spec()).expect("create"))
        .collect();
    let mut per_worker: BTreeMap<usize, usize> = BTreeMap::new();
    for c in &made {
        *per_worker.entry(worker_of(&c.id)).or_default() += 1;
        // Made by the spawner its id names: that process is its PID 1's parent.
        assert_eq!(
            parent_of(c.init_pid),
            pids[worker_of(&c.id)],
            "sandbox {} is the child of the spawner its id names",
            c.id
        );
    }
    assert_eq!(
        per_worker,
        BTreeMap::from([(0, 2), (1, 2), (2, 2)]),
        "creates spread over the spawners"
    );

    // Creates at once in different spawners get different uid slots and ids.
    let together: Vec<Created> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..3)
                        .map(|_| service.create(&kept_spec()).expect("create side by side"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a creating thread"))
            .collect()
    });
    assert_eq!(together.len(), 12);
    let all: Vec<&Created> = made.iter().chain(&together).collect();
    let slots: BTreeSet<u32> = all.iter().map(|c| slot_of(&c.id)).collect();
    assert_eq!(
        slots.len(),
        all.len(),
        "every sandbox has a uid slot of its own"
    );
    let workers: BTreeSet<usize> = together.iter().map(|c| worker_of(&c.id)).collect();
    assert!(
        workers.len() >= 2,
        "creates at once use several spawners: {workers:?}"
    );

    // Every sandbox's agent answers, and requests about it reach its spawner.
    let made: Vec<Made> = made.into_iter().map(Made::from).collect();
    let together: Vec<Made> = together.into_iter().map(Made::from).collect();
    for c in made.iter().chain(&together) {
        let client = AgentClient::connect(c.agent.try_clone().expect("dup"), hello())
            .await
            .expect("hello");
        assert!(matches!(
            client.call(Request::Env).await.expect("env"),
            Reply::Env(_)
        ));
    }
    for c in &made {
        service.freeze(&c.id).expect("freeze");
        service.thaw(&c.id).expect("thaw");
        let name = format!("renamed-{}", worker_of(&c.id));
        let a = husk_runtime::Assignment {
            hostname: name.clone(),
            limits: None,
            mounts: Vec::new(),
        };
        service.assign(&c.id, &a).expect("rename");
        assert_eq!(hostname_of(c.init_pid), name);
    }
    // The files helper's channel reaches every spawner's sandboxes, and only them.
    let roots = service.take_root_channel().expect("the root channel");
    for c in made.iter().filter(|c| worker_of(&c.id) != 0) {
        let root = roots
            .frozen_root(&c.id)
            .expect("a root from another spawner");
        let dev = std::fs::metadata(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            root.as_raw_fd()
        }));
        assert!(dev.is_ok());
        service.thaw(&c.id).expect("thaw after the root");
    }
    match roots.frozen_root("s999999-000000000000-w1") {
        Err(ServiceError::Failed(f)) => assert_eq!(f.kind, FailureKind::NotFound),
        other => panic!("a sandbox no spawner has: {other:?}"),
    }
    // A destroy reaches its spawner; the side-by-side ones go now, the first six are kept.
    for c in &together {
        service.destroy(&c.id).expect("destroy");
        assert!(wait_gone(c.init_pid, Duration::from_secs(5)));
    }
    match service.destroy(&together[0].id) {
        Err(ServiceError::Failed(f)) => assert_eq!(f.kind, FailureKind::NotFound),
        other => panic!("destroyed twice: {other:?}"),
    }
    made
}

/// A service with another number of spawners takes up every kept sandbox, each in the
/// spawner later requests about it reach.
async fn taken_up(service: &SpawnerService, made: &[Made]) {
    let adopted: BTreeSet<String> = service.adopted().iter().map(|a| a.id.clone()).collect();
    let want: BTreeSet<String> = made.iter().map(|c| c.id.clone()).collect();
    assert_eq!(adopted, want, "every kept sandbox is taken up");
    let roots = service.take_root_channel().expect("the root channel");
    for c in made {
        let again = service.reconnect(&c.id).expect("reconnect");
        assert_eq!(again.init_pid, c.init_pid);
        let client = AgentClient::connect(again.agent, hello())
            .await
            .expect("hello again");
        assert!(matches!(
            client.call(Request::Env).await.expect("env"),
            Reply::Env(_)
        ));
        roots
            .frozen_root(&c.id)
            .expect("its root, from its new spawner");
        service.thaw(&c.id).expect("thaw");
    }
    for c in made {
        service.destroy(&c.id).expect("destroy a taken-up sandbox");
        assert!(wait_gone(c.init_pid, Duration::from_secs(5)));
    }
}
