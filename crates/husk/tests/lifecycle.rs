//! How a sandbox ends, and that nothing of it survives any ending.

mod common;
use common::*;

use std::process::Command;
use std::time::Duration;

#[test]
fn exit_codes_propagate() {
    assert_eq!(husk_run(&[], &["/bin/sh", "-c", "exit 42"]).code, 42);
    assert_eq!(husk_run(&[], &["/bin/true"]).code, 0);
    assert_eq!(husk_run(&[], &["/bin/false"]).code, 1);
    let r = husk_run(&[], &["/bin/sh", "-c", "kill -SEGV $$"]);
    assert_eq!(r.code, 128 + 11);
    assert!(r.stderr.contains("husk: killed: SIGSEGV"), "{}", r.stderr);
}

#[test]
fn missing_or_non_executable_commands_are_reported() {
    let r = husk_run(&[], &["no-such-command"]);
    assert_eq!(r.code, 127);
    assert!(
        r.stderr.contains("command not found in the sandbox"),
        "{}",
        r.stderr
    );
    let r = husk_run(&[], &["/etc/hostname"]);
    assert_eq!(r.code, 126, "{}", r.stderr);
    assert!(r.stderr.contains("permission denied"), "{}", r.stderr);
}

#[test]
fn background_processes_die_with_the_command() {
    let r = husk_run(
        &[],
        &["/bin/sh", "-c", "sleep 300 & sleep 300 & echo started"],
    );
    r.ok();
    assert_eq!(r.stdout.trim(), "started");
    // husk_run already asserted that no process of the sandbox survives.
    assert!(r.elapsed < Duration::from_secs(30));
}

#[test]
fn sigterm_to_husk_is_forwarded_and_everything_is_cleaned_up() {
    let dir = TempDir::new("term");
    let (child, id) = husk_spawn(
        &[],
        &[
            "/bin/sh",
            "-c",
            "trap 'echo got-term; exit 7' TERM; sleep 100 & wait",
        ],
        &dir,
    );
    wait_until_running(&id, "sleep");
    signal_process(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "got-term");
    assert_gone(&id);
}

#[test]
fn sigkill_of_husk_takes_the_sandbox_down_and_the_next_run_reaps_its_cgroups() {
    let dir = TempDir::new("kill");
    let (mut child, id) = husk_spawn(&[], &["/bin/sleep", "100"], &dir);
    wait_until_running(&id, "sleep");
    child.kill().unwrap();
    child.wait().unwrap();
    // PID 1 has PDEATHSIG: the kernel kills the sandbox when husk dies.
    wait_for(Duration::from_secs(10), || {
        sandbox_pids(&id).is_empty().then_some(())
    })
    .expect("sandbox processes outlived a SIGKILLed husk");
    // Its cgroups are reaped by the next husk whose sweep is due (at most one sweep per
    // `SWEEP_EVERY` among husk processes; the last one is made older than that here).
    sweep_due_now();
    husk_run(&[], &["/bin/true"]).ok();
    assert_gone(&id);
}

#[test]
fn stdin_is_passed_through() {
    let data: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let r = husk_run_stdin(&[], &["/usr/bin/sha256sum"], Some(&data));
    r.ok();
    let expected = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&data)?;
            c.wait_with_output()
        })
        .unwrap();
    assert_eq!(r.stdout, String::from_utf8_lossy(&expected.stdout));
}

#[test]
fn env_workdir_user_and_hostname_flags_apply() {
    let r = husk_run(
        &[
            "--env",
            "GREETING=hi there",
            "--workdir",
            "/tmp/work",
            "--user",
            "root",
            "--hostname",
            "h1",
        ],
        &[
            "/bin/sh",
            "-c",
            "echo \"$GREETING\"; pwd; id -u; hostname; echo $HOME",
        ],
    );
    r.ok();
    let lines: Vec<&str> = r.stdout.lines().collect();
    assert_eq!(lines, ["hi there", "/tmp/work", "0", "h1", "/root"]);
    let r = husk_run(
        &[],
        &["/bin/sh", "-c", "id -un; pwd; echo $HOME; echo $PATH"],
    );
    let lines: Vec<&str> = r.ok().stdout.lines().collect();
    assert_eq!(lines[..3], ["user", "/home/user", "/home/user"]);
    assert!(lines[3].contains("/usr/bin"));
}

#[test]
fn tty_gives_an_interactive_shell() {
    let r = husk_run_stdin(
        &["-t"],
        &["/bin/bash", "-i"],
        Some(b"echo hi-$((40+2))\ntty\nexit 3\n"),
    );
    assert_eq!(r.code, 3, "{}", r.stdout);
    assert!(r.stdout.contains("hi-42"), "{}", r.stdout);
    assert!(r.stdout.contains("/dev/pts/0"), "{}", r.stdout);
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    use std::io::Read;
    let mut child = Command::new(HUSK)
        .args(["run", "--", "/usr/bin/yes"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    assert_eq!(&first, b"y\ny\n");
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 13));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

#[test]
fn a_command_ignoring_stop_signals_cannot_keep_husk_alive() {
    let dir = TempDir::new("ignore");
    let (child, id) = husk_spawn(
        &[],
        &[
            "/bin/sh",
            "-c",
            "trap '' TERM INT HUP; sleep 100 & wait; sleep 100",
        ],
        &dir,
    );
    wait_until_running(&id, "sleep");
    for _ in 0..2 {
        signal_process(&child, "TERM");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("husk: killed: second SIGTERM"), "{err}");
    assert_gone(&id);
}

#[test]
fn timeout_holds_while_the_host_reader_stalls() {
    // With -t, husk relays the PTY to its stdout; a reader that never reads must not stop the
    // timeout.
    let start = std::time::Instant::now();
    let mut child = Command::new(HUSK)
        .args(["run", "-t", "--timeout", "1s", "--", "/usr/bin/yes"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(Duration::from_secs(10), || child.try_wait().unwrap())
        .expect("husk did not end while its stdout was not read");
    assert_eq!(status.code(), Some(124));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_file_given_as_stdout_is_appended_to_and_cannot_be_rewritten() {
    let dir = TempDir::new("log");
    let log = dir.path().join("log.txt");
    std::fs::write(&log, "earlier line\n").unwrap();
    let out = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    let code = "import os\n\
        print('new line', flush=True)\n\
        try: os.ftruncate(1, 0)\n\
        except OSError: pass\n\
        try: os.pwrite(1, b'XXXXXXXX', 0)\n\
        except OSError: pass\n";
    let status = Command::new(HUSK)
        .args(["run", "--", "/usr/bin/python3", "-c", code])
        .stdin(std::process::Stdio::null())
        .stdout(out)
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "earlier line\nnew line\n"
    );
}

#[test]
fn timeout_holds_while_a_host_terminal_is_not_read() {
    // A terminal nobody reads (a paused terminal, a hung ssh): POLLOUT on it does not promise
    // room for a whole write, so husk must write to it without blocking.
    let (_master, slave) = husk_runtime::pty::open_pair().unwrap();
    let start = std::time::Instant::now();
    let mut child = Command::new(HUSK)
        .args(["run", "--timeout", "1s", "--", "/usr/bin/yes"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::from(slave))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_for(Duration::from_secs(15), || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
    }
    let status = status.expect("husk did not end while its terminal was not read");
    assert_eq!(status.code(), Some(124));
    assert!(
        start.elapsed() < Duration::from_secs(6),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn the_timeout_holds_even_while_husk_is_stopped() {
    let dir = TempDir::new("stopped");
    let (child, id) = husk_spawn(&["--timeout", "1s"], &["/bin/sleep", "30"], &dir);
    wait_until_running(&id, "sleep");
    signal_process(&child, "STOP");
    // PID 1 enforces the timeout itself while husk cannot.
    let gone = wait_for(Duration::from_secs(10), || {
        (!sandbox_runs(&id, "sleep")).then_some(())
    });
    signal_process(&child, "CONT");
    assert!(
        gone.is_some(),
        "the command outlived its timeout while husk was stopped"
    );
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("husk: killed: timeout after 1s"));
    assert_gone(&id);
}

#[test]
fn end_of_piped_input_reaches_a_command_on_a_pty() {
    let r = husk_run_stdin(&["-t"], &["/bin/cat"], Some(b"one\ntwo\n"));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("two"), "{}", r.stdout);
}

#[test]
fn the_run_ends_when_nobody_reads_its_output_any_more() {
    use std::io::Read;
    let mut child = Command::new(HUSK)
        .args(["run", "-t", "--", "/usr/bin/yes"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 4];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let status = wait_for(Duration::from_secs(10), || child.try_wait().unwrap());
    if status.is_none() {
        let _ = child.kill();
    }
    assert_eq!(status.expect("husk kept running").code(), Some(128 + 13));
}
