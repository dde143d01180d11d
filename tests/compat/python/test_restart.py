"""Restarts of the server with the stock SDK (e2b==2.63.0, sync, and one async case): running
sandboxes outlive a `husk serve` (its SIGTERM, a SIGKILL of it, a SIGKILL of its spawner), and
the next server on the same state directory takes them up: same id, team, access token,
metadata, files, running processes (reattached by pid), envs, network policy, ingress,
secrets' masking, timeout.
While no server runs, a sandbox's PID 1 ends it at its deadline. `--destroy-on-exit` (what
the harness passes unless `keep=True`) destroys them at the stop, and the next server says
they were lost.

Every test ends on a server started without `keep`, whose stop destroys what is left, and
then checks on the host that nothing of its sandboxes remains (their PID 1s, cgroups, and
the runtime's registry entries naming the state directory)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from e2b import (
    Sandbox,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from husk_compat import (
    HuskServer,
    children,
    counter,
    http_request,
    remove_state_dir,
    sandbox_headers,
    start_server,
    start_time,
    ticks,
    unique,
    wait_for,
)

# Each test starts two or three servers; none should need more than this.
pytestmark = pytest.mark.timeout(150)

REGISTRY = Path("/run/husk/sandboxes")

# An in-memory counter: `i` lives only in the shell's memory. Each tick appends "i epoch" to
# /tmp/ticks and prints "tick i" (for a reattached stream to see).
TICKER = (
    "i=0\n"
    "while :; do\n"
    "  i=$((i+1))\n"
    '  echo "$i $(date +%s.%N)" >> /tmp/ticks\n'
    '  echo "tick $i"\n'
    "  sleep 0.2\n"
    "done\n"
)

WEB_PORT = 8000
WEB_BODY = b"served from inside, across restarts\n"


# --- the host's view ---------------------------------------------------------------------------


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def alive(pid: int, start: int) -> bool:
    """The process `pid` that started at `start` runs (a zombie, dead but not yet reaped by
    whoever it was reparented to, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0] != "Z" and int(fields[19]) == start


def spawner_pid(server: HuskServer) -> int:
    """The server's spawner: the one direct child of the server that has not renamed itself
    (husk-net, husk-state, husk-files, husk-build do)."""
    found = [p for p in children(server.proc.pid) if comm(p) == "husk"]
    assert len(found) == 1, {p: comm(p) for p in children(server.proc.pid)}
    return found[0]


def spawner_pids(server: HuskServer) -> List[int]:
    """All the server's spawners: the first (`spawner_pid`) and those it forked (its children
    that are not a sandbox's PID 1)."""
    first = spawner_pid(server)
    return [first] + [
        p for p in children(first) if comm(p) == "husk" and not cmdline(p).startswith("husk-init")
    ]


def cgroup_v2_root() -> Path:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ")[0] == "cgroup2":
            return Path(left.split(" ")[4])
    raise AssertionError("no cgroup2 mount")


class Pid1:
    """A sandbox's PID 1 on the host (a child of the spawner that made it), and its cgroup."""

    def __init__(self, pid: int):
        self.pid = pid
        start = start_time(pid)
        assert start is not None, pid
        self.start = start
        line = [l for l in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if l.startswith("0::")]
        assert line, Path(f"/proc/{pid}/cgroup").read_text()
        self.cgroup = cgroup_v2_root() / line[0][3:].lstrip("/")
        assert self.cgroup.is_dir(), self.cgroup

    def __repr__(self) -> str:
        return f"Pid1({self.pid}, cgroup {self.cgroup})"


def sandbox_pid1s(server: HuskServer) -> Dict[int, Pid1]:
    """The PID 1s of the sandboxes this server's spawners made (`husk-init`)."""
    return {
        p: Pid1(p)
        for spawner in spawner_pids(server)
        for p in children(spawner)
        if cmdline(p).startswith("husk-init")
    }


def new_pid1(server: HuskServer, known: Dict[int, Pid1]) -> Pid1:
    """The one sandbox PID 1 of this server not in `known` (added to it)."""
    fresh = {p: v for p, v in sandbox_pid1s(server).items() if p not in known}
    assert len(fresh) == 1, (fresh, known)
    known.update(fresh)
    return next(iter(fresh.values()))


def keep_lines(state_dir: Path) -> List[str]:
    """Lines of the runtime's registry (/run/husk/sandboxes/s<slot>) that keep a sandbox for
    the owner `state_dir` (`keep <owner in hex> <id> <pid> ...`)."""
    owner = os.path.realpath(state_dir).encode().hex()
    out = []
    for entry in REGISTRY.iterdir() if REGISTRY.is_dir() else []:
        try:
            text = entry.read_text()
        except OSError:
            continue
        out += [l for l in text.splitlines() if l.startswith(f"keep {owner} ")]
    return out


def leftovers(pid1s: Dict[int, Pid1], state_dir: Path) -> List[str]:
    what = [f"PID 1 {p.pid} still runs" for p in pid1s.values() if alive(p.pid, p.start)]
    what += [f"cgroup {p.cgroup} still there" for p in pid1s.values() if p.cgroup.exists()]
    what += [f"registry: {l}" for l in keep_lines(state_dir)]
    return what


def assert_nothing_left(pid1s: Dict[int, Pid1], state_dir: Path, timeout: float = 10) -> None:
    assert pid1s, "no sandbox PID 1 recorded"
    try:
        wait_for(lambda: not leftovers(pid1s, state_dir), timeout, "the sandboxes to be gone from the host", 0.2)
    except Exception:
        raise AssertionError(f"left on the host: {leftovers(pid1s, state_dir)}")


# --- servers one after another on one state directory -----------------------------------------


class Restarts:
    """Servers one after another on one state directory. `finish()` closes the last one
    (which must have been started without keep: its stop destroys the sandboxes) and returns
    its exit code; `cleanup()` (in `finally`) makes sure nothing outlives the test even when
    it failed half-way, by taking whatever was kept up with a destroying server."""

    def __init__(self):
        self.servers: List[Tuple[HuskServer, bool]] = []
        self.state_dir: Optional[Path] = None
        self.done = False

    def start(self, keep: bool) -> HuskServer:
        if self.servers:
            prev = self.servers[-1][0]
            assert prev.proc.poll() is not None, "the previous server still runs"
        server = start_server(state_dir=self.state_dir, keep=keep)
        self.state_dir = server.state_dir
        self.servers.append((server, keep))
        return server

    def finish(self) -> Optional[int]:
        server, keep = self.servers[-1]
        assert not keep, "the last server must destroy what it has (started without keep)"
        rc = server.stop()
        # Only an orderly stop destroyed everything; else cleanup() sweeps (and removes) the
        # state directory.
        assert rc == 0, f"the last server exited with {rc}:\n{server.log_tail()}"
        server.close()
        self.done = True
        return rc

    def cleanup(self) -> None:
        if self.done or not self.servers:
            return
        for server, _ in self.servers:
            try:
                server.stop()
            except Exception:
                pass
        sweep(self.state_dir)


def sweep(state_dir: Path) -> None:
    """Cleanup after a failure: a server that destroys at its stop whatever an earlier one on
    `state_dir` kept, stopped once it has taken them up (a stop during the take-up may not be
    an orderly one: tried again), then the state directory removed."""
    try:
        for _ in range(3):
            sweeper = start_server(state_dir=state_dir)
            try:
                wait_for(lambda: "taking them up" not in sweeper.log_tail(100_000)
                         or "took up" in sweeper.log_tail(100_000), 30, "the sweeper to take them up")
            finally:
                rc = sweeper.stop()
            if rc == 0:
                return
    finally:
        remove_state_dir(state_dir)
        (state_dir.parent / f"{state_dir.name}.log").unlink(missing_ok=True)


@pytest.fixture
def restarts():
    r = Restarts()
    try:
        yield r
    finally:
        r.cleanup()


def sigkill(server: HuskServer) -> None:
    server.proc.kill()
    server.proc.wait(timeout=30)


# --- the sandbox's view ------------------------------------------------------------------------


def start_ticker(sbx: Sandbox):
    sbx.files.write("/tmp/ticker.sh", TICKER)
    handle = sbx.commands.run("sh /tmp/ticker.sh", background=True)
    wait_for(lambda: counter(sbx) >= 3, 30, "the ticker to count to 3", 0.1)
    return handle


def assert_counted_all_along(sbx: Sandbox, down_from: float, down_to: float) -> None:
    """One shell counted all along (no restart from 1, no gap in the numbers), and it also
    counted while no server ran (ticks stamped between `down_from` and `down_to`)."""
    got = ticks(sbx)
    assert [i for i, _ in got] == list(range(1, len(got) + 1)), got[:5]
    during = [i for i, t in got if down_from < t < down_to]
    assert during, (down_from, down_to, got[-20:])


def tick_numbers(text: str) -> List[int]:
    """The numbers of the whole "tick N" lines of a ticker's output."""
    return [int(l.split()[1]) for l in text.split("\n")[:-1] if l.startswith("tick ")]


def pids(sbx: Sandbox) -> Dict[int, object]:
    return {p.pid: p for p in sbx.commands.list()}


def read_stream(handle, until, timeout: float, what: str) -> str:
    """Reads a command's stdout until `until(text so far)` holds, then disconnects. The
    commands read here print every 0.2 s, so the deadline is checked often."""
    end = time.monotonic() + timeout
    text = ""
    try:
        for out, _err, _pty in handle:
            if out:
                text += out
            if until(text):
                return text
            if time.monotonic() >= end:
                break
    finally:
        handle.disconnect()
    raise AssertionError(f"{what}: not seen within {timeout:.0f}s; got {text[-2000:]!r}")


def ids(paginator) -> Dict[str, SandboxState]:
    out = {}
    while paginator.has_next:
        for s in paginator.next_items():
            out[s.sandbox_id] = s.state
    return out


def lost(server: HuskServer) -> Dict[str, dict]:
    """`husk sandbox list --state lost --json`: {sandboxID: entry}."""
    r = subprocess.run(
        [str(server.bin), "sandbox", "list", "--state", "lost", "--json",
         "--server", server.url, "--state-dir", str(server.state_dir)],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return {s["sandboxID"]: s for s in json.loads(r.stdout or "[]")}


def get_sandbox(server: HuskServer, sandbox_id: str, key: Optional[str] = "admin"):
    headers = {}
    if key == "admin":
        headers["X-API-Key"] = server.admin_key
    elif key is not None:
        headers["X-API-Key"] = key
    return http_request(server.port, "GET", f"/sandboxes/{sandbox_id}", headers=headers)


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --- the tests ---------------------------------------------------------------------------------


def test_a_sigterm_restart_takes_up_running_sandboxes_whole(restarts):
    first = restarts.start(keep=True)
    opts = first.opts()
    tag = unique("restart")
    sbx = Sandbox.create(timeout=300, metadata={"suite": tag}, envs={"E": "kept-env"}, **opts)
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    sbx.files.write("/home/user/f.txt", "kept file")
    ticker = start_ticker(sbx)
    token = sbx._envd_access_token
    info0 = sbx.get_info()
    assert keep_lines(first.state_dir), "no registry entry keeps the sandbox"

    assert first.stop() == 0, first.log_tail()
    down_from = time.time()
    assert "keep running" in first.log_tail(), first.log_tail()
    # The sandbox's PID 1 lives on while no server runs.
    pid1 = next(iter(pid1s.values()))
    wait_for(lambda: time.time() - down_from >= 1.0 and alive(pid1.pid, pid1.start), 5,
             "1 s with no server, the sandbox still running")

    down_to = time.time()
    second = restarts.start(keep=True)
    opts = second.opts()
    wait_for(lambda: "took up 1 sandbox" in second.log_tail(), 10, "the server to say it took it up")
    assert sbx.sandbox_id in ids(Sandbox.list(**opts))
    assert ids(Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), **opts)) == {
        sbx.sandbox_id: SandboxState.RUNNING
    }
    info = Sandbox.get_info(sbx.sandbox_id, **opts)
    assert info.metadata == {"suite": tag}
    assert info.state == SandboxState.RUNNING
    assert info.template_id == info0.template_id
    # The deadline is the one the first server set (looked at before a connect lengthens it).
    assert abs((info.end_at - info0.end_at).total_seconds()) < 1.5, (info0.end_at, info.end_at)
    back = Sandbox.connect(sbx.sandbox_id, **opts)
    # The same access token: the first server's instance keeps working too.
    assert back._envd_access_token == token
    assert back.files.read("/home/user/f.txt") == "kept file"
    assert back.commands.run("echo $E").stdout == "kept-env\n"

    # The ticker: the same process, still counting, and it counted while no server ran.
    running = pids(back)
    assert ticker.pid in running, (ticker.pid, running)
    assert running[ticker.pid].args == ["-l", "-c", "sh /tmp/ticker.sh"]
    c1 = counter(back)
    wait_for(lambda: counter(back) >= c1 + 3, 20, "the ticker to count on", 0.1)
    assert_counted_all_along(back, down_from, down_to)
    # Reattached by pid: its new output streams in.
    c2 = counter(back)
    handle = back.commands.connect(ticker.pid)
    text = read_stream(handle, lambda t: any(n > c2 for n in tick_numbers(t)), 20,
                       "new ticks on the reattached stream")
    got = tick_numbers(text)
    assert got == list(range(got[0], got[0] + len(got))), text

    # Its timeout can be set as before.
    back.set_timeout(200)
    left = (back.get_info().end_at - now()).total_seconds()
    assert 185 <= left <= 205, left

    # Once more, to a server that destroys it at its stop.
    assert second.stop() == 0, second.log_tail()
    third = restarts.start(keep=False)
    # The deadline set_timeout gave is kept too.
    left = (Sandbox.get_info(sbx.sandbox_id, **third.opts()).end_at - now()).total_seconds()
    assert 170 <= left <= 205, left
    again = Sandbox.connect(sbx.sandbox_id, **third.opts())
    assert again.files.read("/home/user/f.txt") == "kept file"
    assert ticker.pid in pids(again)
    c3 = counter(again)
    wait_for(lambda: counter(again) >= c3 + 2, 20, "the ticker to count on after a second restart", 0.1)

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_sigkill_of_the_server_keeps_running_sandboxes(restarts):
    first = restarts.start(keep=True)
    opts = first.opts()
    sbx = Sandbox.create(timeout=300, metadata={"k": "v"}, envs={"E": "after-kill"}, **opts)
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    sbx.files.write("/home/user/f.txt", "survives a SIGKILL")
    ticker = start_ticker(sbx)
    token = sbx._envd_access_token

    sigkill(first)
    down_from = time.time()
    # Its helpers follow it; the sandbox does not.
    wait_for(lambda: not children(first.proc.pid), 10, "the server's helpers to exit")
    pid1 = next(iter(pid1s.values()))
    wait_for(lambda: time.time() - down_from >= 1.0 and alive(pid1.pid, pid1.start), 5,
             "1 s with no server, the sandbox still running")

    down_to = time.time()
    second = restarts.start(keep=False)
    back = Sandbox.connect(sbx.sandbox_id, **second.opts())
    assert back.get_info().metadata == {"k": "v"}
    assert back._envd_access_token == token
    assert back.files.read("/home/user/f.txt") == "survives a SIGKILL"
    assert back.commands.run("echo $E").stdout == "after-kill\n"
    assert ticker.pid in pids(back)
    c1 = counter(back)
    wait_for(lambda: counter(back) >= c1 + 3, 20, "the ticker to count on", 0.1)
    assert_counted_all_along(back, down_from, down_to)
    text = read_stream(back.commands.connect(ticker.pid), lambda t: len(tick_numbers(t)) >= 2, 20,
                       "ticks on the reattached stream")
    assert min(tick_numbers(text)) >= c1, (c1, text)
    assert sbx.sandbox_id in ids(Sandbox.list(**second.opts()))

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_sigkill_of_the_spawner_ends_the_server_and_a_restart_takes_the_sandbox_up(restarts):
    first = restarts.start(keep=True)
    opts = first.opts()
    sbx = Sandbox.create(timeout=300, **opts)
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    sbx.files.write("/home/user/f.txt", "spawner gone")
    ticker = start_ticker(sbx)

    spawner = spawner_pid(first)
    os.kill(spawner, signal.SIGKILL)
    # The server watches its helpers: it exits by itself, and says it failed.
    wait_for(lambda: first.proc.poll() is not None, 30, "the server to exit after its spawner died", 0.1)
    assert first.proc.returncode != 0, (first.proc.returncode, first.log_tail())
    pid1 = next(iter(pid1s.values()))
    assert alive(pid1.pid, pid1.start), "the sandbox died with the spawner"

    second = restarts.start(keep=False)
    back = Sandbox.connect(sbx.sandbox_id, **second.opts())
    assert back.files.read("/home/user/f.txt") == "spawner gone"
    assert ticker.pid in pids(back)
    c1 = counter(back)
    wait_for(lambda: counter(back) >= c1 + 3, 20, "the ticker to count on", 0.1)
    assert back.commands.run("echo fine").stdout == "fine\n"
    # And new sandboxes can be made by the new spawner.
    fresh = Sandbox.create(timeout=60, **second.opts())
    new_pid1(second, pid1s)
    assert fresh.commands.run("echo new").stdout == "new\n"

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_taken_up_sandbox_stays_its_teams(restarts):
    first = restarts.start(keep=True)
    other_key = first.create_key("other")
    mine = Sandbox.create(timeout=300, **first.opts())
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    theirs = Sandbox.create(timeout=300, metadata={"team": "other"}, **first.opts(api_key=other_key))
    new_pid1(first, pid1s)
    assert first.stop() == 0, first.log_tail()

    second = restarts.start(keep=False)
    as_other = second.opts(api_key=other_key)
    # The other team's key: nothing of the default team's sandbox.
    assert mine.sandbox_id not in ids(Sandbox.list(**as_other))
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(mine.sandbox_id, **as_other)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(mine.sandbox_id, **as_other)
    assert Sandbox.kill(mine.sandbox_id, **as_other) is False
    r = get_sandbox(second, mine.sandbox_id, other_key)
    assert r.status == 404, (r.status, r.text)
    # No key, or a wrong one: 401, whatever the sandbox.
    for key in (None, "e2b_" + "0" * 40):
        r = get_sandbox(second, mine.sandbox_id, key)
        assert r.status == 401, (key, r.status, r.text)
        r = http_request(second.port, "GET", "/sandboxes", headers={"X-API-Key": key} if key else {})
        assert r.status == 401, (key, r.status, r.text)
    # envd refuses the other sandbox's access token.
    r = http_request(
        second.port, "POST", "/filesystem.Filesystem/Stat",
        headers={**sandbox_headers(mine.sandbox_id, theirs._envd_access_token), "Content-Type": "application/json"},
        body=b'{"path": "/home/user"}',
    )
    assert r.status in (401, 403), (r.status, r.text)

    # Each team still has its own, whole.
    assert Sandbox.connect(mine.sandbox_id, **second.opts()).commands.run("echo mine").stdout == "mine\n"
    back = Sandbox.connect(theirs.sandbox_id, **as_other)
    assert back.get_info().metadata == {"team": "other"}
    assert back.commands.run("echo theirs").stdout == "theirs\n"
    assert ids(Sandbox.list(**as_other)) == {theirs.sandbox_id: SandboxState.RUNNING}
    assert theirs.sandbox_id not in ids(Sandbox.list(**second.opts()))

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_sandbox_ends_at_its_timeout_while_no_server_runs(restarts):
    first = restarts.start(keep=True)
    sbx = Sandbox.create(timeout=4, **first.opts())
    created = time.monotonic()
    pid1s: Dict[int, Pid1] = {}
    pid1 = new_pid1(first, pid1s)
    sigkill(first)
    # PID 1 ends the sandbox at its deadline: not before, and not long after.
    wait_for(lambda: not alive(pid1.pid, pid1.start), 15, "the sandbox to end at its timeout", 0.1)
    ended = time.monotonic() - created
    assert 3.0 <= ended <= 10.0, ended
    wait_for(lambda: time.monotonic() - created >= 7, 10, "7 s since the create", 0.1)

    second = restarts.start(keep=False)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, **second.opts())
    # Over, not lost: it ended at its timeout, as it would have with a server.
    assert sbx.sandbox_id not in lost(second)
    r = get_sandbox(second, sbx.sandbox_id)
    assert r.status == 404 and "was lost" not in r.text, r.text
    assert sbx.sandbox_id not in ids(Sandbox.list(**second.opts()))
    # The new server's spawner reaped what was left of it.
    assert_nothing_left(pid1s, restarts.state_dir)

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_sandbox_paused_in_place_stays_paused_and_resumes_with_its_memory(restarts):
    first = restarts.start(keep=True)
    opts = first.opts()
    sbx = Sandbox.create(timeout=300, **opts)
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    sleeper = sbx.commands.run("sleep 1234", background=True)
    ticker = start_ticker(sbx)
    assert sbx.pause() is True
    paused_at = time.monotonic()
    # The SDK still holds both commands' output streams open: the stop ends them at once, as
    # it does a running sandbox's (it need not wait out its shutdown grace for them).
    stopping = time.monotonic()
    assert first.stop() == 0, first.log_tail()
    took = time.monotonic() - stopping
    assert took < 5, f"the stop took {took:.1f}s:\n{first.log_tail()}"

    second = restarts.start(keep=False)
    opts = second.opts()
    assert ids(Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **opts)) == {
        sbx.sandbox_id: SandboxState.PAUSED
    }
    assert Sandbox.get_info(sbx.sandbox_id, **opts).state == SandboxState.PAUSED
    # Paused for at least 2 s in all (bounded).
    wait_for(lambda: time.monotonic() - paused_at >= 2.0, 10, "2 s of pause", 0.1)

    resumed_at = time.monotonic()
    back = Sandbox.connect(sbx.sandbox_id, timeout=200, **opts)
    paused_for = resumed_at - paused_at
    assert back.get_info().state == SandboxState.RUNNING
    running = pids(back)
    assert sleeper.pid in running and ticker.pid in running, running
    c1 = counter(back)
    wait_for(lambda: counter(back) >= c1 + 3, 20, "the ticker to count on after the resume", 0.1)
    got = ticks(back)
    # The same shell counted on from where it was (its memory kept), and not while paused.
    assert [i for i, _ in got] == list(range(1, len(got) + 1)), got[:5]
    longest = max(b[1] - a[1] for a, b in zip(got, got[1:]))
    assert longest >= paused_for - 0.5, (longest, paused_for)

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_secrets_stay_masked_in_the_output_of_taken_up_processes(restarts):
    value = "sk-restart-4b2e9c1d7a60-not-for-eyes"
    name = unique("RESTART_KEY").replace("-", "_").upper()
    first = restarts.start(keep=True)
    out = subprocess.run(
        [str(first.bin), "secret", "set", name, "--team", "default", "--state-dir", str(first.state_dir)],
        input=value.encode(), capture_output=True, timeout=30, env=first.store_env(),
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    sbx = Sandbox.create(timeout=300, envs={"S": f"husk-secret://{name}"}, **first.opts())
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    printer = sbx.commands.run('while :; do echo "v=$S"; sleep 0.2; done', background=True)
    first_out = read_stream(printer, lambda t: t.count("v=") >= 2, 20, "the secret printed")
    assert "v=****" in first_out and value not in first_out, first_out
    assert first.stop() == 0, first.log_tail()

    second = restarts.start(keep=False)
    back = Sandbox.connect(sbx.sandbox_id, **second.opts())
    text = read_stream(back.commands.connect(printer.pid), lambda t: t.count("v=****\n") >= 3, 20,
                       "the masked secret on the reattached stream")
    assert value not in text and value[:12] not in text, text
    assert all(l == "v=****" for l in text.split("\n")[:-1]), text
    # New commands of the sandbox get it masked too.
    r = back.commands.run('echo "v=$S"; test "$S" = "' + value + '" && echo match')
    assert r.stdout == "v=****\nmatch\n", r.stdout

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_ingress_and_the_network_policy_survive_a_restart(restarts):
    first = restarts.start(keep=True)
    opts = first.opts()
    public = Sandbox.create(timeout=300, **opts)
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    private = Sandbox.create(timeout=300, network={"allow_public_traffic": False}, **opts)
    new_pid1(first, pid1s)
    token = private.traffic_access_token
    assert token

    def serve(sbx: Sandbox):
        sbx.files.write("/tmp/www/hello.txt", WEB_BODY)
        sbx.commands.run(f"python3 -m http.server {WEB_PORT} --bind 0.0.0.0 --directory /tmp/www", background=True)

    def fetch(server: HuskServer, host: str, headers=None):
        return http_request(server.port, "GET", "/hello.txt", headers={"Host": host, **(headers or {})})

    def serving(server, host, headers=None):
        def ok():
            r = fetch(server, host, headers)
            return r if r.status == 200 else None

        return wait_for(ok, 30, f"the server at {host}", 0.2)

    serve(public)
    serve(private)
    assert serving(first, public.get_host(WEB_PORT)).body == WEB_BODY
    assert serving(first, private.get_host(WEB_PORT), {"E2B-Traffic-Access-Token": token}).body == WEB_BODY
    assert first.stop() == 0, first.log_tail()

    second = restarts.start(keep=False)
    opts = second.opts()
    pub = Sandbox.connect(public.sandbox_id, **opts)
    priv = Sandbox.connect(private.sandbox_id, **opts)
    # The server started before the restart answers at once (no wait: it never stopped).
    r = fetch(second, pub.get_host(WEB_PORT))
    assert r.status == 200 and r.body == WEB_BODY, (r.status, r.text)
    r = http_request(second.port, "GET", "/hello.txt", headers=sandbox_headers(pub.sandbox_id, port=WEB_PORT))
    assert r.status == 200 and r.body == WEB_BODY, (r.status, r.text)
    # The private one is still private, with the same traffic token.
    assert priv.traffic_access_token == token
    info = Sandbox.get_info(private.sandbox_id, **opts)
    assert info.network is not None and info.network["allow_public_traffic"] is False, info.network
    r = fetch(second, priv.get_host(WEB_PORT))
    assert r.status == 403, (r.status, r.text)
    r = fetch(second, priv.get_host(WEB_PORT), {"E2B-Traffic-Access-Token": token})
    assert r.status == 200 and r.body == WEB_BODY, (r.status, r.text)
    # A port nothing listens on is still "not open".
    r = fetch(second, pub.get_host(WEB_PORT + 1))
    assert r.status == 502, (r.status, r.text)

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_destroy_on_exit_destroys_running_sandboxes_and_the_next_server_says_so(restarts):
    first = restarts.start(keep=False)  # --destroy-on-exit
    opts = first.opts()
    sbx = Sandbox.create(timeout=300, metadata={"k": "v"}, **opts)
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    sbx.commands.run("sleep 999", background=True)
    assert first.stop() == 0, first.log_tail()
    assert "destroying 1 sandbox" in first.log_tail(), first.log_tail()
    # Gone at the stop already.
    assert_nothing_left(pid1s, first.state_dir)

    second = restarts.start(keep=False)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, **second.opts())
    r = get_sandbox(second, sbx.sandbox_id)
    assert r.status == 404 and "was lost" in r.text and "--destroy-on-exit" in r.text, r.text
    gone = lost(second)
    assert sbx.sandbox_id in gone, gone
    assert gone[sbx.sandbox_id]["state"] == "lost" and gone[sbx.sandbox_id]["lostReason"], gone
    assert "--destroy-on-exit" in gone[sbx.sandbox_id]["lostReason"], gone
    assert sbx.sandbox_id not in ids(Sandbox.list(**second.opts()))

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_destroy_on_exit_server_that_crashes_takes_its_sandboxes_with_it(restarts):
    first = restarts.start(keep=False)  # --destroy-on-exit
    sbx = Sandbox.create(timeout=300, **first.opts())
    pid1s: Dict[int, Pid1] = {}
    new_pid1(first, pid1s)
    sigkill(first)
    assert_nothing_left(pid1s, first.state_dir)

    second = restarts.start(keep=False)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sbx.sandbox_id, **second.opts())
    r = get_sandbox(second, sbx.sandbox_id)
    assert r.status == 404 and "was lost" in r.text and "ended while no husk server ran" in r.text, r.text
    assert sbx.sandbox_id in lost(second)

    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


def test_a_sigterm_as_soon_as_the_server_listens_stops_it_in_order(restarts):
    """A server told to stop as soon as it says it listens (here: while it takes up what the
    previous one kept) stops in order: exit code 0, and with --destroy-on-exit the sandboxes
    it took up are destroyed, not left running with no server."""
    first = restarts.start(keep=True)
    pid1s: Dict[int, Pid1] = {}
    made = []
    for _ in range(3):
        sbx = Sandbox.create(timeout=300, **first.opts())
        new_pid1(first, pid1s)
        sbx.commands.run("sleep 1234", background=True)
        made.append(sbx.sandbox_id)
    assert first.stop() == 0, first.log_tail()

    state_dir = restarts.state_dir
    log_path = state_dir.parent / f"{state_dir.name}.sigterm.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(first.bin), "serve", "--listen", "127.0.0.1:0", "--state-dir", str(state_dir),
             "--destroy-on-exit", "--egress", "off"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=first.store_env(),
        )
    try:
        wait_for(lambda: b"listening on" in log_path.read_bytes() or proc.poll() is not None, 30,
                 "the server to listen", 0.001)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
        text = log_path.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log_path.unlink(missing_ok=True)
    assert rc == 0, f"exit {rc} on a SIGTERM right after 'listening on':\n{text[-3000:]}"
    assert "stopped" in text, text[-3000:]
    assert_nothing_left(pid1s, state_dir)

    second = restarts.start(keep=False)
    for sandbox_id in made:
        r = get_sandbox(second, sandbox_id)
        assert r.status == 404 and "was lost" in r.text, r.text
    restarts.finish()


@pytest.mark.asyncio
async def test_the_async_sdk_finds_a_sandbox_and_its_process_after_a_restart(restarts):
    """The same with the async SDK (`AsyncSandbox`): a SIGTERM restart keeps a sandbox, its
    file and its background process, which a reconnect by pid reattaches to."""
    from e2b import AsyncSandbox

    first = restarts.start(keep=True)
    pid1s: Dict[int, Pid1] = {}
    sbx = await AsyncSandbox.create(timeout=300, metadata={"via": "async"}, **first.opts())
    new_pid1(first, pid1s)
    await sbx.files.write("/home/user/a", "async, before")
    handle = await sbx.commands.run("while :; do echo tick; sleep 0.2; done", background=True)
    assert first.stop() == 0, first.log_tail()

    second = restarts.start(keep=False)
    back = await AsyncSandbox.connect(sbx.sandbox_id, **second.opts())
    assert (await back.get_info()).metadata == {"via": "async"}
    assert await back.files.read("/home/user/a") == "async, before"
    assert handle.pid in [p.pid for p in await back.commands.list()]
    seen: List[str] = []
    again = await back.commands.connect(handle.pid, on_stdout=seen.append)
    await wait_async(lambda: any("tick" in s for s in seen), 10)
    await again.kill()
    assert await back.kill() is True
    restarts.finish()
    assert_nothing_left(pid1s, restarts.state_dir)


async def wait_async(check, timeout: float) -> None:
    import asyncio

    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
