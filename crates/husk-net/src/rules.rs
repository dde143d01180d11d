//! Header rules (E2B's `network.rules`): for the hosts a sandbox's rules name, the domain proxy
//! terminates the sandbox's HTTP and TLS (with a certificate from the sandbox's own CA,
//! [`crate::ca`]) and sets the rules' headers on every request before it goes on to the real
//! server ([`crate::intercept`]). The values are resolved outside the sandbox (secrets by the
//! server, from its sealed store) and never enter it.
//!
//! Hosts are DNS names, exact (`api.example.com`) or a leading wildcard (`*.example.com`: its
//! subdomains at any depth, not the apex), lowercase. An exact rule beats a wildcard, and the
//! longest wildcard beats a shorter one; a host's rules are never merged with another's. A
//! rule opens no network access: the sandbox's policy still decides where it may connect.

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::policy::Target;

/// Most hosts with rules in one sandbox.
pub const MAX_HOSTS: usize = 64;
/// Most headers set for one host.
pub const MAX_HEADERS: usize = 32;
/// Longest header name.
pub const MAX_NAME: usize = 128;
/// Longest header value, once resolved (a secret is at most 64 KiB; headers past a few KiB
/// are refused by most servers anyway).
pub const MAX_VALUE: usize = 16 << 10;
/// Most bytes of names and values in all of a sandbox's rules, once resolved: what the
/// network helper holds for one sandbox (and what one request to it carries).
pub const MAX_TOTAL: usize = 256 << 10;

/// Headers a rule may not set: they frame the request or route it, and are the proxy's.
const RESERVED: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "expect",
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RuleError {
    #[error("network.rules: {0:?} is not a host name: rules name DNS names (api.example.com) or a leading wildcard (*.example.com)")]
    BadHost(String),
    #[error("network.rules: at most {MAX_HOSTS} hosts")]
    TooManyHosts,
    #[error("network.rules: at most {MAX_HEADERS} headers for one host ({0})")]
    TooManyHeaders(String),
    #[error("network.rules: {0:?} is not a header name (letters, digits and !#$%&'*+-.^_`|~, at most {MAX_NAME})")]
    BadHeaderName(String),
    #[error("network.rules: the {0} header belongs to the proxy (it frames or routes the request) and cannot be set")]
    ReservedHeader(String),
    #[error("network.rules: the value of {0} holds a line break or control character, or is over {MAX_VALUE} bytes")]
    BadHeaderValue(String),
    #[error("network.rules: {0} is named twice")]
    DuplicateHost(String),
    #[error("network.rules: the headers come to more than {MAX_TOTAL} bytes in all")]
    TooBig,
}

/// A header value: often a secret, so wiped when dropped and never printed.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl SecretValue {
    pub fn new(v: Vec<u8>) -> SecretValue {
        SecretValue(Zeroizing::new(v))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

/// The headers set on requests to one host (or wildcard).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostRule {
    /// `api.example.com` or `*.example.com`, lowercase, no trailing dot.
    pub host: String,
    /// In order: a later one replaces an earlier one of the same name. Names lowercase.
    pub headers: Vec<(String, SecretValue)>,
}

/// A sandbox's header rules, resolved.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeaderRules {
    pub hosts: Vec<HostRule>,
}

/// The host a rule names, normalized: lowercase, without a trailing dot. Addresses, CIDRs and
/// a bare `*` are refused.
pub fn parse_host(s: &str) -> Result<String, RuleError> {
    match Target::parse(s) {
        Ok(Target::Domain(d)) if d != "*" => Ok(d),
        _ => Err(RuleError::BadHost(s.to_owned())),
    }
}

/// Checks a header name as HTTP defines a token; returns it lowercase.
pub fn check_header_name(name: &str) -> Result<String, RuleError> {
    let tchar = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > MAX_NAME || !name.bytes().all(tchar) {
        return Err(RuleError::BadHeaderName(name.to_owned()));
    }
    let lower = name.to_ascii_lowercase();
    if RESERVED.contains(&lower.as_str()) {
        return Err(RuleError::ReservedHeader(name.to_owned()));
    }
    Ok(lower)
}

/// Checks a header value: visible ASCII, spaces, tabs and bytes ≥ 0x80 (as HTTP allows), at
/// most [`MAX_VALUE`] bytes.
pub fn check_header_value(name: &str, value: &[u8]) -> Result<(), RuleError> {
    let ok = |b: &u8| *b == b'\t' || (*b >= 0x20 && *b != 0x7f);
    if value.len() > MAX_VALUE || !value.iter().all(ok) {
        return Err(RuleError::BadHeaderValue(name.to_owned()));
    }
    Ok(())
}

impl HeaderRules {
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Checks rules that crossed a process boundary as the parsers above would have made them.
    pub fn validate(&self) -> Result<(), RuleError> {
        if self.hosts.len() > MAX_HOSTS {
            return Err(RuleError::TooManyHosts);
        }
        if self.size() > MAX_TOTAL {
            return Err(RuleError::TooBig);
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if parse_host(&h.host).as_deref() != Ok(h.host.as_str()) {
                return Err(RuleError::BadHost(h.host.clone()));
            }
            if self.hosts[..i].iter().any(|o| o.host == h.host) {
                return Err(RuleError::DuplicateHost(h.host.clone()));
            }
            if h.headers.len() > MAX_HEADERS {
                return Err(RuleError::TooManyHeaders(h.host.clone()));
            }
            for (name, value) in &h.headers {
                if check_header_name(name).as_deref() != Ok(name.as_str()) {
                    return Err(RuleError::BadHeaderName(name.clone()));
                }
                check_header_value(name, value.bytes())?;
            }
        }
        Ok(())
    }

    /// Bytes of its header names and values.
    pub fn size(&self) -> usize {
        self.hosts
            .iter()
            .flat_map(|h| &h.headers)
            .map(|(n, v)| n.len() + v.bytes().len())
            .sum()
    }

    /// The rule for `host` (lowercase, no trailing dot): the exact one, else the longest
    /// wildcard that matches.
    pub fn for_host(&self, host: &str) -> Option<&HostRule> {
        if let Some(exact) = self.hosts.iter().find(|h| h.host == host) {
            return Some(exact);
        }
        self.hosts
            .iter()
            .filter(|h| {
                h.host.starts_with("*.") && Target::Domain(h.host.clone()).matches_domain(host)
            })
            .max_by_key(|h| h.host.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(host: &str, headers: &[(&str, &str)]) -> HostRule {
        HostRule {
            host: host.into(),
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), SecretValue::new(v.as_bytes().to_vec())))
                .collect(),
        }
    }

    #[test]
    fn hosts_are_names_or_leading_wildcards() {
        assert_eq!(parse_host("API.Example.com.").unwrap(), "api.example.com");
        assert_eq!(parse_host("*.example.com").unwrap(), "*.example.com");
        for bad in [
            "*",
            "10.0.0.1",
            "10.0.0.0/8",
            "",
            "a..b",
            "ex ample.com",
            "*x.com",
        ] {
            assert!(parse_host(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn exact_beats_the_longest_wildcard_which_beats_a_shorter_one() {
        let rules = HeaderRules {
            hosts: vec![
                rule("*.example.com", &[("x-a", "short")]),
                rule("*.api.example.com", &[("x-a", "long")]),
                rule("v1.api.example.com", &[("x-a", "exact")]),
            ],
        };
        let got = |h: &str| rules.for_host(h).map(|r| r.host.as_str());
        assert_eq!(got("v1.api.example.com"), Some("v1.api.example.com"));
        assert_eq!(got("v2.api.example.com"), Some("*.api.example.com"));
        assert_eq!(got("a.b.api.example.com"), Some("*.api.example.com"));
        assert_eq!(got("api.example.com"), Some("*.example.com"));
        // A wildcard never matches its apex.
        assert_eq!(got("example.com"), None);
        assert_eq!(got("example.org"), None);
    }

    #[test]
    fn header_names_and_values_are_checked() {
        assert_eq!(check_header_name("X-Api-Key").unwrap(), "x-api-key");
        for bad in ["", "a b", "a:b", "é", &"x".repeat(MAX_NAME + 1)] {
            assert!(
                matches!(check_header_name(bad), Err(RuleError::BadHeaderName(_))),
                "{bad:?}"
            );
        }
        for reserved in ["Host", "content-length", "Transfer-Encoding", "Connection"] {
            assert!(matches!(
                check_header_name(reserved),
                Err(RuleError::ReservedHeader(_))
            ));
        }
        assert!(check_header_value("a", b"Bearer abc\tdef \xc3\xa9").is_ok());
        for bad in [&b"a\r\nInjected: 1"[..], b"a\nb", b"a\0b", b"\x7f"] {
            assert!(check_header_value("a", bad).is_err(), "{bad:?}");
        }
        assert!(check_header_value("a", &vec![b'a'; MAX_VALUE + 1]).is_err());
    }

    #[test]
    fn validation_refuses_what_the_parsers_would_not_make() {
        let ok = HeaderRules {
            hosts: vec![rule("api.example.com", &[("authorization", "Bearer k")])],
        };
        assert!(ok.validate().is_ok());
        let cases = [
            rule("API.example.com", &[]),
            rule("10.0.0.1", &[]),
            rule("api.example.com", &[("Authorization", "k")]),
            rule("api.example.com", &[("host", "evil")]),
            rule("api.example.com", &[("x", "a\r\nb")]),
        ];
        for bad in cases {
            let rules = HeaderRules { hosts: vec![bad] };
            assert!(rules.validate().is_err(), "{rules:?}");
        }
        let twice = HeaderRules {
            hosts: vec![rule("a.example", &[]), rule("a.example", &[])],
        };
        assert_eq!(
            twice.validate(),
            Err(RuleError::DuplicateHost("a.example".into()))
        );
        let big = HeaderRules {
            hosts: (0..MAX_TOTAL / MAX_VALUE + 1)
                .map(|i| {
                    let v = "v".repeat(MAX_VALUE);
                    rule(&format!("h{i}.example"), &[("x", v.as_str())])
                })
                .collect(),
        };
        assert_eq!(big.validate(), Err(RuleError::TooBig));
        let many = HeaderRules {
            hosts: (0..=MAX_HOSTS)
                .map(|i| rule(&format!("h{i}.example"), &[]))
                .collect(),
        };
        assert_eq!(many.validate(), Err(RuleError::TooManyHosts));
    }

    #[test]
    fn values_are_never_printed() {
        let r = rule("api.example.com", &[("authorization", "Bearer s3cr3t")]);
        let shown = format!("{r:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("<13 bytes>"), "{shown}");
    }
}
