//! `husk secret` as an operator uses it: values from stdin or a file (never argv), listing
//! without values, removal, key rotation, and nothing readable on disk.

mod common;

use std::fs;

use common::{husk_state, TempDir};

/// `husk secret ARGS --state-dir DIR`: (exit code, stdout, stderr).
fn secret(dir: &TempDir, args: &[&str], stdin: Option<&[u8]>) -> (i32, String, String) {
    husk_state("secret", args, dir.path(), stdin)
}

const VALUE: &str = "sk-test-5f2b8c1e9d7a4b3c-do-not-print";

#[test]
fn secrets_are_set_listed_rotated_and_removed_without_ever_showing_a_value() {
    let dir = TempDir::new("secrets-cli");
    let (code, _, err) = secret(
        &dir,
        &["set", "API_KEY", "--team", "acme"],
        Some(format!("{VALUE}\n").as_bytes()),
    );
    assert_eq!(code, 0, "{err}");
    let file = dir.path().join("value.txt");
    fs::write(&file, "from-a-file").unwrap();
    let (code, _, err) = secret(
        &dir,
        &[
            "set",
            "OTHER",
            "--team",
            "acme",
            "--from-file",
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, _) = secret(&dir, &["list", "--team", "acme"], None);
    assert_eq!(code, 0);
    assert!(out.contains("API_KEY") && out.contains("OTHER"), "{out}");
    assert!(
        !out.contains(VALUE) && !out.contains("from-a-file"),
        "{out}"
    );
    // Another team sees none of them.
    let (_, out, _) = secret(&dir, &["list", "--team", "other"], None);
    assert!(!out.contains("API_KEY"), "{out}");
    // A value on the command line is refused (argv is visible to every local user).
    let (code, _, err) = secret(&dir, &["set", "X", VALUE, "--team", "acme"], None);
    assert_ne!(code, 0);
    assert!(err.contains("unexpected argument"), "{err}");
    // Bad input: clear errors.
    let (code, _, err) = secret(&dir, &["set", "bad/name", "--team", "acme"], Some(b"v"));
    assert_eq!(code, 125, "{err}");
    assert!(err.contains("invalid secret name"), "{err}");
    let (code, _, err) = secret(&dir, &["set", "EMPTY", "--team", "acme"], Some(b""));
    assert_eq!(code, 125, "{err}");
    // Rotation keeps them; the key file changes and stays private.
    let key_before = fs::read(dir.path().join("master.key")).unwrap();
    let (code, _, err) = secret(&dir, &["rotate-key"], None);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("2 secret(s) resealed"), "{err}");
    assert_ne!(fs::read(dir.path().join("master.key")).unwrap(), key_before);
    // Nothing in the state directory holds a value in clear.
    for e in fs::read_dir(dir.path()).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() && p != file {
            let bytes = fs::read(&p).unwrap();
            assert!(
                !bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()),
                "{} holds a secret in clear",
                p.display()
            );
        }
    }
    let (code, _, err) = secret(&dir, &["rm", "API_KEY", "--team", "acme"], None);
    assert_eq!(code, 0, "{err}");
    let (code, _, err) = secret(&dir, &["rm", "API_KEY", "--team", "acme"], None);
    assert_eq!(code, 1);
    assert!(err.contains("secret 'API_KEY' not found"), "{err}");
    let (_, out, _) = secret(&dir, &["list", "--team", "acme"], None);
    assert!(!out.contains("API_KEY") && out.contains("OTHER"), "{out}");
}
