//! The domain a server's sandboxes are reachable under (`husk serve --domain`), given to the
//! SDKs as each sandbox's `domain`: they then address a sandbox's port `P` as
//! `P-<sandboxID>.<domain>` (`get_host`, and every per-sandbox call when `E2B_SANDBOX_URL` is
//! not set), which husk routes by its `Host` header.

use std::fmt;

/// Longest domain name DNS allows.
const MAX_NAME: usize = 253;
/// Longest label DNS allows.
const MAX_LABEL: usize = 63;

/// A domain name (lower-case letters, digits and `-` in dot-separated labels), with an
/// optional `:port` for servers not on 443.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain(String);

impl Domain {
    pub fn parse(text: &str) -> Result<Domain, String> {
        let text = text.trim().trim_end_matches('.').to_ascii_lowercase();
        let (name, port) = match text.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (text.as_str(), None),
        };
        let bad = |why: &str| Err(format!("'{text}' is not a domain name: {why}"));
        if name.is_empty() {
            return bad("it is empty");
        }
        if name.len() > MAX_NAME {
            return bad("longer than 253 characters");
        }
        for label in name.split('.') {
            if label.is_empty() || label.len() > MAX_LABEL {
                return bad("each dot-separated label has 1 to 63 characters");
            }
            if !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                || label.starts_with('-')
                || label.ends_with('-')
            {
                return bad("labels are letters, digits and inner '-'");
            }
        }
        if let Some(port) = port {
            if !matches!(port.parse::<u16>(), Ok(p) if p > 0) || port.starts_with('0') {
                return bad("the port must be a number from 1 to 65535");
            }
        }
        Ok(Domain(text))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_names_and_ports_are_checked() {
        for (input, want) in [
            ("husk.example.com", "husk.example.com"),
            ("Sandbox.Example.COM.", "sandbox.example.com"),
            ("localhost:3000", "localhost:3000"),
            ("a-b.c9", "a-b.c9"),
        ] {
            assert_eq!(Domain::parse(input).unwrap().as_str(), want, "{input}");
        }
        for input in [
            "",
            ".",
            "a..b",
            "-a.b",
            "a-.b",
            "a_b.c",
            "a b",
            "http://x.com",
            "x.com/path",
            "x.com:0",
            "x.com:65536",
            "x.com:08",
            "x.com:",
            &"a".repeat(64),
            &format!("{}.com", vec!["a".repeat(60); 5].join(".")),
        ] {
            let err = Domain::parse(input).unwrap_err();
            assert!(err.contains("is not a domain name"), "{input}: {err}");
        }
    }
}
