"""The gateway's cost (`bench.sh --only cluster`): a cluster on this machine (PostgreSQL on
loopback, three `husk node`s, one `husk gateway`) measured two ways in the same run, in
rounds in ABBA order: through the gateway (as the SDKs use it), and straight to the nodes
with the headers the gateway would add (the cluster token and the caller), which is the
nodes' own cost. The difference is what the gateway adds per request: its key check in the
database, its quota claim (creates), and one more HTTP hop.

Creates sent direct go to the three nodes in turn, as the gateway spreads them, so that the
difference does not depend on whether creates one after another on one node (its processes
awake, its caches warm) are cheaper than creates spread over nodes sharing two CPUs.
Creates to one node only are measured too, for reference.

With `tls` (`bench.sh --only cluster --cluster-tls`), the nodes serve HTTPS only, with a
certificate of a CA made for the run, and the gateway verifies them; the clients still reach
the gateway over plain HTTP (as behind a Service) and the nodes direct over HTTPS. Compare a
run with and a run without it for what TLS on the gateway's hop costs."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import ssl
import statistics
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from bench_creates import sdk_creates, timed_workers
from husk_cluster import Cluster, ClusterTls, make_ca, make_cert
from husk_compat import envelope, parse_envelopes
from husk_postgres import PostgresServer


def pct(values: List[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


# Ports served over HTTPS (the nodes, with --cluster-tls), and how they are verified.
TLS_PORTS: Dict[int, ssl.SSLContext] = {}


def keep_alive(port: int) -> http.client.HTTPConnection:
    if port in TLS_PORTS:
        return http.client.HTTPSConnection("127.0.0.1", port, timeout=60, context=TLS_PORTS[port])
    return http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def create_kill_times(port, headers: Dict[str, str], n: int) -> Dict[str, List[float]]:
    """Create+kill pairs on `port`, or on each of a list of ports in turn."""
    conns = [keep_alive(p) for p in (port if isinstance(port, list) else [port])]
    out: Dict[str, List[float]] = {"create": [], "kill": []}
    body = json.dumps({"templateID": "base", "timeout": 60}).encode()
    for i in range(n):
        conn = conns[i % len(conns)]
        t = time.perf_counter()
        conn.request("POST", "/v2/sandboxes", body, {**headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        data = resp.read()
        out["create"].append((time.perf_counter() - t) * 1000)
        if resp.status != 201:
            raise RuntimeError(f"create: {resp.status} {data!r}")
        sid = json.loads(data)["sandboxID"]
        t = time.perf_counter()
        conn.request("DELETE", f"/sandboxes/{sid}", headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        out["kill"].append((time.perf_counter() - t) * 1000)
        if resp.status not in (200, 204):
            raise RuntimeError(f"kill: {resp.status} {data!r}")
    for conn in conns:
        conn.close()
    return out


def request_times(port: int, method: str, path: str, headers: Dict[str, str], n: int,
                  ok=(200, 204)) -> List[float]:
    conn = keep_alive(port)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request(method, path, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        times.append((time.perf_counter() - t) * 1000)
        if resp.status not in ok:
            raise RuntimeError(f"{method} {path}: {resp.status} {data!r}")
    conn.close()
    return times


def commands_per_second(port: int, headers: Dict[str, str], workers: int, seconds: float) -> float:
    """Commands (a Connect `process.Process/Start` of /bin/true, read to its end, as the SDKs
    send it) per second from `workers` threads, each on a keep-alive connection of its own."""
    counts = [0] * workers
    errors: List[str] = []
    stop_at = time.monotonic() + seconds
    start = envelope(json.dumps({"process": {"cmd": "/bin/true"}, "stdin": False}).encode())
    headers = {**headers, "Content-Type": "application/connect+json", "Connect-Protocol-Version": "1"}

    def work(i: int) -> None:
        try:
            conn = keep_alive(port)
            while time.monotonic() < stop_at:
                conn.request("POST", "/process.Process/Start", start, headers)
                resp = conn.getresponse()
                frames = parse_envelopes(resp.read())
                if resp.status != 200 or not any(
                        "end" in json.loads(f[1] or b"{}").get("event", {}) for f in frames):
                    raise RuntimeError(f"Start failed: {resp.status} {frames!r}")
                counts[i] += 1
            conn.close()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    elapsed = timed_workers(workers, work)
    if errors:
        raise RuntimeError(errors[0])
    return sum(counts) / elapsed


def cluster_gateway(iterations: int, seconds: float, concurrencies=(1, 20),
                    durable: bool = False, tls: bool = False) -> None:
    rounds = 4 if iterations >= 20 else 2
    n = max(5, iterations // rounds)
    slice_s = seconds / rounds
    pg = PostgresServer(durable=durable)
    c = None
    held = []
    certs = Path(tempfile.mkdtemp(prefix="husk-bench-tls-"))
    try:
        cluster_tls = None
        if tls:
            ca = make_ca(certs)
            # The cluster's name for the gateway, the address for the clients sent direct.
            cert, key = make_cert(certs, ca, "node", "DNS:husk-node,IP:127.0.0.1")
            cluster_tls = ClusterTls(ca=ca[0], cert=cert, key=key)
            os.environ["SSL_CERT_FILE"] = str(ca[0])  # the SDK, sent to the nodes direct
        c = Cluster(pg, nodes=3, gateways=1, tls=cluster_tls)
        if tls:
            for each in c.nodes:
                TLS_PORTS[each.port] = ssl.create_default_context(cafile=str(cluster_tls.ca))
        node, gw = c.nodes[0], c.gateways[0]
        token = c.token_file.read_text().strip()
        direct_headers = {"X-Husk-Cluster-Token": token, "X-Husk-Team": "default", "X-Husk-Admin": "1"}
        targets = {
            "gateway": (gw.port, {"X-API-Key": c.admin_key},
                        dict(api_url=gw.url, sandbox_url=gw.url, api_key=c.admin_key)),
            "node": (node.port, direct_headers,
                     dict(api_url=node.url, sandbox_url=node.url, api_key=c.admin_key,
                          headers=direct_headers)),
        }
        version = pg.psql("SHOW server_version").split()[0]
        spread = [n.port for n in c.nodes]
        print(f"cluster: one gateway in front of 3 nodes, beside the nodes direct (their cost alone), "
              f"PostgreSQL {version} on loopback ({'durable: fsync and synchronous_commit on' if durable else 'fsync off'}), "
              f"{'gateway to nodes over TLS (nodes direct over HTTPS too), ' if tls else ''}"
              f"{rounds} rounds in ABBA order")
        # A sandbox on node 1 for the per-request figures and the commands.
        conn = keep_alive(node.port)
        conn.request("POST", "/v2/sandboxes", json.dumps({"templateID": "base", "timeout": 600}).encode(),
                     {**direct_headers, "Content-Type": "application/json"})
        resp = conn.getresponse()
        made = json.loads(resp.read())
        conn.close()
        if resp.status != 201:
            raise RuntimeError(f"create: {resp.status} {made!r}")
        sid = made["sandboxID"]
        held.append(sid)
        sandbox_headers = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983",
                           "X-Access-Token": made["envdAccessToken"]}
        in_sandbox = {"gateway": sandbox_headers,
                      "node": {**sandbox_headers, "X-Husk-Cluster-Token": token}}
        figures = {name: {"create": [], "kill": [], "info": [], "envd": [], **{k: [] for k in concurrencies},
                          "cmd1": [], "cmd8": [], "one": []} for name in targets}
        for name, (port, headers, opts) in targets.items():  # warm-up, uncounted
            create_kill_times(port, headers, 2)
            request_times(port, "GET", f"/sandboxes/{sid}", headers, 5)
        for r in range(rounds):
            order = ("gateway", "node") if r % 2 == 0 else ("node", "gateway")
            for name in order:
                port, headers, opts = targets[name]
                f = figures[name]
                t = create_kill_times(port if name == "gateway" else spread, headers, n)
                f["create"] += t["create"]
                f["kill"] += t["kill"]
                if name == "node":
                    f["one"] += create_kill_times(port, headers, n)["create"]
                f["info"] += request_times(port, "GET", f"/sandboxes/{sid}", headers, n * 4)
                f["envd"] += request_times(port, "GET", "/health", in_sandbox[name], n * 4)
            for k in concurrencies:
                for name in order:
                    rate, _, _ = sdk_creates(targets[name][2], k, slice_s)
                    figures[name][k].append(rate)
            for workers, key in ((1, "cmd1"), (8, "cmd8")):
                for name in order:
                    figures[name][key].append(commands_per_second(
                        targets[name][0], in_sandbox[name], workers, slice_s / 2))
    finally:
        for sid in held:
            try:
                request_times(c.nodes[0].port, "DELETE", f"/sandboxes/{sid}", direct_headers, 1)
            except Exception:  # noqa: BLE001
                pass
        if c is not None:
            c.close()
        pg.close()
        shutil.rmtree(certs, ignore_errors=True)
    g, d = figures["gateway"], figures["node"]
    rows = []
    for key, what in (("create", "create over HTTP (direct: to the 3 nodes in turn)"),
                      ("kill", "kill over HTTP"),
                      ("info", "GET /sandboxes/ID (key check + routing)"),
                      ("envd", "in-sandbox GET /health (routing only)")):
        for p in (50, 99):
            rows.append((f"{what}, p{p} (n={len(g[key])})", pct(g[key], p), pct(d[key], p), "ms"))
    rows.append((f"create over HTTP, gateway vs direct to one node only, p50 (n={len(d['one'])})",
                 pct(g["create"], 50), pct(d["one"], 50), "ms"))
    for k in concurrencies:
        rows.append((f"SDK create+kill cycles/s, concurrency {k}", statistics.mean(g[k]), statistics.mean(d[k]), "/s"))
    rows.append(("commands (Connect Start of /bin/true)/s, 1 client", statistics.mean(g["cmd1"]), statistics.mean(d["cmd1"]), "/s"))
    rows.append(("commands (Connect Start of /bin/true)/s, 8 clients", statistics.mean(g["cmd8"]), statistics.mean(d["cmd8"]), "/s"))
    width = max(len(r[0]) for r in rows)
    print(f"  {'figure':<{width}} {'gateway':>11} {'nodes direct':>13} {'added':>9}")
    for name, a, b, unit in rows:
        added = f"{a - b:+8.2f}" if unit == "ms" else f"{a / b:8.2f}x"
        print(f"  {name:<{width}} {a:8.2f} {unit:<2} {b:10.2f} {unit:<2} {added}")
    print("  (added: gateway minus direct for times; gateway / direct for rates; everything but the\n"
          "   creates direct goes to one node: the per-request figures to a sandbox there)")
