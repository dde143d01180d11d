"""Benchmark of `husk serve` through the stock E2B SDK (e2b==2.63.0) and plain HTTP.

Prints, from one run against one server it starts itself:
- create -> agent ready, server side (the create response's Server-Timing) and as the client sees it;
- an authenticated request that does little else (the key check, a list of the team's sandboxes);
- SDK `Sandbox.create()` + first `commands.run("true")`;
- creates per second at concurrencies 1, 20 and 100 (each worker creates, then kills), over
  plain HTTP and through the stock SDK, each with the CPU a cycle took by process (server,
  spawners and sandboxes, helpers, client, the kernel's workers: cpu_share.py), beside
  bubblewrap launches at the same concurrency and the machine's CPU per launch
  (bench_creates.py);
- `commands.run("true")` in a ready sandbox (SDK and raw Connect) beside a bare fork+exec of
  /bin/true from this process (the peer);
- upload and download MB/s of one file over plain HTTP and through the SDK (the SDK's own
  transport is CPU-bound on the client side for downloads: compare both);
- a file into and out of a workspace (husk's workspace API: through the files helper), and
  a listing;
- a one-shot run's round trip through husk's run API (submit -> output saved in a workspace)
  beside `husk run` of the same script with `--output` (no server), interleaved;
- a batch of 20 items: wall time at parallelism 1, 2 and 4;
- create with a network vs without: a second server whose egress is a simulated internet (a
  network namespace of the benchmark's own, only its loopback up; removed at the end, and by
  tests/compat/netsim/reaper.py if this process dies), creates interleaved with the first
  server's (egress off): create -> agent ready server side and client side, and the ratios;
- pause and resume in each mode, idle and loaded (files and memory), beside freezing a cgroup
  directly and copying the same bytes to disk (the floors);
- snapshots and forks: snapshot of an idle and a loaded sandbox, a create from it, a fork of
  10, beside 10 plain creates one after the other and the same copy to disk;
- the code interpreter, on a third server with the `base` and `code-interpreter` presets built
  (shared layer cache) and the stock e2b-code-interpreter SDK: `Sandbox.create()` + first
  `run_code("1+1")`; `run_code("1+1")` in a ready sandbox beside the same ipykernel driven
  directly by jupyter_client on this host (the peer; scripts/jupyter-test-venv), and the
  kernel's own time; memory of an idle sandbox with its Python kernel beside one without;
  then the same create + first result from a warm pool (`--warm code-interpreter=2`, a fourth
  server), each create timed once the pool has a warm sandbox ready;
- the state store, SQLite beside PostgreSQL: two servers of this process, one on each, measured
  interleaved (ABBA rounds): create + kill over HTTP with the create's store step, an
  authenticated list (a key check in the store), SDK create + kill cycles per second at
  concurrencies 1 and 20, and the ratios (`--only store`);
- one tenant's abuse (issue 15: stalled uploads and run bodies, unread downloads, connections
  that never finish their head, from another address) beside another team's SDK create + first
  command and workspace call, quiet and under the abuse, and the server's memory meanwhile.

Figures are printed, never asserted: this machine is a shared VM, compare ratios within a run.
Run with tests/compat/bench.sh (as root); HUSK_BIN picks the binary (use a release build).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import http.client
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

from e2b import Sandbox

from bench_creates import creates_table, sdk_creates
from bench_density import density
from husk_compat import (
    CODE_INTERPRETER_PRESETS,
    PRESETS_DIR,
    REPO_ROOT,
    Deadline,
    build_template,
    remove_template,
    create_raw_sandbox,
    envelope,
    http_request,
    kill_raw_sandbox,
    parse_envelopes,
    sandbox_headers,
    start_server,
    wait_for,
)

NETSIM = Path(__file__).resolve().parent.parent / "netsim"
BENCH_NETNS_RE = re.compile(r"husk-bench-(\d+)")


def pct(values: List[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def line(name: str, values_ms: List[float]) -> None:
    print(
        f"  {name:<46} p50 {pct(values_ms, 50):7.2f} ms   p99 {pct(values_ms, 99):7.2f} ms"
        f"   (n={len(values_ms)})"
    )


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1000


def raw_create_times(port: int, key: str, n: int) -> dict:
    """Sequential creates, each followed by its kill, over one keep-alive connection (ms):
    "server" (the create's Server-Timing total) and its steps "spawn", "boot", "register";
    "client" (the create as the client sees it) and "kill" (the DELETE, likewise)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times: dict = {"server": [], "spawn": [], "boot": [], "register": [], "client": [], "kill": []}
    body = json.dumps({"templateID": "base", "timeout": 60}).encode()
    for _ in range(n):
        t = time.perf_counter()
        conn.request("POST", "/v2/sandboxes", body, {"X-API-KEY": key, "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        times["client"].append((time.perf_counter() - t) * 1000)
        if resp.status != 201:
            raise RuntimeError(f"create: {resp.status} {data!r}")
        timing = dict(re.findall(r"(\w+);dur=([0-9.]+)", resp.getheader("server-timing", "")))
        times["server"].append(float(timing["create"]))
        for step in ("spawn", "boot", "register"):
            times[step].append(float(timing[step]))
        sid = json.loads(data)["sandboxID"]
        t = time.perf_counter()
        conn.request("DELETE", f"/sandboxes/{sid}", headers={"X-API-KEY": key})
        resp = conn.getresponse()
        data = resp.read()
        times["kill"].append((time.perf_counter() - t) * 1000)
        if resp.status not in (200, 204):
            raise RuntimeError(f"delete {sid}: {resp.status} {data!r}")
    conn.close()
    return times


def raw_creates(port: int, key: str, n: int) -> None:
    """Sequential creates over one keep-alive connection: server-side and client-side times."""
    times = raw_create_times(port, key, n)
    line("create -> agent ready, server side", times["server"])
    line("  of which: a spawner makes it", times["spawn"])
    line("  of which: the agent's hello", times["boot"])
    line("  of which: registration (store)", times["register"])
    line("create over HTTP, as the client sees it", times["client"])


def keyed_request_times(port: int, key: str, n: int) -> List[float]:
    """An authenticated request that does little else: the key check (the state helper's, since
    issue 17) and one read of the team's sandboxes, over one keep-alive connection (ms)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/v2/sandboxes", headers={"X-API-KEY": key})
        resp = conn.getresponse()
        data = resp.read()
        times.append((time.perf_counter() - t) * 1000)
        if resp.status != 200:
            raise RuntimeError(f"list: {resp.status} {data!r}")
    conn.close()
    return times


def keyed_request_latency(port: int, key: str, n: int) -> None:
    line("GET /v2/sandboxes (key check + list), as the client sees it", keyed_request_times(port, key, n))


def sdk_create_first_command(opts: dict, n: int) -> None:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        sbx = Sandbox.create(**opts)
        sbx.commands.run("true")
        times.append((time.perf_counter() - t) * 1000)
        sbx.kill()
    line("SDK Sandbox.create() + commands.run('true')", times)


def command_latency(opts: dict, port: int, key: str, n: int) -> None:
    # The peer: fork+exec of /bin/true from this process, no sandbox.
    def bare() -> None:
        pid = os.posix_spawn("/bin/true", ["true"], {})
        os.waitpid(pid, 0)

    line("bare fork+exec of /bin/true (peer)", [timed(bare) for _ in range(n)])
    sbx = Sandbox.create(**opts)
    try:
        sbx.commands.run("true")
        line("SDK commands.run('true') in a ready sandbox", [timed(lambda: sbx.commands.run("true")) for _ in range(n)])
    finally:
        sbx.kill()
    raw_sbx = create_raw_sandbox(port, key)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        start = json.dumps({"process": {"cmd": "/bin/true"}, "stdin": False}).encode()
        headers = sandbox_headers(raw_sbx["sandboxID"], raw_sbx["envdAccessToken"])
        headers.update({"Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"})

        def raw() -> None:
            conn.request("POST", "/process.Process/Start", envelope(start), headers)
            resp = conn.getresponse()
            frames = parse_envelopes(resp.read())
            if resp.status != 200 or not any("end" in json.loads(f[1] or b"{}").get("event", {}) for f in frames):
                raise RuntimeError(f"raw Start failed: {resp.status} {frames!r}")

        raw()
        line("Connect Start of /bin/true, raw HTTP (no SDK)", [timed(raw) for _ in range(n)])
        conn.close()
    finally:
        kill_raw_sandbox(port, key, raw_sbx["sandboxID"])


def transfer(opts: dict, port: int, key: str, size_mb: int) -> None:
    data = os.urandom(1 << 20) * size_mb
    raw_sbx = create_raw_sandbox(port, key)
    try:
        # Plain HTTP first: what the server sustains when the client is not the limit.
        h = sandbox_headers(raw_sbx["sandboxID"], raw_sbx["envdAccessToken"])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

        def up() -> None:
            headers = {**h, "Content-Type": "application/octet-stream"}
            conn.request("POST", "/files?path=/tmp/bench.bin", data, headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"upload: {r.status}")

        got: List[bytes] = []

        def down() -> None:
            conn.request("GET", "/files?path=/tmp/bench.bin", headers=h)
            got.append(conn.getresponse().read())

        print(f"  upload {size_mb} MB over plain HTTP                    {size_mb / (timed(up) / 1000):7.0f} MB/s")
        print(f"  download {size_mb} MB over plain HTTP                  {size_mb / (timed(down) / 1000):7.0f} MB/s")
        if got[0] != data:
            raise RuntimeError("downloaded file differs from the upload")
        conn.close()
    finally:
        kill_raw_sandbox(port, key, raw_sbx["sandboxID"])
    sbx = Sandbox.create(**opts)
    try:
        up = timed(lambda: sbx.files.write("/tmp/bench.bin", data)) / 1000
        got: List[bytes] = []
        down = timed(lambda: got.append(sbx.files.read("/tmp/bench.bin", format="bytes"))) / 1000
        if bytes(got[0]) != data:
            raise RuntimeError("downloaded file differs from the upload")
        print(f"  upload {size_mb} MB through the SDK                     {size_mb / up:7.0f} MB/s")
        print(f"  download {size_mb} MB through the SDK                   {size_mb / down:7.0f} MB/s")
    finally:
        sbx.kill()


def workspace_transfer(port: int, key: str, size_mb: int, n: int) -> None:
    """A file into a workspace and back out, and its listing, over husk's workspace API (what
    crosses the files helper)."""
    data = os.urandom(1 << 20) * size_mb
    status, _ = native(port, key, "POST", "/husk/v1/workspaces", {"name": "bench-transfer"})
    if status != 201:
        raise RuntimeError(f"create workspace: {status}")
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        headers = {"X-API-Key": key}

        def up() -> None:
            conn.request("PUT", "/husk/v1/workspaces/bench-transfer/files/f.bin", data, headers)
            r = conn.getresponse()
            r.read()
            if r.status not in (201, 204):
                raise RuntimeError(f"workspace upload: {r.status}")

        got: List[bytes] = []

        def down() -> None:
            conn.request("GET", "/husk/v1/workspaces/bench-transfer/files/f.bin", headers=headers)
            got.append(conn.getresponse().read())

        ups = [timed(up) for _ in range(3)]
        downs = [timed(down) for _ in range(3)]
        if got[0] != data:
            raise RuntimeError("the workspace download differs from the upload")
        print(f"  workspace upload {size_mb} MB (best of 3)                {size_mb / (min(ups) / 1000):7.0f} MB/s")
        print(f"  workspace download {size_mb} MB (best of 3)              {size_mb / (min(downs) / 1000):7.0f} MB/s")

        def stat() -> None:
            conn.request("GET", "/husk/v1/workspaces/bench-transfer/files?path=&depth=1", headers=headers)
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise RuntimeError(f"workspace listing: {r.status}")

        line("workspace listing (one file)", [timed(stat) for _ in range(n)])
        conn.close()
    finally:
        native(port, key, "DELETE", "/husk/v1/workspaces/bench-transfer")


def native(port: int, key: str, method: str, path: str, body: object = None):
    """One request to husk's own API: (status, parsed JSON or None)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"X-API-Key": key, "Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, (json.loads(raw) if raw else None)


def stream_events(port: int, key: str, path: str, body: object) -> List[dict]:
    """POSTs to a streaming endpoint and reads its NDJSON events to the end."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"X-API-Key": key, "Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{path}: {resp.status} {resp.read()[:300]!r}")
    events = []
    for raw in resp:
        ev = json.loads(raw)
        if ev.get("type") != "keepalive":
            events.append(ev)
    conn.close()
    return events


SCRIPT = "import os\nos.makedirs('o', exist_ok=True)\nopen('o/result.txt', 'w').write('ok\\n')\n"


def run_round_trip(server, n: int) -> None:
    """Submit -> outputs saved, through the run API, beside a local `husk run` with --output."""
    import subprocess
    import tempfile
    port, key = server.port, server.admin_key
    status, _ = native(port, key, "POST", "/husk/v1/workspaces", {"name": "bench"})
    if status not in (201, 409):
        raise RuntimeError(f"create workspace: {status}")
    spec = {"code": SCRIPT, "outputs": ["/home/user/o"], "output_workspace": "bench"}
    api, local = [], []
    with tempfile.TemporaryDirectory(prefix="husk-bench-out-") as out:
        for i in range(n):
            t = time.perf_counter()
            events = stream_events(port, key, "/husk/v1/runs", spec)
            api.append((time.perf_counter() - t) * 1000)
            run = events[-1]["run"]
            if run["status"] != "succeeded" or len(run["outputs"]["files"]) != 1:
                raise RuntimeError(f"run failed: {run}")
            t = time.perf_counter()
            subprocess.run(
                [str(server.bin), "run", "-o", f"/home/user/o:{out}/{i}", "--", "python3", "-c", SCRIPT],
                check=True, capture_output=True, timeout=60,
            )
            local.append((time.perf_counter() - t) * 1000)
    line("run API: submit -> output saved (round trip)", api)
    line("husk run -o (no server), same script", local)
    print(f"  ratio run API / husk run (p50)                  {pct(api, 50) / pct(local, 50):7.2f}")


def batch_walls(server, items: int) -> None:
    """A batch of `items` small CPU-bound items at parallelism 1, 2 and 4."""
    port, key = server.port, server.admin_key
    run = {"code": "import sys\nprint(sum(i * i for i in range(300_000)), sys.argv)"}
    for parallel in (1, 2, 4):
        body = {"run": run, "items": [{"args": [str(i)]} for i in range(items)], "parallel": parallel}
        t = time.perf_counter()
        events = stream_events(port, key, "/husk/v1/batches", body)
        wall = time.perf_counter() - t
        b = events[-1]["batch"]
        if b["succeeded"] != items:
            raise RuntimeError(f"batch: {b}")
        print(f"  batch of {items} items at parallelism {parallel}                 wall {wall * 1000:8.1f} ms   ({items / wall:5.1f} items/s)")


def ratio_line(name: str, num: List[float], den: List[float]) -> None:
    print(
        f"  {name:<46} p50 {pct(num, 50) / pct(den, 50):7.2f}      p99 {pct(num, 99) / pct(den, 99):7.2f}"
    )


class BenchNetns:
    """A named network namespace `husk-bench-<pid>` with only its loopback up: the uplink of the
    egress server (husk puts the gateway address on its own veth end there). `close()` removes
    it; if this process dies first, tests/compat/netsim/reaper.py does."""

    def __init__(self) -> None:
        self.name = f"husk-bench-{os.getpid()}"
        self.path = f"/run/netns/{self.name}"
        self.reaper: Optional[subprocess.Popen] = None
        self.created = False

    @staticmethod
    def ip(*args: str) -> str:
        out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    @classmethod
    def sweep_stale(cls) -> None:
        """Removes `husk-bench-<pid>` namespaces whose creator is gone (never a live one's)."""
        for entry in cls.ip("netns", "list").splitlines():
            name = entry.split()[0] if entry.split() else ""
            m = BENCH_NETNS_RE.fullmatch(name)
            if m and not Path(f"/proc/{m.group(1)}").exists():
                subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)

    def start(self) -> None:
        self.reaper = subprocess.Popen(
            [sys.executable, str(NETSIM / "reaper.py"), self.name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        self.ip("netns", "add", self.name)
        self.created = True
        self.ip("-n", self.name, "link", "set", "lo", "up")

    def close(self) -> None:
        try:
            if self.created:
                subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
        finally:
            if self.reaper is not None and self.reaper.poll() is None:
                self.reaper.terminate()
                self.reaper.wait(timeout=10)
        if Path(self.path).exists():
            raise RuntimeError(f"{self.path} still exists after `ip netns del`")


class Creator:
    """Sequential creates (`POST /sandboxes`) and deletes over one keep-alive connection."""

    BODY = json.dumps({"templateID": "base"}).encode()

    def __init__(self, port: int, key: str) -> None:
        self.key = key
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def create(self) -> tuple:
        """(status, body, server-side ms or None, client-side ms); deletes what it created."""
        t = time.perf_counter()
        self.conn.request("POST", "/sandboxes", self.BODY, {"X-API-KEY": self.key, "Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        client = (time.perf_counter() - t) * 1000
        if resp.status != 201:
            return resp.status, data, None, client
        m = re.search(r"\bcreate;dur=([0-9.]+)", resp.getheader("server-timing", ""))
        if not m:
            raise RuntimeError(f"create: no Server-Timing create;dur in {resp.getheaders()!r}")
        sid = json.loads(data)["sandboxID"]
        self.conn.request("DELETE", f"/sandboxes/{sid}", headers={"X-API-KEY": self.key})
        d = self.conn.getresponse()
        d.read()
        if d.status not in (200, 204):
            raise RuntimeError(f"delete {sid}: {d.status}")
        return resp.status, data, float(m.group(1)), client

    def timed_create(self) -> tuple:
        status, data, server, client = self.create()
        if server is None:
            raise RuntimeError(f"create: {status} {data[:300]!r}")
        return server, client

    def close(self) -> None:
        self.conn.close()


def network_vs_none(plain, n: int, warmups: int = 3) -> None:
    """Create with a network vs without: `n` creates on a server whose egress is a simulated
    internet, interleaved with `n` on `plain` (egress off)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        print("  create with a network vs without: skipped (needs root and iproute2)")
        return
    BenchNetns.sweep_stale()
    netns = BenchNetns()
    server = None
    try:
        netns.start()
        server = start_server(extra_args=(
            "--egress", f"netns:{netns.path}",
            "--egress-address", "203.0.113.2/24",
            "--egress-gateway", "203.0.113.1",
        ))
        off, on = Creator(plain.port, plain.admin_key), Creator(server.port, server.admin_key)
        try:
            # The egress server prepares its router and links in the background: wait until a
            # first create succeeds, then a few uncounted ones on both servers.
            last = ["no answer"]

            def first() -> bool:
                try:
                    status, data, server_ms, _ = on.create()
                except OSError as e:
                    last[0] = repr(e)
                    return False
                last[0] = f"{status} {data[:300]!r}"
                return server_ms is not None

            try:
                wait_for(first, 60, "a first create on the egress server", 0.2)
            except Deadline as e:
                raise RuntimeError(f"{e} (last answer: {last[0]})\n{server.log_tail()}") from None
            for _ in range(warmups):
                off.timed_create()
                on.timed_create()
            server_off, client_off, server_on, client_on = [], [], [], []
            for i in range(n):
                # Alternate which server goes first, so neither always follows the other.
                for which in ((off, on) if i % 2 == 0 else (on, off)):
                    s, c = which.timed_create()
                    (server_off if which is off else server_on).append(s)
                    (client_off if which is off else client_on).append(c)
        finally:
            off.close()
            on.close()
        line("create -> ready, server side, no network", server_off)
        line("create -> ready, server side, with network", server_on)
        ratio_line("ratio with / without network, server side", server_on, server_off)
        line("create over HTTP, client side, no network", client_off)
        line("create over HTTP, client side, with network", client_on)
        ratio_line("ratio with / without network, client side", client_on, client_off)
    finally:
        try:
            if server is not None:
                rc, tail = server.close()
                if rc not in (0, None):
                    print(f"husk serve (egress) exited with {rc}; last log lines:\n{tail}", file=sys.stderr)
        finally:
            netns.close()


def first_results(opts: dict, n: int, before_each: Callable[[], None] = lambda: None) -> List[float]:
    """n times: `before_each()` (untimed), then the timed stock-SDK `Sandbox.create()` + first
    `run_code("1+1")`; each sandbox is killed after (untimed). Milliseconds."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    first = []
    for _ in range(n):
        before_each()
        t = time.perf_counter()
        sbx = CodeSandbox.create(**opts)
        ex = sbx.run_code("1+1")
        first.append((time.perf_counter() - t) * 1000)
        if ex.text != "2":
            raise RuntimeError(f"run_code('1+1') gave {ex.text!r} ({ex.error})")
        sbx.kill()
    return first


def code_interpreter(n: int) -> None:
    from e2b_code_interpreter import Sandbox as CodeSandbox

    print("code interpreter (stock e2b-code-interpreter "
          f"{importlib.metadata.version('e2b-code-interpreter')}, ipykernel 7.4.0)")
    server = start_server()
    try:
        t = time.perf_counter()
        for preset in CODE_INTERPRETER_PRESETS:
            build_template(server, PRESETS_DIR / preset)
        print(f"  (presets built in {time.perf_counter() - t:.1f} s with the layer cache)")
        opts = server.opts(api_key=server.admin_key)
        # Warm: the template's image is mounted and hashed once per server.
        CodeSandbox.create(**opts).kill()

        line("SDK Sandbox.create() + first run_code('1+1')", first_results(opts, n))

        sbx = CodeSandbox.create(**opts)
        try:
            for _ in range(3):
                sbx.run_code("1+1")
            husk_ms = [timed(lambda: sbx.run_code("1+1")) for _ in range(max(n, 20))]
            line("SDK run_code('1+1') in a ready sandbox", husk_ms)
            # Memory: the sandbox with its idle Python kernel, beside an idle base sandbox.
            time.sleep(1)  # a metrics sample needs the kernel settled; no event to wait for
            with_kernel = [m for m in sbx.get_metrics() if m.mem_total > 0]
        finally:
            sbx.kill()
        plain = Sandbox.create("base", **opts)
        try:
            plain.commands.run("true")
            without = [m for m in plain.get_metrics() if m.mem_total > 0]
        finally:
            plain.kill()
        # The peer: the same kernel through the reference client, no husk.
        venv_py = subprocess.run([str(REPO_ROOT / "scripts" / "jupyter-test-venv")],
                                 capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
        peer = subprocess.run([venv_py, str(Path(__file__).with_name("bench_kernel_peer.py")), "1+1",
                               str(max(n, 20))], capture_output=True, text=True, timeout=300)
        if peer.returncode != 0:
            raise RuntimeError(f"the jupyter_client peer failed: {peer.stderr[-2000:]}")
        figures = json.loads(peer.stdout.strip().splitlines()[-1])
        line("jupyter_client execute, same kernel (peer)", figures["round_trip_ms"])
        if figures["kernel_ms"]:
            line("  of which the kernel's own time", figures["kernel_ms"])
        overhead = pct(husk_ms, 50) - pct(figures["round_trip_ms"], 50)
        print(f"  run_code minus the direct client (p50)               {overhead:7.2f} ms")
        if figures["kernel_ms"]:
            over_kernel = pct(husk_ms, 50) - pct(figures["kernel_ms"], 50)
            print(f"  run_code minus the kernel's own time (p50)           {over_kernel:7.2f} ms")
        if with_kernel and without:
            k, b = with_kernel[-1], without[-1]
            print(f"  memory, idle sandbox with its Python kernel          {k.mem_used / 2**20:7.1f} MiB")
            print(f"  memory, idle base sandbox (no kernel)                {b.mem_used / 2**20:7.1f} MiB")
            print(f"  the kernel's share                                   {(k.mem_used - b.mem_used) / 2**20:7.1f} MiB")
    finally:
        for preset in reversed(CODE_INTERPRETER_PRESETS):
            remove_template(server, preset)
        server.close()


def code_interpreter_warm(n: int) -> None:
    """`Sandbox.create()` + first `run_code("1+1")` from a warm pool (`husk serve --warm
    code-interpreter=2`), on a server of its own. Each create is timed once the pool has a warm
    sandbox ready (untimed wait: the refill makes one in about the time of a fresh create, and
    waits for no create to be under way); the figure without a pool is the line above."""
    server = start_server(extra_args=("--warm", "code-interpreter=2"))
    try:
        for preset in CODE_INTERPRETER_PRESETS:
            build_template(server, PRESETS_DIR / preset)
        opts = server.opts(api_key=server.admin_key)

        def pool() -> dict:
            body = http_request(server.port, "GET", "/husk/v1/pools",
                                {"X-API-Key": server.admin_key}).json()
            return next(p for p in body["pools"] if p["template"] == "code-interpreter")

        def wait_warm() -> None:
            deadline = time.monotonic() + 120
            while pool()["ready"] < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the warm pool did not fill: {pool()}")
                time.sleep(0.02)

        first = first_results(opts, n, before_each=wait_warm)
        line("SDK Sandbox.create() + first run_code('1+1'), warm pool", first)
        stats = pool()
        print(f"  (pool: {stats['claimed']} claimed, {stats['missed']} missed)")
        if stats["missed"]:
            raise RuntimeError(f"a timed create was not served by the pool: {stats}")
    finally:
        for preset in reversed(CODE_INTERPRETER_PRESETS):
            remove_template(server, preset)
        server.close()


def _abuser_socket(port: int, source: str) -> "socket.socket":
    """A connection to the server from `source` (another loopback address: the abuser is not
    the client whose latency is measured, as on a real network)."""
    import socket

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def abuse(n: int, connections: int) -> None:
    """Another team's SDK create + first command, and a workspace call, quiet and then while one
    tenant (from another address) abuses the server as issue 15 found: stalled workspace
    uploads, big run bodies that stall, workspace downloads it never reads, and connections
    without a key that never finish their request head. Printed side by side, never asserted."""
    import socket

    print(f"one tenant's abuse vs another team's work ({connections} stalled connections)")
    server = start_server()
    held: List[socket.socket] = []
    try:
        victim = server.create_key("victim")
        abuser = server.create_key("abuser")
        opts = server.opts(api_key=victim)

        def victim_work() -> tuple:
            """(create + first command ms, workspace list ms, ok); a failure (a timeout, an
            error answer) counts its time and is not ok."""
            ok = True
            t = time.perf_counter()
            try:
                sbx = Sandbox.create(**opts)
                sbx.commands.run("true")
                sbx.kill()
            except Exception as e:  # noqa: BLE001 -- any failure is the figure
                print(f"  (another team's create failed: {type(e).__name__})")
                ok = False
            create = (time.perf_counter() - t) * 1000
            t = time.perf_counter()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
                conn.request("GET", "/husk/v1/workspaces", headers={"X-API-Key": victim})
                resp = conn.getresponse()
                resp.read()
                conn.close()
                ok = ok and resp.status == 200
            except OSError as e:
                print(f"  (another team's workspace list failed: {type(e).__name__})")
                ok = False
            return create, (time.perf_counter() - t) * 1000, ok

        quiet = [victim_work() for _ in range(n)]
        # The abuse, from 127.0.0.2.
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/husk/v1/workspaces", json.dumps({"name": "w"}),
                     {"X-API-Key": abuser, "Content-Type": "application/json"})
        conn.getresponse().read()
        conn.request("PUT", "/husk/v1/workspaces/w/files/big", b"\0" * (32 << 20), {"X-API-Key": abuser})
        conn.getresponse().read()
        conn.close()
        per_kind = max(1, connections // 4)
        for i in range(per_kind):
            sock = _abuser_socket(server.port, "127.0.0.2")
            sock.sendall(f"PUT /husk/v1/workspaces/w/files/f{i} HTTP/1.1\r\nHost: x\r\n"
                         f"X-API-Key: {abuser}\r\nContent-Length: 1000000\r\n\r\nx".encode())
            held.append(sock)
        for _ in range(min(per_kind, 10)):
            sock = _abuser_socket(server.port, "127.0.0.2")
            sock.sendall(f"POST /husk/v1/runs HTTP/1.1\r\nHost: x\r\nX-API-Key: {abuser}\r\n"
                         f"Content-Type: application/json\r\nContent-Length: {99 << 20}\r\n\r\n".encode())
            sock.setblocking(False)
            try:
                sock.send(b" " * (8 << 20))
            except OSError:
                pass
            held.append(sock)
        for _ in range(min(per_kind, 16)):
            sock = _abuser_socket(server.port, "127.0.0.2")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(f"GET /husk/v1/workspaces/w/files/big HTTP/1.1\r\nHost: x\r\n"
                         f"X-API-Key: {abuser}\r\n\r\n".encode())
            held.append(sock)
        for _ in range(connections - len(held)):
            try:
                sock = _abuser_socket(server.port, "127.0.0.2")
                sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Unfinished: ")
                held.append(sock)
            except OSError:
                break
        time.sleep(0.5)  # let the server take them all in before measuring
        busy = [victim_work() for _ in range(n)]
        for name, i in (("SDK create + first command", 0), ("another team's workspace list", 1)):
            q, b = [w[i] for w in quiet], [w[i] for w in busy]
            print(f"  {name:<38} quiet p50 {pct(q, 50):8.2f} ms  p99 {pct(q, 99):8.2f}   "
                  f"under abuse p50 {pct(b, 50):8.2f} ms  p99 {pct(b, 99):8.2f}   "
                  f"(x{pct(b, 50) / pct(q, 50):.2f} at p50)")
        failed = sum(1 for w in busy if not w[2])
        print(f"  another team's calls that failed under abuse     {failed} of {n}")
        rss = 0
        for field in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
            if field.startswith("VmRSS:"):
                rss = int(field.split()[1]) >> 10
        print(f"  server memory under abuse                   {rss:7d} MiB")
    finally:
        for sock in held:
            sock.close()
        server.close()


def copy_peer(server, n: int, loaded_mb: int) -> None:
    """The floor of saving a sandbox's files: the same bytes copied from tmpfs to the state
    directory's disk, with a sync."""
    src = Path("/dev/shm") / f"husk-bench-{os.getpid()}"
    dst = server.state_dir / f"bench-copy-{os.getpid()}"
    try:
        with open(src, "wb") as f:
            f.write(os.urandom(loaded_mb << 20))
        copies = []
        for _ in range(max(3, n // 4)):
            copies.append(timed(lambda: (shutil.copyfile(src, dst), os.sync())))
            dst.unlink()
        line(f"peer: copy {loaded_mb} MiB tmpfs -> state dir + sync", copies)
    finally:
        src.unlink(missing_ok=True)
        dst.unlink(missing_ok=True)


def load_sandbox(sbx, loaded_mb: int) -> None:
    """`loaded_mb` MiB of files in /home/user and a process holding as much memory."""
    sbx.commands.run(f"head -c {loaded_mb}M /dev/urandom > /home/user/blob")
    hold = (f"python3 -c 'import time; b = bytearray({loaded_mb} << 20); "
            "b[::4096] = b\"x\" * len(b[::4096]); time.sleep(1e6)'")
    sbx.commands.run(hold, background=True)
    # The memory is taken once the process has touched every page.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        rss = sbx.commands.run("ps -o rss= -C python3 || true").stdout.split()
        if rss and int(rss[0]) >= (loaded_mb << 10) * 9 // 10:
            return
        time.sleep(0.1)
    raise RuntimeError("the memory holder did not take its memory")


def snapshots_forks(server, n: int, loaded_mb: int, forks: int = 10) -> None:
    """Snapshots and forks (issue 19), through the SDK: `create_snapshot()` of an idle sandbox
    and of one holding `loaded_mb` MiB of files and as much memory (each snapshot copies the
    sandbox's whole writable layer; the sandbox is frozen meanwhile), a create from the
    snapshot with its first command, and `fork(count=forks)` (one snapshot, then `forks`
    sandboxes, answered once all are ready). The peers: the same number of plain creates one
    after the other (what a client does without fork), and copying the same bytes from tmpfs
    to the state directory's disk with a sync."""
    opts = server.opts()
    print(f"snapshots and forks (n={n}; loaded: {loaded_mb} MiB of files + {loaded_mb} MiB of memory)")
    for loaded in (False, True):
        what = "loaded" if loaded else "idle"
        sbx = Sandbox.create(timeout=3600, **opts)
        try:
            if loaded:
                load_sandbox(sbx, loaded_mb)
            snaps, creates, firsts = [], [], []
            for _ in range(n):
                info = None

                def take():
                    nonlocal info
                    info = sbx.create_snapshot()

                snaps.append(timed(take))
                child = None

                def create():
                    nonlocal child
                    child = Sandbox.create(info.snapshot_id, timeout=60, **opts)

                creates.append(timed(create))
                firsts.append(timed(lambda: child.commands.run("true")))
                child.kill()
                Sandbox.delete_snapshot(info.snapshot_id, **opts)
            line(f"snapshot, {what}", snaps)
            line(f"create from the snapshot, {what}", creates)
            line("  first command in it", firsts)
            walls = []
            for _ in range(max(3, n // 4)):
                made = []

                def fork():
                    made.extend(sbx.fork(count=forks))

                walls.append(timed(fork))
                failed = [m for m in made if isinstance(m, Exception)]
                for m in made:
                    if not isinstance(m, Exception):
                        m.kill()
                if failed:
                    raise RuntimeError(f"forks failed: {failed}")
            line(f"fork of {forks} (all ready), {what}", walls)
        finally:
            sbx.kill()
    walls = []
    for _ in range(max(3, n // 4)):
        made = []

        def creates():
            for _ in range(forks):
                made.append(Sandbox.create(timeout=60, **opts))

        walls.append(timed(creates))
        for m in made:
            m.kill()
    line(f"peer: {forks} plain creates one after the other", walls)
    copy_peer(server, n, loaded_mb)


def pause_resume(server, n: int, loaded_mb: int) -> None:
    """Pause and resume (issue 19), through the SDK: an idle sandbox and one holding
    `loaded_mb` MiB of files (in /home/user) and as much memory (a process that holds it), in
    each mode. Resume is `Sandbox.connect()` and, for a filesystem pause, the first command
    after it (the sandbox boots again). The peers: freezing and thawing the same kind of
    cgroup directly (the floor of a full pause), and copying the same bytes from tmpfs to the
    state directory's disk with a sync (the floor of a filesystem pause)."""
    opts = server.opts()
    print(f"pause and resume (n={n}; loaded: {loaded_mb} MiB of files + {loaded_mb} MiB of memory)")

    def load(sbx) -> None:
        load_sandbox(sbx, loaded_mb)

    for loaded in (False, True):
        what = "loaded" if loaded else "idle"
        # Full: one sandbox paused and resumed n times (each pause freezes it all again).
        sbx = Sandbox.create(timeout=3600, **opts)
        try:
            if loaded:
                load(sbx)
            pauses, resumes, firsts = [], [], []
            for _ in range(n):
                pauses.append(timed(lambda: sbx.pause()))
                resumes.append(timed(lambda: Sandbox.connect(sbx.sandbox_id, **opts)))
                firsts.append(timed(lambda: sbx.commands.run("true")))
            line(f"full pause, {what}", pauses)
            line(f"full resume (connect), {what}", resumes)
            line("  first command after it", firsts)
        finally:
            sbx.kill()
        # Filesystem: a fresh sandbox each time, so that every pause copies all it holds (a
        # second pause of the same sandbox copies only what changed since it resumed).
        pauses, resumes, firsts = [], [], []
        for _ in range(max(3, n // 4)):
            sbx = Sandbox.create(timeout=3600, **opts)
            try:
                if loaded:
                    load(sbx)
                pauses.append(timed(lambda: sbx.pause(mode="filesystem")))
                resumes.append(timed(lambda: Sandbox.connect(sbx.sandbox_id, **opts)))
                firsts.append(timed(lambda: sbx.commands.run("true")))
            finally:
                sbx.kill()
        line(f"filesystem pause, {what}", pauses)
        line(f"filesystem resume (connect), {what}", resumes)
        line("  first command after it", firsts)
    # The peers, on this host.
    cg = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified/cgroup.procs").exists() \
        else Path("/sys/fs/cgroup")
    peer = cg / f"husk-bench-freeze-{os.getpid()}"
    peer.mkdir()
    child = subprocess.Popen(["sleep", "1000"])
    try:
        (peer / "cgroup.procs").write_text(str(child.pid))

        def set_frozen(v: str) -> None:
            (peer / "cgroup.freeze").write_text(v)
            want = f"frozen {v}"
            while want not in (peer / "cgroup.events").read_text():
                time.sleep(0.0001)

        freezes = [timed(lambda: set_frozen("1")) + timed(lambda: set_frozen("0")) for _ in range(n)]
        line("peer: cgroup freeze + thaw, one process", freezes)
    finally:
        child.kill()
        child.wait()
        deadline = time.monotonic() + 10
        while True:
            try:
                peer.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
    copy_peer(server, n, loaded_mb)


def store_backends(iterations: int, seconds: float, concurrencies=(1, 20)) -> None:
    """The same figures on two servers started side by side, one keeping its state in SQLite
    (the state directory's file) and one in PostgreSQL (a private server on loopback, see
    husk_postgres.py), measured in rounds in ABBA order (SQLite first in even rounds,
    PostgreSQL first in odd ones) so that whatever else the machine does hits both alike:
    create + kill over plain HTTP (and the create's store step, from its Server-Timing), an
    authenticated list (each such request checks its key in the store), and create + kill
    cycles per second through the stock SDK at `concurrencies`, `seconds` on each server in
    all (split over the rounds). Printed side by side with the ratio PostgreSQL / SQLite."""
    from husk_postgres import PostgresServer

    rounds = 4 if iterations >= 20 else 2
    creates = max(2, iterations // rounds)
    keyed = max(10, iterations * 5 // rounds)
    slice_s = seconds / rounds
    pg = servers = None
    try:
        pg = PostgresServer()
        servers = []
        # A plain start_server() would follow HUSK_COMPAT_STORE=postgres: this one must not.
        saved = os.environ.pop("HUSK_COMPAT_STORE", None)
        try:
            servers.append(start_server())
        finally:
            if saved is not None:
                os.environ["HUSK_COMPAT_STORE"] = saved
        servers.append(start_server(database_url=pg.create_database()))
        if servers[0].database_url or not servers[1].database_url:
            raise RuntimeError("the SQLite server is on a database or the PostgreSQL one is not")
        version = pg.psql("SHOW server_version").split()[0]
        print(f"store backends: SQLite vs PostgreSQL {version} (loopback, fsync off), two husk serve "
              f"started by this process, measured interleaved in {rounds} rounds in ABBA order")
        # Uncounted: the first create mounts the template's image, the first request fills caches.
        for s in servers:
            raw_create_times(s.port, s.admin_key, 2)
            keyed_request_times(s.port, s.admin_key, 10)
        figures = [{"create": [], "register": [], "kill": [], "keyed": [],
                    **{c: [] for c in concurrencies}} for _ in servers]
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for i in order:
                s, f = servers[i], figures[i]
                times = raw_create_times(s.port, s.admin_key, creates)
                f["create"] += times["client"]
                f["register"] += times["register"]
                f["kill"] += times["kill"]
                f["keyed"] += keyed_request_times(s.port, s.admin_key, keyed)
            for c in concurrencies:
                for i in order:
                    rate, _, _ = sdk_creates(servers[i].opts(), c, slice_s)
                    figures[i][c].append(rate)
    finally:
        try:
            for s in servers or ():
                rc, tail = s.close()
                if rc not in (0, None):
                    print(f"husk serve ({s.database_url or 'SQLite'}) exited with {rc}; last log lines:\n{tail}",
                          file=sys.stderr)
        finally:
            if pg is not None:
                pg.close()
    rows = []
    for key, what, n in (("create", "create over HTTP, client side", creates),
                         ("register", "  of which: registration (store), server side", creates),
                         ("kill", "kill over HTTP, client side", creates),
                         ("keyed", "GET /v2/sandboxes (key check + list)", keyed)):
        for p in (50, 99):
            rows.append((f"{what}, p{p} (n={n * rounds})", *(pct(f[key], p) for f in figures), "ms"))
    for c in concurrencies:
        # Each server's cycles over all its rounds: the mean of equal slices' rates.
        rows.append((f"SDK create+kill cycles/s, concurrency {c} ({seconds:g} s)",
                     *(statistics.mean(f[c]) for f in figures), "/s"))
    width = max(len(r[0]) for r in rows)
    print(f"  {'figure':<{width}} {'SQLite':>11} {'PostgreSQL':>11} {'ratio':>7}")
    for name, a, b, unit in rows:
        print(f"  {name:<{width}} {a:8.2f} {unit:<2} {b:8.2f} {unit:<2} {b / a:7.2f}")
    print("  (ratio: PostgreSQL / SQLite; above 1 is PostgreSQL slower for times, faster for rates)")


def server_restart(n: int, rounds: int = 3) -> None:
    """A restart of the server with `n` running sandboxes (issue 19), each running a
    background process: how long the stop takes, how long the next server takes to listen
    (having taken every sandbox up), and until every sandbox has answered a command again
    (SDK `connect` + `commands.run`, 20 at a time), after a SIGTERM and after a SIGKILL. The
    peers, in the same run: the same server started and stopped with no sandbox, and a stop
    with `--destroy-on-exit` (what a stop did before: every sandbox destroyed)."""
    from concurrent.futures import ThreadPoolExecutor

    print(f"server restart with {n} running sandboxes ({rounds} rounds each)")
    stops, listens, answers, kill_listens, kill_answers = [], [], [], [], []
    empty_listens, empty_stops, destroy_stops, warm_answers = [], [], [], []

    def started(state_dir=None, keep=True):
        t = time.perf_counter()
        s = start_server(state_dir=state_dir, keep=keep)
        return s, (time.perf_counter() - t) * 1000

    def all_answer(server, ids) -> float:
        opts = server.opts()

        def one(i):
            Sandbox.connect(i, **opts).commands.run("true")

        t = time.perf_counter()
        with ThreadPoolExecutor(20) as pool:
            list(pool.map(one, ids))
        return (time.perf_counter() - t) * 1000

    def fill(server) -> list:
        opts = server.opts()

        def one(_):
            sbx = Sandbox.create(timeout=3600, **opts)
            sbx.commands.run("sleep 100000", background=True)
            return sbx.sandbox_id

        with ThreadPoolExecutor(20) as pool:
            return list(pool.map(one, range(n)))

    servers = []
    try:
        for _ in range(rounds):
            # The peers: a restart with no sandbox at all (on a state directory made before,
            # as the restarts below are).
            s, _ = started()
            s.stop()
            s, ms = started(state_dir=s.state_dir)
            empty_listens.append(ms)
            empty_stops.append(timed(s.stop))
            s.close()
            # n sandboxes through a SIGTERM, then through a SIGKILL.
            first, _ = started()
            servers.append(first)
            ids = fill(first)
            stops.append(timed(first.stop))
            second, ms = started(state_dir=first.state_dir)
            servers.append(second)
            listens.append(ms)
            answers.append(ms + all_answer(second, ids))
            # The peer: the same round of commands on a server that did not just restart.
            warm_answers.append(all_answer(second, ids))
            second.proc.kill()
            second.proc.wait(timeout=60)
            third, ms = started(state_dir=first.state_dir, keep=False)
            servers.append(third)
            kill_listens.append(ms)
            kill_answers.append(ms + all_answer(third, ids))
            # The old behaviour's stop, as the peer of a keeping stop: n destroyed.
            destroy_stops.append(timed(third.stop))
            third.close()
            servers.clear()
    finally:
        for s in servers[:-1]:
            try:
                s.stop()
            except Exception:  # noqa: BLE001 -- the last one's close removes the state
                pass
        if servers:
            servers[-1].close()
    line(f"stop (SIGTERM), {n} kept running", stops)
    line("peer: stop, no sandbox", empty_stops)
    line(f"peer: stop with --destroy-on-exit, {n} destroyed", destroy_stops)
    line(f"start until listening, {n} taken up", listens)
    line("peer: start until listening, none to take up", empty_listens)
    line(f"start until all {n} answered a command", answers)
    line(f"peer: all {n} answer a command, no restart", warm_answers)
    line(f"after a SIGKILL: start until listening", kill_listens)
    line(f"after a SIGKILL: start until all {n} answered", kill_answers)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--concurrencies", default="1,20,100",
                    help="the creates/s table's concurrencies (comma-separated)")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--batch-items", type=int, default=20)
    ap.add_argument("--abuse-connections", type=int, default=2000)
    ap.add_argument("--loaded-mb", type=int, default=256)
    ap.add_argument("--restart-sandboxes", type=int, default=100)
    ap.add_argument("--density", default="",
                    help="idle sandboxes the density section holds, per kind: base=N,network=N,kernel=N "
                         "(default: 30, 20 and 1.5 times --iterations)")
    ap.add_argument("--durable-postgres", action="store_true",
                    help="cluster: run PostgreSQL with fsync and synchronous_commit on, as in production "
                         "(default: off, for steadier figures)")
    ap.add_argument("--cluster-tls", action="store_true",
                    help="cluster: the nodes serve HTTPS only and the gateway verifies them (a CA and a "
                         "certificate made for the run); the direct figures are then over HTTPS too")
    ap.add_argument("--only", choices=["abuse", "main", "hops", "pause", "snapshot", "restart",
                                       "interpreter", "creates", "density", "store", "cluster"],
                    help="run the abuse section alone, everything but it (e.g. against an older binary), "
                         "or only the sections whose requests cross the server's helpers (creates, key "
                         "checks, commands, creates with a network, workspace files, runs' outputs); "
                         "store: SQLite beside PostgreSQL; cluster: through a gateway beside a node direct")
    args = ap.parse_args()
    counts = {"base": args.iterations * 30, "network": args.iterations * 20,
              "kernel": max(2, args.iterations * 3 // 2)}
    for part in filter(None, args.density.split(",")):
        kind, _, n = part.partition("=")
        if kind not in counts or not n.isdigit():
            ap.error(f"--density: {part!r} is not base=N, network=N or kernel=N")
        counts[kind] = int(n)
    if args.only == "density":
        density(counts)
        return
    if args.only == "abuse":
        abuse(args.iterations, args.abuse_connections)
        return
    if args.only == "restart":
        server_restart(args.restart_sandboxes)
        return
    # A SIGTERM unwinds like Ctrl-C, so the servers and the namespace are removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.only == "store":
        store_backends(args.iterations, args.seconds)
        return
    if args.only == "cluster":
        from bench_cluster import cluster_gateway

        cluster_gateway(args.iterations, args.seconds, durable=args.durable_postgres,
                        tls=args.cluster_tls)
        return
    server = start_server()
    try:
        key = server.admin_key
        opts = server.opts(api_key=key)
        print(f"husk serve benchmark ({server.bin}), stock e2b {importlib.metadata.version('e2b')}")
        if args.only == "pause":
            pause_resume(server, args.iterations, args.loaded_mb)
            return
        if args.only == "snapshot":
            snapshots_forks(server, args.iterations, args.loaded_mb)
            return
        if args.only == "creates":
            creates_table(opts, [int(c) for c in args.concurrencies.split(",")], args.seconds,
                          server.proc.pid, (server.port, key))
            return
        if args.only == "interpreter":
            code_interpreter(max(5, args.iterations // 4))
            code_interpreter_warm(max(20, args.iterations // 4))
            return
        raw_creates(server.port, key, args.iterations)
        keyed_request_latency(server.port, key, args.iterations * 5)
        sdk_create_first_command(opts, args.iterations)
        creates_table(opts, [int(c) for c in args.concurrencies.split(",")], args.seconds,
                      server.proc.pid, (server.port, key))
        command_latency(opts, server.port, key, args.iterations)
        if args.only == "hops":
            # A create with a network attaches a link through the network helper; workspace
            # files and runs' outputs go through the files helper.
            network_vs_none(server, args.iterations)
            workspace_transfer(server.port, key, args.size_mb, args.iterations)
            run_round_trip(server, max(5, args.iterations // 4))
            return
        transfer(opts, server.port, key, args.size_mb)
        workspace_transfer(server.port, key, args.size_mb, args.iterations)
        run_round_trip(server, max(5, args.iterations // 4))
        batch_walls(server, args.batch_items)
        network_vs_none(server, args.iterations)
        pause_resume(server, max(5, args.iterations // 4), args.loaded_mb)
        snapshots_forks(server, max(5, args.iterations // 4), args.loaded_mb)
        code_interpreter(max(5, args.iterations // 4))
        code_interpreter_warm(max(20, args.iterations // 4))
    finally:
        server.close()
    if args.only is None:
        store_backends(args.iterations, args.seconds)
        server_restart(args.restart_sandboxes, rounds=1)
        density(counts)
    if args.only != "main":
        abuse(args.iterations, args.abuse_connections)


if __name__ == "__main__":
    main()
