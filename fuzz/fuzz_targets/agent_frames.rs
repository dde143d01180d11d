//! The agent protocol's framing and messages (`husk_proto`), read by both of its readers: the
//! blocking `read_frame` and the agent's own non-blocking `husk_agent::conn::Conn::receive`
//! (over a real socket pair), plus the sandbox-internal sudo protocol's datagrams, which come
//! from code inside the sandbox.
//!
//! Checks: a frame longer than `MAX_FRAME` is refused before it is read; every decoded message
//! encodes again and decodes to the same value; the two frame readers agree on the messages a
//! byte stream holds and on whether it breaks the protocol.
#![no_main]

use std::io::{Cursor, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

use husk_agent::conn::Conn;
use husk_fuzz::{byte, Unstructured};
use husk_proto::sudo::{SudoReply, SudoToAgent};
use husk_proto::{FromAgent, ProtoError, ToAgent, MAX_FRAME};
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Decodes `payload` as `T`; if it decodes, checks that the value survives a round trip.
fn round_trip<T>(payload: &[u8]) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    let msg: T = husk_proto::decode(payload).ok()?;
    // What the agent or the server sends is bounded by MAX_FRAME: larger values cannot be sent.
    if let Ok(frame) = husk_proto::encode(&msg) {
        let back: T = husk_proto::decode(&frame[4..]).expect("an encoded message decodes");
        assert_eq!(back, msg, "a message changed across a frame");
    }
    Some(msg)
}

/// How a byte stream ends, read frame by frame with `read_frame`.
#[derive(Debug, PartialEq)]
enum End {
    /// At a frame boundary, or inside an incomplete frame (more may come).
    Clean,
    /// A frame over the limit, or a payload that is not a message.
    Broken,
}

fn reference(stream: &[u8]) -> (Vec<ToAgent>, End) {
    let mut r = Cursor::new(stream);
    let mut msgs = Vec::new();
    loop {
        match husk_proto::read_frame(&mut r) {
            Ok(None) => return (msgs, End::Clean),
            Ok(Some(payload)) => {
                assert!(payload.len() <= MAX_FRAME);
                let as_reply: Option<FromAgent> = round_trip(&payload);
                let _ = as_reply;
                match round_trip::<ToAgent>(&payload) {
                    Some(m) => msgs.push(m),
                    None => return (msgs, End::Broken),
                }
            }
            Err(ProtoError::TooLarge(n)) => {
                assert!(n > MAX_FRAME);
                return (msgs, End::Broken);
            }
            // The stream ended inside a payload: the agent waits for the rest.
            Err(ProtoError::Io(_)) => return (msgs, End::Clean),
            Err(ProtoError::Malformed(_)) => unreachable!("read_frame does not decode"),
        }
    }
}

fn socket() -> (UnixStream, Conn) {
    let (ours, theirs) = UnixStream::pair().expect("a socket pair");
    let conn = Conn::new(OwnedFd::from(theirs)).expect("a connection");
    (ours, conn)
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mode = byte(&mut u);
    let rest = u.take_rest();
    if mode & 1 == 1 {
        // Sudo: one datagram from sandboxed code, and the agent's reply.
        let _: Option<SudoToAgent> = round_trip_datagram(rest);
        let _: Option<SudoReply> = round_trip_datagram(rest);
        return;
    }
    // The stream as the peer wrote it; socket buffers hold far more than a fuzz input.
    if rest.len() > 64 << 10 {
        return;
    }
    let (expected, end) = reference(rest);
    let (mut peer, mut conn) = socket();
    peer.write_all(rest).expect("write to the agent's socket");
    if mode & 2 == 2 {
        // The server closed its end after writing.
        drop(peer);
        let got = conn.receive();
        check(got, &expected, &end);
        assert!(conn.closed, "end of stream not noticed");
    } else {
        check(conn.receive(), &expected, &end);
        assert!(!conn.closed);
    }
});

fn check(got: Result<Vec<ToAgent>, ProtoError>, expected: &[ToAgent], end: &End) {
    match (got, end) {
        (Ok(msgs), End::Clean) => assert_eq!(msgs, expected, "the two frame readers disagree"),
        (Err(_), End::Broken) => {}
        (got, end) => panic!("the readers disagree: agent {got:?}, read_frame {end:?}"),
    }
}

/// A sudo datagram: postcard without a length prefix.
fn round_trip_datagram<T>(datagram: &[u8]) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug,
{
    let msg: T = postcard::from_bytes(datagram).ok()?;
    let bytes = postcard::to_stdvec(&msg).expect("a decoded message encodes");
    assert!(
        bytes.len() <= datagram.len(),
        "a message grew when encoded again"
    );
    let back: T = postcard::from_bytes(&bytes).expect("an encoded message decodes");
    assert_eq!(back, msg);
    Some(msg)
}
