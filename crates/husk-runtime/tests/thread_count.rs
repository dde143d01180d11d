//! `sys::settled_thread_count` in a process of its own (no test harness: the harness's own
//! threads would be counted): a thread that was just joined is not counted once it has gone,
//! and a thread that lives is.

use std::sync::mpsc;

use husk_runtime::sys::{settled_thread_count, thread_count};

fn main() {
    assert_eq!(
        thread_count().unwrap(),
        1,
        "a harness-less test starts with one thread"
    );
    // Joined threads: gone by the time the settled count is read, every time.
    for i in 0..200 {
        std::thread::scope(|s| {
            s.spawn(|| std::hint::black_box(i));
        });
        assert_eq!(settled_thread_count().unwrap(), 1, "round {i}");
    }
    // A thread that lives is counted, after the wait.
    let (tx, rx) = mpsc::channel::<()>();
    let t = std::thread::spawn(move || rx.recv());
    let started = std::time::Instant::now();
    assert_eq!(settled_thread_count().unwrap(), 2);
    assert!(started.elapsed() >= std::time::Duration::from_millis(100));
    drop(tx);
    let _ = t.join();
    assert_eq!(settled_thread_count().unwrap(), 1);
    println!("thread_count: ok");
}
