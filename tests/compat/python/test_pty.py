"""PTYs with the stock sync SDK: create, input, output, TERM, resize, kill, reconnect, user."""

from __future__ import annotations

import pytest

from e2b import CommandExitException, PtySize, SandboxException

from husk_compat import wait_for


def run_pty(sandbox, inputs, size=PtySize(rows=24, cols=80), **kwargs) -> str:
    """Starts a PTY, types `inputs` (bytes), then collects all output until the shell exits."""
    h = sandbox.pty.create(size, timeout=30, **kwargs)
    assert h.pid > 0
    for data in inputs:
        sandbox.pty.send_stdin(h.pid, data)
    chunks = []
    r = h.wait(on_pty=chunks.append)
    assert r.exit_code == 0
    assert all(isinstance(c, bytes) for c in chunks)
    return b"".join(chunks).decode("utf-8", "replace")


def test_pty_term_and_echo(sandbox):
    out = run_pty(sandbox, [b"echo $TERM\n", b"echo sum=$((40+2))\n", b"exit 0\n"])
    assert "xterm-256color" in out
    # The arithmetic result only appears if the shell ran the line (the echo of the typed
    # line shows "$((40+2))", not "42").
    assert "sum=42" in out


def test_pty_is_a_terminal(sandbox):
    out = run_pty(sandbox, [b"[ -t 0 ] && [ -t 1 ] && echo tty-$((1+1))\n", b"tty\n", b"exit 0\n"])
    assert "tty-2" in out
    assert "/dev/pts/" in out


def test_pty_initial_size_and_resize(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)
    line = b"echo size=$(stty size | tr ' ' x)\n"
    sandbox.pty.send_stdin(h.pid, line)
    buf = b""
    resized = False
    for _out, _err, pty in h:
        buf += pty or b""
        if not resized and b"size=24x80" in buf:
            sandbox.pty.resize(h.pid, PtySize(rows=40, cols=132))
            sandbox.pty.send_stdin(h.pid, line)
            sandbox.pty.send_stdin(h.pid, b"exit 0\n")
            resized = True
    assert resized, f"never saw the initial size 24x80 in: {buf!r}"
    assert b"size=40x132" in buf, buf


def test_pty_kill(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)
    assert h.pid in [p.pid for p in sandbox.commands.list()]
    assert sandbox.pty.kill(h.pid) is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code != 0
    assert sandbox.pty.kill(h.pid) is False


def test_pty_nonzero_exit(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)
    sandbox.pty.send_stdin(h.pid, b"exit 7\n")
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code == 7


def test_pty_user_cwd_envs(sandbox):
    out = run_pty(
        sandbox,
        [b'echo "who=$(whoami) dir=$(pwd) v=$MY_PTY_VAR"\n', b"exit 0\n"],
        user="root",
        cwd="/tmp",
        envs={"MY_PTY_VAR": "pty-value"},
    )
    assert "who=root dir=/tmp v=pty-value" in out


def test_pty_default_user(sandbox):
    out = run_pty(sandbox, [b'echo "who=$(whoami) home=$HOME"\n', b"exit 0\n"])
    assert "who=user home=/home/user" in out


def test_pty_reconnect(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)
    pid = h.pid
    h.disconnect()
    assert pid in [p.pid for p in sandbox.commands.list()]
    again = sandbox.pty.connect(pid, timeout=30)
    assert again.pid == pid
    sandbox.pty.send_stdin(pid, b"echo back-$((3*3))\n")
    sandbox.pty.send_stdin(pid, b"exit 0\n")
    chunks = []
    again.wait(on_pty=chunks.append)
    assert "back-9" in b"".join(chunks).decode("utf-8", "replace")


def test_pty_control_c_interrupts(sandbox):
    h = sandbox.pty.create(PtySize(rows=24, cols=80), timeout=30)
    sandbox.pty.send_stdin(h.pid, b"sleep 600\n")
    # Interrupt only once the sleep runs (a ^C before that would just clear the line).
    wait_for(
        lambda: sandbox.commands.run("pgrep -x sleep || true").stdout.strip(),
        15,
        "sleep to start in the PTY",
    )
    sandbox.pty.send_stdin(h.pid, b"\x03")
    sandbox.pty.send_stdin(h.pid, b"echo after-$((5+5))\n")
    sandbox.pty.send_stdin(h.pid, b"exit 0\n")
    chunks = []
    h.wait(on_pty=chunks.append)
    assert "after-10" in b"".join(chunks).decode("utf-8", "replace")


def test_pty_input_to_unknown_pid(sandbox):
    with pytest.raises(SandboxException):
        sandbox.pty.send_stdin(999999, b"x")
    with pytest.raises(SandboxException):
        sandbox.pty.resize(999999, PtySize(rows=10, cols=10))
