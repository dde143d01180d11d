//! TLS on husk's listeners (`--tls-cert`/`--tls-key`), and on the connections a cluster's
//! processes make to its nodes (`https://` advertised URLs, verified against `--cluster-ca`).
//!
//! A listener's certificate is read again every [`RELOAD`]: certificates are short-lived where
//! they are issued automatically (cert-manager renews at two thirds of their life), and a
//! restart for each would end every stream a node carries. A pair that does not parse, or
//! whose key is not the certificate's, changes nothing and is reported once.
//!
//! The cluster token stays the node API's credential; TLS keeps it (and every tenant's bytes)
//! off the wire in clear and tells a gateway it talks to a node of its cluster. Nodes of a
//! DaemonSet have addresses nobody knows in advance, so a cluster may give all of them one
//! certificate for one name ([`ClientTls::for_nodes`] with a name): each is then verified
//! against that name, whatever address it was reached at.

use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use zeroize::Zeroizing;

/// How often a listener's certificate and key are read again.
pub const RELOAD: Duration = Duration::from_secs(2);
/// Largest certificate chain (or CA bundle) file read.
pub use husk_core::operator_files::MAX_CERT_FILE;
/// Largest private key file read.
pub use husk_core::operator_files::MAX_KEY_FILE;
/// How long before a listener's certificate expires the log starts saying so (then once a
/// day): an expired node certificate cuts the node off from every gateway.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(14 * 86_400);
/// How often the expiry is told again while it nears.
const EXPIRY_REMINDER: Duration = Duration::from_secs(86_400);

/// Why a certificate, key or CA cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    #[error("{what} {path}: {error}")]
    Read {
        what: &'static str,
        path: String,
        error: String,
    },
    #[error("--tls-cert: no PEM certificate in it")]
    NoCertificate,
    #[error("--tls-cert: {0}")]
    Certificate(String),
    #[error("--tls-key: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)")]
    NoKey,
    #[error("--tls-key: {0}")]
    Key(String),
    #[error("--tls-key is not the key of --tls-cert's certificate")]
    KeyMismatch,
    #[error("--cluster-ca {0}: no PEM certificate in it")]
    NoCa(String),
    #[error("--cluster-ca {path}: {error}")]
    Ca { path: String, error: String },
    #[error("--cluster-tls-name {0:?} is not a DNS name or an IP address")]
    Name(String),
    #[error("{0}")]
    Config(String),
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// Reads a file whole, at most `max` bytes (a certificate, key or CA file; `what` is its flag).
pub fn read_bounded(
    what: &'static str,
    path: &Path,
    max: usize,
) -> Result<Zeroizing<Vec<u8>>, TlsError> {
    husk_core::operator_files::read(path, max).map_err(|e| TlsError::Read {
        what,
        path: path.display().to_string(),
        error: e.to_string(),
    })
}

/// A certificate chain and its key, from PEM, checked to belong together.
fn certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Certificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = match PrivateKeyDer::from_pem_slice(key_pem) {
        Ok(k) => k,
        Err(rustls::pki_types::pem::Error::NoItemsFound) => return Err(TlsError::NoKey),
        Err(e) => return Err(TlsError::Key(e.to_string())),
    };
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| TlsError::Key(e.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    match certified.keys_match() {
        Ok(()) => Ok(certified),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch)) => {
            Err(TlsError::KeyMismatch)
        }
        // A key type whose public half rustls cannot compare: the handshake will tell.
        Err(rustls::Error::InconsistentKeys(_)) => Ok(certified),
        Err(e) => Err(TlsError::Certificate(e.to_string())),
    }
}

/// The certificate a listener presents, swapped in place when its files change.
#[derive(Debug)]
struct Current {
    key: RwLock<Arc<CertifiedKey>>,
    /// The files' bytes it was made from, to tell a change (a digest: the key stays out).
    digest: RwLock<[u8; 32]>,
    /// When the leaf stops being valid, and when that was last told.
    expiry: Mutex<Expiry>,
}

/// A certificate's end of validity, and the warnings about it.
#[derive(Debug, Default)]
struct Expiry {
    not_after: Option<SystemTime>,
    told: Option<SystemTime>,
}

impl Expiry {
    fn of(key: &CertifiedKey) -> Expiry {
        Expiry {
            not_after: key.cert.first().and_then(|leaf| not_after(leaf)),
            told: None,
        }
    }

    /// What to log at `now`, if anything: once the end is within [`EXPIRY_WARNING`] (or past),
    /// then once every [`EXPIRY_REMINDER`].
    fn check(&mut self, now: SystemTime) -> Option<ExpiryNotice> {
        let end = self.not_after?;
        let left = end.duration_since(now).unwrap_or_default();
        if left > EXPIRY_WARNING {
            return None;
        }
        if let Some(told) = self.told {
            if now.duration_since(told).unwrap_or_default() < EXPIRY_REMINDER {
                return None;
            }
        }
        self.told = Some(now);
        Some(if left.is_zero() {
            ExpiryNotice::Expired
        } else {
            ExpiryNotice::Soon {
                days: left.as_secs().div_ceil(86_400),
            }
        })
    }
}

/// What the log says of a certificate's expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpiryNotice {
    /// Past its end: clients refuse it.
    Expired,
    /// Ends within this many days (rounded up).
    Soon { days: u64 },
}

impl ExpiryNotice {
    fn log(self) {
        match self {
            ExpiryNotice::Expired => tracing::error!(
                "the TLS certificate has expired: clients refuse it; renew it (the files are \
                 read again every 2 s)"
            ),
            ExpiryNotice::Soon { days } => tracing::warn!(
                days,
                "the TLS certificate expires within {days} day(s): renew it (the files are \
                 read again every 2 s)"
            ),
        }
    }
}

/// When a DER certificate stops being valid (`notAfter`), if it parses.
fn not_after(der: &[u8]) -> Option<SystemTime> {
    use x509_cert::der::Decode;
    let cert = x509_cert::Certificate::from_der(der).ok()?;
    Some(cert.tbs_certificate.validity.not_after.to_system_time())
}

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.key.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

fn digest(cert_pem: &[u8], key_pem: &[u8]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((cert_pem.len() as u64).to_le_bytes());
    h.update(cert_pem);
    h.update(key_pem);
    h.finalize().into()
}

/// A listener's TLS: its configuration and the certificate in it.
#[derive(Clone)]
pub struct ServerTls {
    config: Arc<ServerConfig>,
    current: Arc<Current>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").finish_non_exhaustive()
    }
}

impl ServerTls {
    /// From a PEM certificate chain (leaf first) and its PEM private key.
    pub fn from_pem(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerTls, TlsError> {
        let key = certified_key(cert_pem, key_pem)?;
        let current = Arc::new(Current {
            expiry: Mutex::new(Expiry::of(&key)),
            key: RwLock::new(Arc::new(key)),
            digest: RwLock::new(digest(cert_pem, key_pem)),
        });
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // Both: the listener tells HTTP/2 from HTTP/1.1 by the first bytes anyway.
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(ServerTls {
            config: Arc::new(config),
            current,
        })
    }

    /// The acceptor the listener hands each connection to.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// Takes the pair if it differs from the one in use: `Ok(true)` when it was taken. A pair
    /// that cannot be used leaves the one in use.
    pub fn reload(&self, cert_pem: &[u8], key_pem: &[u8]) -> Result<bool, TlsError> {
        let d = digest(cert_pem, key_pem);
        if *self
            .current
            .digest
            .read()
            .unwrap_or_else(|p| p.into_inner())
            == d
        {
            return Ok(false);
        }
        let key = certified_key(cert_pem, key_pem)?;
        *self
            .current
            .expiry
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Expiry::of(&key);
        *self.current.key.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(key);
        *self
            .current
            .digest
            .write()
            .unwrap_or_else(|p| p.into_inner()) = d;
        Ok(true)
    }

    /// What to say now of the certificate's expiry, if anything (said again once a day while
    /// it nears, and at once for a new certificate).
    pub fn expiry_notice(&self, now: SystemTime) -> Option<ExpiryNotice> {
        self.current
            .expiry
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(now)
    }

    /// Reads the certificate and key again every [`RELOAD`] with `read` (blocking: `husk
    /// serve` and `husk node` ask their state helper, a gateway reads the files), for as long
    /// as the runtime runs. A pair that cannot be used is reported once and changes nothing.
    pub fn spawn_reload<F>(&self, read: F)
    where
        F: Fn() -> Result<CertFiles, String> + Send + Sync + 'static,
    {
        if let Some(notice) = self.expiry_notice(SystemTime::now()) {
            notice.log();
        }
        let tls = self.clone();
        let mut failures = Failures::default();
        crate::reread::spawn("TLS certificate", RELOAD, read, move |files: CertFiles| {
            let reloaded = tls.reload(&files.cert, &files.key);
            if let Some(notice) = tls.expiry_notice(SystemTime::now()) {
                notice.log();
            }
            match reloaded {
                Ok(true) => {
                    failures.worked();
                    tracing::info!("the TLS certificate changed: it is in use");
                }
                Ok(false) => failures.worked(),
                Err(e) => {
                    if failures.report(digest(&files.cert, &files.key)) {
                        tracing::error!("{e}: the certificate read before stays in use");
                    }
                }
            }
        });
    }
}

/// Which failed reloads are worth an error in the log. A renewal caught between its two
/// files (the new key, the old certificate) fails one read and is whole at the next: only a
/// pair that fails twice in a row is reported, and then once, however long it stays.
#[derive(Debug, Default)]
struct Failures {
    last: Option<[u8; 32]>,
    reported: Option<[u8; 32]>,
}

impl Failures {
    /// A read of the pair with digest `d` failed: whether to report it.
    fn report(&mut self, d: [u8; 32]) -> bool {
        let again = self.last.replace(d) == Some(d);
        if again && self.reported != Some(d) {
            self.reported = Some(d);
            return true;
        }
        false
    }

    /// A read gave a usable pair (new or the same).
    fn worked(&mut self) {
        self.last = None;
        self.reported = None;
    }
}

/// A listener's certificate chain and key, as read from their files.
pub struct CertFiles {
    pub cert: Zeroizing<Vec<u8>>,
    pub key: Zeroizing<Vec<u8>>,
}

impl CertFiles {
    /// Reads both files, bounded.
    pub fn read(cert: &Path, key: &Path) -> Result<CertFiles, TlsError> {
        Ok(CertFiles {
            cert: read_bounded("--tls-cert", cert, MAX_CERT_FILE)?,
            key: read_bounded("--tls-key", key, MAX_KEY_FILE)?,
        })
    }
}

/// How a cluster's processes verify the nodes they reach at `https://` URLs.
#[derive(Clone)]
pub struct ClientTls {
    config: ClientConfig,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Nodes' certificates verified against the CA certificates in `ca_pem` (from `ca_path`,
    /// named in errors), or the host's CA certificates without one; and against `name` if
    /// given (one certificate for all nodes), else the host of each node's URL.
    pub fn for_nodes(
        ca: Option<(&Path, &[u8])>,
        name: Option<&str>,
    ) -> Result<ClientTls, TlsError> {
        let mut roots = RootCertStore::empty();
        match ca {
            Some((path, pem)) => {
                let certs = CertificateDer::pem_slice_iter(pem)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| TlsError::Ca {
                        path: path.display().to_string(),
                        error: e.to_string(),
                    })?;
                if certs.is_empty() {
                    return Err(TlsError::NoCa(path.display().to_string()));
                }
                for cert in certs {
                    roots.add(cert).map_err(|e| TlsError::Ca {
                        path: path.display().to_string(),
                        error: e.to_string(),
                    })?;
                }
            }
            None => {
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            }
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let config = match name {
            None => builder.with_root_certificates(roots).with_no_client_auth(),
            Some(name) => {
                let name = ServerName::try_from(name.to_owned())
                    .map_err(|_| TlsError::Name(name.to_owned()))?;
                let inner =
                    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                        .build()
                        .map_err(|e| TlsError::Config(e.to_string()))?;
                builder
                    // Verification is WebPKI's, in full; only the name it checks is fixed.
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(OneName { inner, name }))
                    .with_no_client_auth()
            }
        };
        Ok(ClientTls { config })
    }

    /// The rustls configuration (ALPN left empty: the connector sets it).
    pub fn config(&self) -> ClientConfig {
        self.config.clone()
    }
}

/// WebPKI's verification of a server's certificate against a fixed name instead of the one
/// the client dialled (an address).
#[derive(Debug)]
struct OneName {
    inner: Arc<WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for OneName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
#[path = "tls_tests.rs"]
pub(crate) mod tests;
