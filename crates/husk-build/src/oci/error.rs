//! The one error type of [`crate::oci`], and the translation of oci-client's errors (which
//! speak HTTP) into ones a user can act on (which name the registry or the image).

use std::io;

use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};

/// Why pulling, unpacking or exporting an image failed.
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The reference does not parse as `[registry/]repository[:tag][@digest]`.
    #[error("invalid image reference {reference:?}")]
    InvalidReference {
        reference: String,
        #[source]
        source: oci_client::ParseError,
    },
    /// Nothing answered (or TLS failed: a plain-HTTP registry reached over HTTPS fails here).
    #[error(
        "registry {registry} is unreachable (a plain-HTTP registry must be listed in \
         HUSK_INSECURE_REGISTRIES)"
    )]
    RegistryUnreachable {
        registry: String,
        #[source]
        source: OciDistributionError,
    },
    /// The registry has no manifest under that tag or digest (or no such repository).
    #[error("image {reference} not found")]
    ManifestNotFound { reference: String },
    /// The registry wants credentials, or rejected the ones given.
    #[error(
        "registry {registry} refused access to {reference} (credentials come from \
         HUSK_REGISTRY_USERNAME and HUSK_REGISTRY_PASSWORD)"
    )]
    Unauthorized { registry: String, reference: String },
    /// A multi-arch index without a linux/amd64 entry.
    #[error("image {reference} has no linux/amd64 variant")]
    NoLinuxAmd64 { reference: String },
    /// Downloaded bytes do not hash to the digest the manifest promised.
    #[error("blob {expected} failed verification: its content hashes to {actual}")]
    DigestMismatch { expected: String, actual: String },
    /// Only sha256 digests are verified, so only they are accepted.
    #[error("unsupported digest {digest:?} (only sha256 is supported)")]
    UnsupportedDigest { digest: String },
    #[error("unsupported layer media type {media_type}")]
    UnsupportedMediaType { media_type: String },
    /// The image is well-formed for the registry but not usable as a root file system.
    #[error("image {reference}: {message}")]
    BadImage { reference: String, message: String },
    /// Any other registry failure; `action` says what husk was doing.
    #[error("registry {registry}: {action} failed")]
    Registry {
        registry: String,
        action: String,
        #[source]
        source: OciDistributionError,
    },
    /// A layer entry husk refuses to unpack (escapes, forged links, bad names).
    #[error("layer entry {entry}: {reason}")]
    Unpack { entry: String, reason: String },
    #[error("layer entry {entry}")]
    UnpackIo {
        entry: String,
        #[source]
        source: io::Error,
    },
    #[error("layer has more than {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("layer entry {entry}...: path longer than {limit} bytes")]
    PathTooLong { entry: String, limit: usize },
    /// Local I/O; `context` names the operation and path.
    #[error("{context}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl OciError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(io::Error) -> OciError {
        let context = context.into();
        move |source| OciError::Io { context, source }
    }
}

/// What husk was doing when the registry failed, which decides what "404" means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Manifest,
    Blob,
    Push,
}

impl Phase {
    fn action(self) -> &'static str {
        match self {
            Phase::Manifest => "fetching the manifest",
            Phase::Blob => "downloading a blob",
            Phase::Push => "pushing",
        }
    }
}

/// Translates an oci-client error about `reference` (on `registry`) into an [`OciError`].
pub(crate) fn registry_error(
    source: OciDistributionError,
    registry: &str,
    reference: &str,
    phase: Phase,
) -> OciError {
    let unauthorized = || OciError::Unauthorized {
        registry: registry.to_string(),
        reference: reference.to_string(),
    };
    let not_found = || OciError::ManifestNotFound {
        reference: reference.to_string(),
    };
    match &source {
        OciDistributionError::RequestError(e) if e.is_connect() || e.is_timeout() => {
            return OciError::RegistryUnreachable {
                registry: registry.to_string(),
                source,
            }
        }
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => return unauthorized(),
        OciDistributionError::ServerError {
            code: 401 | 403, ..
        } => return unauthorized(),
        OciDistributionError::ImageManifestNotFoundError(_) => return not_found(),
        OciDistributionError::ServerError { code: 404, .. } if phase == Phase::Manifest => {
            return not_found()
        }
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes = || envelope.errors.iter().map(|e| &e.code);
            if codes().any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied)) {
                return unauthorized();
            }
            let missing = |c: &OciErrorCode| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::NotFound
                )
            };
            if phase == Phase::Manifest && codes().any(missing) {
                return not_found();
            }
        }
        OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
            return OciError::DigestMismatch {
                expected: expected.clone(),
                actual: actual.clone(),
            }
        }
        _ => {}
    }
    OciError::Registry {
        registry: registry.to_string(),
        action: phase.action().to_string(),
        source,
    }
}
