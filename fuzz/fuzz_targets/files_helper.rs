//! The files helper's requests (`husk_core::workspaces::remote::fuzzing`): what the server
//! sends the privileged helper that holds the workspaces, hostile once the server runs
//! unprivileged. The input is a frame (its length in the first two bytes) and the bytes of
//! the stream that comes with an upload; each request is handled against workspaces of the
//! target's own in a fresh scratch directory, where team `t`'s workspace `w` holds a file and
//! a symlink out of it (as a sandbox could leave), and beside the state directory lies a file
//! nothing may touch.
//!
//! Checks: a decoded request encodes again to the same bytes; the reply always fits one
//! frame; nothing outside the workspaces changes (confined as root, a write there fails with
//! `EROFS`), and a file the helper opens for reading is never the one outside.
#![no_main]

use husk_core::workspaces::remote::{fuzzing, FilesReply, WireWorkspaceError};
use husk_core::workspaces::LocalWorkspaces;
use husk_fuzz::{Arena, SENTINEL};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // As in every husk process (the helpers, and Rust's own main, which libFuzzer's replaces):
    // a write to a pipe the helper stopped reading is an error, not a signal.
    static IGNORED: std::sync::Once = std::sync::Once::new();
    IGNORED.call_once(|| husk_runtime::sys::ignore_signal(husk_runtime::libc::SIGPIPE));
    if data.len() < 2 {
        return;
    }
    let len = usize::from(u16::from_le_bytes([data[0], data[1]])).min(data.len() - 2);
    let (frame, stream) = data[2..].split_at(len);
    let arena = Arena::new();
    let ws = LocalWorkspaces::open(&arena.dest).expect("workspaces in the scratch directory");
    ws.create("t", "w").expect("a workspace");
    ws.write_file("t", "w", "dir/f.txt", &b"content"[..], 1 << 20)
        .expect("a file");
    let link = arena.dest.join("workspaces/t/w/out");
    std::os::unix::fs::symlink("../../../../outside/file", link).expect("a symlink");
    let Some((encoded, reply, content)) = fuzzing::request(frame, &ws, stream) else {
        return;
    };
    let size = postcard::to_stdvec(&reply).expect("a reply encodes").len();
    assert!(size <= husk_runtime::helper::MAX_MESSAGE, "a reply of {size} bytes");
    if let FilesReply::Workspace(WireWorkspaceError::Io { errno, .. }) = &reply {
        assert_ne!(
            *errno,
            Some(husk_runtime::libc::EROFS),
            "a write outside the workspaces: {reply:?}"
        );
    }
    if let Some(content) = content {
        assert_ne!(content, SENTINEL, "the file outside was opened");
    }
    arena.check_contained();
    // Removing a paused sandbox's layers removes nothing of the workspaces beside them.
    if matches!(
        postcard::from_bytes::<husk_core::workspaces::remote::FilesRequest>(&encoded),
        Ok(husk_core::workspaces::remote::FilesRequest::DropLayers { .. })
    ) {
        assert!(
            arena.dest.join("workspaces/t/w/dir/f.txt").exists(),
            "a layer removal reached the workspaces: {reply:?}"
        );
    }
    // Once more from the encoded bytes, in a fresh place: the same request.
    let again: husk_core::workspaces::remote::FilesRequest =
        postcard::from_bytes(&encoded).expect("decodes again");
    assert_eq!(
        postcard::to_stdvec(&again).expect("encodes"),
        encoded,
        "a request changed when encoded again"
    );
});
