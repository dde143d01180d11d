"""Tenancy: a second team (its own key from `husk key create --team other`) sees nothing of the
first team's sandboxes, and one sandbox's credentials open no other sandbox."""

from __future__ import annotations

import pytest

from e2b import Sandbox, SandboxNotFoundException, SandboxQuery

from husk_compat import fetch_url as fetch
from husk_compat import http_request, sandbox_headers, unique


def ids(paginator):
    out = set()
    while paginator.has_next:
        out |= {s.sandbox_id for s in paginator.next_items()}
    return out


def test_second_key_is_another_team(husk, other_key):
    assert other_key != husk.admin_key
    assert other_key.startswith("e2b_")


def test_other_team_cannot_see_or_touch(sandbox_factory, husk, other_key):
    tag = unique("tenant")
    mine = sandbox_factory(metadata={"suite": tag})
    theirs = husk.opts(api_key=other_key)

    assert mine.sandbox_id not in ids(Sandbox.list(**theirs))
    assert ids(Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), **theirs)) == set()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(mine.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.connect(mine.sandbox_id, **theirs)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout(mine.sandbox_id, 5, **theirs)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_metrics(mine.sandbox_id, **theirs)
    assert Sandbox.kill(mine.sandbox_id, **theirs) is False

    # None of that changed anything for the owner.
    assert mine.is_running()
    info = mine.get_info()
    assert (info.end_at - info.started_at).total_seconds() > 60
    assert mine.commands.run("echo still mine").stdout == "still mine\n"


def test_each_team_lists_its_own(sandbox_factory, husk, other_key):
    tag = unique("both")
    mine = sandbox_factory(metadata={"suite": tag})
    theirs = sandbox_factory(metadata={"suite": tag}, api_key=other_key)
    q = SandboxQuery(metadata={"suite": tag})
    assert ids(Sandbox.list(query=q, **husk.opts(api_key=other_key))) == {theirs.sandbox_id}
    assert mine.sandbox_id in ids(Sandbox.list(query=q, **husk.opts()))
    # The other team drives its own sandbox normally.
    assert theirs.commands.run("whoami").stdout == "user\n"
    assert Sandbox.get_info(theirs.sandbox_id, **husk.opts(api_key=other_key)).metadata == {"suite": tag}


def test_other_team_raw_http_gets_404(husk, other_key, sandbox):
    for method, path in [
        ("GET", f"/sandboxes/{sandbox.sandbox_id}"),
        ("DELETE", f"/sandboxes/{sandbox.sandbox_id}"),
        ("GET", f"/sandboxes/{sandbox.sandbox_id}/metrics"),
    ]:
        r = http_request(husk.port, method, path, {"X-API-Key": other_key})
        assert r.status == 404, (method, path, r.status, r.text)
    r = http_request(
        husk.port,
        "POST",
        f"/sandboxes/{sandbox.sandbox_id}/timeout",
        {"X-API-Key": other_key, "Content-Type": "application/json"},
        b'{"timeout": 1}',
    )
    assert r.status == 404
    r = http_request(
        husk.port,
        "POST",
        f"/v2/sandboxes/{sandbox.sandbox_id}/connect",
        {"X-API-Key": other_key, "Content-Type": "application/json"},
        b'{"timeout": 60}',
    )
    assert r.status == 404
    assert sandbox.is_running()


def test_access_token_is_per_sandbox(tokened_sandbox, husk, other_key):
    a = tokened_sandbox()
    b = tokened_sandbox(api_key=other_key)
    assert a.token != b.token
    a.sbx.files.write("/tmp/a-secret", "only a")

    # b's token on a's sandbox: refused for RPCs and for /files.
    r = http_request(
        husk.port,
        "POST",
        "/filesystem.Filesystem/Stat",
        {**sandbox_headers(a.id, b.token), "Content-Type": "application/json", "Connect-Protocol-Version": "1"},
        b'{"path": "/tmp/a-secret"}',
    )
    assert r.status == 401, r.text
    assert "unauthorized" in r.text.lower()
    r = http_request(husk.port, "GET", "/files?path=/tmp/a-secret", sandbox_headers(a.id, b.token))
    assert r.status == 401
    assert b"only a" not in r.body

    # a's own token works (control).
    r = http_request(husk.port, "GET", "/files?path=/tmp/a-secret", sandbox_headers(a.id, a.token))
    assert (r.status, r.body) == (200, b"only a")


def test_signed_url_of_one_sandbox_opens_no_other(tokened_sandbox):
    a = tokened_sandbox()
    b = tokened_sandbox()
    a.sbx.files.write("/tmp/same-path", "a")
    b.sbx.files.write("/tmp/same-path", "b")
    url = a.sbx.download_url("/tmp/same-path")
    assert fetch(url, a.id) == (200, b"a")
    status, body = fetch(url, b.id)
    assert status == 401
    assert body != b"b"


def test_sandboxes_of_two_teams_are_isolated(sandbox_factory, other_key):
    a = sandbox_factory()
    b = sandbox_factory(api_key=other_key)
    a.files.write("/tmp/team-file", "a")
    assert not b.files.exists("/tmp/team-file")
    b.files.write("/tmp/team-file", "b")
    assert a.files.read("/tmp/team-file") == "a"
    assert b.files.read("/tmp/team-file") == "b"


def test_wrong_team_key_cannot_use_sdk_instance(sandbox, husk, other_key):
    """Control-plane calls from an instance made with the owner's key, but given the other
    team's key per call, are refused."""
    with pytest.raises(SandboxNotFoundException):
        sandbox.get_info(api_key=other_key)
    assert sandbox.kill(api_key=other_key) is False
    assert sandbox.is_running()
