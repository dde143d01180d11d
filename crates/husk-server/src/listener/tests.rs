//! The accept loop over real loopback sockets, against a small service of its own. Clients
//! connect from several loopback addresses (127.0.0.1, .2, …) to stand for several peers.
//! Nothing here measures time: the short timeouts only keep the tests short, and every wait is
//! a poll with a generous deadline.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::{header, Response, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;

use super::{serve, ConnLimits};

/// Longer than anything here should take; a wait that reaches it is a failure.
const DEADLINE: Duration = Duration::from_secs(20);

/// Limits that keep connections open for the length of a test unless it shortens one.
fn patient() -> ConnLimits {
    ConnLimits {
        header_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        ..ConnLimits::default()
    }
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    /// Told when a request reaches `/gate`.
    entered: Arc<Notify>,
    /// Releases the request waiting at `/gate`.
    gate: Arc<Notify>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `/` answers the peer's address as the request saw it; `/gate` waits for [`Server::gate`];
/// `/echo` upgrades the connection and echoes what it reads.
async fn start(limits: ConnLimits) -> Server {
    start_with(limits, None).await
}

/// [`start`], serving TLS with `tls` when given.
async fn start_with(limits: ConnLimits, tls: Option<crate::tls::ServerTls>) -> Server {
    let (entered, gate) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (e, g) = (entered.clone(), gate.clone());
    let app = Router::new()
        .route(
            "/",
            get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
        )
        .route(
            "/gate",
            get(move || async move {
                e.notify_one();
                g.notified().await;
                "released"
            }),
        )
        .route("/echo", get(echo));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(listener, app, limits, tls.as_ref(), async move {
            let _ = stopped.await;
        })
        .await
    });
    Server {
        addr,
        stop: Some(stop),
        task,
        entered,
        gate,
    }
}

async fn echo(mut req: Request) -> Response<Body> {
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(up) = upgrade.await else { return };
        let mut io = TokioIo::new(up);
        let mut buf = [0u8; 1024];
        while let Ok(n @ 1..) = io.read(&mut buf).await {
            if io.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "upgrade")
        .header(header::UPGRADE, "echo")
        .body(Body::empty())
        .unwrap()
}

/// A connection to `server` from the loopback address 127.0.0.`from`.
async fn connect(server: &Server, from: u8) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(SocketAddr::from(([127, 0, 0, from], 0))).unwrap();
    s.connect(server.addr).await.unwrap()
}

/// Sends a GET that keeps the connection open and reads its whole answer: status and body.
async fn get_on(s: &mut TcpStream, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    tokio::time::timeout(DEADLINE, read_response(s))
        .await
        .expect("no answer")
}

async fn read_response(s: &mut TcpStream) -> (u16, String) {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed mid-answer: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let len = head
            .lines()
            .find_map(|l| {
                l.to_ascii_lowercase()
                    .strip_prefix("content-length:")
                    .map(|v| v.trim().parse::<usize>().unwrap())
            })
            .unwrap_or(0);
        if body.len() >= len {
            return (head[9..12].parse().unwrap(), body.to_owned());
        }
    }
}

/// Waits (bounded) until the server closes `s`, reading whatever it sends first.
async fn closed(s: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let read = tokio::time::timeout(DEADLINE, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the server kept the connection open");
    got
}

/// Asserts the server turned `s` away: a 503, or closed before any answer.
async fn refused(mut s: TcpStream) {
    // A request the server would answer if it had admitted the connection; it may be reset.
    let _ = s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").await;
    let got = closed(&mut s).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || text.starts_with("HTTP/1.1 503 "),
        "{text}"
    );
}

/// Polls until a new connection from 127.0.0.`from` is admitted and answered.
async fn admitted_again(server: &Server, from: u8) -> TcpStream {
    let poll = async {
        loop {
            let mut s = connect(server, from).await;
            if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                .await
                .is_ok()
            {
                let mut head = [0u8; 12];
                if s.read_exact(&mut head).await.is_ok() && &head == b"HTTP/1.1 200" {
                    return s;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(DEADLINE, poll)
        .await
        .expect("never admitted again")
}

#[tokio::test]
async fn a_request_is_answered_and_sees_its_peer() {
    let server = start(patient()).await;
    let mut s = connect(&server, 1).await;
    let me = s.local_addr().unwrap().to_string();
    assert_eq!(get_on(&mut s, "/").await, (200, me.clone()));
    // Keep-alive: a second request on the same connection.
    assert_eq!(get_on(&mut s, "/").await, (200, me));
}

#[tokio::test]
async fn half_a_head_is_closed_after_the_header_timeout() {
    let server = start(ConnLimits {
        header_timeout: Duration::from_millis(300),
        ..patient()
    })
    .await;
    let mut s = connect(&server, 1).await;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        .await
        .unwrap();
    assert!(closed(&mut s).await.is_empty());
}

#[tokio::test]
async fn silence_or_half_an_http2_preface_is_closed_after_the_header_timeout() {
    let server = start(ConnLimits {
        header_timeout: Duration::from_millis(300),
        ..patient()
    })
    .await;
    let mut silent = connect(&server, 1).await;
    let mut preface = connect(&server, 1).await;
    preface.write_all(b"PRI * HTTP/2.0\r\n").await.unwrap();
    assert!(closed(&mut silent).await.is_empty());
    assert!(closed(&mut preface).await.is_empty());
}

#[tokio::test]
async fn a_head_over_the_bound_is_answered_431() {
    let server = start(ConnLimits {
        max_head_bytes: 16 << 10,
        ..patient()
    })
    .await;
    let mut s = connect(&server, 1).await;
    let head = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 << 10)
    );
    // The server may close before it has read it all.
    let _ = s.write_all(head.as_bytes()).await;
    let got = closed(&mut s).await;
    let text = String::from_utf8_lossy(&got);
    assert!(
        got.is_empty() || text.starts_with("HTTP/1.1 431 "),
        "{text}"
    );
    // A head within the bound is fine.
    let mut s = connect(&server, 1).await;
    let head = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX-Big: {}\r\n\r\n",
        "a".repeat(8 << 10)
    );
    s.write_all(head.as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut s).await.0, 200);
}

#[tokio::test]
async fn an_idle_http1_connection_is_closed() {
    let server = start(ConnLimits {
        header_timeout: Duration::from_millis(300),
        ..patient()
    })
    .await;
    let mut s = connect(&server, 1).await;
    assert_eq!(get_on(&mut s, "/").await.0, 200);
    assert!(closed(&mut s).await.is_empty());
}

/// An HTTP/2 (prior knowledge) client on a connection from 127.0.0.`from`, and the task that
/// drives the connection: it ends when the server closes it.
async fn h2(
    server: &Server,
    from: u8,
) -> (
    hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>,
    JoinHandle<()>,
) {
    let io = TokioIo::new(connect(server, from).await);
    let (send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
        .await
        .unwrap();
    (
        send,
        tokio::spawn(async move {
            let _ = conn.await;
        }),
    )
}

async fn h2_get(send: &mut hyper::client::conn::http2::SendRequest<Empty<bytes::Bytes>>) -> String {
    let req = hyper::Request::get("http://t/").body(Empty::new()).unwrap();
    let resp = send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[tokio::test]
async fn http2_prior_knowledge_is_served() {
    let server = start(patient()).await;
    let (mut send, _conn) = h2(&server, 1).await;
    assert!(h2_get(&mut send).await.starts_with("127.0.0.1:"));
    assert!(h2_get(&mut send).await.starts_with("127.0.0.1:"));
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let server = start(ConnLimits {
        idle_timeout: Duration::from_millis(300),
        ..patient()
    })
    .await;
    let (mut send, conn) = h2(&server, 1).await;
    h2_get(&mut send).await;
    tokio::time::timeout(DEADLINE, conn)
        .await
        .expect("the server kept the idle connection")
        .unwrap();
}

#[tokio::test]
async fn the_per_peer_cap_refuses_the_next_connection_until_one_closes() {
    let server = start(ConnLimits {
        max_connections_per_ip: 2,
        ..patient()
    })
    .await;
    let mut a = connect(&server, 1).await;
    let mut b = connect(&server, 1).await;
    // Answered, so surely admitted.
    assert_eq!(get_on(&mut a, "/").await.0, 200);
    assert_eq!(get_on(&mut b, "/").await.0, 200);
    refused(connect(&server, 1).await).await;
    // Another peer is not bound by this one's cap.
    let mut other = connect(&server, 2).await;
    assert_eq!(get_on(&mut other, "/").await.0, 200);
    drop(a);
    admitted_again(&server, 1).await;
}

#[tokio::test]
async fn the_total_cap_refuses_every_peer_until_one_closes() {
    let server = start(ConnLimits {
        max_connections: 2,
        ..patient()
    })
    .await;
    let mut a = connect(&server, 1).await;
    let mut b = connect(&server, 2).await;
    assert_eq!(get_on(&mut a, "/").await.0, 200);
    assert_eq!(get_on(&mut b, "/").await.0, 200);
    refused(connect(&server, 3).await).await;
    refused(connect(&server, 1).await).await;
    drop(b);
    admitted_again(&server, 3).await;
}

#[tokio::test]
async fn an_upgrade_works_and_keeps_its_slot_until_it_ends() {
    let server = start(ConnLimits {
        max_connections_per_ip: 1,
        ..patient()
    })
    .await;
    let mut s = connect(&server, 1).await;
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = tokio::time::timeout(DEADLINE, read_response(&mut s))
        .await
        .unwrap();
    assert_eq!(status, 101);
    s.write_all(b"hello").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"hello");
    // hyper is done with it; the upgraded stream still holds the peer's one slot.
    refused(connect(&server, 1).await).await;
    drop(s);
    admitted_again(&server, 1).await;
}

#[tokio::test]
async fn a_stop_lets_the_request_in_flight_finish_and_accepts_no_more() {
    let mut server = start(patient()).await;
    let mut s = connect(&server, 1).await;
    s.write_all(b"GET /gate HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let mut idle = connect(&server, 1).await;
    assert_eq!(get_on(&mut idle, "/").await.0, 200);
    tokio::time::timeout(DEADLINE, server.entered.notified())
        .await
        .expect("the request never reached its handler");
    server.stop.take().unwrap().send(()).unwrap();
    // The idle connection is closed at once; the listener is gone.
    assert!(closed(&mut idle).await.is_empty());
    let poll = async {
        while TcpStream::connect(server.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(DEADLINE, poll)
        .await
        .expect("still accepting");
    server.gate.notify_one();
    assert_eq!(
        tokio::time::timeout(DEADLINE, read_response(&mut s))
            .await
            .unwrap(),
        (200, "released".to_owned())
    );
    tokio::time::timeout(DEADLINE, &mut server.task)
        .await
        .expect("serve did not return")
        .unwrap();
}

/// A listener serving TLS with a certificate for `husk-node`, and a client that trusts it.
async fn start_tls(limits: ConnLimits) -> (Server, tokio_rustls::TlsConnector) {
    let ca = crate::tls::tests::TestCa::new();
    let (cert, key) = ca.leaf(&["husk-node"]);
    let tls = crate::tls::ServerTls::from_pem(cert.as_bytes(), key.as_bytes()).unwrap();
    let client = crate::tls::ClientTls::for_nodes(
        Some((std::path::Path::new("ca.pem"), ca.pem.as_bytes())),
        Some("husk-node"),
    )
    .unwrap();
    let mut config = client.config();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let server = start_with(limits, Some(tls)).await;
    (server, tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn tls_connect(
    server: &Server,
    connector: &tokio_rustls::TlsConnector,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let name = rustls::pki_types::ServerName::try_from("husk-node").unwrap();
    connector
        .connect(name, connect(server, 1).await)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tls_listener_serves_http1_http2_and_upgrades_inside_tls() {
    let (server, connector) = start_tls(patient()).await;
    // HTTP/1.1, the peer's address seen as on a plain connection.
    let mut s = tls_connect(&server, &connector).await;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(DEADLINE, s.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert!(
        text.ends_with(&s.get_ref().0.local_addr().unwrap().to_string()),
        "{text}"
    );
    // HTTP/2, as ALPN offered it.
    let s = tls_connect(&server, &connector).await;
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    let _conn = tokio::spawn(conn);
    assert!(h2_get(&mut send).await.starts_with("127.0.0.1:"));
    // An upgrade: the echo runs inside the TLS session.
    let mut s = tls_connect(&server, &connector).await;
    s.write_all(b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: echo\r\n\r\n")
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        tokio::time::timeout(DEADLINE, s.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101 "));
    s.write_all(b"through tls").await.unwrap();
    let mut echoed = [0u8; 11];
    tokio::time::timeout(DEADLINE, s.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"through tls");
}

#[tokio::test]
async fn plain_http_to_a_tls_listener_is_closed_unanswered() {
    let (server, _) = start_tls(patient()).await;
    let mut s = connect(&server, 1).await;
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .unwrap();
    let got = closed(&mut s).await;
    // Nothing of the service's: at most a TLS alert record (content type 21).
    assert!(got.is_empty() || got[0] == 21, "{got:?}");
}

#[tokio::test]
async fn a_stalled_tls_handshake_is_closed_after_the_header_timeout_and_frees_its_slot() {
    let (server, connector) = start_tls(ConnLimits {
        header_timeout: Duration::from_millis(300),
        max_connections_per_ip: 1,
        ..patient()
    })
    .await;
    // Silence, then half a ClientHello: each holds the peer's one slot until the timeout.
    let mut silent = connect(&server, 1).await;
    assert!(closed(&mut silent).await.is_empty());
    let mut half = connect(&server, 1).await;
    half.write_all(&[22, 3, 1, 0, 200, 1, 0, 0, 196, 3, 3])
        .await
        .unwrap();
    assert!(closed(&mut half).await.is_empty());
    // The slot is free again: a whole handshake from the same peer is served.
    let poll = async {
        loop {
            let name = rustls::pki_types::ServerName::try_from("husk-node").unwrap();
            if let Ok(mut s) = connector.connect(name, connect(&server, 1).await).await {
                if s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                    .await
                    .is_ok()
                {
                    let mut head = [0u8; 12];
                    if s.read_exact(&mut head).await.is_ok() && &head == b"HTTP/1.1 200" {
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(DEADLINE, poll)
        .await
        .expect("the stalled handshakes kept the slot");
}
