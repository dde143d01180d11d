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
