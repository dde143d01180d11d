"""Commands with the stock sync SDK: run, exit codes, output callbacks, env, cwd, users and sudo,
background handles, stdin, kill, timeouts, list, and reconnecting to a running process."""

from __future__ import annotations

import time

import pytest

from e2b import (
    CommandExitException,
    Sandbox,
    SandboxException,
    SandboxNotRunningException,
    TimeoutException,
)

from husk_compat import unique, wait_for


def test_run_echo(sandbox):
    r = sandbox.commands.run("echo hi")
    assert r.stdout == "hi\n"
    assert r.stderr == ""
    assert r.exit_code == 0
    assert r.error is None


def test_run_is_bash_login_shell(sandbox):
    r = sandbox.commands.run('echo "$0|$BASH_VERSION" ; shopt -q login_shell && echo login')
    first, second = r.stdout.splitlines()
    assert first.startswith("/bin/bash|") or first.startswith("bash|"), first
    assert first.split("|")[1], "BASH_VERSION is empty"
    assert second == "login"


def test_stdout_and_stderr_are_separate(sandbox):
    r = sandbox.commands.run("echo out; echo err >&2; echo out2")
    assert r.stdout == "out\nout2\n"
    assert r.stderr == "err\n"


def test_binary_and_unicode_output(sandbox):
    r = sandbox.commands.run("printf 'h\\xc3\\xa9llo \\xe2\\x9c\\x93\\n'")
    assert r.stdout == "héllo ✓\n"


def test_large_output(sandbox):
    r = sandbox.commands.run("seq 1 200000")
    lines = r.stdout.splitlines()
    assert len(lines) == 200000
    assert lines[0] == "1" and lines[-1] == "200000"


def test_nonzero_exit_raises_with_details(sandbox):
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("echo partial; echo boom >&2; exit 3")
    e = ei.value
    assert e.exit_code == 3
    assert e.stdout == "partial\n"
    assert e.stderr == "boom\n"
    assert "3" in str(e)


@pytest.mark.parametrize("cmd,code", [("false", 1), ("exit 42", 42), ("no-such-command-xyz", 127)])
def test_exit_codes(sandbox, cmd, code):
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run(cmd)
    assert ei.value.exit_code == code


def test_output_callbacks_in_order(sandbox):
    out, err = [], []
    r = sandbox.commands.run(
        "for i in $(seq 1 300); do echo line$i; echo e$i >&2; done",
        on_stdout=out.append,
        on_stderr=err.append,
    )
    expected_out = "".join(f"line{i}\n" for i in range(1, 301))
    expected_err = "".join(f"e{i}\n" for i in range(1, 301))
    assert "".join(out) == expected_out == r.stdout
    assert "".join(err) == expected_err == r.stderr


def test_callbacks_stream_before_exit(sandbox):
    """Output arrives while the command still runs, not only at the end."""
    seen = []

    def on_stdout(chunk):
        seen.append((time.monotonic(), chunk))

    start = time.monotonic()
    sandbox.commands.run("echo early; sleep 2; echo late", on_stdout=on_stdout)
    end = time.monotonic()
    text = "".join(c for _, c in seen)
    assert text == "early\nlate\n"
    first_at = seen[0][0]
    assert first_at - start < (end - start) - 1.0, "early output was held back until exit"


def test_envs_per_command_do_not_leak(sandbox):
    assert sandbox.commands.run("echo $ONE", envs={"ONE": "1"}).stdout == "1\n"
    assert sandbox.commands.run("echo ${ONE:-unset}").stdout == "unset\n"
    r = sandbox.commands.run('echo "$A-$B"', envs={"A": "x y", "B": "=z="})
    assert r.stdout == "x y-=z=\n"


def test_sandbox_envs_visible_and_overridable(sandbox_factory):
    sbx = sandbox_factory(envs={"SBX_VAR": "from-sandbox"})
    assert sbx.commands.run("echo $SBX_VAR").stdout == "from-sandbox\n"
    assert sbx.commands.run("echo $SBX_VAR", envs={"SBX_VAR": "override"}).stdout == "override\n"
    assert sbx.commands.run("echo $SBX_VAR").stdout == "from-sandbox\n"
    assert sbx.commands.run("echo $SBX_VAR", user="root").stdout == "from-sandbox\n"


def test_default_user_home_and_cwd(sandbox):
    r = sandbox.commands.run('whoami; id -u; echo "$HOME"; pwd; echo "$USER"')
    assert r.stdout.splitlines() == ["user", "1000", "/home/user", "/home/user", "user"]


def test_cwd(sandbox):
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    sandbox.files.make_dir("/home/user/work dir")
    assert sandbox.commands.run("pwd", cwd="/home/user/work dir").stdout == "/home/user/work dir\n"


def test_cwd_missing_fails(sandbox):
    with pytest.raises(SandboxException):
        sandbox.commands.run("pwd", cwd="/does/not/exist")


def test_user_root(sandbox):
    r = sandbox.commands.run("whoami; id -u; echo $HOME", user="root")
    assert r.stdout.splitlines() == ["root", "0", "/root"]
    # root can write where user cannot.
    sandbox.commands.run("echo secret > /root/only-root && chmod 600 /root/only-root", user="root")
    with pytest.raises(CommandExitException):
        sandbox.commands.run("cat /root/only-root")


def test_explicit_user_user(sandbox):
    assert sandbox.commands.run("whoami", user="user").stdout == "user\n"


def test_sudo(sandbox):
    assert sandbox.commands.run("sudo whoami").stdout == "root\n"
    assert sandbox.commands.run("sudo -n id -u").stdout == "0\n"
    sandbox.commands.run("sudo touch /tmp/made-by-sudo")
    assert sandbox.files.get_info("/tmp/made-by-sudo").owner == "root"


def test_sudo_passes_stdio_exit_codes_and_users(sandbox):
    # stdin, stdout and stderr are the caller's own.
    r = sandbox.commands.run("echo piped | sudo cat; sudo sh -c 'echo to-stderr >&2'")
    assert (r.stdout, r.stderr) == ("piped\n", "to-stderr\n")
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("sudo sh -c 'exit 7'")
    assert ei.value.exit_code == 7
    with pytest.raises(CommandExitException) as ei:
        sandbox.commands.run("sudo no-such-command-here")
    assert ei.value.exit_code == 1 and "command not found" in ei.value.stderr
    assert sandbox.commands.run("sudo -u user whoami").stdout == "user\n"
    # -i: a login shell in root's home; -s: the command through a shell.
    assert sandbox.commands.run("sudo -i pwd").stdout == "/root\n"
    assert sandbox.commands.run("cd /tmp && sudo -s 'echo $PWD $USER'").stdout == "/tmp root\n"
    # sudo resets the environment (like sudo's env_reset) unless -E.
    assert sandbox.commands.run("X=1 sudo sh -c 'echo ${X:-unset}'").stdout == "unset\n"
    assert sandbox.commands.run("X=1 sudo -E sh -c 'echo ${X:-unset}'").stdout == "1\n"


def test_sudo_forwards_signals(sandbox):
    h = sandbox.commands.run("sudo sleep 60", background=True)
    wait_for(
        lambda: sandbox.commands.run("pgrep -u root -x sleep || true").stdout.strip() != "",
        10,
        "root's sleep to start",
    )
    # The command runs as root; signalling sudo (the user's own process) reaches it.
    sandbox.commands.run("pkill -TERM -x sudo")
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code == 128 + 15


def test_background_wait(sandbox):
    h = sandbox.commands.run("sleep 1; echo done", background=True)
    assert h.pid > 0
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "done\n"


def test_background_wait_failure(sandbox):
    h = sandbox.commands.run("echo bad >&2; exit 5", background=True)
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code == 5
    assert ei.value.stderr == "bad\n"


def test_background_iterate(sandbox):
    h = sandbox.commands.run("echo a; echo b >&2; echo c", background=True)
    stdout, stderr = "", ""
    for out, err, _pty in h:
        stdout += out or ""
        stderr += err or ""
    assert stdout == "a\nc\n"
    assert stderr == "b\n"


def test_kill_background(sandbox):
    h = sandbox.commands.run("sleep 60", background=True)
    assert h.pid in [p.pid for p in sandbox.commands.list()]
    assert h.kill() is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code != 0
    wait_for(lambda: h.pid not in [p.pid for p in sandbox.commands.list()], 10, "killed pid to leave the list")
    assert sandbox.commands.kill(h.pid) is False


def test_kill_by_pid(sandbox):
    h = sandbox.commands.run("sleep 60", background=True)
    assert sandbox.commands.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        h.wait()


def test_kill_unknown_pid(sandbox):
    assert sandbox.commands.kill(999999) is False


def test_list_shows_running_commands(sandbox):
    marker = unique("listed")
    h = sandbox.commands.run(
        f"sleep 60 # {marker}", background=True, envs={"LISTED": marker}, cwd="/tmp"
    )
    try:
        procs = {p.pid: p for p in sandbox.commands.list()}
        assert h.pid in procs
        p = procs[h.pid]
        assert p.cmd == "/bin/bash"
        assert p.args == ["-l", "-c", f"sleep 60 # {marker}"]
        assert p.envs.get("LISTED") == marker
        assert p.cwd == "/tmp"
    finally:
        h.kill()
    wait_for(lambda: h.pid not in [p.pid for p in sandbox.commands.list()], 10, "pid to leave the list")


def test_list_is_empty_of_finished_commands(sandbox):
    r = sandbox.commands.run("echo finished")
    assert r.exit_code == 0
    args = [p.args for p in sandbox.commands.list()]
    assert ["-l", "-c", "echo finished"] not in args


def test_stdin_send_and_close(sandbox):
    h = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.send_stdin(h.pid, "hello\n")
    h.send_stdin(b"bytes too\n")
    sandbox.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.stdout == "hello\nbytes too\n"


def test_stdin_line_by_line(sandbox):
    h = sandbox.commands.run("read a; read b; echo \"$b+$a\"", background=True, stdin=True)
    h.send_stdin("first\n")
    h.send_stdin("second\n")
    assert h.wait().stdout == "second+first\n"


def test_no_stdin_by_default(sandbox):
    """Without stdin=True the SDK sends stdin:false, and a reader sees EOF at once."""
    r = sandbox.commands.run("cat; echo eof", timeout=20)
    assert r.stdout == "eof\n"


def test_send_stdin_to_unknown_pid(sandbox):
    with pytest.raises(SandboxException):
        sandbox.commands.send_stdin(999999, "x")


def test_command_timeout_kills_process(sandbox):
    marker = unique("timeout")
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        sandbox.commands.run(f"sleep 30 # {marker}", timeout=2)
    assert time.monotonic() - start < 15
    # The timeout is the process lifetime: the server kills it.
    wait_for(
        lambda: not any(marker in " ".join(p.args) for p in sandbox.commands.list()),
        15,
        "the timed-out process to be killed",
    )


def test_disconnect_does_not_kill_and_connect_resumes(sandbox):
    h = sandbox.commands.run(
        "echo started; while [ ! -f /tmp/go ]; do sleep 0.1; done; echo finished",
        background=True,
        timeout=60,
    )
    pid = h.pid
    h.disconnect()
    # Still running after the client went away.
    assert pid in [p.pid for p in sandbox.commands.list()]

    again = sandbox.commands.connect(pid, timeout=60)
    assert again.pid == pid
    sandbox.files.write("/tmp/go", "")
    r = again.wait()
    assert r.exit_code == 0
    assert "finished\n" in r.stdout


def test_connect_to_unknown_pid(sandbox):
    with pytest.raises(SandboxException):
        sandbox.commands.connect(999999)


def test_two_connections_see_same_output(sandbox):
    h = sandbox.commands.run(
        "while [ ! -f /tmp/go2 ]; do sleep 0.1; done; echo together", background=True
    )
    other = sandbox.commands.connect(h.pid)
    sandbox.files.write("/tmp/go2", "")
    assert h.wait().stdout == "together\n"
    assert other.wait().stdout == "together\n"


def test_concurrent_background_commands(sandbox):
    handles = [sandbox.commands.run(f"sleep 1; echo n{i}", background=True) for i in range(5)]
    assert len({h.pid for h in handles}) == 5
    assert [h.wait().stdout for h in handles] == [f"n{i}\n" for i in range(5)]


def test_python3_available(sandbox):
    r = sandbox.commands.run("python3 -c 'print(6*7)'")
    assert r.stdout == "42\n"


def test_usr_is_read_only(sandbox):
    with pytest.raises(CommandExitException):
        sandbox.commands.run("touch /usr/husk-compat-should-fail", user="root")


def test_killing_the_sandbox_during_a_command_reports_it_killed(sandbox, husk):
    # E2B: the stream breaks off, the SDK's health probe finds the sandbox gone, and the
    # waiting caller gets SandboxNotRunningException "... was killed or reached its end of
    # life while the request was in flight".
    h = sandbox.commands.run("sleep 60", background=True)
    wait_for(
        lambda: h.pid in [p.pid for p in sandbox.commands.list()], 10, "the command to start"
    )
    assert Sandbox.kill(sandbox.sandbox_id, **husk.opts()) is True
    with pytest.raises(SandboxNotRunningException) as e:
        h.wait()
    assert "was killed or reached its end of life" in str(e.value), str(e.value)
