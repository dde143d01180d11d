//! Listing a team's sandboxes: every node is asked the same question and the answers are
//! merged. Each node answers its own running and paused sandboxes, and the lost ones (shared
//! records, so every node names them: kept once). A page is cut from the merged list by the
//! same key the nodes page by (start time, id), so `nextToken` means the same thing here.

use std::collections::HashSet;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use husk_core::store::Principal;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::{proxy, Gateway};

/// Largest answer read from one node (a list of thousands of sandboxes fits).
const MAX_NODE_ANSWER: usize = 64 << 20;

/// How long a node has to answer a list: one that is stuck (frozen, overloaded) must not
/// hold every list of the cluster; its sandboxes are missing from that answer.
pub const NODE_LIST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub(super) async fn fan_out(
    gw: &Gateway,
    who: &Principal,
    req: Request<Body>,
    paged: bool,
) -> Response {
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    let limit = if paged {
        match crate::rest::page_limit(&query) {
            Ok(l) => Some(l),
            Err(refused) => return refused,
        }
    } else {
        None
    };
    let desc = crate::rest::query_value(&query, "order") != Some("asc");
    let nodes = gw.nodes.serving();
    let asks = nodes.iter().map(|node| {
        ask(
            gw,
            node,
            super::bodiless_copy(&req),
            Some(who),
            MAX_NODE_ANSWER,
        )
    });
    let answers = join_all(asks).await;
    let mut items: Vec<Value> = Vec::new();
    let mut more = false;
    for (node, answer) in nodes.iter().zip(answers) {
        let (parts, bytes) = match answer {
            Ok(a) => a,
            // Its sandboxes are missing from this answer; once it is declared lost, every
            // node lists them as lost.
            Err(e) => {
                tracing::warn!(node = %node.row.name, error = %e, "a node did not answer a list");
                continue;
            }
        };
        if !parts.status.is_success() {
            // A refusal of the request itself (a bad filter): the same from every node.
            return Response::from_parts(parts, Body::from(bytes));
        }
        more |= parts.headers.contains_key("x-next-token");
        match serde_json::from_slice::<Vec<Value>>(&bytes) {
            Ok(list) => items.extend(list),
            Err(e) => {
                tracing::warn!(node = %node.row.name, error = %e, "a node's list does not parse")
            }
        }
    }
    let mut seen = HashSet::new();
    items.retain(|v| {
        v.get("sandboxID")
            .and_then(Value::as_str)
            .is_some_and(|id| seen.insert(id.to_owned()))
    });
    let mut keyed: Vec<(String, Value)> = items.into_iter().map(|v| (page_key(&v), v)).collect();
    keyed.sort_by(|a, b| a.0.cmp(&b.0));
    if desc {
        keyed.reverse();
    }
    let mut token = None;
    if let Some(limit) = limit {
        if keyed.len() > limit || more {
            keyed.truncate(limit);
            token = keyed.last().map(|(k, _)| k.clone());
        }
    }
    let list: Vec<Value> = keyed.into_iter().map(|(_, v)| v).collect();
    let mut resp = (StatusCode::OK, axum::Json(list)).into_response();
    if let Some(t) = token.and_then(|t| HeaderValue::from_str(&t).ok()) {
        resp.headers_mut().insert("x-next-token", t);
    }
    resp
}

/// `req` asked of `node`, its whole answer read (at most `max` bytes) within
/// [`NODE_LIST_TIMEOUT`]: a question the gateway asks several nodes at once (a list, a signed
/// URL's lookup), where one node stuck must not hold the answer.
pub(super) async fn ask(
    gw: &Gateway,
    node: &super::nodes::Node,
    req: Request<Body>,
    who: Option<&Principal>,
    max: usize,
) -> Result<(axum::http::response::Parts, bytes::Bytes), String> {
    let answer = async {
        let resp = proxy::send(&gw.client, &gw.config.token, &node.row.url, req, who)
            .await
            .map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, max)
            .await
            .map_err(|e| e.to_string())?;
        Ok((parts, bytes))
    };
    tokio::time::timeout(NODE_LIST_TIMEOUT, answer)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", NODE_LIST_TIMEOUT.as_secs())))
}

/// The key a node pages by: start time in nanoseconds, zero-padded, then the id.
fn page_key(v: &Value) -> String {
    let nanos = v
        .get("startedAt")
        .and_then(Value::as_str)
        .and_then(|t| OffsetDateTime::parse(t, &Rfc3339).ok())
        .map_or(0, |t| t.unix_timestamp_nanos());
    let id = v.get("sandboxID").and_then(Value::as_str).unwrap_or("");
    format!("{nanos:020}.{id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_key_is_the_nodes() {
        let t = OffsetDateTime::from_unix_timestamp_nanos(1_700_000_000_123_456_789).unwrap();
        let v = serde_json::json!({
            "sandboxID": "abcd1234",
            "startedAt": crate::rest::rfc3339(t),
        });
        assert_eq!(
            page_key(&v),
            format!("{:020}.abcd1234", 1_700_000_000_123_456_789i128)
        );
    }
}
