//! The nftables rules of husk's router namespace, as text for `nft -f`. One table,
//! `inet husk`, holds everything; the namespace is husk's own, so nothing else is there.
//!
//! - Sandbox links are named `sb<N>`, the uplink `up0`.
//! - prerouting: every sandbox's DNS (any address, port 53) goes to husk's resolver on the
//!   router; HTTP and TLS of the links in `@proxied` (policies with domain rules) go to the
//!   domain proxy.
//! - input (the router itself): only the resolver and the proxy, from sandbox links; the rest
//!   is rejected and logged.
//! - forward: new connections only from a sandbox link to the uplink. The always-denied ranges
//!   are rejected and logged first; then the sandbox's own chain, if its policy has lists (map
//!   `@policies`); UDP only where an allow rule opened it; the rest goes out, masqueraded.
//!
//! Rejections are fast (TCP reset, ICMP admin-prohibited) and logged to NFLOG group
//! [`LOG_GROUP`] with the reason as prefix (rate-limited, so a flood cannot drown the reader).

use std::fmt::Write;

use ipnet::IpNet;

use crate::policy::{NetPolicy, Target};

/// The table's name (family `inet`).
pub const TABLE: &str = "husk";
/// The NFLOG group of logged rejections.
pub const LOG_GROUP: u16 = 7;
/// The uplink's name in the router namespace.
pub const UPLINK: &str = "up0";
/// Log prefixes: why a packet was rejected.
pub const WHY_ALWAYS: &str = "always denied";
pub const WHY_POLICY: &str = "policy";
pub const WHY_UDP: &str = "udp not allowed";
pub const WHY_ROUTER: &str = "router";

/// A sandbox link's name on the router side.
pub fn link_name(index: u32) -> String {
    format!("sb{index}")
}

fn chain_name(index: u32) -> String {
    format!("p{index}")
}

/// The nets of one family as set elements, overlaps merged (nftables refuses overlapping
/// intervals, and the host's own addresses often fall inside a built-in range).
fn elements(nets: &[IpNet], v6: bool) -> String {
    let family: Vec<IpNet> = nets
        .iter()
        .filter(|n| matches!(n, IpNet::V6(_)) == v6)
        .copied()
        .collect();
    let v: Vec<String> = IpNet::aggregate(&family)
        .iter()
        .map(|n| n.to_string())
        .collect();
    v.join(", ")
}

/// Rules that log (rate-limited) and reject what `matched` selects: a TCP reset for TCP (the
/// client sees "connection refused"), ICMP admin-prohibited for the rest.
fn reject(matched: &str, why: &str) -> [String; 3] {
    let m = if matched.is_empty() {
        String::new()
    } else {
        format!("{matched} ")
    };
    [
        format!("{m}limit rate 50/second burst 100 packets log prefix \"{why}\" group {LOG_GROUP}"),
        format!("{m}meta l4proto tcp reject with tcp reset"),
        format!("{m}reject with icmpx type admin-prohibited"),
    ]
}

/// The whole table, replacing any earlier one atomically.
pub fn base_table(denied: &[IpNet], resolver_port: u16, proxy_port: u16) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "table inet {TABLE}");
    let _ = writeln!(s, "delete table inet {TABLE}");
    let _ = writeln!(s, "table inet {TABLE} {{");
    for (name, ty, v6) in [
        ("denied4", "ipv4_addr", false),
        ("denied6", "ipv6_addr", true),
    ] {
        let _ = writeln!(s, "  set {name} {{\n    type {ty}\n    flags interval");
        let elems = elements(denied, v6);
        if !elems.is_empty() {
            let _ = writeln!(s, "    elements = {{ {elems} }}");
        }
        let _ = writeln!(s, "  }}");
    }
    let _ = writeln!(s, "  set proxied {{\n    type ifname\n  }}");
    let _ = writeln!(s, "  map policies {{\n    type ifname : verdict\n  }}");
    let _ = writeln!(
        s,
        "  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
    iifname \"sb*\" meta l4proto {{ tcp, udp }} th dport 53 redirect to :{resolver_port}
    iifname @proxied tcp dport {{ 80, 443 }} redirect to :{proxy_port}
  }}"
    );
    let _ = writeln!(
        s,
        "  chain input {{
    type filter hook input priority filter; policy drop;
    iif \"lo\" accept
    ct state established,related accept
    iifname \"sb*\" meta l4proto {{ tcp, udp }} th dport {resolver_port} accept
    iifname \"sb*\" tcp dport {proxy_port} accept"
    );
    for r in reject("iifname \"sb*\"", WHY_ROUTER) {
        let _ = writeln!(s, "    {r}");
    }
    let _ = writeln!(s, "  }}");
    let _ = writeln!(
        s,
        "  chain forward {{
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname \"sb*\" oifname \"{UPLINK}\" jump egress"
    );
    // Anything else from a sandbox (towards another sandbox's link) is refused.
    for r in reject("iifname \"sb*\"", WHY_ALWAYS) {
        let _ = writeln!(s, "    {r}");
    }
    let _ = writeln!(s, "  }}");
    let _ = writeln!(s, "  chain egress {{");
    for r in reject("ip daddr @denied4", WHY_ALWAYS)
        .into_iter()
        .chain(reject("ip6 daddr @denied6", WHY_ALWAYS))
    {
        let _ = writeln!(s, "    {r}");
    }
    let _ = writeln!(s, "    iifname vmap @policies");
    for r in reject("meta l4proto udp", WHY_UDP) {
        let _ = writeln!(s, "    {r}");
    }
    let _ = writeln!(s, "    accept\n  }}");
    let _ = writeln!(
        s,
        "  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"{UPLINK}\" masquerade
  }}"
    );
    let _ = writeln!(s, "}}");
    s
}

/// What the table holds for one sandbox (so that changes add and delete the right things).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Installed {
    /// Its chain exists and `@policies` jumps there.
    pub chain: bool,
    /// Its link is in `@proxied`.
    pub proxied: bool,
}

/// Whether a policy needs a chain of its own (plain internet does not).
fn needs_chain(policy: &NetPolicy) -> bool {
    match policy {
        NetPolicy::None => true,
        NetPolicy::Egress { allow, deny } => allow
            .iter()
            .chain(deny)
            .any(|t| matches!(t, Target::Net(_))),
    }
}

/// The commands that take the sandbox at `index` from `was` to `policy` (with header rules
/// to apply: `intercept`), and what it holds afterwards. Empty when nothing changes.
pub fn apply(
    index: u32,
    was: Installed,
    policy: &NetPolicy,
    intercept: bool,
) -> (String, Installed) {
    let (link, chain) = (link_name(index), chain_name(index));
    let want = Installed {
        chain: needs_chain(policy),
        // Names (in the policy or the rules) are read by the domain proxy.
        proxied: policy.has_domains() || (intercept && *policy != NetPolicy::None),
    };
    let mut s = String::new();
    if want.chain {
        if !was.chain {
            let _ = writeln!(s, "add chain inet {TABLE} {chain}");
        }
        let _ = writeln!(s, "flush chain inet {TABLE} {chain}");
        for r in chain_rules(policy) {
            let _ = writeln!(s, "add rule inet {TABLE} {chain} {r}");
        }
        if !was.chain {
            let _ = writeln!(
                s,
                "add element inet {TABLE} policies {{ \"{link}\" : jump {chain} }}"
            );
        }
    } else if was.chain {
        let _ = writeln!(s, "delete element inet {TABLE} policies {{ \"{link}\" }}");
        let _ = writeln!(s, "delete chain inet {TABLE} {chain}");
    }
    match (was.proxied, want.proxied) {
        (false, true) => {
            let _ = writeln!(s, "add element inet {TABLE} proxied {{ \"{link}\" }}");
        }
        (true, false) => {
            let _ = writeln!(s, "delete element inet {TABLE} proxied {{ \"{link}\" }}");
        }
        _ => {}
    }
    (s, want)
}

/// The commands that remove everything of the sandbox at `index`.
pub fn remove(index: u32, was: Installed) -> String {
    apply(index, was, &NetPolicy::internet(), false).0
}

/// A policy's own rules: allow accepts first (allow beats deny), then deny rejects. Domain
/// rules are the proxy's and do not appear.
fn chain_rules(policy: &NetPolicy) -> Vec<String> {
    let mut rules = Vec::new();
    match policy {
        NetPolicy::None => rules.extend(reject("", WHY_POLICY)),
        NetPolicy::Egress { allow, deny } => {
            let nets = |list: &[Target]| -> Vec<IpNet> {
                list.iter()
                    .filter_map(|t| match t {
                        Target::Net(n) => Some(*n),
                        Target::Domain(_) => None,
                    })
                    .collect()
            };
            let (allow, deny) = (nets(allow), nets(deny));
            for (family, v6) in [("ip", false), ("ip6", true)] {
                let elems = elements(&allow, v6);
                if !elems.is_empty() {
                    rules.push(format!("{family} daddr {{ {elems} }} accept"));
                }
            }
            for (family, v6) in [("ip", false), ("ip6", true)] {
                let elems = elements(&deny, v6);
                if !elems.is_empty() {
                    rules.extend(reject(&format!("{family} daddr {{ {elems} }}"), WHY_POLICY));
                }
            }
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netns::NetNs;

    fn denied() -> Vec<IpNet> {
        crate::denied::always_denied(&[]).unwrap()
    }

    #[test]
    fn the_table_and_every_change_load_into_a_real_namespace() {
        let ns = NetNs::create().unwrap();
        crate::cmd::nft(Some(&ns), &base_table(&denied(), 53, 15001)).unwrap();
        // Loading it again replaces it (a restart).
        crate::cmd::nft(Some(&ns), &base_table(&denied(), 53, 15001)).unwrap();
        let lists = NetPolicy::from_flags(&[
            "allow=203.0.113.0/24,2001:db8::/32,pypi.org".into(),
            "deny=198.51.100.0/24".into(),
        ])
        .unwrap();
        let domains = NetPolicy::from_flags(&["allow=pypi.org".into()]).unwrap();
        let mut state = Installed::default();
        for (policy, intercept) in [
            (NetPolicy::None, true),
            (lists.clone(), false),
            (NetPolicy::internet(), true),
            (NetPolicy::internet(), false),
            (domains, false),
            (lists, true),
            (NetPolicy::internet(), false),
        ] {
            let (text, next) = apply(3, state, &policy, intercept);
            crate::cmd::nft(Some(&ns), &text)
                .unwrap_or_else(|e| panic!("{policy:?}:\n{text}\n{e}"));
            state = next;
        }
        assert_eq!(state, Installed::default());
        let listed =
            crate::cmd::output(Some(&ns), "nft", &["list", "table", "inet", TABLE]).unwrap();
        assert!(!listed.contains("p3"), "{listed}");
        assert!(listed.contains("169.254.0.0/16"), "{listed}");
    }

    #[test]
    fn allow_comes_before_deny_and_domains_stay_out() {
        let p = NetPolicy::from_flags(&[
            "allow=10.1.2.3,example.com".into(),
            "deny=10.0.0.0/8".into(),
        ])
        .unwrap();
        let (text, st) = apply(1, Installed::default(), &p, false);
        assert!(st.chain && st.proxied);
        let allow_at = text.find("10.1.2.3").unwrap();
        let deny_at = text.find("10.0.0.0/8").unwrap();
        assert!(allow_at < deny_at, "{text}");
        assert!(!text.contains("example.com"), "{text}");
        assert!(text.contains("\"sb1\" : jump p1"), "{text}");
        // Plain internet needs nothing of its own.
        assert_eq!(
            apply(1, Installed::default(), &NetPolicy::internet(), false).0,
            ""
        );
    }

    #[test]
    fn header_rules_send_http_and_tls_through_the_proxy_where_there_is_a_link() {
        let (text, st) = apply(2, Installed::default(), &NetPolicy::internet(), true);
        assert_eq!(
            st,
            Installed {
                chain: false,
                proxied: true
            }
        );
        assert!(
            text.contains("add element inet husk proxied { \"sb2\" }"),
            "{text}"
        );
        // No network: nothing to proxy.
        let (_, st) = apply(2, Installed::default(), &NetPolicy::None, true);
        assert!(!st.proxied);
        // Rules cleared: out of the proxy again.
        let (text, st) = apply(2, st_of(true), &NetPolicy::internet(), false);
        assert!(!st.proxied && text.contains("delete element"), "{text}");
    }

    fn st_of(proxied: bool) -> Installed {
        Installed {
            chain: false,
            proxied,
        }
    }
}
