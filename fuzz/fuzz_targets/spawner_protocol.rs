//! The spawner's two inbound protocols. Requests from the server (`service::fuzzing::request`:
//! decoded and checked as the spawner's loop does; hostile once the server runs unprivileged),
//! and the control messages a sandbox's PID 1 sends it (`control::recv_from_init`, over a real
//! SOCK_SEQPACKET pair, with file descriptors attached).
//!
//! Checks: a decoded request encodes again to bytes that decode to the same request and the
//! same verdict; a control message is accepted only in range (exit code 0-255, signal 1-64),
//! with a descriptor only on `Ready` and at most one; every descriptor received is closed
//! again (none leaks); an accepted message sent again by `send_from_init` reads the same.
#![no_main]

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, RawFd};

use husk_fuzz::{byte, Unstructured};
use husk_runtime::control::{recv_from_init, send_from_init, FromInit, MAX_MESSAGE};
use husk_runtime::service::fuzzing;
use husk_runtime::sys::{self, ExitStatus};
use libfuzzer_sys::fuzz_target;

/// The lowest free descriptor number: a descriptor leaked since the last call takes it.
fn lowest_free_fd() -> RawFd {
    File::open("/dev/null").expect("/dev/null").as_raw_fd()
}

/// A message's content, descriptors aside (their numbers change when they are passed).
fn shape(msg: &FromInit) -> String {
    match msg {
        FromInit::Ready { pty_master } => format!("Ready({})", pty_master.is_some()),
        FromInit::Layer { .. } => "Layer".to_owned(),
        other => format!("{other:?}"),
    }
}

fn control(datagram: &[u8], nfds: usize) {
    let before = lowest_free_fd();
    {
        let (init, spawner) = sys::seqpacket_pair().expect("a socket pair");
        let null = File::open("/dev/null").expect("/dev/null");
        let fds = vec![null.as_raw_fd(); nfds];
        if sys::send_with_fds(init.as_fd(), datagram, &fds).is_err() {
            return;
        }
        let Ok(Some(msg)) = recv_from_init(spawner.as_fd()) else {
            return;
        };
        assert!(!datagram.is_empty());
        match &msg {
            FromInit::Exited(ExitStatus::Exited(c)) => assert!((0..=255).contains(c)),
            FromInit::Exited(ExitStatus::Signaled(s)) => assert!((1..=64).contains(s)),
            FromInit::Ready { pty_master } => {
                assert!(nfds <= 1, "{nfds} descriptors accepted with Ready");
                assert_eq!(pty_master.is_some(), nfds == 1, "a descriptor was lost");
            }
            FromInit::Layer { .. } => {
                assert_eq!(nfds, 1, "a layer came with {nfds} descriptors");
                assert_eq!(datagram.len(), 1, "a layer message with a body was accepted");
            }
            FromInit::SetupFailed(text) => {
                assert!(datagram.len() <= MAX_MESSAGE);
                // Invalid UTF-8 becomes U+FFFD (three bytes for one).
                assert!(text.len() <= 3 * (MAX_MESSAGE - 1));
                assert_eq!(nfds, 0);
            }
            _ => assert_eq!(nfds, 0, "descriptors accepted with {msg:?}"),
        }
        // What init's own sender makes of the message reads back the same.
        if send_from_init(init.as_fd(), &msg).is_ok() {
            let again = recv_from_init(spawner.as_fd()).expect("a message init sent");
            let again = again.expect("init's end is open");
            let expected = match &msg {
                // The sender cuts text to fit one message, on a character boundary.
                FromInit::SetupFailed(t) if t.len() > MAX_MESSAGE - 1 => {
                    let mut end = MAX_MESSAGE - 1;
                    while !t.is_char_boundary(end) {
                        end -= 1;
                    }
                    format!("{:?}", FromInit::SetupFailed(t[..end].to_string()))
                }
                m => shape(m),
            };
            assert_eq!(shape(&again), expected);
        }
    }
    assert_eq!(lowest_free_fd(), before, "a descriptor leaked");
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let mode = byte(&mut u);
    let rest = u.take_rest();
    if mode & 1 == 0 {
        control(rest, usize::from(mode >> 1) % 4);
        return;
    }
    let Some(read) = fuzzing::request(rest) else {
        return;
    };
    let encoded = read.encoded.expect("a decoded request encodes");
    let again = fuzzing::request(&encoded).expect("an encoded request decodes");
    assert_eq!(
        again.encoded.expect("encodes"),
        encoded,
        "a request changed when encoded again"
    );
    assert_eq!(
        read.verdict, again.verdict,
        "the verdict changed across a round trip"
    );
});
