//! DNS messages as husk's resolver reads them (`husk_net::dns::wire`): queries from sandboxes
//! (forwarded, or answered with an error reply of husk's own) and answers from upstream
//! servers (parsed for the domain proxy's lookups).
//!
//! Checks: a name reads as text that maps back to exactly its wire labels (two different wire
//! names never read the same); an error reply keeps the query's id, opcode, RD and question
//! and is itself a readable response; a query husk builds reads back as the name and type it
//! was built from; a parsed answer's records and the addresses taken from them are bounded and
//! come from the message.
#![no_main]

use std::net::IpAddr;

use husk_fuzz::{byte, text, Unstructured};
use husk_net::dns::wire::{self, Rdata};
use libfuzzer_sys::fuzz_target;

/// The labels of the name at `off`, lowercased, following pointers: an independent reading
/// of the wire name to compare `read_name` with.
fn labels(msg: &[u8], mut off: usize) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    // Labels and pointers: each pointer read_name accepts points backwards, so this is enough.
    for _ in 0..=msg.len() {
        let len = *msg.get(off)? as usize;
        match len {
            0 => return Some(out),
            1..=63 => {
                out.push(msg.get(off + 1..off + 1 + len)?.to_ascii_lowercase());
                off += 1 + len;
            }
            0xc0..=0xff => off = ((len & 0x3f) << 8) | *msg.get(off + 1)? as usize,
            _ => return None,
        }
    }
    None
}

/// The labels a name read as text stands for: dots separate them, `\DDD` is one byte.
fn unescape(name: &str) -> Vec<Vec<u8>> {
    if name.is_empty() {
        return Vec::new();
    }
    let b = name.as_bytes();
    let mut out = vec![Vec::new()];
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'.' => out.push(Vec::new()),
            b'\\' => {
                let n: u16 = name[i + 1..i + 4]
                    .parse()
                    .expect("three digits after a backslash");
                out.last_mut()
                    .unwrap()
                    .push(u8::try_from(n).expect("a byte"));
                i += 3;
            }
            c => out.last_mut().unwrap().push(c),
        }
        i += 1;
    }
    out
}

fn check_name(msg: &[u8], off: usize) {
    if let Ok((name, end)) = wire::read_name(msg, off) {
        assert!(end > off && end <= msg.len());
        let wire_labels = labels(msg, off).expect("read_name read a name the reference cannot");
        assert_eq!(unescape(&name), wire_labels, "{name:?} reads ambiguously");
    }
}

fn query_side(msg: &[u8]) {
    let Some(header) = msg.get(..wire::HEADER_LEN) else {
        assert!(wire::empty_reply(msg, wire::RCODE_FORMERR, false).is_none());
        return;
    };
    let question = wire::question(msg);
    assert_eq!(wire::same_question(msg, msg), question.is_ok());
    for (rcode, truncated) in [(wire::RCODE_FORMERR, false), (wire::RCODE_REFUSED, true)] {
        let r = wire::empty_reply(msg, rcode, truncated).expect("a header is enough");
        assert!(r.len() <= msg.len());
        assert_eq!(&r[..2], &header[..2], "the id changed");
        assert!(wire::is_response(&r));
        assert_eq!(wire::rcode(&r), Ok(rcode));
        assert_eq!(wire::truncated(&r), truncated);
        assert_eq!(wire::opcode(&r), wire::opcode(msg));
        assert_eq!(r[2] & 1, header[2] & 1, "RD changed");
        match &question {
            Ok(q) => assert_eq!(wire::question(&r).as_ref(), Ok(q)),
            Err(_) => assert_eq!(wire::question(&r), Err(wire::WireError::Questions(0))),
        }
        let parsed = wire::parse_response(&r);
        if question.is_ok() {
            let parsed = parsed.expect("an error reply parses");
            assert!(parsed.answers.is_empty());
        }
    }
}

fn answer_side(msg: &[u8]) {
    let Ok(resp) = wire::parse_response(msg) else {
        return;
    };
    assert!(resp.answers.len() <= 256);
    assert_eq!(Ok(resp.rcode), wire::rcode(msg));
    let (name, _, _) = wire::question(msg).expect("a parsed response has a question");
    let (addrs, ttl) = wire::addresses(&name, &resp.answers);
    for a in &addrs {
        let from_answers = resp.answers.iter().any(|r| match (&r.data, a) {
            (Rdata::A(x), IpAddr::V4(y)) => x == y,
            (Rdata::Aaaa(x), IpAddr::V6(y)) => x == y,
            _ => false,
        });
        assert!(from_answers, "{a} is not in the answers");
        assert!(resp.answers.iter().any(|r| r.ttl <= ttl) || addrs.is_empty());
    }
    if addrs.is_empty() {
        assert_eq!(ttl, 0);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    if byte(&mut u).is_multiple_of(4) {
        // A query husk builds for the proxy's lookups.
        let id = u16::from(byte(&mut u)) << 8 | u16::from(byte(&mut u));
        let qtype = if byte(&mut u) & 1 == 0 {
            wire::TYPE_A
        } else {
            wire::TYPE_AAAA
        };
        let name = text(&mut u, 300);
        if let Ok(q) = wire::query(id, &name, qtype) {
            let expected = name.strip_suffix('.').unwrap_or(&name).to_ascii_lowercase();
            assert_eq!(wire::question(&q), Ok((expected, qtype, wire::CLASS_IN)));
            assert_eq!(wire::id(&q), Ok(id));
            assert!(!wire::is_response(&q) && q.len() <= wire::HEADER_LEN + 255 + 4);
        }
        return;
    }
    let msg = u.take_rest();
    check_name(msg, wire::HEADER_LEN);
    if let Ok(end) = wire::question_end(msg) {
        check_name(msg, end);
    }
    query_side(msg);
    answer_side(msg);
});
