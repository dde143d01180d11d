"""Snapshots and forks with the stock async SDK (`AsyncSandbox`, e2b==2.63.0), more briefly than
test_snapshots.py: a snapshot (unnamed and named) and sandboxes from it, `list_snapshots`, a
fork of three run side by side, `delete_snapshot`, and the errors (a paused sandbox, another
team, unknown sandboxes and snapshots)."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from e2b import (
    AsyncSandbox,
    InvalidArgumentException,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from husk_compat import unique


async def listed(paginator) -> list:
    out = []
    while paginator.has_next:
        out += [s.snapshot_id for s in await paginator.next_items()]
    return out


async def sandboxes(opts, tag) -> set:
    p = AsyncSandbox.list(query=SandboxQuery(metadata={"suite": tag}), **opts)
    out = set()
    while p.has_next:
        out |= {s.sandbox_id for s in await p.next_items()}
    return out


@pytest_asyncio.fixture
async def snapshots(husk):
    """Snapshot ids (with the key that made them) deleted in teardown, pass or fail."""
    made = []
    yield made
    for snapshot_id, key in made:
        try:
            await AsyncSandbox.delete_snapshot(snapshot_id, **husk.opts(api_key=key))
        except Exception:
            pass


@pytest.mark.asyncio
async def test_async_snapshot_create_fork_and_delete(asbx_factory, husk, snapshots, cleanup_ids):
    opts = husk.opts()
    tag = unique("asnap")
    src = await asbx_factory(envs={"ASNAP": "async-env"}, metadata={"suite": tag})
    await src.files.write("/home/user/a.txt", "before")
    await src.files.write("/home/user/doomed.txt", "doomed")
    sleeper = await src.commands.run("sleep 424242", background=True)

    info = await src.create_snapshot()
    snapshots.append((info.snapshot_id, husk.admin_key))
    assert info.snapshot_id.endswith(":default") and "/" not in info.snapshot_id, info
    assert info.names == []
    name = unique("aweb")
    named = await AsyncSandbox.create_snapshot(src.sandbox_id, name=name, **opts)
    snapshots.append((named.snapshot_id, husk.admin_key))
    assert named.snapshot_id.endswith(f"/{name}:default") and named.names == [named.snapshot_id], named
    # The source goes on, and its later changes stay its own.
    assert (await src.get_info()).state == SandboxState.RUNNING
    assert sleeper.pid in [p.pid for p in await src.commands.list()]
    await src.files.write("/home/user/a.txt", "after")
    await src.files.remove("/home/user/doomed.txt")

    assert await listed(src.list_snapshots()) == [named.snapshot_id, info.snapshot_id]
    assert await listed(AsyncSandbox.list_snapshots(name=name, **opts)) == [named.snapshot_id]
    assert await listed(AsyncSandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=1, **opts)) == [
        named.snapshot_id,
        info.snapshot_id,
    ]

    # Sandboxes from it, by snapshot id and by name, side by side.
    copies = await asyncio.gather(
        asbx_factory(template=info.snapshot_id, envs={"ASNAP": "copy"}),
        asbx_factory(template=name),
    )
    for c in copies:
        assert await c.files.read("/home/user/a.txt") == "before"
        assert await c.files.read("/home/user/doomed.txt") == "doomed"
        assert "sleep 424242" not in (await c.commands.run("ps -e -o args=")).stdout
    assert (await copies[0].commands.run("echo $ASNAP")).stdout == "copy\n"

    # A fork of three.
    forks = await src.fork(count=3)
    for f in forks:
        if isinstance(f, AsyncSandbox):
            cleanup_ids.append((f.sandbox_id, husk.admin_key))
    assert len(forks) == 3 and all(isinstance(f, AsyncSandbox) for f in forks), forks
    ids = {f.sandbox_id for f in forks}
    assert len(ids) == 3 and src.sandbox_id not in ids
    assert len({f._envd_access_token for f in forks} | {src._envd_access_token}) == 4
    reads = await asyncio.gather(*(f.commands.run("cat /home/user/a.txt; echo; echo $ASNAP") for f in forks))
    assert [r.stdout for r in reads] == ["after\nasync-env\n"] * 3
    infos = await asyncio.gather(*(f.get_info() for f in forks))
    assert all(i.metadata == {"suite": tag} and i.state == SandboxState.RUNNING for i in infos), infos
    assert await sandboxes(opts, tag) == ids | {src.sandbox_id}
    await forks[0].files.write("/home/user/a.txt", "fork 0")
    assert await forks[1].files.read("/home/user/a.txt") == "after"
    assert await src.files.read("/home/user/a.txt") == "after"
    with pytest.raises(InvalidArgumentException):
        await src.fork(count=21)

    # Deleting: True, then False; sandboxes from it go on; no new ones from it.
    assert await AsyncSandbox.delete_snapshot(info.snapshot_id, **opts) is True
    assert await AsyncSandbox.delete_snapshot(info.snapshot_id, **opts) is False
    assert await listed(src.list_snapshots()) == [named.snapshot_id]
    with pytest.raises(SandboxException) as ei:
        await asbx_factory(template=info.snapshot_id)
    assert ei.value.status_code == 404, ei.value
    assert await copies[0].files.read("/home/user/a.txt") == "before"
    assert await copies[0].pause(mode="filesystem") is True
    await AsyncSandbox.connect(copies[0].sandbox_id, **opts)
    assert await copies[0].files.read("/home/user/doomed.txt") == "doomed"


@pytest.mark.asyncio
async def test_async_snapshot_and_fork_errors(asbx_factory, husk, snapshots, other_key):
    opts = husk.opts()
    theirs = husk.opts(api_key=other_key)
    tag = unique("asnaperr")
    src = await asbx_factory(metadata={"suite": tag})
    info = await src.create_snapshot()
    snapshots.append((info.snapshot_id, husk.admin_key))

    # Another team: not found, and nothing to list or delete.
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.create_snapshot(src.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.fork(src.sandbox_id, **theirs)
    with pytest.raises(SandboxException) as ei:
        await asbx_factory(template=info.snapshot_id, api_key=other_key)
    assert ei.value.status_code == 404, ei.value
    assert await listed(AsyncSandbox.list_snapshots(sandbox_id=src.sandbox_id, **theirs)) == []
    assert await AsyncSandbox.delete_snapshot(info.snapshot_id, **theirs) is False
    # Unknown.
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.create_snapshot("nosuchsandbox0000000", **opts)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.fork("nosuchsandbox0000000", **opts)
    assert await AsyncSandbox.delete_snapshot("nosuchsnapshot000000:default", **opts) is False
    # Paused: 409 for both.
    assert await src.pause() is True
    with pytest.raises(SandboxException) as ei:
        await src.create_snapshot()
    assert ei.value.status_code == 409, ei.value
    with pytest.raises(SandboxException) as ei:
        await src.fork(count=2)
    assert ei.value.status_code == 409, ei.value
    await src.connect()
    # Nothing was made by any of it.
    assert await listed(src.list_snapshots()) == [info.snapshot_id]
    assert await sandboxes(opts, tag) == {src.sandbox_id}
    assert await AsyncSandbox.delete_snapshot(info.snapshot_id, **opts) is True
