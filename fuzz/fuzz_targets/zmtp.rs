//! ZMTP, the ZeroMQ wire protocol the agent speaks to Jupyter kernels, which run inside the
//! sandbox next to the code they execute (`husk_jupyter::zmtp::Connection`).
//!
//! Two kinds of input. A hostile peer: the bytes a kernel sends, fed in chunks to a connection
//! of each socket type; the events must respect the limits, must not depend on how the bytes
//! were cut, and an error must stick. A loopback: two DEALER connections talk to each other
//! through their outputs, cut at random; every message one sends, the other receives intact
//! and in order.
#![no_main]

use husk_fuzz::{byte, chunks, field, Unstructured};
use husk_jupyter::zmtp::{Config, Connection, Event, Limits, SocketType, ZmtpError};
use libfuzzer_sys::fuzz_target;

fn config(u: &mut Unstructured<'_>) -> Config {
    let socket_type = match byte(u) % 3 {
        0 => SocketType::Dealer,
        1 => SocketType::Sub,
        _ => SocketType::Req,
    };
    let mut config = Config::new(socket_type);
    if byte(u) & 1 == 1 {
        // Small limits, so the bounds are reached by small inputs.
        config.limits = Limits {
            max_frame: u64::from(byte(u)) * 4,
            max_message: u64::from(byte(u)) * 8,
            max_parts: usize::from(byte(u) % 16),
        };
    }
    config
}

/// Feeds `pieces` to a new connection: its events and the error that stopped it, if any.
fn run(config: &Config, pieces: &[&[u8]]) -> (Vec<Event>, Option<ZmtpError>) {
    let mut conn = Connection::new(config.clone()).expect("a valid config");
    if config.socket_type == SocketType::Sub {
        conn.subscribe(b"").expect("a SUB subscribes");
    } else {
        conn.send(&[b"hello"]).expect("queued before the handshake");
    }
    let mut events = Vec::new();
    let mut error = None;
    for piece in pieces {
        let r = conn.receive(piece);
        while let Some(e) = conn.next_event() {
            events.push(e);
        }
        if let Err(e) = r {
            assert_eq!(conn.receive(b"more").unwrap_err(), e, "errors stick");
            assert_eq!(conn.error(), Some(&e));
            assert!(!conn.is_ready());
            error = Some(e);
            break;
        }
    }
    (events, error)
}

fn hostile(u: &mut Unstructured<'_>) {
    let config = config(u);
    let seed = u64::from(byte(u)) | 1;
    let input = u.bytes(u.len()).unwrap_or_default();
    let (events, error) = run(&config, &[input]);
    let cut = run(&config, &chunks(input, seed, 32));
    assert_eq!(events, cut.0, "events depend on how the bytes were cut");
    // The kind of error; its details may differ (a version refused before its minor arrived).
    let kind = |e: &Option<ZmtpError>| e.as_ref().map(std::mem::discriminant);
    assert_eq!(kind(&error), kind(&cut.1), "{error:?} vs {:?}", cut.1);
    let limits = config.limits;
    for (i, e) in events.iter().enumerate() {
        match e {
            Event::Ready(info) => {
                assert_eq!(i, 0, "READY after other events");
                assert_eq!(info.version.0, 3);
            }
            Event::Message(parts) => {
                assert!(
                    matches!(events.first(), Some(Event::Ready(_))),
                    "message before READY"
                );
                assert!(parts.len() <= limits.max_parts);
                let total: u64 = parts.iter().map(|p| p.len() as u64).sum();
                assert!(total <= limits.max_message);
                assert!(parts.iter().all(|p| p.len() as u64 <= limits.max_frame));
            }
        }
    }
}

/// Moves what `from` has to send into `to`, in pieces.
fn pump(from: &mut Connection, to: &mut Connection, seed: u64) {
    let out = from.output().to_vec();
    for piece in chunks(&out, seed, 48) {
        to.receive(piece).expect("a well-behaved peer");
    }
    from.consume_output(out.len());
}

fn loopback(u: &mut Unstructured<'_>) {
    let seed = u64::from(byte(u)) | 1;
    let mut a = Connection::new(Config::new(SocketType::Dealer)).unwrap();
    let mut b = Connection::new(Config::new(SocketType::Dealer)).unwrap();
    let mut sent = Vec::new();
    // Some messages go out before the handshake (queued), the rest after.
    let early = byte(u) % 3;
    for i in 0..byte(u) % 6 {
        if i == early {
            pump(&mut a, &mut b, seed);
            pump(&mut b, &mut a, seed ^ 0x55);
        }
        let parts: Vec<Vec<u8>> = (0..1 + byte(u) % 4)
            .map(|_| field(u, 300).to_vec())
            .collect();
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        a.send(&refs).expect("send");
        sent.push(parts);
    }
    pump(&mut a, &mut b, seed);
    pump(&mut b, &mut a, seed ^ 0x55);
    pump(&mut a, &mut b, seed);
    assert!(
        a.is_ready() && b.is_ready(),
        "the handshake did not complete"
    );
    let mut got = Vec::new();
    while let Some(e) = b.next_event() {
        match e {
            Event::Ready(info) => assert_eq!(info.socket_type, "DEALER"),
            Event::Message(parts) => got.push(parts),
        }
    }
    assert_eq!(got, sent, "messages changed on the way");
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    if byte(&mut u).is_multiple_of(4) {
        loopback(&mut u);
    } else {
        hostile(&mut u);
    }
});
