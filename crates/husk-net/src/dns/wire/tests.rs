use super::*;

fn encode_name(out: &mut Vec<u8>, name: &str) {
    for l in name.split('.').filter(|l| !l.is_empty()) {
        out.push(l.len() as u8);
        out.extend_from_slice(l.as_bytes());
    }
    out.push(0);
}

/// An answer to `query` carrying `records` (owner, data); an owner equal to the question's
/// name is written as a compression pointer to it, as servers do. Shared with the resolver's
/// and the proxy's tests (their fake upstream server).
pub(crate) fn answer(query: &[u8], rcode: u8, records: &[(&str, Rdata)]) -> Vec<u8> {
    let mut msg = empty_reply(query, rcode, false).unwrap();
    let (qname, _, _) = question(query).unwrap();
    msg[6..8].copy_from_slice(&(records.len() as u16).to_be_bytes());
    for (owner, data) in records {
        if *owner == qname {
            msg.extend_from_slice(&[0xc0, 12]);
        } else {
            encode_name(&mut msg, owner);
        }
        let (rtype, rdata) = match data {
            Rdata::A(a) => (TYPE_A, a.octets().to_vec()),
            Rdata::Aaaa(a) => (TYPE_AAAA, a.octets().to_vec()),
            Rdata::Cname(t) => {
                let mut v = Vec::new();
                encode_name(&mut v, t);
                (TYPE_CNAME, v)
            }
            Rdata::Other => (16, b"\x03txt".to_vec()),
        };
        msg.extend_from_slice(&rtype.to_be_bytes());
        msg.extend_from_slice(&CLASS_IN.to_be_bytes());
        msg.extend_from_slice(&300u32.to_be_bytes());
        msg.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        msg.extend_from_slice(&rdata);
    }
    msg
}

fn a(s: &str) -> Rdata {
    Rdata::A(s.parse().unwrap())
}

#[test]
fn a_query_encodes_its_question_and_refuses_what_is_not_a_host_name() {
    let q = query(0xbeef, "WWW.Example.com.", TYPE_A).unwrap();
    assert_eq!(id(&q).unwrap(), 0xbeef);
    assert!(!is_response(&q));
    assert_eq!(opcode(&q).unwrap(), 0);
    assert_eq!(
        question(&q).unwrap(),
        ("www.example.com".into(), TYPE_A, CLASS_IN)
    );
    assert_eq!(question_end(&q).unwrap(), q.len());
    let long = vec!["a"; 130].join(".");
    for bad in [
        "",
        ".",
        "a..b",
        "a b.com",
        "ex/ample.com",
        &"x".repeat(64),
        &long,
    ] {
        assert!(query(1, bad, TYPE_A).is_err(), "{bad:?} encoded");
    }
    let mut q2 = q.clone();
    set_id(&mut q2, 7);
    assert_eq!(id(&q2).unwrap(), 7);
    assert!(same_question(&q, &q2));
    assert!(!same_question(
        &q,
        &query(1, "example.com", TYPE_A).unwrap()
    ));
    assert!(!same_question(
        &q,
        &query(1, "www.example.com", TYPE_AAAA).unwrap()
    ));
}

#[test]
fn names_follow_backward_pointers_and_refuse_forward_ones_loops_and_length() {
    // "b.a" at 12, then "c" + pointer to 12 at 17.
    let mut m = vec![0u8; 12];
    m.extend_from_slice(&[1, b'b', 1, b'a', 0]);
    m.extend_from_slice(&[1, b'C', 0xc0, 12]);
    assert_eq!(read_name(&m, 12).unwrap(), ("b.a".into(), 17));
    assert_eq!(read_name(&m, 17).unwrap(), ("c.b.a".into(), 21));
    // A pointer to itself, forwards, or into the middle of its own name.
    let mut m = vec![0u8; 12];
    m.extend_from_slice(&[0xc0, 12]);
    assert_eq!(read_name(&m, 12), Err(WireError::BadName));
    let mut m = vec![0u8; 12];
    m.extend_from_slice(&[0xc0, 14, 0]);
    assert_eq!(read_name(&m, 12), Err(WireError::BadName));
    let mut m = vec![0u8; 12];
    m.extend_from_slice(&[1, b'a', 0xc0, 12]);
    assert_eq!(read_name(&m, 12), Err(WireError::BadName));
    // Two pointers that take turns: the second must point before the first's target.
    let mut m = vec![0u8; 12];
    m.extend_from_slice(&[1, b'a', 0xc0, 16, 1, b'b', 0xc0, 12]);
    assert_eq!(read_name(&m, 16), Err(WireError::BadName));
    // Longer than 255 bytes on the wire.
    let mut m = vec![0u8; 12];
    for _ in 0..5 {
        m.push(63);
        m.extend_from_slice(&[b'x'; 63]);
    }
    m.push(0);
    assert_eq!(read_name(&m, 12), Err(WireError::BadName));
    // Reserved label types, truncation, and bytes that need escaping.
    assert_eq!(read_name(&[0x40], 0), Err(WireError::BadName));
    assert_eq!(read_name(&[3, b'a'], 0), Err(WireError::Short));
    assert_eq!(read_name(&[0xc0], 0), Err(WireError::Short));
    assert_eq!(
        read_name(&[3, b'a', b'.', 0, 0], 0).unwrap().0,
        "a\\046\\000"
    );
}

/// Found by the `dns` fuzz target: a question whose name pointed into the header read one way
/// in the query and another in husk's error reply (whose header differs), so the reply did not
/// answer the question asked.
#[test]
fn pointers_into_the_header_are_refused() {
    // "x", then a pointer to the flags (offset 2), which read as a label while RD is set.
    let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    q.extend_from_slice(&[1, b'x', 0xc0, 2, 0, 1, 0, 1]);
    assert_eq!(read_name(&q, 12), Err(WireError::BadName));
    assert_eq!(question(&q), Err(WireError::BadName));
    // So the error reply carries no question rather than a different one.
    let r = empty_reply(&q, RCODE_FORMERR, false).unwrap();
    assert_eq!(r.len(), HEADER_LEN);
    assert_eq!(question(&r), Err(WireError::Questions(0)));
    // A pointer to the first byte after the header is still followed.
    let mut m = vec![0u8; 12];
    m.extend_from_slice(&[1, b'a', 0, 1, b'b', 0xc0, 12]);
    assert_eq!(read_name(&m, 15).unwrap().0, "b.a");
}

#[test]
fn answers_follow_cname_chains_with_the_smallest_ttl() {
    let q = query(1, "www.example.com", TYPE_A).unwrap();
    let r = answer(
        &q,
        RCODE_NOERROR,
        &[
            ("www.example.com", Rdata::Cname("Edge.CDN.net".into())),
            ("other.example", a("192.0.2.99")),
            ("edge.cdn.net", a("203.0.113.1")),
            ("edge.cdn.net", Rdata::Aaaa("2001:db8::1".parse().unwrap())),
            ("edge.cdn.net", Rdata::Other),
        ],
    );
    let parsed = parse_response(&r).unwrap();
    assert_eq!(parsed.rcode, RCODE_NOERROR);
    assert!(!parsed.truncated);
    assert_eq!(parsed.answers.len(), 5);
    assert_eq!(parsed.answers[0].name, "www.example.com");
    let (addrs, ttl) = addresses("WWW.example.com.", &parsed.answers);
    assert_eq!(
        addrs,
        vec![
            "203.0.113.1".parse::<IpAddr>().unwrap(),
            "2001:db8::1".parse().unwrap()
        ]
    );
    assert_eq!(ttl, 300);
    // Unrelated records are not taken for the name's.
    assert!(addresses("nothing.example", &parsed.answers).0.is_empty());
    // A CNAME loop ends the walk.
    let looped = [
        Record {
            name: "a.test".into(),
            ttl: 1,
            data: Rdata::Cname("b.test".into()),
        },
        Record {
            name: "b.test".into(),
            ttl: 1,
            data: Rdata::Cname("a.test".into()),
        },
    ];
    assert!(addresses("a.test", &looped).0.is_empty());
}

#[test]
fn empty_replies_keep_id_and_question() {
    let q = query(0x1234, "x.test", TYPE_AAAA).unwrap();
    let r = empty_reply(&q, RCODE_SERVFAIL, true).unwrap();
    assert_eq!(id(&r).unwrap(), 0x1234);
    assert!(is_response(&r) && truncated(&r));
    assert_eq!(rcode(&r).unwrap(), RCODE_SERVFAIL);
    assert!(same_question(&q, &r));
    assert!(parse_response(&r).unwrap().answers.is_empty());
    // Without a readable question: the header only, no question counted.
    let r = empty_reply(&q[..14], RCODE_FORMERR, false).unwrap();
    assert_eq!(r.len(), HEADER_LEN);
    assert_eq!(u16_at(&r, 4).unwrap(), 0);
    assert!(empty_reply(&q[..11], RCODE_FORMERR, false).is_none());
}

use crate::testutil::XorShift;

fn poke(msg: &[u8]) {
    let _ = question(msg);
    let _ = parse_response(msg);
    let _ = empty_reply(msg, RCODE_SERVFAIL, true);
    for off in 0..msg.len() {
        let _ = read_name(msg, off);
    }
}

#[test]
fn hostile_bytes_never_panic() {
    let q = query(9, "a.example.com", TYPE_A).unwrap();
    let r = answer(
        &q,
        RCODE_NOERROR,
        &[
            ("a.example.com", Rdata::Cname("b.example.com".into())),
            ("b.example.com", a("203.0.113.5")),
        ],
    );
    for cut in 0..=r.len() {
        poke(&r[..cut]);
    }
    let mut rng = XorShift(0x9e3779b97f4a7c15);
    for _ in 0..20_000 {
        let mut m = r.clone();
        for _ in 0..(rng.next() % 4 + 1) {
            let i = (rng.next() as usize) % m.len();
            m[i] = rng.next() as u8;
        }
        poke(&m);
    }
    for _ in 0..2_000 {
        let len = (rng.next() % 300) as usize;
        let m: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        poke(&m);
    }
}
