//! The host name a connection is for, read from its first bytes: the HTTP/1.x `Host` header or
//! the TLS ClientHello's server name (SNI). The bytes come from a sandbox and are hostile:
//! every read is bounds-checked, anything ambiguous (two `Host` headers, two SNI extensions, a
//! folded header) yields no name, and a partial message asks for more, up to [`MAX_SNIFF`]
//! bytes and [`SNIFF_TIMEOUT`].

use std::net::Ipv6Addr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes read before deciding.
pub const MAX_SNIFF: usize = 16 * 1024;
/// Longest wait for them.
pub const SNIFF_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS handshake record.
pub const TLS_HANDSHAKE: u8 = 0x16;
const CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
const SNI_HOST_NAME: u8 = 0;
/// The largest TLS plaintext record body (RFC 8446 §5.1).
const MAX_RECORD: usize = 1 << 14;

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse {
    /// The host name: lowercase, no port, no trailing dot.
    Name(String),
    /// The message is complete (or not HTTP or TLS at all) and names no host, or names it
    /// ambiguously.
    NoName,
    /// The message is incomplete.
    NeedMore,
}

/// The name in `buf`, read as TLS if it starts like a TLS handshake record, else as HTTP.
pub fn parse(buf: &[u8]) -> Parse {
    match buf.first() {
        None => Parse::NeedMore,
        Some(&TLS_HANDSHAKE) => tls_sni(buf),
        Some(_) => http_host(buf),
    }
}

/// The bytes read and the name they carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sniffed {
    pub bytes: Vec<u8>,
    pub host: Option<String>,
}

/// Reads from `r` until [`parse`] decides, the peer stops sending, `limit` bytes have come or
/// `wait` has passed; whatever was read is returned with the name, if any.
pub async fn sniff<R: AsyncRead + Unpin>(
    r: &mut R,
    limit: usize,
    wait: Duration,
) -> std::io::Result<Sniffed> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut bytes = Vec::with_capacity(limit.min(4096));
    let mut chunk = [0u8; 4096];
    loop {
        let room = (limit - bytes.len()).min(chunk.len());
        let read = tokio::time::timeout_at(deadline, r.read(&mut chunk[..room])).await;
        let n = match read {
            Ok(r) => r?,
            Err(_) => 0,
        };
        bytes.extend_from_slice(&chunk[..n]);
        let host = match parse(&bytes) {
            Parse::Name(n) => Some(n),
            Parse::NoName => None,
            Parse::NeedMore if n > 0 && bytes.len() < limit => continue,
            Parse::NeedMore => None,
        };
        return Ok(Sniffed { bytes, host });
    }
}

/// A host name as HTTP or SNI carries it: letters, digits, `-`, `_` and dots, or a bracketed
/// IPv6 literal; lowercase, trailing dot removed. `None` for anything else.
fn host_name(raw: &[u8]) -> Option<String> {
    let s = std::str::from_utf8(raw).ok()?;
    if let Some(inner) = s.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
        return inner.parse::<Ipv6Addr>().ok().map(|a| a.to_string());
    }
    let s = s.strip_suffix('.').unwrap_or(s);
    let ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    (!s.is_empty() && s.len() <= 253 && s.split('.').all(ok)).then(|| s.to_ascii_lowercase())
}

/// The `Host` header of an HTTP/1.x request, its port removed.
pub fn http_host(buf: &[u8]) -> Parse {
    let mut lines = Lines { buf, pos: 0 };
    let Some(request) = lines.next_line() else {
        // Until the first line ends, it must look like the start of "METHOD SP".
        let looks_http = buf
            .iter()
            .take_while(|&&b| b != b' ')
            .all(|b| b.is_ascii_uppercase())
            && buf.len() < MAX_SNIFF;
        return if looks_http {
            Parse::NeedMore
        } else {
            Parse::NoName
        };
    };
    let mut parts = request.split(|&b| b == b' ');
    let method_ok = parts
        .next()
        .is_some_and(|m| !m.is_empty() && m.iter().all(u8::is_ascii_uppercase));
    let target_ok = parts.next().is_some_and(|t| !t.is_empty());
    let version_ok = parts
        .next()
        .is_some_and(|v| v == b"HTTP/1.1" || v == b"HTTP/1.0");
    if !(method_ok && target_ok && version_ok && parts.next().is_none()) {
        return Parse::NoName;
    }
    let mut host = None;
    loop {
        let Some(line) = lines.next_line() else {
            return Parse::NeedMore;
        };
        if line.is_empty() {
            break;
        }
        if line[0] == b' ' || line[0] == b'\t' {
            // A folded continuation (obsolete): servers disagree on it.
            return Parse::NoName;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            return Parse::NoName;
        };
        if !line[..colon].eq_ignore_ascii_case(b"host") {
            continue;
        }
        if host.is_some() {
            return Parse::NoName;
        }
        host = Some(line[colon + 1..].trim_ascii());
    }
    match host.and_then(strip_port).and_then(host_name) {
        Some(h) => Parse::Name(h),
        None => Parse::NoName,
    }
}

/// `host[:port]` or `[v6][:port]` without the port (which must be digits).
fn strip_port(v: &[u8]) -> Option<&[u8]> {
    let (host, port) = match v.first() {
        Some(b'[') => {
            let end = v.iter().position(|&b| b == b']')?;
            (&v[..=end], &v[end + 1..])
        }
        _ => match v.iter().rposition(|&b| b == b':') {
            Some(i) => (&v[..i], &v[i..]),
            None => (v, &v[v.len()..]),
        },
    };
    match port {
        [] => Some(host),
        [b':', digits @ ..] if !digits.is_empty() && digits.len() <= 5 => {
            digits.iter().all(u8::is_ascii_digit).then_some(host)
        }
        _ => None,
    }
}

/// Lines ending in LF (a CR before it is dropped).
struct Lines<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Lines<'a> {
    fn next_line(&mut self) -> Option<&'a [u8]> {
        let rest = self.buf.get(self.pos..)?;
        let end = rest.iter().position(|&b| b == b'\n')?;
        self.pos += end + 1;
        let line = &rest[..end];
        Some(line.strip_suffix(b"\r").unwrap_or(line))
    }
}

/// The server name of a TLS ClientHello, which may span several handshake records and arrive
/// in pieces.
pub fn tls_sni(buf: &[u8]) -> Parse {
    let mut hello = Vec::new();
    let mut pos = 0;
    loop {
        let Some(header) = buf.get(pos..pos + 5) else {
            return Parse::NeedMore;
        };
        // Content type, then legacy version 3.x.
        if header[0] != TLS_HANDSHAKE || header[1] != 3 {
            return Parse::NoName;
        }
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if len == 0 || len > MAX_RECORD {
            return Parse::NoName;
        }
        let start = pos + 5;
        let body = &buf[start..(start + len).min(buf.len())];
        hello.extend_from_slice(body);
        if hello.len() >= 4 {
            if hello[0] != CLIENT_HELLO {
                return Parse::NoName;
            }
            let want = u32::from_be_bytes([0, hello[1], hello[2], hello[3]]) as usize;
            if want > MAX_SNIFF {
                return Parse::NoName;
            }
            if hello.len() >= 4 + want {
                return client_hello_sni(&hello[4..4 + want]);
            }
        }
        if body.len() < len {
            return Parse::NeedMore;
        }
        pos = start + len;
    }
}

/// A bounds-checked reader over a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    /// A field prefixed by its length in `width` bytes (1 or 2).
    fn vec(&mut self, width: usize) -> Option<&'a [u8]> {
        let n = match width {
            1 => self.u8()? as usize,
            _ => self.u16()? as usize,
        };
        self.take(n)
    }
}

/// The SNI host name in a ClientHello body (RFC 8446 §4.1.2, RFC 6066 §3).
fn client_hello_sni(body: &[u8]) -> Parse {
    fn walk(body: &[u8]) -> Option<Option<String>> {
        let mut r = Reader(body);
        r.take(2 + 32)?; // legacy_version, random
        r.vec(1)?; // legacy_session_id
        r.vec(2)?; // cipher_suites
        r.vec(1)?; // legacy_compression_methods
        if r.0.is_empty() {
            // No extensions (allowed before TLS 1.3): no name.
            return Some(None);
        }
        let mut exts = Reader(r.vec(2)?);
        let mut found = None;
        while !exts.0.is_empty() {
            let kind = exts.u16()?;
            let data = exts.vec(2)?;
            if kind != EXT_SERVER_NAME {
                continue;
            }
            if found.is_some() {
                return None; // two server_name extensions: ambiguous
            }
            let mut list = Reader(Reader(data).vec(2)?);
            while !list.0.is_empty() {
                let name_type = list.u8()?;
                let name = list.vec(2)?;
                if name_type == SNI_HOST_NAME {
                    if found.is_some() {
                        return None; // two host names
                    }
                    found = Some(host_name(name)?);
                }
            }
            found.as_ref()?;
        }
        Some(found)
    }
    match walk(body) {
        Some(Some(name)) => Parse::Name(name),
        _ => Parse::NoName,
    }
}

#[cfg(test)]
pub(crate) mod tests;
