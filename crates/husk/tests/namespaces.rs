//! After a sandbox ends, no process on the host is left in any of its namespaces.
//!
//! This test has its own test binary on purpose: namespace inode numbers are reused as soon as a
//! namespace is freed, so a sandbox of a test running in parallel could be handed the very
//! number this test checks. Test binaries run one after another, so here no other sandbox runs.

mod common;
use common::*;

#[test]
fn namespaces_are_gone_after_a_normal_exit() {
    let r = husk_run(
        &[],
        &[
            "/bin/sh",
            "-c",
            "readlink /proc/self/ns/net /proc/self/ns/mnt /proc/self/ns/pid /proc/self/ns/user",
        ],
    );
    r.ok();
    let links: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(links.len(), 4, "{}", r.stdout);
    for (kind, link) in ["net", "mnt", "pid", "user"].iter().zip(&links) {
        assert!(link.starts_with(kind), "{link}");
        // The sandbox's namespaces differ from the test's own...
        let ours = std::fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
        assert_ne!(ours.to_string_lossy(), *link);
        // ...and no process on the host lives in them any more.
        assert_namespace_gone(kind, link);
    }
}
