//! Compiling [`DENY_RULES`](super::DENY_RULES) into one seccomp BPF program, and installing it.
//!
//! The program is generated here rather than by a general-purpose compiler because its shape is
//! paid at every sandbox start. Installing a filter, the kernel JIT-compiles it (time grows with
//! its length: a generic compiler's 384 instructions took ~0.5 ms here) and, to let the calls it
//! always allows skip it, runs it once for every syscall number of each architecture (time grows
//! with the instructions a number passes through). husk's policy, installed 300 times here
//! (median): 96 µs as a chain of one `jeq` per syscall (149 instructions; a number passed
//! through up to 67 of them), 58 µs as the binary search below (179 instructions, at most 30).
//! The layout, for a policy of N syscalls:
//!
//! ```text
//! prefix      arch != x86_64 -> kill; nr == -1 -> allow (ENOSYS); x32 (nr & 0x40000000) -> EPERM
//! search      jge nodes halve the sorted syscall numbers down to runs of at most LEAF;
//!             each run: if nr == S goto S's block or return ... ; ret ALLOW
//! blocks      per syscall with argument rules: for each rule, load the argument's low 32 bits,
//!             test it, jump to the errno's return on a match; finally ret ALLOW
//! returns     ret ERRNO(e) for each errno the policy uses
//! ```
//!
//! (Classic BPF jumps only forward, hence the returns last.)
//!
//! A syscall whose rules are all unconditional jumps straight to its errno's return.
//! Compilation allocates and happens once in the parent; installation is one `seccomp(2)` call.

use std::collections::BTreeMap;

use seccompiler::{sock_filter, BpfProgram};

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
/// Offset of the low 32 bits of argument `i` (little-endian).
const fn data_arg(i: u8) -> u32 {
    16 + 8 * i as u32
}

use libc::{
    BPF_ABS, BPF_ALU, BPF_AND, BPF_JA, BPF_JEQ, BPF_JGE, BPF_JMP, BPF_JSET, BPF_K, BPF_LD, BPF_RET,
    BPF_W,
};

/// The search ends in runs of at most this many `jeq`s. Measured with husk's policy: runs of 4
/// or 8 install alike (58 and 57 µs), 3 and 2 slower (63 and 65 µs: a longer program to
/// JIT-compile); 4 keeps a denied call's path the shorter.
const LEAF: usize = 4;

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

fn ret_errno(errno: u32) -> sock_filter {
    stmt(
        BPF_RET | BPF_K,
        libc::SECCOMP_RET_ERRNO | (errno & libc::SECCOMP_RET_DATA),
    )
}

/// A jump target inside the program being built, resolved once every part is laid out.
#[derive(Clone, Copy)]
enum Target {
    Return(u32),
    Block(usize),
}

/// One instruction whose jump offsets still name targets.
enum Insn {
    Plain(sock_filter),
    /// `jeq k` / `jset k` to `hit`, else fall through.
    Cond {
        code: u32,
        k: u32,
        hit: Target,
    },
    /// Unconditional jump.
    Jump(Target),
}

/// The argument tests of one syscall: rules are OR-ed; each jumps to the errno's return when it
/// matches.
fn block(rules: &[&DenyRule], errno: u32) -> Vec<Insn> {
    let mut out = Vec::new();
    let hit = Target::Return(errno);
    for rule in rules {
        match rule.arg {
            Some(ArgMatch::MaskedEq { index, mask, value }) => {
                out.push(Insn::Plain(stmt(BPF_LD | BPF_W | BPF_ABS, data_arg(index))));
                if mask != u32::MAX {
                    out.push(Insn::Plain(stmt(BPF_ALU | BPF_AND | BPF_K, mask)));
                }
                out.push(Insn::Cond {
                    code: BPF_JMP | BPF_JEQ | BPF_K,
                    k: value & mask,
                    hit,
                });
            }
            Some(ArgMatch::NoneOf { index, values }) => {
                // Allowed values skip to the next rule; anything else matches.
                out.push(Insn::Plain(stmt(BPF_LD | BPF_W | BPF_ABS, data_arg(index))));
                let n = values.len();
                for (i, v) in values.iter().enumerate() {
                    // Over the remaining jeqs and the jump to the return.
                    let skip = u8::try_from(n - i).expect("few allowed values");
                    out.push(Insn::Plain(jump(BPF_JMP | BPF_JEQ | BPF_K, *v, skip, 0)));
                }
                out.push(Insn::Jump(hit));
            }
            None => out.push(Insn::Jump(hit)),
        }
    }
    // BPF jumps only forward: a block ends in its own return rather than jumping back.
    out.push(Insn::Plain(stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW)));
    out
}

/// The search over `keys` (syscall numbers, ascending, with where each goes): a `jge` on the
/// middle number sends the upper half on and falls through to the lower; a run of at most
/// [`LEAF`] numbers is a `jeq` each and `ret ALLOW`. Offsets within the search are resolved
/// here (it is laid out contiguously); the targets of the `jeq`s later.
fn search(keys: &[(u32, Target)], out: &mut Vec<Insn>) -> Result<(), FenceError> {
    if keys.len() <= LEAF {
        for &(nr, hit) in keys {
            out.push(Insn::Cond {
                code: BPF_JMP | BPF_JEQ | BPF_K,
                k: nr,
                hit,
            });
        }
        out.push(Insn::Plain(stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_ALLOW)));
        return Ok(());
    }
    let mid = keys.len() / 2;
    let mut lower = Vec::new();
    search(&keys[..mid], &mut lower)?;
    // From the node, over the lower half, to the upper half's first instruction.
    let over_lower = offset(0, lower.len() + 1)?;
    out.push(Insn::Plain(jump(
        BPF_JMP | BPF_JGE | BPF_K,
        keys[mid].0,
        over_lower,
        0,
    )));
    out.append(&mut lower);
    search(&keys[mid..], out)
}

/// Compiles the rules into one program (see the module docs). Syscalls matched by several
/// rules with different errnos are rejected (the result would be ambiguous).
pub(crate) fn compile(rules: &[DenyRule]) -> Result<Vec<BpfProgram>, FenceError> {
    let mut by_syscall: BTreeMap<i64, Vec<&DenyRule>> = BTreeMap::new();
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
        let same = by_syscall.entry(rule.syscall).or_default();
        if same.iter().any(|r| r.errno != rule.errno) {
            return Err(invalid("another rule gives this syscall a different errno"));
        }
        same.push(rule);
    }

    // The search, the returns, and the argument blocks, with symbolic targets.
    let mut keys = Vec::new();
    let mut blocks: Vec<Vec<Insn>> = Vec::new();
    let mut errnos: Vec<u32> = Vec::new();
    for (nr, rules) in &by_syscall {
        let errno = rules[0].errno as u32;
        if !errnos.contains(&errno) {
            errnos.push(errno);
        }
        let target = if rules.iter().any(|r| r.arg.is_none()) {
            Target::Return(errno)
        } else {
            blocks.push(block(rules, errno));
            Target::Block(blocks.len() - 1)
        };
        keys.push((*nr as u32, target));
    }
    // BTreeMap order: ascending, as the search needs.
    let mut chain = Vec::new();
    search(&keys, &mut chain)?;

    let mut prefix = vec![
        // A = arch; foreign architecture (e.g. i386 via int 0x80): kill the process.
        stmt(BPF_LD | BPF_W | BPF_ABS, DATA_ARCH),
        jump(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        stmt(BPF_RET | BPF_K, libc::SECCOMP_RET_KILL_PROCESS),
        // A = nr; -1 is let through (the kernel answers ENOSYS), as libseccomp does.
        stmt(BPF_LD | BPF_W | BPF_ABS, DATA_NR),
    ];
    // Layout: prefix | search | blocks | returns (BPF jumps only forward). The prefix ends
    // with three more instructions (the -1 and x32 tests, below); the search's last
    // instruction is a `ret ALLOW`.
    let allow_at = prefix.len() + 3 + chain.len() - 1;
    let mut block_at = Vec::new();
    let mut at = allow_at + 1;
    for b in &blocks {
        block_at.push(at);
        at += b.len();
    }
    let returns_at = at;
    let resolve = |t: Target| match t {
        Target::Return(e) => returns_at + errnos.iter().position(|x| *x == e).unwrap_or(0),
        Target::Block(i) => block_at[i],
    };
    // -1 -> allow; x32 -> EPERM (the x32 ABI shares AUDIT_ARCH_X86_64, so without this
    // `0x40000000 | SYS_mount` would not match the rule for SYS_mount).
    let here = prefix.len();
    prefix.push(jump(
        BPF_JMP | BPF_JEQ | BPF_K,
        u32::MAX,
        offset(here, allow_at)?,
        0,
    ));
    prefix.push(jump(BPF_JMP | BPF_JSET | BPF_K, X32_SYSCALL_BIT, 0, 1));
    prefix.push(ret_errno(libc::EPERM as u32));

    let mut program = prefix;
    let emit = |insns: Vec<Insn>, program: &mut Vec<sock_filter>| -> Result<(), FenceError> {
        for insn in insns {
            let here = program.len();
            program.push(match insn {
                Insn::Plain(f) => f,
                Insn::Cond { code, k, hit } => jump(code, k, offset(here, resolve(hit))?, 0),
                Insn::Jump(t) => stmt(BPF_JMP | BPF_JA, (resolve(t) - here - 1) as u32),
            });
        }
        Ok(())
    };
    emit(chain, &mut program)?;
    debug_assert_eq!(program.len(), allow_at + 1);
    for b in blocks {
        emit(b, &mut program)?;
    }
    for e in &errnos {
        program.push(ret_errno(*e));
    }
    debug_assert_eq!(program.len(), returns_at + errnos.len());
    Ok(vec![program])
}

/// The 8-bit offset of a conditional jump from instruction `from` to `to`.
fn offset(from: usize, to: usize) -> Result<u8, FenceError> {
    to.checked_sub(from + 1)
        .and_then(|d| u8::try_from(d).ok())
        .ok_or(FenceError::InvalidRule {
            rule: "(policy)",
            reason: "policy too large for short jumps",
        })
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
    use super::super::seccomp_rules::{ArgMatch, Probe, DENY_RULES};
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
    fn the_whole_policy_is_one_compact_program() {
        let progs = programs();
        assert_eq!(progs.len(), 1, "one program for every errno");
        // Well under what a generic compiler produced (384), since its length is JIT time.
        assert!(
            progs[0].len() < 200,
            "program has {} instructions",
            progs[0].len()
        );
    }

    /// Runs `prog` on a call the way the kernel's classic BPF does, for the instructions this
    /// compiler emits; returns the action and how many instructions ran.
    fn run(prog: &[sock_filter], arch: u32, nr: u32, args: &[u64; 6]) -> (u32, usize) {
        let mut data = [0u8; 64];
        data[0..4].copy_from_slice(&nr.to_le_bytes());
        data[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        let (mut acc, mut pc, mut ran) = (0u32, 0usize, 0usize);
        loop {
            let f = &prog[pc];
            ran += 1;
            pc += 1;
            let cond = |hit: bool| usize::from(if hit { f.jt } else { f.jf });
            match u32::from(f.code) {
                c if c == BPF_LD | BPF_W | BPF_ABS => {
                    let at = f.k as usize;
                    acc = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                }
                c if c == BPF_ALU | BPF_AND | BPF_K => acc &= f.k,
                c if c == BPF_JMP | BPF_JA => pc += f.k as usize,
                c if c == BPF_JMP | BPF_JEQ | BPF_K => pc += cond(acc == f.k),
                c if c == BPF_JMP | BPF_JGE | BPF_K => pc += cond(acc >= f.k),
                c if c == BPF_JMP | BPF_JSET | BPF_K => pc += cond(acc & f.k != 0),
                c if c == BPF_RET | BPF_K => return (f.k, ran),
                other => panic!("instruction {other:#x} at {}", pc - 1),
            }
        }
    }

    /// What the policy says of a call, from the rules themselves.
    fn decide(arch: u32, nr: u32, args: &[u64; 6]) -> u32 {
        if arch != AUDIT_ARCH_X86_64 {
            return libc::SECCOMP_RET_KILL_PROCESS;
        }
        if nr == u32::MAX {
            return libc::SECCOMP_RET_ALLOW;
        }
        if nr & X32_SYSCALL_BIT != 0 {
            return libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
        }
        DENY_RULES
            .iter()
            .find(|r| r.syscall == i64::from(nr) && r.arg.is_none_or(|m| m.matches(args)))
            .map_or(libc::SECCOMP_RET_ALLOW, |r| {
                libc::SECCOMP_RET_ERRNO | r.errno as u32
            })
    }

    /// Every syscall number, with arguments that do and do not match each rule, gets from the
    /// program what the rules say, in a few instructions.
    #[test]
    fn the_program_decides_every_call_as_the_rules_do_in_few_steps() {
        let prog = &programs()[0];
        // Argument values that sit on either side of every rule's test.
        let mut samples: Vec<u64> = vec![0, 1, u64::from(u32::MAX), 0xdead_0000_0000_0000];
        for r in DENY_RULES {
            match r.arg {
                Some(ArgMatch::MaskedEq { mask, value, .. }) => {
                    for v in [value, value ^ 1, value | !mask, value & mask] {
                        samples.extend([u64::from(v), u64::from(v) | 1 << 40]);
                    }
                }
                Some(ArgMatch::NoneOf { values, .. }) => {
                    samples.extend(
                        values
                            .iter()
                            .flat_map(|&v| [u64::from(v), u64::from(v) + 1]),
                    );
                }
                None => {}
            }
        }
        let mut numbers: Vec<u32> = (0..1024).collect();
        numbers.extend([
            u32::MAX,
            X32_SYSCALL_BIT,
            X32_SYSCALL_BIT | 39,
            u32::MAX - 1,
        ]);
        let (mut longest, mut checked) = (0, 0);
        for arch in [AUDIT_ARCH_X86_64, 3 | 0x4000_0000] {
            for &nr in &numbers {
                for (i, &v) in samples.iter().enumerate() {
                    // Each sample in every argument position, the rest another sample.
                    let mut args = [samples[(i + 1) % samples.len()]; 6];
                    for slot in 0..6 {
                        args[slot] = v;
                        let (got, ran) = run(prog, arch, nr, &args);
                        let want = decide(arch, nr, &args);
                        assert_eq!(got, want, "arch {arch:#x} nr {nr} args {args:x?}");
                        longest = longest.max(ran);
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100_000, "{checked} calls checked");
        // The chain of one `jeq` per syscall this replaced took up to 67; the search takes
        // about log2(N) + LEAF, plus the prefix and a syscall's argument tests.
        assert!(longest <= 30, "a call ran {longest} instructions");
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
