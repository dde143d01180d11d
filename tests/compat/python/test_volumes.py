"""E2B volumes through the stock SDK (`e2b==2.63.0`): `Volume.create/list/get_info/destroy`
and the volume content API (read, write, list, make_dir, update_metadata, remove, exists) with
the volume's token, backed by husk's workspaces; volumes written with no sandbox running and
read from a sandbox (`volume_mounts={path: volume}`); tenancy and tokens; hostile paths and
symlinks. E2B's expected results are those of its own SDK test suite."""

from __future__ import annotations

import http.client
import json
import urllib.parse
from io import BytesIO

import pytest
from e2b import AsyncSandbox, AsyncVolume, Volume
from e2b.exceptions import (
    AuthenticationException,
    NotFoundException,
    VolumeException,
    VolumeNotFoundException,
    VolumePathNotFoundException,
)

from husk_compat import unique


def api_opts(husk, key: str = "") -> dict:
    return dict(api_url=husk.url, api_key=key or husk.admin_key, request_timeout=30)


def raw(husk, method: str, path: str, headers: dict, body: bytes = b"") -> tuple:
    conn = http.client.HTTPConnection("127.0.0.1", husk.port, timeout=60)
    conn.request(method, path, body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


@pytest.fixture
def volume(husk):
    vol = Volume.create(unique("vol"), **api_opts(husk))
    yield vol
    Volume.destroy(vol.volume_id, **api_opts(husk))


def test_volume_lifecycle(husk):
    name = unique("vol")
    vol = Volume.create(name, **api_opts(husk))
    assert vol.name == name and vol.volume_id.startswith("vol_") and vol.token
    info = Volume.get_info(vol.volume_id, **api_opts(husk))
    assert (info.volume_id, info.name, info.token) == (vol.volume_id, name, vol.token)
    listed = Volume.list(**api_opts(husk))
    assert [v.name for v in listed if v.volume_id == vol.volume_id] == [name]
    connected = Volume.connect(vol.volume_id, **api_opts(husk))
    assert connected.token == vol.token
    # The name is taken.
    with pytest.raises(VolumeException) as e:
        Volume.create(name, **api_opts(husk))
    assert "already exists" in str(e.value)
    with pytest.raises(VolumeException) as e:
        Volume.create("../etc", **api_opts(husk))
    assert "invalid workspace name" in str(e.value)
    assert Volume.destroy(vol.volume_id, **api_opts(husk)) is True
    assert Volume.destroy(vol.volume_id, **api_opts(husk)) is False
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id, **api_opts(husk))
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info("non-existent-id", **api_opts(husk))
    assert vol.volume_id not in {v.volume_id for v in Volume.list(**api_opts(husk))}


def test_volume_files(volume):
    # Write and read: text, bytes, a stream, empty.
    written = volume.write_file("/test.txt", "Hello, World!")
    assert (written.name, written.path, written.type.value, written.size) == ("test.txt", "/test.txt", "file", 13)
    assert volume.read_file("/test.txt") == "Hello, World!"
    volume.write_file("/binary.bin", bytes([0, 1, 2, 3, 4]))
    assert volume.read_file("/binary.bin", format="bytes") == bytes([0, 1, 2, 3, 4])
    volume.write_file("/stream.txt", BytesIO(b"x" * 300_000))
    assert b"".join(volume.read_file("/stream.txt", format="stream")) == b"x" * 300_000
    volume.write_file("/empty.txt", "")
    assert volume.read_file("/empty.txt") == ""
    # Replacing needs force.
    with pytest.raises(VolumeException) as e:
        volume.write_file("/test.txt", "New content", force=False)
    assert "already exists" in str(e.value)
    volume.write_file("/test.txt", "New content", force=True)
    assert volume.read_file("/test.txt") == "New content"
    # Owners and modes.
    volume.write_file("/metadata.txt", "m", uid=1000, gid=1000, mode=0o644)
    info = volume.get_info("/metadata.txt")
    assert (info.type.value, info.uid, info.gid, info.mode) == ("file", 1000, 1000, 0o644)
    assert info.mtime.tzinfo is not None and info.ctime >= info.mtime.replace(microsecond=0)
    updated = volume.update_metadata("/metadata.txt", uid=1001, gid=1001, mode=0o755)
    assert (updated.path, updated.uid, updated.gid, updated.mode) == ("/metadata.txt", 1001, 1001, 0o755)
    with pytest.raises(NotFoundException):
        volume.update_metadata("/non-existent.txt", mode=0o644)
    with pytest.raises(VolumeException) as e:
        volume.update_metadata("/metadata.txt", mode=0o4755)
    assert "set-user-id" in str(e.value)
    # Directories: parents with force, an existing one refused without.
    with pytest.raises(VolumePathNotFoundException):
        volume.make_dir("/nested/deep/path")
    made = volume.make_dir("/nested/deep/path", force=True)
    assert (made.type.value, made.path) == ("directory", "/nested/deep/path")
    volume.make_dir("/existing-dir")
    with pytest.raises(VolumeException):
        volume.make_dir("/existing-dir", force=False)
    d = volume.make_dir("/dir-with-metadata", uid=1000, gid=1000, mode=0o755)
    assert (d.uid, d.gid, d.mode & 0o777) == (1000, 1000, 0o755)
    volume.write_file("/nested/deep/path/file.txt", "Nested")
    # Lists.
    names = sorted(e.name for e in volume.list("/"))
    assert {"test.txt", "nested", "existing-dir", "metadata.txt"} <= set(names)
    nested = volume.list("/nested/deep/path")
    assert [(e.name, e.path) for e in nested] == [("file.txt", "/nested/deep/path/file.txt")]
    deep = volume.list("/nested", depth=3)
    assert "/nested/deep/path/file.txt" in {e.path for e in deep}
    with pytest.raises(NotFoundException):
        volume.list("/non-existent")
    # Exists and remove (recursive; a missing path is not found).
    assert volume.exists("/nested") and not volume.exists("/non-existent.txt")
    volume.remove("/nested")
    assert not volume.exists("/nested")
    with pytest.raises(NotFoundException):
        volume.remove("/non-existent.txt")
    with pytest.raises(NotFoundException):
        volume.read_file("/non-existent.txt")


def test_volume_written_with_no_sandbox_is_read_from_one(husk, volume, sandbox_factory):
    volume.make_dir("/in", force=True)
    volume.write_file("/in/data.csv", "a,b\n1,2\n")
    sbx = sandbox_factory(volume_mounts={"/mnt/data": volume})
    r = sbx.commands.run("cat /mnt/data/in/data.csv; stat -c %U /mnt/data/in/data.csv")
    assert r.stdout == "a,b\n1,2\nuser\n"
    assert sbx.get_info().volume_mounts == [{"name": volume.name, "path": "/mnt/data"}]
    # Written from a sandbox (mounted read-write), read back with the volume API.
    rw = sandbox_factory(volume_mounts={"/mnt/w": f"{volume.name}:rw"})
    rw.files.write("/mnt/w/out.txt", "from the sandbox\n")
    rw.commands.run("ln -s /etc/passwd /mnt/w/link && mkfifo /mnt/w/fifo")
    assert volume.read_file("/out.txt") == "from the sandbox\n"
    out = volume.get_info("/out.txt")
    assert (out.uid, out.gid) == (1000, 1000)
    # What a sandbox planted is described, never followed or opened.
    link = volume.get_info("/link")
    assert (link.type.value, link.target) == ("symlink", "/etc/passwd")
    with pytest.raises(VolumeException) as e:
        volume.read_file("/link")
    assert "symlink" in str(e.value)
    with pytest.raises(VolumeException) as e:
        volume.write_file("/link/x", "through", force=True)
    assert "symlink" in str(e.value)
    with pytest.raises(VolumeException) as e:
        volume.read_file("/fifo")
    assert "fifo" in str(e.value)
    assert {e.name: e.type.value for e in volume.list("/")}["fifo"] == "unknown"
    for bad in ("/../etc/passwd", "/a/../../etc/passwd"):
        with pytest.raises(VolumeException) as e:
            volume.read_file(bad)
        assert "`..` is refused" in str(e.value)


def test_volumes_of_other_teams_and_tokens(husk, volume, other_key):
    volume.write_file("/secret.txt", "mine")
    # Another team: not found, not listed, not destroyed.
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(volume.volume_id, **api_opts(husk, other_key))
    assert Volume.destroy(volume.volume_id, **api_opts(husk, other_key)) is False
    assert volume.volume_id not in {v.volume_id for v in Volume.list(**api_opts(husk, other_key))}
    theirs = Volume.create(volume.name, **api_opts(husk, other_key))
    try:
        assert theirs.volume_id != volume.volume_id and theirs.token != volume.token
        assert theirs.list("/") == []
        # Their token does not open our volume, nor ours theirs.
        forged = Volume(volume_id=volume.volume_id, name=volume.name, token=theirs.token)
        with pytest.raises(AuthenticationException):
            forged.read_file("/secret.txt")
        with pytest.raises(AuthenticationException):
            forged.write_file("/planted.txt", "x")
        assert not volume.exists("/planted.txt")
    finally:
        Volume.destroy(theirs.volume_id, **api_opts(husk, other_key))
    # No token, a bad token, an API key instead of a token: 401.
    q = urllib.parse.urlencode({"path": "/secret.txt"})
    for headers in ({}, {"Authorization": "Bearer nope"}, {"X-API-Key": husk.admin_key}):
        status, body = raw(husk, "GET", f"/volumecontent/{volume.volume_id}/file?{q}", headers)
        assert status == 401, (headers, body)
    # The volume API itself needs an API key.
    status, _ = raw(husk, "GET", "/volumes", {})
    assert status == 401
    status, _ = raw(husk, "GET", f"/volumes/{volume.volume_id}", {"Authorization": f"Bearer {volume.token}"})
    assert status == 401


def test_workspaces_and_volumes_are_one_thing(husk):
    name = unique("ws")
    key = {"X-API-Key": husk.admin_key}
    status, body = raw(husk, "POST", "/husk/v1/workspaces", key, json.dumps({"name": name}).encode())
    assert status == 201, body
    status, body = raw(husk, "PUT", f"/husk/v1/workspaces/{name}/files/a.txt", key, b"from husk\n")
    assert status == 201, body
    found = [v for v in Volume.list(**api_opts(husk)) if v.name == name]
    assert len(found) == 1
    vol = Volume.connect(found[0].volume_id, **api_opts(husk))
    assert vol.read_file("/a.txt") == "from husk\n"
    # Deleted with husk's API: the volume (and its token) are gone with it.
    status, _ = raw(husk, "DELETE", f"/husk/v1/workspaces/{name}", key)
    assert status == 204
    with pytest.raises(VolumeNotFoundException):
        Volume.get_info(vol.volume_id, **api_opts(husk))
    with pytest.raises(NotFoundException):
        vol.read_file("/a.txt")


@pytest.mark.asyncio
async def test_async_volume(husk):
    vol = await AsyncVolume.create(unique("avol"), **api_opts(husk))
    try:
        info = await AsyncVolume.get_info(vol.volume_id, **api_opts(husk))
        assert info.token == vol.token
        await vol.make_dir("/d/e", force=True)
        written = await vol.write_file("/d/e/f.txt", "async content")
        assert written.path == "/d/e/f.txt"
        assert await vol.read_file("/d/e/f.txt") == "async content"
        chunks = [c async for c in await vol.read_file("/d/e/f.txt", format="stream")]
        assert b"".join(chunks) == b"async content"
        with pytest.raises(VolumeException):
            await vol.write_file("/d/e/f.txt", "again", force=False)
        assert [e.name for e in await vol.list("/d/e")] == ["f.txt"]
        updated = await vol.update_metadata("/d/e/f.txt", mode=0o600)
        assert updated.mode == 0o600
        sbx = await AsyncSandbox.create(volume_mounts={"/v": vol}, timeout=60, **husk.opts())
        try:
            r = await sbx.commands.run("cat /v/d/e/f.txt")
            assert r.stdout == "async content"
        finally:
            await sbx.kill()
        await vol.remove("/d")
        assert not await vol.exists("/d")
        with pytest.raises(NotFoundException):
            await vol.remove("/d")
    finally:
        assert await AsyncVolume.destroy(vol.volume_id, **api_opts(husk)) is True
    assert await AsyncVolume.destroy(vol.volume_id, **api_opts(husk)) is False
