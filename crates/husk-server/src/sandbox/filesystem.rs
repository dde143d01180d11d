//! `filesystem.Filesystem` over Connect-JSON.
//!
//! WatchDir streams (`start{}` first, then events and keepalives). The polling watchers of the
//! synchronous Python SDK (CreateWatcher / GetWatcherEvents / RemoveWatcher) are the same agent
//! watch, drained by a task into a bounded buffer that each GetWatcherEvents empties.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use futures_util::stream;
use husk_core::agent::WatchStream;
use husk_core::calls::{Answer, Call, FsEvent, SandboxPath, User};

use super::rpc::{call_error, empty, read_request, unary_call};
use super::watch_buffer::{Buffers, WatcherKey};
use super::Sandbox;
use crate::budget::Budget;
use crate::connect::{
    parse_stream_request, parse_unary, stream_error, stream_response, unary_err, unary_ok,
    ConnectError,
};
use crate::envd::filesystem::{
    EntryInfo, EntryResponse, FilesystemEvent, GetWatcherEventsResponse, ListDirRequest,
    ListDirResponse, MakeDirRequest, MoveRequest, RemoveRequest, StatRequest, WatchDirRequest,
    WatchDirResponse, WatcherId,
};

/// Polling watchers per sandbox.
const MAX_WATCHERS: usize = 64;
const KEEPALIVE: Duration = Duration::from_secs(30);

/// A polling watcher: its team (whose bound its buffer counts in), the task that fills its
/// buffer, and where its events' entries are found.
type WatcherEntry = (String, tokio::task::AbortHandle, EntryBase);

/// The polling watchers of every sandbox: (sandbox id, watcher id) → the watcher, and their
/// buffered events, bounded per watcher and per team ([`super::watch_buffer`]).
#[derive(Default)]
pub struct Watchers {
    map: Mutex<HashMap<WatcherKey, WatcherEntry>>,
    buffers: Buffers,
}

impl Watchers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WatcherKey, WatcherEntry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a watch with `include_entry` finds its events' entries: (watched path, user).
type EntryBase = Option<(String, User)>;

/// The wire events, each with the entry of its path when asked for (a path that is gone by
/// now, e.g. after a remove, has none).
async fn events_json(sb: &Sandbox, base: &EntryBase, events: Vec<FsEvent>) -> Vec<FilesystemEvent> {
    let mut out = Vec::with_capacity(events.len());
    for ev in events {
        let path = base
            .as_ref()
            .map(|(dir, user)| (format!("{}/{}", dir.trim_end_matches('/'), ev.name), *user));
        let mut wire = FilesystemEvent::from(ev);
        // A path the core would refuse (too long) has no entry, like a path that is gone.
        if let Some((Ok(path), user)) = path.map(|(p, u)| (SandboxPath::new(p), u)) {
            if let Ok(Answer::Entry(e)) = sb.call(Call::Stat { path, user }).await {
                wire.entry = Some(EntryInfo::from(e));
            }
        }
        out.push(wire);
    }
    out
}

pub async fn handle(
    sb: Sandbox,
    watchers: Arc<Watchers>,
    bodies: Arc<Budget>,
    method: String,
    user: User,
    req: Request<Body>,
) -> Response {
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let streaming = method == "WatchDir";
    let mut held = bodies.reservation(sb.team());
    let bytes = match read_request(body, streaming, &mut held).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let (h, b) = (&headers, &bytes[..]);
    match method.as_str() {
        "Stat" => unary_call::<StatRequest, _>(&sb, h, b, user, entry).await,
        "MakeDir" => unary_call::<MakeDirRequest, _>(&sb, h, b, user, entry).await,
        "Move" => unary_call::<MoveRequest, _>(&sb, h, b, user, entry).await,
        "Remove" => unary_call::<RemoveRequest, _>(&sb, h, b, user, empty).await,
        "ListDir" => {
            unary_call::<ListDirRequest, _>(&sb, h, b, user, |r| match r {
                Answer::Entries(entries) => Some(ListDirResponse {
                    entries: entries.into_iter().map(EntryInfo::from).collect(),
                }),
                _ => None,
            })
            .await
        }
        "WatchDir" => {
            let req = match parse_stream_request::<WatchDirRequest>(&headers, &bytes) {
                Ok(r) => r,
                Err(e) => return stream_error(e),
            };
            let base = req.include_entry.then(|| (req.path.clone(), user));
            match start_watch(&sb, req, user).await {
                Ok(w) => watch_stream(sb, base, w),
                Err(e) => stream_error(e),
            }
        }
        "CreateWatcher" => {
            let req = match parse_unary::<WatchDirRequest>(&headers, &bytes) {
                Ok(r) => r,
                Err(e) => return unary_err(e),
            };
            create_watcher(sb, watchers, req, user).await
        }
        "GetWatcherEvents" => {
            let req = match parse_unary::<WatcherId>(&headers, &bytes) {
                Ok(r) => r,
                Err(e) => return unary_err(e),
            };
            let key = (sb.id().to_owned(), req.watcher_id.clone());
            let base = watchers.lock().get(&key).map(|(_, _, base)| base.clone());
            let taken = base.and_then(|base| Some((watchers.buffers.take(sb.team(), &key)?, base)));
            match taken {
                Some((events, base)) => unary_ok(&GetWatcherEventsResponse {
                    events: events_json(&sb, &base, events).await,
                }),
                None => unary_err(ConnectError::not_found(format!(
                    "watcher {} not found",
                    req.watcher_id
                ))),
            }
        }
        "RemoveWatcher" => {
            let req = match parse_unary::<WatcherId>(&headers, &bytes) {
                Ok(r) => r,
                Err(e) => return unary_err(e),
            };
            let key = (sb.id().to_owned(), req.watcher_id.clone());
            match watchers.lock().remove(&key) {
                Some((team, task, _)) => {
                    // Aborting the task drops its WatchStream, which stops the agent's watch.
                    task.abort();
                    watchers.buffers.close(&team, &key);
                    unary_ok(&serde_json::json!({}))
                }
                None => unary_err(ConnectError::not_found(format!(
                    "watcher {} not found",
                    req.watcher_id
                ))),
            }
        }
        // Like any Connect server: a procedure that does not exist is not found.
        other => unary_err(ConnectError::not_found(format!(
            "no such procedure: filesystem.Filesystem/{other}"
        ))),
    }
}

/// For calls answered by one entry.
fn entry(r: Answer) -> Option<EntryResponse> {
    match r {
        Answer::Entry(e) => Some(EntryResponse::from(EntryInfo::from(e))),
        _ => None,
    }
}

async fn start_watch(
    sb: &Sandbox,
    req: WatchDirRequest,
    user: User,
) -> Result<WatchStream, ConnectError> {
    let (path, recursive) = req.watched()?;
    sb.watch(&path, recursive, user).await.map_err(call_error)
}

fn watch_stream(sb: Sandbox, base: EntryBase, w: WatchStream) -> Response {
    // Start, then each batch's events one message each, keepalives while idle.
    let s = stream::unfold(
        (true, w, VecDeque::<FilesystemEvent>::new()),
        move |(first, mut w, mut queue)| {
            let (sb, base) = (sb.clone(), base.clone());
            async move {
                if first {
                    return Some((Ok(WatchDirResponse::Start), (false, w, queue)));
                }
                if let Some(ev) = queue.pop_front() {
                    return Some((Ok(WatchDirResponse::Filesystem(ev)), (false, w, queue)));
                }
                tokio::select! {
                    batch = w.next() => match batch {
                        Some(events) => {
                            queue.extend(events_json(&sb, &base, events).await);
                            match queue.pop_front() {
                                Some(ev) => Some((
                                    Ok(WatchDirResponse::Filesystem(ev)),
                                    (false, w, queue),
                                )),
                                None => Some((Ok(WatchDirResponse::Keepalive), (false, w, queue))),
                            }
                        }
                        // The sandbox went away: break off, as a process stream does.
                        None if sb.is_gone() => Some((Err(ConnectError::sandbox_gone()), (false, w, queue))),
                        None => None,
                    },
                    _ = tokio::time::sleep(KEEPALIVE) => {
                        Some((Ok::<_, ConnectError>(WatchDirResponse::Keepalive), (false, w, queue)))
                    }
                }
            }
        },
    );
    stream_response(s)
}

async fn create_watcher(
    sb: Sandbox,
    watchers: Arc<Watchers>,
    req: WatchDirRequest,
    user: User,
) -> Response {
    let count = watchers
        .lock()
        .keys()
        .filter(|(s, _)| *s == sb.id())
        .count();
    if count >= MAX_WATCHERS {
        return unary_err(ConnectError::resource_exhausted("too many watchers"));
    }
    let base = req.include_entry.then(|| (req.path.clone(), user));
    let mut w = match start_watch(&sb, req, user).await {
        Ok(w) => w,
        Err(e) => return unary_err(e),
    };
    let id = match husk_core::manager::new_sandbox_id() {
        Ok(id) => id,
        Err(e) => return unary_err(ConnectError::internal(e.to_string())),
    };
    let key = (sb.id().to_owned(), id.clone());
    watchers.buffers.open(sb.team(), key.clone());
    let (task_watchers, task_key, team) = (watchers.clone(), key.clone(), sb.team().to_owned());
    let task = tokio::spawn(async move {
        while let Some(events) = w.next().await {
            if !task_watchers.buffers.push(&team, &task_key, events) {
                return;
            }
        }
        // The sandbox is gone: forget the watcher.
        task_watchers.lock().remove(&task_key);
        task_watchers.buffers.close(&team, &task_key);
    });
    watchers
        .lock()
        .insert(key, (sb.team().to_owned(), task.abort_handle(), base));
    unary_ok(&WatcherId { watcher_id: id })
}
