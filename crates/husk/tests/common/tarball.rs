//! Tar archives for tests: made and unpacked with the system tar, and raw entries no tar tool
//! writes (any path, `..` included), as a hostile client sends them.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// `tar <args>` in `dir`, the archive on stdout.
pub fn tar(dir: &Path, args: &[&str]) -> Vec<u8> {
    let out = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .expect("run tar");
    assert!(out.status.success(), "tar {args:?}: {out:?}");
    out.stdout
}

/// Unpacks `archive` into `dir` with the system tar; the names it held.
pub fn untar(archive: &[u8], dir: &Path) -> Vec<String> {
    let mut child = Command::new("tar")
        .arg("-C")
        .arg(dir)
        .args(["-xvf", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(archive).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "tar -x: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim_end_matches('/').to_string())
        .collect()
}

/// Appends one raw ustar entry: `path`, type byte `kind`, `data`, symlink target `link`.
pub fn raw_entry(out: &mut Vec<u8>, path: &str, kind: u8, data: &[u8], link: &str) {
    let mut h = [0u8; 512];
    h[..path.len()].copy_from_slice(path.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[108..115].copy_from_slice(b"0000000");
    h[116..123].copy_from_slice(b"0000000");
    h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}
