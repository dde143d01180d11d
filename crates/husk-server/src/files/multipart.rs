//! Reading `multipart/form-data` uploads with `multer`.
//!
//! The SDKs send one part named `file` per file, whose `filename` is the full target path;
//! for a single file they also put the path in `?path=`, which then wins. Parts with other
//! names are skipped. Two bounds protect the server from a hostile body:
//! - at most [`MAX_PARTS`] parts;
//! - `multer` buffers a part's headers (and any preamble) until it finds their end, without a
//!   limit of its own, and reads every chunk the body has ready before parsing. So the body
//!   stream is wrapped: it hands `multer` at most [`YIELD_EVERY`] bytes per poll (then yields,
//!   so `multer` parses and passes file data on), and once [`MAX_STALLED_BYTES`] arrive without
//!   `multer` producing a part or a chunk of data, the upload fails instead of buffering on.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use futures_util::Stream;

use super::error::FilesError;

/// Most parts one upload may have.
pub const MAX_PARTS: usize = 1000;
/// Most bytes `multer` may take in without producing a part or data.
pub const MAX_STALLED_BYTES: usize = 16 << 20;
/// Bytes handed to `multer` before the stream yields so that it parses what it has.
pub const YIELD_EVERY: usize = 1 << 20;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An upload being read, part by part.
pub struct UploadForm {
    multipart: multer::Multipart<'static>,
    stalled: Arc<AtomicUsize>,
    parts: usize,
    files: usize,
    query_path: Option<String>,
}

/// One file of an upload: where it goes, and its data.
pub struct UploadFile {
    /// The target path as the client gave it (relative paths resolve against the user's
    /// home, later, in the agent).
    pub path: String,
    field: multer::Field<'static>,
    stalled: Arc<AtomicUsize>,
}

impl UploadForm {
    /// Starts reading `body` as the multipart form its `Content-Type` announces; `query_path`
    /// is `?path=`, if given.
    pub fn new(
        content_type: &str,
        body: Body,
        query_path: Option<&str>,
    ) -> Result<UploadForm, FilesError> {
        UploadForm::from_stream(content_type, body.into_data_stream(), query_path)
    }

    /// [`UploadForm::new`] over any stream of body chunks.
    pub fn from_stream<S, E>(
        content_type: &str,
        stream: S,
        query_path: Option<&str>,
    ) -> Result<UploadForm, FilesError>
    where
        S: Stream<Item = Result<Bytes, E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let boundary = multer::parse_boundary(content_type).map_err(|err| {
            FilesError::bad_request(format!("invalid multipart Content-Type: {err}"))
        })?;
        let stalled = Arc::new(AtomicUsize::new(0));
        let guarded = StallGuard {
            inner: Box::pin(stream),
            stalled: Arc::clone(&stalled),
            mark: 0,
        };
        Ok(UploadForm {
            multipart: multer::Multipart::new(guarded, boundary),
            stalled,
            parts: 0,
            files: 0,
            query_path: query_path.filter(|p| !p.is_empty()).map(str::to_string),
        })
    }

    /// The next file, or `None` at the end of the form. The previous [`UploadFile`] must be
    /// dropped first (multer reads parts strictly in order).
    pub async fn next_file(&mut self) -> Result<Option<UploadFile>, FilesError> {
        loop {
            let field = self.multipart.next_field().await.map_err(multipart_error)?;
            let Some(mut field) = field else {
                return Ok(None);
            };
            self.stalled.store(0, Ordering::Relaxed);
            self.parts += 1;
            if self.parts > MAX_PARTS {
                return Err(FilesError::bad_request(format!(
                    "too many parts: at most {MAX_PARTS} are accepted"
                )));
            }
            if field.name() != Some("file") {
                // Drain and skip parts that are not files.
                while field.chunk().await.map_err(multipart_error)?.is_some() {
                    self.stalled.store(0, Ordering::Relaxed);
                }
                continue;
            }
            self.files += 1;
            let path = match &self.query_path {
                Some(_) if self.files > 1 => {
                    return Err(FilesError::bad_request(
                        "?path names a single file; send several files without ?path, \
                         each with its path as the part's filename",
                    ))
                }
                Some(path) => path.clone(),
                None => match field.file_name().filter(|f| !f.is_empty()) {
                    Some(name) => name.to_string(),
                    None => {
                        return Err(FilesError::bad_request(
                            "part \"file\" has no filename and the request has no ?path",
                        ))
                    }
                },
            };
            if path.contains('\0') {
                return Err(FilesError::bad_request("path contains a NUL byte"));
            }
            return Ok(Some(UploadFile {
                path,
                field,
                stalled: Arc::clone(&self.stalled),
            }));
        }
    }
}

impl UploadFile {
    /// The next chunk of the file's data, `None` at its end.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, FilesError> {
        let chunk = self.field.chunk().await.map_err(multipart_error)?;
        self.stalled.store(0, Ordering::Relaxed);
        Ok(chunk)
    }
}

fn multipart_error(err: multer::Error) -> FilesError {
    match err {
        multer::Error::LockFailure => {
            FilesError::internal("multipart parts must be read one at a time")
        }
        multer::Error::StreamReadFailed(inner) => {
            FilesError::bad_request(format!("reading the multipart body: {inner}"))
        }
        other => FilesError::bad_request(format!("malformed multipart body: {other}")),
    }
}

/// The body stream as `multer` sees it: counts bytes handed over since `multer` last made
/// progress (the reader resets `stalled` to 0), yields every [`YIELD_EVERY`] bytes, and fails
/// the stream beyond [`MAX_STALLED_BYTES`].
struct StallGuard<E> {
    inner: Pin<Box<dyn Stream<Item = Result<Bytes, E>> + Send>>,
    stalled: Arc<AtomicUsize>,
    /// The value of `stalled` when this stream last yielded.
    mark: usize,
}

impl<E: Into<BoxError>> Stream for StallGuard<E> {
    type Item = Result<Bytes, BoxError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        let stalled = this.stalled.load(Ordering::Relaxed);
        if stalled < this.mark {
            // The reader made progress since the last yield.
            this.mark = 0;
        }
        if stalled >= this.mark + YIELD_EVERY {
            // Let multer parse what it has; it is polled again right away.
            this.mark = stalled;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        match this.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                let total = stalled.saturating_add(chunk.len());
                this.stalled.store(total, Ordering::Relaxed);
                if total > MAX_STALLED_BYTES {
                    return Poll::Ready(Some(Err(format!(
                        "more than {MAX_STALLED_BYTES} bytes without a complete part header"
                    )
                    .into())));
                }
                Poll::Ready(Some(Ok(chunk)))
            }
            Poll::Ready(Some(Err(err))) => Poll::Ready(Some(Err(err.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use std::convert::Infallible;

    const CT: &str = "multipart/form-data; boundary=XyZ";

    fn part(name: &str, filename: Option<&str>, data: &str) -> String {
        let disposition = match filename {
            Some(f) => format!("form-data; name=\"{name}\"; filename=\"{f}\""),
            None => format!("form-data; name=\"{name}\""),
        };
        format!(
            "--XyZ\r\nContent-Disposition: {disposition}\r\nContent-Type: application/octet-stream\r\n\r\n{data}\r\n"
        )
    }

    fn form(parts: &[String]) -> Vec<u8> {
        let mut body = parts.concat();
        body.push_str("--XyZ--\r\n");
        body.into_bytes()
    }

    fn chunks(body: Vec<u8>, size: usize) -> impl Stream<Item = Result<Bytes, Infallible>> + Send {
        let pieces: Vec<Result<Bytes, Infallible>> = body
            .chunks(size)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures_util::stream::iter(pieces)
    }

    async fn read_all(form: &mut UploadForm) -> Result<Vec<(String, Vec<u8>)>, FilesError> {
        let mut out = Vec::new();
        while let Some(mut file) = form.next_file().await? {
            let mut data = Vec::new();
            while let Some(chunk) = file.chunk().await? {
                data.extend_from_slice(&chunk);
            }
            out.push((file.path.clone(), data));
        }
        Ok(out)
    }

    #[tokio::test]
    async fn files_by_filename() {
        let body = form(&[
            part("file", Some("/home/user/a.txt"), "alpha"),
            part("other", None, "ignored"),
            part("file", Some("b/c.txt"), "beta\r\nwith lines"),
        ]);
        let mut upload = UploadForm::from_stream(CT, chunks(body, 7), None).unwrap();
        let files = read_all(&mut upload).await.unwrap();
        assert_eq!(
            files,
            vec![
                ("/home/user/a.txt".to_string(), b"alpha".to_vec()),
                ("b/c.txt".to_string(), b"beta\r\nwith lines".to_vec()),
            ]
        );
    }

    #[tokio::test]
    async fn query_path_wins_for_a_single_file() {
        let body = form(&[part("file", Some("ignored.txt"), "x")]);
        let mut upload =
            UploadForm::from_stream(CT, chunks(body, 100), Some("/tmp/t.txt")).unwrap();
        let files = read_all(&mut upload).await.unwrap();
        assert_eq!(files, vec![("/tmp/t.txt".to_string(), b"x".to_vec())]);

        let body = form(&[part("file", None, "x")]);
        let mut upload =
            UploadForm::from_stream(CT, chunks(body, 100), Some("/tmp/t.txt")).unwrap();
        assert_eq!(read_all(&mut upload).await.unwrap().len(), 1);

        let body = form(&[part("file", Some("a"), "1"), part("file", Some("b"), "2")]);
        let mut upload =
            UploadForm::from_stream(CT, chunks(body, 100), Some("/tmp/t.txt")).unwrap();
        let err = read_all(&mut upload).await.unwrap_err();
        assert!(err.message.contains("single file"), "{err}");
    }

    #[tokio::test]
    async fn rejects_files_without_a_target() {
        for p in [part("file", None, "x"), part("file", Some(""), "x")] {
            let mut upload = UploadForm::from_stream(CT, chunks(form(&[p]), 100), None).unwrap();
            let err = read_all(&mut upload).await.unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
            assert!(err.message.contains("no filename"), "{err}");
        }
    }

    #[tokio::test]
    async fn malformed_bodies_are_400() {
        let missing_boundary =
            UploadForm::from_stream("multipart/form-data", chunks(vec![], 1), None);
        assert_eq!(
            missing_boundary.err().unwrap().status,
            StatusCode::BAD_REQUEST
        );
        let not_multipart = UploadForm::from_stream("application/json", chunks(vec![], 1), None);
        assert!(not_multipart.is_err());

        let truncated = part("file", Some("a"), "data").into_bytes();
        let mut upload = UploadForm::from_stream(CT, chunks(truncated, 3), None).unwrap();
        assert_eq!(
            read_all(&mut upload).await.unwrap_err().status,
            StatusCode::BAD_REQUEST
        );

        let mut upload = UploadForm::from_stream(CT, chunks(b"garbage".to_vec(), 3), None).unwrap();
        assert_eq!(
            read_all(&mut upload).await.unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
    }

    #[tokio::test]
    async fn part_count_is_bounded() {
        let parts: Vec<String> = (0..=MAX_PARTS)
            .map(|i| part("note", None, &i.to_string()))
            .collect();
        let mut upload = UploadForm::from_stream(CT, chunks(form(&parts), 4096), None).unwrap();
        let err = read_all(&mut upload).await.unwrap_err();
        assert!(err.message.contains("too many parts"), "{err}");

        let parts: Vec<String> = (0..MAX_PARTS)
            .map(|i| part("file", Some(&format!("f{i}")), ""))
            .collect();
        let mut upload = UploadForm::from_stream(CT, chunks(form(&parts), 4096), None).unwrap();
        assert_eq!(read_all(&mut upload).await.unwrap().len(), MAX_PARTS);
    }

    #[tokio::test]
    async fn endless_part_headers_are_cut_off() {
        // A part whose header section never ends: without the guard multer would buffer it all.
        let head =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\nX-Pad: "
                .to_vec();
        let pad = Bytes::from(vec![b'a'; 1 << 20]);
        let stream = futures_util::stream::iter(
            std::iter::once(Ok::<_, Infallible>(Bytes::from(head)))
                .chain(std::iter::repeat_n(Ok(pad), 40)),
        );
        let mut upload = UploadForm::from_stream(CT, stream, None).unwrap();
        let err = read_all(&mut upload).await.unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        assert!(
            err.message.contains("without a complete part header"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn large_file_data_is_not_mistaken_for_a_stall() {
        let mut body =
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big\"\r\n\r\n"
                .to_vec();
        let size = MAX_STALLED_BYTES * 2;
        body.extend(std::iter::repeat_n(b'z', size));
        body.extend_from_slice(b"\r\n--XyZ--\r\n");
        let mut upload = UploadForm::from_stream(CT, chunks(body, 256 << 10), None).unwrap();
        let mut file = upload.next_file().await.unwrap().unwrap();
        let mut total = 0;
        while let Some(chunk) = file.chunk().await.unwrap() {
            total += chunk.len();
        }
        assert_eq!(total, size);
        drop(file);
        assert!(upload.next_file().await.unwrap().is_none());
    }
}
