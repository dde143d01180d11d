"""`husk serve` keeping its state in PostgreSQL (`--database-url`, here through
HUSK_DATABASE_URL) instead of its state directory's SQLite file, with the stock SDK
(e2b==2.63.0): the state is in the database, keys made by the CLI on the database work, and
a database that goes away makes API calls fail with a clear 503 (never a 401 that would
call the key bad), while running sandboxes keep running and nothing is lost when it is back.

The PostgreSQL server is private to this module (Debian's binaries, a free loopback port;
husk_postgres). The same SDK suites also run whole on PostgreSQL (HUSK_COMPAT_STORE=postgres
in tests/compat/run.sh)."""

from __future__ import annotations

import json
import subprocess

import pytest
from e2b import Sandbox

from husk_compat import COMPAT_NODE, http_request, start_server, wait_for
from husk_postgres import PostgresServer


@pytest.fixture(scope="module")
def pg():
    server = PostgresServer()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def served(pg):
    """A server on a fresh database of `pg`; (server, database name)."""
    url = pg.create_database()
    server = start_server(database_url=url)
    try:
        yield server, url.rsplit("/", 1)[1]
    finally:
        server.close()


def test_the_state_is_in_postgres_and_the_cli_reaches_it(served, pg):
    server, db = served
    # No SQLite file: the database is the only state store.
    assert not (server.state_dir / "husk.db").exists()
    # The admin key the server made is in the database, as a team's key made by the CLI.
    other = server.create_key("other")
    assert pg.psql("SELECT count(*) FROM keys WHERE team = 'other'", db) == "1"
    sbx = Sandbox.create(metadata={"who": "pg"}, **server.opts(api_key=other))
    try:
        row = pg.psql(
            f"SELECT node, team, metadata FROM sandboxes WHERE id = '{sbx.sandbox_id}'", db)
        node, team, metadata = row.split("|")
        assert (node, team, json.loads(metadata)) == (COMPAT_NODE, "other", {"who": "pg"})
        assert sbx.commands.run("echo hi").stdout == "hi\n"
        # Another team does not see it.
        assert [s.sandbox_id for s in Sandbox.list(**server.opts()).next_items()] == []
    finally:
        sbx.kill()
    assert pg.psql(f"SELECT count(*) FROM sandboxes WHERE id = '{sbx.sandbox_id}'", db) == "0"


def test_quota_and_secret_set_by_the_cli_hold(served, pg):
    server, db = served
    key = server.create_key("quota")
    server.set_quota("quota", 1)
    assert pg.psql("SELECT max_sandboxes FROM teams WHERE name = 'quota'", db) == "1"
    first = Sandbox.create(**server.opts(api_key=key))
    try:
        with pytest.raises(Exception, match="limit"):
            Sandbox.create(**server.opts(api_key=key))
    finally:
        first.kill()


def test_a_database_away_is_a_503_and_running_sandboxes_keep_working(served, pg):
    server, db = served
    sbx = Sandbox.create(**server.opts())
    try:
        pg.stop()
        try:
            r = http_request(
                server.port, "POST", "/v2/sandboxes",
                {"X-API-Key": server.admin_key, "Content-Type": "application/json"},
                json.dumps({"templateID": "base"}).encode(), timeout=60)
            assert r.status == 503, f"{r.status} {r.text}"
            # What the client learns: that, and when to retry; nothing of where the database
            # is (the server's log says, for the operator).
            assert r.json()["message"] == "the database is unavailable; retry shortly", r.text
            assert "127.0.0.1" not in r.text and "postgres" not in r.text, r.text
            assert r.headers.get("retry-after") == "1"
            # The running sandbox's processes and files do not need the database.
            assert sbx.commands.run("echo still here").stdout == "still here\n"
            sbx.files.write("/tmp/during", "written while the database was away")
        finally:
            pg.restart()
        # Back: the key works again at once, and nothing was lost.
        assert sbx.files.read("/tmp/during") == "written while the database was away"
        listed = wait_for(
            lambda: [s.sandbox_id for s in Sandbox.list(**server.opts()).next_items()] or None,
            30, "the sandbox listed again")
        assert listed == [sbx.sandbox_id]
        again = Sandbox.create(**server.opts())
        again.kill()
        assert pg.psql(f"SELECT count(*) FROM sandboxes WHERE id = '{sbx.sandbox_id}'", db) == "1"
    finally:
        sbx.kill()


def test_a_server_that_cannot_reach_its_database_says_so(pg, tmp_path):
    # A port nothing listens on: the server refuses to start, naming the database (never its
    # password) and why.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgres://husk:hunter2@127.0.0.1:{port}/husk"
    with pytest.raises(RuntimeError) as info:
        start_server(database_url=url, startup_timeout=60)
    message = str(info.value)
    assert f"postgres://husk:***@127.0.0.1:{port}/husk" in message, message
    assert "unavailable" in message, message
    assert "hunter2" not in message, message


def test_key_commands_on_an_unreachable_database_fail_clearly(served, pg):
    server, _ = served
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = server.store_env()
    env["HUSK_DATABASE_URL"] = f"postgres://husk:hunter2@127.0.0.1:{port}/husk"
    out = subprocess.run([str(server.bin), "key", "list"], env=env, capture_output=True,
                         timeout=60)
    assert out.returncode != 0
    err = out.stderr.decode()
    assert "unavailable" in err and "hunter2" not in err, err
