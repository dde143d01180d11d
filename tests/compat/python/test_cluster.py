"""A husk cluster on this machine, through the stock SDK (e2b==2.63.0): PostgreSQL from
Debian (private, a free loopback port), three `husk node`s with state directories of their
own, two `husk gateway`s (husk_cluster). Creates spread over the nodes; commands, files, PTYs,
watches and ingress work through either gateway for a sandbox on any node; a team's quota
holds across nodes; a secret set once is usable on every node; the node API serves gateways
only and a client cannot pass for a gateway. Faults, each on a cluster of its own: a node
killed (SIGKILL) has its sandboxes reported lost within seconds, their quota freed, and later
creates land elsewhere; a gateway killed is invisible to the other's clients; PostgreSQL
restarted mid-test loses nothing. TLS, on a cluster of its own: nodes on HTTPS verified by the
gateways and by each other, certificates renewed live."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import threading
import time
from collections import Counter
from pathlib import Path

import subprocess

import pytest
from e2b import PtySize, Sandbox, SandboxQuery
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType

from husk_cluster import Cluster, ClusterTls, make_ca, make_cert
from husk_compat import (fetch_url, http_request, metric, metrics_port, multipart,
                         sandbox_headers, scrape_metrics, sdk_in_process, unique, wait_for)
from husk_postgres import PostgresServer

SPEC = Path(__file__).resolve().parent.parent / "templates" / "debian" / "husk.toml"
# A ready node silent this long is declared lost (husk_server::gateway::LOST_AFTER).
LOST_AFTER_S = 10
LAYER_CACHE = "/var/tmp/husk-test-layers"


@pytest.fixture(scope="module")
def pg():
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def cluster(pg):
    # Each node with its operator's metrics (test_each_node_counts_its_own_in_its_metrics).
    c = Cluster(pg, nodes=3, gateways=2, node_args=("--metrics-listen", "127.0.0.1:0"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def made(cluster):
    """Sandboxes a test made (by id, with the options to kill them): killed at the end."""
    ids: dict = {}
    yield ids
    for sid, opts in ids.items():
        try:
            Sandbox.kill(sid, **opts)
        except Exception:  # noqa: BLE001 - a killed node's sandboxes cannot be killed
            pass


def create(cluster, made, gateway=0, api_key=None, **kwargs) -> Sandbox:
    opts = cluster.opts(gateway, api_key)
    sbx = Sandbox.create(timeout=120, **opts, **kwargs)
    made[sbx.sandbox_id] = opts
    return sbx


def one_per_node(cluster, made, limit=30, **kwargs) -> dict:
    """Creates sandboxes until every node holds one: {code: sandbox}."""
    codes = {cluster.code_of(i) for i in range(len(cluster.nodes))}
    found: dict = {}
    for i in range(limit):
        sbx = create(cluster, made, gateway=i % len(cluster.gateways), **kwargs)
        found.setdefault(sbx.sandbox_id[:4], sbx)
        if set(found) >= codes:
            return found
    raise AssertionError(f"{limit} creates did not reach every node: {sorted(found)} of {sorted(codes)}")


def only_node(cluster, index) -> None:
    """Drains every node but `index` (`husk cluster drain`; `None`: none drained), and waits
    for the gateways to read it (they read the nodes every half second)."""
    for i, name in enumerate(cluster.node_names):
        state = "ready" if index is None or i == index else "drain"
        cluster.husk("cluster", state, name)
    time.sleep(1.2)


def test_the_operator_lists_drains_and_readies_nodes(cluster):
    listed = [json.loads(line) for line in cluster.husk("cluster", "nodes", "--json").stdout.splitlines()]
    assert [n["name"] for n in listed] == cluster.node_names
    assert all(n["state"] == "ready" and len(n["code"]) == 4 for n in listed)
    table = cluster.husk("cluster", "nodes").stdout.decode()
    assert table.splitlines()[0].split()[:3] == ["NAME", "CODE", "STATE"]
    cluster.husk("cluster", "drain", "node-2")
    assert next(n for n in cluster.nodes_listed() if n["name"] == "node-2")["state"] == "draining"
    cluster.husk("cluster", "ready", "node-2")
    assert next(n for n in cluster.nodes_listed() if n["name"] == "node-2")["state"] == "ready"
    out = cluster.husk("cluster", "drain", "no-such-node", check=False)
    assert out.returncode == 1 and b"no node" in out.stderr
    out = cluster.husk("cluster", "drain", "Bad Name", check=False)
    assert out.returncode == 1 and b"invalid node name" in out.stderr


def test_creates_spread_over_the_nodes(cluster, made):
    codes = {cluster.code_of(i) for i in range(3)}
    assert len(codes) == 3
    per: dict = {}
    for i in range(12):
        sbx = create(cluster, made, gateway=i % 2)
        per[sbx.sandbox_id[:4]] = per.get(sbx.sandbox_id[:4], 0) + 1
        assert len(sbx.sandbox_id) == 20
    assert set(per) == codes, per
    # Placement by load: nobody gets most of them.
    assert max(per.values()) <= 6, per
    # The nodes report their load within a heartbeat or two.
    def counted():
        live = {n["code"]: n["live"] for n in cluster.nodes_listed()}
        return live if all(live[c] >= per[c] for c in per) else None

    wait_for(counted, 10, "the nodes' heartbeats to count their sandboxes")


def test_each_node_counts_its_own_in_its_metrics(cluster, made):
    """Each node's metrics listener (`--metrics-listen`) counts the creates placed on it and
    the kills of its sandboxes, whichever gateway they came through; it asks for no cluster
    token and serves none of the node's API."""
    ports = [metrics_port(n) for n in cluster.nodes]
    codes = [cluster.code_of(i) for i in range(len(cluster.nodes))]

    def counts(port):
        f = scrape_metrics(port)
        return (
            metric(f, "husk_sandbox_creates", "husk_sandbox_creates_total", source="new"),
            metric(f, "husk_sandbox_ends", "husk_sandbox_ends_total", reason="killed"),
        )

    before = [counts(p) for p in ports]
    sandboxes = [create(cluster, made, gateway=i % 2) for i in range(6)]
    for sbx in sandboxes[:2]:
        sbx.kill()
    # By node: a sandbox id begins with its node's code.
    placed = Counter(sbx.sandbox_id[:4] for sbx in sandboxes)
    killed = Counter(sbx.sandbox_id[:4] for sbx in sandboxes[:2])
    for port, code, (new0, killed0) in zip(ports, codes, before):
        new1, killed1 = counts(port)
        assert (new1 - new0, killed1 - killed0) == (placed[code], killed[code]), code
    # The node's API stays behind its token; its metrics listener has nothing else.
    r = http_request(ports[0], "GET", "/v2/sandboxes", {"X-API-Key": cluster.admin_key})
    assert r.status == 404, r.text


def test_every_api_works_through_either_gateway_on_every_node(cluster, made):
    for code, sbx in one_per_node(cluster, made).items():
        for gw in (0, 1):
            s = Sandbox.connect(sbx.sandbox_id, **cluster.opts(gw))
            # Commands, streamed.
            lines = []
            r = s.commands.run("for i in 1 2 3; do echo line$i; done", on_stdout=lines.append)
            assert r.exit_code == 0 and r.stdout == "line1\nline2\nline3\n"
            # Files.
            s.files.write(f"/tmp/from-{gw}.txt", f"{code}-{gw}")
            assert s.files.read(f"/tmp/from-{gw}.txt") == f"{code}-{gw}"
            names = {e.name for e in s.files.list("/tmp")}
            assert f"from-{gw}.txt" in names
            # A PTY.
            h = s.pty.create(PtySize(rows=24, cols=80), timeout=30)
            s.pty.send_stdin(h.pid, b"echo pty-$((6*7))\nexit 0\n")
            out = []
            assert h.wait(on_pty=out.append).exit_code == 0
            assert "pty-42" in b"".join(out).decode(errors="replace")
            # A watch.
            s.files.make_dir(f"/tmp/w{gw}")
            handle = s.files.watch_dir(f"/tmp/w{gw}")
            s.files.write(f"/tmp/w{gw}/f", "x")
            def seen():
                evs = handle.get_new_events()
                return [e for e in evs if e.name == "f" and e.type in (FilesystemEventType.CREATE, FilesystemEventType.WRITE)] or None
            wait_for(seen, 20, "the watch's event through the gateway")
            handle.stop()


def test_ingress_reaches_a_sandbox_on_any_node(cluster, made):
    for code, sbx in one_per_node(cluster, made).items():
        sbx.files.write("/tmp/www/hello.txt", f"hello from {code}\n")
        sbx.commands.run("python3 -m http.server 8000 --bind 0.0.0.0 --directory /tmp/www",
                         background=True)
        for gw in cluster.gateways:
            def via_host():
                r = http_request(gw.port, "GET", "/hello.txt",
                                 headers={"Host": f"8000-{sbx.sandbox_id}.husk.test"})
                return r if r.status == 200 else None
            r = wait_for(via_host, 30, f"the sandbox's server on node {code} through a gateway")
            assert r.body == f"hello from {code}\n".encode()
            r = http_request(gw.port, "GET", "/hello.txt",
                             headers=sandbox_headers(sbx.sandbox_id, port=8000))
            assert r.status == 200 and r.body == f"hello from {code}\n".encode(), r.text


UPGRADE_SERVER = """
import http.server
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() != "websocket":
            self.send_response(400); self.end_headers(); return
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.end_headers()
        while True:
            data = self.rfile.read1(65536)
            if not data:
                break
            self.wfile.write(data)
        self.close_connection = True
http.server.ThreadingHTTPServer(("0.0.0.0", 8002), H).serve_forever()
"""


def test_a_protocol_upgrade_is_joined_through_a_gateway(cluster, made):
    import socket

    sbx = create(cluster, made)
    sbx.files.write("/tmp/up.py", UPGRADE_SERVER)
    sbx.commands.run("python3 /tmp/up.py", background=True)
    host = f"8002-{sbx.sandbox_id}.husk.test"

    def upgraded():
        s = socket.create_connection(("127.0.0.1", cluster.gateways[1].port), timeout=10)
        s.sendall(f"GET /ws HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\n"
                  f"Upgrade: websocket\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            if not chunk:
                break
            head += chunk
        if head.split(b"\r\n", 1)[0].split(b" ")[1:2] != [b"101"]:
            s.close()
            return None
        return s, head.split(b"\r\n\r\n", 1)[1]

    s, rest = wait_for(upgraded, 30, "the sandbox's server to switch protocols through the gateway")
    try:
        payload = bytes(i % 251 for i in range(200_000))
        sender = threading.Thread(target=s.sendall, args=(payload,))
        sender.start()
        echoed = rest
        while len(echoed) < len(payload):
            chunk = s.recv(65536)
            assert chunk, f"the joined connection ended after {len(echoed)} bytes"
            echoed += chunk
        sender.join()
        assert echoed == payload
    finally:
        s.close()


def test_the_list_merges_every_node_and_pages(cluster, made):
    tag = unique("list")
    ids = set()
    for i in range(7):
        # Spread over the three nodes, so that the list must merge them.
        only_node(cluster, i % 3)
        ids.add(create(cluster, made, gateway=i % 2, metadata={"tag": tag}).sandbox_id)
    only_node(cluster, None)
    assert len({i[:4] for i in ids}) == 3
    for gw in (0, 1):
        listed = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), **cluster.opts(gw)).next_items()
        assert {s.sandbox_id for s in listed} == ids
        # Pages of two, in order, each sandbox once.
        paginator = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2, **cluster.opts(gw))
        seen = []
        while paginator.has_next:
            page = paginator.next_items()
            assert len(page) <= 2
            seen += [s.sandbox_id for s in page]
        assert sorted(seen) == sorted(ids) and len(seen) == len(ids)
        started = [s.started_at for s in Sandbox.list(query=SandboxQuery(metadata={"tag": tag}),
                                                      **cluster.opts(gw)).next_items()]
        assert started == sorted(started, reverse=True)


def test_a_teams_quota_holds_across_nodes(cluster, made):
    team = unique("quota").replace("_", "-")
    key = cluster.create_key(team)
    cluster.set_quota(team, 3)
    # One on each node.
    first = []
    try:
        for i in range(3):
            only_node(cluster, i)
            first.append(create(cluster, made, gateway=i % 2, api_key=key))
            assert first[-1].sandbox_id[:4] == cluster.code_of(i)
        # The fourth, on any node, through either gateway: refused.
        for i in range(3):
            only_node(cluster, i)
            with pytest.raises(Exception) as refused:
                create(cluster, made, gateway=i % 2, api_key=key)
            assert "limit of 3" in str(refused.value), refused.value
    finally:
        only_node(cluster, None)
    # Concurrent creates at the limit: never more than the quota.
    first[0].kill()
    results = []
    def one(gw):
        try:
            results.append(create(cluster, made, gateway=gw, api_key=key).sandbox_id)
        except Exception as e:  # noqa: BLE001
            results.append(e)
    threads = [threading.Thread(target=one, args=(i % 2,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(isinstance(r, str) for r in results) == 1, results
    # Other teams are not counted.
    create(cluster, made, gateway=1)


def test_a_secret_set_once_is_usable_on_every_node(cluster, made):
    name = unique("TOKEN").replace("-", "_").upper()
    value = "cluster-secret-5f1e"
    r = http_request(cluster.gateways[0].port, "PUT", f"/husk/v1/secrets/{name}",
                     headers={"X-API-Key": cluster.admin_key}, body=value.encode())
    assert r.status == 204, r.text
    for code, sbx in one_per_node(cluster, made, envs={"S": f"husk-secret://{name}"}).items():
        r = sbx.commands.run('test "$S" = "%s" && echo match-%s' % (value, code))
        assert r.stdout == f"match-{code}\n"


def test_only_gateways_reach_a_node_and_nobody_passes_for_one(cluster, made):
    node = cluster.nodes[0]
    # The node answers its health probe, and nothing else without the cluster token.
    assert http_request(node.port, "GET", "/health").status == 204
    for headers in ({"X-API-Key": cluster.admin_key},
                    {"X-API-Key": cluster.admin_key, "X-Husk-Cluster-Token": "x" * 64},
                    {"X-Husk-Team": "default"}):
        r = http_request(node.port, "GET", "/sandboxes", headers=headers)
        assert r.status == 401 and "husk node" in r.json()["message"], r.text
    sbx = create(cluster, made)
    r = http_request(node.port, "GET", "/files?path=/etc/hostname",
                     headers=sandbox_headers(sbx.sandbox_id))
    assert r.status == 401, r.text
    r = http_request(node.port, "GET", "/husk/v1/cluster/signed-files?path=/a&signature=v1_x")
    assert r.status == 401 and "husk node" in r.json()["message"], r.text
    # Through a gateway, a client's own cluster headers count for nothing.
    other = cluster.create_key(unique("other").replace("_", "-"))
    spoof = {"X-API-Key": other, "X-Husk-Team": "default", "X-Husk-Admin": "1",
             "X-Husk-Cluster-Token": "y" * 64}
    for gw in cluster.gateways:
        r = http_request(gw.port, "GET", "/sandboxes", headers=spoof)
        assert r.status == 200 and r.json() == [], r.text
        r = http_request(gw.port, "GET", f"/sandboxes/{sbx.sandbox_id}", headers=spoof)
        assert r.status == 404, r.text
        r = http_request(gw.port, "DELETE", f"/sandboxes/{sbx.sandbox_id}", headers=spoof)
        assert r.status == 404, r.text
        r = http_request(gw.port, "GET", "/sandboxes", headers={"X-Husk-Team": "default"})
        assert r.status == 401, r.text
        r = http_request(gw.port, "GET", "/husk/v1/cluster/nodes", headers={"X-API-Key": other})
        assert r.status == 403, r.text
        r = http_request(gw.port, "GET", "/husk/v1/cluster/nodes")
        assert r.status == 401, r.text
        # The nodes' image exchange is theirs alone, even for an admin key.
        digest = "sha256:" + "0" * 64
        for path in (f"/husk/v1/cluster/images/{digest}",
                     "/husk/v1/cluster/signed-files?path=/etc/passwd&signature=v1_x"):
            r = http_request(gw.port, "GET", path, headers={"X-API-Key": cluster.admin_key})
            assert r.status == 404 and r.json()["message"] == "no such route", r.text
    # A sandbox id no node made.
    r = http_request(cluster.gateways[0].port, "GET", "/sandboxes/zzzzaaaaaaaaaaaaaaaa",
                     headers={"X-API-Key": cluster.admin_key})
    assert r.status == 404, r.text
    assert sbx.is_running()


def test_signed_file_urls_without_a_sandbox_id_reach_every_node(cluster, made):
    """`download_url()` / `upload_url()` built on the gateway carry no sandbox id; opened as a
    browser or curl opens them, the gateway finds the sandbox by asking the nodes."""
    for code, sbx in one_per_node(cluster, made).items():
        sbx.files.write("/tmp/signed.txt", f"signed on {code}")
        for gw in (0, 1):
            s = Sandbox.connect(sbx.sandbox_id, **cluster.opts(gw))
            url = s.download_url("/tmp/signed.txt")
            assert url.startswith(cluster.gateways[gw].url + "/files?"), url
            # Twice: found by asking the nodes, then remembered.
            for _ in range(2):
                assert fetch_url(url, None) == (200, f"signed on {code}".encode())
            up = s.upload_url(f"/tmp/up-{gw}.txt")
            body, headers = multipart(f"/tmp/up-{gw}.txt", f"up {code} {gw}".encode())
            status, resp = fetch_url(up, None, "POST", body, headers)
            assert status == 200, resp
            assert sbx.files.read(f"/tmp/up-{gw}.txt") == f"up {code} {gw}"
            # Expired, tampered: refused as a node refuses them.
            expired = s.download_url("/tmp/signed.txt", use_signature_expiration=-30)
            status, body = fetch_url(expired, None)
            assert status == 401 and json.loads(body)["message"] == "signature is already expired"
            forged = url.replace("signature=v1_", "signature=v1_AA", 1)
            status, body = fetch_url(forged, None)
            assert status == 401 and json.loads(body)["message"] == "invalid signature", body
    # Once its sandbox is gone, a URL found before is refused, not served from memory.
    sbx = create(cluster, made)
    sbx.files.write("/tmp/signed.txt", "soon gone")
    url = sbx.download_url("/tmp/signed.txt")
    assert fetch_url(url, None) == (200, b"soon gone")
    sbx.kill()
    # What E2B's proxy answers for a sandbox gone, then the URL is searched again.
    status, body = fetch_url(url, None)
    assert status == 502 and json.loads(body)["message"] == "The sandbox was not found", body
    status, body = fetch_url(url, None)
    assert status == 401 and json.loads(body)["message"] == "invalid signature", body


def test_the_cluster_token_is_rotated_without_a_restart(cluster, made):
    """The documented rotation: the new token as a second line, then first, then alone. Every
    process reads its file again every 2 s; sandboxes keep working through the gateways at
    every step, and at the end the old token opens nothing."""
    sbx = create(cluster, made)
    node = next(n for i, n in enumerate(cluster.nodes) if cluster.code_of(i) == sbx.sandbox_id[:4])
    old = cluster.token_file.read_text().strip()
    new = "r" + old[1:][::-1]
    assert new != old

    def node_status(token):
        return http_request(node.port, "GET", f"/sandboxes/{sbx.sandbox_id}",
                            headers={"X-Husk-Cluster-Token": token, "X-Husk-Team": "default",
                                     "X-Husk-Admin": "1"}).status

    def works():
        for gw in (0, 1):
            s = Sandbox.connect(sbx.sandbox_id, **cluster.opts(gw))
            assert s.commands.run("echo ok").stdout == "ok\n"

    assert node_status(old) == 200 and node_status(new) == 401
    everyone = cluster.nodes + cluster.gateways

    def all_logged(text, times):
        """Every node and gateway has said `text` at least `times` times (each read the file)."""
        return all(p.log_path.read_bytes().decode(errors="replace").count(text) >= times
                   for p in everyone) or None

    changed = "the cluster token file changed: its tokens are in use"
    before = min(p.log_path.read_bytes().decode(errors="replace").count(changed) for p in everyone)
    try:
        cluster.token_file.write_text(f"{old}\n{new}\n")
        wait_for(lambda: all_logged(changed, before + 1), 10, "every process to read the file")
        assert node_status(new) == 200 and node_status(old) == 200
        works()
        cluster.token_file.write_text(f"{new}\n{old}\n")
        wait_for(lambda: all_logged(changed, before + 2), 10, "every process to read the file")
        works()
        cluster.token_file.write_text(f"{new}\n")
        wait_for(lambda: all_logged(changed, before + 3), 10, "every process to read the file")
        assert node_status(old) == 401 and node_status(new) == 200
        # The gateways send the new one: everything still works.
        works()
        # A file that stops being a token file changes nothing.
        cluster.token_file.write_text("not a token\n")
        wait_for(lambda: all_logged("holds no valid token", 1), 10, "every process to refuse it")
        assert node_status(new) == 200 and node_status(old) == 401
        works()
    finally:
        cluster.token_file.write_text(f"{new}\n")
    assert all(p.proc.poll() is None for p in everyone), "a process died"


@pytest.mark.timeout(1800)
def test_a_template_built_once_runs_on_every_node(cluster, made):
    name = unique("cluster-deb")
    # Built on node 1 (into its state directory), registered in the shared database.
    cluster.husk("template", "build", str(SPEC), "--name", name, "--quiet",
                 "--state-dir", str(cluster.nodes[0].state_dir), "--layer-cache", LAYER_CACHE,
                 timeout=1700)
    try:
        digest = cluster.psql(f"SELECT digest FROM templates WHERE name = '{name}'").strip()
        assert digest.startswith("sha256:"), digest
        holders = lambda: {n["name"] for n in cluster.nodes_listed() if digest in n["templates"]}  # noqa: E731
        wait_for(lambda: holders() == {"node-1"} or None, 10, "node 1 to report the image")
        time.sleep(1.2)  # the gateways read the nodes and templates every half second
        # Placement prefers the node that holds it.
        for i in range(3):
            sbx = create(cluster, made, gateway=i % 2, template=name)
            assert sbx.sandbox_id[:4] == cluster.code_of(0)
        # Each other node alone takes the creates: it fetches the image from node 1, checked
        # against its digest, and runs the template.
        for index in (1, 2):
            only_node(cluster, index)
            sbx = create(cluster, made, gateway=index % 2, template=name)
            assert sbx.sandbox_id[:4] == cluster.code_of(index)
            r = sbx.commands.run("cat /etc/husk-compat; jq --version; echo $TEMPLATE_ENV")
            assert r.stdout.splitlines()[0] == "compat-template" and "from-the-template" in r.stdout
        wait_for(lambda: holders() == {"node-1", "node-2", "node-3"} or None, 10,
                 "every node to report the image")
    finally:
        only_node(cluster, None)
        cluster.husk("template", "rm", name, "--state-dir", str(cluster.nodes[0].state_dir), check=False)


@pytest.mark.timeout(2400)
def test_run_code_through_either_gateway_on_every_node(cluster):
    """husk's code-interpreter preset built once, on node 1; `run_code` with the stock
    e2b-code-interpreter SDK through both gateways on sandboxes of every node (nodes 2 and 3
    fetch the image first)."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    from husk_compat import CODE_INTERPRETER_PRESETS, PRESETS_DIR

    built = []
    made = []
    try:
        for preset in CODE_INTERPRETER_PRESETS:
            cluster.husk("template", "build", str(PRESETS_DIR / preset), "--quiet",
                         "--state-dir", str(cluster.nodes[0].state_dir), "--layer-cache", LAYER_CACHE,
                         timeout=2300)
            built.append(preset)
        # `base` now names the built preset, for every create of the cluster: only the code
        # interpreter's image is wanted here.
        cluster.husk("template", "rm", "base", "--state-dir", str(cluster.nodes[0].state_dir))
        built.remove("base")
        seen = {}
        for index in range(3):
            # Node 1 holds the image; the others fetch it when they alone take the create.
            only_node(cluster, index)
            sbx = CodeSandbox.create(timeout=180, **cluster.opts(index % 2))
            made.append(sbx.sandbox_id)
            seen[sbx.sandbox_id[:4]] = sbx
            assert sbx.sandbox_id[:4] == cluster.code_of(index)
        assert len(seen) == 3, sorted(seen)
        for code, sbx in seen.items():
            for gw in (0, 1):
                other = CodeSandbox.connect(sbx.sandbox_id, **cluster.opts(gw))
                first = other.run_code(f"x = {gw + 40}")
                assert first.error is None
                result = other.run_code("x + 2")
                assert result.text == str(gw + 42), (code, gw, result)
    finally:
        only_node(cluster, None)
        for sid in made:
            try:
                Sandbox.kill(sid, **cluster.opts(0))
            except Exception:  # noqa: BLE001
                pass
        for preset in reversed(built):
            cluster.husk("template", "rm", preset, "--state-dir", str(cluster.nodes[0].state_dir),
                         check=False)


def test_workspaces_are_refused_clearly_without_storage_every_node_mounts(cluster):
    headers = {"X-API-Key": cluster.admin_key, "Content-Type": "application/json"}
    for gw in cluster.gateways:
        r = http_request(gw.port, "POST", "/husk/v1/workspaces", headers=headers,
                         body=b'{"name": "data"}')
        assert r.status == 501 and "ReadWriteMany" in r.json()["message"], r.text
        r = http_request(gw.port, "GET", "/volumes", headers=headers)
        assert r.status == 501 and "--shared-workspaces" in r.json()["message"], r.text
        r = http_request(gw.port, "POST", "/v2/sandboxes", headers=headers,
                         body=b'{"templateID": "base", "volumeMounts": [{"name": "data", "path": "/data"}]}')
        assert r.status == 400 and "ReadWriteMany" in r.json()["message"], r.text


def test_workspaces_on_storage_every_node_mounts(pg):
    c = Cluster(pg, nodes=2, gateways=1, shared_workspaces=True)
    made: dict = {}
    try:
        headers = {"X-API-Key": c.admin_key, "Content-Type": "application/json"}
        port = c.gateways[0].port
        name = unique("ws")
        r = http_request(port, "POST", "/husk/v1/workspaces", headers=headers,
                         body=json.dumps({"name": name}).encode())
        assert r.status == 201, r.text
        r = http_request(port, "PUT", f"/husk/v1/workspaces/{name}/files/in.txt", headers=headers,
                         body=b"uploaded once\n")
        assert r.status // 100 == 2, r.text
        # A sandbox on each node mounts it, sees the upload and what the other wrote.
        for index in (0, 1):
            only_node(c, index)
            sbx = create(c, made, volume_mounts={"/data": f"{name}:rw"})
            assert sbx.sandbox_id[:4] == c.code_of(index)
            r = sbx.commands.run(f"cat /data/in.txt; ls /data; echo from-{index} > /data/out-{index}.txt")
            assert r.stdout.startswith("uploaded once\n"), r.stdout
            if index == 1:
                assert "out-0.txt" in r.stdout
        # Listed and read through the gateway (whichever node answers).
        for _ in range(4):
            r = http_request(port, "GET", f"/husk/v1/workspaces/{name}/files/out-1.txt", headers=headers)
            assert r.status == 200 and r.body == b"from-1\n", r.text
    finally:
        only_node(c, None)
        for sid, opts in made.items():
            try:
                Sandbox.kill(sid, **opts)
            except Exception:  # noqa: BLE001
                pass
        c.close()


# ---------------------------------------------------------------------------------------------
# Faults, each on a cluster of its own


def test_a_killed_node_is_reported_lost_and_creates_go_elsewhere(pg):
    # Sandboxes outlive a node's process, as in production: the killed node's keep running.
    c = Cluster(pg, nodes=3, gateways=1, keep=True)
    made: dict = {}
    try:
        team = unique("lost").replace("_", "-")
        key = c.create_key(team)
        c.set_quota(team, 2)
        victim = c.code_of(2)
        # Two sandboxes of the team, one on the node about to die.
        on_victim = None
        for _ in range(20):
            sbx = create(c, made, api_key=key)
            if sbx.sandbox_id[:4] == victim and on_victim is None:
                on_victim = sbx
            else:
                sbx.kill()
                made.pop(sbx.sandbox_id)
            if on_victim is not None:
                break
        assert on_victim is not None, "no create reached the victim node"
        other = create(c, made, api_key=key)
        while other.sandbox_id[:4] == victim:
            other.kill()
            made.pop(other.sandbox_id)
            other = create(c, made, api_key=key)
        with pytest.raises(Exception, match="limit of 2"):
            create(c, made, api_key=key)

        c.nodes[2].proc.kill()
        killed = time.monotonic()

        def reported_lost():
            r = http_request(c.gateways[0].port, "GET", f"/sandboxes/{on_victim.sandbox_id}",
                             headers={"X-API-Key": key})
            return r if r.status == 404 and "stopped answering" in r.text else None

        r = wait_for(reported_lost, 30, "the killed node's sandbox to be reported lost")
        assert time.monotonic() - killed < 20, "reported lost, but late"
        lost = http_request(c.gateways[0].port, "GET", "/v2/sandboxes?state=lost",
                            headers={"X-API-Key": key}).json()
        assert [s["sandboxID"] for s in lost] == [on_victim.sandbox_id], lost
        # Its place in the quota is free; the new one, and every later create, lands elsewhere.
        again = create(c, made, api_key=key)
        assert again.sandbox_id[:4] != victim
        again.kill()
        for _ in range(6):
            sbx = create(c, made)
            assert sbx.sandbox_id[:4] != victim
        # The survivors still serve theirs.
        assert other.commands.run("echo alive").stdout == "alive\n"
        # The node comes back: it takes up nothing the cluster reported lost (the sandbox it
        # still ran is destroyed), is ready again, and gets creates.
        c.restart_node(2)
        wait_for(lambda: next(n for n in c.nodes_listed() if n["code"] == victim)["state"] == "ready"
                 or None, 15, "the restarted node to be ready")
        r = http_request(c.gateways[0].port, "GET", f"/sandboxes/{on_victim.sandbox_id}",
                         headers={"X-API-Key": key})
        assert r.status == 404 and "stopped answering" in r.text, r.text
        assert "destroyed 1 that no record named" in c.nodes[2].log_tail(), c.nodes[2].log_tail()
        only_node(c, 2)
        back = create(c, made)
        assert back.sandbox_id[:4] == victim
        assert back.commands.run("echo back").stdout == "back\n"
        only_node(c, None)
    finally:
        for sid, opts in made.items():
            try:
                Sandbox.kill(sid, **opts)
            except Exception:  # noqa: BLE001
                pass
        c.close()


def test_a_node_restarted_cleanly_keeps_its_sandboxes_however_long_it_takes(pg):
    """SIGTERM (a rolling upgrade): the node drains and stops, its sandboxes keep running;
    it is not declared lost however long past the limit for a silent node it stays away, and
    the next process on its machine takes its sandboxes up."""
    c = Cluster(pg, nodes=2, gateways=1, keep=True)
    made: dict = {}
    try:
        only_node(c, 1)
        sbx = create(c, made)
        assert sbx.sandbox_id[:4] == c.code_of(1)
        sbx.commands.run("echo kept > /tmp/kept")
        only_node(c, None)
        assert c.nodes[1].stop() == 0
        assert "node draining" in c.nodes[1].log_tail()
        state = lambda: next(n for n in c.nodes_listed() if n["code"] == c.code_of(1))["state"]  # noqa: E731
        assert state() == "draining"
        # Creates go elsewhere meanwhile.
        other = create(c, made)
        assert other.sandbox_id[:4] == c.code_of(0)
        time.sleep(LOST_AFTER_S + 3)
        assert state() == "draining"
        c.restart_node(1)
        wait_for(lambda: state() == "ready" or None, 15, "the node to be ready again")

        def kept():
            # The new process listens elsewhere: the gateways learn it within half a second.
            try:
                return sbx.commands.run("cat /tmp/kept").stdout
            except Exception:  # noqa: BLE001
                return None

        assert wait_for(kept, 10, "the sandbox through the restarted node") == "kept\n"
        # Drained by the operator, it stays drained through a restart until made ready.
        c.husk("cluster", "drain", c.node_names[1])
        assert c.nodes[1].stop() == 0
        c.restart_node(1)
        listed = lambda: next(n for n in c.nodes_listed() if n["code"] == c.code_of(1))  # noqa: E731
        wait_for(lambda: listed()["silentForMs"] < 1500 or None, 15, "the node to beat again")
        assert (listed()["state"], listed()["held"]) == ("draining", True)
        assert "held" in c.husk("cluster", "nodes").stdout.decode()
        assert create(c, made).sandbox_id[:4] == c.code_of(0)
        assert wait_for(kept, 10, "the sandbox through the restarted node") == "kept\n"
        c.husk("cluster", "ready", c.node_names[1])
        assert (listed()["state"], listed()["held"]) == ("ready", False)
    finally:
        for sid, opts in made.items():
            try:
                Sandbox.kill(sid, **opts)
            except Exception:  # noqa: BLE001
                pass
        c.close()


def test_a_node_cut_off_too_long_ends_what_the_cluster_reported_lost(pg):
    """A node frozen (SIGSTOP: alive, silent) past the limit is declared lost; when it wakes,
    its first heartbeat tells it, and it destroys the sandboxes the cluster reported lost,
    which must not run on with their quota freed."""
    import signal as sig

    c = Cluster(pg, nodes=2, gateways=1, keep=True)
    made: dict = {}
    try:
        only_node(c, 1)
        sbx = create(c, made)
        assert sbx.sandbox_id[:4] == c.code_of(1)
        only_node(c, None)
        node = c.nodes[1]
        node.proc.send_signal(sig.SIGSTOP)
        try:
            def reported_lost():
                r = http_request(c.gateways[0].port, "GET", f"/v2/sandboxes?state=lost",
                                 headers={"X-API-Key": c.admin_key})
                return r if r.status == 200 and any(s["sandboxID"] == sbx.sandbox_id for s in r.json()) else None

            wait_for(reported_lost, 30, "the frozen node's sandbox to be reported lost")
        finally:
            node.proc.send_signal(sig.SIGCONT)
        wait_for(lambda: "ended the sandboxes the cluster had reported lost" in node.log_tail() or None,
                 15, "the node to end what was reported lost")
        wait_for(lambda: next(n for n in c.nodes_listed() if n["code"] == c.code_of(1))["state"] == "ready"
                 or None, 15, "the node to be ready again")
        # Gone for good: not running on the node, still reported lost.
        r = http_request(c.gateways[0].port, "GET", f"/sandboxes/{sbx.sandbox_id}",
                         headers={"X-API-Key": c.admin_key})
        assert r.status == 404, r.text
        with pytest.raises(Exception):
            sbx.commands.run("true", request_timeout=5)
    finally:
        for sid, opts in made.items():
            try:
                Sandbox.kill(sid, **opts)
            except Exception:  # noqa: BLE001
                pass
        c.close()


def test_a_killed_gateway_is_invisible_to_the_others_clients(pg):
    c = Cluster(pg, nodes=2, gateways=2)
    made: dict = {}
    try:
        sbx = create(c, made, gateway=1)
        s0 = Sandbox.connect(sbx.sandbox_id, **c.opts(0))
        # A command streaming through gateway 1 while gateway 0 dies.
        lines = []
        h = sbx.commands.run("for i in $(seq 1 20); do echo tick$i; sleep 0.1; done",
                             background=True)
        s0.commands.run("true")
        c.gateways[0].kill()
        r = h.wait(on_stdout=lines.append)
        assert r.exit_code == 0 and r.stdout.count("tick") == 20
        assert sbx.commands.run("echo still").stdout == "still\n"
        more = create(c, made, gateway=1)
        assert more.files.write("/tmp/a", "b") is not None
        # The dead gateway's clients fail; retried against the live one they succeed.
        with pytest.raises(Exception):
            s0.commands.run("true", request_timeout=5)
    finally:
        for sid, opts in made.items():
            try:
                Sandbox.kill(sid, **c.opts(1))
            except Exception:  # noqa: BLE001
                pass
        c.close()


def test_a_postgres_restart_loses_nothing():
    pg = PostgresServer()
    c = None
    made: dict = {}
    try:
        c = Cluster(pg, nodes=2, gateways=1)
        team = unique("pgr").replace("_", "-")
        key = c.create_key(team)
        before = [create(c, made, gateway=0, api_key=key, metadata={"n": str(i)}) for i in range(4)]
        pg.stop()
        # Creates fail clearly; running sandboxes keep working through the gateway.
        r = http_request(c.gateways[0].port, "POST", "/sandboxes",
                         headers={"X-API-Key": key, "Content-Type": "application/json"},
                         body=b'{"templateID": "base"}')
        assert r.status == 503, r.text
        assert r.json()["message"] == "the database is unavailable; retry shortly"
        for sbx in before:
            assert sbx.commands.run("echo up").stdout == "up\n"
            sbx.files.write("/tmp/during", "outage")
        pg.start()

        def creates():
            try:
                return create(c, made, gateway=0, api_key=key)
            except Exception:  # noqa: BLE001 - the database is still coming back
                return None

        wait_for(creates, 30, "creates to work again after PostgreSQL restarted")
        listed = {s.sandbox_id for s in Sandbox.list(**c.opts(0, key)).next_items()}
        assert {s.sandbox_id for s in before} <= listed
        # No node was declared lost, no sandbox with it.
        assert all(n["state"] == "ready" for n in c.nodes_listed())
        for sbx in before:
            assert sbx.files.read("/tmp/during") == "outage"
    finally:
        if c is not None:
            for sid, opts in made.items():
                try:
                    Sandbox.kill(sid, **opts)
                except Exception:  # noqa: BLE001
                    pass
            c.close()
        pg.close()


def test_the_stock_js_sdk_works_through_the_gateways(cluster):
    import os
    import subprocess
    from pathlib import Path

    js = Path(__file__).resolve().parent.parent / "js"
    env = dict(os.environ)
    env["HUSK_GATEWAYS"] = ",".join(g.url for g in cluster.gateways)
    env["HUSK_API_KEY"] = cluster.admin_key
    out = subprocess.run(["node", "--test", "--test-timeout=120000", "cluster_gateway.mjs"],
                         cwd=js, env=env, capture_output=True, timeout=300)
    text = (out.stdout + out.stderr).decode(errors="replace")
    assert out.returncode == 0, text[-6000:]
    assert "# pass 1" in text and "# fail 0" in text, text[-3000:]


def test_a_server_of_its_own_serves_none_of_the_node_api(husk):
    digest = "sha256:" + "0" * 64
    for headers in ({}, {"X-API-Key": husk.admin_key}):
        for path in (f"/husk/v1/cluster/images/{digest}",
                     "/husk/v1/cluster/signed-files?path=/a&signature=v1_x"):
            r = http_request(husk.port, "GET", path, headers=headers)
            assert r.status == 404, r.text


def served_certificate(port: int, ca: Path, name: str) -> dict:
    """The certificate the listener on `port` presents, verified against `ca` for `name`."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=name) as tls:
            return tls.getpeercert()


# Run by the SDK in a process of its own that trusts the cluster's CA from its start
# (sdk_in_process): creates through the gateway until every node holds one, each used.
ONE_PER_NODE = """
opts = dict(api_url=args["url"], sandbox_url=args["url"], api_key=args["key"], request_timeout=30)
found, made = {}, []
for _ in range(30):
    sbx = Sandbox.create(timeout=120, template=args.get("template", "base"), **opts)
    made.append(sbx.sandbox_id)
    found.setdefault(sbx.sandbox_id[:4], sbx)
    if set(found) >= set(args["codes"]):
        break
result = {"made": made, "ids": {}, "outs": {}}
for code, sbx in found.items():
    result["ids"][code] = sbx.sandbox_id
    out = sbx.commands.run(args["cmd"]).stdout
    sbx.files.write("/tmp/f", "tls")
    result["outs"][code] = [out, sbx.files.read("/tmp/f")]
"""
RUN_IN = """
opts = dict(api_url=args["url"], sandbox_url=args["url"], api_key=args["key"], request_timeout=30)
result = {sid: Sandbox.connect(sid, **opts).commands.run(args["cmd"]).stdout for sid in args["ids"]}
"""


# A Debian template is built in it: from a cold layer cache that takes minutes.
@pytest.mark.timeout(1800)
def test_gateways_and_nodes_speak_tls_and_renewed_certificates_are_used_live(pg, tmp_path):
    """Nodes serve only HTTPS, with one certificate for the name `husk-node` (what a
    DaemonSet's nodes share), which gateways verify against the cluster's CA; the gateway
    serves the SDK over HTTPS too. A certificate renewed in place is presented within
    seconds, without a restart, while sandboxes keep working; a template's image crosses
    between nodes over TLS; a gateway expecting another name reaches no node."""
    ca = make_ca(tmp_path)
    node_cert, node_key = make_cert(tmp_path, ca, "node", "DNS:husk-node")
    gw_cert, gw_key = make_cert(tmp_path, ca, "gateway", "IP:127.0.0.1")
    tls = ClusterTls(ca=ca[0], cert=node_cert, key=node_key,
                     gateway_cert=gw_cert, gateway_key=gw_key)
    c = Cluster(pg, nodes=2, gateways=1, tls=tls)
    made: list = []
    # The stock SDK trusts the cluster's CA as any program on the host would.
    trust = {"SSL_CERT_FILE": str(ca[0])}
    try:
        gw = c.gateways[0]
        assert gw.url.startswith("https://")
        args = {"url": gw.url, "key": c.admin_key, "cmd": "echo over tls",
                "codes": [c.code_of(i) for i in range(2)]}
        spread = sdk_in_process(ONE_PER_NODE, trust, args)
        made += spread["made"]
        assert sorted(spread["ids"]) == sorted(args["codes"]), spread
        for code, outs in spread["outs"].items():
            assert outs == ["over tls\n", "tls"], (code, outs)
        # The nodes speak nothing but TLS...
        for node in c.nodes:
            with pytest.raises((http.client.HTTPException, OSError)):
                http_request(node.port, "GET", "/health", timeout=10)
        # ...present the certificate for the cluster's name, and still want the token.
        first = served_certificate(c.nodes[0].port, ca[0], "husk-node")
        assert ("DNS", "husk-node") in first["subjectAltName"]
        no_name = ssl.create_default_context(cafile=str(ca[0]))
        no_name.check_hostname = False
        resp = http_request(c.nodes[0].port, "GET", "/sandboxes",
                            headers={"X-API-Key": c.admin_key}, tls=no_name)
        assert resp.status == 401, (resp.status, resp.body)
        # Renewal (what cert-manager does to a Secret): new key and certificate, in place.
        new_cert, new_key = make_cert(tmp_path, ca, "node-renewed", "DNS:husk-node")
        os.replace(new_key, node_key)
        os.replace(new_cert, node_cert)
        for node in c.nodes:
            wait_for(lambda: served_certificate(node.port, ca[0], "husk-node")["serialNumber"]
                     != first["serialNumber"], 20, "the renewed certificate to be served", 0.1)
            assert "the TLS certificate changed" in node.log_tail(20000)
            # Caught half-written (the new key, the old certificate), it was not an error.
            assert "stays in use" not in node.log_tail(20000)
        ran = sdk_in_process(RUN_IN, trust, {**args, "cmd": "echo renewed",
                                             "ids": list(spread["ids"].values())})
        assert set(ran.values()) == {"renewed\n"}, ran
        # A template built on node 1 reaches node 2 over the node API's TLS: node 2 fetches
        # the image from node 1, verifying it as the gateway does.
        name = unique("tls-deb")
        c.husk("template", "build", str(SPEC), "--name", name, "--quiet",
               "--state-dir", str(c.nodes[0].state_dir), "--layer-cache", LAYER_CACHE,
               timeout=1700)
        try:
            only_node(c, 1)
            built = sdk_in_process(ONE_PER_NODE, trust, {
                **args, "template": name, "cmd": "cat /etc/husk-compat", "codes": [c.code_of(1)]})
            made += built["made"]
            assert built["outs"] == {c.code_of(1): ["compat-template\n", "tls"]}, built
            assert "fetched a template image" in c.nodes[1].log_tail(40000)
        finally:
            only_node(c, None)
            c.husk("template", "rm", name, "--state-dir", str(c.nodes[0].state_dir), check=False)
        # A gateway verifying another name refuses every node: nothing is sent to them.
        bad = c.add_gateway({"HUSK_CLUSTER_TLS_NAME": "husk-other"}, serve_tls=False)
        assert bad.url.startswith("http://")
        with pytest.raises(Exception) as refused:
            Sandbox.create(timeout=60, **c.opts(1))
        # The client is told no node can take it; the operator's log says why.
        assert "503" in str(refused.value), str(refused.value)
        assert "certificate not valid for name" in bad.log_tail(20000), bad.log_tail()
    finally:
        for sid in made:
            try:
                http_request(c.gateways[0].port, "DELETE", f"/sandboxes/{sid}",
                             headers={"X-API-Key": c.admin_key}, tls=c.client_tls(0))
            except Exception:  # noqa: BLE001
                pass
        c.close()


def test_a_node_refuses_an_advertised_url_its_listener_does_not_speak(pg, tmp_path):
    ca = make_ca(tmp_path)
    cert, key = make_cert(tmp_path, ca, "node", "DNS:husk-node")
    c = Cluster(pg, nodes=0, gateways=1)
    try:
        base = [str(c.bin), "node", "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
        env = dict(os.environ, HUSK_DATABASE_URL=c.database_url,
                   HUSK_CLUSTER_TOKEN_FILE=str(c.token_file))
        runs = {
            "https without a certificate": (["--advertise-url", "https://127.0.0.1"],
                                            "needs --tls-cert"),
            "http with a certificate": (["--advertise-url", "http://127.0.0.1", "--tls-cert",
                                         str(cert), "--tls-key", str(key)], "advertise an https"),
            "a key that is not the certificate's": (
                ["--advertise-url", "https://127.0.0.1", "--tls-cert", str(cert), "--tls-key",
                 str(ca[1])], "not the key of --tls-cert"),
            "a certificate without its key": (["--advertise-url", "https://127.0.0.1",
                                               "--tls-cert", str(cert)], "--tls-key"),
            "a CA file without a certificate": (
                ["--advertise-url", "http://127.0.0.1", "--cluster-ca", str(key)],
                "no PEM certificate"),
        }
        for what, (args, said) in runs.items():
            out = subprocess.run(base + args, capture_output=True, timeout=60, env=env)
            err = out.stderr.decode(errors="replace")
            assert out.returncode == 2, (what, out.returncode, err)
            assert said in err, (what, err)
        # Refused before it registered: the cluster has no node.
        assert c.psql("SELECT count(*) FROM nodes") == "0"
    finally:
        c.close()
