"""The async API of the stock SDK (`AsyncSandbox`, e2b==2.63.0) over the same areas, more
briefly: lifecycle, list, timeouts, connect, metrics, commands, PTY, files, streaming watch,
signed URLs, tenancy and bad input."""

from __future__ import annotations

import asyncio
import datetime as dt
import time

import pytest
import pytest_asyncio

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    PtySize,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)

from husk_compat import await_for, fetch_url, unique

WRONG_KEY = "e2b_" + "f" * 40


@pytest_asyncio.fixture
async def asbx(asbx_factory) -> AsyncSandbox:
    return await asbx_factory()


async def list_all(opts, **kwargs):
    p = AsyncSandbox.list(**kwargs, **opts)
    out = []
    while p.has_next:
        out.extend(await p.next_items())
    return out


# --- lifecycle --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_create_info_kill(asbx_factory, husk):
    sbx = await asbx_factory(timeout=200, metadata={"m": "async"}, envs={"AV": "async-env"})
    assert await sbx.is_running() is True
    info = await sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.metadata == {"m": "async"}
    assert info.state == SandboxState.RUNNING
    assert info.cpu_count > 0 and info.memory_mb > 0
    assert 190 <= (info.end_at - info.started_at).total_seconds() <= 210
    assert (await sbx.commands.run("echo $AV")).stdout == "async-env\n"
    assert await sbx.kill() is True
    assert await sbx.is_running() is False
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.get_info(sbx.sandbox_id, **husk.opts())
    assert await AsyncSandbox.kill(sbx.sandbox_id, **husk.opts()) is False
    with pytest.raises(SandboxException):
        await sbx.commands.run("echo gone", timeout=10)


@pytest.mark.asyncio
async def test_async_list_filter_and_pages(asbx_factory, husk):
    tag = unique("alist")
    made = {(await asbx_factory(metadata={"suite": tag})).sandbox_id for _ in range(3)}
    q = SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING])
    p = AsyncSandbox.list(query=q, limit=2, **husk.opts())
    first = await p.next_items()
    assert len(first) == 2 and p.has_next
    second = await p.next_items()
    assert not p.has_next
    assert {s.sandbox_id for s in first + second} == made
    assert await list_all(husk.opts(), query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED])) == []


@pytest.mark.asyncio
@pytest.mark.timeout(90)
async def test_async_set_timeout_and_expiry(asbx_factory, husk):
    sbx = await asbx_factory(timeout=300)
    await sbx.set_timeout(2)

    async def gone():
        return not await sbx.is_running()

    await await_for(gone, 40, "the sandbox to expire", 0.5)
    with pytest.raises(SandboxNotFoundException):
        await sbx.get_info()


@pytest.mark.asyncio
async def test_async_connect_extends(asbx_factory, husk):
    sbx = await asbx_factory(timeout=60)
    end0 = (await sbx.get_info()).end_at
    other = await AsyncSandbox.connect(sbx.sandbox_id, timeout=600, **husk.opts())
    end1 = (await other.get_info()).end_at
    assert (end1 - end0).total_seconds() >= 500
    await AsyncSandbox.connect(sbx.sandbox_id, timeout=5, **husk.opts())
    assert (await sbx.get_info()).end_at >= end1 - dt.timedelta(seconds=1)
    await other.files.write("/tmp/from-other", "o")
    assert await sbx.files.read("/tmp/from-other") == "o"
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect("nosuchsandbox0000000", **husk.opts())


@pytest.mark.asyncio
async def test_async_metrics(asbx):
    async def metrics():
        return [m for m in await asbx.get_metrics() if m.mem_total > 0]

    found = await await_for(metrics, 30, "a metric with memTotal > 0", 0.5)
    assert found[-1].cpu_count > 0
    assert 0 < found[-1].mem_used <= found[-1].mem_total
    # A range before the sandbox existed has no samples.
    hour = dt.timedelta(hours=1)
    before = await asbx.get_metrics(
        start=dt.datetime.now(dt.timezone.utc) - 2 * hour,
        end=dt.datetime.now(dt.timezone.utc) - hour,
    )
    assert before == []


# --- commands ---------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_commands_basics(asbx):
    r = await asbx.commands.run("echo hi")
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "", 0)
    with pytest.raises(CommandExitException) as ei:
        await asbx.commands.run("echo e >&2; exit 4")
    assert ei.value.exit_code == 4 and ei.value.stderr == "e\n"
    assert (await asbx.commands.run("echo $X", envs={"X": "1"})).stdout == "1\n"
    assert (await asbx.commands.run("echo ${X:-unset}")).stdout == "unset\n"
    assert (await asbx.commands.run("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await asbx.commands.run("whoami")).stdout == "user\n"
    assert (await asbx.commands.run("whoami", user="root")).stdout == "root\n"


@pytest.mark.asyncio
async def test_async_sudo(asbx):
    assert (await asbx.commands.run("sudo whoami")).stdout == "root\n"


@pytest.mark.asyncio
async def test_async_callbacks_in_order(asbx):
    out, err = [], []

    async def on_err(chunk):
        err.append(chunk)

    r = await asbx.commands.run(
        "for i in $(seq 1 200); do echo o$i; echo e$i >&2; done", on_stdout=out.append, on_stderr=on_err
    )
    assert "".join(out) == r.stdout == "".join(f"o{i}\n" for i in range(1, 201))
    assert "".join(err) == r.stderr == "".join(f"e{i}\n" for i in range(1, 201))


@pytest.mark.asyncio
async def test_async_background_stdin_kill_list(asbx):
    h = await asbx.commands.run("cat", background=True, stdin=True)
    await asbx.commands.send_stdin(h.pid, "through stdin\n")
    await h.close_stdin()
    assert (await h.wait()).stdout == "through stdin\n"

    marker = unique("alist")
    sleeper = await asbx.commands.run(f"sleep 60 # {marker}", background=True)
    procs = {p.pid: p for p in await asbx.commands.list()}
    assert procs[sleeper.pid].args == ["-l", "-c", f"sleep 60 # {marker}"]
    assert await sleeper.kill() is True
    with pytest.raises(CommandExitException):
        await sleeper.wait()
    assert await asbx.commands.kill(sleeper.pid) is False


@pytest.mark.asyncio
async def test_async_command_timeout(asbx):
    start = time.monotonic()
    with pytest.raises(TimeoutException):
        await asbx.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - start < 15


@pytest.mark.asyncio
async def test_async_connect_to_running_command(asbx):
    h = await asbx.commands.run(
        "while [ ! -f /tmp/go ]; do sleep 0.1; done; echo resumed", background=True
    )
    await h.disconnect()
    assert h.pid in [p.pid for p in await asbx.commands.list()]
    seen = []
    again = await asbx.commands.connect(h.pid, on_stdout=seen.append)
    await asbx.files.write("/tmp/go", "")
    r = await again.wait()
    assert r.stdout == "resumed\n"
    assert "".join(seen) == "resumed\n"


# --- pty --------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_pty(asbx):
    chunks = []
    h = await asbx.pty.create(PtySize(rows=24, cols=80), on_data=chunks.append, timeout=30)

    def text():
        return b"".join(chunks).decode("utf-8", "replace")

    await asbx.pty.send_stdin(h.pid, b"echo $TERM\n")
    await asbx.pty.send_stdin(h.pid, b"echo size=$(stty size | tr ' ' x)\n")

    async def initial():
        return "size=24x80" in text()

    await await_for(initial, 15, "the initial PTY size")
    await asbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
    await asbx.pty.send_stdin(h.pid, b"echo size=$(stty size | tr ' ' x)\n")
    await asbx.pty.send_stdin(h.pid, b"exit 0\n")
    r = await h.wait()
    assert r.exit_code == 0
    assert "xterm-256color" in text()
    assert "size=30x100" in text()


@pytest.mark.asyncio
async def test_async_pty_kill(asbx):
    h = await asbx.pty.create(PtySize(rows=10, cols=40), on_data=lambda _: None, timeout=30)
    assert await asbx.pty.kill(h.pid) is True
    with pytest.raises(CommandExitException):
        await h.wait()


# --- files ------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_files(asbx):
    info = await asbx.files.write("/home/user/a.txt", "async text")
    assert info.path == "/home/user/a.txt" and info.type == FileType.FILE
    assert await asbx.files.read("/home/user/a.txt") == "async text"
    data = bytes(range(256)) * 10
    await asbx.files.write("/tmp/a.bin", data)
    assert bytes(await asbx.files.read("/tmp/a.bin", format="bytes")) == data
    stream = await asbx.files.read("/tmp/a.bin", format="stream")
    got = b""
    async with stream:
        async for chunk in stream:
            got += chunk
    assert got == data

    infos = await asbx.files.write_files([{"path": f"/tmp/many/f{i}", "data": str(i)} for i in range(10)])
    assert len(infos) == 10
    listing = await asbx.files.list("/tmp/many")
    assert sorted(e.name for e in listing) == sorted(f"f{i}" for i in range(10))
    await asbx.commands.run("mkdir -p /tmp/deep/x/y && touch /tmp/deep/x/y/z")
    assert {e.path for e in await asbx.files.list("/tmp/deep", depth=2)} == {"/tmp/deep/x", "/tmp/deep/x/y"}

    assert await asbx.files.exists("/tmp/a.bin") is True
    assert await asbx.files.exists("/tmp/nope") is False
    st = await asbx.files.get_info("/tmp/a.bin")
    assert st.size == len(data) and st.owner == "user" and st.type == FileType.FILE
    assert await asbx.files.make_dir("/tmp/newdir") is True
    assert await asbx.files.make_dir("/tmp/newdir") is False
    moved = await asbx.files.rename("/tmp/a.bin", "/tmp/b.bin")
    assert moved.path == "/tmp/b.bin"
    await asbx.files.remove("/tmp/b.bin")
    assert await asbx.files.exists("/tmp/b.bin") is False
    with pytest.raises(FileNotFoundException):
        await asbx.files.read("/tmp/b.bin")


@pytest.mark.asyncio
async def test_async_metadata_and_gzip(asbx):
    info = await asbx.files.write("/tmp/m.txt", "meta", metadata={"Key": "value"})
    assert info.metadata == {"key": "value"}
    assert (await asbx.files.get_info("/tmp/m.txt")).metadata == {"key": "value"}
    text = "zip " * 10000
    await asbx.files.write("/tmp/z.txt", text, gzip=True)
    assert await asbx.files.read("/tmp/z.txt", gzip=True) == text
    assert (await asbx.commands.run("wc -c < /tmp/z.txt")).stdout.strip() == str(len(text))


@pytest.mark.asyncio
async def test_async_watch_streaming(asbx):
    await asbx.commands.run("mkdir -p /tmp/aw/sub")
    events = []
    exits = []
    h = await asbx.files.watch_dir(
        "/tmp/aw", on_event=events.append, on_exit=exits.append, recursive=True, timeout=30
    )
    try:
        await asbx.files.write("/tmp/aw/top.txt", "t")
        await asbx.files.write("/tmp/aw/sub/nested.txt", "n")
        await asbx.files.remove("/tmp/aw/top.txt")

        async def seen():
            names = {(e.name, e.type) for e in events}
            return (
                any(n == "top.txt" and t in (FilesystemEventType.CREATE, FilesystemEventType.WRITE) for n, t in names)
                and any(n == "sub/nested.txt" for n, _ in names)
                and ("top.txt", FilesystemEventType.REMOVE) in names
            )

        await await_for(seen, 15, f"watch events; got {events}")
    finally:
        await h.stop()
    assert exits == [None]


@pytest.mark.asyncio
async def test_async_watch_errors(asbx):
    with pytest.raises(FileNotFoundException):
        await asbx.files.watch_dir("/tmp/not-a-dir", on_event=lambda e: None)


# --- signed URLs, tenancy, bad input --------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_signed_urls(asbx):
    await asbx.files.write("/tmp/s.txt", "signed")
    status, body = await asyncio.to_thread(fetch_url, asbx.download_url("/tmp/s.txt"), asbx.sandbox_id)
    assert (status, body) == (200, b"signed")
    expired = asbx.download_url("/tmp/s.txt", use_signature_expiration=-10)
    status, body = await asyncio.to_thread(fetch_url, expired, asbx.sandbox_id)
    assert status == 401
    assert body.strip() == b'{"code":401,"message":"signature is already expired"}'


@pytest.mark.asyncio
async def test_async_signed_url_without_routing_headers(asbx):
    await asbx.files.write("/tmp/plain.txt", "plain")
    # No sandbox id: no routing headers, as a browser or curl opens it.
    status, body = await asyncio.to_thread(fetch_url, asbx.download_url("/tmp/plain.txt"), None)
    assert (status, body) == (200, b"plain")


@pytest.mark.asyncio
async def test_async_remove_missing_and_symlink_info(asbx):
    await asbx.files.remove("/tmp/never-there")
    await asbx.files.write("/tmp/al/t.txt", "t")
    await asbx.commands.run("ln -s t.txt /tmp/al/link")
    info = await asbx.files.get_info("/tmp/al/link")
    assert (info.type, info.symlink_target) == (FileType.FILE, "/tmp/al/t.txt")


@pytest.mark.asyncio
async def test_async_killing_the_sandbox_during_a_command(asbx, husk):
    h = await asbx.commands.run("sleep 60", background=True)

    async def listed():
        return h.pid in [p.pid for p in await asbx.commands.list()]

    await await_for(listed, 10, "the command to start")
    assert await AsyncSandbox.kill(asbx.sandbox_id, **husk.opts()) is True
    with pytest.raises(SandboxNotRunningException) as e:
        await h.wait()
    assert "was killed or reached its end of life" in str(e.value), str(e.value)


@pytest.mark.asyncio
async def test_async_tenancy(asbx, husk, other_key):
    theirs = husk.opts(api_key=other_key)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.get_info(asbx.sandbox_id, **theirs)
    assert await AsyncSandbox.kill(asbx.sandbox_id, **theirs) is False
    assert asbx.sandbox_id not in {s.sandbox_id for s in await list_all(theirs)}
    assert await asbx.is_running()


@pytest.mark.asyncio
async def test_async_wrong_key(husk):
    with pytest.raises(AuthenticationException):
        await AsyncSandbox.create(timeout=30, **husk.opts(api_key=WRONG_KEY))
    with pytest.raises(AuthenticationException):
        await AsyncSandbox.list(**husk.opts(api_key=WRONG_KEY)).next_items()


@pytest.mark.asyncio
async def test_async_concurrent_commands(asbx):
    results = await asyncio.gather(*[asbx.commands.run(f"sleep 1; echo c{i}") for i in range(5)])
    assert [r.stdout for r in results] == [f"c{i}\n" for i in range(5)]
