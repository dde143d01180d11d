//! The HTTP side of header rules, in process on loopback: a sandbox-side client trusting the
//! sandbox's CA, the proxy's `serve`, and an upstream TLS server with a CA of its own.

use std::sync::Mutex as StdMutex;

use http_body_util::Empty;
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use super::*;
use crate::ca::SandboxCa;
use crate::rules::SecretValue;

const HOST: &str = "api.test";
const SECRET: &str = "Bearer sk-live-0123456789";

type Seen = Arc<StdMutex<Vec<(String, Option<String>, Option<String>)>>>;

/// An upstream server for `HOST` (TLS with its own CA): records each request's path, its
/// `Authorization` and `X-Other` headers, and answers `ok <path>`. Returns its address, its
/// CA's certificate, and what it saw.
async fn upstream() -> (std::net::SocketAddr, CertificateDer<'static>, Seen) {
    let ca = SandboxCa::new("upstream").unwrap();
    let cfg = ca.server_config(HOST).unwrap();
    let root = CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let seen: Seen = Arc::default();
    let seen2 = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (cfg, seen) = (cfg.clone(), seen2.clone());
            tokio::spawn(async move {
                let Ok(tls) = TlsAcceptor::from(cfg).accept(tcp).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        let h =
                            |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned());
                        let path = req.uri().path().to_owned();
                        seen.lock()
                            .unwrap()
                            .push((path.clone(), h("authorization"), h("x-other")));
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(format!(
                            "ok {path} {}",
                            body.len()
                        )))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    (at, root, seen)
}

/// The proxy for one connection: accepts it, terminates TLS with the sandbox CA's certificate
/// for `HOST`, and serves it with the rule's headers over a verified connection to `up`.
async fn proxy(
    ca: Arc<SandboxCa>,
    up: std::net::SocketAddr,
    roots: Vec<CertificateDer<'static>>,
) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let at = listener.local_addr().unwrap();
    let rule = HostRule {
        host: HOST.into(),
        headers: vec![
            (
                "authorization".into(),
                SecretValue::new(SECRET.as_bytes().to_vec()),
            ),
            ("x-other".into(), SecretValue::new(b"first".to_vec())),
            ("x-other".into(), SecretValue::new(b"second".to_vec())),
        ],
    };
    let t = Arc::new(Transform::new(HOST, &rule).unwrap());
    let client_cfg = client_config_with(roots).unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = TlsAcceptor::from(ca.server_config(HOST).unwrap())
            .accept(Rewind::new(Vec::new(), tcp))
            .await
            .unwrap();
        let upstream = async {
            let tcp = TcpStream::connect(up).await?;
            TlsConnector::from(client_cfg)
                .connect(ServerName::try_from(HOST).unwrap(), tcp)
                .await
        }
        .await;
        let _ = serve(tls, upstream, t).await;
    });
    at
}

/// A sandbox-side HTTP/1.1 client over TLS to `at`, trusting only `ca`.
async fn client(at: std::net::SocketAddr, ca: &SandboxCa) -> SendRequest<Empty<Bytes>> {
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
        .unwrap();
    let cfg = ClientConfig::builder_with_provider(crate::ca::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(at).await.unwrap();
    let tls = TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(HOST).unwrap(), tcp)
        .await
        .expect("the sandbox's client trusts the proxy's certificate");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn get(
    s: &mut SendRequest<Empty<Bytes>>,
    host: &str,
    path: &str,
    auth: Option<&str>,
) -> (StatusCode, String) {
    let mut req = Request::get(path).header("host", host);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    s.ready().await.unwrap();
    let resp = s
        .send_request(req.body(Empty::new()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn requests_get_the_rules_headers_and_only_for_their_host() {
    let (up, root, seen) = upstream().await;
    let ca = Arc::new(SandboxCa::new("test").unwrap());
    let at = proxy(ca.clone(), up, vec![root]).await;
    let mut c = client(at, &ca).await;
    // The sandbox's own Authorization is replaced; the later of two rules for a name wins.
    let (status, body) = get(&mut c, HOST, "/v1/one", Some("Bearer from-the-sandbox")).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "ok /v1/one 0"));
    let (status, _) = get(&mut c, "API.test.:443", "/v1/two", None).await;
    assert_eq!(status, StatusCode::OK);
    // Another host on the same connection is refused and never reaches the upstream.
    let (status, body) = get(&mut c, "other.test", "/v1/three", None).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST, "{body}");
    assert!(body.contains("this connection is for api.test"), "{body}");
    let seen = seen.lock().unwrap().clone();
    let want = |p: &str| {
        (
            p.to_owned(),
            Some(SECRET.to_owned()),
            Some("second".to_owned()),
        )
    };
    assert_eq!(seen, vec![want("/v1/one"), want("/v1/two")]);
}

#[tokio::test]
async fn an_upstream_that_fails_verification_is_answered_502_with_the_reason() {
    let (up, _root, seen) = upstream().await;
    let ca = Arc::new(SandboxCa::new("test").unwrap());
    // The proxy does not trust the upstream's CA.
    let at = proxy(ca.clone(), up, Vec::new()).await;
    let mut c = client(at, &ca).await;
    let (status, body) = get(&mut c, HOST, "/", None).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert!(body.contains("could not reach api.test"), "{body}");
    assert!(body.to_lowercase().contains("certificate"), "{body}");
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_request_host_is_read_from_the_header_and_an_absolute_target() {
    // Through a plain-HTTP proxy connection whose upstream is a raw listener that records the
    // bytes it gets.
    let raw = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let raw_at = raw.local_addr().unwrap();
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_at = front.local_addr().unwrap();
    let rule = HostRule {
        host: HOST.into(),
        headers: vec![("x-key".into(), SecretValue::new(b"k1".to_vec()))],
    };
    let t = Arc::new(Transform::new(HOST, &rule).unwrap());
    tokio::spawn(async move {
        let (tcp, _) = front.accept().await.unwrap();
        let up = TcpStream::connect(raw_at).await;
        let _ = serve(Rewind::new(b"GET http://api.test/abs".to_vec(), tcp), up, t).await;
    });
    let mut c = TcpStream::connect(front_at).await.unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    c.write_all(b"?q=1 HTTP/1.1\r\nHost: api.test\r\nX-Key: mine\r\n\r\n")
        .await
        .unwrap();
    let (mut up, _) = raw.accept().await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = up.read(&mut buf).await.unwrap();
        assert!(n > 0, "upstream got {:?}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_lowercase();
    assert!(head.starts_with("get /abs?q=1 http/1.1\r\n"), "{head}");
    assert!(head.contains("x-key: k1\r\n"), "{head}");
    assert!(!head.contains("mine"), "{head}");
}

#[test]
fn extra_roots_are_read_from_pem_files() {
    let ca = SandboxCa::new("file").unwrap();
    let path = std::env::temp_dir().join(format!("husk-roots-{}.pem", std::process::id()));
    std::fs::write(&path, ca.pem()).unwrap();
    let read = read_roots(&path);
    std::fs::write(&path, "not a certificate").unwrap();
    let empty = read_roots(&path);
    let _ = std::fs::remove_file(&path);
    assert_eq!(read.unwrap().len(), 1);
    assert!(empty.unwrap_err().contains("no PEM certificate"));
    assert!(read_roots(std::path::Path::new("/nonexistent/x.pem")).is_err());
}
