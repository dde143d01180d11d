//! Certificates parsed, checked and swapped, and nodes verified by the CA and the name
//! asked for, over real handshakes on loopback.

use super::*;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A CA, and certificates it signs. Public: the listener's tests use it too.
pub(crate) struct TestCa {
    pub pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub(crate) fn new() -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        TestCa {
            pem,
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for `names` (DNS names or IP addresses) and its key, both PEM.
    pub(crate) fn leaf(&self, names: &[&str]) -> (String, String) {
        self.leaf_until(names, None)
    }

    /// [`TestCa::leaf`], valid until `end` (rcgen's default end without it).
    pub(crate) fn leaf_until(&self, names: &[&str], end: Option<SystemTime>) -> (String, String) {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        if let Some(end) = end {
            params.not_before = (end - Duration::from_secs(365 * 86_400)).into();
            params.not_after = end.into();
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

#[test]
fn a_pair_that_does_not_belong_together_or_does_not_parse_is_refused_saying_which() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(&["husk-node"]);
    let (_, other_key) = ca.leaf(&["husk-node"]);
    assert!(ServerTls::from_pem(cert.as_bytes(), key.as_bytes()).is_ok());
    assert_eq!(
        ServerTls::from_pem(cert.as_bytes(), other_key.as_bytes()).unwrap_err(),
        TlsError::KeyMismatch
    );
    assert_eq!(
        ServerTls::from_pem(b"", key.as_bytes()).unwrap_err(),
        TlsError::NoCertificate
    );
    assert_eq!(
        ServerTls::from_pem(key.as_bytes(), key.as_bytes()).unwrap_err(),
        TlsError::NoCertificate,
        "a key where the certificate should be"
    );
    assert_eq!(
        ServerTls::from_pem(cert.as_bytes(), cert.as_bytes()).unwrap_err(),
        TlsError::NoKey
    );
    let mangled = cert.replace("MII", "MIX");
    assert!(matches!(
        ServerTls::from_pem(mangled.as_bytes(), key.as_bytes()),
        Err(TlsError::Certificate(_))
    ));
}

#[test]
fn files_over_their_bound_are_not_read() {
    let dir = std::env::temp_dir().join(format!("husk-tls-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.pem");
    std::fs::write(&big, vec![b'a'; MAX_CERT_FILE + 1]).unwrap();
    let small = dir.join("small.pem");
    std::fs::write(&small, b"x").unwrap();
    let got = CertFiles::read(&big, &small);
    std::fs::remove_dir_all(&dir).unwrap();
    match got {
        Err(TlsError::Read { what, error, .. }) => {
            assert_eq!(what, "--tls-cert");
            assert!(error.contains("larger than"), "{error}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("an oversized file was read"),
    }
    assert!(matches!(
        CertFiles::read(Path::new("/nonexistent/c"), Path::new("/nonexistent/k")),
        Err(TlsError::Read { .. })
    ));
}

/// The leaf a client is shown when it connects to a listener with `tls`.
async fn handshake(tls: &ServerTls, client: &ClientTls, dialled: &str) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tls.acceptor();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        if let Ok(mut s) = acceptor.accept(tcp).await {
            let mut b = [0u8; 4];
            if s.read_exact(&mut b).await.is_ok() {
                let _ = s.write_all(&b).await;
            }
        }
    });
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client.config()));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from(dialled.to_owned()).unwrap();
    let got = async {
        let mut s = connector.connect(name, tcp).await?;
        s.write_all(b"ping").await?;
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await?;
        assert_eq!(&b, b"ping");
        Ok::<_, std::io::Error>(())
    }
    .await
    .map_err(|e| e.to_string());
    server.abort();
    got
}

#[tokio::test]
async fn a_node_is_verified_by_the_cluster_ca_and_the_name_asked_for_whatever_its_address() {
    let ca = TestCa::new();
    let (cert, key) = ca.leaf(&["husk-node"]);
    let tls = ServerTls::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let ca_path = Path::new("ca.pem");
    let by_name =
        ClientTls::for_nodes(Some((ca_path, ca.pem.as_bytes())), Some("husk-node")).unwrap();
    handshake(&tls, &by_name, "127.0.0.1").await.unwrap();
    // Without the fixed name, the address dialled is what the certificate must name.
    let by_address = ClientTls::for_nodes(Some((ca_path, ca.pem.as_bytes())), None).unwrap();
    let e = handshake(&tls, &by_address, "127.0.0.1").await.unwrap_err();
    assert!(e.contains("certificate"), "{e}");
    let (cert_ip, key_ip) = ca.leaf(&["127.0.0.1"]);
    let tls_ip = ServerTls::from_pem(cert_ip.as_bytes(), key_ip.as_bytes()).unwrap();
    handshake(&tls_ip, &by_address, "127.0.0.1").await.unwrap();
    // Another name, or another CA, is refused.
    let other_name =
        ClientTls::for_nodes(Some((ca_path, ca.pem.as_bytes())), Some("husk-gateway")).unwrap();
    assert!(handshake(&tls, &other_name, "127.0.0.1").await.is_err());
    let stranger = TestCa::new();
    let (cert_s, key_s) = stranger.leaf(&["husk-node"]);
    let forged = ServerTls::from_pem(cert_s.as_bytes(), key_s.as_bytes()).unwrap();
    let e = handshake(&forged, &by_name, "127.0.0.1").await.unwrap_err();
    assert!(e.contains("invalid peer certificate"), "{e}");
}

#[tokio::test]
async fn a_changed_pair_is_presented_to_the_next_handshake_and_a_broken_one_changes_nothing() {
    let ca = TestCa::new();
    let (cert_a, key_a) = ca.leaf(&["husk-node"]);
    let (cert_b, key_b) = ca.leaf(&["husk-node-b"]);
    let tls = ServerTls::from_pem(cert_a.as_bytes(), key_a.as_bytes()).unwrap();
    let ca_path = Path::new("ca.pem");
    let a = ClientTls::for_nodes(Some((ca_path, ca.pem.as_bytes())), Some("husk-node")).unwrap();
    let b = ClientTls::for_nodes(Some((ca_path, ca.pem.as_bytes())), Some("husk-node-b")).unwrap();
    handshake(&tls, &a, "127.0.0.1").await.unwrap();
    assert_eq!(tls.reload(cert_a.as_bytes(), key_a.as_bytes()), Ok(false));
    // Half-written (a new certificate with the old key): refused, the old pair stays.
    assert_eq!(
        tls.reload(cert_b.as_bytes(), key_a.as_bytes()),
        Err(TlsError::KeyMismatch)
    );
    handshake(&tls, &a, "127.0.0.1").await.unwrap();
    assert_eq!(tls.reload(cert_b.as_bytes(), key_b.as_bytes()), Ok(true));
    handshake(&tls, &b, "127.0.0.1").await.unwrap();
    // A new client (`a` would resume its session, which shows no certificate) is shown b.
    let a_again =
        ClientTls::for_nodes(Some((ca_path, ca.pem.as_bytes())), Some("husk-node")).unwrap();
    let e = handshake(&tls, &a_again, "127.0.0.1").await.unwrap_err();
    assert!(e.contains("invalid peer certificate"), "{e}");
}

#[test]
fn a_cluster_ca_or_name_that_cannot_be_used_is_refused_saying_why() {
    let p = Path::new("/etc/husk/ca.pem");
    assert_eq!(
        ClientTls::for_nodes(Some((p, b"")), None).unwrap_err(),
        TlsError::NoCa("/etc/husk/ca.pem".into())
    );
    let ca = TestCa::new();
    let mangled = ca.pem.replace("MII", "MIX");
    assert!(matches!(
        ClientTls::for_nodes(Some((p, mangled.as_bytes())), None),
        Err(TlsError::Ca { .. })
    ));
    assert_eq!(
        ClientTls::for_nodes(Some((p, ca.pem.as_bytes())), Some("not a name!")).unwrap_err(),
        TlsError::Name("not a name!".into())
    );
}

#[test]
fn a_failed_reload_is_reported_once_it_fails_twice_and_then_not_again() {
    let (torn, broken) = ([1; 32], [2; 32]);
    let mut f = Failures::default();
    // Caught half-written once, whole at the next read: nothing reported.
    assert!(!f.report(torn));
    f.worked();
    assert!(!f.report(torn));
    // Broken for good: reported at its second read, then never again while it stays.
    assert!(!f.report(broken));
    assert!(f.report(broken));
    assert!(!f.report(broken));
    assert!(!f.report(broken));
    // Another broken pair is news; after a good one, the first is news again.
    assert!(!f.report(torn));
    assert!(f.report(torn));
    f.worked();
    assert!(!f.report(broken));
    assert!(f.report(broken));
}

#[test]
fn the_log_says_when_a_certificate_nears_its_end_then_once_a_day_and_again_for_a_new_one() {
    let ca = TestCa::new();
    let day = Duration::from_secs(86_400);
    let now = SystemTime::now();
    let (far_cert, far_key) = ca.leaf_until(&["husk-node"], Some(now + 90 * day));
    let tls = ServerTls::from_pem(far_cert.as_bytes(), far_key.as_bytes()).unwrap();
    assert_eq!(tls.expiry_notice(now), None, "90 days left");
    // Ten days left: told, then not again within the day, then again the next.
    let (cert, key) = ca.leaf_until(
        &["husk-node"],
        Some(now + 10 * day - Duration::from_secs(60)),
    );
    assert_eq!(tls.reload(cert.as_bytes(), key.as_bytes()), Ok(true));
    assert_eq!(
        tls.expiry_notice(now),
        Some(ExpiryNotice::Soon { days: 10 })
    );
    assert_eq!(tls.expiry_notice(now + Duration::from_secs(3600)), None);
    assert_eq!(
        tls.expiry_notice(now + day + Duration::from_secs(1)),
        Some(ExpiryNotice::Soon { days: 9 })
    );
    // Past its end: expired, said at once.
    assert_eq!(
        tls.expiry_notice(now + 11 * day),
        Some(ExpiryNotice::Expired)
    );
    // Renewed: nothing to say; an expired one put in its place is told at once.
    assert_eq!(
        tls.reload(far_cert.as_bytes(), far_key.as_bytes()),
        Ok(true)
    );
    assert_eq!(tls.expiry_notice(now + 11 * day), None);
    let (old_cert, old_key) = ca.leaf_until(&["husk-node"], Some(now - day));
    assert_eq!(
        tls.reload(old_cert.as_bytes(), old_key.as_bytes()),
        Ok(true)
    );
    assert_eq!(tls.expiry_notice(now), Some(ExpiryNotice::Expired));
}
