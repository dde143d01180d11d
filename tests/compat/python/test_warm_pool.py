"""Warm pools (`husk serve --warm code-interpreter=2`) through the stock code-interpreter SDK
(`e2b_code_interpreter.Sandbox`, pinned 2.11.5).

A server of its own keeps a pool of the `code-interpreter` preset; `ci_husk` (conftest.py), a
server without a pool, makes the fresh sandboxes a claimed one is compared with. A claimed
sandbox must be indistinguishable from a fresh one, from inside (environment, hostname and the
files that carry it, kernel state and execution count, files, processes, uid mapping) and from
the API (id, metadata, start time); `GET /husk/v1/pools` shows the claims. (Creates a warm
sandbox cannot serve, made fresh, are covered in the core's unit tests.)"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from e2b_code_interpreter import Sandbox

from husk_compat import (
    CODE_INTERPRETER_PRESETS,
    PRESETS_DIR,
    build_template,
    http_request,
    remove_template,
    start_server,
)

pytestmark = pytest.mark.timeout(240, func_only=True)

# What the kernel reports about itself, as the first execution of a sandbox: the names in its
# namespace, its execution count, its environment, hostname, the files that carry it, some
# directories, the processes by name, and its uid mapping's shape.
PROBE = r"""
import os, socket, json
def _probe():
    procs = []
    for p in os.listdir('/proc'):
        if p.isdigit():
            try:
                procs.append(open(f'/proc/{p}/comm').read().strip())
            except OSError:
                pass
    uid_map = [l.split() for l in open('/proc/self/uid_map').read().splitlines()]
    return {
        'env': dict(os.environ),
        'hostname': socket.gethostname(),
        'etc_hostname': open('/etc/hostname').read(),
        'etc_hosts': open('/etc/hosts').read(),
        'dirs': {d: sorted(os.listdir(d)) for d in ['/', '/tmp', '/etc', '/home/user', os.getcwd()]},
        'procs': sorted(procs),
        'uid_map_inside': [(m[0], m[2]) for m in uid_map],
        'uid_map_host': [m[1] for m in uid_map],
    }
print(json.dumps({'names': sorted(k for k in globals() if k not in ('_probe',)), **_probe()}))
"""


def probe(sbx: Sandbox) -> tuple[dict, int]:
    ex = sbx.run_code(PROBE)
    assert ex.error is None, ex.error
    return json.loads("".join(ex.logs.stdout)), ex.execution_count


def pools(server) -> dict:
    r = http_request(server.port, "GET", "/husk/v1/pools", {"X-API-Key": server.admin_key})
    assert r.status == 200, r.body
    return {p["template"]: p for p in r.json()["pools"]}


def wait_ready(server, n: int, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        p = pools(server).get("code-interpreter", {})
        if p.get("ready", 0) >= n:
            return p
        assert time.monotonic() < deadline, f"the pool did not fill: {p}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def warm_husk():
    server = start_server(extra_args=("--warm", "code-interpreter=2"))
    built = []
    try:
        for preset in CODE_INTERPRETER_PRESETS:
            build_template(server, PRESETS_DIR / preset)
            built.append(preset)
        yield server
    finally:
        for preset in reversed(built):
            remove_template(server, preset)
        server.close()


def test_a_claimed_sandbox_is_indistinguishable_from_a_fresh_one(warm_husk, ci_husk):
    wait_ready(warm_husk, 2)
    before = pools(warm_husk)["code-interpreter"]
    envs = {"FOO": "bar", "PATH_EXTRA": "it's \"quoted\" $HOME"}
    meta = {"who": "pool-test"}
    t0 = datetime.now(timezone.utc)
    warm = Sandbox.create(envs=envs, metadata=meta, timeout=120, **warm_husk.opts())
    fresh = Sandbox.create(envs=envs, metadata=meta, timeout=120, **ci_husk.opts())
    other = None
    try:
        after = pools(warm_husk)["code-interpreter"]
        # Served by the pool: claimed, and no claim failed (a failed one is made fresh).
        assert after["claimed"] == before["claimed"] + 1, after
        assert after["claim_failed"] == 0, after
        got, count = probe(warm)
        want, fresh_count = probe(fresh)
        # Kernel state: the first execution of each, nothing else in its namespace.
        assert count == fresh_count == 1
        assert got["names"] == want["names"]
        # Environment: the create's variables, and nothing of the pool's.
        assert got["env"] == want["env"]
        assert got["env"]["FOO"] == "bar"
        # Named by its own id, everywhere the name is.
        assert got["hostname"] == warm.sandbox_id
        assert got["etc_hostname"] == f"{warm.sandbox_id}\n"
        assert got["etc_hosts"] == want["etc_hosts"].replace(fresh.sandbox_id, warm.sandbox_id)
        assert got["dirs"] == want["dirs"]
        assert got["procs"] == want["procs"]
        assert got["uid_map_inside"] == want["uid_map_inside"]
        # A command sees the create's variables too.
        assert warm.commands.run("echo $FOO").stdout == "bar\n"
        # From the API: its own metadata, and it started when it was claimed.
        info = warm.get_info()
        assert info.metadata == meta
        assert info.started_at >= t0.replace(microsecond=0)
        # Another claimed sandbox maps its users to other host uids.
        other = Sandbox.create(timeout=60, **warm_husk.opts())
        got_other, _ = probe(other)
        assert got_other["uid_map_host"] != got["uid_map_host"]
        assert got_other["env"].get("FOO") is None
    finally:
        for s in (warm, fresh, other):
            if s is not None:
                s.kill()


def test_claims_are_counted_and_the_pools_route_is_an_operators(warm_husk):
    wait_ready(warm_husk, 1)
    before = pools(warm_husk)["code-interpreter"]
    sbx = Sandbox.create(timeout=60, **warm_husk.opts())
    try:
        assert sbx.run_code("1+1").text == "2"
    finally:
        sbx.kill()
    after = pools(warm_husk)["code-interpreter"]
    assert after["claimed"] == before["claimed"] + 1
    assert (after["claim_failed"], after["target"]) == (0, 2), after
    # The figures are an operator's: another team's key is refused, no key is 401.
    other = warm_husk.create_key("pool-other")
    assert http_request(warm_husk.port, "GET", "/husk/v1/pools", {"X-API-Key": other}).status == 403
    assert http_request(warm_husk.port, "GET", "/husk/v1/pools").status == 401


def test_a_claimed_kernel_holds_the_creates_secret_masked(warm_husk):
    """A secret named in the create's `envs` reaches the warm kernel (set at claim) as its
    value, masked in what the kernel prints, as in a fresh sandbox."""
    import subprocess

    value = "sk-warm-4e1d77a9-not-for-eyes"
    out = subprocess.run(
        [str(warm_husk.bin), "secret", "set", "WARM_KEY", "--team", "default",
         "--state-dir", str(warm_husk.state_dir)],
        input=value.encode(), capture_output=True, timeout=30, env=warm_husk.store_env(),
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    wait_ready(warm_husk, 1)
    before = pools(warm_husk)["code-interpreter"]
    sbx = Sandbox.create(envs={"TOKEN": "husk-secret://WARM_KEY"}, timeout=60, **warm_husk.opts())
    try:
        after = pools(warm_husk)["code-interpreter"]
        assert after["claimed"] == before["claimed"] + 1, after
        assert after["claim_failed"] == 0, after
        ex = sbx.run_code(
            f"import os; print(os.environ['TOKEN'] == {value!r}); print(os.environ['TOKEN'])"
        )
        assert ex.error is None, ex.error
        lines = "".join(ex.logs.stdout).splitlines()
        assert lines[0] == "True", lines
        assert value not in "".join(ex.logs.stdout)
        assert lines[1] != value
        # The first execution the client sees is the first the kernel counts.
        assert ex.execution_count == 1
    finally:
        sbx.kill()
