//! The gateway's picture of the nodes: refreshed from the database every
//! [`REFRESH`](super::REFRESH), kept in memory, so that routing a request never asks the
//! database (and keeps working while the database is away). Placement picks among the
//! nodes that are ready, recently heard from and below their capacity.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use husk_core::store::cluster::{NodeRow, NodeState};

/// A node not heard from for this long gets no creates (its heartbeat is every second).
pub const FRESH: Duration = Duration::from_secs(3);

/// How long a create this gateway placed counts in its node's load on top of what the node
/// reports: until a heartbeat (every second) has counted it and the gateway read that (every
/// half second). It counts twice meanwhile, which only errs towards spreading.
pub const RECENT: Duration = Duration::from_millis(1500);

/// A node as this gateway knows it.
#[derive(Debug)]
pub struct Node {
    pub row: NodeRow,
    /// Creates this gateway sent it that have not been answered yet.
    inflight: Arc<AtomicU32>,
    /// When this gateway placed its latest creates there (within [`RECENT`]).
    recent: Arc<Mutex<VecDeque<Instant>>>,
}

impl Node {
    /// Sandboxes it has or is about to have, as far as this gateway knows.
    fn load(&self) -> u64 {
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        while recent.front().is_some_and(|t| t.elapsed() > RECENT) {
            recent.pop_front();
        }
        u64::from(self.row.load.live)
            + u64::from(self.inflight.load(Ordering::Relaxed))
            + recent.len() as u64
    }

    fn placed(&self) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.push_back(Instant::now());
        // Bounded by what a gateway places in RECENT; a cap keeps a burst from growing it.
        if recent.len() > 100_000 {
            recent.pop_front();
        }
    }
}

/// A create on its way to a node: counted in the node's load until dropped.
pub struct Placed {
    pub node: Arc<Node>,
}

impl Drop for Placed {
    fn drop(&mut self) {
        self.node.inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

struct Picture {
    nodes: Vec<Arc<Node>>,
    by_code: HashMap<String, Arc<Node>>,
    /// When the database last said this.
    at: Instant,
}

/// Every node, by code.
pub struct Nodes {
    picture: RwLock<Arc<Picture>>,
}

impl Default for Nodes {
    fn default() -> Self {
        Nodes {
            picture: RwLock::new(Arc::new(Picture {
                nodes: Vec::new(),
                by_code: HashMap::new(),
                at: Instant::now(),
            })),
        }
    }
}

impl Nodes {
    fn now(&self) -> Arc<Picture> {
        self.picture
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Replaces the picture with what the database says now (creates in flight carry over).
    pub fn refresh(&self, rows: Vec<NodeRow>) {
        let old = self.now();
        let nodes: Vec<Arc<Node>> = rows
            .into_iter()
            .map(|row| {
                let (inflight, recent) = old
                    .by_code
                    .get(&row.code)
                    .map(|n| (n.inflight.clone(), n.recent.clone()))
                    .unwrap_or_default();
                Arc::new(Node {
                    row,
                    inflight,
                    recent,
                })
            })
            .collect();
        let by_code = nodes
            .iter()
            .map(|n| (n.row.code.clone(), n.clone()))
            .collect();
        *self.picture.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(Picture {
            nodes,
            by_code,
            at: Instant::now(),
        });
    }

    /// The node whose code is `code`, whatever its state.
    pub fn by_code(&self, code: &str) -> Option<Arc<Node>> {
        self.now().by_code.get(code).cloned()
    }

    /// Nodes that may hold sandboxes (all but those declared lost).
    pub fn serving(&self) -> Vec<Arc<Node>> {
        self.now()
            .nodes
            .iter()
            .filter(|n| n.row.state != NodeState::Lost)
            .cloned()
            .collect()
    }

    /// Nodes that take creates now: ready, heard from within [`FRESH`] (counting the age of
    /// this picture), below capacity; `except` left out (a node that just failed).
    fn candidates(&self, except: &[String]) -> Vec<Arc<Node>> {
        let picture = self.now();
        let age = picture.at.elapsed();
        picture
            .nodes
            .iter()
            .filter(|n| {
                n.row.state == NodeState::Ready
                    && n.row.silent_for + age < FRESH
                    && n.load() < u64::from(n.row.capacity)
                    && !except.contains(&n.row.code)
            })
            .cloned()
            .collect()
    }

    /// A node for a new sandbox: among those holding the template's image (`digest`) if any
    /// can take it (the others would fetch it first), the less loaded (relative to capacity)
    /// of two picked at random, which balances nearly as well as the least loaded of all
    /// without every gateway sending its creates to the same one between heartbeats.
    pub fn place(
        &self,
        except: &[String],
        digest: Option<&str>,
        random: impl FnMut() -> u64,
    ) -> Option<Placed> {
        let all = self.candidates(except);
        let holding: Vec<Arc<Node>> = match digest {
            Some(d) => all
                .iter()
                .filter(|n| n.row.load.templates.iter().any(|t| t == d))
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        let pool = if holding.is_empty() { &all } else { &holding };
        let node = choose(pool, random)?;
        node.placed();
        Some(Placed { node })
    }

    /// One node for requests about `key` (a template): the same node for the same key while
    /// the ready nodes stay the same (rendezvous hashing), so a build's steps meet.
    pub fn for_key(&self, key: &str) -> Option<Arc<Node>> {
        let picture = self.now();
        let age = picture.at.elapsed();
        picture
            .nodes
            .iter()
            .filter(|n| n.row.state == NodeState::Ready && n.row.silent_for + age < FRESH)
            .max_by_key(|n| rendezvous(key, &n.row.code))
            .cloned()
    }
}

/// Of two candidates drawn at random, the one with the smaller share of its capacity used.
fn choose(candidates: &[Arc<Node>], mut random: impl FnMut() -> u64) -> Option<Arc<Node>> {
    let n = candidates.len() as u64;
    if n == 0 {
        return None;
    }
    let a = &candidates[(random() % n) as usize];
    let b = &candidates[(random() % n) as usize];
    // load_a / cap_a <= load_b / cap_b, without division.
    let share = |x: &Node| (x.load(), u64::from(x.row.capacity.max(1)));
    let ((la, ca), (lb, cb)) = (share(a), share(b));
    Some(if la * cb <= lb * ca {
        a.clone()
    } else {
        b.clone()
    })
}

/// FNV-1a of `key` and `code`: a stable score (not a secret one).
fn rendezvous(key: &str, code: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes().chain([0]).chain(code.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use husk_core::store::cluster::NodeLoad;
    use std::collections::HashSet;

    fn row(name: &str, code: &str, state: NodeState, capacity: u32, live: u32) -> NodeRow {
        NodeRow {
            name: name.into(),
            code: code.into(),
            url: format!("http://{name}:3000"),
            state,
            capacity,
            load: NodeLoad {
                live,
                templates: Vec::new(),
            },
            silent_for: Duration::from_millis(200),
            held: false,
        }
    }

    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed.max(1);
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    #[test]
    fn only_ready_fresh_nodes_below_capacity_get_creates() {
        let nodes = Nodes::default();
        let mut silent = row("d", "dddd", NodeState::Ready, 10, 0);
        silent.silent_for = FRESH;
        nodes.refresh(vec![
            row("a", "aaaa", NodeState::Ready, 10, 3),
            row("b", "bbbb", NodeState::Draining, 10, 0),
            row("c", "cccc", NodeState::Lost, 10, 0),
            silent,
            row("e", "eeee", NodeState::Ready, 2, 2),
        ]);
        let mut random = rng(7);
        // Left out (it just failed): nothing else takes creates.
        assert!(nodes.place(&["aaaa".into()], None, &mut random).is_none());
        // Seven places left on "a" (3 of 10 live); each placed create counts at once.
        for _ in 0..7 {
            let p = nodes.place(&[], None, &mut random).expect("a node");
            assert_eq!(p.node.row.name, "a");
        }
        assert!(nodes.place(&[], None, &mut random).is_none(), "a is full");
        // Lost nodes still route (they may come back), but are not among those serving.
        assert!(nodes.by_code("cccc").is_some());
        let serving: Vec<_> = nodes.serving().iter().map(|n| n.row.name.clone()).collect();
        assert_eq!(serving, ["a", "b", "d", "e"]);
    }

    #[test]
    fn creates_spread_by_load_and_count_until_they_land() {
        let nodes = Nodes::default();
        nodes.refresh(vec![
            row("a", "aaaa", NodeState::Ready, 100, 0),
            row("b", "bbbb", NodeState::Ready, 100, 0),
            row("c", "cccc", NodeState::Ready, 100, 0),
        ]);
        let mut random = rng(42);
        // Held (in flight): each counts against its node, so they spread evenly.
        let held: Vec<Placed> = (0..30)
            .map(|_| nodes.place(&[], None, &mut random).expect("a node"))
            .collect();
        let mut per: HashMap<String, usize> = HashMap::new();
        for p in &held {
            *per.entry(p.node.row.name.clone()).or_default() += 1;
        }
        for name in ["a", "b", "c"] {
            let n = per.get(name).copied().unwrap_or(0);
            assert!((7..=13).contains(&n), "{per:?}");
        }
        // A refresh keeps what is in flight; landing gives it back.
        nodes.refresh(vec![
            row("a", "aaaa", NodeState::Ready, 100, 0),
            row("b", "bbbb", NodeState::Ready, 100, 0),
            row("c", "cccc", NodeState::Ready, 100, 0),
        ]);
        let a = nodes.by_code("aaaa").unwrap();
        // In flight, and placed recently: counted twice until the heartbeat has it.
        assert_eq!(a.load(), 2 * per["a"] as u64);
        drop(held);
        assert_eq!(a.load(), per["a"] as u64);
    }

    #[test]
    fn creates_one_after_another_spread_before_any_heartbeat() {
        let nodes = Nodes::default();
        nodes.refresh(vec![
            row("a", "aaaa", NodeState::Ready, 100, 0),
            row("b", "bbbb", NodeState::Ready, 100, 0),
            row("c", "cccc", NodeState::Ready, 100, 0),
        ]);
        let mut random = rng(3);
        let mut per: HashMap<String, usize> = HashMap::new();
        for _ in 0..12 {
            // Each answered at once: nothing stays in flight.
            let p = nodes.place(&[], None, &mut random).expect("a node");
            *per.entry(p.node.row.name.clone()).or_default() += 1;
        }
        for name in ["a", "b", "c"] {
            let n = per.get(name).copied().unwrap_or(0);
            assert!((2..=6).contains(&n), "{per:?}");
        }
    }

    #[test]
    fn a_template_goes_where_its_image_is_while_that_node_takes_creates() {
        let nodes = Nodes::default();
        let mut b = row("b", "bbbb", NodeState::Ready, 100, 50);
        b.load.templates = vec!["sha256:t".into()];
        nodes.refresh(vec![row("a", "aaaa", NodeState::Ready, 100, 0), b.clone()]);
        let mut random = rng(5);
        for _ in 0..20 {
            let p = nodes.place(&[], Some("sha256:t"), &mut random).unwrap();
            assert_eq!(p.node.row.name, "b", "the holder, though busier");
        }
        // Nobody holds it, or the holder is full: anywhere (the node fetches it).
        let names: HashSet<String> = (0..10)
            .map(|_| {
                nodes
                    .place(&[], Some("sha256:other"), &mut random)
                    .unwrap()
                    .node
                    .row
                    .name
                    .clone()
            })
            .collect();
        assert!(names.contains("a"), "{names:?}");
        b.load.live = 100;
        nodes.refresh(vec![row("a", "aaaa", NodeState::Ready, 100, 0), b]);
        let p = nodes.place(&[], Some("sha256:t"), &mut random).unwrap();
        assert_eq!(p.node.row.name, "a");
    }

    #[test]
    fn a_key_maps_to_one_node_while_the_nodes_stay() {
        let nodes = Nodes::default();
        nodes.refresh(vec![
            row("a", "aaaa", NodeState::Ready, 10, 0),
            row("b", "bbbb", NodeState::Ready, 10, 0),
            row("c", "cccc", NodeState::Ready, 10, 0),
        ]);
        let first = nodes.for_key("my-app").unwrap().row.code.clone();
        for _ in 0..10 {
            assert_eq!(nodes.for_key("my-app").unwrap().row.code, first);
        }
        let homes: std::collections::HashSet<String> = (0..64)
            .map(|i| nodes.for_key(&format!("t{i}")).unwrap().row.code.clone())
            .collect();
        assert_eq!(homes.len(), 3, "keys spread over the nodes");
        assert!(Nodes::default().for_key("x").is_none());
    }
}
