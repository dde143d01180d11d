//! A sandbox's own certificate authority, for the hosts its header rules name
//! ([`crate::rules`]): the network helper makes one per sandbox that has rules, the sandbox's
//! trust store gets its certificate (never its key, which stays in the helper's memory), and
//! the domain proxy shows the sandbox a certificate it signs for the host the sandbox asked
//! for. One CA per sandbox: a certificate minted for one sandbox means nothing in another.
//! A server's router also keeps the key in its link's record (root's alone, under `/run`),
//! so that the next network helper can take a sandbox that outlived the server up with the
//! CA it already trusts ([`crate::router::Router::reattach`]); the key never reaches the
//! server itself.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use time::{Duration, OffsetDateTime};

/// How long the CA is valid (beyond any sandbox's life).
const CA_DAYS: i64 = 400;
/// How long a host's certificate is valid: each connection gets a fresh one.
const LEAF_DAYS: i64 = 7;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("making a certificate: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("TLS configuration: {0}")]
    Tls(#[from] rustls::Error),
}

pub struct SandboxCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// The subject of every sandbox CA (the same for all: what tells one from another is its key).
fn ca_params(label: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "husk");
    dn.push(DnType::CommonName, format!("husk sandbox CA {label}"));
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

impl std::fmt::Debug for SandboxCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SandboxCa")
    }
}

/// The crypto provider for every TLS configuration of the proxy (the helper installs no
/// process-wide default).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl SandboxCa {
    /// A new CA (an ECDSA P-256 key), named for `label` (the sandbox's link, for whoever
    /// reads the certificate).
    pub fn new(label: &str) -> Result<SandboxCa, CaError> {
        let key = KeyPair::generate()?;
        let mut params = ca_params(label);
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(CA_DAYS);
        let cert = params.self_signed(&key)?;
        Ok(SandboxCa {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA made by [`SandboxCa::new`] with `label`, from its certificate and its key
    /// (PEM, [`SandboxCa::key_pem`]): it signs as the original did (same subject, same key,
    /// hence the same key identifier), so what the sandbox trusts goes on working.
    pub fn restore(label: &str, cert_pem: &str, key_pem: &str) -> Result<SandboxCa, CaError> {
        let key = KeyPair::from_pem(key_pem)?;
        Ok(SandboxCa {
            pem: cert_pem.to_owned(),
            issuer: Issuer::new(ca_params(label), key),
        })
    }

    /// The CA's private key (PEM): for its link's record only.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// The CA's certificate (PEM), for the sandbox's trust store.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A server configuration that shows `host` a certificate this CA signed (HTTP/1.1 only:
    /// the proxy speaks HTTP/1.1 on both sides).
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, CaError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_owned()])?;
        params.distinguished_name = DistinguishedName::new();
        params
            .distinguished_name
            .push(DnType::CommonName, host.to_owned());
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(LEAF_DAYS);
        let cert = params.signed_by(&key, &self.issuer)?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut cfg = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![CertificateDer::from(cert.der().to_vec())], key)?;
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::ServerName;
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    /// Whether a client that trusts `trusted` (PEM) accepts what `ca` signs for `api.test`.
    async fn trusted_by(ca: &SandboxCa, trusted: &str) -> bool {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(trusted.as_bytes()).unwrap())
            .unwrap();
        let client = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let server = TlsAcceptor::from(ca.server_config("api.test").unwrap());
        let (a, b) = tokio::io::duplex(64 << 10);
        let accept = tokio::spawn(async move { server.accept(b).await.is_ok() });
        let name = ServerName::try_from("api.test").unwrap();
        let ok = TlsConnector::from(Arc::new(client))
            .connect(name, a)
            .await
            .is_ok();
        accept.abort();
        ok
    }

    #[tokio::test]
    async fn a_restored_ca_signs_what_the_sandbox_already_trusts() {
        let original = SandboxCa::new("sandbox").unwrap();
        let restored = SandboxCa::restore("sandbox", original.pem(), &original.key_pem()).unwrap();
        assert_eq!(restored.pem(), original.pem());
        assert!(trusted_by(&original, original.pem()).await);
        assert!(trusted_by(&restored, original.pem()).await);
        // Another CA of the same name is not trusted: the key is what counts.
        let other = SandboxCa::new("sandbox").unwrap();
        assert!(!trusted_by(&other, original.pem()).await);
        assert!(SandboxCa::restore("sandbox", original.pem(), "not a key").is_err());
    }
}
