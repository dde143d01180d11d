//! Connect's envelope framing of streaming request bodies (`connect::EnvelopeDecoder`), fed
//! the way a client's body arrives: in chunks of any size, against a limit.
//!
//! Checks: every envelope is within the limit and has only the end-stream flag; the decoding
//! does not depend on how the body was cut; re-encoding the envelopes gives back exactly the
//! bytes they were decoded from; a refused header is never buffered.
#![no_main]

use husk_fuzz::{byte, chunks, Unstructured};
use husk_server::connect::envelope::{FLAG_END_STREAM, HEADER_LEN};
use husk_server::connect::{encode_envelope, Envelope, EnvelopeDecoder};
use libfuzzer_sys::fuzz_target;

/// Decodes `parts` in order: the envelopes, and the first error (`feed`'s or `finish`'s).
fn decode(max: usize, parts: &[&[u8]]) -> (Vec<Envelope>, Result<(), String>, bool) {
    let mut dec = EnvelopeDecoder::with_max(max);
    let mut out = Vec::new();
    let mut result = Ok(());
    for part in parts {
        let fed = dec.feed(part);
        while let Some(e) = dec.next_envelope() {
            out.push(e);
        }
        if let Err(e) = fed {
            // The first error is sticky: feeding more repeats it.
            assert_eq!(dec.feed(b"x"), Err(e.clone()));
            result = Err(e.to_string());
            break;
        }
    }
    let boundary = dec.is_at_boundary();
    if result.is_ok() {
        result = dec.finish().map_err(|e| e.to_string());
    }
    (out, result, boundary)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    // Small limits reach the refusal paths; the default is what the server uses.
    let max = match byte(&mut u) % 4 {
        0 => husk_server::connect::envelope::DEFAULT_MAX_ENVELOPE,
        n => usize::from(byte(&mut u)) << (4 * (n - 1)),
    };
    let seed = u64::from_le_bytes([byte(&mut u), byte(&mut u), byte(&mut u), 0, 0, 0, 0, 1]);
    let body = u.take_rest();

    let (whole, whole_result, whole_boundary) = decode(max, &[body]);
    let pieces = chunks(body, seed, 64);
    let (cut, cut_result, _) = decode(max, &pieces);
    assert_eq!(whole, cut, "envelopes depend on how the body was cut");
    assert_eq!(
        whole_result, cut_result,
        "the verdict depends on how the body was cut"
    );

    let mut again = Vec::new();
    for e in &whole {
        assert!(e.data.len() <= max, "an envelope above the limit");
        assert_eq!(e.flags & !FLAG_END_STREAM, 0, "a refused flag got through");
        again.extend_from_slice(&encode_envelope(e.flags, &e.data));
    }
    // The envelopes are exactly a prefix of the body; a clean end is all of it.
    assert_eq!(
        &body[..again.len()],
        &again[..],
        "re-encoding differs from the input"
    );
    if whole_result.is_ok() {
        assert_eq!(again.len(), body.len(), "bytes left over after a clean end");
        assert!(whole_boundary);
    } else if !whole_boundary && body.len() - again.len() >= HEADER_LEN {
        // Stopped inside a payload: its header was accepted, so it was within the limit.
        let h = &body[again.len()..again.len() + HEADER_LEN];
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        assert!(len <= max, "a payload over the limit was being buffered");
    }
});
