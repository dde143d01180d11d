//! The server's side of a sandbox's agent connection.
//!
//! One reader task per sandbox decodes the agent's frames and routes them: replies to the
//! waiting call, process output to the streams subscribed to that process, watch events to
//! their watch. Subscriptions are registered by the reader itself when it sees the reply to
//! `Start`/`Find`/`WatchStart`, before it reads the next frame, so no event that the agent
//! sends after its reply can be missed.
//!
//! The agent runs inside the sandbox: every frame is bounded (`husk_proto::read_frame`
//! limits), decoding is fallible, data sizes are checked, and a protocol violation closes the
//! connection, which ends the sandbox.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use husk_proto::{
    AgentError, ExecEvent, FromAgent, FsEvent, Hello, KernelEvent, KernelStart, ProcEvent, Reply,
    Request, Selector, StartProc, ToAgent, User, CHUNK, VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot, watch};

/// Events buffered per subscriber before the reader waits for it (back-pressure).
const SUBSCRIBER_BUFFER: usize = 64;
/// How long the agent has to answer the hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// The agent answered with an error.
    #[error(transparent)]
    Agent(#[from] AgentError),
    /// The sandbox is gone (its agent closed the connection or broke the protocol).
    #[error("the sandbox is gone")]
    Gone,
}

enum Subscribe {
    None,
    Proc(mpsc::Sender<ProcEvent>),
    Watch(mpsc::Sender<Vec<FsEvent>>),
    Kernel(u32, mpsc::Sender<KernelEvent>),
}

struct Pending {
    reply: oneshot::Sender<Result<Reply, CallError>>,
    subscribe: Subscribe,
}

#[derive(Default)]
struct Routes {
    pending: HashMap<u64, Pending>,
    procs: HashMap<u32, Vec<mpsc::Sender<ProcEvent>>>,
    watches: HashMap<u32, mpsc::Sender<Vec<FsEvent>>>,
    kernels: HashMap<u32, mpsc::Sender<KernelEvent>>,
    closed: bool,
}

struct Inner {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    /// The same socket, for [`AgentClient::close`] to shut both ways without waiting for
    /// the writer (a send may be stuck on a frozen agent's full socket).
    hangup: std::os::unix::net::UnixStream,
    routes: Mutex<Routes>,
    next_id: AtomicU64,
    closed: watch::Sender<bool>,
}

/// A cheap, cloneable handle to one sandbox's agent.
#[derive(Clone)]
pub struct AgentClient {
    inner: Arc<Inner>,
}

/// The reply to a submitted call.
pub struct PendingReply {
    rx: oneshot::Receiver<Result<Reply, CallError>>,
}

impl std::future::IntoFuture for PendingReply {
    type Output = Result<Reply, CallError>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Self::Output> + Send>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.rx.await.unwrap_or(Err(CallError::Gone)) })
    }
}

/// Whether the reply to a [`Request::Deadline`] says the agent holds its backstop.
pub fn deadline_taken(reply: Result<Reply, CallError>) -> Result<(), CallError> {
    match reply? {
        Reply::Done => Ok(()),
        _ => Err(CallError::Gone),
    }
}

/// Output of one process, until its `End` (or until the sandbox is gone: `None` without `End`).
pub struct ProcStream {
    rx: mpsc::Receiver<ProcEvent>,
}

impl ProcStream {
    pub async fn next(&mut self) -> Option<ProcEvent> {
        self.rx.recv().await
    }

    /// The same events with `values` masked in stdout, stderr and terminal output (see
    /// [`crate::secrets::redact`]); a forwarding task does the work. Without values, `self`.
    pub fn redacted(mut self, values: Vec<zeroize::Zeroizing<Vec<u8>>>) -> ProcStream {
        use crate::secrets::redact::Redactor;
        if values.is_empty() {
            return self;
        }
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(async move {
            let (mut out, mut err, mut pty) = (
                Redactor::new(&values),
                Redactor::new(&values),
                Redactor::new(&values),
            );
            drop(values);
            while let Some(ev) = self.next().await {
                let ev = match ev {
                    ProcEvent::Stdout(b) => ProcEvent::Stdout(out.push(&b)),
                    ProcEvent::Stderr(b) => ProcEvent::Stderr(err.push(&b)),
                    ProcEvent::Pty(b) => ProcEvent::Pty(pty.push(&b)),
                    ProcEvent::End(end) => {
                        // What was held back goes out before the end.
                        for (r, wrap) in [
                            (&mut out, ProcEvent::Stdout as fn(Vec<u8>) -> ProcEvent),
                            (&mut err, ProcEvent::Stderr),
                            (&mut pty, ProcEvent::Pty),
                        ] {
                            let rest = r.finish();
                            if !rest.is_empty() && tx.send(wrap(rest)).await.is_err() {
                                return;
                            }
                        }
                        ProcEvent::End(end)
                    }
                };
                let empty = matches!(&ev, ProcEvent::Stdout(b) | ProcEvent::Stderr(b) | ProcEvent::Pty(b) if b.is_empty());
                if !empty && tx.send(ev).await.is_err() {
                    return;
                }
            }
        });
        ProcStream { rx }
    }
}

/// Events of one kernel, until its `Dead` (or until the sandbox is gone: `None` without it).
pub struct KernelStream {
    rx: mpsc::Receiver<KernelEvent>,
}

impl KernelStream {
    pub async fn next(&mut self) -> Option<KernelEvent> {
        self.rx.recv().await
    }
}

/// Events of one watch; the watch is stopped in the agent when this is dropped.
pub struct WatchStream {
    id: u32,
    rx: mpsc::Receiver<Vec<FsEvent>>,
    client: AgentClient,
}

impl WatchStream {
    /// The next batch of events; `None` when the sandbox is gone.
    pub async fn next(&mut self) -> Option<Vec<FsEvent>> {
        self.rx.recv().await
    }
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        let client = self.client.clone();
        let watch = self.id;
        if let Ok(mut r) = client.inner.routes.lock() {
            r.watches.remove(&watch);
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = client.call(Request::WatchStop { watch }).await;
            });
        }
    }
}

fn lock(m: &Mutex<Routes>) -> std::sync::MutexGuard<'_, Routes> {
    // A panic while holding the lock cannot leave the routes inconsistent in a way that
    // matters more than losing the sandbox's streams; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn read_msg(r: &mut OwnedReadHalf) -> Option<FromAgent> {
    let mut header = [0u8; 4];
    r.read_exact(&mut header).await.ok()?;
    let len = husk_proto::frame_len(header).ok()?;
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload).await.ok()?;
    husk_proto::decode(&payload).ok()
}

/// Whether a message from the agent stays within what the protocol allows.
fn valid(msg: &FromAgent) -> bool {
    match msg {
        FromAgent::Reply {
            result: Ok(Reply::Data(d)),
            ..
        } => d.len() <= CHUNK,
        FromAgent::Proc {
            event: ProcEvent::Stdout(d) | ProcEvent::Stderr(d) | ProcEvent::Pty(d),
            ..
        } => d.len() <= CHUNK,
        FromAgent::Watch { events, .. } => events.len() <= 100_000,
        FromAgent::Kernel { event, .. } => match event {
            KernelEvent::Ready {
                language,
                implementation,
            } => language.len() <= 1024 && implementation.len() <= 1024,
            KernelEvent::Dead { message } => message.len() <= CHUNK,
            KernelEvent::Exec { event, .. } => match event {
                ExecEvent::Count(_) | ExecEvent::Done { .. } => true,
                ExecEvent::Stdout { text, date } | ExecEvent::Stderr { text, date } => {
                    text.len() <= CHUNK && date.len() <= 64
                }
                ExecEvent::ResultPart { mime, json } => mime.len() <= 256 && json.len() <= CHUNK,
                ExecEvent::Result { date, .. } => date.len() <= 64,
                ExecEvent::Error {
                    name,
                    value,
                    traceback,
                } => {
                    name.len() + value.len() + traceback.iter().map(String::len).sum::<usize>()
                        <= CHUNK
                }
            },
        },
        _ => true,
    }
}

impl AgentClient {
    /// Takes over the server's end of an agent socket, says hello and waits for the answer.
    pub async fn connect(fd: OwnedFd, hello: Hello) -> Result<AgentClient, CallError> {
        let std = std::os::unix::net::UnixStream::from(fd);
        std.set_nonblocking(true).map_err(|_| CallError::Gone)?;
        let hangup = std.try_clone().map_err(|_| CallError::Gone)?;
        let stream = UnixStream::from_std(std).map_err(|_| CallError::Gone)?;
        let (mut r, mut w) = stream.into_split();
        let frame = husk_proto::encode(&ToAgent::Hello(hello)).map_err(|_| CallError::Gone)?;
        w.write_all(&frame).await.map_err(|_| CallError::Gone)?;
        match tokio::time::timeout(HELLO_TIMEOUT, read_msg(&mut r)).await {
            Ok(Some(FromAgent::Hello { version })) if version == VERSION => {}
            _ => return Err(CallError::Gone),
        }
        let (closed, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            writer: tokio::sync::Mutex::new(w),
            hangup,
            routes: Mutex::new(Routes::default()),
            next_id: AtomicU64::new(1),
            closed,
        });
        tokio::spawn(reader(r, inner.clone()));
        Ok(AgentClient { inner })
    }

    /// Whether the agent connection has ended.
    pub fn is_closed(&self) -> bool {
        *self.inner.closed.borrow()
    }

    /// Resolves when the agent connection ends.
    pub async fn closed(&self) {
        let mut rx = self.inner.closed.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    async fn send_call(&self, req: Request, subscribe: Subscribe) -> Result<Reply, CallError> {
        self.submit_call(req, subscribe).await?.await
    }

    /// Sends a call and returns, once it is on its way, the future of its reply. Calls
    /// submitted one after another reach the agent in that order, so a caller can have the
    /// next one under way while the agent works on the previous (an upload's writes).
    pub async fn submit(&self, req: Request) -> Result<PendingReply, CallError> {
        self.submit_call(req, Subscribe::None).await
    }

    async fn submit_call(
        &self,
        req: Request,
        subscribe: Subscribe,
    ) -> Result<PendingReply, CallError> {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut routes = lock(&self.inner.routes);
            if routes.closed {
                return Err(CallError::Gone);
            }
            routes.pending.insert(
                id,
                Pending {
                    reply: tx,
                    subscribe,
                },
            );
        }
        let frame = husk_proto::encode(&ToAgent::Call { id, req }).map_err(|_| {
            lock(&self.inner.routes).pending.remove(&id);
            CallError::Agent(AgentError::new(
                husk_proto::ErrorKind::InvalidArgument,
                "request too large",
            ))
        })?;
        {
            let mut w = self.inner.writer.lock().await;
            if w.write_all(&frame).await.is_err() {
                lock(&self.inner.routes).pending.remove(&id);
                return Err(CallError::Gone);
            }
        }
        Ok(PendingReply { rx })
    }

    /// One call and its reply.
    pub async fn call(&self, req: Request) -> Result<Reply, CallError> {
        self.send_call(req, Subscribe::None).await
    }

    /// Starts a process and subscribes to its output.
    pub async fn start(&self, p: StartProc) -> Result<(u32, ProcStream), CallError> {
        self.subscribe_call(Request::Start(p)).await
    }

    /// Re-attaches to a running process's output.
    pub async fn attach(&self, sel: Selector) -> Result<(u32, ProcStream), CallError> {
        self.subscribe_call(Request::Find(sel)).await
    }

    async fn subscribe_call(&self, req: Request) -> Result<(u32, ProcStream), CallError> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        match self.send_call(req, Subscribe::Proc(tx)).await? {
            Reply::Started { pid } => Ok((pid, ProcStream { rx })),
            _ => Err(CallError::Gone),
        }
    }

    /// Starts watching a directory.
    pub async fn watch(
        &self,
        path: String,
        recursive: bool,
        user: User,
    ) -> Result<WatchStream, CallError> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let req = Request::WatchStart {
            path,
            recursive,
            user,
        };
        match self.send_call(req, Subscribe::Watch(tx)).await? {
            Reply::Watch { watch } => Ok(WatchStream {
                id: watch,
                rx,
                client: self.clone(),
            }),
            _ => Err(CallError::Gone),
        }
    }

    /// Starts a kernel and subscribes to its events (until its `Dead`, or the sandbox's end:
    /// `None` without `Dead`).
    pub async fn kernel_start(&self, k: KernelStart) -> Result<KernelStream, CallError> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let kernel = k.kernel;
        match self
            .send_call(Request::KernelStart(k), Subscribe::Kernel(kernel, tx))
            .await?
        {
            Reply::Done => Ok(KernelStream { rx }),
            _ => Err(CallError::Gone),
        }
    }

    /// Subscribes to the events of a kernel that runs already (a sandbox taken up again by a
    /// restarted server): `CallError::Agent` (not found) if it does not run.
    pub async fn kernel_attach(&self, kernel: u32) -> Result<KernelStream, CallError> {
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        match self
            .send_call(
                Request::KernelAttach { kernel },
                Subscribe::Kernel(kernel, tx),
            )
            .await?
        {
            Reply::Done => Ok(KernelStream { rx }),
            _ => Err(CallError::Gone),
        }
    }

    /// Sets a kept sandbox's backstop: when it ends if no server is connected to it then.
    pub async fn set_deadline(&self, at: Option<std::time::SystemTime>) -> Result<(), CallError> {
        let reply = self.submit_deadline(at).await?;
        deadline_taken(reply.await)
    }

    /// [`Self::set_deadline`] in two steps: this returns once the call is on its way, and
    /// [`deadline_taken`] of its reply says whether the agent holds the backstop.
    pub async fn submit_deadline(
        &self,
        at: Option<std::time::SystemTime>,
    ) -> Result<PendingReply, CallError> {
        let unix_ms = at.map(|t| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis().min(u128::from(u64::MAX)) as u64)
        });
        self.submit(Request::Deadline { unix_ms }).await
    }

    /// Closes the connection from the server's side: the agent exits, ending the sandbox, or,
    /// in a kept sandbox, waits for the next server. Both ways at once: what the server still
    /// had subscribed (process output, watches, kernels) ends now, even from an agent that
    /// cannot answer (frozen).
    pub async fn close(&self) {
        let _ = self.inner.hangup.shutdown(std::net::Shutdown::Both);
    }
}

async fn reader(mut r: OwnedReadHalf, inner: Arc<Inner>) {
    while let Some(msg) = read_msg(&mut r).await {
        if !valid(&msg) {
            break;
        }
        match msg {
            FromAgent::Reply { id, result } => {
                let pending = lock(&inner.routes).pending.remove(&id);
                let Some(p) = pending else { continue };
                let result = result.map_err(CallError::Agent);
                {
                    let mut routes = lock(&inner.routes);
                    match (&result, p.subscribe) {
                        (Ok(Reply::Started { pid }), Subscribe::Proc(tx)) => {
                            routes.procs.entry(*pid).or_default().push(tx);
                        }
                        (Ok(Reply::Watch { watch }), Subscribe::Watch(tx)) => {
                            routes.watches.insert(*watch, tx);
                        }
                        (Ok(Reply::Done), Subscribe::Kernel(kernel, tx)) => {
                            routes.kernels.insert(kernel, tx);
                        }
                        _ => {}
                    }
                }
                let _ = p.reply.send(result);
            }
            FromAgent::Proc { pid, event } => {
                let end = matches!(event, ProcEvent::End(_));
                let subs = {
                    let mut routes = lock(&inner.routes);
                    if end {
                        routes.procs.remove(&pid).unwrap_or_default()
                    } else {
                        routes.procs.get(&pid).cloned().unwrap_or_default()
                    }
                };
                let mut gone = Vec::new();
                for (i, tx) in subs.iter().enumerate() {
                    if tx.send(event.clone()).await.is_err() {
                        gone.push(i);
                    }
                }
                if !end && !gone.is_empty() {
                    let mut routes = lock(&inner.routes);
                    if let Some(list) = routes.procs.get_mut(&pid) {
                        list.retain(|tx| !tx.is_closed());
                    }
                }
            }
            FromAgent::Watch { watch, events } => {
                let tx = lock(&inner.routes).watches.get(&watch).cloned();
                if let Some(tx) = tx {
                    let _ = tx.send(events).await;
                }
            }
            FromAgent::Kernel { kernel, event } => {
                let dead = matches!(event, KernelEvent::Dead { .. });
                let tx = {
                    let mut routes = lock(&inner.routes);
                    if dead {
                        routes.kernels.remove(&kernel)
                    } else {
                        routes.kernels.get(&kernel).cloned()
                    }
                };
                if let Some(tx) = tx {
                    let _ = tx.send(event).await;
                }
            }
            // A second hello is a protocol violation.
            FromAgent::Hello { .. } => break,
        }
    }
    // Closed first, then every route dropped: whoever sees its stream end can then tell
    // by `is_closed` that the sandbox went (rather than its process, watch or kernel).
    // send_replace, not send: `send` leaves the value unchanged when nobody is waiting at this
    // moment, and `is_closed` must still see it.
    inner.closed.send_replace(true);
    let mut routes = lock(&inner.routes);
    routes.closed = true;
    for (_, p) in routes.pending.drain() {
        let _ = p.reply.send(Err(CallError::Gone));
    }
    routes.procs.clear();
    routes.watches.clear();
    routes.kernels.clear();
}

#[cfg(test)]
mod tests {
    //! The agent is inside the sandbox: these play a hostile agent on the other end of a
    //! socket pair and check that the server's side stays bounded and fails closed.

    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream as StdStream;

    use husk_proto::{ErrorKind, MAX_FRAME};

    use super::*;

    fn hello() -> Hello {
        Hello {
            version: VERSION,
            env: Vec::new(),
            default_user: User::User,
            default_workdir: None,
        }
    }

    /// Reads one frame the server sent and returns the call's id (0 for the hello).
    fn read_call(s: &mut StdStream) -> u64 {
        let payload = husk_proto::read_frame(s).unwrap().unwrap();
        match husk_proto::decode::<ToAgent>(&payload).unwrap() {
            ToAgent::Hello(_) => 0,
            ToAgent::Call { id, .. } => id,
        }
    }

    fn send(s: &mut StdStream, msg: &FromAgent) {
        s.write_all(&husk_proto::encode(msg).unwrap()).unwrap();
    }

    /// A client connected to a fake agent that answered the hello.
    async fn connected() -> (AgentClient, StdStream) {
        let (ours, mut theirs) = StdStream::pair().unwrap();
        let agent = std::thread::spawn(move || {
            assert_eq!(read_call(&mut theirs), 0);
            send(&mut theirs, &FromAgent::Hello { version: VERSION });
            theirs
        });
        let client = AgentClient::connect(OwnedFd::from(ours), hello())
            .await
            .unwrap();
        (client, agent.join().unwrap())
    }

    async fn closes_on(bytes: Vec<u8>) {
        let (client, mut agent) = connected().await;
        let call = tokio::spawn({
            let client = client.clone();
            async move { client.call(Request::Env).await }
        });
        let agent = tokio::task::spawn_blocking(move || {
            read_call(&mut agent);
            agent.write_all(&bytes).unwrap();
            agent
        })
        .await
        .unwrap();
        assert!(matches!(call.await.unwrap(), Err(CallError::Gone)));
        tokio::time::timeout(Duration::from_secs(5), client.closed())
            .await
            .expect("connection not closed");
        assert!(client.is_closed());
        drop(agent);
    }

    #[tokio::test]
    async fn an_oversize_frame_closes_the_connection_without_allocating_it() {
        closes_on(u32::MAX.to_be_bytes().to_vec()).await;
        closes_on(((MAX_FRAME + 1) as u32).to_be_bytes().to_vec()).await;
    }

    #[tokio::test]
    async fn a_garbage_frame_closes_the_connection() {
        let mut frame = 3u32.to_be_bytes().to_vec();
        frame.extend_from_slice(&[0xff, 0xff, 0xff]);
        closes_on(frame).await;
    }

    #[tokio::test]
    async fn data_larger_than_a_chunk_closes_the_connection() {
        let msg = FromAgent::Proc {
            pid: 1,
            event: ProcEvent::Stdout(vec![0; CHUNK + 1]),
        };
        closes_on(husk_proto::encode(&msg).unwrap()).await;
    }

    #[tokio::test]
    async fn a_second_hello_closes_the_connection() {
        closes_on(husk_proto::encode(&FromAgent::Hello { version: VERSION }).unwrap()).await;
    }

    #[tokio::test]
    async fn a_reply_to_an_unknown_call_is_ignored() {
        let (client, mut agent) = connected().await;
        let call = tokio::spawn({
            let client = client.clone();
            async move { client.call(Request::Env).await }
        });
        // Kept open to the end: the connection must stay up.
        let _agent = tokio::task::spawn_blocking(move || {
            let id = read_call(&mut agent);
            let stray = FromAgent::Reply {
                id: id + 1000,
                result: Ok(Reply::Done),
            };
            send(&mut agent, &stray);
            let err = AgentError::new(ErrorKind::NotFound, "no");
            send(
                &mut agent,
                &FromAgent::Reply {
                    id,
                    result: Err(err),
                },
            );
            agent
        })
        .await
        .unwrap();
        match call.await.unwrap() {
            Err(CallError::Agent(e)) => assert_eq!(e.kind, ErrorKind::NotFound),
            other => panic!("unexpected {other:?}"),
        }
        assert!(!client.is_closed());
    }

    #[tokio::test]
    async fn an_agent_speaking_another_version_is_refused() {
        let (ours, mut theirs) = StdStream::pair().unwrap();
        let agent = std::thread::spawn(move || {
            read_call(&mut theirs);
            send(
                &mut theirs,
                &FromAgent::Hello {
                    version: VERSION + 1,
                },
            );
            let mut rest = Vec::new();
            let _ = theirs.read_to_end(&mut rest);
        });
        let result = AgentClient::connect(OwnedFd::from(ours), hello()).await;
        assert!(matches!(result, Err(CallError::Gone)));
        agent.join().unwrap();
    }
}
