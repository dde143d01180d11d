"""A private PostgreSQL server for the tests that run husk on a shared database: Debian's
binaries, a fresh data directory, trust authentication for the superuser `husk`, and a free
port on 127.0.0.1 (never a fixed one: other workloads listen on this machine's loopback).

PostgreSQL refuses to run as root, so the server runs as the `postgres` user (the Debian
package's). It dies with the test process (PR_SET_PDEATHSIG, set after the uid change, which
would clear it), close() removes its directory, and the next run removes the directory of a
test process that was killed before it could."""

from __future__ import annotations

import atexit
import ctypes
import glob
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

_counter = itertools.count()
# Servers' directories are named for the test process, so that one killed before its close()
# (SIGKILL) leaves a directory the next run recognises as stale and removes.
DIR_PREFIX = "husk-pg-compat-"


def _sweep_stale_dirs() -> None:
    for d in Path(tempfile.gettempdir()).glob(f"{DIR_PREFIX}*-*"):
        pid = d.name[len(DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            # Its server died with its test process (PR_SET_PDEATHSIG): only files remain.
            shutil.rmtree(d, ignore_errors=True)


def pg_bin() -> Path:
    """Debian's newest PostgreSQL binaries (or $HUSK_TEST_PG_BIN)."""
    if os.environ.get("HUSK_TEST_PG_BIN"):
        return Path(os.environ["HUSK_TEST_PG_BIN"])
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if not found:
        raise RuntimeError("PostgreSQL is not installed (Debian package postgresql); scripts/test installs it")
    return Path(found[-1]).parent


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGQUIT, 0, 0, 0)  # PR_SET_PDEATHSIG; SIGQUIT: immediate shutdown


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    def __init__(self, durable: bool = False) -> None:
        # durable: every commit waits for the disk, as on a production server (the benches'
        # option); the tests' server never flushes, for speed.
        self.durable = durable
        self.bin = pg_bin()
        self.user = pwd.getpwnam("postgres")
        _sweep_stale_dirs()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-"))
        os.chown(self.dir, self.user.pw_uid, self.user.pw_gid)
        self.data = self.dir / "data"
        self.log = self.dir / "log"
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        try:
            self._run_as_postgres(
                [str(self.bin / "initdb"), "-D", str(self.data), "-U", "husk", "--auth=trust",
                 "-E", "UTF8", "--no-sync"],
            )
            for _ in range(5):
                self.port = _free_port()
                if self.start():
                    break
            else:
                raise RuntimeError(f"PostgreSQL did not start:\n{self._log_tail()}")
        except BaseException:
            self.close()
            raise
        atexit.register(self.close)

    def _run_as_postgres(self, argv) -> None:
        out = subprocess.run(argv, user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[],
                             capture_output=True, timeout=120, cwd=self.dir)
        if out.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {out.stderr.decode(errors='replace')}")

    def _log_tail(self) -> str:
        try:
            return self.log.read_bytes()[-3000:].decode(errors="replace")
        except OSError:
            return "<no log>"

    def _durability(self) -> list:
        if self.durable:
            return ["-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on"]
        return ["-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"]

    def start(self, timeout: float = 30) -> bool:
        """Starts the server on self.port; False if it exited (the port was taken)."""
        log = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-h", "127.0.0.1",
             "-p", str(self.port), "-k", str(self.dir), *self._durability(),
             "-c", "max_connections=300"],
            user=self.user.pw_uid, group=self.user.pw_gid, extra_groups=[],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, preexec_fn=_die_with_parent,
            cwd=self.dir,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
                capture_output=True)
            if ready.returncode == 0:
                return True
            time.sleep(0.05)
        raise RuntimeError(f"PostgreSQL not ready within {timeout}s:\n{self._log_tail()}")

    def url(self, database: str = "postgres") -> str:
        return f"postgres://husk@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        out = subprocess.run(
            [str(self.bin / "psql"), "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1",
             "-d", self.url(database), "-c", sql],
            capture_output=True, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {out.stderr.decode(errors='replace')}")
        return out.stdout.decode().strip()

    def create_database(self) -> str:
        """A new empty database; its URL."""
        name = f"husk_{os.getpid()}_{next(_counter)}"
        self.psql(f"CREATE DATABASE {name} TEMPLATE template0")
        return self.url(name)

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT) and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        if not self.start():
            raise RuntimeError(f"PostgreSQL did not restart on port {self.port}:\n{self._log_tail()}")

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


_session: Optional[PostgresServer] = None


def session_postgres() -> PostgresServer:
    """One server for the whole test process, started on first use."""
    global _session
    if _session is None:
        _session = PostgresServer()
    return _session
