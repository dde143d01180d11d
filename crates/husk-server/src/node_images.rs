//! Template images between a cluster's nodes: a template is built on one node, and every
//! other node fetches its image by digest from a node that holds it (each reports what it
//! holds in its heartbeat) the first time a sandbox needs it, then keeps it. The image is
//! checked against its digest before it takes its name, so a peer cannot hand over anything
//! else; the files are the build helper's, this process only carries the bytes.
//!
//! Served on the node API only (`GET /husk/v1/cluster/images/{digest}`, cluster token):
//! a server of its own never hands out its images.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::TryStreamExt;
use husk_build::helper::BuildHelper;
use husk_core::store::cluster::NodeState;
use husk_core::store::Store;

use crate::app::AppState;
use crate::cluster::ClusterToken;
use crate::error::ApiError;
use crate::gateway::proxy;

/// Where a node serves its images to its peers.
pub const IMAGES_PATH: &str = "/husk/v1/cluster/images";

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/husk/v1/cluster/images/{digest}", get(serve_image))
        .with_state(state)
}

/// One image, streamed (the node API only: every request there carries the token).
async fn serve_image(State(state): State<AppState>, Path(digest): Path<String>) -> Response {
    let (Some(_), Some(templates)) = (&state.cluster, &state.templates) else {
        return ApiError::new(StatusCode::NOT_FOUND, "no such route").into_response();
    };
    let helper = templates.helper().clone();
    let asked = digest.clone();
    let opened = tokio::task::spawn_blocking(move || helper.open_image(&asked)).await;
    let file = match opened {
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => {
            return ApiError::new(StatusCode::NOT_FOUND, format!("no image {digest} here"))
                .into_response()
        }
        Ok(Err(e)) => return ApiError::new(StatusCode::BAD_REQUEST, e.to_string()).into_response(),
        Err(e) => {
            return ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
        }
    };
    let len = file.metadata().map(|m| m.len()).ok();
    let stream =
        tokio_util::io::ReaderStream::with_capacity(tokio::fs::File::from_std(file), 1 << 20);
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Some(len) = len {
        resp.headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    }
    resp
}

/// The node's [`husk_core::template::ImageSource`]: its peers.
pub struct NodeImages {
    builds: Arc<BuildHelper>,
    store: Arc<Store>,
    token: ClusterToken,
    /// This node's code (it is not its own peer).
    code: String,
    client: proxy::Client,
    /// Digests known to be here (refreshed by [`NodeImages::held`]).
    present: Mutex<HashSet<String>>,
    /// One fetch per digest at a time: the creates that need it wait for it.
    fetching: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl NodeImages {
    pub fn new(
        builds: Arc<BuildHelper>,
        store: Arc<Store>,
        token: ClusterToken,
        code: String,
        peers_tls: &crate::tls::ClientTls,
    ) -> NodeImages {
        NodeImages {
            builds,
            store,
            token,
            code,
            client: proxy::client(peers_tls),
            present: Mutex::default(),
            fetching: Mutex::default(),
        }
    }

    /// The images this machine holds (the heartbeat reports them). Blocking.
    pub fn held(&self) -> Result<Vec<String>, String> {
        let held = self.builds.list_images().map_err(|e| e.to_string())?;
        *self.present.lock().unwrap_or_else(|p| p.into_inner()) = held.iter().cloned().collect();
        Ok(held)
    }

    fn is_present(&self, digest: &str) -> bool {
        self.present
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(digest)
    }

    async fn fetch(&self, digest: &str, size: u64) -> Result<(), String> {
        let gate = self
            .fetching
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(digest.to_owned())
            .or_default()
            .clone();
        let _one = gate.lock().await;
        if self.is_present(digest) {
            return Ok(());
        }
        // Here already (built here, fetched before a restart)?
        let me = self.builds.clone();
        let held = tokio::task::spawn_blocking(move || me.list_images())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if held.iter().any(|d| d == digest) {
            self.present
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(digest.to_owned());
            return Ok(());
        }
        let store = self.store.clone();
        let nodes = tokio::task::spawn_blocking(move || store.nodes())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| husk_core::error_chain(&e))?;
        let peers: Vec<_> = nodes
            .into_iter()
            .filter(|n| {
                n.code != self.code
                    && n.state != NodeState::Lost
                    && n.load.templates.iter().any(|d| d == digest)
            })
            .collect();
        if peers.is_empty() {
            return Err(format!("no node of the cluster holds {digest}"));
        }
        let mut failures = Vec::new();
        for peer in &peers {
            match self.fetch_from(&peer.url, digest, size).await {
                Ok(()) => {
                    tracing::info!(digest, from = %peer.name, "fetched a template image");
                    self.present
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(digest.to_owned());
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!(digest, from = %peer.name, error = %e, "fetching a template image failed");
                    failures.push(format!("{}: {e}", peer.name));
                }
            }
        }
        Err(failures.join("; "))
    }

    async fn fetch_from(&self, base: &str, digest: &str, size: u64) -> Result<(), String> {
        let req = Request::get(format!("{IMAGES_PATH}/{digest}"))
            .body(Body::empty())
            .map_err(|e| e.to_string())?;
        let resp = proxy::send(&self.client, &self.token, base, req, None)
            .await
            .map_err(|e| e.to_string())?;
        if resp.status() != StatusCode::OK {
            return Err(format!("the peer answered {}", resp.status()));
        }
        let stream =
            http_body_util::BodyDataStream::new(resp.into_body()).map_err(std::io::Error::other);
        let reader = tokio_util::io::SyncIoBridge::new(tokio_util::io::StreamReader::new(stream));
        let builds = self.builds.clone();
        let digest = digest.to_owned();
        tokio::task::spawn_blocking(move || builds.put_image(&digest, size, reader))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

impl husk_core::template::ImageSource for NodeImages {
    fn ensure<'a>(
        &'a self,
        digest: &'a str,
        size: u64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            if self.is_present(digest) {
                return Ok(());
            }
            self.fetch(digest, size).await
        })
    }
}
