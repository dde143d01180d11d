//! Resource limits: memory, pids, CPU quota, timeout, disk. Each hits the sandbox only.

mod common;
use common::*;

use std::time::{Duration, Instant};

#[test]
fn memory_exhaustion_kills_inside_the_sandbox_only() {
    // The cgroup holds 64 MiB for processes + 8 MiB of disk (/dev/shm included): 256 MiB is
    // past all of it.
    let r = husk_run(
        &["--memory", "64M", "--disk", "8M"],
        &strs(&py("a = bytearray(256 << 20)\nprint('survived')")),
    );
    assert_eq!(r.code, 137, "stdout {} stderr {}", r.stdout, r.stderr);
    assert!(
        r.stderr
            .contains("husk: killed: out of memory (limit 64 MiB, plus 8 MiB for files in memory)"),
        "{}",
        r.stderr
    );
    assert!(!r.stdout.contains("survived"));
}

/// Issue 15, L1: with the defaults (512 MiB of memory, a 1 GiB disk in RAM) a full disk used to
/// take the processes' memory and the OOM killer ended the sandbox. Now the write fails with
/// ENOSPC, and the processes still have their 512 MiB.
#[test]
fn a_full_disk_is_enospc_and_the_sandbox_lives_on_with_its_memory() {
    let code = "\
import errno, subprocess
n, seen = 0, None
chunk = b'x' * (1 << 20)
try:
    while True:
        with open(f'/tmp/fill-{n // 100}', 'ab', buffering=0) as f:
            f.write(chunk)
        n += 1
except OSError as e:
    seen = errno.errorcode.get(e.errno, e.errno)
print('filled', n, seen)
a = bytearray(400 << 20)
print('allocated', len(a) >> 20)
print(subprocess.run(['echo', 'alive'], capture_output=True, text=True).stdout.strip())
";
    let r = husk_run(&[], &strs(&py(code)));
    r.ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    let filled: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(filled[0], "filled", "{}", r.stdout);
    let mib: u64 = filled[1].parse().unwrap();
    assert!(
        (1000..=1024).contains(&mib),
        "the 1 GiB disk took {mib} MiB"
    );
    assert_eq!(filled[2], "ENOSPC", "{}", r.stdout);
    assert_eq!(&lines[1..], ["allocated 400", "alive"], "{}", r.stdout);
}

#[test]
fn a_fork_bomb_hits_the_pids_limit_and_nothing_else() {
    let dir = TempDir::new("bomb");
    // A neighbour sandbox that must keep working while the bomb goes off.
    let (neighbour, nid) = husk_spawn(&[], &["/bin/sh", "-c", "sleep 4; echo alive"], &dir);
    let r = husk_run(
        &["--pids", "64", "--timeout", "3s"],
        &["/bin/bash", "-c", "b() { b | b & }; b; sleep 10"],
    );
    assert_eq!(r.code, 124, "{}", r.stderr);
    let out = neighbour.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "alive");
    assert_gone(&nid);
    // The pids limit itself: forks beyond it fail with EAGAIN.
    let r = husk_run(
        &["--pids", "20"],
        &strs(&py("import os, time\nn = 0\nerr = None\n\
             for i in range(60):\n\
             \x20   try:\n\
             \x20       pid = os.fork()\n\
             \x20   except OSError as e:\n\
             \x20       err = e.errno; break\n\
             \x20   if pid == 0:\n\
             \x20       time.sleep(3); os._exit(0)\n\
             \x20   n += 1\n\
             print(n, err)")),
    );
    r.ok();
    let mut it = r.stdout.split_whitespace();
    let n: u32 = it.next().unwrap().parse().unwrap();
    assert!(n < 20, "forked {n} processes under --pids 20");
    assert_eq!(
        it.next(),
        Some("11"),
        "fork should fail with EAGAIN: {}",
        r.stdout
    );
}

#[test]
fn cpu_quota_throttles() {
    let busy = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass\nprint(time.process_time())";
    let r = husk_run(&["--cpus", "0.2"], &strs(&py(busy)));
    r.ok();
    let cpu: f64 = r.stdout.trim().parse().unwrap();
    // 0.2 CPU over 1.5 s is 0.3 s of CPU; allow start-up and period granularity.
    assert!(cpu < 0.5, "a 0.2-CPU sandbox used {cpu} s of CPU in 1.5 s");
}

#[test]
fn timeout_kills_within_a_small_margin() {
    let start = Instant::now();
    let r = husk_run(&["--timeout", "1s"], &["/bin/sleep", "30"]);
    let took = start.elapsed();
    assert_eq!(r.code, 124);
    assert!(
        r.stderr.contains("husk: killed: timeout after 1s"),
        "{}",
        r.stderr
    );
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_millis(2500), "timeout took {took:?}");
}

#[test]
fn disk_size_caps_the_writable_layer() {
    let r = husk_run(
        &["--disk", "8M"],
        &[
            "/bin/sh",
            "-c",
            "dd if=/dev/zero of=/tmp/big bs=1M count=32 2>&1; ls -l /tmp/big",
        ],
    );
    assert!(r.stdout.contains("No space left on device"), "{}", r.stdout);
    let size: u64 = r
        .stdout
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|s| s.parse().ok())
        .unwrap();
    assert!(size <= 8 << 20, "wrote {size} bytes into an 8 MiB layer");
}
