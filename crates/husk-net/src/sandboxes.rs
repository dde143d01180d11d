//! The live sandboxes' network state, shared by the router (links and rules), the resolver,
//! the domain proxy and the denial log: each sandbox's address, policy (changeable while it
//! runs), its header rules and CA (if it has them) and the log of connections its policy
//! refused.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::ca::SandboxCa;
use crate::policy::NetPolicy;
use crate::rules::HeaderRules;

/// Most denials remembered per sandbox (the oldest go first).
pub const MAX_DENIALS: usize = 1000;

/// One refused connection (or datagram).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// `tcp`, `udp`, `icmp` or another protocol's name.
    pub protocol: String,
    pub address: IpAddr,
    /// 0 when the protocol has no ports.
    pub port: u16,
    /// The name the sandbox asked for (HTTP `Host`, TLS SNI), when the domain proxy saw one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Why: `always denied`, `policy`, `resolves to a denied address`, ….
    pub reason: String,
}

impl Denial {
    pub fn now(protocol: &str, address: IpAddr, port: u16, reason: &str) -> Denial {
        Denial {
            at: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            protocol: protocol.to_owned(),
            address,
            port,
            host: None,
            reason: reason.to_owned(),
        }
    }
}

/// One line for a denial: `denied tcp 10.0.0.5:5432 (always denied)`, with the name when the
/// proxy saw one.
pub fn describe(d: &Denial) -> String {
    let dest = match (d.address, d.port) {
        (a, 0) => a.to_string(),
        (IpAddr::V6(a), p) => format!("[{a}]:{p}"),
        (a, p) => format!("{a}:{p}"),
    };
    match &d.host {
        Some(h) => format!("denied {} {h} at {dest} ({})", d.protocol, d.reason),
        None => format!("denied {} {dest} ({})", d.protocol, d.reason),
    }
}

/// Header rules for a sandbox created without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("network.rules can be changed only on a sandbox created with network.rules (its trust store gets its CA when it is created)")]
pub struct NoCa;

/// One sandbox's network state.
#[derive(Debug)]
pub struct SandboxNet {
    /// The sandbox's address on its link (what its packets come from).
    pub address: Ipv4Addr,
    /// The router's address on the link (the sandbox's gateway and name server).
    pub gateway: Ipv4Addr,
    policy: RwLock<NetPolicy>,
    /// Its CA, made when it was created with header rules (never afterwards: its trust store
    /// is written once).
    ca: Option<Arc<SandboxCa>>,
    rules: RwLock<Arc<HeaderRules>>,
    denials: Mutex<VecDeque<Denial>>,
    /// Denials dropped because the log was full.
    dropped: Mutex<u64>,
}

impl SandboxNet {
    pub fn new(address: Ipv4Addr, gateway: Ipv4Addr, policy: NetPolicy) -> SandboxNet {
        SandboxNet {
            address,
            gateway,
            policy: RwLock::new(policy),
            ca: None,
            rules: RwLock::default(),
            denials: Mutex::new(VecDeque::new()),
            dropped: Mutex::new(0),
        }
    }

    pub fn policy(&self) -> NetPolicy {
        self.policy
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_policy(&self, policy: NetPolicy) {
        *self.policy.write().unwrap_or_else(|p| p.into_inner()) = policy;
    }

    /// This sandbox with `ca` for its header rules.
    pub fn with_ca(mut self, ca: SandboxCa) -> SandboxNet {
        self.ca = Some(Arc::new(ca));
        self
    }

    /// Its CA, if it was created with header rules.
    pub fn ca(&self) -> Option<&Arc<SandboxCa>> {
        self.ca.as_ref()
    }

    /// Its header rules (empty: none).
    pub fn rules(&self) -> Arc<HeaderRules> {
        self.rules.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces its header rules. Rules need the CA (made at creation): without it, only
    /// empty rules are taken.
    pub fn set_rules(&self, rules: HeaderRules) -> Result<(), NoCa> {
        if self.ca.is_none() && !rules.is_empty() {
            return Err(NoCa);
        }
        *self.rules.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
        Ok(())
    }

    pub fn record(&self, d: Denial) {
        tracing::debug!(sandbox = %self.address, ?d, "denied");
        let mut log = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        if log.len() >= MAX_DENIALS {
            log.pop_front();
            *self.dropped.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        }
        log.push_back(d);
    }

    /// The denials recorded so far, oldest first.
    pub fn denials(&self) -> Vec<Denial> {
        let log = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect()
    }
}

/// The live sandboxes by address.
#[derive(Debug, Default)]
pub struct Sandboxes {
    by_addr: RwLock<HashMap<Ipv4Addr, Arc<SandboxNet>>>,
}

impl Sandboxes {
    pub fn insert(&self, sb: Arc<SandboxNet>) {
        let mut map = self.by_addr.write().unwrap_or_else(|p| p.into_inner());
        map.insert(sb.address, sb);
    }

    pub fn remove(&self, address: Ipv4Addr) {
        let mut map = self.by_addr.write().unwrap_or_else(|p| p.into_inner());
        map.remove(&address);
    }

    /// The sandbox whose link address is `address` (where a connection or query came from).
    pub fn by_address(&self, address: IpAddr) -> Option<Arc<SandboxNet>> {
        let IpAddr::V4(a) = address else { return None };
        let map = self.by_addr.read().unwrap_or_else(|p| p.into_inner());
        map.get(&a).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_denial_log_is_bounded_and_keeps_the_newest() {
        let sb = SandboxNet::new(
            Ipv4Addr::new(100, 96, 0, 1),
            Ipv4Addr::new(100, 96, 0, 0),
            NetPolicy::internet(),
        );
        for port in 0..(MAX_DENIALS as u16 + 5) {
            sb.record(Denial::now(
                "tcp",
                "10.0.0.1".parse().unwrap(),
                port,
                "always denied",
            ));
        }
        let log = sb.denials();
        assert_eq!(log.len(), MAX_DENIALS);
        assert_eq!(log[0].port, 5);
        assert_eq!(log.last().unwrap().port, MAX_DENIALS as u16 + 4);
    }

    #[test]
    fn sandboxes_are_found_by_their_address() {
        let all = Sandboxes::default();
        let a = Arc::new(SandboxNet::new(
            Ipv4Addr::new(100, 96, 0, 1),
            Ipv4Addr::new(100, 96, 0, 0),
            NetPolicy::None,
        ));
        all.insert(a.clone());
        assert!(all.by_address("100.96.0.1".parse().unwrap()).is_some());
        assert!(all.by_address("100.96.0.3".parse().unwrap()).is_none());
        all.remove(a.address);
        assert!(all.by_address("100.96.0.1".parse().unwrap()).is_none());
    }
}
