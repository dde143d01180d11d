"""A husk cluster on this machine, for the tests: a private PostgreSQL (husk_postgres), N
`husk node`s with state directories of their own, and M `husk gateway`s, all on free loopback
ports, sharing one cluster token and one master key. The SDKs talk to a gateway exactly as to
`husk serve` (`opts(gateway)`)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

from husk_compat import (
    LISTEN_RE,
    HuskServer,
    _pdeathsig_term,
    http_request,
    husk_binary,
    start_server,
    wait_for,
)
from husk_postgres import PostgresServer


@dataclass
class ClusterTls:
    """TLS between a cluster's processes: the nodes serve HTTPS with one certificate for
    `name` (what a DaemonSet's nodes share), which gateways verify against `ca`; with
    `gateway_cert`, the gateways serve HTTPS to clients too."""
    ca: Path
    cert: Path
    key: Path
    name: str = "husk-node"
    gateway_cert: Optional[Path] = None
    gateway_key: Optional[Path] = None


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str = "husk-test-ca") -> Tuple[Path, Path]:
    """A CA certificate and its key (P-256), valid for a day: (ca.crt, ca.key)."""
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(key), "-out", str(crt), "-subj", f"/CN={name}", "-days", "1")
    return crt, key


def make_cert(directory: Path, ca: Tuple[Path, Path], stem: str, san: str) -> Tuple[Path, Path]:
    """A certificate signed by `ca` for `san` (e.g. DNS:husk-node or IP:127.0.0.1), and its
    key: (stem.crt, stem.key)."""
    crt, key, csr = directory / f"{stem}.crt", directory / f"{stem}.key", directory / f"{stem}.csr"
    ext = directory / f"{stem}.ext"
    ext.write_text(f"subjectAltName={san}\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={stem}")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
            "-set_serial", str(secrets.randbits(63)), "-out", str(crt), "-days", "1",
            "-extfile", str(ext))
    return crt, key


@dataclass
class Gateway:
    proc: subprocess.Popen
    port: int
    url: str
    log_path: Path

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode("utf-8", "replace")
        except OSError:
            return "<no gateway log>"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self, timeout: float = 30) -> Optional[int]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


class Cluster:
    def __init__(self, pg: PostgresServer, nodes: int = 3, gateways: int = 2,
                 node_args: tuple = (), shared_workspaces: bool = False, keep: bool = False,
                 tls: Optional[ClusterTls] = None) -> None:
        # keep: sandboxes outlive their node's process (as in production), instead of ending
        # with it (--destroy-on-exit, the tests' default).
        self.keep = keep
        self.tls = tls
        self.pg = pg
        self.bin = husk_binary()
        self.database_url = pg.create_database()
        self.dir = Path(tempfile.mkdtemp(prefix="husk-cluster-"))
        self.token_file = self.dir / "cluster-token"
        self.token_file.write_text(secrets.token_hex(32) + "\n")
        os.chmod(self.token_file, 0o600)
        self.master_key = self.dir / "master.key"
        self.node_args = node_args
        # One directory bind-mounted at every node's STATE_DIR/workspaces: what a
        # ReadWriteMany volume is to a cluster's machines.
        self.shared = self.dir / "shared-workspaces" if shared_workspaces else None
        if self.shared is not None:
            self.shared.mkdir()
        self.nodes: List[HuskServer] = []
        self.node_names: List[str] = []
        self.gateways: List[Gateway] = []
        self.admin_key: Optional[str] = None
        try:
            for i in range(nodes):
                self.add_node()
            for _ in range(gateways):
                self.add_gateway()
        except BaseException:
            self.close()
            raise

    def node_env(self, name: str) -> dict:
        env = {
            "HUSK_NODE_NAME": name,
            "HUSK_CLUSTER_TOKEN_FILE": str(self.token_file),
            "HUSK_ADVERTISE_URL": "http://127.0.0.1",
        }
        if self.tls is not None:
            env.update({
                "HUSK_ADVERTISE_URL": "https://127.0.0.1",
                "HUSK_TLS_CERT": str(self.tls.cert),
                "HUSK_TLS_KEY": str(self.tls.key),
                **self.cluster_tls_env(),
            })
        return env

    def cluster_tls_env(self) -> dict:
        """How a process verifies the nodes (a node its peers, a gateway every node)."""
        if self.tls is None:
            return {}
        return {"HUSK_CLUSTER_CA": str(self.tls.ca), "HUSK_CLUSTER_TLS_NAME": self.tls.name}

    def add_node(self) -> HuskServer:
        name = f"node-{len(self.node_names) + 1}"
        state_dir = None
        extra = ("--master-key", str(self.master_key), *self.node_args)
        if self.shared is not None:
            state_dir = Path(tempfile.mkdtemp(prefix="husk-compat-py-"))
            (state_dir / "workspaces").mkdir()
            subprocess.run(["mount", "--bind", str(self.shared), str(state_dir / "workspaces")],
                           check=True)
            extra = (*extra, "--shared-workspaces")
        node = start_server(
            command="node",
            database_url=self.database_url,
            env_extra=self.node_env(name),
            extra_args=extra,
            admin_key=self.admin_key,
            state_dir=state_dir,
            keep=self.keep,
        )
        # The first node on a fresh database makes the admin key; the others find keys.
        self.admin_key = self.admin_key or node.admin_key
        self.nodes.append(node)
        self.node_names.append(name)
        return node

    def restart_node(self, index: int) -> HuskServer:
        """Starts node `index` again on its state directory (after it stopped or was killed)."""
        old = self.nodes[index]
        extra = ("--master-key", str(self.master_key), *self.node_args)
        if self.shared is not None:
            extra = (*extra, "--shared-workspaces")
        node = start_server(
            command="node",
            database_url=self.database_url,
            env_extra=self.node_env(self.node_names[index]),
            extra_args=extra,
            admin_key=self.admin_key,
            state_dir=old.state_dir,
            keep=self.keep,
        )
        self.nodes[index] = node
        return node

    def add_gateway(self, env_extra: Optional[dict] = None, serve_tls: bool = True) -> Gateway:
        log_path = self.dir / f"gateway-{len(self.gateways) + 1}.log"
        env = dict(os.environ)
        env["HUSK_DATABASE_URL"] = self.database_url
        env["HUSK_CLUSTER_TOKEN_FILE"] = str(self.token_file)
        env.update(self.cluster_tls_env())
        if serve_tls and self.tls is not None and self.tls.gateway_cert is not None:
            env["HUSK_TLS_CERT"] = str(self.tls.gateway_cert)
            env["HUSK_TLS_KEY"] = str(self.tls.gateway_key)
        env.update(env_extra or {})
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [str(self.bin), "gateway", "--listen", "127.0.0.1:0"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                preexec_fn=_pdeathsig_term,
            )

        def listening() -> Optional[int]:
            m = LISTEN_RE.search(log_path.read_bytes())
            if m:
                return int(m.group(1))
            if proc.poll() is not None:
                raise RuntimeError(f"husk gateway exited with {proc.returncode}:\n"
                                   + log_path.read_bytes()[-3000:].decode(errors="replace"))
            return None

        try:
            port = wait_for(listening, 30, "husk gateway to log 'listening on'", 0.05)
        except BaseException:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            raise
        scheme = "https" if b"listening on https://" in log_path.read_bytes() else "http"
        gw = Gateway(proc=proc, port=port, url=f"{scheme}://127.0.0.1:{port}", log_path=log_path)
        self.gateways.append(gw)
        return gw

    def opts(self, gateway: int = 0, api_key: Optional[str] = None, **extra) -> dict:
        """SDK connection kwargs for a gateway."""
        url = self.gateways[gateway].url
        return dict(api_url=url, sandbox_url=url, api_key=api_key or self.admin_key,
                    request_timeout=30, **extra)

    def client_tls(self, gateway: int = 0) -> Optional[ssl.SSLContext]:
        """What a client verifies a gateway serving HTTPS with (None: plain HTTP)."""
        if not self.gateways[gateway].url.startswith("https://"):
            return None
        return ssl.create_default_context(cafile=str(self.tls.ca))

    def nodes_listed(self, gateway: int = 0) -> list:
        """GET /husk/v1/cluster/nodes (admin)."""
        resp = http_request(self.gateways[gateway].port, "GET", "/husk/v1/cluster/nodes",
                            headers={"X-API-Key": self.admin_key}, tls=self.client_tls(gateway))
        assert resp.status == 200, (resp.status, resp.body)
        return resp.json()

    def code_of(self, node_index: int) -> str:
        name = self.node_names[node_index]
        return next(n["code"] for n in self.nodes_listed() if n["name"] == name)

    def husk(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        """A `husk` CLI command on the cluster's database."""
        env = dict(os.environ)
        env["HUSK_DATABASE_URL"] = self.database_url
        env["HUSK_NODE_NAME"] = "cli"
        out = subprocess.run([str(self.bin), *args], capture_output=True, timeout=timeout, env=env)
        if check and out.returncode != 0:
            raise RuntimeError(f"husk {' '.join(args)} failed: {out.stderr.decode(errors='replace')}")
        return out

    def psql(self, sql: str) -> str:
        """SQL on the cluster's database (as an operator would, by hand)."""
        return self.pg.psql(sql, self.database_url.rsplit("/", 1)[1])

    def create_key(self, team: str) -> str:
        return self.husk("key", "create", "--team", team).stdout.decode().strip()

    def set_quota(self, team: str, limit: int) -> None:
        self.husk("key", "quota", "--team", team, str(limit))

    def logs(self) -> str:
        parts = [f"--- gateway {i + 1}\n{g.log_tail(2000)}" for i, g in enumerate(self.gateways)]
        parts += [f"--- {self.node_names[i]}\n{n.log_tail(2000)}" for i, n in enumerate(self.nodes)]
        return "\n".join(parts)

    def close(self) -> None:
        for gw in self.gateways:
            gw.stop()
        for node in self.nodes:
            try:
                node.close()
            except Exception:  # noqa: BLE001 - closing the rest matters more
                pass
        shutil.rmtree(self.dir, ignore_errors=True)
