"""Pause and resume with the stock async SDK (`AsyncSandbox`, e2b==2.63.0), more briefly than
test_pause.py: a full pause and its resume, a filesystem pause, pause at the timeout with
auto-resume, and errors (killed sandboxes, another team, kill of a paused sandbox)."""

from __future__ import annotations

import secrets

import pytest

from e2b import (
    AsyncSandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from husk_compat import await_for, unique

SHORT = 10


async def listed(opts, tag=None, states=None) -> dict:
    q = SandboxQuery(metadata={"suite": tag} if tag else None, state=states)
    p = AsyncSandbox.list(query=q, **opts)
    out = {}
    while p.has_next:
        for s in await p.next_items():
            out[s.sandbox_id] = s.state
    return out


async def state_of(sandbox_id, opts):
    return (await AsyncSandbox.get_info(sandbox_id, **opts)).state


async def assert_calls_say_paused(sbx: AsyncSandbox, path: str):
    with pytest.raises(SandboxException) as ei:
        await sbx.commands.run("true", timeout=SHORT, request_timeout=SHORT)
    assert "paused" in str(ei.value).lower(), repr(ei.value)
    with pytest.raises(SandboxException) as ei:
        await sbx.files.read(path, request_timeout=SHORT)
    assert "paused" in str(ei.value).lower(), repr(ei.value)


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_async_full_pause_and_connect(asbx_factory, husk):
    opts = husk.opts()
    tag = unique("apause")
    sbx = await asbx_factory(envs={"APAUSE": "async-env"}, metadata={"suite": tag})
    await sbx.files.write("/home/user/a.txt", "async before")
    sleeper = await sbx.commands.run("sleep 1000", background=True)

    assert await sbx.pause() is True
    info = await sbx.get_info()
    assert info.state == SandboxState.PAUSED
    assert info.metadata == {"suite": tag}
    assert await listed(opts, tag, [SandboxState.PAUSED]) == {sbx.sandbox_id: SandboxState.PAUSED}
    assert await listed(opts, tag, [SandboxState.RUNNING]) == {}
    assert await AsyncSandbox.pause(sbx.sandbox_id, **opts) is False
    assert await sbx.pause() is False
    assert await sbx.is_running() is False
    await assert_calls_say_paused(sbx, "/home/user/a.txt")
    assert await state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED

    same = await AsyncSandbox.connect(sbx.sandbox_id, timeout=200, **opts)
    assert same.sandbox_id == sbx.sandbox_id
    assert await state_of(sbx.sandbox_id, opts) == SandboxState.RUNNING
    assert await sbx.is_running() is True
    assert await sbx.files.read("/home/user/a.txt") == "async before"
    assert await same.files.read("/home/user/a.txt") == "async before"
    procs = {p.pid: p for p in await sbx.commands.list()}
    assert sleeper.pid in procs, (sleeper.pid, procs)
    assert procs[sleeper.pid].args == ["-l", "-c", "sleep 1000"]
    assert (await sbx.commands.run("echo $APAUSE")).stdout == "async-env\n"

    # The instance variant, once more.
    assert await sbx.pause() is True
    assert await sbx.connect() is sbx
    assert await state_of(sbx.sandbox_id, opts) == SandboxState.RUNNING
    assert sleeper.pid in [p.pid for p in await sbx.commands.list()]


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_async_filesystem_pause(asbx_factory, husk):
    opts = husk.opts()
    marker = f"sleep {secrets.randbelow(900_000) + 100_000}"
    sbx = await asbx_factory(envs={"APAUSE": "fs"}, metadata={"m": "fs"})
    await sbx.files.write("/home/user/fs.txt", "kept")
    await sbx.commands.run("printf root > /opt/root.txt && rm /etc/issue", user="root")
    sleeper = await sbx.commands.run(marker, background=True)

    assert await sbx.pause(mode="filesystem") is True
    assert await state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED
    await AsyncSandbox.connect(sbx.sandbox_id, **opts)

    info = await sbx.get_info()
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {"m": "fs"}
    assert await sbx.files.read("/home/user/fs.txt") == "kept"
    assert await sbx.files.read("/opt/root.txt") == "root"
    assert await sbx.files.exists("/etc/issue") is False
    # Gone (by its command line: a fresh sandbox may hand its pid to something else).
    assert not [p for p in await sbx.commands.list() if marker in " ".join(p.args)]
    assert marker not in (await sbx.commands.run("ps -e -o args=")).stdout
    assert (await sbx.commands.run("echo $APAUSE")).stdout == "fs\n"


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_async_pause_at_timeout_then_auto_resume(asbx_factory, husk):
    opts = husk.opts()
    sbx = await asbx_factory(timeout=60, lifecycle={"on_timeout": "pause", "auto_resume": True})
    assert (await sbx.get_info()).lifecycle == {"on_timeout": "pause", "auto_resume": True}
    await sbx.files.write("/home/user/f", "woken")
    await sbx.set_timeout(3)

    async def paused():
        return await state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED

    await await_for(paused, 40, "the sandbox to pause at its timeout", 0.25)
    r = await sbx.commands.run("cat /home/user/f", timeout=30, request_timeout=30)
    assert r.stdout == "woken"
    assert await state_of(sbx.sandbox_id, opts) == SandboxState.RUNNING


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_async_pause_at_timeout_without_auto_resume(asbx_factory, husk):
    opts = husk.opts()
    sbx = await asbx_factory(timeout=3, lifecycle={"on_timeout": "pause"})
    await sbx.files.write("/home/user/f", "asleep")

    async def paused():
        return await state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED

    await await_for(paused, 40, "the sandbox to pause at its timeout", 0.25)
    assert (await sbx.get_info()).lifecycle == {"on_timeout": "pause", "auto_resume": False}
    await assert_calls_say_paused(sbx, "/home/user/f")
    await sbx.connect(timeout=60)
    assert await sbx.files.read("/home/user/f") == "asleep"


@pytest.mark.asyncio
async def test_async_pause_errors_tenancy_and_kill(asbx_factory, husk, other_key):
    opts = husk.opts()
    theirs = husk.opts(api_key=other_key)
    tag = unique("aerr")

    gone = await asbx_factory()
    assert await gone.kill() is True
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.pause(gone.sandbox_id, **opts)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(gone.sandbox_id, **opts)

    sbx = await asbx_factory(metadata={"suite": tag})
    assert await sbx.pause() is True
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(sbx.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.pause(sbx.sandbox_id, **theirs)
    assert await listed(theirs, tag, [SandboxState.PAUSED]) == {}
    assert await state_of(sbx.sandbox_id, opts) == SandboxState.PAUSED

    assert await sbx.kill() is True
    assert await listed(opts, tag) == {}
    assert await listed(opts, tag, [SandboxState.PAUSED]) == {}
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(sbx.sandbox_id, **opts)
    assert not (husk.state_dir / "paused" / sbx.sandbox_id).exists()
