//! TLS to PostgreSQL (`sslmode=require`): rustls with husk's crypto provider (aws-lc), the
//! host's CA certificates and an operator's own CA (`--database-ca`), and the server's
//! certificate always verified against them and the host name in the URL, as libpq's
//! `verify-full` does. A connection is never encrypted without knowing whom it talks to.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::super::StoreError;

/// The connector for a pool: verifying TLS when `require`d; else one never used (the
/// connection's `sslmode` is `disable`), with no roots loaded.
pub(super) fn connector(require: bool, ca: Option<&Path>) -> Result<MakeRustlsConnect, StoreError> {
    let mut roots = RootCertStore::empty();
    if require {
        let native = rustls_native_certs::load_native_certs();
        roots.add_parsable_certificates(native.certs);
        if let Some(ca) = ca {
            for cert in read_pem(ca)? {
                roots
                    .add(cert)
                    .map_err(|e| StoreError::Tls(format!("{}: {e}", ca.display())))?;
            }
        }
        if roots.is_empty() {
            return Err(StoreError::Tls(
                "sslmode=require, but no CA certificate to verify the database with: none on \
                 this host and no --database-ca"
                    .into(),
            ));
        }
    } else if let Some(ca) = ca {
        return Err(StoreError::Tls(format!(
            "--database-ca {} is given but the URL does not ask for TLS: add sslmode=require",
            ca.display()
        )));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The certificates in a PEM file (at least one).
fn read_pem(path: &Path) -> Result<Vec<CertificateDer<'static>>, StoreError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StoreError::Tls(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(StoreError::Tls(format!(
            "{}: no PEM certificate in it",
            path.display()
        )));
    }
    Ok(certs)
}
