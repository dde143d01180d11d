//! `sudo` inside a husk sandbox: this binary, run under the name `sudo` (it is
//! `/usr/local/bin/sudo` in server sandboxes). It asks the sandbox's agent to run the command
//! as root with this process's stdin, stdout and stderr, forwards the signals a terminal or
//! parent sends it, and exits with the command's status. Passwordless, and no setuid file.

use std::os::fd::AsFd;

use husk_proto::sudo::{SudoReply, SudoRequest, SudoToAgent, MAX_MESSAGE, SOCKET};
use husk_proto::User;
use husk_runtime::sys;

const USAGE: &str = "usage: sudo [-nEHksv] [-u user] [-i | -s] [--] [command [arg ...]]";

/// Signals forwarded to the command: the same as `husk run` forwards.
use crate::run::HANDLED_SIGNALS as FORWARDED;

/// What the command line asks for.
#[derive(Debug, Default, PartialEq, Eq)]
struct Options {
    user: Option<String>,
    login: bool,
    shell: bool,
    preserve_env: bool,
    /// `-v`, `-k`, `-l`, `-h`, `-V`: answered without running anything.
    info: Option<&'static str>,
    argv: Vec<String>,
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        if let Some(long) = a.strip_prefix("--") {
            match long {
                "login" => o.login = true,
                "shell" => o.shell = true,
                "preserve-env" => o.preserve_env = true,
                "non-interactive" | "set-home" | "reset-timestamp" | "validate" => {}
                "help" => o.info = Some(USAGE),
                "user" => {
                    i += 1;
                    o.user = Some(
                        args.get(i)
                            .ok_or("sudo: option requires an argument -- u")?
                            .clone(),
                    );
                }
                _ if long.starts_with("user=") => o.user = Some(long["user=".len()..].into()),
                _ => return Err(format!("sudo: unrecognized option '{a}'\n{USAGE}")),
            }
            i += 1;
            continue;
        }
        let flags: Vec<char> = a[1..].chars().collect();
        let mut j = 0;
        while j < flags.len() {
            match flags[j] {
                'n' | 'H' | 'S' | 'A' | 'b' => {}
                'E' => o.preserve_env = true,
                'i' => o.login = true,
                's' => o.shell = true,
                'k' | 'v' => o.info = o.info.or(Some("")),
                'l' => {
                    o.info = Some("User user may run the following commands on this sandbox:\n    (ALL) NOPASSWD: ALL")
                }
                'h' => o.info = Some(USAGE),
                'V' => o.info = Some("sudo (husk's sandbox sudo)"),
                'u' => {
                    let rest: String = flags[j + 1..].iter().collect();
                    o.user = Some(if rest.is_empty() {
                        i += 1;
                        args.get(i).ok_or("sudo: option requires an argument -- u")?.clone()
                    } else {
                        rest
                    });
                    j = flags.len();
                    continue;
                }
                c => return Err(format!("sudo: invalid option -- '{c}'\n{USAGE}")),
            }
            j += 1;
        }
        i += 1;
    }
    o.argv = args[i.min(args.len())..].to_vec();
    if o.login && o.shell {
        return Err(format!(
            "sudo: you may not specify both the -i and -s options\n{USAGE}"
        ));
    }
    Ok(o)
}

fn target(user: Option<&str>) -> Result<User, String> {
    match user {
        None | Some("root") | Some("#0") | Some("0") => Ok(User::Root),
        Some("user") | Some("#1000") | Some("1000") => Ok(User::User),
        Some(other) => Err(format!("sudo: unknown user {other}")),
    }
}

/// Runs `sudo` with the arguments after the program name; returns the exit status.
pub fn main(args: &[String]) -> i32 {
    let opts = match parse(args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    if let Some(text) = opts.info {
        if !text.is_empty() {
            println!("{text}");
        }
        if opts.argv.is_empty() {
            return 0;
        }
    }
    if opts.argv.is_empty() && !opts.login && !opts.shell {
        eprintln!("{USAGE}");
        return 1;
    }
    let user = match target(opts.user.as_deref()) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("{e}");
            return 1;
        }
    };
    let request = SudoToAgent::Run(SudoRequest {
        argv: opts.argv,
        user,
        env: std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .collect(),
        preserve_env: opts.preserve_env,
        cwd: std::env::current_dir()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".into()),
        login: opts.login,
        shell: opts.shell,
    });
    let bytes = match postcard::to_stdvec(&request) {
        Ok(b) if b.len() <= MAX_MESSAGE => b,
        _ => {
            eprintln!("sudo: argument list and environment too long");
            return 1;
        }
    };
    // Signals are taken before the request goes out, so none is lost in between.
    let sigfd = match sys::signalfd(FORWARDED) {
        Ok(fd) => fd,
        Err(e) => {
            eprintln!("sudo: {e}");
            return 1;
        }
    };
    let sock = match sys::connect_abstract(SOCKET) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "sudo: husk's agent is not reachable ({e}); sudo works inside husk sandboxes"
            );
            return 1;
        }
    };
    if let Err(e) = sys::send_with_fds(sock.as_fd(), &bytes, &[0, 1, 2]) {
        eprintln!("sudo: {e}");
        return 1;
    }
    wait(&sock, &sigfd)
}

/// Forwards signals until the agent says how the command ended.
fn wait(sock: &std::os::fd::OwnedFd, sigfd: &std::os::fd::OwnedFd) -> i32 {
    use std::os::fd::AsRawFd;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        if let Err(e) = sys::poll(&mut fds, -1) {
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            eprintln!("sudo: {e}");
            return 1;
        }
        if fds[1].revents != 0 {
            while let Ok(Some(sig)) = sys::read_signalfd(sigfd.as_fd()) {
                if let Ok(b) = postcard::to_stdvec(&SudoToAgent::Signal(sig)) {
                    let _ = sys::send_with_fds(sock.as_fd(), &b, &[]);
                }
            }
        }
        if fds[0].revents != 0 {
            let mut buf = vec![0u8; MAX_MESSAGE];
            return match sys::recv_with_fds(sock.as_fd(), &mut buf) {
                Ok((n, _)) if n > 0 => match postcard::from_bytes::<SudoReply>(&buf[..n]) {
                    Ok(SudoReply::Exited(code)) => code,
                    Ok(SudoReply::Failed(msg)) => {
                        eprintln!("{msg}");
                        1
                    }
                    Err(e) => {
                        eprintln!("sudo: malformed answer: {e}");
                        1
                    }
                },
                _ => {
                    eprintln!("sudo: the agent closed the connection");
                    1
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Options, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_and_command_are_told_apart() {
        let o = p(&["-n", "id", "-u"]).unwrap();
        assert_eq!(o.argv, ["id", "-u"]);
        assert!(o.user.is_none());
        let o = p(&["-nEu", "user", "--", "-x"]).unwrap();
        assert_eq!(
            (o.user.as_deref(), o.preserve_env, o.argv.clone()),
            (Some("user"), true, vec!["-x".to_string()])
        );
        assert_eq!(
            p(&["-uroot", "true"]).unwrap().user.as_deref(),
            Some("root")
        );
        assert_eq!(
            p(&["--user=user", "true"]).unwrap().user.as_deref(),
            Some("user")
        );
        let o = p(&["-i"]).unwrap();
        assert!(o.login && o.argv.is_empty());
        assert!(p(&["-i", "-s"]).is_err());
        assert!(p(&["-Z", "true"]).is_err());
        assert!(p(&["-u"]).is_err());
        assert_eq!(p(&["-v"]).unwrap().info, Some(""));
    }

    #[test]
    fn only_the_sandbox_users_are_targets() {
        assert_eq!(target(None), Ok(User::Root));
        assert_eq!(target(Some("#0")), Ok(User::Root));
        assert_eq!(target(Some("user")), Ok(User::User));
        assert!(target(Some("nobody")).is_err());
    }
}
