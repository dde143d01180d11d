//! Bad input: one clear line, a non-zero exit, and nothing left behind.

mod common;
use common::*;

use std::process::{Command, Stdio};

fn err_of(args: &[&str]) -> (i32, String) {
    let out = husk(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_flags_are_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "--memory", "12X", "--", "true"],
            "--memory: invalid size unit",
        ),
        (
            &["run", "--timeout", "0s", "--", "true"],
            "--timeout: duration \"0s\" must be positive",
        ),
        (&["run", "--cpus", "zero", "--", "true"], "invalid --cpus"),
        (
            &["run", "--user", "admin", "--", "true"],
            "invalid --user \"admin\"",
        ),
        (
            &["run", "--env", "NOEQUALS", "--", "true"],
            "expected KEY=VALUE",
        ),
        (
            &["run", "--mount", "/definitely/not/here:/x", "--", "true"],
            "does not exist",
        ),
        (
            &["run", "--mount", "/tmp:relative", "--", "true"],
            "must be absolute",
        ),
        (
            &["run", "--copy", "/definitely/not/here:/x", "--", "true"],
            "does not exist",
        ),
        (
            &["run", "--output", "nocolon", "--", "true"],
            "expected SANDBOX_DIR:HOST_DIR",
        ),
        (
            &["run", "--hostname", "bad host!", "--", "true"],
            "invalid hostname",
        ),
        (&["run", "--memory", "1M", "--", "true"], "at least 4 MiB"),
        (&["run", "--workdir", "../x", "--", "true"], "workdir"),
    ];
    for (args, want) in cases {
        let (code, err) = err_of(args);
        assert_eq!(code, 125, "{args:?}: {err}");
        assert!(err.starts_with("husk: "), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: expected {want:?} in {err:?}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
    }
    let (code, err) = err_of(&["run"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("CMD"), "{err}");
}

#[test]
fn not_root_is_a_clear_error() {
    use std::os::unix::process::CommandExt;
    let out = Command::new(HUSK)
        .args(["run", "--", "/bin/true"])
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("husk must run as root"), "{err}");
}

#[test]
fn bad_input_leaves_nothing_behind() {
    let layout = husk_runtime::cgroup::CgroupLayout::discover().unwrap();
    let before = layout.existing().len();
    for args in [
        &["run", "--memory", "12X", "--", "true"][..],
        &["run", "--mount", "/nope:/x", "--", "true"],
        &["run", "--workdir", "/../x", "--", "true"],
    ] {
        assert_eq!(husk(args).status.code(), Some(125));
    }
    // Sandboxes of tests running in parallel come and go; ours never existed, so the count of
    // sandbox cgroups cannot have grown because of these runs. Poll briefly for neighbours to end.
    let settled = wait_for(std::time::Duration::from_secs(10), || {
        (layout.existing().len() <= before).then_some(())
    });
    assert!(settled.is_some(), "sandbox cgroups left behind");
}

// A minimal container has no CA certificates, and reqwest's TLS set-up refused to start
// without them even for a plain-HTTP server (reqwest#2988): `husk run --server http://...`
// must still reach the server. The "server" is a listener of the test's own.
#[test]
fn a_host_without_ca_certificates_still_reaches_a_plain_http_server() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut head = [0u8; 64];
        let n = conn.read(&mut head).unwrap();
        conn.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .unwrap();
        String::from_utf8_lossy(&head[..n]).into_owned()
    });
    let out = Command::new(HUSK)
        .args([
            "run",
            "--server",
            &format!("http://127.0.0.1:{port}"),
            "--",
            "true",
        ])
        .env("SSL_CERT_FILE", "/nonexistent")
        .env("SSL_CERT_DIR", "/nonexistent")
        .env("HUSK_API_KEY", format!("e2b_{}", "0".repeat(40)))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("CA certificates"), "{err}");
    assert!(err.contains("404"), "{err}");
    let head = server.join().unwrap();
    assert!(head.starts_with("POST /husk/v1/runs "), "{head}");
}
