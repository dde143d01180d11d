//! Ranges no sandbox may reach, whatever its policy says: the host's own addresses (added at
//! run time), loopback, private and shared address space, link-local (cloud metadata lives at
//! 169.254.169.254), multicast and the IPv6 equivalents. Kept as data, extensible by the
//! operator's configuration ([`always_denied`]).

use ipnet::IpNet;

/// The built-in list, with why each range is on it.
pub const ALWAYS_DENIED: &[(&str, &str)] = &[
    ("0.0.0.0/8", "\"this network\""),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "shared address space (carrier-grade NAT)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local, cloud metadata"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved, broadcast"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    (
        "::ffff:0:0/96",
        "IPv4-mapped (would reach IPv4 ranges above)",
    ),
    ("64:ff9b::/96", "NAT64 (would reach IPv4 ranges above)"),
    ("fc00::/7", "unique local"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
];

/// The built-in ranges plus `extra` (the operator's), parsed; an error names the bad entry.
pub fn always_denied(extra: &[String]) -> Result<Vec<IpNet>, String> {
    let mut out = Vec::with_capacity(ALWAYS_DENIED.len() + extra.len());
    for (net, _) in ALWAYS_DENIED {
        out.push(net.parse().map_err(|e| format!("{net}: {e}"))?);
    }
    for net in extra {
        let parsed: IpNet = net.parse().map_err(|_| {
            format!("invalid denied range {net:?}: expected a CIDR like 203.0.113.0/24")
        })?;
        out.push(parsed.trunc());
    }
    Ok(out)
}

/// Whether `addr` is in any of `denied`.
pub fn is_denied(denied: &[IpNet], addr: std::net::IpAddr) -> bool {
    denied.iter().any(|n| n.contains(&addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_list_parses_and_covers_what_the_issue_names() {
        let d = always_denied(&[]).unwrap();
        for addr in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "169.254.169.254",
            "224.0.0.1",
            "::1",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
        ] {
            assert!(is_denied(&d, addr.parse().unwrap()), "{addr} not denied");
        }
        for addr in ["1.1.1.1", "203.0.113.7", "172.32.0.1", "2001:db8::1"] {
            assert!(!is_denied(&d, addr.parse().unwrap()), "{addr} denied");
        }
    }

    #[test]
    fn operators_extend_it_and_bad_entries_are_named() {
        let d = always_denied(&["203.0.113.9/24".into()]).unwrap();
        assert!(is_denied(&d, "203.0.113.200".parse().unwrap()));
        let e = always_denied(&["not-a-net".into()]).unwrap_err();
        assert!(e.contains("not-a-net"), "{e}");
    }
}
