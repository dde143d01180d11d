//! The build helper: the process that builds templates (unpacks uploaded contexts, parses
//! their specs, runs build steps in sandboxes with a layered root and, where a step asks, the
//! host's network, writes layers and images under `STATE_DIR/templates`) and removes them;
//! and the server's side of it ([`BuildHelper`]).
//!
//! `husk serve` forks it before any thread (`husk_runtime::helper`) with two channels of other
//! processes: the spawner's build channel (the only one whose sandboxes may get a build's
//! root or the host's network; the server's channel is refused both) and one channel to the
//! state helper (to register what it built). It runs its own async runtime.
//!
//! A build is one call of several frames: [`BuildRequest::Build`] with the read end of a pipe
//! that carries the context archive as chunks (`husk_runtime::helper::ChunkWriter`: a context
//! whose upload broke off is refused, never built short); the helper unpacks it and parses
//! the spec, then answers [`BuildReply::Started`] with the read end of a pipe of the build's
//! NDJSON events (or [`BuildReply::Refused`] with the status the client gets), and, once the
//! build is over and its last event written, [`BuildReply::Finished`]. The query is parsed
//! again in the helper with the server's own check: it is hostile there.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::build::{BuildOptions, Builder};
use husk_core::store::remote::RemoteStore;
use husk_core::store::{Store, TemplateRecord};
use husk_core::template::{summary_json, HOST_TEMPLATE};
use husk_runtime::failure::{Failure, FailureKind};
use husk_runtime::helper::{self as rt, Channels, HelperError, Lent};
use husk_runtime::service::SpawnerService;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::context::{self, ContextDir, ContextError};
use crate::events::Events;
use crate::request::{load, parse_query};

/// Channels to the build helper: a build (one at a time per server) and removals beside it.
const CHANNELS: usize = 3;

/// Bytes moved per chunk of a context upload, and per read of the events.
const CHUNK: usize = 128 << 10;

/// What the server asks the build helper.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum BuildRequest {
    /// A build from the context that comes through the pipe passed with it; `query` is the
    /// request's query as pairs, `key` the id of the key that asked (for the log).
    Build {
        query: Vec<(String, String)>,
        key: String,
    },
    /// Unregister template `name` and release its image.
    Remove { name: String },
    /// A build of E2B's templates as code, registered as `name`, its `COPY` steps' files
    /// taken from those uploaded before ([`BuildRequest::PutFiles`]). No descriptor.
    E2bBuild {
        name: String,
        template: crate::e2b::E2bTemplate,
        key: String,
    },
    /// Register template `source`'s image under each of `names` too (E2B's tags: `name:tag`),
    /// replacing what they named. No descriptor.
    Tag { source: String, names: Vec<String> },
    /// Whether the files of an E2B `COPY` step are stored. No descriptor.
    HasFiles { hash: String },
    /// Store the files of an E2B `COPY` step (a tar archive) that come through the pipe
    /// passed with it.
    PutFiles { hash: String },
    /// The digests of the template images this machine holds (a cluster's node reports
    /// them). No descriptor.
    ListImages,
    /// The image with `digest`, opened for reading, comes with the answer (a peer node
    /// fetches it). No descriptor.
    OpenImage { digest: String },
    /// Store the image of `size` bytes with `digest` that comes through the pipe passed with
    /// it (fetched from a peer node), checked against its digest.
    PutImage { digest: String, size: u64 },
}

/// The build helper's answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BuildReply {
    /// The build runs; its events come through the pipe passed with this reply.
    Started,
    /// The build's last event is written.
    Finished,
    /// Refused before it started: the HTTP status and the message.
    Refused {
        status: u16,
        message: String,
    },
    /// What was removed (`None`: no such template).
    Removed(Option<Box<TemplateRecord>>),
    /// The template whose image the names now name.
    Tagged(Box<TemplateRecord>),
    /// Whether the files asked about are stored.
    HasFiles(bool),
    /// The files are stored.
    Stored,
    /// The images held, by digest.
    Images(Vec<String>),
    /// The image asked for: its descriptor comes with this answer.
    ImageOpened,
    Failed(Failure),
}

/// Why the build helper did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The answer the client gets (a bad archive or spec, a reserved name).
    #[error("{message}")]
    Refused { status: u16, message: String },
    #[error(transparent)]
    Helper(#[from] HelperError),
}

/// The server's side of the build helper.
#[derive(Debug)]
pub struct BuildHelper {
    channels: Arc<Channels>,
    pid: husk_runtime::libc::pid_t,
}

/// A build that runs in the helper: its events, then the helper's last word.
pub struct RunningBuild {
    // Dropped first: the helper's writes then fail, and its answer is read when the channel
    // goes back.
    events: File,
    lent: Lent<Arc<Channels>>,
}

impl RunningBuild {
    /// Gives every chunk of the build's events to `each` until the build is over; `each`
    /// answers false once nobody reads them (the rest is read and dropped: the build goes on
    /// without its client). Blocking.
    pub fn forward(mut self, mut each: impl FnMut(Vec<u8>) -> bool) -> Result<(), BuildError> {
        let mut listening = true;
        let mut buf = vec![0u8; CHUNK];
        loop {
            match self.events.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if listening {
                        listening = each(buf[..n].to_vec());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        match self.lent.recv::<BuildReply>()?.0 {
            BuildReply::Finished => Ok(()),
            other => Err(unexpected(&other)),
        }
    }
}

fn unexpected(reply: &BuildReply) -> BuildError {
    BuildError::Helper(HelperError::Protocol {
        helper: "build",
        message: format!("unexpected answer {reply:?}"),
    })
}

impl BuildHelper {
    /// Forks the build helper with the spawner's build channel and a channel to the state
    /// helper; builds start from `opts`. The process must be single-threaded.
    pub fn start(
        spawner: Option<OwnedFd>,
        spawner_pid: husk_runtime::libc::pid_t,
        state: Option<OwnedFd>,
        opts: BuildOptions,
    ) -> Result<BuildHelper, Failure> {
        let (Some(spawner), Some(state)) = (spawner, state) else {
            return Err(Failure::new(
                FailureKind::Internal,
                "the build helper needs the spawner's build channel and a state channel",
            ));
        };
        let keep = [spawner.as_raw_fd(), state.as_raw_fd()];
        let forked = rt::fork("husk-build", CHANNELS, &keep, move |channels| {
            run(channels, spawner, spawner_pid, state, opts)
        })?;
        rt::await_ready::<()>("build", &forked)?;
        Ok(BuildHelper {
            channels: Arc::new(Channels::new("build", forked.channels)),
            pid: forked.pid,
        })
    }

    pub fn pid(&self) -> husk_runtime::libc::pid_t {
        self.pid
    }

    /// Stops the helper (a build in progress first ends) and waits for it. Blocking.
    pub fn shutdown(&self) {
        self.channels.close();
        if self.pid > 0 {
            let _ = husk_runtime::sys::waitpid(self.pid, 0);
        }
    }

    /// Starts a build from the context `reader` gives (read to its end, or until the helper
    /// refuses it). Blocking. A `reader` that fails leaves the upload without its end: the
    /// helper refuses the context.
    pub fn start_build(
        &self,
        query: &[(String, String)],
        key: &str,
        reader: impl Read,
    ) -> Result<RunningBuild, BuildError> {
        let req = BuildRequest::Build {
            query: query.to_vec(),
            key: key.to_owned(),
        };
        let mut lent = self.send_streamed(&req, reader)?;
        let (reply, fd) = lent.recv_more::<BuildReply>()?;
        started(lent, reply, fd)
    }

    /// Sends `req` with the read end of a pipe that carries what `reader` gives, as chunks,
    /// to its end; the channel stays lent for the answer. However the stream ends (a reader
    /// that fails leaves it without its end), the helper answers: a refusal says why.
    fn send_streamed(
        &self,
        req: &BuildRequest,
        reader: impl Read,
    ) -> Result<Lent<Arc<Channels>>, BuildError> {
        let (theirs, ours) = rt::stream_pipe().map_err(pipe_failed)?;
        let mut lent = self.channels.clone().lend_owned()?;
        lent.send(req, Some(theirs.as_fd()))?;
        drop(theirs);
        let _ = rt::send_stream(reader, ours);
        Ok(lent)
    }

    /// Starts a build of E2B's template `template` as `name` (refused, with the client's
    /// status, when it does not check, names files never uploaded or a base that is not
    /// there). Blocking.
    pub fn start_e2b_build(
        &self,
        name: &str,
        template: &crate::e2b::E2bTemplate,
        key: &str,
    ) -> Result<RunningBuild, BuildError> {
        let req = BuildRequest::E2bBuild {
            name: name.to_owned(),
            template: template.clone(),
            key: key.to_owned(),
        };
        let mut lent = self.channels.clone().lend_owned()?;
        lent.send(&req, None)?;
        let (reply, fd) = lent.recv_more::<BuildReply>()?;
        started(lent, reply, fd)
    }

    /// Whether the files of an E2B `COPY` step with hash `hash` are stored. Blocking.
    pub fn has_files(&self, hash: &str) -> Result<bool, BuildError> {
        let req = BuildRequest::HasFiles { hash: hash.into() };
        match self.channels.call::<_, BuildReply>(&req, None)?.0 {
            BuildReply::HasFiles(b) => Ok(b),
            other => Err(settled_error(other)),
        }
    }

    /// Stores the files (a tar archive) `reader` gives as those of hash `hash`; a reader that
    /// fails stores nothing. Blocking.
    pub fn put_files(&self, hash: &str, reader: impl Read) -> Result<(), BuildError> {
        let req = BuildRequest::PutFiles { hash: hash.into() };
        let mut lent = self.send_streamed(&req, reader)?;
        let (reply, _) = lent.recv::<BuildReply>()?;
        lent.settled();
        match reply {
            BuildReply::Stored => Ok(()),
            other => Err(settled_error(other)),
        }
    }

    /// The digests of the template images this machine holds. Blocking.
    pub fn list_images(&self) -> Result<Vec<String>, BuildError> {
        match self
            .channels
            .call::<_, BuildReply>(&BuildRequest::ListImages, None)?
            .0
        {
            BuildReply::Images(d) => Ok(d),
            other => Err(settled_error(other)),
        }
    }

    /// The image with `digest`, open for reading (`None`: this machine has none). Blocking.
    pub fn open_image(&self, digest: &str) -> Result<Option<File>, BuildError> {
        let req = BuildRequest::OpenImage {
            digest: digest.into(),
        };
        match self.channels.call::<_, BuildReply>(&req, None)? {
            (BuildReply::ImageOpened, Some(fd)) => Ok(Some(File::from(fd))),
            (BuildReply::Refused { status: 404, .. }, _) => Ok(None),
            (other, _) => Err(settled_error(other)),
        }
    }

    /// Stores the `size` bytes `reader` gives as the image with `digest` (refused if they
    /// are not that image). Blocking.
    pub fn put_image(&self, digest: &str, size: u64, reader: impl Read) -> Result<(), BuildError> {
        let req = BuildRequest::PutImage {
            digest: digest.into(),
            size,
        };
        let mut lent = self.send_streamed(&req, reader)?;
        let (reply, _) = lent.recv::<BuildReply>()?;
        lent.settled();
        match reply {
            BuildReply::Stored => Ok(()),
            other => Err(settled_error(other)),
        }
    }

    /// Registers template `source`'s image under each of `names` too, replacing what they
    /// named (refused: 404 when `source` is missing, 400 for a name that is not
    /// `name[:tag]`). Blocking.
    pub fn tag(&self, source: &str, names: &[String]) -> Result<TemplateRecord, BuildError> {
        let req = BuildRequest::Tag {
            source: source.into(),
            names: names.to_vec(),
        };
        match self.channels.call::<_, BuildReply>(&req, None)?.0 {
            BuildReply::Tagged(r) => Ok(*r),
            other => Err(settled_error(other)),
        }
    }

    /// Unregisters template `name` and releases its image (sandboxes running from it keep
    /// their mount); `None` when there is no such template. Blocking.
    pub fn remove(&self, name: &str) -> Result<Option<TemplateRecord>, BuildError> {
        let req = BuildRequest::Remove { name: name.into() };
        match self.channels.call::<_, BuildReply>(&req, None)?.0 {
            BuildReply::Removed(r) => Ok(r.map(|b| *b)),
            other => Err(settled_error(other)),
        }
    }
}

/// A build that started (its events' pipe came with the reply), or why not.
fn started(
    mut lent: Lent<Arc<Channels>>,
    reply: BuildReply,
    fd: Option<OwnedFd>,
) -> Result<RunningBuild, BuildError> {
    match (reply, fd) {
        (BuildReply::Started, Some(events)) => Ok(RunningBuild {
            events: File::from(events),
            lent,
        }),
        (other, _) => {
            lent.settled();
            Err(settled_error(other))
        }
    }
}

/// The error of an answer that ends a call and is not what it asked for.
fn settled_error(reply: BuildReply) -> BuildError {
    match reply {
        BuildReply::Refused { status, message } => BuildError::Refused { status, message },
        BuildReply::Failed(f) => BuildError::Helper(HelperError::Failed(f)),
        other => unexpected(&other),
    }
}

fn pipe_failed(e: io::Error) -> BuildError {
    BuildError::Helper(HelperError::Failed(Failure::new(
        FailureKind::Internal,
        format!("a pipe to the build helper: {e}"),
    )))
}

/// What the helper builds with.
struct Served {
    runtime: tokio::runtime::Runtime,
    /// Cloned per build (its own `no_cache`).
    proto: Builder,
}

/// The helper's body: its runtime, its builder, then the channels until the server closes
/// them.
fn run(
    channels: Vec<OwnedFd>,
    spawner: OwnedFd,
    spawner_pid: husk_runtime::libc::pid_t,
    state: OwnedFd,
    opts: BuildOptions,
) -> i32 {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("husk-build")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let f = Failure::new(
                FailureKind::Host,
                format!("the build helper's runtime: {e}"),
            );
            let _ = rt::ready::<()>(&channels, &Err(f));
            return 1;
        }
    };
    // Contexts a previous run left behind (it was killed mid-build): one server per state
    // directory, so none of them is in use.
    let _ = std::fs::remove_dir_all(context::contexts_dir(&opts.state_dir));
    let proto = Builder {
        spawner: Arc::new(SpawnerService::client(spawner, spawner_pid)),
        store: Arc::new(Store::remote(Arc::new(RemoteStore::client(state)))),
        opts,
    };
    if rt::ready(&channels, &Ok(())).is_err() {
        return 1;
    }
    let served = Served { runtime, proto };
    rt::serve_channels(
        channels,
        "husk-build",
        |req, fd, sock| handle(&served, req, fd, sock),
        bad_request,
    );
    0
}

fn bad_request(m: String) -> BuildReply {
    BuildReply::Failed(Failure::new(
        FailureKind::InvalidSpec,
        format!("bad request: {m}"),
    ))
}

fn refused(status: u16, message: impl Into<String>) -> (BuildReply, Option<OwnedFd>) {
    (
        BuildReply::Refused {
            status,
            message: message.into(),
        },
        None,
    )
}

fn handle(
    served: &Served,
    req: BuildRequest,
    fd: Option<OwnedFd>,
    sock: BorrowedFd<'_>,
) -> (BuildReply, Option<OwnedFd>) {
    match (req, fd) {
        (BuildRequest::Build { query, key }, Some(pipe)) => build(served, &query, &key, pipe, sock),
        (BuildRequest::Remove { name }, None) => remove(served, &name),
        (
            BuildRequest::E2bBuild {
                name,
                template,
                key,
            },
            None,
        ) => e2b_build(served, &name, &template, &key, sock),
        (BuildRequest::Tag { source, names }, None) => tag(served, &source, &names),
        (BuildRequest::HasFiles { hash }, None) => {
            match crate::e2b_files::has(&served.proto.opts.state_dir, &hash) {
                Ok(b) => (BuildReply::HasFiles(b), None),
                Err(e) => context_refusal(e),
            }
        }
        (BuildRequest::ListImages, None) => (
            BuildReply::Images(crate::image_files::list(
                &served.proto.opts.state_dir,
                husk_core::store::postgres::MAX_NODE_TEMPLATES,
            )),
            None,
        ),
        (BuildRequest::OpenImage { digest }, None) => {
            match crate::image_files::open(&served.proto.opts.state_dir, &digest) {
                Ok(Some(file)) => (BuildReply::ImageOpened, Some(OwnedFd::from(file))),
                Ok(None) => refused(404, format!("no image {digest} on this node")),
                Err(e) => refused(400, e.to_string()),
            }
        }
        (BuildRequest::PutImage { digest, size }, Some(pipe)) => {
            let reader = rt::chunk_reader(pipe);
            let opts = &served.proto.opts;
            match crate::image_files::put(&opts.state_dir, &opts.run_dir, &digest, size, reader) {
                Ok(()) => {
                    tracing::info!(digest = %digest, size, "template image received");
                    (BuildReply::Stored, None)
                }
                Err(e) => refused(502, e.to_string()),
            }
        }
        (BuildRequest::PutFiles { hash }, Some(pipe)) => {
            let reader = rt::chunk_reader(pipe);
            match crate::e2b_files::put(&served.proto.opts.state_dir, &hash, reader) {
                Ok(bytes) => {
                    tracing::info!(hash = %hash, bytes, "template files stored");
                    (BuildReply::Stored, None)
                }
                Err(e) => context_refusal(e),
            }
        }
        (_, _) => (
            BuildReply::Failed(Failure::new(
                FailureKind::InvalidSpec,
                "a build and stored files come with a pipe; removals, E2B builds and \
                 questions with no descriptor",
            )),
            None,
        ),
    }
}

fn remove(served: &Served, name: &str) -> (BuildReply, Option<OwnedFd>) {
    if name == HOST_TEMPLATE {
        return refused(400, "the host template is built in and cannot be removed");
    }
    let store = &served.proto.store;
    match store.delete_template(name) {
        Ok(Some(old)) => {
            crate::image::release(store, &served.proto.opts.run_dir, &old);
            (BuildReply::Removed(Some(Box::new(old))), None)
        }
        Ok(None) => (BuildReply::Removed(None), None),
        Err(e) => (
            BuildReply::Failed(Failure::new(
                FailureKind::Internal,
                husk_core::error_chain(&e),
            )),
            None,
        ),
    }
}

/// Registers `source`'s image under `names` too.
fn tag(served: &Served, source: &str, names: &[String]) -> (BuildReply, Option<OwnedFd>) {
    if names.len() > 64 {
        return refused(400, "at most 64 tags at once");
    }
    if let Some(bad) = names
        .iter()
        .find(|n| !crate::e2b::valid_tagged_name(n) || *n == HOST_TEMPLATE)
    {
        return refused(400, format!("invalid template name or tag {bad:?}"));
    }
    let store = &served.proto.store;
    let failed = |e: husk_core::store::StoreError| {
        (
            BuildReply::Failed(Failure::new(
                FailureKind::Internal,
                husk_core::error_chain(&e),
            )),
            None,
        )
    };
    let rec = match store.template(source) {
        Ok(Some(r)) => r,
        Ok(None) => return refused(404, format!("template '{source}' not found")),
        Err(e) => return failed(e),
    };
    for name in names.iter().filter(|n| **n != rec.name) {
        let mut new = rec.clone();
        new.name = name.clone();
        new.created_at = husk_core::store::OffsetDateTime::now_utc();
        match store.put_template(&new) {
            Ok(Some(old)) => crate::image::release(store, &served.proto.opts.run_dir, &old),
            Ok(None) => {}
            Err(e) => return failed(e),
        }
    }
    (BuildReply::Tagged(Box::new(rec)), None)
}

/// Unpacks the context, parses the spec, says the build started (with the events' pipe),
/// runs it to its end whatever becomes of the client, and removes the context.
fn build(
    served: &Served,
    query: &[(String, String)],
    key: &str,
    pipe: OwnedFd,
    sock: BorrowedFd<'_>,
) -> (BuildReply, Option<OwnedFd>) {
    let q = match parse_query(query) {
        Ok(q) => q,
        Err(m) => return refused(400, m),
    };
    let state_dir = served.proto.opts.state_dir.clone();
    let ctx = match ContextDir::create(&state_dir) {
        Ok(c) => c,
        Err(e) => return refused(500, format!("creating a build context directory: {e}")),
    };
    if let Err(e) = context::unpack(rt::chunk_reader(pipe), ctx.path()) {
        return context_refusal(e);
    }
    let (plan, spec) = match load(&ctx, q.file.as_deref(), &q.build_args) {
        Ok(p) => p,
        Err(m) => return refused(400, m),
    };
    let source = format!("upload:{}", spec.display());
    let no_cache = q.no_cache;
    run_build(
        served, &plan, &q.name, no_cache, None, &source, key, ctx, sock,
    )
}

/// Unpacks the files of an E2B template's `COPY` steps into a new context, makes the plan
/// and runs it as [`build`] does.
fn e2b_build(
    served: &Served,
    name: &str,
    template: &crate::e2b::E2bTemplate,
    key: &str,
    sock: BorrowedFd<'_>,
) -> (BuildReply, Option<OwnedFd>) {
    // The server's checks, again: this request is hostile here.
    if !crate::e2b::valid_tagged_name(name) || name == HOST_TEMPLATE {
        return refused(400, format!("invalid template name {name:?}"));
    }
    if let Err(e) = template.check() {
        return refused(400, e.to_string());
    }
    let store = &served.proto.store;
    let local = |n: &str| matches!(store.template(n), Ok(Some(_)));
    if let Some(from) = &template.from_template {
        if !local(from) {
            return refused(400, crate::e2b::missing_base_template(from));
        }
    }
    let state_dir = served.proto.opts.state_dir.clone();
    let ctx = match ContextDir::create(&state_dir) {
        Ok(c) => c,
        Err(e) => return refused(500, format!("creating a build context directory: {e}")),
    };
    for hash in template.files_hashes() {
        let dir = ctx.path().join(crate::e2b::FILES_DIR).join(&hash);
        if let Err(e) = crate::e2b_files::unpack(&state_dir, &hash, &dir) {
            return context_refusal(e);
        }
    }
    let base = crate::e2b::base_of(template, &local);
    let plan = match crate::e2b::plan(template, name, ctx.path(), base) {
        Ok((plan, _)) => plan,
        Err(e) => return refused(400, e.to_string()),
    };
    let login = template
        .registry_login
        .as_ref()
        .map(|l| (l.username.clone(), l.password.clone()));
    run_build(served, &plan, name, false, login, "e2b-sdk", key, ctx, sock)
}

/// The client's status for a context or stored files husk refuses.
fn context_refusal(e: ContextError) -> (BuildReply, Option<OwnedFd>) {
    match e {
        ContextError::Refused(m) => refused(400, m),
        ContextError::TooLarge(m) => refused(413, m),
        e @ ContextError::Io { .. } => refused(500, e.to_string()),
    }
}

/// Says the build started (with the events' pipe), runs it to its end whatever becomes of the
/// client, and removes the context.
#[allow(clippy::too_many_arguments)]
fn run_build(
    served: &Served,
    plan: &crate::plan::BuildPlan,
    name: &str,
    no_cache: bool,
    registry_login: Option<(String, String)>,
    source: &str,
    key: &str,
    ctx: ContextDir,
    sock: BorrowedFd<'_>,
) -> (BuildReply, Option<OwnedFd>) {
    let (events_r, events_w) = match rt::stream_pipe() {
        Ok(p) => p,
        Err(e) => return refused(500, format!("a pipe for the build's events: {e}")),
    };
    if rt::send(sock, &BuildReply::Started, Some(events_r.as_fd())).is_err() {
        // The server is gone; nothing would read the events.
        return (
            BuildReply::Failed(Failure::new(FailureKind::Internal, "channel closed")),
            None,
        );
    }
    drop(events_r);
    let events = Arc::new(Events::new());
    let mut rx = events.take_receiver();
    // The events go out through the pipe as the server reads them; a server that stops
    // reading breaks the pipe, and the rest is dropped (the build goes on).
    let writer = std::thread::Builder::new()
        .name("husk-build-events".into())
        .spawn(move || {
            let mut out = File::from(events_w);
            let mut open = true;
            while let Some(line) = rx.blocking_recv() {
                if open && out.write_all(&line).is_err() {
                    open = false;
                }
            }
        });
    let builder = Builder {
        spawner: served.proto.spawner.clone(),
        store: served.proto.store.clone(),
        opts: BuildOptions {
            no_cache,
            // A login the build brings is used for its pull instead of the server's.
            registry: match registry_login {
                Some(auth) => crate::oci::RegistryOptions {
                    auth: Some(auth),
                    ..served.proto.opts.registry.clone()
                },
                None => served.proto.opts.registry.clone(),
            },
            ..served.proto.opts.clone()
        },
    };
    tracing::info!(template = %name, key = %key, %source, "template build started");
    served.runtime.block_on(async {
        let last = match builder.build(plan, name, source, &*events).await {
            Ok(rec) => {
                tracing::info!(template = %rec.name, digest = %rec.digest, "template built");
                json!({"type": "done", "template": summary_json(&rec)})
            }
            Err(e) => {
                tracing::info!(template = %name, error = %e, "template build failed");
                json!({"type": "error", "message": e.to_string()})
            }
        };
        events.finish(last).await;
    });
    // The last sender goes: the writer ends once it wrote everything.
    drop(events);
    if let Ok(w) = writer {
        let _ = w.join();
    }
    drop(ctx);
    (BuildReply::Finished, None)
}

/// The helper's reading of one request frame, for husk's fuzz targets (`fuzz/`). Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// A request as the helper read it.
    pub struct Read {
        /// The request encoded again.
        pub encoded: Vec<u8>,
        /// A build's query, as the helper's check takes it.
        pub query: Option<Result<crate::request::BuildQuery, String>>,
        /// An E2B build's template: the helper's check, and (when it passes and copies
        /// nothing) its plan's step numbers beside [`crate::e2b::step_numbers`]'s.
        pub e2b: Option<E2bRead>,
        /// A stored-files request's hash, and whether the helper takes it.
        pub hash: Option<(String, bool)>,
    }

    /// What the helper makes of an E2B build's template.
    pub struct E2bRead {
        pub checked: Result<(), String>,
        /// `(plan's numbers, step_numbers)` for a template without `COPY` steps.
        pub numbers: Option<(Vec<usize>, Vec<usize>)>,
    }

    /// Decodes `frame` as the helper does; `None` when it is not a request.
    pub fn request(frame: &[u8]) -> Option<Read> {
        let req: BuildRequest = postcard::from_bytes(frame).ok()?;
        let encoded = postcard::to_stdvec(&req).expect("a decoded request encodes");
        let query = match &req {
            BuildRequest::Build { query, .. } => Some(parse_query(query)),
            _ => None,
        };
        let e2b = match &req {
            BuildRequest::E2bBuild { template, .. } => {
                let checked = template.check().map_err(|e| e.to_string());
                let numbers = (checked.is_ok() && template.files_hashes().is_empty())
                    .then(|| {
                        let ctx = std::path::Path::new("/nonexistent/husk-fuzz-context");
                        crate::e2b::plan(template, "t", ctx, crate::plan::Base::Scratch)
                            .ok()
                            .map(|(_, n)| (n, crate::e2b::step_numbers(template)))
                    })
                    .flatten();
                Some(E2bRead { checked, numbers })
            }
            _ => None,
        };
        let hash = match &req {
            BuildRequest::HasFiles { hash } | BuildRequest::PutFiles { hash } => {
                Some((hash.clone(), crate::e2b::valid_files_hash(hash)))
            }
            _ => None,
        };
        Some(Read {
            encoded,
            query,
            e2b,
            hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build helper served on threads of this process over a store in memory and a spawner
    /// channel nobody answers (these tests never reach a build step); and the server's side.
    struct Pair {
        helper: BuildHelper,
        state_dir: std::path::PathBuf,
        threads: Vec<std::thread::JoinHandle<()>>,
        _spawner: OwnedFd,
    }

    impl Drop for Pair {
        fn drop(&mut self) {
            self.helper.channels.close();
            for t in self.threads.drain(..) {
                let _ = t.join();
            }
            let _ = std::fs::remove_dir_all(&self.state_dir);
        }
    }

    fn pair(tag: &str) -> Pair {
        let state_dir =
            std::env::temp_dir().join(format!("husk-build-helper-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&state_dir).unwrap();
        let (ours, theirs) = husk_runtime::sys::seqpacket_pair().unwrap();
        let served = Arc::new(Served {
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap(),
            proto: Builder {
                spawner: Arc::new(SpawnerService::client(theirs, 0)),
                store: Arc::new(Store::open_in_memory().unwrap()),
                opts: BuildOptions::new(&state_dir),
            },
        });
        let mut channels = Vec::new();
        let mut threads = Vec::new();
        for _ in 0..2 {
            let (a, b) = husk_runtime::sys::stream_pair().unwrap();
            channels.push(a);
            let served = served.clone();
            threads.push(std::thread::spawn(move || {
                rt::serve_channel(
                    b,
                    |req, fd, sock| handle(&served, req, fd, sock),
                    bad_request,
                )
            }));
        }
        Pair {
            helper: BuildHelper {
                channels: Arc::new(Channels::new("build", channels)),
                pid: 0,
            },
            state_dir,
            threads,
            _spawner: ours,
        }
    }

    fn tar(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn query(name: &str) -> Vec<(String, String)> {
        vec![("name".to_string(), name.to_string())]
    }

    /// A reader that gives some bytes of an archive and then fails, as a client that broke off.
    struct Breaks(Vec<u8>, usize);

    impl Read for Breaks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.1 >= self.0.len() / 2 {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "client gone",
                ));
            }
            let n = buf.len().min(self.0.len() / 2 - self.1);
            buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    fn refused(r: Result<RunningBuild, BuildError>) -> (u16, String) {
        match r {
            Err(BuildError::Refused { status, message }) => (status, message),
            Err(e) => panic!("not refused: {e}"),
            Ok(_) => panic!("the build started"),
        }
    }

    fn contexts_left(p: &Pair) -> usize {
        std::fs::read_dir(context::contexts_dir(&p.state_dir)).map_or(0, |d| d.count())
    }

    #[test]
    fn what_is_not_a_build_is_refused_with_the_clients_status_and_leaves_nothing() {
        let p = pair("refused");
        let good = tar(&[("husk.toml", b"[template]\nfrom = \"debian:bookworm\"\n")]);
        // The query is checked again in the helper.
        for q in [
            vec![],
            query("Bad Name"),
            query("host"),
            vec![
                ("name".to_string(), "ok".to_string()),
                ("file".to_string(), "../x".to_string()),
            ],
        ] {
            let (status, m) = refused(p.helper.start_build(&q, "k1", &good[..]));
            assert_eq!(status, 400, "{q:?}: {m}");
        }
        // Not an archive; no spec in it; a spec that does not parse.
        let (status, m) = refused(p.helper.start_build(&query("t"), "k1", &b"not a tar"[..]));
        assert_eq!(status, 400, "{m}");
        let none = tar(&[("README", b"hi")]);
        let (status, m) = refused(p.helper.start_build(&query("t"), "k1", &none[..]));
        assert_eq!(status, 400, "{m}");
        assert!(m.contains("no husk.toml"), "{m}");
        let broken = tar(&[("Dockerfile", b"FROM\nWHAT IS THIS\n")]);
        let (status, m) = refused(p.helper.start_build(&query("t"), "k1", &broken[..]));
        assert_eq!(status, 400, "{m}");
        // An upload that broke off is not unpacked short: refused, and gone.
        let (status, m) = refused(
            p.helper
                .start_build(&query("t"), "k1", Breaks(good.clone(), 0)),
        );
        assert_eq!(status, 400, "{m}");
        assert!(m.contains("broke off"), "{m}");
        assert_eq!(contexts_left(&p), 0);
        // Removals: the host template is not removable; an unknown one is not found.
        let e = p.helper.remove("host").unwrap_err();
        assert!(matches!(e, BuildError::Refused { status: 400, .. }), "{e}");
        assert!(p.helper.remove("nothing").unwrap().is_none());
    }

    #[test]
    fn e2b_files_are_stored_whole_and_e2b_builds_are_checked_before_they_start() {
        use crate::e2b::{E2bStep, E2bTemplate};
        let p = pair("e2b");
        let h = "ab".repeat(32);
        assert!(!p.helper.has_files(&h).unwrap());
        // A cut-off upload stores nothing; a whole one is there after.
        let archive = tar(&[("app/main.py", b"print(1)\n")]);
        let e = p.helper.put_files(&h, Breaks(archive.clone(), 0));
        assert!(e.is_err());
        assert!(!p.helper.has_files(&h).unwrap());
        p.helper.put_files(&h, &archive[..]).unwrap();
        assert!(p.helper.has_files(&h).unwrap());
        // Hashes are checked in the helper too.
        for bad in ["../../etc", "AB"] {
            let e = p.helper.has_files(bad).unwrap_err();
            assert!(matches!(e, BuildError::Refused { status: 400, .. }), "{e}");
            let e = p.helper.put_files(bad, &archive[..]).unwrap_err();
            assert!(matches!(e, BuildError::Refused { status: 400, .. }), "{e}");
        }
        let copy = |hash: &str| E2bTemplate {
            from_image: Some("python:3".into()),
            steps: vec![E2bStep {
                kind: "COPY".into(),
                args: vec!["app".into(), "/app".into()],
                files_hash: Some(hash.into()),
                force: false,
            }],
            ..E2bTemplate::default()
        };
        let refusal = |r| refused(r);
        // A bad name, a template that does not check, files never uploaded, files that are
        // not what the step copies, a base template that is not built.
        let (status, m) = refusal(p.helper.start_e2b_build("Bad", &copy(&h), "k"));
        assert_eq!(status, 400, "{m}");
        let (status, m) = refusal(p.helper.start_e2b_build("host", &copy(&h), "k"));
        assert_eq!(status, 400, "{m}");
        let (status, m) = refusal(p.helper.start_e2b_build("t", &E2bTemplate::default(), "k"));
        assert_eq!((status, m.contains("required")), (400, true), "{m}");
        let (status, m) = refusal(p.helper.start_e2b_build("t", &copy(&"cd".repeat(32)), "k"));
        assert_eq!((status, m.contains("never uploaded")), (400, true), "{m}");
        let mut other = copy(&h);
        other.steps[0].args[0] = "lib".into();
        let (status, m) = refusal(p.helper.start_e2b_build("t", &other, "k"));
        assert_eq!((status, m.contains("hold nothing")), (400, true), "{m}");
        let from = E2bTemplate {
            from_template: Some("base".into()),
            ..E2bTemplate::default()
        };
        let (status, m) = refusal(p.helper.start_e2b_build("t", &from, "k"));
        assert_eq!((status, m.contains("base preset")), (400, true), "{m}");
        assert_eq!(contexts_left(&p), 0);
    }

    #[test]
    fn hostile_requests_are_answered_and_the_channel_goes_on() {
        let p = pair("hostile");
        // A build without its context's pipe, a removal with a descriptor.
        let req = BuildRequest::Build {
            query: query("t"),
            key: "k".into(),
        };
        let (reply, _) = p.helper.channels.call::<_, BuildReply>(&req, None).unwrap();
        assert!(matches!(reply, BuildReply::Failed(_)), "{reply:?}");
        // Stored files without their pipe; a removal, an E2B build or a question with one.
        let req = BuildRequest::PutFiles {
            hash: "ab".repeat(32),
        };
        let (reply, _) = p.helper.channels.call::<_, BuildReply>(&req, None).unwrap();
        assert!(matches!(reply, BuildReply::Failed(_)), "{reply:?}");
        for req in [
            BuildRequest::Remove { name: "x".into() },
            BuildRequest::HasFiles {
                hash: "ab".repeat(32),
            },
            BuildRequest::E2bBuild {
                name: "t".into(),
                template: Default::default(),
                key: "k".into(),
            },
        ] {
            let (r, _w) = husk_runtime::sys::pipe().unwrap();
            let (reply, _) = p
                .helper
                .channels
                .call::<_, BuildReply>(&req, Some(r.as_fd()))
                .unwrap();
            assert!(matches!(reply, BuildReply::Failed(_)), "{reply:?}");
        }
        // Bytes that are no request.
        let (reply, _) = p
            .helper
            .channels
            .call::<_, BuildReply>(&[0xffu8; 7], None)
            .unwrap();
        assert!(matches!(reply, BuildReply::Failed(_)), "{reply:?}");
        assert!(p.helper.remove("nothing").unwrap().is_none());
        p.helper.channels.close();
        let e = p.helper.remove("nothing").unwrap_err();
        assert!(
            matches!(e, BuildError::Helper(HelperError::Gone("build"))),
            "{e}"
        );
    }
}
