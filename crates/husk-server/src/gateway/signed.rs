//! Signed file URLs that name no sandbox (`download_url()` / `upload_url()` opened by a
//! browser or curl with `E2B_SANDBOX_URL` pointing at the gateway): the gateway holds no
//! sandbox's token, so it asks every node which of its sandboxes signed the URL (the node
//! API's `sandbox::signed::LOOKUP_PATH`, answered by the same search a server of its own
//! makes), remembers the answer, and sends the request on to that sandbox by id. The node
//! checks the signature again, as it checks every signed request.
//!
//! Each search costs a question to every node, and comes unauthenticated: searches are
//! rationed per gateway as they are per node, and a URL found once is not searched again.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{FuturesUnordered, StreamExt};

use super::Gateway;
use crate::error::ApiError;
use crate::ration::Ration;
use crate::sandbox::signed::{
    signature_of, too_many, Remembered, LOOKUP_METHOD, LOOKUP_PATH, SEARCHES_PER_SECOND,
};

/// Largest lookup answer read from a node.
const MAX_ANSWER: usize = 16 << 10;

/// What a gateway keeps for signed URLs.
pub(super) struct SignedSearch {
    found: Remembered,
    ration: Ration,
}

impl Default for SignedSearch {
    fn default() -> Self {
        SignedSearch {
            found: Remembered::default(),
            ration: Ration::new(SEARCHES_PER_SECOND),
        }
    }
}

/// What the nodes said of a URL.
enum Found {
    Sandbox(String),
    /// No node's sandbox signed it: the answer a node gave (401, 429, 400).
    Refused(Response),
}

impl Gateway {
    /// A signed `/files` request without a sandbox id.
    pub(super) async fn signed_files(&self, mut req: Request<Body>) -> Response {
        let upload = req.method() == Method::POST;
        let Some(signature) = signature_of(req.uri().query()) else {
            return ApiError::new(StatusCode::BAD_REQUEST, "no signature").into_response();
        };
        let id = match self.signed.found.get(&signature) {
            Some(id) => id,
            None => match self.search(req.uri().query(), upload).await {
                Found::Sandbox(id) => {
                    self.signed.found.remember(signature.clone(), id.clone());
                    id
                }
                Found::Refused(mut resp) => {
                    // An upload's body stays unread: its connection cannot carry more.
                    if upload {
                        resp.headers_mut()
                            .insert(header::CONNECTION, HeaderValue::from_static("close"));
                    }
                    return resp;
                }
            },
        };
        // Named now as the SDK's own requests name it (the port is envd's, whatever the
        // client said).
        let headers = req.headers_mut();
        headers.remove("e2b-sandbox-port");
        match HeaderValue::from_str(&id) {
            Ok(v) => headers.insert("e2b-sandbox-id", v),
            Err(_) => return super::not_found(&id),
        };
        let resp = self.to_sandbox(&id, req, None).await;
        if matches!(
            resp.status(),
            StatusCode::NOT_FOUND | StatusCode::BAD_GATEWAY
        ) {
            // The sandbox is gone ("The sandbox was not found", as E2B's proxy answers): the
            // URL is searched again next time, and refused then.
            self.signed.found.forget(&signature);
        }
        resp
    }

    /// Asks every node which of its sandboxes signed the URL of `query` (for an upload, or a
    /// download); the first to say wins.
    async fn search(&self, query: Option<&str>, upload: bool) -> Found {
        if !self.signed.ration.take() {
            return Found::Refused(too_many());
        }
        let path = match query {
            Some(q) => format!("{LOOKUP_PATH}?{q}"),
            None => LOOKUP_PATH.to_owned(),
        };
        let method = if upload { "POST" } else { "GET" };
        let mut asks: FuturesUnordered<_> = self
            .nodes
            .serving()
            .into_iter()
            .map(|node| {
                let path = path.clone();
                async move {
                    let answer = match Request::get(path)
                        .header(LOOKUP_METHOD, method)
                        .body(Body::empty())
                    {
                        Ok(q) => super::list::ask(self, &node, q, None, MAX_ANSWER).await,
                        Err(e) => Err(e.to_string()),
                    };
                    (node, answer)
                }
            })
            .collect();
        let mut refusal: Option<Response> = None;
        while let Some((node, answer)) = asks.next().await {
            let (parts, bytes) = match answer {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(node = %node.row.name, error = %e, "a node did not answer a signed URL's lookup");
                    continue;
                }
            };
            if parts.status.is_success() {
                let id = serde_json::from_slice::<serde_json::Value>(&bytes)
                    .ok()
                    .and_then(|v| v.get("sandboxID")?.as_str().map(str::to_owned));
                // A node answers for its own sandboxes only.
                match id {
                    Some(id) if super::routes::code_of(&id) == Some(node.row.code.as_str()) => {
                        return Found::Sandbox(id)
                    }
                    _ => {
                        tracing::warn!(node = %node.row.name, "a node's lookup answer does not name one of its sandboxes");
                        continue;
                    }
                }
            }
            // A node out of searches may hold the sandbox: that answer outranks "no such".
            let rationed = parts.status == StatusCode::TOO_MANY_REQUESTS;
            if refusal.is_none() || rationed {
                refusal = Some(Response::from_parts(parts, Body::from(bytes)));
            }
        }
        Found::Refused(refusal.unwrap_or_else(super::no_nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_nodes_a_signed_url_waits_for_them_and_searches_are_rationed() {
        let (gw, _) = super::super::tests::gateway();
        let url = "/files?path=%2Ftmp%2Fa&signature=v1_abc&username=user";
        let get = || Request::get(url).body(Body::empty()).unwrap();
        assert_eq!(
            gw.clone().handle(get()).await.status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        let upload = Request::post(url).body(Body::from("x")).unwrap();
        let resp = gw.clone().handle(upload).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
        // The gateway's ration is spent by a flood, whatever the nodes would say.
        let mut statuses = Vec::new();
        for _ in 0..(SEARCHES_PER_SECOND as usize + 10) {
            statuses.push(gw.clone().handle(get()).await.status());
        }
        assert_eq!(statuses.last(), Some(&StatusCode::TOO_MANY_REQUESTS));
        let resp = gw.clone().handle(get()).await;
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");
    }
}
