//! Compiling [`DENY_RULES`](super::DENY_RULES) into seccomp BPF programs, and installing them.
//!
//! seccompiler gives a filter one on-match action, so the rules of the main errno (EPERM) are
//! compiled by seccompiler, and unconditional rules with another errno (`clone3` → ENOSYS) are
//! answered by a hand-written prefix, so the whole policy is one program (one JIT compilation at
//! install time). The prefix also does what seccompiler does not provide:
//!
//! * foreign architecture (e.g. the i386 ABI via `int 0x80`) → kill the process
//!   (seccompiler's own programs do this too; the prefix just does it first), and
//! * x32 ABI syscalls (`nr & 0x40000000`) → EPERM. The x32 ABI shares `AUDIT_ARCH_X86_64`, so
//!   without this check `0x40000000 | SYS_mount` would not match the rule for `SYS_mount`.
//!   `nr == -1` is let through (the kernel answers ENOSYS), as libseccomp does.
//!
//! Compilation allocates and happens once in the parent; installation is one `seccomp(2)` call
//! on prepared data.

use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

use super::seccomp_rules::{ArgMatch, DenyRule};
use super::FenceError;

#[cfg(not(target_arch = "x86_64"))]
compile_error!("husk's seccomp policy (syscall numbers, x32 handling) is written for x86_64 only");

/// `AUDIT_ARCH_X86_64` (`EM_X86_64 | __AUDIT_ARCH_64BIT | __AUDIT_ARCH_LE`).
const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
/// `__X32_SYSCALL_BIT`.
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
/// Offsets in `struct seccomp_data`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The hand-written prefix. It falls through (to the program appended after it) for native
/// x86_64 syscalls, except those in `direct` (syscall number, errno), which it answers itself:
/// that is how rules whose errno differs from the main program's (clone3 → ENOSYS) share one
/// program with the rest. Every extra program costs a BPF JIT compilation at install time
/// (~0.15 ms here, once per sandbox) and a filter run on every syscall of the sandbox.
fn prefix(direct: &[(u32, u32)]) -> Vec<sock_filter> {
    use libc::{BPF_ABS, BPF_JEQ, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET, BPF_W};
    let skip = u8::try_from(2 + 2 * direct.len()).expect("few direct rules");
    let mut p = vec![
        // 0: A = arch
        stmt(BPF_LD | BPF_W | BPF_ABS, DATA_ARCH),
        // 1: if A == x86_64 goto 3
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        // 2: kill the process
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        // 3: A = nr
        stmt(BPF_LD | BPF_W | BPF_ABS, DATA_NR),
        // 4: if A == -1 fall through to the appended program
        jump(BPF_JMP | BPF_JEQ | BPF_K, u32::MAX, skip, 0),
        // 5: if A & X32 goto 6 else goto 7
        jump(BPF_JMP | BPF_JSET | BPF_K, X32_SYSCALL_BIT, 0, 1),
        // 6: x32 syscall: EPERM
        stmt(
            BPF_RET | BPF_K,
            libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA),
        ),
    ];
    // 7..: if A == nr return errno (two instructions per direct rule)
    for &(nr, errno) in direct {
        p.push(jump(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
        p.push(stmt(
            BPF_RET | BPF_K,
            libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA),
        ));
    }
    // then: the appended program
    p
}

fn condition(index: u8, op: SeccompCmpOp, value: u32) -> Result<SeccompCondition, FenceError> {
    SeccompCondition::new(index, SeccompCmpArgLen::Dword, op, u64::from(value))
        .map_err(FenceError::SeccompCompile)
}

/// The seccompiler rule for an argument pattern, or `None` if the pattern matches every call.
fn seccomp_rule(arg: &ArgMatch) -> Result<Option<SeccompRule>, FenceError> {
    let conditions = match *arg {
        ArgMatch::MaskedEq { index, mask, value } => {
            vec![condition(
                index,
                SeccompCmpOp::MaskedEq(u64::from(mask)),
                value & mask,
            )?]
        }
        ArgMatch::NoneOf { index, values } => values
            .iter()
            .map(|&v| condition(index, SeccompCmpOp::Ne, v))
            .collect::<Result<Vec<_>, _>>()?,
    };
    if conditions.is_empty() {
        return Ok(None);
    }
    SeccompRule::new(conditions)
        .map(Some)
        .map_err(FenceError::SeccompCompile)
}

/// Compiles the rules into one program per distinct errno, ordered by errno. The first program
/// carries the architecture/x32 prefix. Syscalls matched by several rules with different errnos
/// are rejected (the result would depend on kernel precedence rules).
pub(crate) fn compile(rules: &[DenyRule]) -> Result<Vec<BpfProgram>, FenceError> {
    // errno -> syscall -> rules (an empty Vec means "every call").
    let mut by_errno: BTreeMap<i32, BTreeMap<i64, Option<Vec<SeccompRule>>>> = BTreeMap::new();
    let mut errno_of_syscall: BTreeMap<i64, i32> = BTreeMap::new();
    for rule in rules {
        let invalid = |reason| FenceError::InvalidRule {
            rule: rule.name,
            reason,
        };
        if !(1..=4095).contains(&rule.errno) {
            return Err(invalid("errno must be in 1..=4095"));
        }
        if !(0..i64::from(X32_SYSCALL_BIT)).contains(&rule.syscall) {
            return Err(invalid("not a native x86_64 syscall number"));
        }
        if let Some(&other) = errno_of_syscall.get(&rule.syscall) {
            if other != rule.errno {
                return Err(invalid("another rule gives this syscall a different errno"));
            }
        }
        errno_of_syscall.insert(rule.syscall, rule.errno);
        let entry = by_errno
            .entry(rule.errno)
            .or_default()
            .entry(rule.syscall)
            .or_insert_with(|| Some(Vec::new()));
        let conditional = match &rule.arg {
            Some(arg) => seccomp_rule(arg)?,
            None => None,
        };
        match (entry.as_mut(), conditional) {
            // Once unconditional, a syscall stays unconditional.
            (None, _) => {}
            (Some(chain), Some(r)) => chain.push(r),
            (Some(_), None) => *entry = None,
        }
    }

    // The errno with the most syscalls gets the seccompiler program; the other errnos' syscalls
    // are answered by the prefix when all their rules are unconditional (they are, today), and
    // get programs of their own otherwise.
    let main = by_errno
        .iter()
        .max_by_key(|(_, syscalls)| syscalls.len())
        .map(|(e, _)| *e);
    let mut direct = Vec::new();
    by_errno.retain(|&errno, syscalls| {
        if Some(errno) == main || syscalls.values().any(Option::is_some) {
            return true;
        }
        direct.extend(syscalls.keys().map(|&nr| (nr as u32, errno as u32)));
        false
    });
    let mut programs = Vec::with_capacity(by_errno.len());
    for (errno, syscalls) in by_errno {
        // Validated above: 1..=4095.
        let errno = errno as u32;
        let map: BTreeMap<i64, Vec<SeccompRule>> = syscalls
            .into_iter()
            .map(|(nr, chain)| (nr, chain.unwrap_or_default()))
            .collect();
        let filter = SeccompFilter::new(
            map,
            SeccompAction::Allow,
            SeccompAction::Errno(errno),
            TargetArch::x86_64,
        )
        .map_err(FenceError::SeccompCompile)?;
        let body: BpfProgram = filter.try_into().map_err(FenceError::SeccompCompile)?;
        let program = if programs.is_empty() {
            let mut p = prefix(&direct);
            p.extend(body);
            p
        } else {
            body
        };
        programs.push(program);
    }
    if programs.is_empty() {
        // No rules: still install the architecture/x32 check.
        let mut p = prefix(&direct);
        p.push(stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW));
        programs.push(p);
    }
    Ok(programs)
}

/// Installs the programs on the calling thread (or, with `all_threads`, on every thread of the
/// process via `SECCOMP_FILTER_FLAG_TSYNC`). Sets no_new_privs first (seccompiler does it; it is
/// also required for unprivileged callers). Does not allocate.
pub(crate) fn install(programs: &[BpfProgram], all_threads: bool) -> Result<(), FenceError> {
    for program in programs {
        let result = if all_threads {
            seccompiler::apply_filter_all_threads(program)
        } else {
            seccompiler::apply_filter(program)
        };
        result.map_err(FenceError::SeccompInstall)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::seccomp_rules::{Probe, DENY_RULES};
    use super::super::testing::{errno, in_child};
    use super::*;

    fn programs() -> Vec<BpfProgram> {
        compile(DENY_RULES).expect("policy compiles")
    }

    /// Makes the probe call; returns 0 on success, else errno. Async-signal-safe.
    fn probe_errno(p: &Probe) -> i32 {
        let a = p.args.map(|a| a as libc::c_long);
        // SAFETY: the probes' arguments are NULL/invalid pointers, invalid fds or invalid
        // flags (see seccomp_rules); the kernel validates them and no memory of ours is touched.
        let r = unsafe { libc::syscall(p.nr, a[0], a[1], a[2], a[3], a[4], a[5]) };
        if r == -1 {
            errno()
        } else {
            0
        }
    }

    #[test]
    fn the_whole_policy_is_one_program_with_the_enosys_calls_in_the_prefix() {
        let progs = programs();
        assert_eq!(progs.len(), 1, "one program for EPERM and ENOSYS rules");
        let direct = [
            (libc::SYS_clone3 as u32, libc::ENOSYS as u32),
            (libc::SYS_openat2 as u32, libc::ENOSYS as u32),
        ];
        assert_eq!(&progs[0][..prefix(&direct).len()], &prefix(&direct)[..]);
        assert!(
            progs[0].len() < 4096,
            "program too long: {}",
            progs[0].len()
        );
    }

    #[test]
    fn a_conditional_rule_with_another_errno_gets_its_own_program() {
        let mut rules: Vec<DenyRule> = DENY_RULES.to_vec();
        let mut odd = *DENY_RULES
            .iter()
            .find(|r| r.arg.is_some())
            .expect("a conditional rule");
        odd.errno = libc::EACCES;
        rules.retain(|r| r.syscall != odd.syscall);
        rules.push(odd);
        let progs = compile(&rules).unwrap();
        assert_eq!(progs.len(), 2);
    }

    #[test]
    fn conflicting_errnos_for_one_syscall_are_rejected() {
        let mut rules = vec![DENY_RULES[0]];
        let mut other = DENY_RULES[0];
        other.errno = libc::ENOSYS;
        rules.push(other);
        assert!(matches!(
            compile(&rules),
            Err(FenceError::InvalidRule { .. })
        ));
        let mut bad = DENY_RULES[0];
        bad.errno = 0;
        assert!(matches!(
            compile(&[bad]),
            Err(FenceError::InvalidRule { .. })
        ));
    }

    #[test]
    fn every_deny_rule_blocks_its_probe() {
        let progs = programs();
        let mut failures = Vec::new();
        for rule in DENY_RULES {
            let filtered = in_child(|out| {
                if install(&progs, false).is_err() {
                    return 2;
                }
                out.send_i32(probe_errno(&rule.probe));
                0
            });
            let control = in_child(|out| {
                out.send_i32(probe_errno(&rule.probe));
                0
            });
            match filtered.i32s().first() {
                Some(&e) if e == rule.errno => {}
                got => failures.push(format!(
                    "{}: with the filter the probe gave {:?}, want errno {} ({filtered:?})",
                    rule.name, got, rule.errno
                )),
            }
            match control.i32s().first() {
                Some(&e) if e != rule.errno => {}
                got => failures.push(format!(
                    "{}: without the filter the probe gave {:?}: it does not prove the rule",
                    rule.name, got
                )),
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn allowed_calls_still_work_under_the_filter() {
        let progs = programs();
        // SAFETY: posix_openpt only opens /dev/ptmx; the fd is closed below.
        let pty = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
        assert!(
            pty >= 0,
            "posix_openpt: {}",
            std::io::Error::last_os_error()
        );

        let checks: &[(&str, i32)] = &[
            ("getpid", 0),
            ("fork (clone without CLONE_NEWUSER)", 0),
            ("socket(AF_INET)", 0),
            ("socket(AF_UNIX)", 0),
            ("ioctl(pty, TCGETS)", 0),
            ("personality(0xffffffff)", 0),
            ("personality(PER_LINUX)", 0),
            ("unshare(0)", 0),
            ("ioctl TIOCSTI with junk in the upper 32 bits", libc::EPERM),
            ("x32 getpid", libc::EPERM),
            ("syscall -1", libc::ENOSYS),
        ];
        let child = in_child(|out| {
            if install(&progs, false).is_err() {
                return 2;
            }
            let ok = |r: libc::c_long| if r >= 0 { 0 } else { errno() };
            // SAFETY: plain syscalls on our own fds with valid or no pointers (the termios is
            // a local); the forked grandchild only calls _exit.
            unsafe {
                out.send_i32(ok(libc::syscall(libc::SYS_getpid)));
                let pid = libc::fork();
                if pid == 0 {
                    libc::_exit(7);
                }
                let mut status = 0;
                let forked = pid > 0
                    && libc::waitpid(pid, &mut status, 0) == pid
                    && libc::WIFEXITED(status)
                    && libc::WEXITSTATUS(status) == 7;
                out.send_i32(if forked { 0 } else { -1 });
                let s = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                out.send_i32(ok(s.into()));
                let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                out.send_i32(ok(s.into()));
                let mut tio: libc::termios = std::mem::zeroed();
                out.send_i32(ok(libc::ioctl(pty, libc::TCGETS, &mut tio).into()));
                out.send_i32(ok(libc::syscall(libc::SYS_personality, 0xffff_ffff_u64)));
                out.send_i32(ok(libc::syscall(libc::SYS_personality, 0)));
                out.send_i32(ok(libc::syscall(libc::SYS_unshare, 0)));
                out.send_i32(ok(libc::syscall(
                    libc::SYS_ioctl,
                    -1,
                    0x1_0000_0000_u64 | libc::TIOCSTI,
                    0,
                )));
                out.send_i32(ok(libc::syscall(
                    i64::from(X32_SYSCALL_BIT) | libc::SYS_getpid,
                )));
                out.send_i32(ok(libc::syscall(-1)));
            }
            0
        });
        // SAFETY: closing the fd we opened above.
        unsafe { libc::close(pty) };
        assert!(child.exited(0), "{child:?}");
        let got = child.i32s();
        assert_eq!(got.len(), checks.len(), "{child:?}");
        for ((name, want), got) in checks.iter().zip(got) {
            assert_eq!(got, *want, "{name}: got errno {got}, want {want}");
        }
    }

    /// The i386 ABI (`int 0x80`) is a different audit arch: the filter kills the process.
    #[test]
    fn foreign_architecture_kills_the_process() {
        fn int80_getpid() -> i32 {
            let ret: i32;
            // SAFETY: i386 getpid (20) via int 0x80 takes no arguments and touches no memory;
            // the compat entry may clobber r8-r11, declared as clobbered.
            unsafe {
                std::arch::asm!(
                    "int 0x80",
                    inlateout("eax") 20 => ret,
                    lateout("r8") _, lateout("r9") _, lateout("r10") _, lateout("r11") _,
                    options(nostack)
                );
            }
            ret
        }
        let progs = programs();
        let control = in_child(|out| {
            out.send_i32(int80_getpid());
            0
        });
        let filtered = in_child(|out| {
            if install(&progs, false).is_err() {
                return 2;
            }
            out.send_i32(int80_getpid());
            0
        });
        if control.exited(0) && control.i32s().first().is_some_and(|&p| p > 0) {
            // The kernel runs i386 syscalls: the filter must kill the caller with SIGSYS.
            assert_eq!(filtered.signal(), Some(libc::SIGSYS), "{filtered:?}");
            assert!(
                filtered.i32s().is_empty(),
                "the i386 syscall returned: {filtered:?}"
            );
        } else {
            // No IA-32 emulation: int 0x80 faults before seccomp; it must not succeed either.
            assert!(!filtered.exited(0), "{filtered:?}");
        }
    }

    /// glibc's pthread_create tries clone3 first and falls back to clone(2) on ENOSYS: a
    /// multithreaded program (this test binary, re-executed to run one unit test, which libtest
    /// runs on a spawned thread) must work under the filter.
    #[test]
    fn threads_still_work_under_the_filter() {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt;

        let progs = programs();
        let exe = std::env::current_exe().expect("current_exe");
        let exe = CString::new(exe.as_os_str().as_bytes()).expect("exe path");
        let module = module_path!();
        // Test names omit the crate name.
        let module = module.split_once("::").map_or(module, |(_, rest)| rest);
        let name = module.replace(
            "seccomp::tests",
            "seccomp_rules::tests::rules_are_well_formed",
        );
        let args = [
            exe.clone(),
            CString::new("--exact").unwrap(),
            CString::new(name).unwrap(),
            CString::new("--test-threads=2").unwrap(),
        ];
        let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
        argv.push(std::ptr::null());

        let child = in_child(|out| {
            if install(&progs, false).is_err() {
                return 2;
            }
            // SAFETY: dup2 onto stdout/stderr of this (forked) process; execv gets
            // NUL-terminated strings and a NULL-terminated argv prepared before fork.
            unsafe {
                libc::dup2(out.fd(), 1);
                libc::dup2(out.fd(), 2);
                libc::execv(exe.as_ptr(), argv.as_ptr());
            }
            3
        });
        let text = String::from_utf8_lossy(&child.output);
        assert!(child.exited(0), "{child:?}\n{text}");
        assert!(text.contains("1 passed"), "{text}");
    }
}
