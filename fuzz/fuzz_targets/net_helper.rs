//! The network helper's requests (`husk_net::helper::fuzzing`): what the server sends the
//! privileged helper that holds the router and makes sockets in sandboxes' namespaces, hostile
//! once the server runs unprivileged. Each datagram is decoded and handled as a helper without
//! egress would, with a descriptor attached or not (`/dev/null`, never a namespace).
//!
//! Checks: a decoded request encodes again to the same bytes' meaning (decodes to the same
//! encoding); the reply is a typed failure for anything but a well-formed request (no link is
//! ever found, no socket made and no link made again from a descriptor that is not a network
//! namespace; nothing to prune); every
//! descriptor passed in is closed again (none leaks).
#![no_main]

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use husk_fuzz::{byte, Unstructured};
use husk_net::helper::{fuzzing, Reply};
use libfuzzer_sys::fuzz_target;

/// The lowest free descriptor number: a descriptor leaked since the last call takes it.
fn lowest_free_fd() -> RawFd {
    File::open("/dev/null").expect("/dev/null").as_raw_fd()
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let with_fd = byte(&mut u) & 1 == 1;
    let datagram = u.take_rest();
    let before = lowest_free_fd();
    {
        let fd = with_fd.then(|| OwnedFd::from(File::open("/dev/null").expect("/dev/null")));
        if let Some((encoded, reply)) = fuzzing::request(datagram, fd) {
            let (again, _) = fuzzing::request(&encoded, None).expect("an encoded request decodes");
            assert_eq!(again, encoded, "a request changed when encoded again");
            // Without egress there is no link to prune either.
            assert!(
                matches!(reply, Reply::Failed(_) | Reply::Pruned(0)),
                "a helper without egress, given no namespace, answered {reply:?}"
            );
        }
    }
    assert_eq!(lowest_free_fd(), before, "a descriptor leaked");
});
