"""Creates per second over plain HTTP and through the stock SDK at several concurrencies,
beside bubblewrap.

Over plain HTTP, each of `workers` threads runs `POST /v2/sandboxes` then `DELETE` on a
connection of its own: the client costs little, so the rate is husk's. Through the SDK, each of
`workers` clients runs `AsyncSandbox.create()` then `kill()` in a loop for a fixed
time; the clients are spread over a few processes (one event loop each), so that the client's
own CPU is not one interpreter's lock. Printed per concurrency: completed create+kill cycles
per second and the create's p50/p99 as the client sees it; given the server's pid, also where
each cycle's CPU went (cpu_share.py), the SDK clients' own included: on a small machine the
clients share the CPUs with the server, and their share bounds the rate.

The peer, in the same run and at the same concurrency: `bwrap --unshare-all ... true`
launched and waited for in a loop (a sandbox that starts, runs nothing and ends: no server,
no agent, no cgroup), the floor for starting namespaced processes on this machine.

Figures are printed, never asserted. Used by bench_server.py (`--only creates`).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import multiprocessing
import os
import queue
import shutil
import subprocess
import threading
import time
from typing import Callable, List, Optional, Tuple

from cpu_share import CpuShare, machine_busy

# Client processes at most: enough that the SDK's own CPU is spread over the machine's cores.
MAX_PROCS = max(2, os.cpu_count() or 2)


def _pct(values: List[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def timed_workers(workers: int, work: Callable[[int], None]) -> float:
    """Runs `work(i)` for i in 0..workers, each on a thread of its own; seconds until all end."""
    t = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t


async def _client_loop(opts: dict, tasks: int, start_at: float,
                       stop_at: float) -> Tuple[int, List[float], List[str], float]:
    """(cycles done, create latencies in ms, errors, this process's CPU seconds from the
    start to the last cycle's end)."""
    from e2b import AsyncSandbox

    done = 0
    cpu_at_start: List[float] = []
    latencies: List[float] = []
    errors: List[str] = []

    async def one() -> None:
        nonlocal done
        while time.time() < start_at:
            await asyncio.sleep(min(0.01, max(0.0, start_at - time.time())))
        if not cpu_at_start:
            cpu_at_start.append(sum(os.times()[:2]))
        while time.time() < stop_at and not errors:
            t = time.perf_counter()
            try:
                sbx = await AsyncSandbox.create(**opts)
            except Exception as e:  # noqa: BLE001 - reported by the parent
                errors.append(f"create: {type(e).__name__}: {e}")
                return
            latencies.append((time.perf_counter() - t) * 1000)
            try:
                await sbx.kill()
            except Exception as e:  # noqa: BLE001
                errors.append(f"kill: {type(e).__name__}: {e}")
                return
            done += 1

    await asyncio.gather(*(one() for _ in range(tasks)))
    return done, latencies, errors, sum(os.times()[:2]) - cpu_at_start[0]


def _client_process(opts: dict, tasks: int, start_at: float, stop_at: float, out) -> None:
    out.put(asyncio.run(_client_loop(opts, tasks, start_at, stop_at)))


def _spread(workers: int) -> List[int]:
    procs = min(workers, MAX_PROCS)
    return [workers // procs + (1 if i < workers % procs else 0) for i in range(procs)]


def plain_creates(port: int, key: str, workers: int, seconds: float,
                  server_pid: Optional[int] = None) -> Tuple[float, int, Optional[str]]:
    """Create+kill cycles per second over plain HTTP, each worker a connection of its own; the
    cycles done; given `server_pid`, where each cycle's CPU went (`CpuShare.line`)."""
    count = [0] * workers
    errors: List[str] = []
    stop_at = time.monotonic() + seconds

    def work(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = json.dumps({"templateID": "base", "timeout": 60}).encode()
        while time.monotonic() < stop_at and not errors:
            conn.request("POST", "/v2/sandboxes", body, {"X-API-KEY": key})
            resp = conn.getresponse()
            data = resp.read()
            if resp.status != 201:
                errors.append(f"{resp.status} {data[:200]!r}")
                return
            count[i] += 1
            sid = json.loads(data)["sandboxID"]
            conn.request("DELETE", f"/sandboxes/{sid}", headers={"X-API-KEY": key})
            conn.getresponse().read()
        conn.close()

    share = CpuShare(server_pid) if server_pid else None
    elapsed = timed_workers(workers, work)
    if errors:
        raise RuntimeError(f"creates/s over plain HTTP at concurrency {workers}: {errors[0]}")
    total = sum(count)
    return total / elapsed, total, share.line(total) if share and total else None


def sdk_creates(opts: dict, workers: int, seconds: float,
                server_pid: Optional[int] = None) -> Tuple[float, List[float], Optional[str]]:
    """Create+kill cycles per second, the creates' latencies (ms) at `workers` clients, and,
    given `server_pid`, where each cycle's CPU went (`CpuShare.line`, the clients' included)."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    # The clients import the SDK before the clock starts (a spawned interpreter takes ~1 s).
    start_at = time.time() + 3.0
    stop_at = start_at + seconds
    procs = [ctx.Process(target=_client_process, args=(opts, n, start_at, stop_at, out)) for n in _spread(workers)]
    for p in procs:
        p.start()
    share = None
    if server_pid:
        # The clients' imports are done by now; the snapshot starts with their first cycle.
        time.sleep(max(0.0, start_at - time.time()))
        share = CpuShare(server_pid)
    results = []
    give_up = time.monotonic() + seconds + 120
    try:
        while len(results) < len(procs):
            try:
                results.append(out.get(timeout=0.5))
            except queue.Empty:
                # A client that died says nothing: stop waiting for it.
                dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
                if dead or time.monotonic() > give_up:
                    raise RuntimeError(f"SDK creates at concurrency {workers}: a client process ended "
                                       f"with {dead or 'no answer'}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = [e for _, _, errs, _ in results for e in errs]
    if errors:
        raise RuntimeError(f"SDK creates at concurrency {workers}: {errors[0]}")
    total = sum(d for d, _, _, _ in results)
    elapsed = max(time.time(), stop_at) - start_at
    split = share.line(total, client_cpu=sum(c for _, _, _, c in results)) if share and total else None
    return total / elapsed, [x for _, lat, _, _ in results for x in lat], split


def bwrap_launches(workers: int, seconds: float) -> Tuple[float, List[float], float]:
    """bubblewrap sandboxes of `true` started and waited for per second, at `workers` threads,
    and the machine's CPU per launch (ms; the launching threads' included)."""
    cmd = [
        "bwrap", "--unshare-all", "--die-with-parent",
        "--ro-bind", "/usr", "/usr",
        "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "true",
    ]
    counts = [0] * workers
    latencies: List[List[float]] = [[] for _ in range(workers)]
    errors: List[str] = []
    stop_at = time.monotonic() + seconds

    def work(i: int) -> None:
        while time.monotonic() < stop_at and not errors:
            t = time.perf_counter()
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True)
            if r.returncode != 0:
                errors.append(f"bwrap exited {r.returncode}: {r.stderr[:200]!r}")
                return
            latencies[i].append((time.perf_counter() - t) * 1000)
            counts[i] += 1

    busy = machine_busy()
    elapsed = timed_workers(workers, work)
    if errors:
        raise RuntimeError(errors[0])
    n = sum(counts)
    return n / elapsed, [x for lat in latencies for x in lat], (machine_busy() - busy) * 1e3 / max(1, n)


def creates_table(opts: dict, concurrencies: List[int], seconds: float,
                  server_pid: Optional[int] = None, plain: Optional[Tuple[int, str]] = None) -> None:
    """Per concurrency: husk over plain HTTP (given `plain`, the server's port and a key), husk
    through the SDK, then bubblewrap; with the server's pid, the CPU each cycle took by
    process, and the machine's CPU per bubblewrap launch."""
    have_bwrap = shutil.which("bwrap") is not None
    print(f"  creates/s (create+kill cycles, {seconds:.0f} s each): over plain HTTP, through the stock "
          f"SDK (AsyncSandbox.create + kill; client processes: up to {MAX_PROCS}), beside bubblewrap")
    for c in concurrencies:
        prate = None
        if plain:
            prate, n, split = plain_creates(plain[0], plain[1], c, seconds, server_pid)
            print(f"    concurrency {c:>3}: husk, plain HTTP  {prate:7.1f}/s  (n={n})")
            if split:
                print(f"      per cycle, {split}")
        rate, lat, split = sdk_creates(opts, c, seconds, server_pid)
        print(f"    concurrency {c:>3}: husk, SDK         {rate:7.1f}/s  create p50 {_pct(lat, 50):7.2f} ms  "
              f"p99 {_pct(lat, 99):7.2f} ms  (n={len(lat)})")
        if split:
            print(f"      per cycle, {split}")
        if have_bwrap:
            brate, blat, bcpu = bwrap_launches(c, seconds)
            ratios = (f"plain HTTP {prate / brate:.2f}, " if prate is not None else "") + f"SDK {rate / brate:.2f}"
            print(f"    concurrency {c:>3}: bwrap true        {brate:7.1f}/s  p50 {_pct(blat, 50):7.2f} ms  "
                  f"p99 {_pct(blat, 99):7.2f} ms  (n={len(blat)})")
            print(f"      per launch, {bcpu:.2f} ms of the machine's CPU;  husk/bwrap rate: {ratios}")
        else:
            print("    bwrap not installed: no peer figure")
