//! Sandbox networking as one service: the router ([`crate::router`]), husk's resolver and
//! domain proxy listening in the router's namespace, and the reader that turns the router's
//! logged rejections into each sandbox's denial log.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::dns::Resolver;
use crate::netns;
use crate::nflog::{protocol_name, NflogReader};
use crate::policy::NetPolicy;
use crate::proxy::DomainProxy;
use crate::router::{Attachment, Router, RouterConfig, RouterError, PROXY_PORT, RESOLVER_PORT};
use crate::rules::HeaderRules;
use crate::sandboxes::{Denial, Sandboxes};

#[derive(Debug)]
pub struct NetService {
    router: Router,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    log: Arc<LogControl>,
    log_thread: Mutex<Option<JoinHandle<()>>>,
}

/// How the denial log's thread is woken (to stop, or to file what is pending now).
#[derive(Debug)]
struct LogControl {
    stop: AtomicBool,
    wake: UnixStream,
    /// Rounds finished on request: (asked, done).
    rounds: Mutex<(u64, u64)>,
    done: Condvar,
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
        // A file the operator named must load; a host with no CA bundle only costs the
        // header rules (their connections are answered 502 with the reason).
        let extra = &router.config().upstream_ca;
        let upstream_tls = match crate::intercept::client_config(extra) {
            Err(e) if !extra.is_empty() => return Err(RouterError::Config(e)),
            r => r,
        };
        let proxy = Arc::new(
            DomainProxy::new(
                sandboxes.clone(),
                resolver.clone(),
                router.denied(),
                router.egress().cloned(),
            )
            .with_upstream_tls(upstream_tls),
        );
        let tasks = vec![
            tokio::spawn(resolver.clone().serve_udp(udp, sandboxes.clone())),
            tokio::spawn(resolver.serve_tcp(tcp, sandboxes.clone())),
            tokio::spawn(proxy.serve(proxy_listener)),
        ];
        let reader = NflogReader::open(&ns, crate::nft::LOG_GROUP).map_err(io_err("denial log"))?;
        let (wake, woken) = UnixStream::pair().map_err(io_err("denial log"))?;
        let log = Arc::new(LogControl {
            stop: AtomicBool::new(false),
            wake,
            rounds: Mutex::new((0, 0)),
            done: Condvar::new(),
        });
        let log_thread = {
            let log = log.clone();
            std::thread::Builder::new()
                .name("husk-net-log".into())
                .spawn(move || log_loop(reader, woken, sandboxes, log))
                .map_err(io_err("denial log thread"))?
        };
        Ok(NetService {
            router,
            tasks: Mutex::new(tasks),
            log,
            log_thread: Mutex::new(Some(log_thread)),
        })
    }

    /// A link out for a new sandbox (blocking; see [`Router::attach`]).
    pub fn attach(
        &self,
        policy: NetPolicy,
        rules: Option<HeaderRules>,
    ) -> Result<Attachment, RouterError> {
        self.router.attach(policy, rules)
    }

    pub fn router(&self) -> &Router {
        &self.router
    }

    /// Files every rejection the kernel has logged so far into the sandboxes' denial logs
    /// (waits at most `timeout`): what a caller about to read a log wants to be complete.
    pub fn sync_log(&self, timeout: Duration) {
        let target = {
            let mut r = self.log.rounds.lock().unwrap_or_else(|p| p.into_inner());
            r.0 += 1;
            r.0
        };
        let _ = (&self.log.wake).write_all(&[1]);
        let r = self.log.rounds.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .log
            .done
            .wait_timeout_while(r, timeout, |r| r.1 < target);
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
        self.log.stop.store(true, Ordering::Relaxed);
        let _ = (&self.log.wake).write_all(&[0]);
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

/// Reads the router's logged rejections into the sandboxes' denial logs until stopped. It
/// sleeps in poll(2) on the log socket and the wake-up socket: no periodic wake-ups.
fn log_loop(
    mut reader: NflogReader,
    mut woken: UnixStream,
    sandboxes: Arc<Sandboxes>,
    log: Arc<LogControl>,
) {
    let file = |packets: Vec<crate::nflog::LoggedPacket>| {
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
    };
    let _ = woken.set_nonblocking(true);
    loop {
        let mut fds = [
            libc::pollfd {
                fd: reader.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: woken.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if let Err(e) = husk_runtime::sys::poll(&mut fds, -1) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!("denial log: poll: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            continue;
        }
        // Everything pending, whatever woke us.
        loop {
            match reader.recv_timeout(Duration::ZERO) {
                Ok(p) if p.is_empty() => break,
                Ok(p) => file(p),
                Err(e) => {
                    tracing::warn!("denial log: {e}");
                    break;
                }
            }
        }
        if fds[1].revents != 0 {
            let mut buf = [0u8; 64];
            while matches!(woken.read(&mut buf), Ok(n) if n > 0) {}
            if log.stop.load(Ordering::Relaxed) {
                return;
            }
            let mut r = log.rounds.lock().unwrap_or_else(|p| p.into_inner());
            r.1 = r.0;
            log.done.notify_all();
        }
    }
}
