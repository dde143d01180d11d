"""Sandbox egress with the stock SDK (e2b==2.63.0), on a simulated internet.

The module builds the internet itself: a named network namespace (`husk-compat-<pid>`) with,
on its loopback, a web server at 198.51.100.10:80 and a private target at 10.20.30.40:80 and a
metadata target at 169.254.169.254:80 (all answer `public host=<Host>` and record every hit),
and a name server at 198.51.100.53 (allowed.test and other.test -> 198.51.100.10, NXDOMAIN
otherwise); the helpers are tests/compat/netsim/{web,dns}.py, run with `ip netns exec`. It then
starts its own `husk serve` with that namespace as the uplink. No traffic leaves loopback or
that namespace. Every test runs on two such servers in turn: one that makes each sandbox fresh,
and one with a warm pool of `base` (`--warm base=2`), whose creates claim a warm sandbox made
with the default policy and get their own policy at the claim (each claim checked in
`/husk/v1/pools`).

The web server also speaks TLS at 198.51.100.10:443 with a certificate (allowed.test,
other.test) from a CA the module makes (netsim/certs.py, with `openssl`); husk's proxy trusts that CA
(`--net-upstream-ca`), the sandboxes do not.

Checks, through the SDK's own create/update_network/get_info (sync, and async once): the default
policy reaches the internet and not the private network or metadata (refused fast, no hit);
`allow_internet_access=False`; `network.deny_out` then `update_network` (allow beats deny,
`allow_internet_access: False`, `{}`); a domain allow list with `deny_out: [ALL_TRAFFIC]`, also
against an `/etc/hosts` entry pointing the allowed name at the private target; the denial log
(husk's `/husk/v1/sandboxes/{id}/denials` and E2B's `/sandboxes/{id}/logs`, parsed with the
SDK's own model); header rules with `Secret.fill` (`network.rules`): the TLS server gets the
secret, which is nowhere in the sandbox (files, environments, the requesting process's memory,
searched with a positive control), rules only for their host, changed and cleared by
`update_network`, opening no access, and refused clearly when wrong."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

import pytest

from e2b import ALL_TRAFFIC, AsyncSandbox, AsyncSecret, Sandbox, Secret
from e2b.api.client.models import SandboxLogs

from husk_compat import HuskServer, http_request, pool_of, start_server, wait_for

NETSIM = Path(__file__).resolve().parent.parent / "netsim"
PUBLIC = "198.51.100.10"
DNS = "198.51.100.53"
PRIVATE = "10.20.30.40"
METADATA = "169.254.169.254"
NAMES = {"allowed.test": PUBLIC, "other.test": PUBLIC}
EGRESS_ARGS = (
    "--egress-address",
    "203.0.113.2/24",
    "--egress-gateway",
    "203.0.113.1",
    "--net-dns",
    DNS,
)
PROBE_SRC = (NETSIM / "probe.py").read_text()
PROBE_PATH = "/tmp/husk-net-probe.py"
NETNS_RE = re.compile(r"husk-compat-(\d+)")


# --------------------------------------------------------------------------------------------
# The simulated internet


def _ip(*args: str) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def sweep_stale_namespaces() -> None:
    """Removes `husk-compat-<pid>` namespaces whose creator is gone (a run killed before its
    teardown, e.g. by pytest-timeout); a live process's namespace is never touched."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.split() else ""
        m = NETNS_RE.fullmatch(name)
        if m and not Path(f"/proc/{m.group(1)}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)


class SimInternet:
    """The namespace, its addresses and its servers; `close()` removes all of it."""

    def __init__(self) -> None:
        self.name = f"husk-compat-{os.getpid()}"
        self.dir = Path(tempfile.mkdtemp(prefix="husk-netsim-"))
        self.hits_path = self.dir / "hits.jsonl"
        self.hits_path.touch()
        self.procs: List[subprocess.Popen] = []
        self.reaper = None
        self.created = False

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.name}"

    def start(self) -> None:
        # If this process dies before its teardown, the reaper removes the namespace.
        self.reaper = subprocess.Popen(
            [sys.executable, str(NETSIM / "reaper.py"), self.name, str(self.dir)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        _ip("netns", "add", self.name)
        self.created = True
        _ip("-n", self.name, "link", "set", "lo", "up")
        for a in (PUBLIC, DNS, PRIVATE, METADATA):
            _ip("-n", self.name, "addr", "add", f"{a}/32", "dev", "lo")
        web_ready = self.dir / "web.ready"
        dns_ready = self.dir / "dns.ready"
        cert, key = self._make_certificates()
        self._spawn(
            "web.py",
            str(self.hits_path),
            str(web_ready),
            "--tls",
            str(cert),
            str(key),
            f"{PUBLIC}:80",
            f"{PUBLIC}:443",
            f"{PRIVATE}:80",
            f"{METADATA}:80",
        )
        self._spawn("dns.py", str(dns_ready), f"{DNS}:53", *(f"{n}={a}" for n, a in NAMES.items()))
        for ready in (web_ready, dns_ready):
            wait_for(lambda: self._check_alive() or ready.exists(), 15, f"the simulated internet's {ready.stem}")

    @property
    def ca_path(self) -> Path:
        return self.dir / "ca.pem"

    def _make_certificates(self):
        """The CA (ca.pem) and the web server's certificate (netsim/certs.py)."""
        r = subprocess.run([sys.executable, str(NETSIM / "certs.py"), str(self.dir)],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"netsim/certs.py: {r.stderr.strip()}")
        return self.dir / "web.pem", self.dir / "web.key"

    def _spawn(self, script: str, *args: str) -> None:
        with open(self.dir / f"{script}.log", "wb") as log:
            self.procs.append(
                subprocess.Popen(
                    ["ip", "netns", "exec", self.name, sys.executable, str(NETSIM / script), *args],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                )
            )

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                logs = "".join(f.read_text(errors="replace") for f in self.dir.glob("*.log"))
                raise RuntimeError(f"a netsim helper exited with {p.returncode}: {logs}")

    def hits(self) -> List[dict]:
        """Every connection the internet's servers got so far: [{"to": "ADDR:PORT", "host": H}]."""
        return [json.loads(l) for l in self.hits_path.read_text().splitlines() if l.strip()]

    def hits_to(self, *addresses: str) -> List[dict]:
        return [h for h in self.hits() if h["to"].rsplit(":", 1)[0] in addresses]

    def close(self) -> None:
        try:
            for p in self.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGKILL)
            for p in self.procs:
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            try:
                if self.created:
                    subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)
                if self.reaper is not None and self.reaper.poll() is None:
                    self.reaper.terminate()
                    self.reaper.wait(timeout=10)


class NetEnv:
    def __init__(self, internet: SimInternet, server: HuskServer, warm: bool) -> None:
        self.internet = internet
        self.server = server
        # The server keeps a warm pool of `base`: creates that fit claim a warm sandbox and get
        # their network policy at the claim (Link::set_policy), not at the link's attach.
        self.warm = warm

    def pool(self) -> dict:
        return pool_of(self.server)


# Every test runs twice: on a server that makes each sandbox fresh, and on one whose creates
# claim warm sandboxes (made with the default policy before the create asked for its own).
@pytest.fixture(scope="module", params=["fresh", "warm"])
def net(request):
    # Not root: conftest has already stopped the session (husk serve needs root).
    if shutil.which("ip") is None:
        pytest.fail("iproute2 (`ip`) is not installed")
    sweep_stale_namespaces()
    internet = SimInternet()
    server = None
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL")}
    try:
        internet.start()
        warm = request.param == "warm"
        server = start_server(
            extra_args=(
                "--egress",
                f"netns:{internet.netns_path}",
                *EGRESS_ARGS,
                "--net-upstream-ca",
                str(internet.ca_path),
                *(("--warm", "base=2") if warm else ()),
            )
        )
        # Safety net, as in conftest: an SDK call without per-call URLs still reaches this server.
        os.environ["E2B_API_URL"] = server.url
        os.environ["E2B_SANDBOX_URL"] = server.url
        yield NetEnv(internet, server, warm)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        try:
            if server is not None:
                rc, tail = server.close()
                if rc not in (0, None):
                    print(f"\nhusk serve (network) exited with {rc}; last log lines:\n{tail}")
        finally:
            internet.close()
    assert not Path(internet.netns_path).exists(), f"{internet.netns_path} still exists"


@pytest.fixture
def make(net: NetEnv):
    """Creates sandboxes on the network test's server with the sync SDK; kills them all."""
    made = []

    def create(**kwargs) -> Sandbox:
        kwargs.setdefault("timeout", 120)
        # On the warm server, a create without header rules (whose CA a warm sandbox lacks)
        # is a claim: it waits for a warm sandbox, and the claim is checked to have happened.
        claims = net.warm and not (kwargs.get("network") or {}).get("rules")
        if claims:
            before = wait_for(lambda: (lambda p: p if p["ready"] >= 1 else None)(net.pool()), 60, "a warm sandbox")
        sbx = Sandbox.create(**kwargs, **net.server.opts())
        made.append(sbx.sandbox_id)
        if claims:
            after = net.pool()
            assert after["claimed"] == before["claimed"] + 1, (before, after)
            assert after["claim_failed"] == 0, after
        return sbx

    yield create
    for sandbox_id in made:
        try:
            Sandbox.kill(sandbox_id, **net.server.opts())
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# Probes from inside a sandbox


def _probe_cmd(probes) -> str:
    return "python3 " + PROBE_PATH + " " + " ".join(shlex.quote(p) for p in probes)


def _parse(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def probe(sbx: Sandbox, *probes: str) -> dict:
    """Runs the probes inside the sandbox (as the default user); {probe: {"r", "ms"}}."""
    sbx.files.write(PROBE_PATH, PROBE_SRC)
    return _parse(sbx.commands.run(_probe_cmd(probes), timeout=60).stdout)


async def aprobe(sbx: AsyncSandbox, *probes: str) -> dict:
    await sbx.files.write(PROBE_PATH, PROBE_SRC)
    return _parse((await sbx.commands.run(_probe_cmd(probes), timeout=60)).stdout)


def result(v: dict, p: str) -> str:
    return v.get(p, {}).get("r", "missing")


def assert_ok(v: dict, p: str, body: str) -> None:
    assert result(v, p) == f"ok:{body}", f"{p}: {v}"


def assert_refused_fast(v: dict, p: str) -> None:
    """Refused at once (a reset, an ICMP error, an unreachable network), never a silent hang."""
    r, ms = result(v, p), v.get(p, {}).get("ms", 10**9)
    assert r in ("refused", "reset", "closed") or r.startswith(("oserror:", "urlerror:")), f"{p}: expected a refusal, got {r} ({v})"
    assert "timed out" not in r, f"{p}: {r}"
    assert ms < 1500, f"{p}: refused only after {ms} ms ({r})"


def http(url_host: str) -> str:
    return f"http:http://{url_host}/"


def tcp(addr: str, port: int = 80) -> str:
    return f"tcp:{addr}:{port}"


def denials(net: NetEnv, sandbox_id: str, api_key=None):
    r = http_request(
        net.server.port,
        "GET",
        f"/husk/v1/sandboxes/{sandbox_id}/denials",
        {"X-API-Key": api_key or net.server.admin_key},
    )
    return r


def wait_denial(net: NetEnv, sandbox_id: str, **want) -> List[dict]:
    """Polls the denial log until it has a record with all of `want`; returns the log."""

    def check():
        r = denials(net, sandbox_id)
        assert r.status == 200, r.text
        log = r.json()["denials"]
        return log if any(all(d.get(k) == v for k, v in want.items()) for d in log) else None

    try:
        return wait_for(check, 10, f"a denial {want}")
    except Exception:
        raise AssertionError(f"no denial {want} in {denials(net, sandbox_id).text}")


def same_targets(got, want) -> bool:
    """Whether two rule lists name the same CIDRs/addresses/domains (a bare address and its /32
    are the same rule)."""

    def norm(x: str):
        try:
            return str(ipaddress.ip_network(x, strict=False))
        except ValueError:
            return x.lower()

    return sorted(map(norm, got or [])) == sorted(map(norm, want))


# --------------------------------------------------------------------------------------------
# Tests


def test_the_default_policy_reaches_the_internet_and_not_the_private_network(net: NetEnv, make):
    sbx = make()
    v = probe(sbx, http(PUBLIC), "dns:allowed.test", tcp(PRIVATE), tcp(METADATA))
    assert_ok(v, http(PUBLIC), f"public host={PUBLIC}")
    assert_ok(v, "dns:allowed.test", PUBLIC)
    assert_refused_fast(v, tcp(PRIVATE))
    assert_refused_fast(v, tcp(METADATA))
    assert any(h["to"] == f"{PUBLIC}:80" and h["host"] == PUBLIC for h in net.internet.hits()), net.internet.hits()
    assert net.internet.hits_to(PRIVATE, METADATA) == []

    info = sbx.get_info()
    assert info.allow_internet_access is True, info
    assert info.network is not None, info
    assert not info.network.get("allow_out") and not info.network.get("deny_out"), info.network


def test_no_internet_access(net: NetEnv, make):
    before = len(net.internet.hits())
    sbx = make(allow_internet_access=False)
    v = probe(sbx, http(PUBLIC), tcp(PUBLIC), tcp(PRIVATE), "dns:allowed.test")
    assert_refused_fast(v, http(PUBLIC))
    assert_refused_fast(v, tcp(PUBLIC))
    assert_refused_fast(v, tcp(PRIVATE))
    assert not result(v, "dns:allowed.test").startswith("ok:"), v
    assert net.internet.hits()[before:] == []

    info = sbx.get_info()
    assert info.allow_internet_access is False, info
    # The class method variant reports the same.
    assert Sandbox.get_info(sbx.sandbox_id, **net.server.opts()).allow_internet_access is False


def test_deny_out_then_update_network(net: NetEnv, make):
    sbx = make(network={"deny_out": ["198.51.100.0/24"]})
    web = tcp(PUBLIC)
    assert_refused_fast(probe(sbx, web), web)
    info = sbx.get_info()
    assert info.allow_internet_access is True, info
    assert same_targets(info.network.get("deny_out"), ["198.51.100.0/24"]), info.network
    assert not info.network.get("allow_out"), info.network

    # Allow beats deny.
    sbx.update_network({"allow_out": [PUBLIC], "deny_out": ["198.51.100.0/24"]})
    v = probe(sbx, web)
    assert result(v, web).startswith("ok:HTTP/1.0 200"), v
    info = sbx.get_info()
    assert same_targets(info.network.get("allow_out"), [PUBLIC]), info.network
    assert same_targets(info.network.get("deny_out"), ["198.51.100.0/24"]), info.network

    # Everything open again: omitted fields are cleared.
    sbx.update_network({})
    v = probe(sbx, web, http(PUBLIC))
    assert_ok(v, http(PUBLIC), f"public host={PUBLIC}")
    info = sbx.get_info()
    assert not info.network.get("allow_out") and not info.network.get("deny_out"), info.network

    # No internet at all (the SDK sends `allow_internet_access` in the body).
    sbx.update_network({"allow_internet_access": False})
    v = probe(sbx, web)
    assert_refused_fast(v, web)
    assert sbx.get_info().allow_internet_access is False

    # And open again.
    Sandbox.update_network(sbx.sandbox_id, {}, **net.server.opts())
    v = probe(sbx, http(PUBLIC))
    assert_ok(v, http(PUBLIC), f"public host={PUBLIC}")
    assert sbx.get_info().allow_internet_access is True
    assert net.internet.hits_to(PRIVATE, METADATA) == []


def test_a_domain_allow_list_resolves_names_itself(net: NetEnv, make):
    sbx = make(network={"allow_out": ["allowed.test"], "deny_out": [ALL_TRAFFIC]})
    info = sbx.get_info()
    assert same_targets(info.network.get("allow_out"), ["allowed.test"]), info.network
    assert same_targets(info.network.get("deny_out"), [ALL_TRAFFIC]), info.network

    v = probe(sbx, http("allowed.test"), http("other.test"), http(PUBLIC), tcp(PRIVATE))
    assert_ok(v, http("allowed.test"), "public host=allowed.test")
    # Same address, a name that is not allowed; the bare address is not a name.
    assert_refused_fast(v, http("other.test"))
    assert_refused_fast(v, http(PUBLIC))
    assert_refused_fast(v, tcp(PRIVATE))
    assert not [h for h in net.internet.hits() if h["host"] == "other.test"], net.internet.hits()
    wait_denial(net, sbx.sandbox_id, host="other.test", reason="policy")

    # /etc/hosts inside points allowed.test at the private target: the request still reaches
    # the real server, the private one sees nothing.
    sbx.commands.run(f"echo '{PRIVATE} allowed.test' >> /etc/hosts", user="root")
    v = probe(sbx, "dns:allowed.test", http("allowed.test"))
    assert_ok(v, "dns:allowed.test", PRIVATE)
    assert_ok(v, http("allowed.test"), "public host=allowed.test")
    assert net.internet.hits_to(PRIVATE, METADATA) == []


def test_the_denial_log_lists_refused_connections(net: NetEnv, make):
    sbx = make()
    v = probe(sbx, tcp(PRIVATE), tcp(METADATA))
    assert_refused_fast(v, tcp(PRIVATE))
    log = wait_denial(net, sbx.sandbox_id, address=PRIVATE, port=80, protocol="tcp", reason="always denied")
    wait_denial(net, sbx.sandbox_id, address=METADATA, port=80, protocol="tcp", reason="always denied")
    assert all(d.get("reason") for d in log), log

    # E2B's logs endpoint, parsed with the SDK's own model.
    r = http_request(net.server.port, "GET", f"/sandboxes/{sbx.sandbox_id}/logs", {"X-API-Key": net.server.admin_key})
    assert r.status == 200, r.text
    logs = SandboxLogs.from_dict(r.json())
    assert any(f"{PRIVATE}:80" in l.line and "always denied" in l.line for l in logs.logs), r.text
    assert any(f"{PRIVATE}:80" in e.message for e in logs.log_entries), r.text

    # Another team sees nothing of it.
    other = net.server.create_key("net-other")
    assert denials(net, sbx.sandbox_id, api_key=other).status == 404
    # Nor does a request without a key.
    assert http_request(net.server.port, "GET", f"/husk/v1/sandboxes/{sbx.sandbox_id}/denials").status == 401


@pytest.mark.asyncio
async def test_async_domains_by_callable_and_update_network(net: NetEnv):
    sbx = await AsyncSandbox.create(
        timeout=120,
        network={"allow_out": ["allowed.test"], "deny_out": lambda ctx: [ctx.all_traffic]},
        **net.server.opts(),
    )
    try:
        info = await sbx.get_info()
        assert same_targets(info.network.get("allow_out"), ["allowed.test"]), info.network

        v = await aprobe(sbx, http("allowed.test"), http("other.test"))
        assert_ok(v, http("allowed.test"), "public host=allowed.test")
        assert_refused_fast(v, http("other.test"))

        # Swap the names.
        await sbx.update_network({"allow_out": ["other.test"], "deny_out": lambda ctx: [ctx.all_traffic]})
        v = await aprobe(sbx, http("allowed.test"), http("other.test"))
        assert_ok(v, http("other.test"), "public host=other.test")
        assert_refused_fast(v, http("allowed.test"))

        # No internet, through the class method variant.
        await AsyncSandbox.update_network(sbx.sandbox_id, {"allow_internet_access": False}, **net.server.opts())
        v = await aprobe(sbx, http("other.test"), tcp(PUBLIC))
        assert_refused_fast(v, http("other.test"))
        assert_refused_fast(v, tcp(PUBLIC))
        assert (await sbx.get_info()).allow_internet_access is False
        assert net.internet.hits_to(PRIVATE, METADATA) == []
    finally:
        await AsyncSandbox.kill(sbx.sandbox_id, **net.server.opts())


# --------------------------------------------------------------------------------------------
# Header rules (`network.rules`) with secrets

# Runs in the sandbox as root: `python3 rules_search.py SECRET_HEX CONTROL_HEX SINCE`. Starts a
# fresh Python (exec: none of this process's memory) that makes the HTTPS and HTTP requests with
# CONTROL in its environment, in /tmp/husk-control.txt and in a variable, then waits; searches
# that process's memory (a child: readable), every process's environment it may read, and every
# file outside /proc and /sys written since SINCE (a Unix time from before the sandbox was
# created: only files written in its life can hold what it got) for both values; prints one
# JSON object. The values come in hex, so that no command line holds them.
RULES_SEARCH = r"""
import json, os, stat, subprocess, sys
secret, control = (bytes.fromhex(a) for a in sys.argv[1:3])
since = float(sys.argv[3])
REQUESTER = '''
import os, ssl, sys, urllib.request
held = os.environ["HUSK_CONTROL"] + " held"
open("/tmp/husk-control.txt", "w").write(os.environ["HUSK_CONTROL"])
out = []
for url in ("https://allowed.test/tls", "http://allowed.test/plain"):
    req = urllib.request.Request(url, headers={"Authorization": "Bearer from-the-sandbox"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            out.append("%d:%s" % (r.status, r.read().decode()))
    except Exception as e:
        out.append("error:%r" % (e,))
print("|".join(out), flush=True)
sys.stdin.read()
'''
child = subprocess.Popen([sys.executable, "-c", REQUESTER], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True,
                         env={**os.environ, "HUSK_CONTROL": control.decode()})
answers = child.stdout.readline().strip()
found = {"secret": [], "control": []}
stats = {"files_seen": 0, "files_read": 0, "mem_bytes": 0, "environs": 0}
def check(where, data):
    for name, needle in (("secret", secret), ("control", control)):
        if needle in data:
            found[name].append(where)
try:
    maps = open(f"/proc/{child.pid}/maps").read().splitlines()
    with open(f"/proc/{child.pid}/mem", "rb", 0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            if "r" not in perms:
                continue
            lo, hi = (int(x, 16) for x in addr.split("-"))
            try:
                mem.seek(lo)
                data = mem.read(hi - lo)
            except (OSError, ValueError, OverflowError):
                continue
            stats["mem_bytes"] += len(data)
            check("memory of the requesting process", data)
except OSError as e:
    found["mem_error"] = repr(e)
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    try:
        data = open(f"/proc/{pid}/environ", "rb").read()
    except OSError:
        continue
    stats["environs"] += 1
    check(f"/proc/{pid}/environ", data)
for top in os.listdir("/"):
    if top in ("proc", "sys"):
        continue
    for root, dirs, files in os.walk("/" + top):
        for f in files:
            p = os.path.join(root, f)
            try:
                st = os.lstat(p)
                stats["files_seen"] += 1
                if not stat.S_ISREG(st.st_mode) or max(st.st_ctime, st.st_mtime) < since:
                    continue
                data = open(p, "rb").read(64 << 20)
            except OSError:
                continue
            stats["files_read"] += 1
            check(p, data)
child.stdin.close()
child.wait(timeout=10)
print(json.dumps({"answers": answers, "found": found, "stats": stats}))
"""


def _rules(host: str, value: str) -> dict:
    return {host: [{"transform": {"headers": {"Authorization": value}}}]}


def _secret(net: NetEnv, value: str, api_key=None) -> str:
    name = "net-key-" + os.urandom(4).hex()
    Secret.create(name=name, value=value, **net.server.opts(api_key=api_key))
    return name


def _hits_since(net: NetEnv, before: int) -> List[dict]:
    return net.internet.hits()[before:]


def test_a_header_rule_sends_a_secret_that_never_enters_the_sandbox(net: NetEnv, make):
    secret = "sk-husk-" + os.urandom(12).hex()
    control = "ctl-husk-" + os.urandom(12).hex()
    name = _secret(net, secret)
    before = len(net.internet.hits())
    since = time.time() - 2
    sbx = make(
        network={
            "allow_out": ["allowed.test"],
            "deny_out": [ALL_TRAFFIC],
            "rules": _rules("allowed.test", f"Bearer {Secret.fill(name)}"),
        }
    )
    # The sandbox's info shows the placeholder, never the value.
    info = sbx.get_info()
    assert info.network["rules"] == _rules("allowed.test", "Bearer ${e2b.secrets." + name + "}"), info.network

    sbx.files.write("/tmp/rules_search.py", RULES_SEARCH)
    out = sbx.commands.run(
        f"python3 /tmp/rules_search.py {secret.encode().hex()} {control.encode().hex()} {since}",
        user="root",
        timeout=120,
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    # Both requests went through, verified by the sandbox's own TLS stack (its trust store
    # has the sandbox's CA), and the server got the secret in place of the sandbox's header.
    assert report["answers"] == "200:public host=allowed.test|200:public host=allowed.test", report
    got = [(h["to"], h["authorization"], h["tls"]) for h in _hits_since(net, before)]
    assert got == [
        (f"{PUBLIC}:443", f"Bearer {secret}", True),
        (f"{PUBLIC}:80", f"Bearer {secret}", False),
    ], got
    # The search works (it finds the control in the process's environment, memory and file),
    # and the secret is nowhere.
    found, stats = report["found"], report["stats"]
    assert "memory of the requesting process" in found["control"], report
    assert "/tmp/husk-control.txt" in found["control"], report
    assert any(w.endswith("/environ") for w in found["control"]), report
    assert found["secret"] == [], report
    assert stats["mem_bytes"] > 1 << 20 and stats["files_seen"] > 1000, stats
    # What the sandbox's creation wrote was read (its /etc files and trust store among them).
    # Other commands' environments are closed to this one (Landlock domains): its child's is
    # the one read.
    assert stats["files_read"] >= 5 and stats["environs"] >= 1, stats
    assert secret not in out.stdout and secret not in out.stderr
    # Nor in any process's environment as the sandbox's user sees it; the TLS libraries are
    # pointed at the bundle with the sandbox's CA.
    env = sbx.commands.run("cat /proc/self/environ | tr '\\0' '\\n'").stdout
    assert secret not in env
    assert "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt" in env, env


def test_header_rules_are_per_host_change_with_update_network_and_open_nothing(net: NetEnv, make):
    first, second = "sk-first-" + os.urandom(6).hex(), "sk-second-" + os.urandom(6).hex()
    n1, n2 = _secret(net, first), _secret(net, second)
    sbx = make(network={"rules": _rules("*.test", f"Bearer {Secret.fill(n1)}")})
    get = (
        "import ssl, sys, urllib.request\n"
        "ctx = ssl._create_unverified_context() if len(sys.argv) > 2 else None\n"
        "with urllib.request.urlopen(sys.argv[1], timeout=10, context=ctx) as r:\n"
        "    print(r.status, r.read().decode())\n"
    )
    sbx.files.write("/tmp/get.py", get)

    def fetch(url: str, unverified: bool = False) -> dict:
        before = len(net.internet.hits())
        r = sbx.commands.run(f"python3 /tmp/get.py {url}{' x' if unverified else ''}", timeout=60)
        assert r.stdout.startswith("200 public host="), r
        hits = _hits_since(net, before)
        assert len(hits) == 1, hits
        return hits[0]

    # A wildcard rule: both names, over TLS and plain HTTP; the default internet policy.
    assert fetch("https://other.test/")["authorization"] == f"Bearer {first}"
    assert fetch("http://allowed.test/")["authorization"] == f"Bearer {first}"
    # An address is not a name a rule matches: straight to the server (whose CA the sandbox
    # does not trust).
    assert fetch(f"https://{PUBLIC}/", unverified=True)["authorization"] is None

    # An exact rule beats the wildcard; a host without a rule is not intercepted.
    sbx.update_network(
        {"rules": {**_rules("*.allowed.test", "x"), **_rules("allowed.test", f"Bearer {Secret.fill(n2)}")}}
    )
    assert fetch("https://allowed.test/")["authorization"] == f"Bearer {second}"
    assert fetch("https://other.test/", unverified=True)["authorization"] is None
    assert sbx.get_info().network["rules"]["allowed.test"] == [
        {"transform": {"headers": {"Authorization": "Bearer ${e2b.secrets." + n2 + "}"}}}
    ]

    # Rules open nothing: the policy refuses other.test whatever the rules say.
    sbx.update_network(
        {
            "allow_out": ["allowed.test"],
            "deny_out": [ALL_TRAFFIC],
            "rules": _rules("other.test", f"Bearer {Secret.fill(n1)}"),
        }
    )
    before = len(net.internet.hits())
    v = probe(sbx, "http:https://other.test/", http("other.test"))
    assert_refused_fast(v, "http:https://other.test/")
    assert_refused_fast(v, http("other.test"))
    assert _hits_since(net, before) == []
    wait_denial(net, sbx.sandbox_id, host="other.test", reason="policy")

    # Cleared: omitted fields are cleared, rules too.
    sbx.update_network({})
    assert fetch("https://allowed.test/", unverified=True)["authorization"] is None
    assert not sbx.get_info().network.get("rules"), sbx.get_info().network


def test_wrong_header_rules_are_refused_with_the_reason(net: NetEnv, make):
    opts = net.server.opts()
    for rules, why in [
        (_rules("allowed.test", "Bearer ${e2b.secrets.no-such-secret}"), "no-such-secret"),
        (_rules("allowed.test", "${e2b.identity.tokens.aws}"), "not supported by husk"),
        (_rules("10.0.0.1", "x"), "not a host name"),
        ({"allowed.test": [{"transform": {"headers": {"Host": "evil.test"}}}]}, "belongs to the proxy"),
    ]:
        with pytest.raises(Exception) as e:
            Sandbox.create(network={"rules": rules}, timeout=60, **opts)
        assert why in str(e.value), (rules, e.value)
    # Another team's secret is no secret of this one.
    name = _secret(net, "sk-other-" + os.urandom(6).hex())
    other = net.server.create_key("rules-other")
    with pytest.raises(Exception) as e:
        Sandbox.create(
            network={"rules": _rules("allowed.test", Secret.fill(name))},
            timeout=60,
            **net.server.opts(api_key=other),
        )
    assert name in str(e.value), e.value
    # A sandbox created without rules has no CA in its trust store: rules cannot be added.
    sbx = make()
    with pytest.raises(Exception) as e:
        sbx.update_network({"rules": _rules("allowed.test", "x")})
    assert "created with network.rules" in str(e.value), e.value
    assert sbx.get_info().network.get("rules") in (None, {}), sbx.get_info().network


@pytest.mark.asyncio
async def test_async_header_rules_on_create_and_update(net: NetEnv):
    secret = "sk-async-" + os.urandom(10).hex()
    name = "net-key-" + os.urandom(4).hex()
    await AsyncSecret.create(name=name, value=secret, **net.server.opts())
    sbx = await AsyncSandbox.create(
        timeout=120,
        network={"rules": _rules("allowed.test", f"Bearer {AsyncSecret.fill(name)}")},
        **net.server.opts(),
    )
    try:
        cmd = "curl -sS https://allowed.test/async"
        before = len(net.internet.hits())
        r = await sbx.commands.run(cmd, timeout=60)
        assert r.stdout == "public host=allowed.test", r
        assert [h["authorization"] for h in _hits_since(net, before)] == [f"Bearer {secret}"]
        info = await sbx.get_info()
        assert info.network["rules"] == _rules("allowed.test", "Bearer ${e2b.secrets." + name + "}"), info.network
        # Cleared through the class method variant: curl now meets the server's own
        # certificate, which the sandbox does not trust.
        await AsyncSandbox.update_network(sbx.sandbox_id, {}, **net.server.opts())
        with pytest.raises(Exception) as e:
            await sbx.commands.run(cmd, timeout=60)
        assert "certificate" in str(e.value), e.value
    finally:
        await AsyncSandbox.kill(sbx.sandbox_id, **net.server.opts())
