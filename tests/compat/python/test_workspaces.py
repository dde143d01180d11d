"""Workspaces as E2B volumes, through the stock SDK: `Sandbox.create(volume_mounts={path: name})`
mounts the team's workspace NAME (husk's API creates and fills it) read-only; `NAME:rw` asks for
write access; the files are the sandbox user's; a missing workspace or a bad mount path is a
clear error; another team cannot mount it.

Every test runs twice: on the session's server, which makes each sandbox fresh (the mounts are
made with its root), and on one with a warm pool of `base` (`--warm base=2`), whose creates
claim a warm sandbox and get their workspaces at the claim (mounted by the spawner into the
running sandbox); each claim is checked in `/husk/v1/pools`."""

from __future__ import annotations

import http.client
import json

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from husk_compat import pool_of, start_server, unique, wait_for


def api(husk, method: str, path: str, body: bytes = b"", key: str = "") -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", husk.port, timeout=60)
    conn.request(method, path, body=body, headers={"X-API-Key": key or husk.admin_key})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


class Server:
    """A server the module's tests run on, and whether its creates claim warm sandboxes."""

    def __init__(self, husk, warm: bool) -> None:
        self.husk = husk
        self.warm = warm

    def pool(self) -> dict:
        return pool_of(self.husk)


@pytest.fixture(scope="module", params=["fresh", "warm"])
def server(request):
    if request.param == "fresh":
        yield Server(request.getfixturevalue("husk"), False)
        return
    husk = start_server(extra_args=("--warm", "base=2"))
    try:
        yield Server(husk, True)
    finally:
        husk.close()


@pytest.fixture(scope="module")
def other_key(server) -> str:
    return server.husk.create_key("other")


@pytest.fixture
def sandbox_factory(server):
    """Creates sandboxes with the stock SDK on the module's server; on the warm one, a create
    that succeeds must have claimed a warm sandbox. Kills every one in teardown."""
    made = []

    def make(**kwargs) -> Sandbox:
        api_key = kwargs.pop("api_key", None) or server.husk.admin_key
        kwargs.setdefault("timeout", 120)
        before = None
        if server.warm:
            before = wait_for(lambda: (lambda p: p if p["ready"] >= 1 else None)(server.pool()), 60, "a warm sandbox")
        sbx = Sandbox.create(**kwargs, **server.husk.opts(api_key=api_key))
        made.append((sbx.sandbox_id, api_key))
        if before is not None:
            after = server.pool()
            assert after["claimed"] == before["claimed"] + 1, (before, after)
            assert after["claim_failed"] == 0, after
        return sbx

    yield make
    for sandbox_id, api_key in made:
        try:
            Sandbox.kill(sandbox_id, **server.husk.opts(api_key=api_key))
        except Exception:
            pass


@pytest.fixture(scope="module")
def workspace(server) -> str:
    husk = server.husk
    name = unique("ws")
    status, body = api(husk, "POST", "/husk/v1/workspaces", json.dumps({"name": name}).encode())
    assert status == 201, body
    status, body = api(husk, "PUT", f"/husk/v1/workspaces/{name}/files/in/data.csv", b"a,b\n1,2\n")
    assert status // 100 == 2, body
    yield name
    api(husk, "DELETE", f"/husk/v1/workspaces/{name}")


def test_a_volume_mount_is_read_only_and_owned_by_the_user(workspace, sandbox_factory):
    sbx = sandbox_factory(volume_mounts={"/data": workspace})
    r = sbx.commands.run("cat /data/in/data.csv; stat -c %U /data/in/data.csv")
    assert r.stdout == "a,b\n1,2\nuser\n"
    r = sbx.commands.run("touch /data/new 2>&1 || echo refused", user="root")
    assert "Read-only file system" in r.stdout and r.stdout.endswith("refused\n")
    info = sbx.get_info()
    assert info.volume_mounts == [{"name": workspace, "path": "/data"}]


def test_rw_volume_writes_land_in_the_workspace(server, workspace, sandbox_factory):
    husk = server.husk
    sbx = sandbox_factory(volume_mounts={"/mnt/w": f"{workspace}:rw"})
    sbx.files.write("/mnt/w/from-sdk.txt", "written by the SDK\n")
    r = sbx.commands.run("echo by-command > /mnt/w/cmd.txt && ls /mnt/w")
    assert r.stdout.split() == ["cmd.txt", "from-sdk.txt", "in"]
    status, body = api(husk, "GET", f"/husk/v1/workspaces/{workspace}/files/from-sdk.txt")
    assert (status, body) == (200, b"written by the SDK\n")
    status, body = api(husk, "GET", f"/husk/v1/workspaces/{workspace}/files/cmd.txt")
    assert (status, body) == (200, b"by-command\n")
    # Persistent: a later sandbox sees what this one wrote.
    later = sandbox_factory(volume_mounts={"/data": workspace})
    assert later.commands.run("cat /data/cmd.txt").stdout == "by-command\n"


def test_missing_workspaces_bad_paths_and_other_teams_are_refused(workspace, sandbox_factory, other_key):
    with pytest.raises(SandboxException) as e:
        sandbox_factory(volume_mounts={"/data": "no-such-workspace"})
    assert "workspace 'no-such-workspace' not found" in str(e.value)
    with pytest.raises(SandboxException) as e:
        sandbox_factory(volume_mounts={"/proc/x": workspace})
    assert "/proc" in str(e.value)
    with pytest.raises(SandboxException) as e:
        sandbox_factory(volume_mounts={"relative": workspace})
    assert "absolute" in str(e.value)
    # Another team's sandboxes cannot mount it: to them it does not exist.
    with pytest.raises(SandboxException) as e:
        sandbox_factory(volume_mounts={"/data": workspace}, api_key=other_key)
    assert f"workspace '{workspace}' not found" in str(e.value)
    # The server still serves.
    sbx = sandbox_factory(volume_mounts={"/data": workspace})
    assert sbx.commands.run("echo ok").stdout == "ok\n"
