"""The stock E2B Python SDK (e2b==2.63.0) against a husk server inside the VM:
sdk_check.py URL API_KEY full|smoke [TEMPLATE]. Prints one `RESULT<TAB>check<TAB>ok|FAIL|skip<TAB>detail` line per
check (kind-body records them); tracebacks go to the same log."""

import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from e2b import CommandExitException, Sandbox

URL, KEY, MODE = sys.argv[1], sys.argv[2], sys.argv[3]
TEMPLATE = sys.argv[4] if len(sys.argv) > 4 else ""
# `smoke`: create, a command, kill; `full`: also files, the carried-in template and 10
# sandboxes at once.
FULL = MODE == "full"
# TCG is slow: generous per-request deadlines, sandboxes that outlive the checks.
OPTS = dict(api_url=URL, sandbox_url=URL, api_key=KEY, request_timeout=180)
failed = set()


def result(name, status, detail=""):
    detail = " ".join(str(detail).split())[:500]
    print(f"RESULT\t{name}\t{status}\t{detail}", flush=True)


def check(name, fn, needs=()):
    missing = [n for n in needs if n in failed]
    if missing:
        failed.add(name)
        result(name, "skip", f"needs {', '.join(missing)}")
        return
    t0 = time.monotonic()
    try:
        detail = fn() or ""
        result(name, "ok", f"{detail} ({time.monotonic() - t0:.1f}s)".strip())
    except Skip as e:
        result(name, "skip", str(e))
    except Exception as e:  # every failure is a result, never a crash of the suite
        traceback.print_exc()
        failed.add(name)
        result(name, "FAIL", f"{type(e).__name__}: {e}")


state = {}


def create():
    state["sbx"] = Sandbox.create(timeout=600, **OPTS)
    return state["sbx"].sandbox_id


def commands():
    sbx = state["sbx"]
    r = sbx.commands.run("echo hi; id -un")
    assert r.exit_code == 0 and r.stdout.split()[0] == "hi", repr(r)
    try:
        sbx.commands.run("exit 3")
        raise AssertionError("exit 3 did not raise")
    except CommandExitException as e:
        assert e.exit_code == 3, e.exit_code
    return f"user {r.stdout.split()[1]}"


def base_pool():
    """The server's warm pool of `base` (`/husk/v1/pools`), or None."""
    import json
    import urllib.request

    req = urllib.request.Request(URL + "/husk/v1/pools", headers={"X-API-Key": KEY})
    with urllib.request.urlopen(req, timeout=60) as r:
        pools = json.load(r)["pools"]
    return next((p for p in pools if p["template"] == "base"), None)


def pool_ready(deadline):
    """Waits (until `deadline`, monotonic) for a warm `base` sandbox; the pool as it is then."""
    while True:
        p = base_pool()
        if p["ready"] >= 1:
            return p
        if time.monotonic() > deadline:
            raise AssertionError(f"the pool did not fill: {p}")
        time.sleep(1)


def warm():
    """A create served by the server's warm pool (`--warm base=2`, servers the kind starts
    itself): named by its own id in the kernel (set by the spawner) and in /etc/hostname."""
    import json

    if base_pool() is None:
        raise Skip("no warm pool on this server")
    deadline = time.monotonic() + 300
    before = pool_ready(deadline)
    s = Sandbox.create(timeout=120, **OPTS)
    try:
        names = s.commands.run("cat /proc/sys/kernel/hostname /etc/hostname").stdout.split()
        assert names == [s.sandbox_id] * 2, (names, s.sandbox_id)
    finally:
        s.kill()
    after = base_pool()
    assert after["claimed"] == before["claimed"] + 1, after
    assert after["claim_failed"] == 0, after
    # A create with a workspace claims too: the spawner mounts it into the running sandbox.
    name = f"vm-ws-{int(time.time() * 1000)}"
    status, body = husk_api("POST", "/husk/v1/workspaces", json.dumps({"name": name}).encode())
    if status == 501:
        return f"claimed {after['claimed']}; no workspace at a claim: {body.decode(errors='replace')}"
    assert status == 201, (status, body)
    try:
        status, body = husk_api("PUT", f"/husk/v1/workspaces/{name}/files/in.txt", b"from the host\n")
        assert status // 100 == 2, (status, body)
        before = pool_ready(deadline)
        s = Sandbox.create(timeout=120, volume_mounts={"/data": f"{name}:rw"}, **OPTS)
        try:
            r = s.commands.run("cat /data/in.txt; stat -c %U /data/in.txt; echo out > /data/out.txt")
            assert r.stdout == "from the host\nuser\n", repr(r.stdout)
        finally:
            s.kill()
        after = base_pool()
        assert after["claimed"] == before["claimed"] + 1, after
        assert after["claim_failed"] == 0, after
        status, body = husk_api("GET", f"/husk/v1/workspaces/{name}/files/out.txt")
        assert (status, body) == (200, b"out\n"), (status, body)
    finally:
        husk_api("DELETE", f"/husk/v1/workspaces/{name}")
    return f"claimed {after['claimed']}, one with a workspace"


def run_events(spec):
    """A run through husk's run API (`POST /husk/v1/runs`): its NDJSON events, keepalives left out."""
    import json

    status, body = husk_api("POST", "/husk/v1/runs", json.dumps(spec).encode())
    assert status == 200, (status, body[:300])
    events = [json.loads(line) for line in body.splitlines() if line.strip()]
    return [e for e in events if e.get("type") != "keepalive"]


def warm_limits():
    """Runs with limits below the server's, on a server with a warm pool: each claims a warm
    sandbox, and the spawner lowers its limits at the claim (the writable layer's tmpfs resized,
    the cgroups' limits written, under this kind's cgroup set-up). Seen from inside: /dev/shm
    (a directory of the layer) has the run's disk, and a shell holding more memory than the
    run's memory and disk together is killed by the OOM killer."""
    if base_pool() is None:
        raise Skip("no warm pool on this server")
    deadline = time.monotonic() + 300
    limits = {"memory_mb": 64, "disk_mb": 16}
    before = pool_ready(deadline)
    events = run_events({"shell": "df -k /dev/shm | tail -n 1", "limits": limits, "timeout": 60})
    end = events[-1]["run"]
    assert end["status"] == "succeeded", end
    out = "".join(e["data"] for e in events if e["type"] == "stdout")
    size_kib = int(out.split()[1])
    assert size_kib == 16 * 1024, f"/dev/shm is {size_kib} KiB, not the run's 16 MiB: {out!r}"
    pool_ready(deadline)
    # 300 MB in a shell variable: far above 64 + 16 MiB, within the server's default limits.
    hog = "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo held ${#x}"
    events = run_events({"shell": hog, "limits": limits, "timeout": 120})
    end = events[-1]["run"]
    assert end["reason"] == "out of memory", end
    after = base_pool()
    assert after["claimed"] == before["claimed"] + 2, (before, after)
    assert after["claim_failed"] == 0, after
    return f"claimed 2 with 64 MiB and 16 MiB: /dev/shm {size_kib} KiB, the hog {end['reason']}"


def husk_api(method, path, body=None):
    """(status, body) of one request to husk's own API."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(URL + path, data=body, method=method, headers={"X-API-Key": KEY})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def files():
    sbx = state["sbx"]
    sbx.files.write("/tmp/vm-check.txt", "written by the SDK")
    got = sbx.files.read("/tmp/vm-check.txt")
    assert got == "written by the SDK", repr(got)
    r = sbx.commands.run("cat /tmp/vm-check.txt")
    assert r.stdout == "written by the SDK", repr(r.stdout)
    names = [e.name for e in sbx.files.list("/tmp")]
    assert "vm-check.txt" in names, names


def template():
    if not TEMPLATE:
        raise AssertionError("no template was carried in (its build failed on the host)")
    s = Sandbox.create(template=TEMPLATE, timeout=600, **OPTS)
    try:
        r = s.commands.run("cat /etc/husk-vm-template")
        assert r.stdout.strip() == "carried-in", repr(r.stdout)
    finally:
        s.kill()


def one(i):
    s = Sandbox.create(timeout=600, **OPTS)
    try:
        r = s.commands.run(f"echo {i}")
        assert r.stdout.strip() == str(i), repr(r.stdout)
    finally:
        s.kill()


def ten_at_once():
    with ThreadPoolExecutor(10) as ex:
        list(ex.map(one, range(10)))


class Skip(Exception):
    pass


def rules_ca():
    """A sandbox created with a header rule (network.rules): its PID 1 appends its own CA to the
    template's bundle before anything runs (trust.rs: openat2 in the sandbox's root), and the
    TLS libraries' variables name that bundle."""
    count = "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt || true"
    plain = int(state["sbx"].commands.run(count).stdout.strip() or 0)
    try:
        s = Sandbox.create(
            timeout=600,
            network={"rules": {"vm.test": [{"transform": {"headers": {"X-Vm": "1"}}}]}},
            **OPTS,
        )
    except Exception as e:
        if "need sandboxes with a network" in str(e):
            raise Skip("the server runs without sandbox egress")
        raise
    try:
        ruled = int(s.commands.run(count).stdout.strip())
        assert ruled == plain + 1, f"{ruled} certificates, the template has {plain}"
        r = s.commands.run("stat -c %u /etc/ssl/certs/ca-certificates.crt; echo $SSL_CERT_FILE")
        assert r.stdout.split() == ["0", "/etc/ssl/certs/ca-certificates.crt"], repr(r.stdout)
        return f"{plain} + 1 certificates"
    finally:
        s.kill()


def pause():
    """Pause and resume on a stock kernel: frozen in place (the cgroup's freezer, v1 or v2)
    and saved to disk (the writable layer copied out by the files helper, then mounted again,
    id-mapped, under a new sandbox with the same id)."""
    s = Sandbox.create(timeout=600, **OPTS)
    try:
        s.files.write("/home/user/kept.txt", "before the pause")
        s.commands.run("rm -f /tmp/gone; touch /tmp/gone; rm /tmp/gone; mkdir -p /tmp/d", user="root")
        bg = s.commands.run("sleep 1000", background=True)
        assert s.pause() is True, "pause() was refused"
        assert Sandbox.get_info(s.sandbox_id, **OPTS).state.value == "paused"
        Sandbox.connect(s.sandbox_id, **OPTS)
        pids = [p.pid for p in s.commands.list()]
        assert bg.pid in pids, f"the background command {bg.pid} is gone: {pids}"
        assert s.pause(mode="filesystem") is True, "the filesystem pause was refused"
        Sandbox.connect(s.sandbox_id, **OPTS)
        got = s.files.read("/home/user/kept.txt")
        assert got == "before the pause", repr(got)
        r = s.commands.run("stat -c %U /home/user/kept.txt; test -d /tmp/d && echo dir")
        assert r.stdout.split() == ["user", "dir"], repr(r.stdout)
        old = [p.pid for p in s.commands.list() if "sleep 1000" in " ".join([p.cmd, *p.args])]
        assert old == [], f"processes outlived a filesystem pause: {old}"
        return "full and filesystem"
    finally:
        s.kill()


def snapshot():
    """A snapshot of a running sandbox (its layer copied while frozen, on this kernel's
    overlayfs and id-mapped mounts), a sandbox created from it, a fork of 2, and nothing of
    either left once they are deleted and killed."""
    s = Sandbox.create(timeout=120, **OPTS)
    made = []
    try:
        s.files.write("/home/user/snap.txt", "in the snapshot")
        s.commands.run("mkdir -p /tmp/d && rm -f /home/user/.bashrc")
        info = s.create_snapshot(name="vm-check")
        s.files.write("/home/user/snap.txt", "after the snapshot")
        c = Sandbox.create(info.snapshot_id, timeout=60, **OPTS)
        made.append(c)
        got = c.files.read("/home/user/snap.txt")
        assert got == "in the snapshot", repr(got)
        r = c.commands.run("stat -c %U /home/user/snap.txt; test -d /tmp/d && echo dir; "
                           "test -e /home/user/.bashrc || echo deleted")
        assert r.stdout.split() == ["user", "dir", "deleted"], repr(r.stdout)
        forks = s.fork(count=2)
        for f in forks:
            assert not isinstance(f, Exception), f"a fork failed: {f}"
            made.append(f)
            got = f.files.read("/home/user/snap.txt")
            assert got == "after the snapshot", repr(got)
        assert Sandbox.delete_snapshot(info.snapshot_id, **OPTS) is True
        return "snapshot, create from it, fork of 2"
    finally:
        for m in made:
            m.kill()
        s.kill()


def kill():
    sbx = state["sbx"]
    sbx.kill()
    assert not sbx.is_running(), "still running after kill"


def none_left():
    deadline = time.monotonic() + 60
    while True:
        left = Sandbox.list(**OPTS).next_items()
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still listed: {[s.sandbox_id for s in left]}")
        time.sleep(1)


def only_full(name, fn, needs=()):
    if FULL:
        check(name, fn, needs)
    else:
        result(name, "skip", "smoke mode (HUSK_VM_FULL_SDK_KINDS)")


check("sdk-create", create)
check("sdk-commands", commands, needs=["sdk-create"])
check("sdk-warm", warm)
check("sdk-warm-limits", warm_limits)
only_full("sdk-files", files, needs=["sdk-create"])
only_full("sdk-template", template)
only_full("sdk-10-at-once", ten_at_once)
check("sdk-rules-ca", rules_ca, needs=["sdk-create"])
check("sdk-pause", pause)
check("sdk-snapshot", snapshot)
check("sdk-kill", kill, needs=["sdk-create"])
check("sdk-none-left", none_left)
