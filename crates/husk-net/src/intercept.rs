//! The domain proxy's HTTP side, for connections to a host the sandbox's header rules name
//! ([`crate::rules`]): the proxy is the server the sandbox talks to (over TLS with a
//! certificate from the sandbox's CA, or plain HTTP), and for each request it sets the rule's
//! headers and sends it on, over a connection of its own (TLS verified against the host's
//! roots), to the real server. HTTP/1.1 on both sides.
//!
//! Every request on such a connection must be for the host the connection was opened for (the
//! TLS name, or the first request's `Host`): one for another host is answered 421, so that a
//! connection opened for an allowed name cannot carry the rule's headers to a different
//! virtual host. Heads are bounded ([`MAX_HEAD`], [`HEAD_TIMEOUT`]); bodies stream through.

use std::convert::Infallible;
use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::header::{HeaderName, HeaderValue, HOST};
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Mutex;

use crate::rules::HostRule;

/// Most bytes of a request's head (hyper's read buffer).
pub const MAX_HEAD: usize = 64 << 10;
/// How long the sandbox has to send a request's head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the upstream connection may stay to finish once the sandbox's side is done.
const DRAIN: Duration = Duration::from_secs(1);

type Body = BoxBody<Bytes, hyper::Error>;

/// A stream that yields `prefix` (the bytes the proxy read to learn the host) before the rest
/// of `inner`.
pub struct Rewind<S> {
    prefix: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Rewind<S> {
    pub fn new(prefix: Vec<u8>, inner: S) -> Rewind<S> {
        Rewind {
            prefix,
            pos: 0,
            inner,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Rewind<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            if self.pos == self.prefix.len() {
                self.prefix = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Rewind<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// What the proxy does to the requests of one connection.
#[derive(Debug)]
pub struct Transform {
    /// The host the connection was opened for (lowercase).
    host: String,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl Transform {
    /// The rule's headers for requests to `host`. The values were checked when the rules were
    /// ([`crate::rules::HeaderRules::validate`]); one hyper refuses is reported.
    pub fn new(host: &str, rule: &HostRule) -> io::Result<Transform> {
        let mut headers = Vec::with_capacity(rule.headers.len());
        for (name, value) in &rule.headers {
            let n = HeaderName::from_bytes(name.as_bytes()).map_err(io::Error::other)?;
            let mut v = HeaderValue::from_bytes(value.bytes()).map_err(io::Error::other)?;
            v.set_sensitive(true);
            headers.push((n, v));
        }
        Ok(Transform {
            host: host.to_owned(),
            headers,
        })
    }
}

/// The roots upstream servers are verified against: the host's (its CA bundle, as
/// `rustls-native-certs` finds it) and the operator's `extra` PEM files (a corporate CA, or a
/// test's). Fails when a file cannot be read or no root at all is found.
pub fn client_config(extra: &[PathBuf]) -> Result<Arc<ClientConfig>, String> {
    let mut certs = Vec::new();
    for path in extra {
        certs.extend(read_roots(path)?);
    }
    client_config_with(certs)
}

/// The certificates of a PEM file (at least one).
pub fn read_roots(path: &std::path::Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect())
        .map_err(|e| format!("reading the CA certificates in {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// As [`client_config`], with the extra roots given.
pub fn client_config_with(
    extra: Vec<CertificateDer<'static>>,
) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    roots.add_parsable_certificates(native.certs);
    for c in extra {
        roots
            .add(c)
            .map_err(|e| format!("an extra CA certificate: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "no CA certificates for upstream servers: none found on this host ({}) and none given",
            native
                .errors
                .first()
                .map_or_else(|| "no error".to_owned(), ToString::to_string)
        ));
    }
    let mut cfg = ClientConfig::builder_with_provider(crate::ca::provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

fn answer(status: StatusCode, text: String) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(text)).map_err(|n| match n {}).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// The host a request is for: its `Host` header, or the authority of an absolute URI (both,
/// and they must agree), port removed, lowercase, trailing dot removed.
fn request_host(req: &Request<Incoming>) -> Option<String> {
    let from_header = match req.headers().get_all(HOST).iter().collect::<Vec<_>>()[..] {
        [] => None,
        [one] => Some(one.to_str().ok()?.parse::<Uri>().ok()?.host()?.to_owned()),
        _ => return None,
    };
    let from_uri = req.uri().host().map(str::to_owned);
    let host = match (from_header, from_uri) {
        (Some(h), Some(u)) if !h.eq_ignore_ascii_case(&u) => return None,
        (Some(h), _) | (None, Some(h)) => h,
        (None, None) => return None,
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

async fn forward(
    mut req: Request<Incoming>,
    t: &Transform,
    upstream: &Mutex<SendRequest<Incoming>>,
) -> Response<Body> {
    if request_host(&req).as_deref() != Some(t.host.as_str()) {
        return answer(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "husk: this connection is for {}; a request for another host needs a connection of its own\n",
                t.host
            ),
        );
    }
    // Origin form upstream, whatever form the client used.
    if req.uri().authority().is_some() {
        let pq = req
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        match pq.parse::<Uri>() {
            Ok(u) => *req.uri_mut() = u,
            Err(_) => return answer(StatusCode::BAD_REQUEST, "husk: bad request target\n".into()),
        }
    }
    for (name, value) in &t.headers {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    let mut sender = upstream.lock().await;
    if let Err(e) = sender.ready().await {
        return answer(
            StatusCode::BAD_GATEWAY,
            format!("husk: the connection to {} closed: {e}\n", t.host),
        );
    }
    match sender.send_request(req).await {
        Ok(resp) => resp.map(BodyExt::boxed),
        Err(e) => answer(
            StatusCode::BAD_GATEWAY,
            format!("husk: {} did not answer: {e}\n", t.host),
        ),
    }
}

fn server() -> hyper::server::conn::http1::Builder {
    let mut b = hyper::server::conn::http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_buf_size(MAX_HEAD);
    b
}

/// Serves the sandbox's side (`client`) until it closes, sending each request, transformed,
/// over `upstream`; when the upstream could not be reached (`Err`), each request is answered
/// 502 with the reason instead.
pub async fn serve<C, U>(client: C, upstream: io::Result<U>, t: Arc<Transform>) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let client = TokioIo::new(client);
    let upstream = match upstream {
        Ok(u) => u,
        Err(e) => {
            let why = format!("husk: could not reach {}: {e}\n", t.host);
            let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
                let why = why.clone();
                async move { Ok::<_, Infallible>(answer(StatusCode::BAD_GATEWAY, why)) }
            });
            return server()
                .keep_alive(false)
                .serve_connection(client, svc)
                .await
                .map_err(io::Error::other);
        }
    };
    let (sender, conn) =
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream))
            .await
            .map_err(io::Error::other)?;
    let sender = Arc::new(Mutex::new(sender));
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (t, sender) = (t.clone(), sender.clone());
        async move { Ok::<_, Infallible>(forward(req, &t, &sender).await) }
    });
    let served = server().serve_connection(client, svc);
    tokio::pin!(served, conn);
    tokio::select! {
        r = &mut served => {
            // The service (and with it the sender) is gone: the upstream connection ends
            // once idle.
            let _ = tokio::time::timeout(DRAIN, conn).await;
            r.map_err(io::Error::other)
        }
        // The upstream closed first: the sandbox's side is still served (a response being
        // written finishes; a later request is answered 502) until it closes.
        _ = &mut conn => served.await.map_err(io::Error::other),
    }
}

#[cfg(test)]
mod tests;
