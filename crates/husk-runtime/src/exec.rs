//! Starting a process inside a sandbox, from its PID 1 (husk's init or the agent): fork, then
//! in the child the default `oom_score_adj`, a new session, the terminal or the given stdio,
//! the working directory, the user, the fences, and `execve`. Every process of a sandbox but
//! PID 1 starts here (commands, PTYs, code kernels, `sudo`'s commands).
//!
//! Everything the child needs is built before the fork ([`ExecPlan`]), so the child allocates
//! nothing between fork and exec but what `std::env::set_current_dir` and error paths need.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::Path;

use crate::fences::{CommandDomain, Fences, Rlimits};
use crate::spec::{Limits, User};
use crate::sys;

/// The default `PATH` of sandbox processes.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// argv, envp and the candidate paths of the executable, built before the fork.
#[derive(Debug)]
pub struct ExecPlan {
    argv: Vec<CString>,
    envp: Vec<CString>,
    candidates: Vec<CString>,
    workdir: CString,
    user: User,
    rlimits: Rlimits,
}

/// Where the new process's fds 0, 1 and 2 come from.
#[derive(Debug, Clone, Copy)]
pub enum Stdio {
    /// The parent's own 0, 1, 2.
    Inherit,
    /// These fds (of the parent) become 0, 1, 2.
    Fds([RawFd; 3]),
    /// This PTY slave becomes the controlling terminal and 0, 1, 2.
    Tty(RawFd),
}

fn cstr(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

impl ExecPlan {
    /// Plans running `argv` as `user` in `workdir` with exactly the environment `env` (its
    /// `PATH` is searched for a program name without `/`). `limits` bound the process's
    /// rlimits (processes, file size).
    pub fn new(
        argv: &[String],
        env: &[(String, String)],
        workdir: &str,
        user: User,
        limits: &Limits,
    ) -> io::Result<ExecPlan> {
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.as_str())
            .unwrap_or(DEFAULT_PATH);
        let prog = argv
            .first()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        let candidates = if prog.contains('/') {
            vec![cstr(prog)?]
        } else {
            path.split(':')
                .filter(|d| !d.is_empty())
                .map(|d| cstr(&format!("{d}/{prog}")))
                .collect::<io::Result<_>>()?
        };
        Ok(ExecPlan {
            argv: argv.iter().map(|a| cstr(a)).collect::<io::Result<_>>()?,
            envp: env
                .iter()
                .map(|(k, v)| cstr(&format!("{k}={v}")))
                .collect::<io::Result<_>>()?,
            candidates,
            workdir: cstr(workdir)?,
            user,
            rlimits: Rlimits {
                nproc: Some(limits.pids),
                fsize: Some(limits.disk_bytes),
                ..Rlimits::default()
            },
        })
    }
}

/// Forks and executes `plan`; returns the new process's pid, or the error that kept it from
/// executing (reported by the child through a close-on-exec pipe, so a failed exec is never
/// mistaken for the program's own exit).
///
/// The caller must be a single-threaded process (PID 1 of a sandbox is).
///
/// Every process started here gets a Landlock domain of its own, nested in the sandbox's
/// (see [`CommandDomain`]): the processes of one command cannot read the environment
/// (`/proc/PID/environ`) or memory of another command's, while signals between them work.
pub fn spawn(fences: &Fences, plan: &ExecPlan, stdio: Stdio) -> io::Result<libc::pid_t> {
    let domain = fences
        .command_domain()
        .map_err(|e| io::Error::other(e.to_string()))?;
    let (err_r, err_w) = sys::pipe()?;
    // SAFETY: sandbox PID 1 (init or the agent) is single-threaded: a fork of the
    // single-threaded spawner that never starts a thread.
    let pid = unsafe { sys::fork() }?;
    if pid == 0 {
        drop(err_r);
        let e = exec_child(fences, domain, plan, stdio, err_w.as_raw_fd());
        let code = e.raw_os_error().unwrap_or(libc::EIO);
        let _ = sys::write_all(err_w.as_fd(), &code.to_le_bytes());
        sys::exit_now(127);
    }
    drop(err_w);
    let mut buf = [0u8; 4];
    match sys::read(err_r.as_fd(), &mut buf) {
        Ok(4) => {
            // The child failed before or at execve and exits; reap it here so its status is
            // not reported as the program's exit.
            let _ = sys::waitpid(pid, 0);
            Err(io::Error::from_raw_os_error(i32::from_le_bytes(buf)))
        }
        _ => Ok(pid),
    }
}

/// In the forked child: session, terminal, user, fences, the command's own Landlock domain,
/// exec. Returns only on error.
fn exec_child(
    fences: &Fences,
    domain: CommandDomain,
    p: &ExecPlan,
    stdio: Stdio,
    err_fd: RawFd,
) -> io::Error {
    let step = || -> io::Result<()> {
        // PID 1 is the last thing of its sandbox the OOM killer may take (crate::oom); its
        // children inherit its value and must not share that protection. Before anything
        // else, so that nothing of the program runs with it.
        sys::set_own_oom_score_adj(crate::oom::PROCESS)?;
        // PID 1 built the root with umask 0; processes (and a workdir made for them) get the
        // conventional 022.
        sys::umask(0o022);
        sys::reset_signals()?;
        // A new session: the process can never reach a terminal of the host through its
        // session (TIOCSTI is also denied by seccomp).
        sys::setsid()?;
        match stdio {
            Stdio::Inherit => {}
            Stdio::Fds(fds) => {
                for (i, fd) in fds.iter().enumerate() {
                    sys::dup2(*fd, i as RawFd)?;
                }
            }
            Stdio::Tty(t) => {
                for i in 0..3 {
                    sys::dup2(t, i)?;
                }
                crate::pty::set_controlling(sys::stdio_fd(0))?;
            }
        }
        let root = p.user == User::Root;
        let id = p.user.id();
        let wd = Path::new(std::str::from_utf8(p.workdir.as_bytes()).unwrap_or("/"));
        if std::env::set_current_dir(wd).is_err() {
            std::fs::create_dir_all(wd)?;
            sys::lchown(&p.workdir, id, id)?;
            std::env::set_current_dir(wd)?;
        }
        fences
            .drop_bounding(root)
            .map_err(|e| io::Error::other(e.to_string()))?;
        sys::become_user(id, id)?;
        fences
            .apply_after_setuid(root, &p.rlimits)
            .map_err(|e| io::Error::other(e.to_string()))?;
        // After no_new_privs (set just above), before the ruleset's fd is closed.
        domain.enter()?;
        sys::close_fds_from(3, &[err_fd]);
        Ok(())
    };
    if let Err(e) = step() {
        return e;
    }
    let mut last = io::Error::from_raw_os_error(libc::ENOENT);
    for path in &p.candidates {
        let e = sys::execve(path, &p.argv, &p.envp);
        // Keep searching PATH past missing entries, remember a permission problem.
        if e.raw_os_error() != Some(libc::ENOENT) || last.raw_os_error() == Some(libc::ENOENT) {
            last = e;
        }
    }
    last
}
