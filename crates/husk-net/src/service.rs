//! Sandbox networking as one service: the router ([`crate::router`]), husk's resolver and
//! domain proxy listening in the router's namespace, and the reader that turns the router's
//! logged rejections into each sandbox's denial log.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::dns::Resolver;
use crate::netns;
use crate::nflog::{protocol_name, NflogReader};
use crate::policy::NetPolicy;
use crate::proxy::DomainProxy;
use crate::router::{Attachment, Router, RouterConfig, RouterError, PROXY_PORT, RESOLVER_PORT};
use crate::sandboxes::{Denial, Sandboxes};

#[derive(Debug)]
pub struct NetService {
    router: Router,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
    log_thread: std::sync::Mutex<Option<JoinHandle<()>>>,
}

fn io_err(what: &str) -> impl FnOnce(std::io::Error) -> RouterError + '_ {
    move |source| RouterError::Io {
        what: what.to_owned(),
        source,
    }
}

impl NetService {
    /// Starts the router and its services. Call inside a tokio runtime (the services are
    /// tasks of it); blocks for the router's set-up.
    pub fn start(cfg: RouterConfig) -> Result<NetService, RouterError> {
        NetService::serve(Router::start(cfg)?)
    }

    /// Starts the services of a router already made (see [`NetService::start`]).
    pub fn serve(router: Router) -> Result<NetService, RouterError> {
        let upstreams = if router.config().dns.is_empty() {
            crate::dns::host_upstreams()
        } else {
            router.config().dns.clone()
        };
        let ns = router.namespace().clone();
        let any = |port: u16| std::net::SocketAddr::from(([0, 0, 0, 0], port));
        let udp =
            netns::udp_bind(Some(&ns), any(RESOLVER_PORT)).map_err(io_err("resolver socket"))?;
        let tcp = netns::tcp_listen(&ns, any(RESOLVER_PORT)).map_err(io_err("resolver socket"))?;
        let proxy_listener =
            netns::tcp_listen(&ns, any(PROXY_PORT)).map_err(io_err("proxy socket"))?;
        let resolver = Arc::new(Resolver::new(upstreams, router.egress().cloned()));
        let sandboxes = router.sandboxes();
        let proxy = Arc::new(DomainProxy::new(
            sandboxes.clone(),
            resolver.clone(),
            router.denied(),
            router.egress().cloned(),
        ));
        let tasks = vec![
            tokio::spawn(resolver.clone().serve_udp(udp, sandboxes.clone())),
            tokio::spawn(resolver.serve_tcp(tcp, sandboxes.clone())),
            tokio::spawn(proxy.serve(proxy_listener)),
        ];
        let stop = Arc::new(AtomicBool::new(false));
        let reader = NflogReader::open(&ns, crate::nft::LOG_GROUP).map_err(io_err("denial log"))?;
        let log_thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("husk-net-log".into())
                .spawn(move || log_loop(reader, sandboxes, stop))
                .map_err(io_err("denial log thread"))?
        };
        Ok(NetService {
            router,
            tasks: std::sync::Mutex::new(tasks),
            stop,
            log_thread: std::sync::Mutex::new(Some(log_thread)),
        })
    }

    /// A link out for a new sandbox (blocking; see [`Router::attach`]).
    pub fn attach(&self, policy: NetPolicy) -> Result<Attachment, RouterError> {
        self.router.attach(policy)
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Stops the services and removes what the router made on the host. Idempotent.
    pub fn shutdown(&self) {
        let tasks: Vec<_> = self
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for t in tasks {
            t.abort();
        }
        self.stop.store(true, Ordering::Relaxed);
        let thread = self
            .log_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(t) = thread {
            let _ = t.join();
        }
        self.router.shutdown();
    }
}

impl Drop for NetService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads the router's logged rejections into the sandboxes' denial logs until `stop`.
fn log_loop(mut reader: NflogReader, sandboxes: Arc<Sandboxes>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match reader.recv_timeout(Duration::from_millis(200)) {
            Ok(packets) => {
                for p in packets {
                    if let Some(sb) = sandboxes.by_address(p.src) {
                        sb.record(Denial::now(
                            protocol_name(p.protocol),
                            p.dst,
                            p.dst_port,
                            &p.prefix,
                        ));
                    }
                }
            }
            Err(e) => {
                tracing::warn!("denial log: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}
