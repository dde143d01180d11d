"""Creates per second through the stock SDK at several concurrencies, beside bubblewrap.

Each of `workers` clients runs `AsyncSandbox.create()` then `kill()` in a loop for a fixed
time; the clients are spread over a few processes (one event loop each), so that the client's
own CPU is not one interpreter's lock. Printed per concurrency: completed create+kill cycles
per second and the create's p50/p99 as the client sees it.

The peer, in the same run and at the same concurrency: `bwrap --unshare-all ... true`
launched and waited for in a loop (a sandbox that starts, runs nothing and ends: no server,
no agent, no cgroup), the floor for starting namespaced processes on this machine.

Figures are printed, never asserted. Used by bench_server.py (`--only creates`).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import queue
import shutil
import subprocess
import threading
import time
from typing import List, Tuple

# Client processes at most: enough that the SDK's own CPU is spread over the machine's cores.
MAX_PROCS = max(2, os.cpu_count() or 2)


def _pct(values: List[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


async def _client_loop(opts: dict, tasks: int, start_at: float, stop_at: float) -> Tuple[int, List[float], List[str]]:
    from e2b import AsyncSandbox

    done = 0
    latencies: List[float] = []
    errors: List[str] = []

    async def one() -> None:
        nonlocal done
        while time.time() < start_at:
            await asyncio.sleep(min(0.01, max(0.0, start_at - time.time())))
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
    return done, latencies, errors


def _client_process(opts: dict, tasks: int, start_at: float, stop_at: float, out) -> None:
    out.put(asyncio.run(_client_loop(opts, tasks, start_at, stop_at)))


def _spread(workers: int) -> List[int]:
    procs = min(workers, MAX_PROCS)
    return [workers // procs + (1 if i < workers % procs else 0) for i in range(procs)]


def sdk_creates(opts: dict, workers: int, seconds: float) -> Tuple[float, List[float]]:
    """Create+kill cycles per second and the creates' latencies (ms) at `workers` clients."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    # The clients import the SDK before the clock starts (a spawned interpreter takes ~1 s).
    start_at = time.time() + 3.0
    stop_at = start_at + seconds
    procs = [ctx.Process(target=_client_process, args=(opts, n, start_at, stop_at, out)) for n in _spread(workers)]
    for p in procs:
        p.start()
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
    errors = [e for _, _, errs in results for e in errs]
    if errors:
        raise RuntimeError(f"SDK creates at concurrency {workers}: {errors[0]}")
    total = sum(d for d, _, _ in results)
    elapsed = max(time.time(), stop_at) - start_at
    return total / elapsed, [x for _, lat, _ in results for x in lat]


def bwrap_launches(workers: int, seconds: float) -> Tuple[float, List[float]]:
    """bubblewrap sandboxes of `true` started and waited for per second, at `workers` threads."""
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

    t = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    elapsed = time.perf_counter() - t
    if errors:
        raise RuntimeError(errors[0])
    return sum(counts) / elapsed, [x for lat in latencies for x in lat]


def creates_table(opts: dict, concurrencies: List[int], seconds: float) -> None:
    """One line per concurrency: husk through the SDK, then bubblewrap at the same one."""
    have_bwrap = shutil.which("bwrap") is not None
    print(f"  creates/s through the stock SDK (AsyncSandbox.create + kill, {seconds:.0f} s each), "
          f"client processes: up to {MAX_PROCS}")
    for c in concurrencies:
        rate, lat = sdk_creates(opts, c, seconds)
        print(f"    concurrency {c:>3}: husk {rate:7.1f}/s  create p50 {_pct(lat, 50):7.2f} ms  "
              f"p99 {_pct(lat, 99):7.2f} ms  (n={len(lat)})")
        if have_bwrap:
            brate, blat = bwrap_launches(c, seconds)
            print(f"    concurrency {c:>3}: bwrap true {brate:7.1f}/s  p50 {_pct(blat, 50):7.2f} ms  "
                  f"p99 {_pct(blat, 99):7.2f} ms  (n={len(blat)})  husk/bwrap rate {rate / brate:.2f}")
        else:
            print("    bwrap not installed: no peer figure")
