"""Sandbox lifecycle with the stock sync SDK: create, kill, info, list with filters and
pagination, timeouts, connect, metrics, and configuration through environment variables only."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from packaging.version import Version

from e2b import (
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)

from husk_compat import http_request, start_server, unique, wait_for


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def list_all(opts: dict, **kwargs):
    paginator = Sandbox.list(**kwargs, **opts)
    out = []
    while paginator.has_next:
        out.extend(paginator.next_items())
    return out


def test_create_run_kill(sandbox_factory, opts):
    sbx = sandbox_factory()
    assert re.fullmatch(r"[a-z0-9]+", sbx.sandbox_id), sbx.sandbox_id
    assert sbx.is_running() is True
    assert sbx.commands.run("echo hi").stdout == "hi\n"
    assert sbx.kill() is True
    assert sbx.is_running() is False
    # Gone for the control plane too.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **opts)
    assert Sandbox.kill(sbx.sandbox_id, **opts) is False


def test_calls_on_a_killed_sandbox_fail(sandbox, husk):
    sandbox.files.write("/tmp/x", "x")
    assert Sandbox.kill(sandbox.sandbox_id, **husk.opts()) is True
    with pytest.raises(SandboxException):
        sandbox.commands.run("echo hi", timeout=10)
    with pytest.raises(SandboxException):
        sandbox.files.read("/tmp/x")
    r = http_request(
        husk.port,
        "GET",
        "/health",
        {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49983"},
    )
    assert r.status == 502
    assert "The sandbox was not found" in r.json()["message"]


def test_kill_unknown_returns_false(opts):
    assert Sandbox.kill("nosuchsandbox0000000", **opts) is False


def test_context_manager_kills(husk):
    with Sandbox.create(timeout=60, **husk.opts()) as sbx:
        sandbox_id = sbx.sandbox_id
        assert sbx.is_running()
    assert Sandbox.kill(sandbox_id, **husk.opts()) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox_id, **husk.opts())


def test_create_answer_times_its_steps(husk):
    """A create's answer says in Server-Timing how long the server took and, for a sandbox
    made fresh, its steps (spawner, agent and start-up, registration), which fit in it."""
    r = http_request(
        husk.port,
        "POST",
        "/v2/sandboxes",
        {"X-API-Key": husk.admin_key, "Content-Type": "application/json"},
        b'{"templateID": "base", "timeout": 60}',
    )
    assert r.status == 201, r.text
    sid = r.json()["sandboxID"]
    try:
        timing = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r"(\w+);dur=([0-9.]+)", r.headers.get("server-timing", ""))
        }
        assert set(timing) == {"spawn", "boot", "register", "create"}, r.headers
        assert all(v >= 0 for v in timing.values()), timing
        assert timing["spawn"] > 0 and timing["boot"] > 0, timing
        assert timing["spawn"] + timing["boot"] + timing["register"] <= timing["create"], timing
    finally:
        assert http_request(husk.port, "DELETE", f"/sandboxes/{sid}", {"X-API-Key": husk.admin_key}).status == 204


def test_get_info_fields(sandbox_factory, husk):
    before = now() - dt.timedelta(seconds=5)
    sbx = sandbox_factory(timeout=300, metadata={"purpose": "info", "owner": "compat"})
    info = sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == "base" or info.name == "base", (info.template_id, info.name)
    assert info.metadata == {"purpose": "info", "owner": "compat"}
    assert info.state == SandboxState.RUNNING
    assert before <= info.started_at <= now() + dt.timedelta(seconds=5)
    life = (info.end_at - info.started_at).total_seconds()
    assert 290 <= life <= 310, life
    assert info.cpu_count > 0
    assert info.memory_mb > 0
    assert Version(info.envd_version) >= Version("0.1.0")
    # The SDK's SandboxInfo has no disk figure; the API's SandboxDetail must carry one.
    r = http_request(husk.port, "GET", f"/sandboxes/{sbx.sandbox_id}", {"X-API-Key": husk.admin_key})
    assert r.status == 200, r.text
    detail = r.json()
    assert detail["diskSizeMB"] > 0
    assert detail["memoryMB"] == info.memory_mb
    assert detail["cpuCount"] == info.cpu_count
    assert detail["state"] == "running"
    # Same through the static variant.
    assert Sandbox.get_info(sbx.sandbox_id, **husk.opts()).metadata == info.metadata


def test_list_filters_by_metadata_and_state(sandbox_factory, opts):
    tag = unique("list")
    a = sandbox_factory(metadata={"suite": tag, "n": "1"})
    b = sandbox_factory(metadata={"suite": tag, "n": "2"})
    other = sandbox_factory(metadata={"suite": unique("other")})

    found = list_all(opts, query=SandboxQuery(metadata={"suite": tag}))
    assert {s.sandbox_id for s in found} == {a.sandbox_id, b.sandbox_id}
    assert all(s.metadata["suite"] == tag for s in found)
    assert all(s.state == SandboxState.RUNNING for s in found)

    one = list_all(opts, query=SandboxQuery(metadata={"suite": tag, "n": "2"}))
    assert [s.sandbox_id for s in one] == [b.sandbox_id]

    running = list_all(opts, query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING]))
    assert {s.sandbox_id for s in running} == {a.sandbox_id, b.sandbox_id}
    paused = list_all(opts, query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.PAUSED]))
    assert paused == []

    everything = {s.sandbox_id for s in list_all(opts)}
    assert {a.sandbox_id, b.sandbox_id, other.sandbox_id} <= everything


def test_list_metadata_with_reserved_characters(sandbox_factory, opts):
    tag = unique("enc")
    odd = {"a b": "c&d=e", "suite": tag, "pct": "100%"}
    sbx = sandbox_factory(metadata=odd)
    sandbox_factory(metadata={"suite": tag, "a b": "different"})
    found = list_all(opts, query=SandboxQuery(metadata={"a b": "c&d=e", "suite": tag}))
    assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
    assert found[0].metadata == odd
    assert list_all(opts, query=SandboxQuery(metadata={"suite": tag, "pct": "100%"}))[0].sandbox_id == sbx.sandbox_id


def test_list_pagination(sandbox_factory, opts):
    tag = unique("page")
    ids = {sandbox_factory(metadata={"suite": tag}).sandbox_id for _ in range(3)}
    paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=1, **opts)
    pages = []
    while paginator.has_next:
        items = paginator.next_items()
        assert len(items) <= 1
        pages.append([s.sandbox_id for s in items])
        assert len(pages) <= 5, f"pagination does not end: {pages}"
    seen = [i for page in pages for i in page]
    assert sorted(seen) == sorted(ids), pages
    assert paginator.has_next is False
    assert not paginator.next_token

    # limit=2 takes two pages, and a next_token resumes where the first stopped.
    p2 = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=2, **opts)
    first = p2.next_items()
    assert len(first) == 2 and p2.has_next and p2.next_token
    resumed = Sandbox.list(
        query=SandboxQuery(metadata={"suite": tag}), limit=2, next_token=p2.next_token, **opts
    )
    rest = resumed.next_items()
    assert {s.sandbox_id for s in first} | {s.sandbox_id for s in rest} == ids
    assert not {s.sandbox_id for s in first} & {s.sandbox_id for s in rest}


def test_list_order(sandbox_factory, opts):
    tag = unique("order")
    made = [sandbox_factory(metadata={"suite": tag}) for _ in range(3)]
    asc = list_all(opts, query=SandboxQuery(metadata={"suite": tag}), order="asc")
    desc = list_all(opts, query=SandboxQuery(metadata={"suite": tag}), order="desc")
    assert {s.sandbox_id for s in asc} == {s.sandbox_id for s in made}
    assert [s.started_at for s in asc] == sorted(s.started_at for s in asc)
    assert [s.started_at for s in desc] == sorted((s.started_at for s in desc), reverse=True)


def test_create_timeout_sets_end(sandbox_factory):
    sbx = sandbox_factory(timeout=45)
    info = sbx.get_info()
    assert 40 <= (info.end_at - info.started_at).total_seconds() <= 50


@pytest.mark.timeout(90)
def test_sandbox_expires_after_its_timeout(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=3)
    assert sbx.is_running()
    wait_for(lambda: not sbx.is_running(), 40, "the sandbox to expire", 0.5)
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()
    with pytest.raises(SandboxException):
        sbx.commands.run("echo hi", timeout=10)


@pytest.mark.timeout(90)
def test_set_timeout_shortens_then_sandbox_disappears(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=300)
    sbx.set_timeout(120)
    end = sbx.get_info().end_at
    assert 110 <= (end - now()).total_seconds() <= 125
    sbx.set_timeout(2)
    wait_for(lambda: not sbx.is_running(), 40, "the sandbox to expire after set_timeout(2)", 0.5)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id, **opts)
    assert Sandbox.kill(sbx.sandbox_id, **opts) is False
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(sbx.sandbox_id, 60, **opts)


def test_set_timeout_extends(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=30)
    Sandbox.set_timeout(sbx.sandbox_id, 600, **opts)
    assert 590 <= (sbx.get_info().end_at - now()).total_seconds() <= 605


def test_connect_extends_never_shortens(sandbox_factory, opts):
    sbx = sandbox_factory(timeout=60)
    end0 = sbx.get_info().end_at

    same = Sandbox.connect(sbx.sandbox_id, timeout=600, **opts)
    assert same.sandbox_id == sbx.sandbox_id
    end1 = same.get_info().end_at
    assert (end1 - end0).total_seconds() >= 500, (end0, end1)

    Sandbox.connect(sbx.sandbox_id, timeout=10, **opts)
    end2 = sbx.get_info().end_at
    assert end2 >= end1 - dt.timedelta(seconds=1), (end1, end2)

    # The connected instance drives the same sandbox.
    sbx.files.write("/tmp/connected", "via first")
    assert same.files.read("/tmp/connected") == "via first"
    assert same.commands.run("cat /tmp/connected").stdout == "via first"

    # Instance variant.
    assert sbx.connect(timeout=900) is sbx
    assert (sbx.get_info().end_at - now()).total_seconds() >= 880


def test_connect_unknown_raises_not_found(opts):
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect("nosuchsandbox0000000", **opts)


def test_connect_killed_raises_not_found(sandbox, opts):
    sandbox.kill()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(sandbox.sandbox_id, **opts)


def test_metrics(sandbox, opts):
    sandbox.commands.run("head -c 4000000 /dev/zero > /tmp/fill")

    def metrics():
        return [m for m in sandbox.get_metrics() if m.mem_total > 0]

    found = wait_for(metrics, 30, "a metric with memTotal > 0", 0.5)
    m = found[-1]
    assert m.cpu_count > 0
    assert 0 <= m.cpu_used_pct <= 100 * m.cpu_count
    assert 0 < m.mem_used <= m.mem_total
    assert m.disk_total > 0
    assert 0 <= m.disk_used <= m.disk_total
    assert m.timestamp <= now() + dt.timedelta(seconds=5)
    # Static variant with a time window covering the whole life.
    window = Sandbox.get_metrics(
        sandbox.sandbox_id,
        start=now() - dt.timedelta(minutes=5),
        end=now() + dt.timedelta(minutes=1),
        **opts,
    )
    assert any(x.mem_total > 0 for x in window)


def test_metrics_honour_the_time_range(sandbox, opts, husk):
    created = now()
    # Before the sandbox existed: nothing (E2B answers an empty list).
    before = Sandbox.get_metrics(
        sandbox.sandbox_id,
        start=created - dt.timedelta(hours=2),
        end=created - dt.timedelta(hours=1),
        **opts,
    )
    assert before == []
    # Sampled every 5 s by the server, asked or not: a range that ended a moment ago (no
    # fresh sample is taken for it) fills up with them.
    def closed_range():
        end = now() - dt.timedelta(seconds=1)
        ms = Sandbox.get_metrics(sandbox.sandbox_id, end=end, **opts)
        assert all(m.timestamp <= end for m in ms), (end, ms)
        return ms if len(ms) >= 2 else None

    found = wait_for(closed_range, 30, "two periodic samples", 1)
    stamps = [m.timestamp for m in found]
    assert stamps == sorted(stamps)
    assert all(m.mem_total > 0 and m.cpu_count > 0 for m in found)
    # A bad time is a clear 400.
    r = http_request(
        husk.port,
        "GET",
        f"/sandboxes/{sandbox.sandbox_id}/metrics?start=yesterday",
        {"X-API-Key": husk.admin_key},
    )
    assert r.status == 400 and "start" in r.text, r.text


def test_metrics_of_unknown_sandbox(opts):
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics("nosuchsandbox0000000", **opts)


def test_envs_and_metadata_at_create(sandbox_factory):
    sbx = sandbox_factory(envs={"COMPAT_A": "alpha", "COMPAT_B": "with space"}, metadata={"k": "v"})
    r = sbx.commands.run('echo "$COMPAT_A|$COMPAT_B"')
    assert r.stdout == "alpha|with space\n"
    assert sbx.get_info().metadata == {"k": "v"}


def test_configuration_from_environment_only(husk, monkeypatch, cleanup_ids):
    """No per-call options at all: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY."""
    monkeypatch.setenv("E2B_API_URL", husk.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", husk.url)
    monkeypatch.setenv("E2B_API_KEY", husk.admin_key)
    tag = unique("env")
    sbx = Sandbox.create(timeout=60, metadata={"suite": tag})
    cleanup_ids.append((sbx.sandbox_id, husk.admin_key))
    assert sbx.commands.run("echo from-env").stdout == "from-env\n"
    sbx.files.write("/tmp/env.txt", "env")
    assert sbx.files.read("/tmp/env.txt") == "env"
    found = Sandbox.list(query=SandboxQuery(metadata={"suite": tag})).next_items()
    assert [s.sandbox_id for s in found] == [sbx.sandbox_id]
    assert Sandbox.connect(sbx.sandbox_id).commands.run("echo again").stdout == "again\n"
    assert sbx.kill() is True
    assert sbx.is_running() is False


def test_many_sandboxes_are_isolated(sandbox_factory):
    a = sandbox_factory()
    b = sandbox_factory()
    assert a.sandbox_id != b.sandbox_id
    a.files.write("/tmp/only-in-a", "a")
    assert a.files.exists("/tmp/only-in-a")
    assert not b.files.exists("/tmp/only-in-a")
    a.commands.run("sleep 30 >/dev/null 2>&1 &")
    pids_b = b.commands.run("ps -e -o comm=").stdout.split()
    assert "sleep" not in pids_b


def test_sandboxes_have_the_domain_the_operator_names(sandbox, husk):
    # Without `--domain` there is none (the SDK then falls back to its own default).
    raw = http_request(
        husk.port, "GET", f"/sandboxes/{sandbox.sandbox_id}", {"X-API-Key": husk.admin_key}
    )
    assert raw.json()["domain"] is None, raw.text
    server = start_server(extra_args=("--domain", "Sandboxes.Husk.Test"))
    try:
        sbx = Sandbox.create(timeout=60, **server.opts())
        try:
            assert sbx.sandbox_domain == "sandboxes.husk.test"
            assert sbx.get_host(8000) == f"8000-{sbx.sandbox_id}.sandboxes.husk.test"
            connected = Sandbox.connect(sbx.sandbox_id, **server.opts())
            assert connected.sandbox_domain == "sandboxes.husk.test"
            # The host the SDK would use without E2B_SANDBOX_URL routes to the sandbox.
            r = http_request(
                server.port, "GET", "/health", {"Host": f"49983-{sbx.sandbox_id}.sandboxes.husk.test"}
            )
            assert r.status == 204, (r.status, r.text)
            raw = http_request(
                server.port,
                "GET",
                f"/sandboxes/{sbx.sandbox_id}",
                {"X-API-Key": server.admin_key},
            )
            assert raw.json()["domain"] == "sandboxes.husk.test", raw.text
        finally:
            sbx.kill()
    finally:
        server.close()
