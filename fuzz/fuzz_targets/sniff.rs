//! The host name a sandbox's connection is for, read from its first bytes by the domain proxy
//! (`husk_net::sniff`): the HTTP/1.x `Host` header or the TLS ClientHello's SNI.
//!
//! Checks: a name is a well-formed host name (lowercase, no port, no trailing dot) or a
//! canonical IPv6 literal; the verdict is final once given, whatever bytes follow (the proxy
//! decides on the first bytes, so a later byte must never change what a prefix said); and
//! `sniff`, reading the bytes in pieces, decides what the whole message says.
#![no_main]

use std::collections::VecDeque;
use std::net::Ipv6Addr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use husk_fuzz::{byte, chunks, runtime, Unstructured};
use husk_net::sniff::{parse, sniff, Parse, MAX_SNIFF};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncRead, ReadBuf};

fn well_formed(name: &str) -> bool {
    if let Ok(a) = name.parse::<Ipv6Addr>() {
        return a.to_string() == name;
    }
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    };
    !name.is_empty() && name.len() <= 253 && name.split('.').all(label)
}

/// A peer that sends its bytes in the given pieces, then closes.
struct Pieces(VecDeque<Vec<u8>>);

impl AsyncRead for Pieces {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(mut piece) = self.0.pop_front() {
            let n = piece.len().min(buf.remaining());
            buf.put_slice(&piece[..n]);
            if n < piece.len() {
                self.0.push_front(piece.split_off(n));
            }
        }
        Poll::Ready(Ok(()))
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let seed = u64::from(byte(&mut u)) << 8 | u64::from(byte(&mut u)) | 1;
    let bytes = u.take_rest();
    let whole = parse(bytes);
    if let Parse::Name(n) = &whole {
        assert!(well_formed(n), "{n:?}");
    }
    // Every prefix either asks for more or already says what the whole says (within what
    // the proxy reads at all).
    let step = (bytes.len() / 64).max(1);
    let end = if bytes.len() <= MAX_SNIFF {
        bytes.len()
    } else {
        0
    };
    for cut in (0..end).step_by(step) {
        match parse(&bytes[..cut]) {
            Parse::NeedMore => {}
            early => assert_eq!(early, whole, "the first {cut} bytes decided otherwise"),
        }
    }
    let pieces = chunks(bytes, seed, 512)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect();
    let sniffed = runtime()
        .block_on(sniff(
            &mut Pieces(pieces),
            MAX_SNIFF,
            Duration::from_secs(10),
        ))
        .expect("reading from memory");
    assert!(
        bytes.starts_with(&sniffed.bytes),
        "sniff returned bytes it was not sent"
    );
    if bytes.len() <= MAX_SNIFF {
        let expected = match whole {
            Parse::Name(n) => Some(n),
            Parse::NoName | Parse::NeedMore => None,
        };
        assert_eq!(
            sniffed.host, expected,
            "sniff decided otherwise than the whole message"
        );
    }
});
