//! The fences of `husk serve`'s own process (`husk_runtime::fences::server`), on the real
//! kernel, as root: each case forks a child (this test has no harness, so it stays
//! single-threaded and its children may allocate), which drops privileges as the server does
//! and then checks what it can and cannot do. A child reports a failed check on stderr and
//! exits non-zero; the files the checks need are made, and removed, by the parent.

use std::ffi::CString;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use husk_runtime::fences::server::{drop_all_capabilities, ServerFences, SERVER_DENY_RULES};
use husk_runtime::fences::LandlockState;

const NOBODY: u32 = 65534;

/// What the server may read, as `husk serve` passes it.
const READABLE: &[&str] = &[
    "/proc",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
    "/dev/urandom",
    "/dev/random",
];

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn errno_of(r: libc::c_long) -> i32 {
    if r >= 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }
}

fn open_errno(path: &Path, flags: i32) -> i32 {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the fd, if any, is closed at once.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o600) };
    if fd >= 0 {
        // SAFETY: our own fd.
        unsafe { libc::close(fd) };
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
    }
}

fn status_field(name: &str) -> String {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
        .unwrap_or_default()
}

/// Forks; the child drops privileges and runs `checks`, whose `Err` is a failed check.
fn in_dropped_child(name: &str, checks: impl FnOnce(LandlockState) -> Result<(), String>) {
    let fences = ServerFences::prepare(READABLE).expect("prepare the server's fences");
    // SAFETY: this process is single-threaded (no test harness): the child may do anything.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let code = match fences.apply(NOBODY, NOBODY) {
            Err(e) => {
                eprintln!("{name}: apply: {e}");
                2
            }
            Ok(applied) => match checks(applied.landlock) {
                Ok(()) => 0,
                Err(m) => {
                    eprintln!("{name}: {m}");
                    1
                }
            },
        };
        let _ = std::io::stderr().flush();
        // SAFETY: ending the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    drop(fences);
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{name}: the child failed (status {status:#x})"
    );
    println!("ok: {name}");
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

fn main() {
    // SAFETY: getuid takes no arguments.
    if unsafe { libc::getuid() } != 0 {
        eprintln!("server_fences: needs root (scripts/test runs the tests as root)");
        std::process::exit(1);
    }
    let scratch =
        Scratch(std::env::temp_dir().join(format!("husk-server-fences-{}", std::process::id())));
    std::fs::create_dir_all(&scratch.0).unwrap();
    std::fs::set_permissions(&scratch.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let secret = scratch.0.join("master.key");
    std::fs::write(&secret, b"secret").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    let public = scratch.0.join("public");
    std::fs::write(&public, b"anyone may read this").unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (secret2, public2, dir) = (secret.clone(), public.clone(), scratch.0.clone());

    in_dropped_child("no capability, no way back", |_| {
        for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            let v = status_field(set);
            check(u64::from_str_radix(&v, 16) == Ok(0), || {
                format!("{set} is {v}")
            })?;
        }
        let uid = status_field("Uid");
        check(uid == "65534\t65534\t65534\t65534", || {
            format!("Uid: {uid}")
        })?;
        check(status_field("NoNewPrivs") == "1", || {
            "no no_new_privs".into()
        })?;
        check(status_field("Seccomp") == "2", || {
            "no seccomp filter".into()
        })?;
        // SAFETY: setuid and PR_GET_DUMPABLE take integers.
        let (setuid, dumpable) = unsafe { (libc::setuid(0), libc::prctl(libc::PR_GET_DUMPABLE)) };
        check(setuid != 0, || "setuid(0) worked".into())?;
        check(dumpable == 0, || "still dumpable".into())
    });

    in_dropped_child("files: only what it may read", move |landlock| {
        let e = open_errno(&secret2, libc::O_RDONLY);
        check(e == libc::EACCES, || {
            format!("the root-only file: errno {e}")
        })?;
        check(std::fs::read_to_string("/proc/meminfo").is_ok(), || {
            "/proc/meminfo is not readable".into()
        })?;
        check(std::fs::read_dir("/sys/fs/cgroup").is_ok(), || {
            "/sys/fs/cgroup is not listable".into()
        })?;
        let mut random = [0u8; 16];
        check(
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
                .is_ok(),
            || "/dev/urandom is not readable".into(),
        )?;
        if matches!(landlock, LandlockState::Enforced { .. }) {
            // World-readable, but outside what the server reads: Landlock says no.
            let e = open_errno(&public2, libc::O_RDONLY);
            check(e == libc::EACCES, || format!("a public file: errno {e}"))?;
            let e = open_errno(Path::new("/etc/hostname"), libc::O_RDONLY);
            check(e == libc::EACCES, || format!("/etc/hostname: errno {e}"))?;
            let e = open_errno(Path::new("/dev/null"), libc::O_WRONLY);
            check(e == libc::EACCES, || format!("/dev/null: errno {e}"))?;
            let e = open_errno(&dir.join("new"), libc::O_WRONLY | libc::O_CREAT);
            check(e == libc::EACCES, || format!("a new file: errno {e}"))?;
            let e = open_errno(Path::new("/proc/self/status"), libc::O_WRONLY);
            check(e == libc::EACCES, || format!("writing /proc: errno {e}"))?;
        } else {
            println!("note: this kernel has no Landlock: the public-file checks are skipped");
        }
        Ok(())
    });

    in_dropped_child("every denied call is refused", |_| {
        for rule in SERVER_DENY_RULES {
            let p = rule.probe;
            // SAFETY: each probe is chosen to fail harmlessly even unfiltered (NULL
            // pointers, bad descriptors, invalid flags), see SERVER_DENY_RULES.
            let r = unsafe {
                libc::syscall(
                    p.nr, p.args[0], p.args[1], p.args[2], p.args[3], p.args[4], p.args[5],
                )
            };
            let e = errno_of(r);
            check(e == rule.errno, || {
                format!("{}: errno {e}, expected {}", rule.name, rule.errno)
            })?;
        }
        // A new user namespace (unprivileged users may make one where nothing filters).
        // SAFETY: unshare takes flags.
        let r = unsafe { libc::unshare(libc::CLONE_NEWUSER) };
        check(r != 0, || "unshare(CLONE_NEWUSER) worked".into())
    });

    in_dropped_child("threads and sockets still work", |_| {
        let t = std::thread::spawn(|| 6 * 7).join();
        check(t.ok() == Some(42), || "a thread did not run".into())?;
        let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
        let addr = l.local_addr().map_err(|e| e.to_string())?;
        let c = std::net::TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
        drop((c, l));
        let (a, b) = std::os::unix::net::UnixStream::pair().map_err(|e| e.to_string())?;
        drop((a, b));
        Ok(())
    });
    // A helper that keeps uid 0 (the state helper) but drops every capability: it still
    // opens what root owns, and nothing of another user's.
    let foreign = scratch.0.join("foreign.key");
    std::fs::write(&foreign, b"another user's").unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&foreign, Some(1234), Some(1234)).unwrap();
    let (secret3, foreign2) = (secret.clone(), foreign.clone());
    // SAFETY: this process is single-threaded (no test harness): the child may do anything.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        let result = drop_all_capabilities()
            .map_err(|e| format!("drop: {e}"))
            .and_then(|()| {
                for set in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                    let v = status_field(set);
                    check(u64::from_str_radix(&v, 16) == Ok(0), || {
                        format!("{set} is {v}")
                    })?;
                }
                check(status_field("Uid") == "0\t0\t0\t0", || "not uid 0".into())?;
                check(status_field("Seccomp") == "2", || {
                    "no seccomp filter".into()
                })?;
                let e = open_errno(&secret3, libc::O_RDONLY);
                check(e == 0, || format!("its own file: errno {e}"))?;
                let e = open_errno(&foreign2, libc::O_RDONLY);
                check(e == libc::EACCES, || {
                    format!("another user's file: errno {e}")
                })?;
                // SAFETY: unshare takes flags.
                let r = unsafe { libc::unshare(libc::CLONE_NEWNS) };
                check(r != 0, || "unshare(CLONE_NEWNS) worked".into())
            });
        let code = match result {
            Ok(()) => 0,
            Err(m) => {
                eprintln!("a helper that keeps uid 0: {m}");
                1
            }
        };
        // SAFETY: ending the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "a helper that keeps uid 0: the child failed (status {status:#x})"
    );
    println!("ok: a helper that keeps uid 0");
    drop(scratch);
}
