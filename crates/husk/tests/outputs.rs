//! `--output` and `--copy`: files cross the sandbox boundary only as regular files and
//! directories, never through a symlink, within quotas.

mod common;
use common::*;

use std::fs;
use std::os::unix::fs::MetadataExt;

#[test]
fn outputs_are_copied_and_symlinks_are_not_followed() {
    let out = TempDir::new("out");
    let dest = out.path().join("result");
    let spec = format!("/home/user/out:{}", dest.display());
    let r = husk_run(
        &["--output", &spec],
        &[
            "/bin/sh",
            "-c",
            "mkdir -p out/sub && echo A > out/a.txt && head -c 100000 /dev/urandom > out/sub/b.bin && \
             (chmod 4755 out/a.txt || chmod 755 out/a.txt); ln -s /etc/shadow out/leak && ln -s / out/root && mkfifo out/pipe && \
             sha256sum out/sub/b.bin | cut -d' ' -f1",
        ],
    );
    r.ok();
    assert_eq!(fs::read_to_string(dest.join("a.txt")).unwrap(), "A\n");
    let bin = fs::read(dest.join("sub/b.bin")).unwrap();
    assert_eq!(bin.len(), 100_000);
    let sum = std::process::Command::new("sha256sum")
        .arg(dest.join("sub/b.bin"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&sum.stdout)
            .split_whitespace()
            .next(),
        Some(r.stdout.trim())
    );
    // The set-uid chmod is refused inside (seccomp), the plain one kept; symlinks and FIFOs
    // are reported, not copied.
    assert_eq!(
        fs::metadata(dest.join("a.txt")).unwrap().mode() & 0o7777,
        0o755
    );
    for skipped in ["leak", "root", "pipe"] {
        assert!(
            fs::symlink_metadata(dest.join(skipped)).is_err(),
            "{skipped} was copied"
        );
    }
    assert!(
        r.stderr.contains("skipped leak (symlink -> /etc/shadow"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("skipped pipe (fifo"), "{}", r.stderr);
}

#[test]
fn an_output_dir_that_is_a_symlink_is_refused() {
    let out = TempDir::new("outlink");
    let spec = format!("/home/user/out:{}", out.path().join("r").display());
    let r = husk_run(
        &["--output", &spec],
        &["/bin/ln", "-s", "/etc", "/home/user/out"],
    );
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("symlink"), "{}", r.stderr);
    let copied: Vec<_> = fs::read_dir(out.path().join("r"))
        .map(|d| d.flatten().collect())
        .unwrap_or_default();
    assert!(copied.is_empty(), "{copied:?}");
}

#[test]
fn output_limits_are_enforced_with_a_clear_message() {
    let out = TempDir::new("quota");
    let spec = format!("/home/user/out:{}", out.path().display());
    let r = husk_run(
        &["--output", &spec, "--output-limit", "64k"],
        &[
            "/bin/sh",
            "-c",
            "mkdir out && head -c 200000 /dev/zero > out/big",
        ],
    );
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("output limit exceeded"), "{}", r.stderr);
    assert!(
        fs::metadata(out.path().join("big"))
            .map(|m| m.len())
            .unwrap_or(0)
            <= 64 << 10
    );

    let r = husk_run(
        &["--output", &spec, "--output-limit", "1M:5"],
        &[
            "/bin/sh",
            "-c",
            "mkdir out && for i in 1 2 3 4 5 6 7 8 9 10; do echo $i > out/f$i; done",
        ],
    );
    assert_eq!(r.code, 125);
    assert!(r.stderr.contains("output limit exceeded"), "{}", r.stderr);
    assert!(fs::read_dir(out.path()).unwrap().count() <= 5);
}

#[test]
fn copy_puts_files_into_the_writable_layer_owned_by_the_user() {
    let src = TempDir::new("copy");
    fs::write(src.path().join("data.csv"), "a,b\n1,2\n").unwrap();
    fs::create_dir(src.path().join("nested")).unwrap();
    fs::write(src.path().join("nested/x.py"), "print(6*7)\n").unwrap();
    let spec = format!("{}:/home/user/project", src.path().display());
    let r = husk_run(
        &["--copy", &spec],
        &[
            "/bin/sh",
            "-c",
            "cd project && cat data.csv && python3 nested/x.py && stat -c %U nested/x.py && echo more >> data.csv && echo ok",
        ],
    );
    r.ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines, ["a,b", "1,2", "42", "user", "ok"]);
    // The host's copy is untouched.
    assert_eq!(
        fs::read_to_string(src.path().join("data.csv")).unwrap(),
        "a,b\n1,2\n"
    );
}

#[test]
fn a_sandbox_cannot_redirect_the_output_destination_through_a_writable_mount() {
    let job = TempDir::new("job");
    let victim = TempDir::new("victim");
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(job.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let mount = format!("{}:/job:rw", job.path().display());
    let output = format!("/home/user/out:{}", job.path().join("results").display());
    // The sandbox swaps the destination for a symlink to a directory of its choice.
    let script = format!(
        "mkdir -p out && echo pwned > out/evil && rm -rf /job/results && ln -s {} /job/results",
        victim.path().display()
    );
    let r = husk_run(
        &["--mount", &mount, "--output", &output],
        &["/bin/sh", "-c", &script],
    );
    // husk opened the destination before the sandbox ran: the copy goes to the directory that
    // was there (now deleted, so it fails) and never through the symlink.
    assert_eq!(r.code, 125, "{}", r.stderr);
    assert!(r.stderr.contains("cannot create host path"), "{}", r.stderr);
    assert_eq!(
        fs::read_dir(victim.path()).unwrap().count(),
        0,
        "husk wrote through the sandbox's symlink"
    );
}
