//! `multipart/form-data` uploads of `POST /files` (`files::multipart::UploadForm`), read to the
//! end as the handler reads them, from a body arriving in chunks.
//!
//! Two kinds of input. Raw: any `Content-Type` and body; the files read must have a non-empty
//! path without NUL, be no more than the parts bound allows, and the outcome must not depend on
//! how the body was cut. Built: a well-formed form made from the input (parts named `file` or
//! not, file names, data); reading it must give back exactly its `file` parts, in order.
#![no_main]

use std::convert::Infallible;

use bytes::Bytes;
use husk_fuzz::{byte, chunks, field, runtime, text, Unstructured};
use husk_server::files::multipart::{UploadForm, MAX_PARTS};
use libfuzzer_sys::fuzz_target;

const BOUNDARY: &str = "husk-fuzz-7f3a";

/// Reads every file of the form: `(path, data)` pairs, or the error's message.
fn read(
    content_type: &str,
    body: &[u8],
    seed: u64,
    query_path: Option<&str>,
) -> Result<Vec<(String, Vec<u8>)>, String> {
    let pieces: Vec<Result<Bytes, Infallible>> = chunks(body, seed, 256)
        .into_iter()
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let stream = futures_util::stream::iter(pieces);
    runtime().block_on(async {
        let mut form = UploadForm::from_stream(content_type, stream, query_path)
            .map_err(|e| e.message.clone())?;
        let mut files = Vec::new();
        while let Some(mut file) = form.next_file().await.map_err(|e| e.message.clone())? {
            let mut data = Vec::new();
            while let Some(chunk) = file.chunk().await.map_err(|e| e.message.clone())? {
                data.extend_from_slice(&chunk);
            }
            files.push((file.path.clone(), data));
        }
        Ok(files)
    })
}

fn check(files: &[(String, Vec<u8>)], body: &[u8]) {
    assert!(files.len() <= MAX_PARTS);
    let total: usize = files.iter().map(|f| f.1.len()).sum();
    assert!(total <= body.len(), "more file data than body");
    for (path, _) in files {
        assert!(
            !path.is_empty() && !path.contains('\0'),
            "bad path {path:?}"
        );
    }
}

/// A name that needs no quoting or escaping in a `Content-Disposition` parameter.
fn plain(u: &mut Unstructured<'_>, max: usize) -> String {
    const OK: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._- ~";
    field(u, max)
        .iter()
        .map(|b| OK[usize::from(*b) % OK.len()] as char)
        .collect()
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mode = byte(&mut u);
    let seed = u64::from(byte(&mut u)) << 8 | u64::from(byte(&mut u)) | 1;
    if mode & 1 == 0 {
        let content_type = match mode & 6 {
            0 => format!("multipart/form-data; boundary={BOUNDARY}"),
            2 => format!("multipart/form-data; boundary={}", text(&mut u, 80)),
            _ => text(&mut u, 120),
        };
        let query = (mode & 8 != 0).then(|| text(&mut u, 32));
        let body = u.take_rest();
        let whole = read(&content_type, body, u64::MAX, query.as_deref());
        let cut = read(&content_type, body, seed, query.as_deref());
        if let Ok(files) = &whole {
            check(files, body);
        }
        // Error messages may name the chunk where parsing stopped; the outcome may not differ.
        match (&whole, &cut) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "files depend on how the body was cut"),
            (Err(_), Err(_)) => {}
            _ => panic!("outcome depends on how the body was cut: {whole:?} vs {cut:?}"),
        }
        return;
    }

    // A well-formed form.
    let mut body = Vec::new();
    let mut expected = Vec::new();
    let query = (mode & 2 != 0).then(|| format!("/q/{}", plain(&mut u, 16)));
    let parts = byte(&mut u) % 8;
    for _ in 0..parts {
        let is_file = !byte(&mut u).is_multiple_of(4);
        let name = if is_file {
            "file".to_string()
        } else {
            format!("x{}", plain(&mut u, 8))
        };
        let filename = plain(&mut u, 40);
        let content = field(&mut u, 512).to_vec();
        if content
            .windows(BOUNDARY.len())
            .any(|w| w == BOUNDARY.as_bytes())
        {
            return;
        }
        body.extend_from_slice(format!("--{BOUNDARY}\r\n").as_bytes());
        let disposition = if filename.is_empty() {
            format!("Content-Disposition: form-data; name=\"{name}\"\r\n")
        } else {
            format!("Content-Disposition: form-data; name=\"{name}\"; filename=\"{filename}\"\r\n")
        };
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(b"Content-Type: application/octet-stream\r\n\r\n");
        body.extend_from_slice(&content);
        body.extend_from_slice(b"\r\n");
        if is_file {
            expected.push((filename, content));
        }
    }
    body.extend_from_slice(format!("--{BOUNDARY}--\r\n").as_bytes());
    let ct = format!("multipart/form-data; boundary={BOUNDARY}");
    let got = read(&ct, &body, seed, query.as_deref());
    match &query {
        Some(q) if expected.len() == 1 => {
            assert_eq!(
                got,
                Ok(vec![(q.clone(), expected[0].1.clone())]),
                "?path wins"
            );
        }
        Some(_) if expected.len() > 1 => assert!(got.is_err(), "?path with several files"),
        _ if expected.iter().any(|(f, _)| f.is_empty()) => {
            assert!(
                got.is_err(),
                "a file without a name or ?path was accepted: {got:?}"
            );
        }
        _ => assert_eq!(got, Ok(expected), "a well-formed form read differently"),
    }
});
