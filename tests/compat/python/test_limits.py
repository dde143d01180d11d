"""Quotas, disk limits and features husk does not offer: each gets a clear answer, and the
server, the team's other sandboxes and the failing sandbox itself stay usable."""

from __future__ import annotations

import pytest
from e2b import Sandbox, SandboxException

from husk_compat import create_raw_sandbox, http_request, kill_raw_sandbox, start_server, unique


def test_team_quota_is_enforced_with_429(husk):
    team = unique("quota")
    key = husk.create_key(team)
    husk.set_quota(team, 2)
    first = [Sandbox.create(timeout=60, **husk.opts(api_key=key)) for _ in range(2)]
    try:
        r = http_request(
            husk.port,
            "POST",
            "/v2/sandboxes",
            {"X-API-KEY": key, "Content-Type": "application/json"},
            b'{"templateID": "base"}',
        )
        assert r.status == 429, r.text
        assert "limit of 2" in r.json()["message"]
        # The SDK gets the message too (and does not retry a quota).
        with pytest.raises(SandboxException) as ei:
            Sandbox.create(timeout=60, **husk.opts(api_key=key))
        assert "limit of 2" in str(ei.value)
        # The team's sandboxes are untouched; another team is not limited by this quota.
        assert all(s.commands.run("echo ok").stdout == "ok\n" for s in first)
        other = create_raw_sandbox(husk.port, husk.admin_key)
        kill_raw_sandbox(husk.port, husk.admin_key, other["sandboxID"])
        # With one killed, there is room again.
        first.pop().kill()
        first.append(Sandbox.create(timeout=60, **husk.opts(api_key=key)))
    finally:
        for s in first:
            s.kill()


def test_unsupported_features_answer_501_with_a_message(husk, sandbox):
    # (Forks and snapshots are supported now: test_snapshots.py.)
    for method, path in [
        ("PUT", f"/sandboxes/{sandbox.sandbox_id}/network"),
    ]:
        r = http_request(husk.port, method, path, {"X-API-KEY": husk.admin_key}, b"{}")
        assert r.status == 501, (path, r.status, r.text)
        # This suite's server runs without egress: a network change says how to get one.
        expected = "--egress" if path.endswith("/network") else "not supported by husk"
        assert expected in r.json()["message"], (path, r.text)
        # Without a valid key, nothing is said about the feature.
        r = http_request(husk.port, method, path, {"X-API-KEY": "e2b_" + "0" * 40}, b"{}")
        assert r.status == 401, (path, r.status)
    assert sandbox.is_running()


def test_a_full_disk_is_507_and_the_sandbox_goes_on():
    server = start_server(extra_args=("--disk", "16M"))
    try:
        sbx = Sandbox.create(timeout=60, **server.opts())
        try:
            with pytest.raises(SandboxException) as ei:
                sbx.files.write("/tmp/too-big.bin", b"x" * (24 << 20))
            assert "507" in str(ei.value) or "disk" in str(ei.value).lower(), ei.value
            # The sandbox still works, and frees space as usual.
            sbx.files.remove("/tmp/too-big.bin")
            sbx.files.write("/tmp/small.txt", "fits")
            assert sbx.files.read("/tmp/small.txt") == "fits"
        finally:
            sbx.kill()
    finally:
        server.close()
