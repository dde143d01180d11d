//! A sandbox's header rules as its creator wrote them (E2B's `network.rules`): per host, an
//! ordered list of rules, each a set of headers whose values may name the team's secrets as
//! `${e2b.secrets.NAME}` (what the SDKs' `Secret.fill(NAME)` writes).
//!
//! These are what the sandbox's info shows, placeholders and all. The values are resolved
//! only to be handed to the network helper ([`husk_net::rules::HeaderRules`]), never kept
//! resolved here, and never enter the sandbox.

use husk_net::rules::{
    check_header_name, check_header_value, parse_host, HeaderRules, HostRule, RuleError,
    SecretValue, MAX_HEADERS, MAX_HOSTS,
};
use zeroize::Zeroizing;

use crate::secrets::{SecretError, Secrets};

/// Most rules listed for one host.
pub const MAX_RULES_PER_HOST: usize = 16;

const SECRET_PLACEHOLDER: &str = "${e2b.secrets.";

/// One rule: headers set, in order.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Rule {
    /// Names as written (shown back so); values with their placeholders.
    pub headers: Vec<(String, String)>,
}

/// The rules for one host, as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostRules {
    /// Normalized (lowercase, no trailing dot).
    pub host: String,
    pub rules: Vec<Rule>,
}

/// All of a sandbox's rules, as written (kept so by a paused sandbox's description; checked
/// again, by [`NetRules::new`], when it is read back).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NetRules {
    pub hosts: Vec<HostRules>,
}

#[derive(Debug, thiserror::Error)]
pub enum NetRulesError {
    #[error(transparent)]
    Rule(#[from] RuleError),
    #[error("network.rules: at most {MAX_RULES_PER_HOST} rules for one host ({0})")]
    TooManyRules(String),
    #[error("network.rules: {0}")]
    Placeholder(String),
    #[error("network.rules names secrets, and secrets are not enabled on this server")]
    NoSecrets,
    #[error("network.rules: the secret {name:?}: {source}")]
    Secret {
        name: String,
        #[source]
        source: SecretError,
    },
}

impl NetRules {
    /// Rules from `(host, [rule])` pairs as a client sent them: hosts and header names
    /// checked, placeholders' syntax checked (the secrets themselves at [`NetRules::resolve`]).
    pub fn new(hosts: Vec<(String, Vec<Rule>)>) -> Result<NetRules, NetRulesError> {
        if hosts.len() > MAX_HOSTS {
            return Err(RuleError::TooManyHosts.into());
        }
        let written: usize = hosts
            .iter()
            .flat_map(|(_, rules)| rules.iter().flat_map(|r| &r.headers))
            .map(|(n, v)| n.len() + v.len())
            .sum();
        if written > husk_net::rules::MAX_TOTAL {
            return Err(RuleError::TooBig.into());
        }
        let mut out: Vec<HostRules> = Vec::with_capacity(hosts.len());
        for (host, rules) in hosts {
            let host = parse_host(&host)?;
            if out.iter().any(|h| h.host == host) {
                return Err(RuleError::DuplicateHost(host).into());
            }
            if rules.len() > MAX_RULES_PER_HOST {
                return Err(NetRulesError::TooManyRules(host));
            }
            let count: usize = rules.iter().map(|r| r.headers.len()).sum();
            if count > MAX_HEADERS {
                return Err(RuleError::TooManyHeaders(host).into());
            }
            for (name, value) in rules.iter().flat_map(|r| &r.headers) {
                check_header_name(name)?;
                placeholders(value)?;
                // The literal parts: the whole value with no placeholder filled in.
                check_header_value(name, value.as_bytes())?;
            }
            out.push(HostRules { host, rules });
        }
        // By name: which host comes first means nothing (the best match is chosen), and the
        // same rules read the same whatever order or spelling they came in.
        out.sort_by(|a, b| a.host.cmp(&b.host));
        Ok(NetRules { hosts: out })
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The secrets the rules name.
    pub fn secret_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .hosts
            .iter()
            .flat_map(|h| &h.rules)
            .flat_map(|r| &r.headers)
            .flat_map(|(_, v)| placeholders(v).unwrap_or_default())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The rules with `team`'s secrets filled in, for the network helper: per host, the
    /// headers of its rules in order (a later one of a name replaces an earlier one).
    pub fn resolve(
        &self,
        team: &str,
        secrets: Option<&Secrets>,
    ) -> Result<HeaderRules, NetRulesError> {
        self.resolve_with(|name| {
            let store = secrets.ok_or(NetRulesError::NoSecrets)?;
            store
                .get(team, name)
                .map_err(|source| NetRulesError::Secret {
                    name: name.to_owned(),
                    source,
                })
        })
    }

    /// As [`NetRules::resolve`], with each secret's value from `secret(NAME)`.
    pub fn resolve_with(
        &self,
        mut secret: impl FnMut(&str) -> Result<Zeroizing<Vec<u8>>, NetRulesError>,
    ) -> Result<HeaderRules, NetRulesError> {
        let mut hosts = Vec::with_capacity(self.hosts.len());
        for h in &self.hosts {
            let mut headers: Vec<(String, SecretValue)> = Vec::new();
            for (name, value) in h.rules.iter().flat_map(|r| &r.headers) {
                let name = check_header_name(name)?;
                let value = fill(value, &mut secret)?;
                check_header_value(&name, &value)?;
                headers.retain(|(n, _)| *n != name);
                headers.push((name, SecretValue::new(value.to_vec())));
            }
            hosts.push(HostRule {
                host: h.host.clone(),
                headers,
            });
        }
        let resolved = HeaderRules { hosts };
        if resolved.size() > husk_net::rules::MAX_TOTAL {
            return Err(RuleError::TooBig.into());
        }
        Ok(resolved)
    }
}

/// The secret names a value's placeholders hold, in order; an `${e2b.` placeholder of another
/// kind, or an unterminated one, is refused.
fn placeholders(value: &str) -> Result<Vec<String>, NetRulesError> {
    let mut names = Vec::new();
    let mut rest = value;
    while let Some(at) = rest.find("${e2b.") {
        let after = &rest[at..];
        let Some(end) = after.find('}') else {
            return Err(NetRulesError::Placeholder(format!(
                "an unterminated placeholder in {value:?}"
            )));
        };
        let inner = &after[..end + 1];
        match inner
            .strip_prefix(SECRET_PLACEHOLDER)
            .and_then(|s| s.strip_suffix('}'))
        {
            Some(name) if crate::secrets::validate_name(&name.to_ascii_lowercase()).is_ok() => {
                names.push(name.to_ascii_lowercase())
            }
            Some(name) => {
                return Err(NetRulesError::Placeholder(format!(
                    "{name:?} is not a secret name"
                )))
            }
            None => {
                return Err(NetRulesError::Placeholder(format!(
                    "{inner} is not supported by husk (only ${{e2b.secrets.NAME}})"
                )))
            }
        }
        rest = &after[end + 1..];
    }
    Ok(names)
}

/// `value` with each `${e2b.secrets.NAME}` replaced by what `secret(NAME)` gives.
fn fill(
    value: &str,
    secret: &mut impl FnMut(&str) -> Result<Zeroizing<Vec<u8>>, NetRulesError>,
) -> Result<Zeroizing<Vec<u8>>, NetRulesError> {
    let mut out = Zeroizing::new(Vec::with_capacity(value.len()));
    let mut rest = value;
    while let Some(at) = rest.find(SECRET_PLACEHOLDER) {
        out.extend_from_slice(&rest.as_bytes()[..at]);
        let after = &rest[at + SECRET_PLACEHOLDER.len()..];
        let end = after.find('}').ok_or_else(|| {
            NetRulesError::Placeholder(format!("an unterminated placeholder in {value:?}"))
        })?;
        let v = secret(&after[..end].to_ascii_lowercase())?;
        out.extend_from_slice(&v);
        rest = &after[end + 1..];
    }
    out.extend_from_slice(rest.as_bytes());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(h: &[(&str, &str)]) -> Rule {
        Rule {
            headers: h
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn placeholders_are_found_and_checked() {
        assert_eq!(
            placeholders("Bearer ${e2b.secrets.OpenAI-Key} and ${e2b.secrets.b}").unwrap(),
            vec!["openai-key".to_string(), "b".to_string()]
        );
        assert!(placeholders("plain ${HOME} value").unwrap().is_empty());
        for bad in [
            "${e2b.identity.tokens.aws}",
            "${e2b.secrets.}",
            "x ${e2b.secrets.k",
            "${e2b.secrets.a b}",
        ] {
            assert!(placeholders(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn values_are_filled_and_later_headers_replace_earlier_ones() {
        let rules = NetRules::new(vec![(
            "API.example.com".into(),
            vec![
                rule(&[("Authorization", "Bearer ${e2b.secrets.K}"), ("X-A", "1")]),
                rule(&[("x-a", "2${e2b.secrets.k}2")]),
            ],
        )])
        .unwrap();
        assert_eq!(rules.hosts[0].host, "api.example.com");
        assert_eq!(rules.secret_names(), vec!["k".to_string()]);
        let mut asked = Vec::new();
        let resolved = rules
            .resolve_with(|name| {
                asked.push(name.to_owned());
                Ok(Zeroizing::new(b"s3cr3t".to_vec()))
            })
            .unwrap();
        let got: Vec<(String, Vec<u8>)> = resolved.hosts[0]
            .headers
            .iter()
            .map(|(n, v)| (n.clone(), v.bytes().to_vec()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("authorization".into(), b"Bearer s3cr3t".to_vec()),
                ("x-a".into(), b"2s3cr3t2".to_vec()),
            ]
        );
        assert_eq!(asked, vec!["k", "k"]);
    }

    #[test]
    fn bad_rules_are_refused_with_the_reason() {
        type Hosts = Vec<(String, Vec<Rule>)>;
        let cases: Vec<(Hosts, &str)> = vec![
            (vec![("10.0.0.1".into(), vec![])], "not a host name"),
            (vec![("*".into(), vec![])], "not a host name"),
            (
                vec![("a.example".into(), vec![rule(&[("Host", "x")])])],
                "belongs to the proxy",
            ),
            (
                vec![("a.example".into(), vec![rule(&[("x", "a\nb")])])],
                "line break",
            ),
            (
                vec![(
                    "a.example".into(),
                    vec![rule(&[("x", "${e2b.identity.tokens.t}")])],
                )],
                "not supported by husk",
            ),
            (
                vec![("a.example".into(), vec![]), ("A.example.".into(), vec![])],
                "named twice",
            ),
        ];
        for (hosts, want) in cases {
            let e = NetRules::new(hosts).unwrap_err().to_string();
            assert!(e.contains(want), "{e} (wanted {want:?})");
        }
    }

    #[test]
    fn resolved_rules_are_bounded_in_all() {
        // Each value within its own bound, together over the helper's.
        let hosts = (0..20)
            .map(|i| {
                (
                    format!("h{i}.example"),
                    vec![rule(&[("x", "${e2b.secrets.big}")])],
                )
            })
            .collect();
        let rules = NetRules::new(hosts).unwrap();
        let big = Zeroizing::new(vec![b'k'; husk_net::rules::MAX_VALUE]);
        assert!(matches!(
            rules.resolve_with(|_| Ok(big.clone())),
            Err(NetRulesError::Rule(RuleError::TooBig))
        ));
    }

    #[test]
    fn without_a_secret_store_a_placeholder_is_refused() {
        let rules = NetRules::new(vec![(
            "a.example".into(),
            vec![rule(&[("x", "${e2b.secrets.k}")])],
        )])
        .unwrap();
        assert!(matches!(
            rules.resolve("team", None),
            Err(NetRulesError::NoSecrets)
        ));
        // Rules without placeholders need no store.
        let plain = NetRules::new(vec![("a.example".into(), vec![rule(&[("x", "v")])])]).unwrap();
        assert_eq!(plain.resolve("team", None).unwrap().hosts.len(), 1);
    }
}
