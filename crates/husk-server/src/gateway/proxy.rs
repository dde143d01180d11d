//! Sending a request on to a node, and its answer back: streamed both ways (a command's
//! output, an upload), protocol upgrades bridged (a WebSocket to a sandbox's server), over
//! pooled HTTP/1.1 connections.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, uri::PathAndQuery, HeaderValue, Uri, Version};
use axum::response::Response;
use husk_core::store::Principal;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::cluster::{self, ClusterToken};
use crate::sandbox::ingress::{relay_response, strip_hop_by_hop, upgrade_of};
use crate::tls::ClientTls;

/// How long connecting to a node may take before it counts as not answering.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The gateway's connections to nodes (and a node's to its peers).
pub type Client = hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Body>;

/// A client keeping connections to nodes open between requests: plain to `http://` nodes,
/// TLS verified by `tls` to `https://` ones.
pub fn client(tls: &ClientTls) -> Client {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    // The connector below takes `https://`.
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls.config())
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// Why a request did not reach a node's answer.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// No connection could be made: nothing was sent, another node may be tried.
    #[error("cannot connect: {0}")]
    Connect(String),
    /// Sent (perhaps in part), then the node failed or went away.
    #[error("{0}")]
    Failed(String),
    #[error("bad node URL {0:?}")]
    Url(String),
}

impl ProxyError {
    fn of(e: hyper_util::client::legacy::Error) -> ProxyError {
        let text = husk_core::error_chain(&e);
        if e.is_connect() {
            ProxyError::Connect(text)
        } else {
            ProxyError::Failed(text)
        }
    }
}

/// Sends `req` to the node at `base` (`http://host:port`) with the cluster token and, for
/// the REST API, `who` in place of the caller's key; the node's answer, streaming.
pub async fn send(
    client: &Client,
    token: &ClusterToken,
    base: &str,
    mut req: Request<Body>,
    who: Option<&Principal>,
) -> Result<Response, ProxyError> {
    let path = req
        .uri()
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    let uri: Uri = format!("{base}{path}")
        .parse()
        .map_err(|_| ProxyError::Url(base.to_owned()))?;
    // An HTTP/2 client names the host in its authority: the node routes by `Host`.
    if !req.headers().contains_key(header::HOST) {
        if let Some(host) = req
            .uri()
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        {
            req.headers_mut().insert(header::HOST, host);
        }
    }
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let upgrade = upgrade_of(req.headers());
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let headers = req.headers_mut();
    strip_hop_by_hop(headers);
    cluster::strip(headers);
    if let Some(proto) = upgrade {
        headers.insert(header::UPGRADE, proto);
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    }
    if let Some(who) = who {
        // The node trusts the gateway's word; the key itself stays here.
        headers.remove("x-api-key");
        cluster::put_principal(headers, who);
    }
    headers.insert(cluster::TOKEN, token.header_value());

    let resp = client.request(req).await.map_err(ProxyError::of)?;
    Ok(relay_response(resp, client_upgrade, format!("node {base}")))
}
