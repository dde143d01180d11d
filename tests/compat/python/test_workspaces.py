"""Workspaces as E2B volumes, through the stock SDK: `Sandbox.create(volume_mounts={path: name})`
mounts the team's workspace NAME (husk's API creates and fills it) read-only; `NAME:rw` asks for
write access; the files are the sandbox user's; a missing workspace or a bad mount path is a
clear error; another team cannot mount it."""

from __future__ import annotations

import http.client
import json

import pytest
from e2b.exceptions import SandboxException

from husk_compat import unique


def api(husk, method: str, path: str, body: bytes = b"", key: str = "") -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", husk.port, timeout=60)
    conn.request(method, path, body=body, headers={"X-API-Key": key or husk.admin_key})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


@pytest.fixture(scope="module")
def workspace(husk) -> str:
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


def test_rw_volume_writes_land_in_the_workspace(husk, workspace, sandbox_factory):
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


def test_missing_workspaces_bad_paths_and_other_teams_are_refused(husk, workspace, sandbox_factory, other_key):
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
