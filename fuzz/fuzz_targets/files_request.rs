//! The parts of a `/files` request a client controls and the paths a sandbox controls: the
//! query (`FilesQuery`), signed-URL authorization, `Range`, `Accept-Encoding` and
//! `Content-Encoding`, `X-Metadata-*` headers, the agent's resolution of a client path
//! (`husk_agent::fs::resolve`), the `Content-Disposition` of a file name, and the adaptive
//! gzip of a download's bytes.
//!
//! Checks: a parsed query, written again, parses the same; authorization passes only with the
//! token or the signature of exactly what was asked; a partial range lies inside the file; a
//! coding nobody asked for is never chosen; metadata stays within the xattr bounds; a resolved
//! path is absolute and normal, and resolving it again changes nothing; the file name can be
//! read back from `Content-Disposition`, which stays one visible-ASCII header value; the gzip
//! stream decompresses to the bytes given.
#![no_main]

use std::io::Read;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use husk_fuzz::{byte, chunks, field, text, Unstructured};
use husk_proto::User;
use husk_server::files::auth::{authorize, sign, FilesAuthError, Operation};
use husk_server::files::disposition::content_disposition;
use husk_server::files::encoding::{negotiate_encoding, request_encoding, Coding};
use husk_server::files::gzip::AdaptiveGzip;
use husk_server::files::metadata::{extract_metadata, MAX_KEY_LEN, MAX_TOTAL_LEN};
use husk_server::files::range::{parse_range, parse_range_value, ByteRange};
use husk_server::files::FilesQuery;
use libfuzzer_sys::fuzz_target;

const TOKEN: &str = "tok_fuzz";
const NOW: i64 = 1_800_000_000;

fn query(u: &mut Unstructured<'_>) -> FilesQuery {
    let raw = text(u, 200);
    let Ok(q) = FilesQuery::parse(Some(&raw)) else {
        return FilesQuery::default();
    };
    // Written again as a query string, it must parse to the same values.
    let mut out = form_urlencoded::Serializer::new(String::new());
    for (k, v) in [
        ("path", &q.path),
        ("username", &q.username),
        ("signature", &q.signature),
        ("signature_expiration", &q.signature_expiration),
    ] {
        if let Some(v) = v {
            out.append_pair(k, v);
        }
    }
    let again = out.finish();
    assert_eq!(
        FilesQuery::parse(Some(&again)).ok(),
        Some(q.clone()),
        "via {again:?}"
    );
    q
}

fn auth(u: &mut Unstructured<'_>, q: &FilesQuery) {
    let op = if byte(u) & 1 == 0 {
        Operation::Read
    } else {
        Operation::Write
    };
    let mut h = HeaderMap::new();
    let token = field(u, 12);
    let sent_token = byte(u) & 1 == 0;
    if sent_token {
        if let Ok(v) = HeaderValue::from_bytes(token) {
            h.insert("x-access-token", v);
        }
    }
    let verdict = authorize(&h, q, op, Some(TOKEN), NOW);
    if h.contains_key("x-access-token") {
        assert_eq!(verdict.is_ok(), token == TOKEN.as_bytes(), "token check");
        return;
    }
    if verdict.is_ok() || verdict == Err(FilesAuthError::Expired) {
        // Only the genuine signature of this path, operation, user and expiration passes.
        let exp = q
            .signature_expiration
            .as_deref()
            .map(|e| e.parse::<i64>().expect("parsed"));
        let genuine = sign(
            q.path.as_deref().unwrap_or(""),
            op,
            q.username.as_deref(),
            TOKEN,
            exp,
        );
        assert_eq!(
            q.signature.as_deref(),
            Some(genuine.as_str()),
            "a forged signature passed"
        );
        assert_eq!(verdict.is_err(), exp.is_some_and(|e| e < NOW), "expiry");
    }
    // And the genuine signature of what was asked always passes (the SDK's URLs work).
    let exp = (byte(u) & 1 == 0).then(|| NOW + i64::from(byte(u)) - 128);
    let path = q.path.clone().unwrap_or_default();
    let signed = FilesQuery {
        path: Some(path.clone()),
        username: q.username.clone(),
        signature: Some(sign(&path, op, q.username.as_deref(), TOKEN, exp)),
        signature_expiration: exp.map(|e| e.to_string()),
    };
    let verdict = authorize(&HeaderMap::new(), &signed, op, Some(TOKEN), NOW);
    let expected = if exp.is_some_and(|e| e < NOW) {
        Err(FilesAuthError::Expired)
    } else {
        Ok(())
    };
    assert_eq!(verdict, expected, "a genuine signature was refused");
}

fn range(u: &mut Unstructured<'_>) {
    let value = field(u, 48);
    let size = u64::from_le_bytes(std::array::from_fn(|i| if i < 3 { byte(u) } else { 0 }));
    // Huge sizes too: the arithmetic near u64::MAX must hold.
    let size = if byte(u) & 1 == 0 {
        size
    } else {
        u64::MAX - size
    };
    let mut h = HeaderMap::new();
    let Ok(v) = HeaderValue::from_bytes(value) else {
        return;
    };
    h.insert("range", v);
    let r = parse_range(&h, size);
    if let Ok(text) = std::str::from_utf8(value) {
        if h["range"].to_str().is_ok() {
            assert_eq!(r, parse_range_value(text, size));
        }
    }
    if let ByteRange::Partial { start, end } = r {
        assert!(start <= end && end < size, "{start}-{end} of {size}");
        let cr = ByteRange::content_range(start, end, size);
        assert_eq!(cr, format!("bytes {start}-{end}/{size}"));
    }
}

fn codings(u: &mut Unstructured<'_>) {
    let mut h = HeaderMap::new();
    for _ in 0..byte(u) % 3 {
        if let Ok(v) = HeaderValue::from_bytes(field(u, 48)) {
            h.append("accept-encoding", v);
        }
    }
    if let Ok(Coding::Gzip) = negotiate_encoding(&h) {
        let asked = h.get_all("accept-encoding").iter().any(|v| {
            let v = String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase();
            v.contains("gzip") || v.contains('*')
        });
        assert!(asked, "gzip chosen though nobody asked for it: {h:?}");
    }
    let mut h = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_bytes(field(u, 16)) {
        h.insert("content-encoding", v);
    }
    let _ = request_encoding(&h);
}

fn metadata(u: &mut Unstructured<'_>) {
    let mut h = HeaderMap::new();
    for _ in 0..byte(u) % 6 {
        let mut name = b"x-metadata-".to_vec();
        name.extend_from_slice(field(u, 24));
        if byte(u) & 3 == 0 {
            name.extend(std::iter::repeat_n(b'k', 250));
        }
        let value = field(u, 64);
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&name),
            HeaderValue::from_bytes(value),
        ) {
            h.append(n, v);
        }
    }
    if let Ok(md) = extract_metadata(&h) {
        let total: usize = md.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(total <= MAX_TOTAL_LEN);
        for w in md.windows(2) {
            assert!(w[0].0 < w[1].0, "keys not sorted and unique");
        }
        for (k, v) in &md {
            assert!(!k.is_empty() && k.len() <= MAX_KEY_LEN);
            let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7e).contains(&b));
            assert!(printable(k) && printable(v), "{k:?}={v:?}");
        }
    }
}

/// The file name `content_disposition` announces, read back as a client would.
fn disposition_name(value: &HeaderValue) -> String {
    let text = value.to_str().expect("visible ASCII");
    assert!(text.bytes().all(|b| (0x20..=0x7e).contains(&b)), "{text:?}");
    if let Some(enc) = text.strip_prefix("inline; filename*=utf-8''") {
        let bytes: Vec<u8> = percent_encoding::percent_decode_str(enc).collect();
        return String::from_utf8(bytes).expect("UTF-8 name");
    }
    let v = text
        .strip_prefix("inline; filename=")
        .expect("one filename parameter");
    let Some(quoted) = v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        assert!(!v.contains([' ', '"', ';', '\\', ',']), "unquoted {v:?}");
        return v.to_string();
    };
    let mut out = String::new();
    let mut chars = quoted.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => out.push(chars.next().expect("an escaped character")),
            '"' => panic!("unescaped quote in {quoted:?}"),
            c => out.push(c),
        }
    }
    out
}

fn paths(path: &str, user: User) {
    let name = path
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty());
    let value = content_disposition(path);
    assert_eq!(disposition_name(&value), name.unwrap_or("download"));

    let Ok(resolved) = husk_agent::fs::resolve(path, user) else {
        assert!(
            path.len() > 4096 || path.contains('\0') || path.starts_with('~'),
            "{path:?}"
        );
        return;
    };
    let r = resolved.to_str().expect("UTF-8 in, UTF-8 out");
    assert!(r.starts_with('/'), "{r:?} is not absolute");
    assert!(r == "/" || !r.ends_with('/'), "{r:?}");
    for comp in r.split('/').skip(1) {
        assert!(
            r == "/" || !matches!(comp, "" | "." | ".."),
            "{r:?} is not normal"
        );
    }
    let again = husk_agent::fs::resolve(r, User::Root).expect("a resolved path resolves");
    assert_eq!(again, resolved, "resolving twice changed {r:?}");
    // A path that is already absolute and normal stays as it is.
    if path.starts_with('/')
        && path.len() > 1
        && path
            .split('/')
            .skip(1)
            .all(|c| !matches!(c, "" | "." | ".."))
    {
        assert_eq!(r, path);
    }
}

fn gzip(data: &[u8], seed: u64) {
    let mut g = AdaptiveGzip::default();
    let mut out = Vec::new();
    for c in chunks(data, seed, 4096) {
        out.extend(g.chunk(c).expect("gzip of a chunk"));
    }
    out.extend(g.finish().expect("end of the gzip stream"));
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&out[..])
        .read_to_end(&mut back)
        .expect("valid gzip");
    assert_eq!(back, data, "gzip round trip");
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let q = query(&mut u);
    auth(&mut u, &q);
    range(&mut u);
    codings(&mut u);
    metadata(&mut u);
    let user = if byte(&mut u) & 1 == 0 {
        User::User
    } else {
        User::Root
    };
    match &q.path {
        Some(p) => paths(p, user),
        None => paths(&text(&mut u, 120), user),
    }
    // The gzip round trip costs more than everything above: every other input only.
    let seed = byte(&mut u);
    if seed & 1 == 1 {
        gzip(u.take_rest(), u64::from(seed));
    }
});
