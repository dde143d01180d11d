//! The archive targets' confinement holds: inside it, writing anywhere but the scratch
//! directory fails with `EROFS` (which the targets count as a finding), and the scratch
//! directory works. Needs root; skipped otherwise. Its own process: the confinement is for good.

use std::fs;
use std::os::unix::fs::MetadataExt;

use husk_fuzz::{is_erofs, Arena};

#[test]
fn writes_outside_the_scratch_directory_fail_with_erofs() {
    // /proc/self belongs to the process's effective user.
    if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) != 0 {
        eprintln!("skipped: the confinement needs root");
        return;
    }
    // The scratch root goes under TMPDIR: keep it in cargo's directory for tests.
    std::env::set_var("TMPDIR", env!("CARGO_TARGET_TMPDIR"));
    let arena = Arena::new();
    fs::write(arena.dest.join("inside"), b"ok").expect("the destination is writable");
    for outside in [
        "/etc/husk-fuzz-probe",
        "/var/husk-fuzz-probe",
        "/root/husk-fuzz-probe",
    ] {
        let err = fs::write(outside, b"no").expect_err(outside);
        assert!(is_erofs(&err), "{outside}: {err}");
        assert!(fs::metadata(outside).is_err());
    }
    // An error that wraps one (as the unpackers' errors do) still counts.
    let wrapped = std::io::Error::other(fs::write("/etc/husk-fuzz-probe", b"no").unwrap_err());
    assert!(is_erofs(&wrapped));
    assert!(!is_erofs(&std::io::Error::other("os error 30")));
    arena.check_contained();
}
