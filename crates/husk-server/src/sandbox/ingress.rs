//! Ingress: a request to any port of a sandbox but the daemon's goes to the server listening on
//! that port inside the sandbox.
//!
//! husk connects from inside the sandbox's network namespace to its loopback, so servers bound
//! to 127.0.0.1 are reached as well as those bound to 0.0.0.0, and the sandbox needs no route,
//! link or address of its own for it. The sandbox's server is spoken to in HTTP/1.1 whatever
//! the client spoke; bodies stream both ways (nothing is held whole), hop-by-hop headers stay
//! on their hop, `Host` is the client's. An `Upgrade` (WebSocket, or any other) is forwarded,
//! and after a `101` the two connections are joined byte for byte.
//!
//! A private sandbox (E2B `network.allowPublicTraffic: false`) admits only requests that carry
//! its traffic token (`E2B-Traffic-Access-Token`) or an API key of its own team; a public one
//! admits everyone, as on E2B. (Port 49999, the code interpreter, is not ingress: it always
//! wants a credential, see [`super::interpreter`].)

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{StatusCode, Uri, Version};
use axum::response::{IntoResponse, Response};
use husk_net::netns::NetNs;
use hyper_util::rt::TokioIo;
use serde_json::json;
use subtle::ConstantTimeEq;

use super::Sandbox;
use crate::app::AppState;

/// Longest wait for the sandbox's server to accept a connection (a full backlog drops SYNs
/// instead of refusing them).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The header that carries a private sandbox's traffic token.
pub const TRAFFIC_TOKEN_HEADER: &str = "e2b-traffic-access-token";

/// Headers that belong to one hop (RFC 9110 §7.6.1, and the older ones proxies still see);
/// the headers a `Connection` header names are dropped too.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authenticate",
    "proxy-authorization",
];

/// husk's own headers: routing and credentials, which the sandbox's code has no business
/// seeing (a husk API key there would be a key in untrusted hands).
const HUSK_HEADERS: &[&str] = &["e2b-sandbox-id", "e2b-sandbox-port", TRAFFIC_TOKEN_HEADER];

/// The answer the SDKs classify as "port is not open".
pub fn port_not_open(id: &str, port: u16) -> Response {
    (
        StatusCode::BAD_GATEWAY,
        axum::Json(json!({
            "sandboxId": id,
            "message": format!("The sandbox is running but port is not open: {port}"),
            "port": port,
            "code": 502,
        })),
    )
        .into_response()
}

fn answer(status: StatusCode, message: String) -> Response {
    (
        status,
        axum::Json(json!({"code": status.as_u16(), "message": message})),
    )
        .into_response()
}

/// Proxies `req` to `port` of the sandbox.
pub async fn handle(state: &AppState, sb: Sandbox, port: u16, mut req: Request<Body>) -> Response {
    if !admitted(state, &sb, req.headers()) {
        return answer(StatusCode::FORBIDDEN, private_message(sb.id()));
    }
    let stream = match tokio::time::timeout(
        CONNECT_TIMEOUT,
        connect(&state.manager, sb.netns(), port),
    )
    .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::debug!(sandbox = %sb.id(), port, error = %e, "ingress: no server");
            return port_not_open(sb.id(), port);
        }
        Err(_) => {
            return answer(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                "the server on port {port} of sandbox {} did not accept a connection within {}s",
                sb.id(),
                CONNECT_TIMEOUT.as_secs()
            ),
            )
        }
    };
    let upgrade = upgrade_of(req.headers());
    // Taken before the request moves on: it resolves once our 101 has gone to the client.
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let mut req = outbound(req);
    // The sandbox asked for its servers to see another `Host` (E2B `maskRequestHost`).
    if let Some(mask) = sb.mask_request_host() {
        if let Ok(host) = HeaderValue::from_str(&mask.for_port(port)) {
            req.headers_mut().insert(header::HOST, host);
        }
    }

    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(x) => x,
        Err(e) => return bad_gateway(sb.id(), port, e),
    };
    let id = sb.id().to_owned();
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(sandbox = %id, port, error = %e, "ingress connection ended");
        }
    });
    let resp = match sender.send_request(req).await {
        Ok(r) => r,
        Err(e) => return bad_gateway(sb.id(), port, e),
    };
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    if switching && client_upgrade.is_none() {
        // A 101 to a request that asked for no protocol switch is a broken server; relayed,
        // it would leave the client's connection in a protocol neither side agreed on.
        return answer(
            StatusCode::BAD_GATEWAY,
            format!(
                "the server on port {port} of sandbox {} switched protocols, but the request \
                 asked for no upgrade",
                sb.id()
            ),
        );
    }
    relay_response(
        resp,
        client_upgrade,
        format!("sandbox {} port {port}", sb.id()),
    )
}

/// An upstream answer as the client gets it: no hop-by-hop headers; on a protocol switch the
/// client asked for (`client_upgrade`), its `Upgrade` kept and the two upgraded connections
/// joined once the 101 has gone out (`what` names the upstream in the log). Shared by
/// ingress and a cluster's gateway.
pub(crate) fn relay_response(
    mut resp: Response<hyper::body::Incoming>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    what: String,
) -> axum::response::Response {
    let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    let kept = switching
        .then(|| resp.headers().get(header::UPGRADE).cloned())
        .flatten();
    strip_hop_by_hop(resp.headers_mut());
    if let (true, Some(client_upgrade)) = (switching, client_upgrade) {
        if let Some(proto) = kept {
            resp.headers_mut().insert(header::UPGRADE, proto);
        }
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((client, upstream)) => {
                    let (mut c, mut u) = (TokioIo::new(client), TokioIo::new(upstream));
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut u).await;
                }
                Err(e) => tracing::debug!(upstream = %what, error = %e, "upgrade failed"),
            }
        });
    }
    resp.map(Body::new)
}

fn bad_gateway(id: &str, port: u16, e: hyper::Error) -> Response {
    answer(
        StatusCode::BAD_GATEWAY,
        format!("the server on port {port} of sandbox {id} failed to answer: {e}"),
    )
}

/// The refusal of a request to a private sandbox's port.
fn private_message(id: &str) -> String {
    format!(
        "sandbox {id} is private: send its traffic access token in the \
         E2B-Traffic-Access-Token header, or an API key of its team"
    )
}

/// Whether the sandbox's own servers admit the request: it is public, or the request carries a
/// credential of its team ([`team_credential`]).
pub(super) fn admitted(state: &AppState, sb: &Sandbox, headers: &HeaderMap) -> bool {
    sb.public_traffic() || team_credential(state, sb, headers)
}

/// Whether the request carries the sandbox's traffic token or an API key of its team (never
/// another team's, whatever its rights elsewhere). Both are handed only to the team: the token
/// comes with create, connect and info.
pub(super) fn team_credential(state: &AppState, sb: &Sandbox, headers: &HeaderMap) -> bool {
    let token = sb.traffic_access_token().as_bytes();
    if headers
        .get_all(TRAFFIC_TOKEN_HEADER)
        .iter()
        .any(|v| bool::from(v.as_bytes().ct_eq(token)))
    {
        return true;
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .and_then(|k| state.manager.store().authenticate(k))
        .is_some_and(|who| who.team == sb.team())
}

/// A connection to `port` on the sandbox's loopback: 127.0.0.1, then `[::1]` if nothing listens
/// on the former (a server bound to `::1` or `[::]` only).
async fn connect(
    manager: &husk_core::manager::Manager,
    ns: &NetNs,
    port: u16,
) -> io::Result<tokio::net::TcpStream> {
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    match manager.connect_in(ns, v4).await {
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
            // The first error is the one worth telling (the namespace may have no IPv6).
            manager.connect_in(ns, v6).await.map_err(|_| e)
        }
        r => r,
    }
}

/// The protocol an `Upgrade` request asks for, when it is one (`Connection: upgrade` too).
pub(crate) fn upgrade_of(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// Removes the hop-by-hop headers and those the `Connection` header names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

/// The request as the sandbox's server gets it: HTTP/1.1 in origin form, the client's `Host`
/// (from an HTTP/2 client's authority when it sent none), no hop-by-hop or husk headers, and
/// `X-Forwarded-For`/`-Proto` saying whom it came from.
fn outbound(req: Request<Body>) -> Request<Body> {
    let (mut parts, body) = req.into_parts();
    let upgrade = upgrade_of(&parts.headers);
    strip_hop_by_hop(&mut parts.headers);
    for name in HUSK_HEADERS {
        parts.headers.remove(*name);
    }
    // A husk key is a credential of the team, not something the sandbox's code may keep;
    // any other X-API-Key is the application's own and passes.
    if parts
        .headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .is_some_and(husk_core::keys::looks_like_key)
    {
        parts.headers.remove("x-api-key");
    }
    if let Some(proto) = upgrade {
        parts.headers.insert(header::UPGRADE, proto);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if !parts.headers.contains_key(header::HOST) {
        if let Some(host) = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            parts.headers.insert(header::HOST, host);
        }
    }
    if let Some(ConnectInfo(peer)) = parts.extensions.get::<ConnectInfo<SocketAddr>>() {
        let ip = peer.ip().to_canonical().to_string();
        let xff = match parts.headers.get("x-forwarded-for").map(|v| v.to_str()) {
            Some(Ok(prev)) => format!("{prev}, {ip}"),
            _ => ip,
        };
        if let Ok(v) = HeaderValue::from_str(&xff) {
            parts.headers.insert("x-forwarded-for", v);
        }
    }
    // husk's listener is plain HTTP; a TLS terminator in front of it says so itself.
    if !parts.headers.contains_key("x-forwarded-proto") {
        parts
            .headers
            .insert("x-forwarded-proto", HeaderValue::from_static("http"));
    }
    parts.uri = parts
        .uri
        .path_and_query()
        .and_then(|pq| Uri::try_from(pq.as_str()).ok())
        .unwrap_or_else(|| Uri::from_static("/"));
    parts.version = Version::HTTP_11;
    Request::from_parts(parts, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request<Body> {
        let mut b = Request::builder().uri("http://8000-abc.example:3000/p?q=1");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn hop_by_hop_and_husk_headers_stay_behind() {
        let key = "e2b_0123456789abcdef0123456789abcdef01234567";
        let req = outbound(request(&[
            ("host", "8000-abc.example"),
            ("connection", "keep-alive, x-private"),
            ("x-private", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("e2b-sandbox-id", "abc"),
            ("e2b-sandbox-port", "8000"),
            ("e2b-traffic-access-token", "t"),
            ("x-api-key", key),
            ("x-kept", "yes"),
        ]));
        let h = req.headers();
        for gone in [
            "connection",
            "x-private",
            "keep-alive",
            "transfer-encoding",
            "te",
            "e2b-sandbox-id",
            "e2b-sandbox-port",
            "e2b-traffic-access-token",
            "x-api-key",
            "upgrade",
        ] {
            assert!(!h.contains_key(gone), "{gone} passed");
        }
        assert_eq!(h["x-kept"], "yes");
        assert_eq!(h["host"], "8000-abc.example");
        assert_eq!(h["x-forwarded-proto"], "http");
        assert_eq!(req.uri(), "/p?q=1");
        assert_eq!(req.version(), Version::HTTP_11);
    }

    #[test]
    fn an_applications_own_api_key_passes() {
        let req = outbound(request(&[("x-api-key", "app-secret")]));
        assert_eq!(req.headers()["x-api-key"], "app-secret");
    }

    #[test]
    fn an_upgrade_keeps_its_headers_and_host_comes_from_the_authority() {
        let req = outbound(request(&[
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-key", "k"),
        ]));
        let h = req.headers();
        assert_eq!(h["upgrade"], "websocket");
        assert_eq!(h["connection"], "upgrade");
        assert_eq!(h["sec-websocket-key"], "k");
        assert_eq!(h["host"], "8000-abc.example:3000");
        // Upgrade without `Connection: upgrade` is not one.
        let req = outbound(request(&[("upgrade", "websocket")]));
        assert!(!req.headers().contains_key("upgrade"));
    }

    #[test]
    fn forwarded_for_appends_the_peer() {
        let mut req = request(&[("x-forwarded-for", "203.0.113.7")]);
        let peer: SocketAddr = "[::ffff:127.0.0.1]:5000".parse().unwrap();
        req.extensions_mut().insert(ConnectInfo(peer));
        let req = outbound(req);
        assert_eq!(req.headers()["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
        let mut req = request(&[("x-forwarded-proto", "https")]);
        req.extensions_mut().insert(ConnectInfo(peer));
        let req = outbound(req);
        assert_eq!(req.headers()["x-forwarded-for"], "127.0.0.1");
        assert_eq!(req.headers()["x-forwarded-proto"], "https");
    }
}
