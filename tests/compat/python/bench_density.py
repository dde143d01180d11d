"""Idle density through `husk serve`: how many idle sandboxes the host holds and what each
costs, created one after another over HTTP as a client would, for three kinds of sandbox:
`base` without a network, `base` with a network (each with its link to the router, on a server
whose egress is a namespace of the benchmark's own, which no packet ever crosses), and the
`code-interpreter` template with its Python kernel running.

For each kind: the creates per second in each tenth of the run (a create that slows as
sandboxes accumulate shows), the host memory each sandbox costs (`MemAvailable` before and
after), what stopped the run if it stopped short (the server's answer: a quota, the host's
memory reserve, a limit of the kernel's), then the destroys per second likewise. Figures are
printed, not asserted."""

from __future__ import annotations

import http.client
import json
import time
from typing import List, Optional, Tuple

from husk_compat import CODE_INTERPRETER_PRESETS, PRESETS_DIR, build_template, remove_template, start_server


def mem_available() -> int:
    """The host's MemAvailable, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def by_tenth(stamps: List[float], start: float) -> List[float]:
    """Operations per second in each tenth of the operations (`stamps`: when each ended)."""
    n = len(stamps)
    if n < 10:
        return [n / max(stamps[-1] - start, 1e-9)] if stamps else []
    rates = []
    prev = start
    for k in range(1, 11):
        i = k * n // 10 - 1
        lo = (k - 1) * n // 10
        rates.append((i + 1 - lo) / max(stamps[i] - prev, 1e-9))
        prev = stamps[i]
    return rates


def _fmt(rates: List[float]) -> str:
    return " ".join(f"{r:.0f}" for r in rates)


class Client:
    """Creates and destroys over one keep-alive connection."""

    def __init__(self, port: int, key: str, template: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        self.key = key
        self.body = json.dumps({"templateID": template, "timeout": 3600}).encode()

    def create(self) -> Tuple[Optional[str], str]:
        """(sandbox id, "") or (None, the server's answer)."""
        self.conn.request("POST", "/sandboxes", self.body,
                          {"X-API-KEY": self.key, "Content-Type": "application/json"})
        resp = self.conn.getresponse()
        data = resp.read()
        if resp.status != 201:
            return None, f"{resp.status} {data[:300].decode(errors='replace')}"
        return json.loads(data)["sandboxID"], ""

    def destroy(self, sid: str) -> None:
        self.conn.request("DELETE", f"/sandboxes/{sid}", headers={"X-API-KEY": self.key})
        resp = self.conn.getresponse()
        resp.read()
        if resp.status not in (200, 204):
            raise RuntimeError(f"delete {sid}: {resp.status}")

    def close(self) -> None:
        self.conn.close()


def fill(server, template: str, count: int, label: str) -> None:
    """Creates up to `count` idle sandboxes of `template` on `server`, prints the figures,
    destroys them."""
    client = Client(server.port, server.admin_key, template)
    ids: List[str] = []
    try:
        # Uncounted: the first create of a template mounts and hashes its image.
        sid, why = client.create()
        if sid is None:
            raise RuntimeError(f"{label}: the first create failed: {why}")
        client.destroy(sid)
        before = mem_available()
        start = time.perf_counter()
        stamps: List[float] = []
        stopped = ""
        while len(ids) < count:
            sid, why = client.create()
            if sid is None:
                stopped = why
                break
            ids.append(sid)
            stamps.append(time.perf_counter())
        after = mem_available()
        n = len(ids)
        took = (stamps[-1] - start) if stamps else 0.0
        print(f"  {label}: {n} idle sandboxes in {took:.1f} s ({n / max(took, 1e-9):.0f}/s)")
        print(f"    creates/s by tenth: {_fmt(by_tenth(stamps, start))}")
        if n:
            print(f"    host memory each: {(before - after) / n / 2**20:.2f} MiB "
                  f"({(before - after) / 2**30:.2f} GiB for {n}; {after / 2**30:.1f} GiB left available)")
        if stopped:
            print(f"    stopped short of {count} by the server's answer: {stopped}")
        start = time.perf_counter()
        stamps = []
        while ids:
            client.destroy(ids.pop())
            stamps.append(time.perf_counter())
        took = (stamps[-1] - start) if stamps else 0.0
        print(f"    destroys/s by tenth: {_fmt(by_tenth(stamps, start))} "
              f"({len(stamps) / max(took, 1e-9):.0f}/s over {took:.1f} s)")
    finally:
        for sid in ids:
            try:
                client.destroy(sid)
            except Exception:
                pass
        client.close()


def density(counts: dict) -> None:
    """`counts`: sandboxes to hold per kind (`base`, `network`, `kernel`; 0 skips a kind)."""
    from bench_server import BenchNetns

    print("idle density through husk serve (creates one at a time over HTTP)")
    quota = ("--max-sandboxes", str(max(counts.values()) + 10))
    if counts.get("base"):
        server = start_server(extra_args=quota)
        try:
            fill(server, "base", counts["base"], "base, no network")
        finally:
            server.close()
    if counts.get("network"):
        BenchNetns.sweep_stale()
        netns = BenchNetns()
        server = None
        try:
            netns.start()
            server = start_server(extra_args=quota + (
                "--egress", f"netns:{netns.path}",
                "--egress-address", "203.0.113.2/24",
                "--egress-gateway", "203.0.113.1",
            ))
            fill(server, "base", counts["network"], "base, with a network")
        finally:
            try:
                if server is not None:
                    server.close()
            finally:
                netns.close()
    if counts.get("kernel"):
        server = start_server(extra_args=quota)
        built = []
        try:
            for preset in CODE_INTERPRETER_PRESETS:
                build_template(server, PRESETS_DIR / preset)
                built.append(preset)
            fill(server, "code-interpreter", counts["kernel"], "code-interpreter, its kernel running")
        finally:
            for preset in reversed(built):
                remove_template(server, preset)
            server.close()
