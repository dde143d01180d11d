"""Helpers shared by husk's Python compatibility tests: starting `husk serve`, polling with a
deadline, and plain-HTTP access to the server for the tests that look below the SDK."""

from __future__ import annotations

import asyncio
import ctypes
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_BIN = REPO_ROOT / "target" / "x86_64-unknown-linux-gnu" / "debug" / "husk"
# `https` when the listener has a certificate (--tls-cert).
LISTEN_RE = re.compile(rb"listening on https?://127\.0\.0\.1:(\d+)")
KEY_RE = re.compile(r"^e2b_[0-9a-f]{40}$")
ENVD_PORT = 49983
JUPYTER_PORT = 49999
# husk's preset templates (templates/README.md), and the layer cache the tests share with the
# cargo tests (crates/husk/tests/common/templates.rs): layers are keyed by content, so a
# machine bootstraps Debian once.
PRESETS_DIR = REPO_ROOT / "templates"
# The presets a code-interpreter server needs, in build order.
CODE_INTERPRETER_PRESETS = ("base", "code-interpreter")
LAYER_CACHE = "/var/tmp/husk-test-layers"

T = TypeVar("T")

# HUSK_COMPAT_STORE=postgres: every server keeps its state in a database of its own on a
# private PostgreSQL server (husk_postgres) instead of its state dir's SQLite file; a restart
# on the same state dir reuses its database. The node name the servers use there.
COMPAT_NODE = "compat"
_databases: Dict[Path, str] = {}


def _database_for(state_dir: Path) -> Optional[str]:
    if os.environ.get("HUSK_COMPAT_STORE", "sqlite") != "postgres":
        return None
    if state_dir not in _databases:
        from husk_postgres import session_postgres
        _databases[state_dir] = session_postgres().create_database()
    return _databases[state_dir]


class Deadline(Exception):
    pass


def sdk_in_process(code: str, env: Dict[str, str], args: Optional[dict] = None,
                   timeout: float = 600) -> dict:
    """Runs `code` with the stock SDK in a Python process of its own, with `env` added to the
    environment from its start, as a user's program runs. The SDK's HTTP client reads the CA
    certificates (SSL_CERT_FILE) once per process, so a test that trusts a CA of its own cannot
    set it in the test process. `code` reads its inputs from `args` and sets `result` (a dict,
    returned)."""
    prelude = (
        "import json, os, sys\n"
        "from e2b import Sandbox\n"
        "args = json.loads(os.environ['HUSK_SDK_ARGS'])\n"
        "result = {}\n"
    )
    epilogue = "\nprint('HUSK-SDK-RESULT ' + json.dumps(result))\n"
    full = dict(os.environ, **env, HUSK_SDK_ARGS=json.dumps(args or {}))
    out = subprocess.run([sys.executable, "-c", prelude + code + epilogue], env=full,
                         capture_output=True, timeout=timeout)
    text = out.stdout.decode(errors="replace")
    for line in text.splitlines():
        if line.startswith("HUSK-SDK-RESULT "):
            return json.loads(line[len("HUSK-SDK-RESULT "):])
    raise AssertionError(f"the SDK process failed ({out.returncode}):\n{text[-3000:]}\n"
                         + out.stderr.decode(errors="replace")[-6000:])


def wait_for(
    check: Callable[[], Optional[T]],
    timeout: float,
    what: str,
    interval: float = 0.1,
) -> T:
    """Calls `check` until it returns something truthy (returned) or `timeout` seconds pass
    (raises with `what`). Exceptions from `check` propagate."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= end:
            raise Deadline(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


async def await_for(check, timeout: float, what: str, interval: float = 0.1):
    """Async twin of husk_compat.wait_for: awaits `check()` until truthy or the deadline."""
    end = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() >= end:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(interval)


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


# --------------------------------------------------------------------------------------------
# The server


def _pdeathsig_term() -> None:
    """Runs in the child before exec: if the test process dies without stopping the server
    (e.g. pytest-timeout ends the run), the kernel sends the server SIGTERM, so it still
    cleans up its sandboxes."""
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


@dataclass
class HuskServer:
    """A running `husk serve` on 127.0.0.1 with a fresh state directory."""

    bin: Path
    state_dir: Path
    url: str
    port: int
    admin_key: str
    proc: subprocess.Popen
    log_path: Path
    extra_keys: Dict[str, str] = field(default_factory=dict)
    # The PostgreSQL database the server keeps its state in (None: the state dir's SQLite).
    database_url: Optional[str] = None

    def store_env(self) -> dict:
        """The environment for a `husk` command on this server's database."""
        env = dict(os.environ)
        env.pop("HUSK_DATABASE_URL", None)
        if self.database_url:
            env["HUSK_DATABASE_URL"] = self.database_url
            env["HUSK_NODE_NAME"] = COMPAT_NODE
        return env

    def opts(self, api_key: Optional[str] = None, **extra) -> dict:
        """Per-call SDK connection kwargs pointing at this server."""
        return dict(
            api_url=self.url,
            sandbox_url=self.url,
            api_key=api_key or self.admin_key,
            request_timeout=30,
            **extra,
        )

    def log_tail(self, n: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "<no server log>"
        return data[-n:].decode("utf-8", "replace")

    def create_key(self, team: str) -> str:
        """`husk key create --team NAME`: a key of another team (cached per team)."""
        if team in self.extra_keys:
            return self.extra_keys[team]
        out = subprocess.run(
            [str(self.bin), "key", "create", "--team", team, "--state-dir", str(self.state_dir)],
            capture_output=True,
            timeout=30,
            env=self.store_env(),
        )
        if out.returncode != 0:
            raise RuntimeError(
                f"husk key create failed ({out.returncode}): {out.stderr.decode(errors='replace')}"
            )
        key = out.stdout.decode().strip()
        if not KEY_RE.match(key):
            raise RuntimeError(f"husk key create printed {key!r}, not a key e2b_<40 hex>")
        self.extra_keys[team] = key
        return key

    def set_quota(self, team: str, limit: int) -> None:
        """`husk key quota --team NAME MAX`."""
        subprocess.run(
            [str(self.bin), "key", "quota", "--team", team, str(limit), "--state-dir", str(self.state_dir)],
            check=True,
            capture_output=True,
            timeout=30,
            env=self.store_env(),
        )

    def stop(self, timeout: float = 60) -> Optional[int]:
        """SIGTERM, then wait for the exit (the server kills its sandboxes first)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
                raise RuntimeError(
                    f"husk serve did not exit within {timeout:.0f}s of SIGTERM; killed it"
                )
        return self.proc.returncode

    def close(self) -> Tuple[Optional[int], str]:
        """stop(), then remove the state dir and the log. Returns (exit code, log tail)."""
        try:
            rc = self.stop()
        finally:
            tail = self.log_tail()
            remove_state_dir(self.state_dir)
            try:
                self.log_path.unlink()
            except OSError:
                pass
        return rc, tail


def build_template(server: "HuskServer", spec: Path, name: Optional[str] = None,
                   timeout: float = 900) -> str:
    """`husk template build SPEC [--name NAME]` into the server's state directory (with the
    shared layer cache), next to the running server. Returns the CLI's last line (name, size,
    build time); raises with the build's output if it fails."""
    args = [str(server.bin), "template", "build", str(spec), "--quiet",
            "--state-dir", str(server.state_dir), "--layer-cache", LAYER_CACHE]
    if name:
        args += ["--name", name]
    out = subprocess.run(args, capture_output=True, timeout=timeout, env=server.store_env())
    text = (out.stdout + out.stderr).decode(errors="replace").strip()
    if out.returncode != 0:
        raise RuntimeError(f"husk template build {spec} failed ({out.returncode}):\n{text[-4000:]}")
    return text.splitlines()[-1] if text else ""


def remove_template(server: "HuskServer", name: str) -> None:
    """`husk template rm NAME` (best effort: used in teardown)."""
    subprocess.run([str(server.bin), "template", "rm", name, "--state-dir", str(server.state_dir)],
                   capture_output=True, timeout=60, env=server.store_env())


def husk_binary() -> Path:
    path = Path(os.environ.get("HUSK_BIN") or DEFAULT_BIN)
    if not path.is_file() or not os.access(path, os.X_OK):
        raise RuntimeError(f"husk binary not found at {path}: build husk first: cargo build")
    return path


def unmount_beneath(directory: Path) -> None:
    """Lazily unmounts whatever is mounted at or beneath `directory`, deepest first: a
    server's workspace file systems stay mounted after it stops (by design), and a state dir
    cannot be removed (or would leave mounts behind) while they are."""
    prefix = str(directory)
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    points = [f[4] for f in (line.split(" ") for line in lines) if len(f) > 4]
    mine = [p for p in points if p == prefix or p.startswith(prefix + "/")]
    for point in sorted(mine, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def children(pid: int) -> List[int]:
    """The children of process `pid` (of all its threads); none if it is gone."""
    out: List[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(p) for p in task.read_text().split()]
        except OSError:
            pass
    return out


def start_time(pid: int) -> Optional[int]:
    """Field 22 of /proc/PID/stat (the process' start time, in clock ticks since boot): a pid
    with its start time names one process for good."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[19])


def kill_kept(directory: Path) -> None:
    """Kills PID 1 of every sandbox kept for a server on `directory` (their owner, in the
    registry's keep lines, see husk_runtime::keep), so that a test that failed half-way leaves
    no sandbox running once its state dir is gone; the next husk start reaps the rest."""
    try:
        owner = os.path.realpath(directory).encode().hex()
        entries = list(Path("/run/husk/sandboxes").iterdir())
    except OSError:
        return
    for entry in entries:
        try:
            lines = entry.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            f = line.split(" ")
            # keep <owner hex> <id> <pid> <start time> <send fd> <layer fd>
            if len(f) != 7 or f[0] != "keep" or f[1] != owner:
                continue
            try:
                if start_time(int(f[3])) == int(f[4]):
                    os.kill(int(f[3]), signal.SIGKILL)
            except (OSError, ValueError):
                pass


def remove_state_dir(directory: Path) -> None:
    """Kills the sandboxes kept for it, unmounts what a server left mounted in its state dir,
    then removes it."""
    kill_kept(directory)
    unmount_beneath(directory)
    shutil.rmtree(directory, ignore_errors=True)


def start_server(
    startup_timeout: float = 30,
    extra_args: Tuple[str, ...] = (),
    state_dir: Optional[Path] = None,
    keep: bool = False,
    database_url: Optional[str] = None,
    command: str = "serve",
    env_extra: Optional[Dict[str, str]] = None,
    admin_key: Optional[str] = None,
) -> HuskServer:
    """A new server; with `state_dir`, on an earlier server's state (a restart), which the
    returned server's close() removes as its own. Its sandboxes end when it stops
    (`--destroy-on-exit`), unless `keep`: then they outlive it, as by default, for the next
    server on the same state directory to take up. With `database_url`, its state is in that
    PostgreSQL database (else see HUSK_COMPAT_STORE). `command` is `serve` or `node` (a
    cluster's node, with `env_extra` naming it); `admin_key`: the key to use when the server
    makes none (a database that has keys already)."""
    binary = husk_binary()
    if not keep:
        extra_args = (*extra_args, "--destroy-on-exit")
    # No sandbox egress unless the caller sets one up (never the host's routing in tests).
    if not any(a.startswith("--egress") for a in extra_args):
        extra_args = (*extra_args, "--egress", "off")
    if state_dir is None:
        state_dir = Path(tempfile.mkdtemp(prefix="husk-compat-py-"))
    log_path = state_dir.parent / f"{state_dir.name}.log"
    database_url = database_url or _database_for(state_dir)
    env = dict(os.environ)
    env.pop("HUSK_DATABASE_URL", None)
    if database_url:
        env["HUSK_DATABASE_URL"] = database_url
        env["HUSK_NODE_NAME"] = COMPAT_NODE
    env.update(env_extra or {})
    log = open(log_path, "wb")
    try:
        proc = subprocess.Popen(
            [str(binary), command, "--listen", "127.0.0.1:0", "--state-dir", str(state_dir), *extra_args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=_pdeathsig_term,
            env=env,
        )
    except BaseException:
        log.close()
        remove_state_dir(state_dir)
        log_path.unlink(missing_ok=True)
        raise
    log.close()

    def listening() -> Optional[int]:
        m = LISTEN_RE.search(log_path.read_bytes())
        if m:
            return int(m.group(1))
        if proc.poll() is not None:
            raise RuntimeError(
                f"husk {command} exited with {proc.returncode} before listening:\n"
                + log_path.read_bytes()[-4000:].decode("utf-8", "replace")
            )
        return None

    try:
        port = wait_for(listening, startup_timeout, f"husk {command} to log 'listening on'", 0.05)
        if admin_key is None:
            key_file = state_dir / "admin.key"
            wait_for(lambda: key_file.is_file() and key_file.read_text().strip(), 10, "admin.key")
            admin_key = key_file.read_text().strip()
        if not KEY_RE.match(admin_key):
            raise RuntimeError(f"admin.key holds {admin_key!r}, not e2b_<40 hex>")
    except BaseException:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        remove_state_dir(state_dir)
        # What the log said is in the exception (the server's last lines); nothing stays.
        log_path.unlink(missing_ok=True)
        raise
    return HuskServer(
        bin=binary,
        state_dir=state_dir,
        url=("https" if b"listening on https://" in log_path.read_bytes() else "http")
        + f"://127.0.0.1:{port}",
        port=port,
        admin_key=admin_key,
        proc=proc,
        log_path=log_path,
        database_url=database_url,
    )


# --------------------------------------------------------------------------------------------
# Plain HTTP


@dataclass
class Response:
    status: int
    headers: Dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


def http_request(
    port: int,
    method: str,
    path: str,
    headers: Optional[Dict[str, str]] = None,
    body: Optional[bytes] = None,
    timeout: float = 20,
    tls: Optional["ssl.SSLContext"] = None,
) -> Response:
    """One request to 127.0.0.1:port (over TLS with `tls`), the whole response body read."""
    if tls is not None:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Response(r.status, {k.lower(): v for k, v in r.getheaders()}, data)
    finally:
        conn.close()


def sandbox_headers(sandbox_id: str, token: Optional[str] = None, port: int = ENVD_PORT) -> dict:
    h = {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}
    if token is not None:
        h["X-Access-Token"] = token
    return h


def envelope(payload: bytes, flags: int = 0) -> bytes:
    """One Connect streaming envelope: flags (1 byte) | big-endian length (4 bytes) | payload."""
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


def parse_envelopes(data: bytes) -> list:
    """Splits a Connect streaming response body into [(flags, payload)]. Raises on a torn one."""
    out = []
    i = 0
    while i < len(data):
        if len(data) - i < 5:
            raise ValueError(f"torn envelope header at {i}: {data[i:]!r}")
        flags = data[i]
        n = int.from_bytes(data[i + 1 : i + 5], "big")
        payload = data[i + 5 : i + 5 + n]
        if len(payload) != n:
            raise ValueError(f"torn envelope at {i}: want {n} bytes, have {len(payload)}")
        out.append((flags, payload))
        i += 5 + n
    return out


def connect_stream_error(resp: Response) -> Tuple[str, str]:
    """For a streaming Connect call that must fail: returns (code, message) whether the server
    refused it with an HTTP 4xx (Connect unary-style error body) or answered 200 with an
    end-stream envelope carrying an error. Fails if the call looks successful."""
    if 400 <= resp.status < 500:
        try:
            body = resp.json()
        except ValueError:
            return (str(resp.status), resp.text)
        if isinstance(body, dict):
            return (str(body.get("code", resp.status)), str(body.get("message", "")))
        return (str(resp.status), resp.text)
    assert resp.status == 200, f"expected a 4xx or a Connect error, got {resp.status}: {resp.body[:500]!r}"
    ctype = resp.headers.get("content-type", "")
    assert ctype.startswith("application/connect+json"), f"content-type {ctype!r}"
    envs = parse_envelopes(resp.body)
    assert envs, "empty streaming response"
    flags, payload = envs[-1]
    assert flags & 0x02, f"last envelope is not end-stream: {envs!r}"
    end = json.loads(payload or b"{}")
    assert "error" in end, f"end-stream carries no error: {end!r}; all: {envs!r}"
    for flags, payload in envs[:-1]:
        msg = json.loads(payload)
        assert "start" not in json.dumps(msg), f"a process was started: {msg!r}"
    return (str(end["error"].get("code")), str(end["error"].get("message", "")))


def create_raw_sandbox(port: int, api_key: str, timeout: int = 120, metadata=None) -> dict:
    """POST /v2/sandboxes with plain HTTP; returns the JSON body (has envdAccessToken)."""
    body = {"templateID": "base", "timeout": timeout}
    if metadata:
        body["metadata"] = metadata
    r = http_request(
        port,
        "POST",
        "/v2/sandboxes",
        {"X-API-Key": api_key, "Content-Type": "application/json"},
        json.dumps(body).encode(),
    )
    assert r.status == 201, f"create: {r.status} {r.text}"
    data = r.json()
    assert data.get("sandboxID"), data
    assert data.get("envdAccessToken"), f"create returned no envdAccessToken: {data}"
    return data


def kill_raw_sandbox(port: int, api_key: str, sandbox_id: str) -> int:
    try:
        return http_request(port, "DELETE", f"/sandboxes/{sandbox_id}", {"X-API-Key": api_key}).status
    except OSError:
        return -1


def fetch_url(
    url: str, sandbox_id: Optional[str], method: str = "GET", body: Optional[bytes] = None, headers=None
):
    """Fetches a URL the SDK built (e.g. a signed file URL) with urllib, naming the sandbox with
    the routing headers of single-base-URL mode and nothing else (no access token); with no
    `sandbox_id`, not even those, as a browser or curl opens it. Returns (status, body)."""
    assert url.startswith("http://127.0.0.1:"), url
    req = urllib.request.Request(url, data=body, method=method)
    if sandbox_id is not None:
        req.add_header("E2b-Sandbox-Id", sandbox_id)
        req.add_header("E2b-Sandbox-Port", str(ENVD_PORT))
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def multipart(path: str, data: bytes):
    """A multipart/form-data body with one part named `file` whose filename is the target path
    (what envd's upload expects). Returns (body, headers)."""
    boundary = uuid.uuid4().hex
    body = (
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{path}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


# --------------------------------------------------------------------------------------------
# A ticker's file inside a sandbox


def ticks(sbx) -> List[Tuple[int, float]]:
    """[(i, epoch seconds)] of a ticker's /tmp/ticks (lines "i epoch", appended one by one),
    whole lines only ([] before the first tick)."""
    from e2b import FileNotFoundException

    try:
        text = sbx.files.read("/tmp/ticks")
    except FileNotFoundException:
        return []
    out = []
    for line in text.split("\n")[:-1]:  # the part after the last newline may be torn
        i, t = line.split(" ")
        out.append((int(i), float(t)))
    return out


def counter(sbx) -> int:
    """The ticker's last count (0 before the first tick)."""
    got = ticks(sbx)
    return got[-1][0] if got else 0


METRICS_RE = re.compile(rb"metrics on http://127\.0\.0\.1:(\d+)/metrics")


def metrics_port(server: "HuskServer") -> int:
    """The port of the server's metrics listener (`--metrics-listen 127.0.0.1:0`), from its log."""
    m = METRICS_RE.search(server.log_path.read_bytes())
    if not m:
        raise AssertionError(f"the server did not say where its metrics are:\n{server.log_tail()}")
    return int(m.group(1))


def scrape_metrics(port: int) -> dict:
    """`GET /metrics` on a metrics listener, parsed by prometheus_client's own parser (the
    format Prometheus scrapes): {family name: family}, a counter's name without `_total`."""
    from prometheus_client.parser import text_string_to_metric_families

    r = http_request(port, "GET", "/metrics")
    assert r.status == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4"), r.headers
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def metric(families: dict, family: str, sample: str, **labels) -> float:
    """The one sample `sample` of `family` with `labels`."""
    found = [
        s.value
        for s in families[family].samples
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, f"{sample}{labels}: {found} in {families[family].samples}"
    return found[0]


def pool_of(server, template: str = "base") -> dict:
    """`GET /husk/v1/pools` (the server's admin key): the figures of `template`'s warm pool."""
    r = http_request(server.port, "GET", "/husk/v1/pools", {"X-API-Key": server.admin_key})
    assert r.status == 200, r.text
    return next(p for p in r.json()["pools"] if p["template"] == template)
