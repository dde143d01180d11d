//! The nftables rules of husk's router namespace, as text for `nft -f`. One table,
//! `inet husk`, holds everything husk adds, so removing it (`delete table inet husk`) removes
//! all of it. Forwarded traffic is dropped unless a sandbox's chain accepts it; each sandbox's
//! chain rejects (fast: TCP reset, ICMP admin-prohibited) the always-denied ranges first, then
//! applies its policy's address rules. Domain rules are the domain proxy's: they do not appear
//! here.

use std::fmt::Write;

use ipnet::IpNet;

use crate::policy::{NetPolicy, Target};

/// The table's name (family `inet`).
pub const TABLE: &str = "husk";

/// A sandbox's link into the router, as nftables matches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The router side's interface name (at most 15 bytes, `[a-z0-9-]`).
    pub ifname: String,
    /// The chain's name suffix (the uid slot: unique among live sandboxes).
    pub slot: u32,
}

fn set_elements(nets: &[IpNet], v6: bool) -> String {
    let v: Vec<String> = nets
        .iter()
        .filter(|n| matches!(n, IpNet::V6(_)) == v6)
        .map(|n| n.to_string())
        .collect();
    v.join(", ")
}

/// The base table: the always-denied sets and the forward chain (policy drop), replacing any
/// earlier `inet husk` table (a crashed server's) atomically.
pub fn base_table(denied: &[IpNet]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "table inet {TABLE}");
    let _ = writeln!(s, "delete table inet {TABLE}");
    let _ = writeln!(s, "table inet {TABLE} {{");
    for (name, ty, v6) in [
        ("denied4", "ipv4_addr", false),
        ("denied6", "ipv6_addr", true),
    ] {
        let _ = writeln!(s, "  set {name} {{\n    type {ty}\n    flags interval");
        let elems = set_elements(denied, v6);
        if !elems.is_empty() {
            let _ = writeln!(s, "    elements = {{ {elems} }}");
        }
        let _ = writeln!(s, "  }}");
    }
    let _ = writeln!(
        s,
        "  chain forward {{\n    type filter hook forward priority filter; policy drop;\n    ct state established,related accept\n  }}"
    );
    let _ = writeln!(s, "}}");
    s
}

/// A sandbox's chain and the forward rule that sends its link's traffic there.
pub fn sandbox_chain(link: &Link, policy: &NetPolicy) -> String {
    let chain = format!("sb{}", link.slot);
    let mut s = String::new();
    let _ = writeln!(s, "add chain inet {TABLE} {chain}");
    let _ = writeln!(s, "flush chain inet {TABLE} {chain}");
    let mut rules: Vec<String> = Vec::new();
    rules.extend(reject("ip daddr @denied4"));
    rules.extend(reject("ip6 daddr @denied6"));
    match policy {
        NetPolicy::None => rules.extend(reject("")),
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
            // Allow beats deny: its accepts come first.
            for (family, v6) in [("ip", false), ("ip6", true)] {
                let elems = set_elements(&allow, v6);
                if !elems.is_empty() {
                    rules.push(format!("{family} daddr {{ {elems} }} accept"));
                }
            }
            for (family, v6) in [("ip", false), ("ip6", true)] {
                let elems = set_elements(&deny, v6);
                if !elems.is_empty() {
                    rules.extend(reject(&format!("{family} daddr {{ {elems} }}")));
                }
            }
            rules.push("accept".to_owned());
        }
    }
    for r in rules {
        let _ = writeln!(s, "add rule inet {TABLE} {chain} {r}");
    }
    let _ = writeln!(
        s,
        "add rule inet {TABLE} forward iifname \"{}\" jump {chain}",
        link.ifname
    );
    s
}

/// Rules that reject what `matched` selects, fast: a TCP reset for TCP (the client sees
/// "connection refused"), ICMP admin-prohibited for the rest (an immediate error, never a
/// silent timeout).
fn reject(matched: &str) -> [String; 2] {
    let m = if matched.is_empty() {
        String::new()
    } else {
        format!("{matched} ")
    };
    [
        format!("{m}meta l4proto tcp reject with tcp reset"),
        format!("{m}reject with icmpx type admin-prohibited"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied() -> Vec<IpNet> {
        crate::denied::always_denied(&[]).unwrap()
    }

    /// `nft -c -f -`: checks a ruleset without applying it (needs root, like the server).
    fn nft_check(text: &str) -> Result<(), String> {
        use std::io::Write;
        let mut child = std::process::Command::new("nft")
            .args(["-c", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("nft (nftables, installed by scripts/test): {e}"))?;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        if out.status.success() {
            Ok(())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    #[test]
    fn the_rules_are_valid_nftables_for_every_kind_of_policy() {
        let link = Link {
            ifname: "hk-7".into(),
            slot: 7,
        };
        let lists = NetPolicy::from_flags(&[
            "allow=203.0.113.0/24,2001:db8::/32,pypi.org".into(),
            "deny=198.51.100.0/24".into(),
        ])
        .unwrap();
        for policy in [NetPolicy::None, NetPolicy::internet(), lists] {
            let text = format!("{}{}", base_table(&denied()), sandbox_chain(&link, &policy));
            nft_check(&text).unwrap_or_else(|e| panic!("{policy:?}:\n{text}\n{e}"));
        }
    }

    #[test]
    fn denied_ranges_come_before_the_policy_and_domains_stay_out() {
        let link = Link {
            ifname: "hk-1".into(),
            slot: 1,
        };
        let p = NetPolicy::from_flags(&["allow=10.1.2.3,example.com".into()]).unwrap();
        let text = sandbox_chain(&link, &p);
        let denied_at = text.find("@denied4").unwrap();
        let allow_at = text.find("10.1.2.3").unwrap();
        assert!(denied_at < allow_at, "{text}");
        assert!(!text.contains("example.com"), "{text}");
        assert!(text.contains("iifname \"hk-1\" jump sb1"), "{text}");
        let base = base_table(&denied());
        assert!(
            base.contains("169.254.0.0/16") && base.contains("fe80::/10"),
            "{base}"
        );
        assert!(base.contains("policy drop"), "{base}");
    }
}
