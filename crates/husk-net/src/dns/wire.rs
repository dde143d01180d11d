//! The few pieces of the DNS wire format (RFC 1035) the resolver needs: the header, one
//! question, and the answer section's A, AAAA and CNAME records. Every read is bounds-checked:
//! messages come from sandboxes and from the network, and hostile bytes give an error, never a
//! panic. Names are followed through compression pointers that must point backwards (so they
//! cannot loop) and are bounded by the 255-byte wire limit.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const HEADER_LEN: usize = 12;
pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
pub const CLASS_IN: u16 = 1;

pub const RCODE_NOERROR: u8 = 0;
pub const RCODE_FORMERR: u8 = 1;
pub const RCODE_SERVFAIL: u8 = 2;
pub const RCODE_NXDOMAIN: u8 = 3;
pub const RCODE_NOTIMP: u8 = 4;
pub const RCODE_REFUSED: u8 = 5;

/// The longest name on the wire, length bytes included (RFC 1035 §2.3.4).
const MAX_NAME_WIRE: usize = 255;
/// The longest label.
const MAX_LABEL: usize = 63;
/// Most answer records read from one message (the rest are ignored).
const MAX_ANSWERS: usize = 256;
/// Most CNAME hops followed from the question's name.
const MAX_CNAME_HOPS: usize = 8;

const FLAG_QR: u16 = 0x8000;
const FLAG_TC: u16 = 0x0200;
const FLAG_RD: u16 = 0x0100;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// The message ends inside a field.
    #[error("DNS message truncated")]
    Short,
    /// A name is malformed: a reserved label type, a forward or looping pointer, too long.
    #[error("malformed name in DNS message")]
    BadName,
    /// Not one question.
    #[error("DNS message has {0} questions, expected 1")]
    Questions(u16),
    /// A name we were asked to encode is not a host name.
    #[error("invalid host name {0:?}")]
    BadHost(String),
}

fn u16_at(msg: &[u8], off: usize) -> Result<u16, WireError> {
    match msg.get(off..off.checked_add(2).ok_or(WireError::Short)?) {
        Some(b) => Ok(u16::from_be_bytes([b[0], b[1]])),
        None => Err(WireError::Short),
    }
}

fn u32_at(msg: &[u8], off: usize) -> Result<u32, WireError> {
    match msg.get(off..off.checked_add(4).ok_or(WireError::Short)?) {
        Some(b) => Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]])),
        None => Err(WireError::Short),
    }
}

/// The message's id.
pub fn id(msg: &[u8]) -> Result<u16, WireError> {
    u16_at(msg, 0)
}

/// Replaces the message's id (no-op on a message shorter than a header).
pub fn set_id(msg: &mut [u8], id: u16) {
    if let Some(b) = msg.get_mut(..2) {
        b.copy_from_slice(&id.to_be_bytes());
    }
}

/// The header's flags word (QR, opcode, AA, TC, RD, RA, Z, rcode).
pub fn flags(msg: &[u8]) -> Result<u16, WireError> {
    u16_at(msg, 2)
}

pub fn is_response(msg: &[u8]) -> bool {
    flags(msg).is_ok_and(|f| f & FLAG_QR != 0)
}

pub fn opcode(msg: &[u8]) -> Result<u8, WireError> {
    Ok(((flags(msg)? >> 11) & 0xf) as u8)
}

pub fn rcode(msg: &[u8]) -> Result<u8, WireError> {
    Ok((flags(msg)? & 0xf) as u8)
}

pub fn truncated(msg: &[u8]) -> bool {
    flags(msg).is_ok_and(|f| f & FLAG_TC != 0)
}

/// Reads the name at `off`; returns it (lowercase, labels joined by dots, no trailing dot, the
/// root as "") and the offset just past it where it starts (not where a pointer led).
/// Bytes that would be ambiguous in text (`.`, `\`, anything not printable ASCII) are written
/// `\DDD`, so two different wire names never read the same. A pointer into the header is
/// refused: the header holds no name, and a name read from it would change when the header
/// does (an error reply's, or the id husk gives a forwarded query).
pub fn read_name(msg: &[u8], off: usize) -> Result<(String, usize), WireError> {
    let mut name = String::new();
    let mut pos = off;
    // Where reading continues in the message after this name: set at the first pointer.
    let mut end = None;
    // Every pointer must point before the label that holds it, so each hop moves strictly
    // backwards and the walk ends.
    let mut limit = off;
    let mut wire_len = 0usize;
    loop {
        let len = *msg.get(pos).ok_or(WireError::Short)? as usize;
        match len & 0xc0 {
            0x00 => {
                wire_len += len + 1;
                if wire_len > MAX_NAME_WIRE {
                    return Err(WireError::BadName);
                }
                if len == 0 {
                    return Ok((name, end.unwrap_or(pos + 1)));
                }
                let label = msg.get(pos + 1..pos + 1 + len).ok_or(WireError::Short)?;
                if !name.is_empty() {
                    name.push('.');
                }
                for &b in label {
                    match b {
                        b'.' | b'\\' => name.push_str(&format!("\\{b:03}")),
                        0x21..=0x7e => name.push(b.to_ascii_lowercase() as char),
                        _ => name.push_str(&format!("\\{b:03}")),
                    }
                }
                pos += 1 + len;
            }
            0xc0 => {
                let lo = *msg.get(pos + 1).ok_or(WireError::Short)? as usize;
                let target = ((len & 0x3f) << 8) | lo;
                if target >= limit || target < HEADER_LEN {
                    return Err(WireError::BadName);
                }
                end.get_or_insert(pos + 2);
                limit = target;
                pos = target;
            }
            // 0x40 and 0x80: extended and reserved label types (RFC 6891 deprecated them).
            _ => return Err(WireError::BadName),
        }
    }
}

/// Where the (single) question ends: the offset of the answer section.
pub fn question_end(msg: &[u8]) -> Result<usize, WireError> {
    if msg.len() < HEADER_LEN {
        return Err(WireError::Short);
    }
    let qd = u16_at(msg, 4)?;
    if qd != 1 {
        return Err(WireError::Questions(qd));
    }
    let (_, pos) = read_name(msg, HEADER_LEN)?;
    let end = pos + 4;
    if msg.len() < end {
        return Err(WireError::Short);
    }
    Ok(end)
}

/// The question: name, type, class.
pub fn question(msg: &[u8]) -> Result<(String, u16, u16), WireError> {
    let end = question_end(msg)?;
    let (name, _) = read_name(msg, HEADER_LEN)?;
    Ok((name, u16_at(msg, end - 4)?, u16_at(msg, end - 2)?))
}

/// Whether `response` answers the question `query` asked (so a stray or forged datagram that
/// happens to carry the right id is still not taken for the answer).
pub fn same_question(query: &[u8], response: &[u8]) -> bool {
    match (question(query), question(response)) {
        (Ok(q), Ok(r)) => q == r,
        _ => false,
    }
}

/// A query for `name` of type `qtype`, recursion desired. `name` must be a host name: labels of
/// letters, digits, `-` and `_`, 1 to 63 bytes each, 253 bytes in all.
pub fn query(id: u16, name: &str, qtype: u16) -> Result<Vec<u8>, WireError> {
    let name = name.strip_suffix('.').unwrap_or(name);
    let bad = || WireError::BadHost(name.to_owned());
    if name.is_empty() || name.len() > 253 {
        return Err(bad());
    }
    let mut msg = Vec::with_capacity(HEADER_LEN + name.len() + 6);
    msg.extend_from_slice(&id.to_be_bytes());
    msg.extend_from_slice(&FLAG_RD.to_be_bytes());
    msg.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        let ok = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
        if label.is_empty() || label.len() > MAX_LABEL || !label.bytes().all(ok) {
            return Err(bad());
        }
        msg.push(label.len() as u8);
        msg.extend(label.bytes().map(|b| b.to_ascii_lowercase()));
    }
    msg.push(0);
    msg.extend_from_slice(&qtype.to_be_bytes());
    msg.extend_from_slice(&CLASS_IN.to_be_bytes());
    Ok(msg)
}

/// A reply to `query` carrying no records: the query's header and question (when it has a
/// readable one) with QR set and `rcode`, and TC when `truncated` (the client retries over
/// TCP). `None` when `query` is not even a header.
pub fn empty_reply(query: &[u8], rcode: u8, truncated: bool) -> Option<Vec<u8>> {
    let header = query.get(..HEADER_LEN)?;
    let question = question_end(query).ok();
    let mut msg = Vec::with_capacity(question.unwrap_or(HEADER_LEN));
    msg.extend_from_slice(header);
    let mut f = u16::from_be_bytes([header[2], header[3]]);
    // Keep opcode and RD; set QR (and TC); the rest (AA, RA, AD, CD, rcode) start clear.
    f = (f & 0x7900) | FLAG_QR | (rcode as u16 & 0xf);
    if truncated {
        f |= FLAG_TC;
    }
    msg[2..4].copy_from_slice(&f.to_be_bytes());
    let qd = u16::from(question.is_some());
    msg[4..6].copy_from_slice(&qd.to_be_bytes());
    msg[6..12].fill(0);
    if let Some(end) = question {
        msg.extend_from_slice(&query[HEADER_LEN..end]);
    }
    Some(msg)
}

/// What an answer record says (only what the lookup uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rdata {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Cname(String),
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: String,
    pub ttl: u32,
    pub data: Rdata,
}

/// A response's rcode, TC flag and answer records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub rcode: u8,
    pub truncated: bool,
    pub answers: Vec<Record>,
}

/// Parses a response's answer section (class IN records; others are skipped).
pub fn parse_response(msg: &[u8]) -> Result<Response, WireError> {
    let mut pos = question_end(msg)?;
    let count = (u16_at(msg, 6)? as usize).min(MAX_ANSWERS);
    let mut answers = Vec::with_capacity(count.min(16));
    for _ in 0..count {
        let (name, after) = read_name(msg, pos)?;
        let rtype = u16_at(msg, after)?;
        let class = u16_at(msg, after + 2)?;
        let ttl = u32_at(msg, after + 4)?;
        let len = u16_at(msg, after + 8)? as usize;
        let start = after + 10;
        let rdata = msg.get(start..start + len).ok_or(WireError::Short)?;
        pos = start + len;
        if class != CLASS_IN {
            continue;
        }
        let data = match rtype {
            TYPE_A => Rdata::A(Ipv4Addr::from(
                <[u8; 4]>::try_from(rdata).map_err(|_| WireError::Short)?,
            )),
            TYPE_AAAA => Rdata::Aaaa(Ipv6Addr::from(
                <[u8; 16]>::try_from(rdata).map_err(|_| WireError::Short)?,
            )),
            TYPE_CNAME => {
                let (target, end) = read_name(msg, start)?;
                if end != pos {
                    return Err(WireError::BadName);
                }
                Rdata::Cname(target)
            }
            _ => Rdata::Other,
        };
        answers.push(Record { name, ttl, data });
    }
    Ok(Response {
        rcode: rcode(msg)?,
        truncated: truncated(msg),
        answers,
    })
}

/// The addresses `name` has in `answers`, following CNAME records from it (a bounded number of
/// hops; a loop just ends the walk), and the smallest TTL along the way.
pub fn addresses(name: &str, answers: &[Record]) -> (Vec<IpAddr>, u32) {
    let mut name = name.trim_end_matches('.').to_ascii_lowercase();
    let mut ttl = u32::MAX;
    for _ in 0..=MAX_CNAME_HOPS {
        let mut found = Vec::new();
        for r in answers.iter().filter(|r| r.name == name) {
            match r.data {
                Rdata::A(a) => found.push((IpAddr::V4(a), r.ttl)),
                Rdata::Aaaa(a) => found.push((IpAddr::V6(a), r.ttl)),
                _ => {}
            }
        }
        if !found.is_empty() {
            let min = found.iter().map(|f| f.1).min().unwrap_or(0);
            return (found.into_iter().map(|f| f.0).collect(), ttl.min(min));
        }
        let next = answers.iter().find_map(|r| match &r.data {
            Rdata::Cname(t) if r.name == name => Some((t.clone(), r.ttl)),
            _ => None,
        });
        match next {
            Some((target, t)) => {
                ttl = ttl.min(t);
                name = target;
            }
            None => break,
        }
    }
    (Vec::new(), 0)
}

#[cfg(test)]
pub(crate) mod tests;
