//! Sandbox link addresses: the sandbox subnet is cut into /31s, one per link. Link `n` has the
//! router at the even address and the sandbox at the odd one.

use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// Free and used link indexes of one subnet. A released index is reused only after every
/// other one was handed out once, so a sandbox's address is not soon another's.
#[derive(Debug)]
pub struct Links {
    subnet: Ipv4Net,
    next: u32,
    free: std::collections::VecDeque<u32>,
    used: std::collections::HashSet<u32>,
}

impl Links {
    pub fn new(subnet: Ipv4Net) -> Links {
        Links {
            subnet: subnet.trunc(),
            next: 0,
            free: Default::default(),
            used: Default::default(),
        }
    }

    /// How many links the subnet holds.
    pub fn capacity(&self) -> u32 {
        let host_bits = 32 - u32::from(self.subnet.prefix_len());
        if host_bits >= 32 {
            u32::MAX
        } else {
            (1u32 << host_bits) / 2
        }
    }

    pub fn take(&mut self) -> Option<u32> {
        let i = loop {
            if self.next < self.capacity() {
                self.next += 1;
                // Reserved ahead of its turn (see reserve).
                if self.used.contains(&(self.next - 1)) {
                    continue;
                }
                break self.next - 1;
            }
            break self.free.pop_front()?;
        };
        self.used.insert(i);
        Some(i)
    }

    /// Takes index `i` itself (a link an earlier router recorded); whether it was free.
    pub fn reserve(&mut self, i: u32) -> bool {
        if i >= self.capacity() || self.used.contains(&i) {
            return false;
        }
        self.free.retain(|&f| f != i);
        self.used.insert(i);
        true
    }

    pub fn give_back(&mut self, i: u32) {
        if self.used.remove(&i) {
            self.free.push_back(i);
        }
    }

    /// (router, sandbox) addresses of link `i`.
    pub fn addresses(&self, i: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.subnet.network()) + 2 * i;
        (Ipv4Addr::from(base), Ipv4Addr::from(base + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_slash_31s_and_reuse_comes_last() {
        let mut l = Links::new("100.96.0.0/29".parse().unwrap());
        assert_eq!(l.capacity(), 4);
        let a = l.take().unwrap();
        assert_eq!(
            l.addresses(a),
            ("100.96.0.0".parse().unwrap(), "100.96.0.1".parse().unwrap())
        );
        l.give_back(a);
        let rest: Vec<u32> = (0..3).map(|_| l.take().unwrap()).collect();
        assert_eq!(rest, vec![1, 2, 3]);
        assert_eq!(l.take(), Some(0));
        assert_eq!(l.take(), None);
        assert_eq!(l.addresses(3).1, "100.96.0.7".parse::<Ipv4Addr>().unwrap());
    }

    #[test]
    fn a_reserved_index_is_never_handed_out_until_given_back() {
        let mut l = Links::new("100.96.0.0/29".parse().unwrap());
        assert!(l.reserve(1));
        assert!(!l.reserve(1), "already reserved");
        assert!(!l.reserve(4), "beyond the subnet");
        let taken: Vec<u32> = (0..3).map(|_| l.take().unwrap()).collect();
        assert_eq!(taken, vec![0, 2, 3]);
        assert_eq!(l.take(), None);
        l.give_back(1);
        assert_eq!(l.take(), Some(1));
    }
}
