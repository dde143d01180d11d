//! `husk node` and `husk gateway`: husk on several machines behind one E2B endpoint.
//!
//! A node is `husk serve` with its state in PostgreSQL, registered among the cluster's nodes
//! (a code that begins its sandboxes' ids, the URL gateways reach it at, its capacity), a
//! heartbeat every second, and a listener that serves holders of the cluster token only. A
//! gateway holds nothing but a pool of database connections and its picture of the nodes
//! (`husk_server::gateway`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use husk_core::store::cluster::{NodeLoad, NodeState};
use husk_core::store::Store;
use husk_server::cluster::ClusterToken;
use husk_server::tls::ClientTls;

/// How often a node tells the database it is alive, and how loaded.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// What makes `husk serve` a cluster's node.
#[derive(clap::Args, Debug)]
pub struct NodeArgs {
    #[command(flatten)]
    pub serve: crate::serve::ServeArgs,
    /// A file holding the cluster token (32+ printable characters), the only credential the
    /// node accepts on its listener; gateways send it (a mounted Secret; never a flag value).
    /// One token per line while rotating: the first is sent, all are accepted; the file is
    /// read again every 2 s.
    #[arg(long, value_name = "FILE", env = "HUSK_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: PathBuf,
    /// The URL gateways reach this node's listener at, e.g. http://10.0.0.5:3000; without a
    /// port, the port it listens on (--listen 127.0.0.1:0 picks a free one).
    #[arg(long, value_name = "URL", env = "HUSK_ADVERTISE_URL")]
    pub advertise_url: String,
    /// Most sandboxes this node takes (alive at once, all teams); gateways place no more.
    #[arg(long, value_name = "N", env = "HUSK_CAPACITY", default_value_t = 1000)]
    pub capacity: u32,
    /// STATE_DIR/workspaces is storage every node mounts (one ReadWriteMany volume): serve
    /// workspaces and volumes, without husk's per-team quota (the volume's own applies).
    /// Without it a node refuses them, saying why.
    #[arg(
        long,
        env = "HUSK_SHARED_WORKSPACES",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub shared_workspaces: bool,
    #[command(flatten)]
    pub cluster_tls: ClusterTlsArgs,
}

/// How a cluster's processes verify the nodes they reach at `https://` URLs.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterTlsArgs {
    /// PEM CA certificate(s) that sign the nodes' certificates (nodes started with
    /// --tls-cert and an https:// --advertise-url). Without it, the host's CA certificates.
    /// Read at start.
    #[arg(long, value_name = "FILE", env = "HUSK_CLUSTER_CA")]
    pub cluster_ca: Option<PathBuf>,
    /// The name every node's certificate carries (one certificate for all nodes, e.g.
    /// husk-node), checked whatever address a node is reached at. Without it, each node's
    /// certificate must name the host of its --advertise-url.
    #[arg(long, value_name = "NAME", env = "HUSK_CLUSTER_TLS_NAME")]
    pub cluster_tls_name: Option<String>,
}

impl ClusterTlsArgs {
    /// Read now, as root (a node's server cannot read the file later).
    pub fn load(&self) -> Result<ClientTls, husk_server::tls::TlsError> {
        let ca = match &self.cluster_ca {
            Some(path) => Some((
                path.as_path(),
                husk_server::tls::read_bounded(
                    "--cluster-ca",
                    path,
                    husk_server::tls::MAX_CERT_FILE,
                )?,
            )),
            None => None,
        };
        ClientTls::for_nodes(
            ca.as_ref().map(|(p, pem)| (*p, pem.as_slice())),
            self.cluster_tls_name.as_deref(),
        )
    }
}

/// What a node is told, once checked.
pub struct NodeSettings {
    pub token: ClusterToken,
    /// Where the token was read (read again, by the state helper, for rotations).
    pub token_file: PathBuf,
    pub url: String,
    pub capacity: u32,
    pub shared_workspaces: bool,
    /// How its peers are verified (a node fetches templates from them).
    pub peers_tls: ClientTls,
}

/// `husk node`.
pub fn node_main(args: NodeArgs) -> i32 {
    if args.serve.database.postgres.database_url.is_none() {
        crate::report::say(
            "husk node keeps the cluster's state in PostgreSQL: give --database-url (or \
             HUSK_DATABASE_URL)",
        );
        return 2;
    }
    // Read now, as root, before the server gives up its privileges.
    let token = match ClusterToken::load(&args.cluster_token_file) {
        Ok(t) => t,
        Err(e) => {
            crate::report::say(&crate::report::chain(&e));
            return 2;
        }
    };
    let url = args.advertise_url.trim_end_matches('/').to_owned();
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or("");
    if host.is_empty()
        || url
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        crate::report::say(&format!(
            "--advertise-url {url:?}: give the URL gateways reach this node at, e.g. \
             http://10.0.0.5:3000"
        ));
        return 2;
    }
    // The URL says how gateways connect: it must be what the listener speaks.
    match (
        url.starts_with("https://"),
        args.serve.tls.tls_cert.is_some(),
    ) {
        (true, false) => {
            crate::report::say(&format!(
                "--advertise-url {url}: an https:// URL needs --tls-cert and --tls-key (the \
                 certificate gateways verify with --cluster-ca)"
            ));
            return 2;
        }
        (false, true) => {
            crate::report::say(&format!(
                "--advertise-url {url}: the listener serves HTTPS (--tls-cert): advertise an \
                 https:// URL"
            ));
            return 2;
        }
        _ => {}
    }
    let peers_tls = match args.cluster_tls.load() {
        Ok(t) => t,
        Err(e) => {
            crate::report::say(&crate::report::chain(&e));
            return 2;
        }
    };
    crate::serve::main_with(
        args.serve,
        Some(NodeSettings {
            token,
            token_file: args.cluster_token_file.clone(),
            url,
            capacity: args.capacity,
            shared_workspaces: args.shared_workspaces,
            peers_tls,
        }),
    )
}

impl NodeSettings {
    /// The advertised URL, with `port` (the one listened on) if it names none.
    pub fn with_port(mut self, port: u16) -> NodeSettings {
        let rest = self.url.split_once("://").map_or("", |(_, r)| r);
        let authority = rest.split('/').next().unwrap_or("");
        let has_port = authority.rsplit_once(':').is_some_and(|(host, p)| {
            !host.is_empty()
                && !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && !p.contains(']')
        });
        if !has_port {
            let (head, path) = match rest.find('/') {
                Some(i) => (&self.url[..self.url.len() - rest.len() + i], &rest[i..]),
                None => (self.url.as_str(), ""),
            };
            self.url = format!("{head}:{port}{path}");
        }
        self
    }
}

/// Registers the node; its code (the start of its sandboxes' ids).
pub fn register(store: &Store, node: &NodeSettings) -> Result<String, String> {
    store
        .register_node(&node.url, node.capacity)
        .map_err(|e| format!("registering the node: {}", crate::report::chain(&e)))
}

/// The node's heartbeat, for as long as the runtime runs: its load every [`HEARTBEAT`];
/// ends what it still runs of what the cluster declared lost, and registers again if an
/// operator removed it.
pub fn spawn_heartbeat(
    store: Arc<Store>,
    manager: Arc<husk_core::manager::Manager>,
    node: Arc<NodeSettings>,
    images: Option<Arc<husk_server::node_images::NodeImages>>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(HEARTBEAT);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let live = u32::try_from(manager.count()).unwrap_or(u32::MAX);
            let (s, n, images) = (store.clone(), node.clone(), images.clone());
            let beat = tokio::task::spawn_blocking(move || {
                // The images held, so that placement prefers this node for their templates
                // and peers fetch them from here.
                let templates = match &images {
                    Some(i) => i.held()?,
                    None => Vec::new(),
                };
                match s.node_heartbeat(&NodeLoad { live, templates }) {
                    Ok(None) => register(&s, &n).map(|_| None),
                    other => other.map_err(|e| crate::report::chain(&e)),
                }
            })
            .await;
            match beat {
                Ok(Ok(Some(hb))) if hb.was_lost => {
                    let ended = manager.end_declared_lost().await;
                    tracing::warn!(
                        ended,
                        "this node was declared lost while cut off from the database; ended \
                         the sandboxes the cluster had reported lost"
                    );
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat failed"),
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
    });
}

/// Takes the node out of placement (it is stopping): gateways send no more creates.
pub fn drain(store: &Store) {
    match store.set_node_state(NodeState::Draining) {
        Ok(_) => eprintln!("husk: node draining: gateways place no more sandboxes here"),
        Err(e) => eprintln!(
            "husk: cannot mark the node draining: {}",
            crate::report::chain(&e)
        ),
    }
}

/// `husk gateway`'s flags.
#[derive(clap::Args, Debug)]
pub struct GatewayArgs {
    /// Address and port to listen on: the E2B endpoint (E2B_API_URL and E2B_SANDBOX_URL).
    #[arg(long, default_value = "127.0.0.1:3000", value_name = "ADDR:PORT")]
    pub listen: std::net::SocketAddr,
    #[command(flatten)]
    pub database: crate::database::PostgresArgs,
    /// A file holding the cluster token the nodes accept (one per line while rotating: the
    /// first is sent; read again every 2 s).
    #[arg(long, value_name = "FILE", env = "HUSK_CLUSTER_TOKEN_FILE")]
    pub cluster_token_file: PathBuf,
    /// Sandboxes a team may run at once across the cluster, unless `husk key quota` gave it
    /// its own.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub max_sandboxes: u32,
    #[command(flatten)]
    pub conn: crate::serve::ConnArgs,
    #[command(flatten)]
    pub tls: crate::serve::TlsArgs,
    #[command(flatten)]
    pub cluster_tls: ClusterTlsArgs,
}

/// `husk gateway`.
pub fn gateway_main(args: GatewayArgs) -> i32 {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HUSK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let token = match ClusterToken::load(&args.cluster_token_file) {
        Ok(t) => t,
        Err(e) => {
            crate::report::say(&crate::report::chain(&e));
            return 2;
        }
    };
    let (tls, node_tls) = match (args.tls.load(), args.cluster_tls.load()) {
        (Ok(tls), Ok(node_tls)) => (tls, node_tls),
        (Err(e), _) | (_, Err(e)) => {
            crate::report::say(&crate::report::chain(&e));
            return 2;
        }
    };
    let store = match args.database.open("husk gateway", "gateway") {
        Ok(s) => Arc::new(s),
        Err(e) => {
            crate::report::say(&e);
            return if args.database.database_url.is_none() {
                2
            } else {
                1
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            crate::report::say(&format!("async runtime: {e}"));
            return 1;
        }
    };
    let code = runtime.block_on(async move {
        let signals = crate::serve::stop_signals();
        let listener = match tokio::net::TcpListener::bind(args.listen).await {
            Ok(l) => l,
            Err(e) => {
                crate::report::say(&format!("listen on {}: {e}", args.listen));
                return 1;
            }
        };
        let gateway = match husk_server::gateway::Gateway::new(
            store,
            husk_server::gateway::GatewayConfig {
                token: token.clone(),
                default_quota: args.max_sandboxes,
                body_policy: husk_server::body::BodyPolicy::default(),
                team_body_bytes: husk_server::app::TEAM_BODY_BYTES,
                node_tls,
            },
        ) {
            Ok(g) => g,
            Err(e) => {
                crate::report::say(&format!("starting the gateway: {e}"));
                return 1;
            }
        };
        match gateway.refresh().await {
            Ok(n) => eprintln!("husk: gateway: {n} node(s) registered"),
            Err(e) => eprintln!(
                "husk: gateway: cannot read the nodes yet: {}",
                crate::report::chain(&e)
            ),
        }
        gateway.spawn_background();
        let path = args.cluster_token_file.clone();
        token.spawn_reload(move || {
            husk_server::cluster::read_file(&path).map_err(|e| crate::report::chain(&e))
        });
        let addr = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        if let (Some(tls), Some((cert, key))) = (&tls, args.tls.files()) {
            tls.spawn_reload(move || {
                husk_server::tls::CertFiles::read(&cert, &key).map_err(|e| crate::report::chain(&e))
            });
        }
        eprintln!(
            "husk: gateway listening on {}://{addr}",
            crate::serve::scheme(tls.as_ref())
        );
        husk_server::gateway::serve(
            listener,
            gateway,
            args.conn.limits(),
            tls.as_ref(),
            crate::serve::wait_for_stop(signals),
        )
        .await;
        eprintln!("husk: gateway stopped");
        0
    });
    // The database's connections close off the runtime's threads.
    drop(runtime);
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: &str) -> NodeSettings {
        NodeSettings {
            token: ClusterToken::new(&[b'a'; 32]).unwrap(),
            token_file: PathBuf::from("/nonexistent"),
            url: url.into(),
            capacity: 1,
            shared_workspaces: false,
            peers_tls: ClientTls::for_nodes(None, None).unwrap(),
        }
    }

    #[test]
    fn an_advertised_url_without_a_port_gets_the_listeners() {
        let url = |u: &str| settings(u).with_port(4567).url;
        assert_eq!(url("http://10.0.0.5"), "http://10.0.0.5:4567");
        assert_eq!(url("http://node-1.husk/api"), "http://node-1.husk:4567/api");
        assert_eq!(url("http://[::1]"), "http://[::1]:4567");
        assert_eq!(url("http://10.0.0.5:3000"), "http://10.0.0.5:3000");
        assert_eq!(url("http://[::1]:3000"), "http://[::1]:3000");
    }
}
