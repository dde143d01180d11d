"""Pause and resume with the stock sync SDK (e2b==2.63.0): `pause()` (mode "full", the default,
and mode "filesystem"), the paused state in info and lists, calls to a paused sandbox, resuming
through `connect()` (and the deprecated raw `POST /sandboxes/{id}/resume`), what survives each
kind of pause (files, processes, memory, envs, metadata, the envd access token), layers of
repeated filesystem pauses, `lifecycle={"on_timeout": "pause", "auto_resume": ...}`, tenancy,
killing a paused sandbox (nothing left in the state dir) and the team quota."""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import subprocess
import time

import pytest

from e2b import (
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from husk_compat import counter, create_raw_sandbox, http_request, ticks, unique, wait_for

# Calls that must fail on a paused sandbox get a short budget: a bug must not hang the test.
SHORT = 10
UNKNOWN_ID = "nosuchsandbox0000000"

# An in-memory counter: `i` lives only in the shell's memory. Each tick appends "i epoch" to
# /tmp/ticks (one append per line, so a reader sees whole lines but perhaps a torn last one).
TICKER = 'i=0\nwhile :; do\n  i=$((i+1))\n  echo "$i $(date +%s.%N)" >> /tmp/ticks\n  sleep 0.1\ndone\n'


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def ids(paginator) -> dict:
    """{sandbox_id: state} of every page."""
    out = {}
    while paginator.has_next:
        for s in paginator.next_items():
            out[s.sandbox_id] = s.state
    return out


def listed(opts: dict, tag=None, states=None) -> dict:
    query = SandboxQuery(metadata={"suite": tag} if tag else None, state=states)
    return ids(Sandbox.list(query=query, **opts))


def state_of(sandbox_id: str, opts: dict):
    return Sandbox.get_info(sandbox_id, **opts).state


def wait_until_paused(sandbox_id: str, opts: dict, timeout: float = 40):
    """Polls get_info until the sandbox is paused (a SandboxNotFoundException, e.g. because it
    was killed at its timeout instead, fails the test right away)."""
    wait_for(
        lambda: state_of(sandbox_id, opts) == SandboxState.PAUSED,
        timeout,
        f"sandbox {sandbox_id} to be paused",
        0.25,
    )


def assert_calls_say_paused(sbx: Sandbox, path: str) -> None:
    """In-sandbox calls to a paused sandbox (no auto-resume) fail, saying it is paused."""
    with pytest.raises(SandboxException) as ei:
        sbx.commands.run("true", timeout=SHORT, request_timeout=SHORT)
    assert "paused" in str(ei.value).lower(), repr(ei.value)
    with pytest.raises(SandboxException) as ei:
        sbx.files.read(path, request_timeout=SHORT)
    assert "paused" in str(ei.value).lower(), repr(ei.value)


def procs(sbx: Sandbox) -> dict:
    return {p.pid: p for p in sbx.commands.list()}


# --- full pauses ------------------------------------------------------------------------------


def test_pause_marks_the_sandbox_paused_and_lists_it_as_such(sandbox_factory, opts):
    tag = unique("pause")
    a = sandbox_factory(metadata={"suite": tag, "who": "a"})
    b = sandbox_factory(metadata={"suite": tag, "who": "b"})
    a.files.write("/home/user/x.txt", "x")

    assert a.pause() is True
    info = a.get_info()
    assert info.state == SandboxState.PAUSED
    assert info.sandbox_id == a.sandbox_id
    assert info.metadata == {"suite": tag, "who": "a"}
    assert b.get_info().state == SandboxState.RUNNING

    assert listed(opts, tag, [SandboxState.PAUSED]) == {a.sandbox_id: SandboxState.PAUSED}
    assert listed(opts, tag, [SandboxState.RUNNING]) == {b.sandbox_id: SandboxState.RUNNING}
    both = {a.sandbox_id: SandboxState.PAUSED, b.sandbox_id: SandboxState.RUNNING}
    assert listed(opts, tag, [SandboxState.RUNNING, SandboxState.PAUSED]) == both
    # No state filter: E2B lists running and paused sandboxes.
    assert listed(opts, tag) == both
    assert a.sandbox_id in listed(opts, states=[SandboxState.PAUSED])
    assert a.sandbox_id not in listed(opts, states=[SandboxState.RUNNING])

    # Pausing again is a 409: False, from the instance and the static call alike.
    assert a.pause() is False
    assert Sandbox.pause(a.sandbox_id, **opts) is False
    assert a.get_info().state == SandboxState.PAUSED

    # Nothing runs in it: the proxy reports it not running, and calls say it is paused.
    assert a.is_running() is False
    assert_calls_say_paused(a, "/home/user/x.txt")
    # Those failed calls did not resume it.
    assert a.get_info().state == SandboxState.PAUSED
    # The other sandbox is untouched.
    assert b.commands.run("echo b").stdout == "b\n"


@pytest.mark.timeout(120)
def test_full_pause_keeps_files_processes_memory_and_envs(sandbox_factory, opts):
    tag = unique("full")
    marker = unique("sleeper")
    sbx = sandbox_factory(envs={"PAUSE_ENV": "full-env"}, metadata={"suite": tag})
    sbx.files.write("/home/user/before.txt", "written before the pause")
    sleeper = sbx.commands.run(f"sleep 1000 # {marker}", background=True)
    sbx.files.write("/tmp/ticker.sh", TICKER)
    ticker = sbx.commands.run("sh /tmp/ticker.sh", background=True)
    wait_for(lambda: counter(sbx) >= 10, 30, "the ticker to count to 10", 0.2)
    before = procs(sbx)
    assert sleeper.pid in before and ticker.pid in before

    c0 = counter(sbx)
    assert sbx.pause() is True
    paused_at = time.monotonic()
    assert sbx.get_info().state == SandboxState.PAUSED
    # Stay paused for at least 2 s (bounded): frozen processes must show that gap.
    wait_for(
        lambda: state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
        and time.monotonic() - paused_at >= 2.0,
        20,
        "2 s of pause",
        0.25,
    )

    resume_started = time.monotonic()
    same = Sandbox.connect(sbx.sandbox_id, timeout=200, **opts)
    paused_for = resume_started - paused_at
    assert same.sandbox_id == sbx.sandbox_id
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"suite": tag}
    # A resume starts the timeout the connect asked for.
    left = (info.end_at - now()).total_seconds()
    assert 185 <= left <= 205, left
    assert sbx.is_running() is True

    # Files (through the instance made before the pause: same envd access token).
    assert sbx.files.read("/home/user/before.txt") == "written before the pause"
    assert same.files.read("/home/user/before.txt") == "written before the pause"

    # Processes: the same pids, still running the same commands.
    after = procs(sbx)
    assert sleeper.pid in after, (sleeper.pid, after)
    assert after[sleeper.pid].args == ["-l", "-c", f"sleep 1000 # {marker}"]
    assert ticker.pid in after, (ticker.pid, after)
    assert after[ticker.pid].args == ["-l", "-c", "sh /tmp/ticker.sh"]

    # Memory: the counter goes on from where it was and keeps counting.
    c1 = counter(sbx)
    assert c1 >= c0, (c0, c1)
    wait_for(lambda: counter(sbx) >= c1 + 5, 20, "the ticker to count on after the resume", 0.2)
    got = ticks(sbx)
    # One shell counted all along: no restart from 1, no line lost.
    assert [i for i, _ in got] == list(range(1, len(got) + 1)), got[:5]
    # And it did not run while paused: one gap between two ticks spans the pause.
    longest = max(b[1] - a[1] for a, b in zip(got, got[1:]))
    assert longest >= paused_for - 0.5, (longest, paused_for)

    # Envs of the create, and the default user and directory.
    r = sbx.commands.run('echo "$PAUSE_ENV|$(whoami)|$(pwd)"')
    assert r.stdout == "full-env|user|/home/user\n"
    assert sleeper.kill() is True


def test_instance_connect_resumes_and_sets_the_timeout(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=60)
    sbx.files.write("/tmp/inst", "instance")
    assert sbx.pause() is True
    assert sbx.connect(timeout=300) is sbx
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert 290 <= (info.end_at - now()).total_seconds() <= 310
    assert sbx.files.read("/tmp/inst") == "instance"
    assert sbx.commands.run("cat /tmp/inst").stdout == "instance"
    # Connecting to the running sandbox changes nothing.
    assert Sandbox.connect(sbx.sandbox_id, **opts).sandbox_id == sbx.sandbox_id
    assert sbx.get_info().state == SandboxState.RUNNING
    # Pause and resume again: the cycle repeats.
    assert Sandbox.pause(sbx.sandbox_id, **opts) is True
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    assert sbx.connect() is sbx
    assert sbx.files.read("/tmp/inst") == "instance"


def test_commands_connect_reattaches_after_a_resume(sandbox):
    h = sandbox.commands.run(
        "while [ ! -f /tmp/go ]; do sleep 0.1; done; echo resumed-output", background=True
    )
    pid = h.pid
    assert sandbox.pause() is True
    assert sandbox.connect() is sandbox
    assert pid in procs(sandbox)
    again = sandbox.commands.connect(pid)
    sandbox.files.write("/tmp/go", "")
    r = again.wait()
    assert (r.exit_code, r.stdout, r.stderr) == (0, "resumed-output\n", "")
    assert pid not in procs(sandbox)


def test_raw_resume_and_connect_statuses(husk, cleanup_ids):
    raw = create_raw_sandbox(husk.port, husk.admin_key)
    sid, token = raw["sandboxID"], raw["envdAccessToken"]
    cleanup_ids.append((sid, husk.admin_key))
    key = {"X-API-KEY": husk.admin_key}
    js = {**key, "Content-Type": "application/json"}

    def post(path, body=b'{"timeout": 60}'):
        return http_request(husk.port, "POST", path, js, body)

    def detail_state():
        r = http_request(husk.port, "GET", f"/sandboxes/{sid}", key)
        assert r.status == 200, r.text
        return r.json()["state"]

    def same_sandbox(body):
        assert set(body) == set(raw), (body, raw)
        for k in ("sandboxID", "templateID", "clientID", "envdVersion", "envdAccessToken"):
            assert body[k] == raw[k], (k, body, raw)
        assert body["envdAccessToken"] == token

    # Running: resume is a 409, connect a 200.
    r = post(f"/sandboxes/{sid}/resume")
    assert r.status == 409, (r.status, r.text)
    r = post(f"/v2/sandboxes/{sid}/connect")
    assert r.status == 200, (r.status, r.text)
    same_sandbox(r.json())

    # Pause: 204, then 409.
    r = post(f"/sandboxes/{sid}/pause", b"{}")
    assert r.status == 204, (r.status, r.text)
    assert detail_state() == "paused"
    r = post(f"/sandboxes/{sid}/pause", b"{}")
    assert r.status == 409, (r.status, r.text)

    # The deprecated resume: 201 with the sandbox, then it runs (and resume is a 409 again).
    r = post(f"/sandboxes/{sid}/resume")
    assert r.status == 201, (r.status, r.text)
    same_sandbox(r.json())
    assert detail_state() == "running"
    r = post(f"/sandboxes/{sid}/resume")
    assert r.status == 409, (r.status, r.text)

    # Connect of a paused sandbox: 201 (it resumed); of a running one: 200.
    r = post(f"/sandboxes/{sid}/pause", b"{}")
    assert r.status == 204, (r.status, r.text)
    r = post(f"/v2/sandboxes/{sid}/connect")
    assert r.status == 201, (r.status, r.text)
    same_sandbox(r.json())
    assert detail_state() == "running"
    r = post(f"/v2/sandboxes/{sid}/connect")
    assert r.status == 200, (r.status, r.text)

    # Unknown sandboxes: 404 everywhere.
    for path in (f"/sandboxes/{UNKNOWN_ID}/pause", f"/sandboxes/{UNKNOWN_ID}/resume", f"/v2/sandboxes/{UNKNOWN_ID}/connect"):
        r = post(path)
        assert r.status == 404, (path, r.status, r.text)

    # The resumed sandbox works with its original token.
    sbx = Sandbox.connect(sid, **husk.opts())
    assert sbx.commands.run("echo up").stdout == "up\n"


@pytest.mark.timeout(90)
def test_a_paused_sandbox_outlives_its_timeout(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=5)
    created = time.monotonic()
    sbx.files.write("/home/user/keep", "kept")
    assert sbx.pause() is True
    # Well past the 5 s it had: still there, still paused.
    wait_for(
        lambda: state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
        and time.monotonic() - created >= 12,
        30,
        "12 s after the create",
        0.5,
    )
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    Sandbox.connect(sbx.sandbox_id, timeout=60, **opts)
    assert sbx.files.read("/home/user/keep") == "kept"
    assert 50 <= (sbx.get_info().end_at - now()).total_seconds() <= 65


# --- filesystem pauses ------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_filesystem_pause_keeps_files_not_processes(sandbox_factory, opts):
    tag = unique("fspause")
    # A duration no other process has, so that `ps` can tell whether it survived (bash execs
    # a single command, so a comment would not show in its arguments).
    marker = f"sleep {secrets.randbelow(900_000) + 100_000}"
    sbx = sandbox_factory(envs={"PAUSE_ENV": "fs-env"}, metadata={"suite": tag})
    blob = bytes(range(256)) * 64
    sbx.files.write("/home/user/notes.txt", "in home")
    sbx.files.write("/home/user/blob.bin", blob)
    sbx.files.write("/tmp/t.txt", "in tmp")
    sbx.commands.run(
        "mkdir -p /home/user/d/e && printf deep > /home/user/d/e/f"
        " && ln -s /home/user/notes.txt /home/user/link"
        " && printf x > /tmp/short-lived && rm /tmp/short-lived"
        " && printf '#!/bin/sh\\necho ran\\n' > /home/user/run.sh && chmod 0750 /home/user/run.sh"
    )
    # A template file to delete (the host template's /etc copy has it).
    assert sbx.files.exists("/etc/issue"), "the template has no /etc/issue to delete"
    sbx.commands.run(
        "mkdir -p /opt/pz && printf opt > /opt/pz/data && chmod 0600 /opt/pz/data"
        " && printf etc > /etc/pz.conf && rm /etc/issue",
        user="root",
    )
    sleeper = sbx.commands.run(marker, background=True)
    assert sleeper.pid in procs(sbx)
    assert marker in sbx.commands.run("ps -e -o args=").stdout

    assert sbx.pause(mode="filesystem") is True
    info = sbx.get_info()
    assert info.state == SandboxState.PAUSED
    assert info.metadata == {"suite": tag}
    assert listed(opts, tag, [SandboxState.PAUSED]) == {sbx.sandbox_id: SandboxState.PAUSED}
    assert sbx.pause(mode="filesystem") is False
    assert_calls_say_paused(sbx, "/home/user/notes.txt")

    same = Sandbox.connect(sbx.sandbox_id, **opts)
    assert same.sandbox_id == sbx.sandbox_id
    info = sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"suite": tag}

    # Every file, as it was (read through the instance made before the pause).
    assert sbx.files.read("/home/user/notes.txt") == "in home"
    assert sbx.files.read("/home/user/blob.bin", format="bytes") == blob
    assert sbx.files.read("/tmp/t.txt") == "in tmp"
    assert sbx.files.read("/home/user/d/e/f") == "deep"
    assert sbx.files.read("/opt/pz/data", user="root") == "opt"
    assert sbx.files.read("/etc/pz.conf") == "etc"
    assert sbx.files.exists("/etc/issue") is False
    assert sbx.files.exists("/tmp/short-lived") is False
    r = sbx.commands.run(
        "readlink /home/user/link; /home/user/run.sh;"
        " stat -c '%U %a' /home/user/notes.txt /home/user/run.sh /home/user/d/e /tmp/t.txt;"
        " sudo stat -c '%U %a' /opt/pz/data /etc/pz.conf"
    )
    assert r.stdout == (
        "/home/user/notes.txt\nran\n"
        "user 644\nuser 750\nuser 755\nuser 644\n"
        "root 600\nroot 644\n"
    ), r.stdout

    # No process survived a filesystem pause.
    assert not [p for p in sbx.commands.list() if any(marker in a for a in p.args)]
    ps = sbx.commands.run("ps -e -o args=").stdout
    assert marker not in ps, ps

    # The sandbox works as a new one: envs of the create, user, directory, writes.
    r = sbx.commands.run('echo "$PAUSE_ENV|$(whoami)|$(pwd)"')
    assert r.stdout == "fs-env|user|/home/user\n"
    sbx.files.write("/home/user/after.txt", "after")
    assert same.files.read("/home/user/after.txt") == "after"


@pytest.mark.timeout(150)
def test_repeated_filesystem_pauses_merge_their_layers(sandbox_factory, opts):
    sbx = sandbox_factory()
    # Generation 1.
    sbx.files.write("/home/user/g1.txt", "one")
    sbx.files.write("/home/user/shared.txt", "v1")
    sbx.files.write("/home/user/delete-later.txt", "doomed")
    sbx.commands.run("mkdir -p /tmp/d && printf old > /tmp/d/old")
    sbx.commands.run("printf g1 > /etc/gen.conf", user="root")
    assert sbx.pause(mode="filesystem") is True
    Sandbox.connect(sbx.sandbox_id, **opts)
    assert sbx.files.read("/home/user/g1.txt") == "one"

    # Generation 2: add, change, delete, and replace a directory of generation 1.
    sbx.files.write("/home/user/g2.txt", "two")
    sbx.files.write("/home/user/shared.txt", "v2")
    sbx.files.remove("/home/user/delete-later.txt")
    sbx.commands.run("rm -rf /tmp/d && mkdir /tmp/d && printf new > /tmp/d/new")
    sbx.commands.run("printf g2 > /etc/gen.conf", user="root")
    assert sbx.pause(mode="filesystem") is True
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    Sandbox.connect(sbx.sandbox_id, **opts)

    def check():
        assert sbx.files.read("/home/user/g1.txt") == "one"
        assert sbx.files.read("/home/user/g2.txt") == "two"
        assert sbx.files.read("/home/user/shared.txt") == "v2"
        assert sbx.files.exists("/home/user/delete-later.txt") is False
        assert [e.name for e in sbx.files.list("/tmp/d")] == ["new"]
        assert sbx.files.read("/tmp/d/new") == "new"
        assert sbx.files.read("/etc/gen.conf") == "g2"

    check()
    # A full pause on top of the merged layers keeps all of it too.
    assert sbx.pause() is True
    Sandbox.connect(sbx.sandbox_id, **opts)
    check()
    # And a third filesystem pause after that.
    sbx.files.write("/home/user/g3.txt", "three")
    assert sbx.pause(mode="filesystem") is True
    Sandbox.connect(sbx.sandbox_id, **opts)
    check()
    assert sbx.files.read("/home/user/g3.txt") == "three"


# --- lifecycle: pause at the timeout, auto-resume ---------------------------------------------


@pytest.mark.timeout(90)
def test_on_timeout_pause_pauses_instead_of_killing(sandbox_factory, opts):
    tag = unique("autopause")
    sbx = sandbox_factory(timeout=3, lifecycle={"on_timeout": "pause"}, metadata={"suite": tag})
    sbx.files.write("/home/user/f", "before the auto-pause")
    sleeper = sbx.commands.run("sleep 1000", background=True)
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}

    wait_until_paused(sbx.sandbox_id, opts)
    info = sbx.get_info()
    assert info.lifecycle == {"on_timeout": "pause", "auto_resume": False}
    assert info.metadata == {"suite": tag}
    assert listed(opts, tag, [SandboxState.PAUSED]) == {sbx.sandbox_id: SandboxState.PAUSED}
    # No auto-resume: calls fail, and leave it paused.
    assert_calls_say_paused(sbx, "/home/user/f")
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED

    Sandbox.connect(sbx.sandbox_id, timeout=120, **opts)
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sbx.files.read("/home/user/f") == "before the auto-pause"
    # The timeout's pause is a full one: the process is still there.
    assert sleeper.pid in procs(sbx)
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}


@pytest.mark.timeout(90)
def test_auto_resume_wakes_a_paused_sandbox_on_a_call(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
    sbx.files.write("/home/user/f", "auto")
    sbx.set_timeout(3)
    wait_until_paused(sbx.sandbox_id, opts)

    # A command just works: the server resumes the sandbox for it.
    r = sbx.commands.run("cat /home/user/f", timeout=30, request_timeout=30)
    assert r.stdout == "auto"
    assert sbx.get_info().state == SandboxState.RUNNING
    sbx.set_timeout(120)

    # So does a file read, after a pause by hand.
    assert sbx.pause() is True
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    assert sbx.files.read("/home/user/f", request_timeout=30) == "auto"
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}


# --- errors, tenancy, kill, quota -------------------------------------------------------------


def test_pause_and_connect_of_killed_or_unknown_sandboxes(sandbox_factory, opts):
    sbx = sandbox_factory()
    assert sbx.kill() is True
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(sbx.sandbox_id, **opts)
    with pytest.raises(SandboxNotFoundException):
        sbx.pause()
    with pytest.raises(SandboxNotFoundException):
        sbx.pause(mode="filesystem")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, **opts)
    with pytest.raises(SandboxNotFoundException):
        sbx.connect()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(UNKNOWN_ID, **opts)


def test_another_team_cannot_pause_resume_or_list(sandbox_factory, husk, other_key):
    tag = unique("pausetenant")
    mine = sandbox_factory(metadata={"suite": tag})
    mine.files.write("/tmp/mine", "mine")
    theirs = husk.opts(api_key=other_key)

    # Running: the other team cannot pause it.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(mine.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(mine.sandbox_id, mode="filesystem", **theirs)
    assert mine.get_info().state == SandboxState.RUNNING

    assert mine.pause() is True
    # Paused: it cannot see, resume, pause or kill it either.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(mine.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(mine.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(mine.sandbox_id, **theirs)
    assert Sandbox.kill(mine.sandbox_id, **theirs) is False
    assert listed(theirs, tag) == {}
    assert mine.sandbox_id not in listed(theirs, states=[SandboxState.PAUSED])
    assert mine.sandbox_id not in listed(theirs)
    js = {"X-API-KEY": other_key, "Content-Type": "application/json"}
    for path in (
        f"/sandboxes/{mine.sandbox_id}/resume",
        f"/v2/sandboxes/{mine.sandbox_id}/connect",
        f"/sandboxes/{mine.sandbox_id}/pause",
    ):
        r = http_request(husk.port, "POST", path, js, b'{"timeout": 60}')
        assert r.status == 404, (path, r.status, r.text)

    # Still paused, and still the owner's.
    assert mine.get_info().state == SandboxState.PAUSED
    assert listed(husk.opts(), tag) == {mine.sandbox_id: SandboxState.PAUSED}
    Sandbox.connect(mine.sandbox_id, **husk.opts())
    assert mine.files.read("/tmp/mine") == "mine"


@pytest.mark.parametrize("mode", ["full", "filesystem"])
def test_kill_of_a_paused_sandbox_removes_everything(sandbox_factory, husk, opts, mode):
    tag = unique("killpaused")
    sbx = sandbox_factory(metadata={"suite": tag})
    sbx.files.write("/home/user/data.txt", "x" * 100_000)
    sid = sbx.sandbox_id
    paused_root = husk.state_dir / "paused"
    assert sbx.pause(mode=mode) is True
    assert state_of(sid, opts) == SandboxState.PAUSED
    if mode == "filesystem":
        # Where husk keeps a filesystem-paused sandbox's layer.
        assert (paused_root / sid).exists(), sorted(os.listdir(paused_root)) if paused_root.exists() else "no paused/"

    assert sbx.kill() is True
    assert listed(opts, tag) == {}
    assert listed(opts, tag, [SandboxState.PAUSED]) == {}
    assert listed(opts, tag, [SandboxState.RUNNING]) == {}
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sid, **opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sid, **opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.pause(sid, **opts)
    assert Sandbox.kill(sid, **opts) is False

    # Nothing of it is left in the state dir.
    assert not (paused_root / sid).exists()
    if paused_root.exists():
        assert not [n for n in os.listdir(paused_root) if sid in n], os.listdir(paused_root)


@pytest.mark.timeout(120)
def test_paused_sandboxes_do_not_count_against_the_quota(sandbox_factory, husk):
    team = unique("pausequota")
    key = husk.create_key(team)
    husk.set_quota(team, 1)
    mine = husk.opts(api_key=key)

    first = sandbox_factory(api_key=key, metadata={"n": "1"})
    first.files.write("/home/user/first.txt", "first")
    # The quota holds: a second running sandbox is refused.
    with pytest.raises(RateLimitException):
        sandbox_factory(api_key=key)

    assert first.pause() is True
    second = sandbox_factory(api_key=key, metadata={"n": "2"})
    assert second.commands.run("echo second").stdout == "second\n"
    assert ids(Sandbox.list(**mine)) == {
        first.sandbox_id: SandboxState.PAUSED,
        second.sandbox_id: SandboxState.RUNNING,
    }

    # Resuming the first would make two running: refused, and it stays paused.
    with pytest.raises(RateLimitException):
        Sandbox.connect(first.sandbox_id, **mine)
    assert state_of(first.sandbox_id, mine) == SandboxState.PAUSED
    r = http_request(
        husk.port,
        "POST",
        f"/sandboxes/{first.sandbox_id}/resume",
        {"X-API-KEY": key, "Content-Type": "application/json"},
        b'{"timeout": 60}',
    )
    assert r.status == 429, (r.status, r.text)
    assert state_of(first.sandbox_id, mine) == SandboxState.PAUSED

    # With the second gone there is room: the first resumes with its files.
    assert second.kill() is True
    Sandbox.connect(first.sandbox_id, **mine)
    assert first.get_info().state == SandboxState.RUNNING
    assert first.files.read("/home/user/first.txt") == "first"


# --- ingress and husk's own CLI ---------------------------------------------------------------

WEB_PORT = 8000


def via_host(husk, host: str):
    return http_request(husk.port, "GET", "/hello.txt", headers={"Host": host})


@pytest.mark.parametrize("mode", ["full", "filesystem"])
def test_ingress_traffic_resumes_a_paused_sandbox_with_auto_resume(sandbox_factory, husk, opts, mode):
    """Traffic to one of its ports wakes a paused sandbox created with auto-resume: the request
    waits for the resume, then goes through. Without auto-resume it is refused, saying why."""
    sbx = sandbox_factory(timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    start = "mkdir -p /tmp/www && echo woken > /tmp/www/hello.txt && " \
        f"exec python3 -m http.server {WEB_PORT} --bind 0.0.0.0 --directory /tmp/www"
    sbx.commands.run(f"sh -c '{start}'", background=True)
    host = sbx.get_host(WEB_PORT)
    wait_for(lambda: via_host(husk, host).status == 200, 30, "the sandbox's web server")
    assert sbx.pause(mode=mode) is True
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    if mode == "filesystem":
        # Booted again on its files: the server is not running, but its files are there, so
        # a new one serves them (the request that woke it found no server yet).
        r = via_host(husk, host)
        assert state_of(sbx.sandbox_id, opts) == SandboxState.RUNNING, r.text
        sbx.commands.run(f"sh -c '{start}'", background=True)
        wait_for(lambda: via_host(husk, host).status == 200, 30, "the server started again")
    else:
        # The same server, frozen and thawed, answers the request that woke it.
        r = via_host(husk, host)
        assert r.status == 200 and r.body == b"woken\n", r.text
        assert state_of(sbx.sandbox_id, opts) == SandboxState.RUNNING

    # Without auto-resume, traffic does not wake it.
    plain = sandbox_factory(timeout=120)
    plain.commands.run(f"sh -c '{start}'", background=True)
    plain_host = plain.get_host(WEB_PORT)
    wait_for(lambda: via_host(husk, plain_host).status == 200, 30, "the second web server")
    assert plain.pause() is True
    r = via_host(husk, plain_host)
    assert r.status == 502 and "paused" in r.json()["message"], r.text
    assert state_of(plain.sandbox_id, opts) == SandboxState.PAUSED


def test_a_private_sandbox_is_not_woken_by_traffic_without_its_token(sandbox_factory, husk, opts):
    sbx = sandbox_factory(
        timeout=120,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        network={"allow_public_traffic": False},
    )
    host = sbx.get_host(WEB_PORT)
    assert sbx.pause() is True
    # Naming it is not enough: the request would not be let in, so it does not wake it.
    r = via_host(husk, host)
    assert r.status == 502 and "paused" in r.json()["message"], r.text
    assert state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    r = http_request(
        husk.port, "GET", "/", headers={"Host": host, "E2B-Traffic-Access-Token": sbx.traffic_access_token}
    )
    assert state_of(sbx.sandbox_id, opts) == SandboxState.RUNNING, r.text


def test_husk_cli_lists_pauses_resumes_and_kills(sandbox_factory, husk):
    sbx = sandbox_factory(timeout=120)
    sbx.files.write("/home/user/cli", "kept")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(husk.bin), "sandbox", *args, "--server", husk.url, "--state-dir", str(husk.state_dir)],
            capture_output=True, text=True, timeout=60,
        )

    r = cli("pause", sbx.sandbox_id, "--files-only")
    assert r.returncode == 0 and "files saved" in r.stderr, r.stderr
    r = cli("pause", sbx.sandbox_id)
    assert r.returncode == 0 and "paused already" in r.stderr, r.stderr
    r = cli("list", "--state", "paused")
    assert r.returncode == 0, r.stderr
    line = [l for l in r.stdout.splitlines() if sbx.sandbox_id in l]
    assert len(line) == 1 and " paused " in line[0], r.stdout
    r = cli("list", "--state", "running", "--json")
    assert r.returncode == 0 and sbx.sandbox_id not in r.stdout, r.stdout
    r = cli("resume", sbx.sandbox_id, "--timeout", "100")
    assert r.returncode == 0 and "resumed" in r.stderr, r.stderr
    assert sbx.files.read("/home/user/cli") == "kept"
    r = cli("resume", sbx.sandbox_id)
    assert r.returncode == 0 and "was running" in r.stderr, r.stderr
    r = cli("kill", sbx.sandbox_id)
    assert r.returncode == 0, r.stderr
    r = cli("resume", sbx.sandbox_id)
    assert r.returncode != 0 and "not found" in r.stderr, r.stderr


# --- a restart of the server ------------------------------------------------------------------


def test_sandboxes_paused_to_disk_survive_a_restart_of_the_server():
    """SIGTERM, then a new server on the same state directory: a sandbox paused to disk comes
    back as it was (id, token, metadata, envs, files); one paused in place was saved to disk at
    the stop (its files kept, its processes not); a running one is gone, and said to be lost
    (why, in the SDK's error and in `husk sandbox list --state lost`). Then a SIGKILL: what was
    paused to disk survives that too, what ran is lost. Nothing is left after the kills."""
    from husk_compat import start_server

    first = start_server()
    servers = [first]
    try:
        opts = first.opts()
        disk = Sandbox.create(timeout=300, metadata={"k": "v"}, envs={"E": "1"}, **opts)
        disk.files.write("/home/user/r", "kept")
        resident = Sandbox.create(timeout=300, **opts)
        resident.files.write("/home/user/r2", "kept too")
        old = resident.commands.run("sleep 1234", background=True)
        running = Sandbox.create(timeout=300, **opts)
        assert disk.pause(mode="filesystem") is True
        assert resident.pause() is True
        state_dir = first.state_dir
        assert first.stop() == 0, first.log_tail()

        second = start_server(state_dir=state_dir)
        servers.append(second)
        opts = second.opts()
        assert listed(opts, states=[SandboxState.PAUSED]) == {
            disk.sandbox_id: SandboxState.PAUSED,
            resident.sandbox_id: SandboxState.PAUSED,
        }
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(running.sandbox_id, **opts)
        # The SDKs word their own 404s; the server's answer says what became of it.
        r = http_request(second.port, "GET", f"/sandboxes/{running.sandbox_id}",
                         headers={"X-API-KEY": second.admin_key})
        assert r.status == 404 and "was lost" in r.text and "was stopped" in r.text, r.text
        assert running.sandbox_id not in ids(Sandbox.list(**opts))
        back = Sandbox.connect(disk.sandbox_id, **opts)
        assert back.get_info().metadata == {"k": "v"}
        assert back.files.read("/home/user/r") == "kept"
        assert back.commands.run("echo $E").stdout == "1\n"
        # The access token is the one the first server gave.
        assert back._envd_access_token == disk._envd_access_token
        back2 = Sandbox.connect(resident.sandbox_id, **opts)
        assert back2.files.read("/home/user/r2") == "kept too"
        procs = [" ".join([p.cmd, *p.args]) for p in back2.commands.list()]
        assert not any("sleep 1234" in p for p in procs), procs
        assert old.pid  # it was a real process before the stop

        # Paused to disk again, then the server is killed outright.
        assert back.pause(mode="filesystem") is True
        second.proc.kill()
        second.proc.wait(timeout=30)
        third = start_server(state_dir=state_dir)
        servers.append(third)
        opts = third.opts()
        again = Sandbox.connect(disk.sandbox_id, **opts)
        assert again.files.read("/home/user/r") == "kept"
        assert again.kill() is True
        assert Sandbox.kill(resident.sandbox_id, **opts) is False  # it ran, so it died
        r = http_request(third.port, "GET", f"/sandboxes/{resident.sandbox_id}",
                         headers={"X-API-KEY": third.admin_key})
        assert r.status == 404 and "ended while no husk server ran" in r.text, r.text
        r = subprocess.run(
            [str(third.bin), "sandbox", "list", "--state", "lost", "--json",
             "--server", third.url, "--state-dir", str(state_dir)],
            capture_output=True, text=True, timeout=60,
        )
        assert r.returncode == 0, r.stderr
        gone = {s["sandboxID"]: s for s in json.loads(r.stdout)}
        assert set(gone) == {running.sandbox_id, resident.sandbox_id}, gone
        assert all(s["state"] == "lost" and s["lostReason"] for s in gone.values()), gone
        leftovers = list((state_dir / "paused").iterdir()) if (state_dir / "paused").exists() else []
        assert leftovers == [], leftovers
    finally:
        # Each stops its own process; the last one removes the shared state directory.
        for s in servers[:-1]:
            try:
                s.stop()
            except Exception:
                pass
        servers[-1].close()


def test_on_resume_reboot_boots_a_sandbox_paused_in_place_on_its_files(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=120)
    sbx.files.write("/home/user/f", "kept")
    sbx.commands.run("sleep 4321", background=True)
    assert sbx.pause() is True
    back = Sandbox.connect(sbx.sandbox_id, on_resume="reboot", **opts)
    assert back.files.read("/home/user/f") == "kept"
    procs = [" ".join([p.cmd, *p.args]) for p in back.commands.list()]
    assert not any("sleep 4321" in p for p in procs), procs
    assert back.get_info().state == SandboxState.RUNNING


def test_pause_and_resume_without_a_valid_key_say_nothing(sandbox, husk, opts):
    bad = {"X-API-KEY": "e2b_" + "0" * 40}
    for path in [
        f"/sandboxes/{sandbox.sandbox_id}/pause",
        f"/sandboxes/{sandbox.sandbox_id}/resume",
        f"/v2/sandboxes/{sandbox.sandbox_id}/connect",
    ]:
        for headers in (bad, {}):
            r = http_request(husk.port, "POST", path, headers, b"{}")
            assert r.status == 401, (path, r.status, r.text)
    assert state_of(sandbox.sandbox_id, opts) == SandboxState.RUNNING


def test_malformed_pause_and_resume_bodies_are_refused_and_change_nothing(sandbox, husk, opts):
    key = {"X-API-KEY": husk.admin_key}
    for path, body in [
        (f"/sandboxes/{sandbox.sandbox_id}/pause", b'{"memory": "no"}'),
        (f"/sandboxes/{sandbox.sandbox_id}/pause", b"{not json"),
        (f"/v2/sandboxes/{sandbox.sandbox_id}/connect", b'{"timeout": -5}'),
        (f"/v2/sandboxes/{sandbox.sandbox_id}/connect", b'{"memory": 3}'),
    ]:
        r = http_request(husk.port, "POST", path, key, body)
        assert r.status == 400, (path, body, r.status, r.text)
        assert r.json()["message"], r.text
    assert state_of(sandbox.sandbox_id, opts) == SandboxState.RUNNING
    assert sandbox.commands.run("echo ok").stdout == "ok\n"
