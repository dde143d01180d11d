//! The fences, checked from inside real sandboxes: every seccomp rule denies its call (as the
//! sandbox's root and as its user), capabilities are bounded, no_new_privs is set, and PID 1
//! cannot be killed or traced from inside.

mod common;
use common::*;

use husk_runtime::fences::{Capability, DEFAULT_ROOT_CAPS, DENY_RULES};

fn probe_script() -> String {
    let mut s = String::from(
        "import ctypes, os\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         libc.syscall.restype = ctypes.c_long\n\
         def probe(name, nr, args):\n\
         \x20   ctypes.set_errno(0)\n\
         \x20   r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_ulong(a) for a in args])\n\
         \x20   print(name, ctypes.get_errno() if r == -1 else 'OK')\n",
    );
    for rule in DENY_RULES {
        let args: Vec<String> = rule.probe.args.iter().map(|a| a.to_string()).collect();
        s.push_str(&format!(
            "probe({:?}, {}, [{}])\n",
            rule.name,
            rule.probe.nr,
            args.join(", ")
        ));
    }
    s
}

#[test]
fn every_seccomp_rule_denies_its_call_inside_the_sandbox() {
    assert!(DENY_RULES.len() >= 40, "the deny list shrank");
    let script = probe_script();
    for user in ["root", "user"] {
        let r = husk_run(&["--user", user], &strs(&py(&script)));
        r.ok();
        let got: std::collections::HashMap<&str, &str> =
            r.stdout.lines().filter_map(|l| l.split_once(' ')).collect();
        for rule in DENY_RULES {
            assert_eq!(
                got.get(rule.name).copied(),
                Some(rule.errno.to_string().as_str()),
                "rule {} ({}) as {user}: the call did not fail with errno {}",
                rule.name,
                rule.why,
                rule.errno
            );
        }
    }
}

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .unwrap_or_else(|| panic!("{key} missing"))
        .trim()
        .to_owned()
}

#[test]
fn capabilities_are_bounded_and_no_new_privs_is_set() {
    let r = husk_run(&[], &["/bin/cat", "/proc/self/status"]);
    let st = &r.ok().stdout;
    for key in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(status_field(st, key), "0000000000000000", "user {key}");
    }
    assert_eq!(status_field(st, "NoNewPrivs:"), "1");
    assert_eq!(status_field(st, "Seccomp:"), "2");

    let r = husk_run(&["--user", "root"], &["/bin/cat", "/proc/self/status"]);
    let st = &r.ok().stdout;
    let want = format!("{:016x}", Capability::mask(DEFAULT_ROOT_CAPS));
    assert_eq!(status_field(st, "CapBnd:"), want);
    assert_eq!(status_field(st, "CapEff:"), want);
    assert_eq!(status_field(st, "NoNewPrivs:"), "1");
    // Root has no CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_MKNOD, CAP_SYS_PTRACE.
    let bnd = u64::from_str_radix(&want, 16).unwrap();
    for cap in [21u32, 12, 27, 19] {
        assert_eq!(
            bnd & (1 << cap),
            0,
            "capability {cap} is in root's bounding set"
        );
    }
}

#[test]
fn pid1_cannot_be_killed_or_traced_from_inside() {
    let r = husk_run(
        &["--user", "root"],
        &[
            "/bin/sh",
            "-c",
            "kill -9 1; echo kill=$?; cat /proc/1/environ >/dev/null 2>&1; echo environ=$?; \
             ls -l /proc/1/exe >/dev/null 2>&1; echo exe=$?; echo done",
        ],
    );
    r.ok();
    // SIGKILL to a PID namespace's init from inside is ignored by the kernel: the shell goes on.
    assert!(r.stdout.contains("done"), "{}", r.stdout);
    assert!(
        r.stdout.contains("environ=1"),
        "PID 1's environment is readable: {}",
        r.stdout
    );
    assert!(
        r.stdout.contains("exe=2") || r.stdout.contains("exe=1"),
        "{}",
        r.stdout
    );
}

#[test]
fn no_device_nodes_and_no_remounts_even_as_root() {
    let r = husk_run(
        &["--user", "root"],
        &[
            "/bin/sh",
            "-c",
            "exec 2>&1; mknod /tmp/mem c 1 1 || echo MKNOD-DENIED; \
             umount /proc || echo UMOUNT-DENIED; \
             mount -t tmpfs none /mnt || echo MOUNT-DENIED; \
             unshare -U true || echo USERNS-DENIED; \
             test -e /sys/kernel && echo SYS-VISIBLE; echo end",
        ],
    );
    r.ok();
    for want in [
        "MKNOD-DENIED",
        "UMOUNT-DENIED",
        "MOUNT-DENIED",
        "USERNS-DENIED",
        "end",
    ] {
        assert!(r.stdout.contains(want), "{want} missing:\n{}", r.stdout);
    }
    assert!(!r.stdout.contains("SYS-VISIBLE"));
}
