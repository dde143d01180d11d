//! A batch of CPU-bound items runs them in parallel: every item's work overlaps every other's
//! (each prints when its work started and ended). How much faster that is belongs to the
//! benchmark (`tests/compat/bench.sh`, batch walls at parallelism 1, 2 and 4), not to a test
//! whose verdict would depend on the machine's load.

mod common;

use std::time::{Duration, Instant};

use common::server::Server;
use common::TempDir;
use serde_json::{json, Value};

/// A CPU-bound item: a fixed amount of work (not a fixed time), framed by wall-clock stamps.
const BUSY: &str = "import time\nt0 = time.time()\nn = 0\nfor i in range(3_000_000):\n    n += i * i\nprint(t0, time.time())";

fn batch(server: &Server, items: usize, parallel: usize) -> (Vec<Value>, Duration) {
    let spec = json!({
        "run": {"code": BUSY},
        "items": (0..items).map(|i| json!({"args": [i.to_string()]})).collect::<Vec<_>>(),
        "parallel": parallel,
    });
    let t0 = Instant::now();
    let events = server.post_events("/husk/v1/batches", &server.admin_key, &spec);
    (events, t0.elapsed())
}

#[test]
fn five_cpu_bound_items_run_in_parallel_and_every_item_is_reported() {
    let state = TempDir::new("batch-parallel");
    let server = Server::start(state.path());
    let (events, five) = batch(&server, 5, 5);

    let end = events.last().unwrap();
    assert_eq!(end["type"], "batch_finished", "{events:#?}");
    let b = &end["batch"];
    assert_eq!(b["total"], 5);
    assert_eq!(b["succeeded"], 5, "{b:#}");
    let mut spans: Vec<(usize, f64, f64)> = events
        .iter()
        .filter(|e| e["type"] == "item_finished")
        .map(|e| {
            let out = e["run"]["stdout_tail"].as_str().unwrap();
            let mut it = out.split_whitespace().map(|x| x.parse::<f64>().unwrap());
            let (s, f) = (it.next().unwrap(), it.next().unwrap());
            (e["index"].as_u64().unwrap() as usize, s, f)
        })
        .collect();
    spans.sort_by_key(|s| s.0);
    let indexes: Vec<usize> = spans.iter().map(|s| s.0).collect();
    assert_eq!(indexes, vec![0, 1, 2, 3, 4], "every item reported once");
    // All five were running at once: each started before any of them finished.
    let last_start = spans.iter().map(|s| s.1).fold(f64::MIN, f64::max);
    let first_end = spans.iter().map(|s| s.2).fold(f64::MAX, f64::min);
    assert!(last_start < first_end, "items did not overlap: {spans:?}");
    println!("five in parallel took {five:?}");
}
