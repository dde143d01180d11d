//! Who may hold a connection: a count of open connections in total and per peer, each held by a
//! [`Slot`] that gives itself back when dropped, however the connection ends (an upgraded
//! connection keeps its slot until the upgrade's own I/O is dropped).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The open connections, counted against two caps.
pub(super) struct Admission {
    max_total: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    total: usize,
    per_peer: HashMap<Peer, usize>,
}

/// What one peer is counted as: an IPv4 address (an IPv4-mapped IPv6 address is the IPv4 one),
/// or an IPv6 /64. An IPv6 host is usually given a whole /64, so a cap per address would not
/// bind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Peer(IpAddr);

impl Peer {
    pub(super) fn of(ip: IpAddr) -> Peer {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Peer(IpAddr::V4(v4)),
            IpAddr::V6(v6) => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                Peer(IpAddr::V6(Ipv6Addr::from(prefix)))
            }
        }
    }
}

/// Why a connection was turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Every slot of the listener is taken.
    Total,
    /// The peer holds all the slots one peer may hold.
    Peer,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refused::Total => "the listener's connection cap",
            Refused::Peer => "the per-peer connection cap",
        })
    }
}

impl Admission {
    pub(super) fn new(max_total: usize, max_per_peer: usize) -> Arc<Admission> {
        Arc::new(Admission {
            max_total,
            max_per_peer,
            open: Mutex::default(),
        })
    }

    /// A slot for a connection from `ip`, unless a cap is reached.
    pub(super) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Slot, Refused> {
        let peer = Peer::of(ip);
        let mut open = self.lock();
        if open.total >= self.max_total {
            return Err(Refused::Total);
        }
        let n = open.per_peer.entry(peer).or_insert(0);
        if *n >= self.max_per_peer {
            return Err(Refused::Peer);
        }
        *n += 1;
        open.total += 1;
        Ok(Slot {
            admission: self.clone(),
            peer,
        })
    }

    /// Open connections: in total, and `ip`'s.
    #[cfg(test)]
    pub(super) fn open(&self, ip: IpAddr) -> (usize, usize) {
        let open = self.lock();
        let peer = open.per_peer.get(&Peer::of(ip)).copied().unwrap_or(0);
        (open.total, peer)
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        // The counts are updated in one step each; a panic elsewhere cannot leave them torn.
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One admitted connection. Dropping it frees the slot.
pub(super) struct Slot {
    admission: Arc<Admission>,
    peer: Peer,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.admission.lock();
        open.total -= 1;
        if let Some(n) = open.per_peer.get_mut(&self.peer) {
            *n -= 1;
            // Peers come and go; the map holds only those with a connection open.
            if *n == 0 {
                open.per_peer.remove(&self.peer);
            }
        }
    }
}

/// Lets a repeated event through to the log at most once per period, with the count of those
/// held back: a flood of refused connections must not become a flood of log lines.
pub(super) struct Throttle {
    period: Duration,
    last: Option<Instant>,
    held: u64,
}

impl Throttle {
    pub(super) fn new(period: Duration) -> Throttle {
        Throttle {
            period,
            last: None,
            held: 0,
        }
    }

    /// `Some(n)` when this event should be logged, `n` being the events not logged since the
    /// last one that was.
    pub(super) fn hit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.period => {
                self.held += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.held))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_per_peer_cap_binds_one_peer_and_not_the_others() {
        let a = Admission::new(10, 2);
        let s1 = a.admit(ip("10.0.0.1")).unwrap();
        let _s2 = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.1")).err(), Some(Refused::Peer));
        let _other = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(a.open(ip("10.0.0.1")), (3, 2));
        drop(s1);
        assert_eq!(a.open(ip("10.0.0.1")), (2, 1));
        let _s3 = a.admit(ip("10.0.0.1")).unwrap();
    }

    #[test]
    fn the_total_cap_binds_every_peer() {
        let a = Admission::new(2, 2);
        let s1 = a.admit(ip("10.0.0.1")).unwrap();
        let _s2 = a.admit(ip("10.0.0.2")).unwrap();
        assert_eq!(a.admit(ip("10.0.0.3")).err(), Some(Refused::Total));
        drop(s1);
        let _s3 = a.admit(ip("10.0.0.3")).unwrap();
    }

    #[test]
    fn mapped_ipv4_is_the_ipv4_peer_and_ipv6_counts_by_64() {
        assert_eq!(Peer::of(ip("::ffff:10.0.0.1")), Peer::of(ip("10.0.0.1")));
        assert_eq!(
            Peer::of(ip("2001:db8:1:2::1")),
            Peer::of(ip("2001:db8:1:2:ffff::9"))
        );
        assert_ne!(
            Peer::of(ip("2001:db8:1:2::1")),
            Peer::of(ip("2001:db8:1:3::1"))
        );
        let a = Admission::new(10, 1);
        let _s = a.admit(ip("10.0.0.1")).unwrap();
        assert_eq!(a.admit(ip("::ffff:10.0.0.1")).err(), Some(Refused::Peer));
    }

    #[test]
    fn freed_peers_leave_the_map() {
        let a = Admission::new(10, 10);
        drop(a.admit(ip("10.0.0.1")).unwrap());
        assert!(a.lock().per_peer.is_empty());
        assert_eq!(a.lock().total, 0);
    }

    #[test]
    fn the_throttle_logs_once_per_period_with_the_count_held_back() {
        let mut t = Throttle::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(t.hit(t0), Some(0));
        assert_eq!(t.hit(t0 + Duration::from_secs(1)), None);
        assert_eq!(t.hit(t0 + Duration::from_secs(2)), None);
        assert_eq!(t.hit(t0 + Duration::from_secs(11)), Some(2));
        assert_eq!(t.hit(t0 + Duration::from_secs(12)), None);
    }
}
