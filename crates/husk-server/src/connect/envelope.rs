//! Envelope framing of streaming Connect bodies: `flags (1 byte) | length (4 bytes, big-endian) |
//! payload`.
//!
//! Request bodies come from clients and are hostile: [`EnvelopeDecoder`] checks each header as
//! soon as its five bytes are in and refuses an oversized or compressed envelope before
//! buffering any of its payload, so memory stays bounded by the configured maximum.

use std::collections::VecDeque;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::error::ConnectError;

/// Flag bit: the payload is compressed. husk never negotiates compression, so it is refused.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: the end-stream envelope that closes every streaming response.
pub const FLAG_END_STREAM: u8 = 0x02;
/// Length of an envelope header.
pub const HEADER_LEN: usize = 5;
/// Largest payload an [`EnvelopeDecoder`] accepts unless configured otherwise.
pub const DEFAULT_MAX_ENVELOPE: usize = 4 << 20;

/// Initial buffer for a payload; it grows as bytes arrive, so a header that merely claims a
/// large length does not allocate that length up front.
const INITIAL_PAYLOAD_CAPACITY: usize = 64 << 10;

/// One decoded envelope.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    pub flags: u8,
    pub data: Bytes,
}

impl Envelope {
    /// Whether this is the end-stream envelope (flag `0x02`).
    pub fn is_end_stream(&self) -> bool {
        self.flags & FLAG_END_STREAM != 0
    }
}

/// Frames `json` as one envelope with `flags`.
///
/// Payloads above `u32::MAX` bytes cannot be framed; callers never produce them (messages are
/// bounded far below), and the length saturates rather than wrapping if one ever did.
pub fn encode_envelope(flags: u8, json: &[u8]) -> Bytes {
    let len = u32::try_from(json.len()).unwrap_or(u32::MAX);
    let mut buf = BytesMut::with_capacity(HEADER_LEN + json.len());
    buf.put_u8(flags);
    buf.put_u32(len);
    buf.extend_from_slice(json);
    buf.freeze()
}

/// The end-stream envelope's JSON.
#[derive(Serialize)]
struct EndStream<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a ConnectError>,
}

/// The end-stream envelope: `{}` on success, `{"error":{"code":..,"message":..}}` on failure.
pub fn encode_end_stream(error: Option<&ConnectError>) -> Bytes {
    let json = serde_json::to_vec(&EndStream { error })
        .unwrap_or_else(|_| br#"{"error":{"code":"internal"}}"#.to_vec());
    encode_envelope(FLAG_END_STREAM, &json)
}

/// An incremental, bounded envelope decoder.
///
/// Feed it body chunks as they arrive with [`feed`](Self::feed) and take complete envelopes
/// with [`next_envelope`](Self::next_envelope). After the body ends, [`finish`](Self::finish)
/// reports a truncated trailing envelope. The first error is sticky: every later call to
/// `feed` returns it again.
#[derive(Debug)]
pub struct EnvelopeDecoder {
    max: usize,
    header: [u8; HEADER_LEN],
    header_len: usize,
    /// The envelope whose payload is being collected: flags, bytes so far, expected length.
    partial: Option<(u8, BytesMut, usize)>,
    ready: VecDeque<Envelope>,
    failed: Option<ConnectError>,
}

impl Default for EnvelopeDecoder {
    fn default() -> Self {
        EnvelopeDecoder::new()
    }
}

impl EnvelopeDecoder {
    /// A decoder refusing payloads above [`DEFAULT_MAX_ENVELOPE`].
    pub fn new() -> Self {
        EnvelopeDecoder::with_max(DEFAULT_MAX_ENVELOPE)
    }

    /// A decoder refusing payloads above `max` bytes.
    pub fn with_max(max: usize) -> Self {
        EnvelopeDecoder {
            max,
            header: [0; HEADER_LEN],
            header_len: 0,
            partial: None,
            ready: VecDeque::new(),
            failed: None,
        }
    }

    /// Consumes a chunk of body bytes. Complete envelopes become available from
    /// [`next_envelope`](Self::next_envelope), including those decoded before an error.
    pub fn feed(&mut self, mut chunk: &[u8]) -> Result<(), ConnectError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        while !chunk.is_empty() {
            match self.partial.as_mut() {
                Some((flags, payload, expected)) => {
                    let take = (*expected - payload.len()).min(chunk.len());
                    payload.extend_from_slice(&chunk[..take]);
                    chunk = &chunk[take..];
                    if payload.len() == *expected {
                        let envelope = Envelope {
                            flags: *flags,
                            data: std::mem::take(payload).freeze(),
                        };
                        self.ready.push_back(envelope);
                        self.partial = None;
                    }
                }
                None => {
                    let take = (HEADER_LEN - self.header_len).min(chunk.len());
                    self.header[self.header_len..self.header_len + take]
                        .copy_from_slice(&chunk[..take]);
                    self.header_len += take;
                    chunk = &chunk[take..];
                    if self.header_len == HEADER_LEN {
                        self.header_len = 0;
                        if let Err(err) = self.start_envelope() {
                            self.failed = Some(err.clone());
                            return Err(err);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Validates a complete header and starts collecting its payload.
    fn start_envelope(&mut self) -> Result<(), ConnectError> {
        let flags = self.header[0];
        let len = u32::from_be_bytes([
            self.header[1],
            self.header[2],
            self.header[3],
            self.header[4],
        ]);
        if flags & FLAG_COMPRESSED != 0 {
            return Err(ConnectError::unimplemented(
                "compressed envelope (flag 0x01): husk does not support compression; \
                 send Connect-Content-Encoding: identity",
            ));
        }
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(ConnectError::invalid_argument(format!(
                "envelope with unknown flags {flags:#04x}"
            )));
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.max {
            return Err(ConnectError::resource_exhausted(format!(
                "envelope of {len} bytes exceeds the limit of {} bytes",
                self.max
            )));
        }
        if len == 0 {
            self.ready.push_back(Envelope {
                flags,
                data: Bytes::new(),
            });
        } else {
            let payload = BytesMut::with_capacity(len.min(INITIAL_PAYLOAD_CAPACITY));
            self.partial = Some((flags, payload, len));
        }
        Ok(())
    }

    /// The next complete envelope, if any.
    pub fn next_envelope(&mut self) -> Option<Envelope> {
        self.ready.pop_front()
    }

    /// Whether no envelope is partially received (the body may end here).
    pub fn is_at_boundary(&self) -> bool {
        self.header_len == 0 && self.partial.is_none()
    }

    /// Checks that the body ended on an envelope boundary.
    pub fn finish(&self) -> Result<(), ConnectError> {
        if let Some(err) = &self.failed {
            return Err(err.clone());
        }
        if let Some((_, payload, expected)) = &self.partial {
            return Err(ConnectError::invalid_argument(format!(
                "truncated envelope: got {} of {expected} payload bytes",
                payload.len()
            )));
        }
        if self.header_len != 0 {
            return Err(ConnectError::invalid_argument(format!(
                "truncated envelope header: got {} of {HEADER_LEN} bytes",
                self.header_len
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::Code;

    fn decode_all(bytes: &[u8]) -> (Vec<Envelope>, Result<(), ConnectError>) {
        let mut dec = EnvelopeDecoder::new();
        let res = dec.feed(bytes).and_then(|()| dec.finish());
        let mut out = Vec::new();
        while let Some(e) = dec.next_envelope() {
            out.push(e);
        }
        (out, res)
    }

    #[test]
    fn encodes_header_and_payload() {
        let bytes = encode_envelope(0, br#"{"a":1}"#);
        assert_eq!(&bytes[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(&bytes[5..], br#"{"a":1}"#);
    }

    #[test]
    fn end_stream_envelopes() {
        let ok = encode_end_stream(None);
        assert_eq!(&ok[..], b"\x02\x00\x00\x00\x02{}");
        let err = encode_end_stream(Some(&ConnectError::not_found("no such process")));
        assert_eq!(err[0], FLAG_END_STREAM);
        let json: serde_json::Value = serde_json::from_slice(&err[5..]).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"error":{"code":"not_found","message":"no such process"}})
        );
        let (envs, res) = decode_all(&err);
        res.unwrap();
        assert!(envs[0].is_end_stream());
    }

    #[test]
    fn decodes_the_captured_sdk_request() {
        let payload =
            br#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"]},"stdin":false}"#;
        let mut body = vec![0u8, 0, 0, 0, payload.len() as u8];
        body.extend_from_slice(payload);
        let (envs, res) = decode_all(&body);
        res.unwrap();
        assert_eq!(
            envs,
            vec![Envelope {
                flags: 0,
                data: Bytes::copy_from_slice(payload)
            }]
        );
        assert!(!envs[0].is_end_stream());
    }

    #[test]
    fn decodes_byte_by_byte_and_several_per_chunk() {
        let mut body = Vec::new();
        for i in 0..5u8 {
            body.extend_from_slice(&encode_envelope(0, &vec![b'x'; i as usize * 3]));
        }
        body.extend_from_slice(&encode_end_stream(None));
        let mut dec = EnvelopeDecoder::new();
        let mut seen = Vec::new();
        for b in &body {
            dec.feed(std::slice::from_ref(b)).unwrap();
            while let Some(e) = dec.next_envelope() {
                seen.push(e);
            }
        }
        dec.finish().unwrap();
        assert_eq!(seen.len(), 6);
        assert_eq!(seen[0].data.len(), 0);
        assert_eq!(seen[4].data.len(), 12);
        assert!(seen[5].is_end_stream());
        let (all, res) = decode_all(&body);
        res.unwrap();
        assert_eq!(all, seen);
    }

    #[test]
    fn truncated_header_and_payload_are_reported() {
        let (envs, res) = decode_all(&[0, 0, 0]);
        assert!(envs.is_empty());
        let err = res.unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(err.message.contains("truncated envelope header"), "{err}");

        let (envs, res) = decode_all(b"\x00\x00\x00\x00\x05{}");
        assert!(envs.is_empty());
        let err = res.unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(err.message.contains("got 2 of 5"), "{err}");
    }

    #[test]
    fn oversized_length_is_refused_before_buffering() {
        let mut dec = EnvelopeDecoder::new();
        let err = dec.feed(&[0, 0xff, 0xff, 0xff, 0xff]).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
        assert!(err.message.contains("4294967295"), "{err}");
        assert!(
            dec.partial.is_none(),
            "nothing is buffered for a refused envelope"
        );
        // The error is sticky.
        assert_eq!(dec.feed(b"more").unwrap_err(), err);
        assert_eq!(dec.finish().unwrap_err(), err);

        let mut small = EnvelopeDecoder::with_max(4);
        small.feed(&encode_envelope(0, b"1234")).unwrap();
        assert_eq!(
            small.next_envelope().unwrap().data,
            Bytes::from_static(b"1234")
        );
        let err = small.feed(&encode_envelope(0, b"12345")).unwrap_err();
        assert_eq!(err.code, Code::ResourceExhausted);
    }

    #[test]
    fn compressed_and_unknown_flags_are_refused() {
        let (_, res) = decode_all(&encode_envelope(FLAG_COMPRESSED, b"{}"));
        let err = res.unwrap_err();
        assert_eq!(err.code, Code::Unimplemented);
        assert!(err.message.contains("compress"), "{err}");

        let (_, res) = decode_all(&encode_envelope(FLAG_COMPRESSED | FLAG_END_STREAM, b"{}"));
        assert_eq!(res.unwrap_err().code, Code::Unimplemented);

        let (_, res) = decode_all(&encode_envelope(0x80, b"{}"));
        let err = res.unwrap_err();
        assert_eq!(err.code, Code::InvalidArgument);
        assert!(err.message.contains("0x80"), "{err}");
    }

    #[test]
    fn envelopes_before_an_error_are_kept() {
        let mut body = encode_envelope(0, b"{}").to_vec();
        body.extend_from_slice(&[0x01, 0, 0, 0, 0]);
        let (envs, res) = decode_all(&body);
        assert_eq!(envs.len(), 1);
        assert!(res.is_err());
    }

    /// A small deterministic PRNG (xorshift64*), so the fuzz-style test needs no dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    #[test]
    fn random_bytes_never_panic_and_stay_bounded() {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for round in 0..2000 {
            let max = (rng.next() % 512) as usize;
            let mut dec = EnvelopeDecoder::with_max(max);
            let total = (rng.next() % 2048) as usize;
            let mut bytes: Vec<u8> = (0..total).map(|_| rng.next() as u8).collect();
            // Bias some rounds towards plausible headers so payload paths are exercised too.
            if round % 3 == 0 && bytes.len() >= 5 {
                bytes[0] &= FLAG_END_STREAM;
                bytes[1] = 0;
                bytes[2] = 0;
                bytes[3] &= 0x01;
            }
            let mut pos = 0;
            while pos < bytes.len() {
                let step = 1 + (rng.next() % 64) as usize;
                let end = (pos + step).min(bytes.len());
                let fed = dec.feed(&bytes[pos..end]);
                while let Some(e) = dec.next_envelope() {
                    assert!(e.data.len() <= max);
                    assert_eq!(e.flags & FLAG_COMPRESSED, 0);
                }
                if let Some((_, payload, expected)) = &dec.partial {
                    assert!(payload.len() <= *expected && *expected <= max);
                }
                if fed.is_err() {
                    break;
                }
                pos = end;
            }
            let _ = dec.finish();
        }
    }
}
