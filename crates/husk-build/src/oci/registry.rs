//! How husk talks to registries: which ones get plain HTTP, which credentials, and the
//! oci-client configuration both pulls and pushes use.

use std::net::IpAddr;
use std::time::Duration;

use oci_client::client::{linux_amd64_resolver, ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::error::OciError;

/// Registry access settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegistryOptions {
    /// Registries (`host[:port]`, as written in references) reached over plain HTTP. Loopback
    /// registries always are, as in Docker.
    pub insecure: Vec<String>,
    /// Basic credentials `(username, password)`; oci-client trades them for a bearer token when
    /// the registry asks for one. `None` pulls anonymously (still with the anonymous token dance).
    pub auth: Option<(String, String)>,
}

impl RegistryOptions {
    /// From `HUSK_REGISTRY_USERNAME` / `HUSK_REGISTRY_PASSWORD` (both needed) and
    /// `HUSK_INSECURE_REGISTRIES` (comma-separated `host[:port]`).
    pub fn from_env() -> Self {
        let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
        let insecure = var("HUSK_INSECURE_REGISTRIES")
            .map(|list| {
                list.split(',')
                    .map(|s| s.trim().to_string())
                    .filter(|s| !s.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let auth = match (var("HUSK_REGISTRY_USERNAME"), var("HUSK_REGISTRY_PASSWORD")) {
            (Some(user), Some(password)) => Some((user, password)),
            _ => None,
        };
        RegistryOptions { insecure, auth }
    }

    pub(crate) fn registry_auth(&self) -> RegistryAuth {
        match &self.auth {
            Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
            None => RegistryAuth::Anonymous,
        }
    }

    /// A client for talking to `reference`'s registry.
    pub(crate) fn client_for(&self, reference: &Reference) -> Result<Client, OciError> {
        let registry = reference.resolve_registry();
        let mut http = self.insecure.clone();
        if is_loopback(registry) {
            http.push(registry.to_string());
        }
        let config = ClientConfig {
            protocol: ClientProtocol::HttpsExcept(http),
            // Templates run on amd64 hosts whatever machine builds them.
            platform_resolver: Some(Box::new(linux_amd64_resolver)),
            connect_timeout: Some(Duration::from_secs(30)),
            // Per read, not per request: a multi-GB layer may take long, a stalled one may not.
            read_timeout: Some(Duration::from_secs(300)),
            ..ClientConfig::default()
        };
        Client::try_from(config).map_err(|source| OciError::Registry {
            registry: registry.to_string(),
            action: "setting up the HTTP client".to_string(),
            source,
        })
    }
}

/// Parses `reference`, with a user-facing error.
pub(crate) fn parse_reference(reference: &str) -> Result<Reference, OciError> {
    reference
        .parse()
        .map_err(|source| OciError::InvalidReference {
            reference: reference.to_string(),
            source,
        })
}

/// Whether a registry `host[:port]` is on this machine: 127.0.0.0/8, `[::1]` or `localhost`.
pub(crate) fn is_loopback(registry: &str) -> bool {
    let host = if let Some(rest) = registry.strip_prefix('[') {
        match rest.split_once(']') {
            Some((host, _)) => host,
            None => return false,
        }
    } else {
        registry.split(':').next().unwrap_or(registry)
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_registries() {
        for r in [
            "127.0.0.1:5000",
            "127.1.2.3",
            "localhost",
            "LOCALHOST:80",
            "[::1]:5000",
        ] {
            assert!(is_loopback(r), "{r}");
        }
        for r in [
            "index.docker.io",
            "10.0.0.1:5000",
            "localhost.evil.com",
            "[::2]:1",
            "[::1",
        ] {
            assert!(!is_loopback(r), "{r}");
        }
    }

    #[test]
    fn loopback_registry_uses_plain_http() {
        let opts = RegistryOptions::default();
        let r = parse_reference("127.0.0.1:5000/husk/test:v1").unwrap();
        assert_eq!(r.resolve_registry(), "127.0.0.1:5000");
        opts.client_for(&r).unwrap();
    }
}
