//! `GET /files` (download) and `POST /files` (upload) of the in-sandbox API.
//!
//! The transfers themselves are the core's (`husk_core::files`): a download is read ahead of
//! the client by a couple of chunks, an upload is sent chunk by chunk once enough of the body
//! has arrived, and handles are closed even when the client goes away. Here: HTTP, ranges,
//! gzip either way, multipart forms.

use std::io::Write;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use futures_util::{stream, StreamExt};
use husk_core::agent::CallError;
use husk_core::calls::{ErrorKind, SandboxPath, User, CHUNK};
use husk_core::files::FileWrite;

use super::Sandbox;
use crate::files::encoding::{negotiate_encoding, request_encoding, Coding};
use crate::files::gzip::AdaptiveGzip;
use crate::files::multipart::UploadForm;
use crate::files::range::{parse_range, unsatisfiable, ByteRange};
use crate::files::upload::UploadedEntry;
use crate::files::{authorize, FilesError, FilesQuery, Operation};

/// Largest upload body read at once before it is sent on to the agent.
const WRITE_BATCH: usize = CHUNK;
/// Compressed bytes decompressed at a time (at most about 1 MiB of output).
const GUNZIP_PIECE: usize = 1024;

fn agent_error(e: CallError, path: &str) -> FilesError {
    match e {
        CallError::Gone => FilesError::new(StatusCode::BAD_GATEWAY, "The sandbox was not found"),
        CallError::Agent(a) => match a.kind {
            ErrorKind::NotFound => FilesError::not_found(format!("path '{path}' does not exist")),
            ErrorKind::InvalidArgument | ErrorKind::AlreadyExists => {
                FilesError::bad_request(a.message)
            }
            ErrorKind::PermissionDenied => FilesError::new(StatusCode::FORBIDDEN, a.message),
            ErrorKind::NoSpace => FilesError::insufficient_storage(format!(
                "not enough disk space in the sandbox: {}",
                a.message
            )),
            ErrorKind::ResourceExhausted => {
                FilesError::new(StatusCode::TOO_MANY_REQUESTS, a.message)
            }
            ErrorKind::Internal => FilesError::internal(a.message),
        },
    }
}

pub async fn handle(sb: Sandbox, req: Request<Body>) -> Response {
    // An upload refused before its body ended (a full disk, a bad path, no credential) leaves
    // the rest of the body unread, so its HTTP/1.1 connection cannot carry another request: a
    // client that kept it in its pool would send the next request into a closing socket.
    // `Connection: close` tells it not to.
    let body_unread = req.method() == Method::POST && req.version() <= Version::HTTP_11;
    match serve(sb, req).await {
        Ok(r) => r,
        Err(e) => {
            let mut resp = e.into_response();
            if body_unread {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            resp
        }
    }
}

async fn serve(sb: Sandbox, req: Request<Body>) -> Result<Response, FilesError> {
    let query = FilesQuery::parse(req.uri().query())?;
    let op = if req.method() == Method::GET {
        Operation::Read
    } else {
        Operation::Write
    };
    // The access token when the request carries one, else a signature for this path and user.
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    authorize(req.headers(), &query, op, Some(sb.access_token()), now)?;
    let user = crate::files::auth::resolve_user(&query, User::User)?;
    match op {
        Operation::Read => download(sb, req.headers(), query, user).await,
        Operation::Write => upload(sb, req, query, user).await,
    }
}

async fn download(
    sb: Sandbox,
    headers: &HeaderMap,
    query: FilesQuery,
    user: User,
) -> Result<Response, FilesError> {
    let path = query
        .path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| FilesError::bad_request("the path query parameter is required"))?;
    let coding = negotiate_encoding(headers)?;
    let checked =
        SandboxPath::new(path.as_str()).map_err(|e| FilesError::bad_request(e.to_string()))?;
    let file = sb
        .read_file(&checked, user)
        .await
        .map_err(|e| agent_error(e, &path))?;
    let entry = file.entry.clone();
    let size = entry.size;
    let (start, end, status) = match (coding, parse_range(headers, size)) {
        (Coding::Identity, ByteRange::Partial { start, end }) => {
            (start, end + 1, StatusCode::PARTIAL_CONTENT)
        }
        (Coding::Identity, ByteRange::Unsatisfiable) => return Ok(unsatisfiable(size)),
        _ => (0, size, StatusCode::OK),
    };
    let chunks = chunk_stream(file.bytes(start, end));
    let mut builder = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(
            header::CONTENT_DISPOSITION,
            crate::files::disposition::content_disposition(&entry.name),
        )
        .header(header::ACCEPT_RANGES, "bytes");
    let body = match coding {
        Coding::Identity => {
            builder = builder.header(header::CONTENT_LENGTH, end - start);
            if status == StatusCode::PARTIAL_CONTENT {
                builder = builder.header(
                    header::CONTENT_RANGE,
                    ByteRange::content_range(start, end - 1, size),
                );
            }
            Body::from_stream(chunks)
        }
        Coding::Gzip => {
            builder = builder.header(header::CONTENT_ENCODING, "gzip");
            Body::from_stream(gzip_stream(chunks))
        }
    };
    builder
        .body(body)
        .map_err(|e| FilesError::internal(e.to_string()))
}

/// The file's chunks, as the core reads them ahead of the client, as a body stream.
fn chunk_stream(
    rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, CallError>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((
            chunk
                .map(Bytes::from)
                .map_err(|e| std::io::Error::other(e.to_string())),
            rx,
        ))
    })
}

/// Compresses a byte stream with gzip, chunk by chunk (see [`AdaptiveGzip`]).
fn gzip_stream(
    input: impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    stream::unfold(
        (Box::pin(input), Some(AdaptiveGzip::default())),
        |(mut input, gz)| async move {
            let mut gz = gz?;
            match input.next().await {
                Some(Ok(chunk)) => match gz.chunk(&chunk) {
                    Ok(out) => Some((Ok(Bytes::from(out)), (input, Some(gz)))),
                    Err(e) => Some((Err(e), (input, None))),
                },
                Some(Err(e)) => Some((Err(e), (input, None))),
                None => Some((gz.finish().map(Bytes::from), (input, None))),
            }
        },
    )
}

/// Writes one file's data, from successive chunks of the body, through the core: decoded
/// (gzip) and batched here, sent and closed by the core's [`FileWrite`].
struct FileWriter {
    file: FileWrite,
    buf: Vec<u8>,
    gunzip: Option<flate2::write::GzDecoder<Vec<u8>>>,
    path: String,
}

impl FileWriter {
    async fn open(
        sb: &Sandbox,
        path: String,
        user: User,
        metadata: Vec<(String, String)>,
        gzip: bool,
    ) -> Result<FileWriter, FilesError> {
        let checked =
            SandboxPath::new(path.as_str()).map_err(|e| FilesError::bad_request(e.to_string()))?;
        let file = sb
            .write_file(&checked, user, metadata)
            .await
            .map_err(|e| agent_error(e, &path))?;
        Ok(FileWriter {
            file,
            buf: Vec::with_capacity(WRITE_BATCH),
            gunzip: gzip.then(|| flate2::write::GzDecoder::new(Vec::new())),
            path,
        })
    }

    async fn push(&mut self, chunk: &[u8]) -> Result<(), FilesError> {
        if self.gunzip.is_none() {
            self.buf.extend_from_slice(chunk);
            return self.write_full_batches().await;
        }
        // gzip can expand data about a thousandfold: decompress in small pieces and pass each
        // piece's output on, so the memory an upload holds stays near one batch whatever the
        // body claims to expand to.
        for piece in chunk.chunks(GUNZIP_PIECE) {
            if let Some(dec) = &mut self.gunzip {
                dec.write_all(piece)
                    .map_err(|e| FilesError::bad_request(format!("invalid gzip body: {e}")))?;
                let out = std::mem::take(dec.get_mut());
                self.buf.extend_from_slice(&out);
            }
            self.write_full_batches().await?;
        }
        Ok(())
    }

    async fn write_full_batches(&mut self) -> Result<(), FilesError> {
        while self.buf.len() >= WRITE_BATCH {
            let rest = self.buf.split_off(WRITE_BATCH);
            let data = std::mem::replace(&mut self.buf, rest);
            self.write(data).await?;
        }
        Ok(())
    }

    async fn write(&mut self, data: Vec<u8>) -> Result<(), FilesError> {
        self.file
            .write(data)
            .await
            .map_err(|e| agent_error(e, &self.path))
    }

    async fn finish(mut self) -> Result<UploadedEntry, FilesError> {
        if let Some(dec) = self.gunzip.take() {
            let out = dec
                .finish()
                .map_err(|e| FilesError::bad_request(format!("invalid gzip body: {e}")))?;
            self.buf.extend_from_slice(&out);
        }
        while !self.buf.is_empty() {
            let rest = self.buf.split_off(self.buf.len().min(WRITE_BATCH));
            let data = std::mem::replace(&mut self.buf, rest);
            self.write(data).await?;
        }
        let path = self.path;
        match self.file.finish().await {
            Ok(entry) => Ok(UploadedEntry::from(entry)),
            Err(e) => Err(agent_error(e, &path)),
        }
    }
}

async fn upload(
    sb: Sandbox,
    req: Request<Body>,
    query: FilesQuery,
    user: User,
) -> Result<Response, FilesError> {
    let metadata = crate::files::metadata::extract_metadata(req.headers())?;
    let gzip = request_encoding(req.headers())? == Coding::Gzip;
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let mut written = Vec::new();
    if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        let mut form = UploadForm::new(&content_type, req.into_body(), query.path.as_deref())?;
        while let Some(mut file) = form.next_file().await? {
            let mut w =
                FileWriter::open(&sb, file.path.clone(), user, metadata.clone(), gzip).await?;
            loop {
                let pushed = match file.chunk().await {
                    Ok(Some(chunk)) => w.push(&chunk).await,
                    Ok(None) => break,
                    Err(e) => Err(e),
                };
                if let Err(e) = pushed {
                    // Closed before the answer, so the client's next call sees the file closed.
                    w.file.abort().await;
                    return Err(e);
                }
            }
            written.push(w.finish().await?);
        }
    } else {
        let path = query.path.filter(|p| !p.is_empty()).ok_or_else(|| {
            FilesError::bad_request("the path query parameter is required for a raw upload")
        })?;
        let mut w = FileWriter::open(&sb, path, user, metadata, gzip).await?;
        let mut body = req.into_body().into_data_stream();
        while let Some(chunk) = body.next().await {
            let pushed = match chunk {
                Ok(chunk) => w.push(&chunk).await,
                Err(e) => Err(FilesError::bad_request(format!("reading the body: {e}"))),
            };
            if let Err(e) = pushed {
                // Closed before the answer, so the client's next call sees the file closed.
                w.file.abort().await;
                return Err(e);
            }
        }
        written.push(w.finish().await?);
    }
    let mut resp = axum::Json(written).into_response();
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}
