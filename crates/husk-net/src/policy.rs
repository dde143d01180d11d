//! A sandbox's egress policy: no network, or egress with allow and deny lists of CIDRs and
//! domains (an allow entry beats a deny entry). Parsed from husk's `--net` flag and from the E2B
//! create fields (`allow_internet_access`, `network.allowOut/denyOut`). The always-denied
//! ranges ([`crate::denied`]) are checked before any of this and cannot be opened by it.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Most entries in one allow or deny list.
pub const MAX_ENTRIES: usize = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PolicyError {
    #[error("invalid network rule {0:?}: expected a CIDR (203.0.113.0/24, 2001:db8::/32), an address, or a domain (example.com, *.example.com)")]
    BadTarget(String),
    #[error("too many network rules: at most {MAX_ENTRIES} per list")]
    TooMany,
    #[error("invalid --net {0:?}: use none, internet, allow=LIST or deny=LIST (LIST: CIDRs and domains, comma-separated)")]
    BadFlag(String),
}

/// What a rule names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// An address range (a single address is a /32 or /128).
    Net(IpNet),
    /// A domain, lowercase, without a trailing dot; `*.example.com` matches its subdomains
    /// (not `example.com` itself).
    Domain(String),
}

impl Target {
    pub fn parse(s: &str) -> Result<Target, PolicyError> {
        let bad = || PolicyError::BadTarget(s.to_owned());
        let t = s.trim();
        if t.is_empty() || t.len() > 253 {
            return Err(bad());
        }
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(Target::Net(net.trunc()));
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(Target::Net(IpNet::from(ip)));
        }
        let name = t.trim_end_matches('.').to_ascii_lowercase();
        let (wild, rest) = match name.strip_prefix("*.") {
            Some(r) => (true, r),
            None => (false, name.as_str()),
        };
        let labels: Vec<&str> = rest.split('.').collect();
        let label_ok = |l: &&str| {
            !l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        };
        // A domain has a dot (a bare word is almost always a mistake) unless it is a wildcard.
        if labels.iter().all(label_ok) && (labels.len() >= 2 || wild) {
            return Ok(Target::Domain(name));
        }
        Err(bad())
    }

    /// Whether this rule matches the address.
    pub fn matches_ip(&self, ip: IpAddr) -> bool {
        matches!(self, Target::Net(n) if n.contains(&ip))
    }

    /// Whether this rule matches the (lowercase, dot-less) host name.
    pub fn matches_domain(&self, host: &str) -> bool {
        match self {
            Target::Net(_) => false,
            Target::Domain(d) => match d.strip_prefix("*.") {
                Some(base) => host.len() > base.len() + 1 && host.ends_with(&format!(".{base}")),
                None => host == d,
            },
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Net(n) => write!(f, "{n}"),
            Target::Domain(d) => f.write_str(d),
        }
    }
}

/// A sandbox's network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum NetPolicy {
    /// Loopback only: no link out at all.
    None,
    /// Egress, minus `deny`, except what `allow` names (allow beats deny). Both empty: the
    /// internet.
    Egress {
        allow: Vec<Target>,
        deny: Vec<Target>,
    },
}

/// What the policy says of one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

fn targets(list: &[String]) -> Result<Vec<Target>, PolicyError> {
    if list.len() > MAX_ENTRIES {
        return Err(PolicyError::TooMany);
    }
    list.iter().map(|s| Target::parse(s)).collect()
}

fn everything() -> Vec<Target> {
    ["0.0.0.0/0", "::/0"]
        .iter()
        .map(|n| Target::Net(n.parse().expect("literal CIDR")))
        .collect()
}

impl NetPolicy {
    /// The internet (under the always-denied ranges).
    pub fn internet() -> NetPolicy {
        NetPolicy::Egress {
            allow: Vec::new(),
            deny: Vec::new(),
        }
    }

    /// Checks a policy that was not made by this module's parsers (one that crossed a process
    /// boundary): each list at most [`MAX_ENTRIES`] (and the two ranges of "everything"),
    /// each domain as [`Target::parse`] would have made it, each range truncated.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let NetPolicy::Egress { allow, deny } = self else {
            return Ok(());
        };
        for list in [allow, deny] {
            if list.len() > MAX_ENTRIES + 2 {
                return Err(PolicyError::TooMany);
            }
            for t in list {
                let ok = match t {
                    Target::Net(n) => *n == n.trunc(),
                    Target::Domain(d) => Target::parse(d).ok().as_ref() == Some(t),
                };
                if !ok {
                    return Err(PolicyError::BadTarget(t.to_string()));
                }
            }
        }
        Ok(())
    }

    /// From `--net` values (repeatable): `none`, `internet`, `allow=LIST`, `deny=LIST`. An
    /// allow list alone means only what it names.
    pub fn from_flags(flags: &[String]) -> Result<NetPolicy, PolicyError> {
        let (mut allow, mut deny) = (Vec::new(), Vec::new());
        let (mut none, mut internet) = (false, false);
        for f in flags {
            match f.split_once('=') {
                None if f == "none" => none = true,
                None if f == "internet" => internet = true,
                Some(("allow", l)) => allow.extend(l.split(',').map(str::to_owned)),
                Some(("deny", l)) => deny.extend(l.split(',').map(str::to_owned)),
                _ => return Err(PolicyError::BadFlag(f.clone())),
            }
        }
        if none {
            if internet || !allow.is_empty() || !deny.is_empty() {
                return Err(PolicyError::BadFlag("none".into()));
            }
            return Ok(NetPolicy::None);
        }
        let allow = targets(&allow)?;
        let mut deny = targets(&deny)?;
        if !allow.is_empty() && !internet && deny.is_empty() {
            deny = everything();
        }
        Ok(NetPolicy::Egress { allow, deny })
    }

    /// From E2B's create fields; `default` when the request says nothing.
    /// `allow_internet_access: false` denies everything but `allowOut`; with no `allowOut` it
    /// is no network at all.
    pub fn from_e2b(
        allow_internet_access: Option<bool>,
        allow_out: &[String],
        deny_out: &[String],
        default: &NetPolicy,
    ) -> Result<NetPolicy, PolicyError> {
        let allow = targets(allow_out)?;
        let mut deny = targets(deny_out)?;
        match allow_internet_access {
            Some(false) if allow.is_empty() => return Ok(NetPolicy::None),
            Some(false) => deny.extend(everything()),
            None if allow.is_empty() && deny.is_empty() => return Ok(default.clone()),
            _ => {}
        }
        Ok(NetPolicy::Egress { allow, deny })
    }

    /// The verdict for a connection to `ip` (the always-denied ranges come first, elsewhere).
    pub fn decide_ip(&self, ip: IpAddr) -> Verdict {
        match self {
            NetPolicy::None => Verdict::Deny,
            NetPolicy::Egress { allow, deny } => {
                if allow.iter().any(|t| t.matches_ip(ip)) || !deny.iter().any(|t| t.matches_ip(ip))
                {
                    Verdict::Allow
                } else {
                    Verdict::Deny
                }
            }
        }
    }

    /// The verdict for a connection to `host` at `ip` (seen by the domain proxy in the HTTP
    /// `Host` or the TLS SNI): allowed by name or by address beats denied by either.
    pub fn decide_host(&self, host: &str, ip: IpAddr) -> Verdict {
        match self {
            NetPolicy::None => Verdict::Deny,
            NetPolicy::Egress { allow, deny } => {
                let host = host.trim_end_matches('.').to_ascii_lowercase();
                let allowed = allow
                    .iter()
                    .any(|t| t.matches_domain(&host) || t.matches_ip(ip));
                let denied = deny
                    .iter()
                    .any(|t| t.matches_domain(&host) || t.matches_ip(ip));
                if allowed || !denied {
                    Verdict::Allow
                } else {
                    Verdict::Deny
                }
            }
        }
    }

    /// As E2B reports it: (`allowInternetAccess`, `allowOut`, `denyOut`).
    pub fn to_e2b(&self) -> (bool, Vec<String>, Vec<String>) {
        match self {
            NetPolicy::None => (false, Vec::new(), Vec::new()),
            NetPolicy::Egress { allow, deny } => {
                let all = everything();
                let closed = all.iter().all(|t| deny.contains(t));
                let show = |l: &[Target]| l.iter().map(Target::to_string).collect::<Vec<_>>();
                let deny: Vec<Target> = if closed {
                    deny.iter().filter(|t| !all.contains(t)).cloned().collect()
                } else {
                    deny.clone()
                };
                (!closed, show(allow), show(&deny))
            }
        }
    }

    /// Whether any rule names a domain (then HTTP and TLS go through the domain proxy).
    pub fn has_domains(&self) -> bool {
        match self {
            NetPolicy::None => false,
            NetPolicy::Egress { allow, deny } => allow
                .iter()
                .chain(deny)
                .any(|t| matches!(t, Target::Domain(_))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn flags(f: &[&str]) -> Result<NetPolicy, PolicyError> {
        NetPolicy::from_flags(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn targets_parse_and_match() {
        assert_eq!(
            Target::parse("203.0.113.9/24").unwrap(),
            Target::Net("203.0.113.0/24".parse().unwrap())
        );
        assert_eq!(
            Target::parse("1.2.3.4").unwrap(),
            Target::Net("1.2.3.4/32".parse().unwrap())
        );
        assert_eq!(
            Target::parse("PyPI.org.").unwrap(),
            Target::Domain("pypi.org".into())
        );
        let wild = Target::parse("*.example.com").unwrap();
        assert!(wild.matches_domain("a.example.com") && wild.matches_domain("a.b.example.com"));
        assert!(!wild.matches_domain("example.com") && !wild.matches_domain("badexample.com"));
        for bad in [
            "",
            "localhost",
            "a..b",
            "-a.com",
            "a b.com",
            "1.2.3.4/40",
            "ex*ample.com",
        ] {
            assert!(Target::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn flags_give_none_internet_and_lists_where_allow_beats_deny() {
        assert_eq!(flags(&["none"]).unwrap(), NetPolicy::None);
        assert_eq!(flags(&["internet"]).unwrap(), NetPolicy::internet());
        // An allow list alone: only what it names.
        let p = flags(&["allow=203.0.113.0/24,pypi.org"]).unwrap();
        assert_eq!(p.decide_ip(ip("203.0.113.5")), Verdict::Allow);
        assert_eq!(p.decide_ip(ip("198.51.100.1")), Verdict::Deny);
        assert_eq!(
            p.decide_host("pypi.org", ip("198.51.100.1")),
            Verdict::Allow
        );
        assert!(p.has_domains());
        // A deny list: the internet minus it; allow beats deny.
        let p = flags(&["deny=198.51.100.0/24", "allow=198.51.100.7"]).unwrap();
        assert_eq!(p.decide_ip(ip("198.51.100.8")), Verdict::Deny);
        assert_eq!(p.decide_ip(ip("198.51.100.7")), Verdict::Allow);
        assert_eq!(p.decide_ip(ip("1.1.1.1")), Verdict::Allow);
        assert!(flags(&["none", "internet"]).is_err());
        assert!(flags(&["everything"]).is_err());
        assert!(flags(&["allow=not a domain"]).is_err());
        let many = format!("deny={}", vec!["1.2.3.4"; MAX_ENTRIES + 1].join(","));
        assert_eq!(flags(&[&many]).unwrap_err(), PolicyError::TooMany);
    }

    #[test]
    fn e2b_fields_map_onto_the_policy() {
        let default = NetPolicy::internet();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            NetPolicy::from_e2b(Some(false), &[], &[], &default).unwrap(),
            NetPolicy::None
        );
        assert_eq!(
            NetPolicy::from_e2b(None, &[], &[], &NetPolicy::None).unwrap(),
            NetPolicy::None
        );
        let p = NetPolicy::from_e2b(Some(false), &s(&["api.example.com"]), &[], &default).unwrap();
        assert_eq!(
            p.decide_host("api.example.com", ip("203.0.113.1")),
            Verdict::Allow
        );
        assert_eq!(p.decide_host("other.com", ip("203.0.113.1")), Verdict::Deny);
        let p = NetPolicy::from_e2b(Some(true), &s(&["8.8.8.8"]), &s(&["0.0.0.0/0"]), &default)
            .unwrap();
        assert_eq!(p.decide_ip(ip("8.8.8.8")), Verdict::Allow);
        assert_eq!(p.decide_ip(ip("8.8.4.4")), Verdict::Deny);
        assert!(NetPolicy::from_e2b(None, &s(&["bad name"]), &[], &default).is_err());
    }

    #[test]
    fn e2b_view_round_trips() {
        let default = NetPolicy::internet();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let p = NetPolicy::from_e2b(Some(false), &s(&["1.2.3.4"]), &[], &default).unwrap();
        assert_eq!(p.to_e2b(), (false, s(&["1.2.3.4/32"]), vec![]));
        let p = NetPolicy::from_e2b(Some(true), &[], &s(&["198.51.100.0/24"]), &default).unwrap();
        assert_eq!(p.to_e2b(), (true, vec![], s(&["198.51.100.0/24"])));
        assert_eq!(NetPolicy::None.to_e2b(), (false, vec![], vec![]));
        assert_eq!(NetPolicy::internet().to_e2b(), (true, vec![], vec![]));
    }

    #[test]
    fn the_policy_round_trips_as_json() {
        let p = flags(&["allow=pypi.org", "deny=10.0.0.0/8"]).unwrap();
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<NetPolicy>(&text).unwrap(), p);
    }
}
