"""The operator's metrics (`husk serve --metrics-listen`), read as Prometheus reads them.

A server with a warm pool of `base` and a metrics listener of its own: creates through the stock
SDK (`e2b.Sandbox`, pinned 2.63.0), one the pool serves, one of an unknown template, one over a
team's quota, then kills (counted as ends); after each step `/metrics` is parsed with
prometheus_client's own text parser (the format Prometheus scrapes) and its counts checked
against what was done. The API's listener does not serve the metrics, to a key of any team or
to nobody; the metrics listener serves nothing else. (A cluster's nodes: test_cluster.py.)"""

from __future__ import annotations

import time

import pytest
from e2b import Sandbox

from husk_compat import (
    METRICS_RE,
    http_request,
    metric as value,
    metrics_port,
    scrape_metrics as scrape,
    start_server,
)

pytestmark = pytest.mark.timeout(180, func_only=True)


def creates(families: dict, source: str) -> float:
    return value(families, "husk_sandbox_creates", "husk_sandbox_creates_total", source=source)


def failures(families: dict, reason: str) -> float:
    return value(
        families,
        "husk_sandbox_create_failures",
        "husk_sandbox_create_failures_total",
        reason=reason,
    )


def running(families: dict) -> float:
    return value(families, "husk_sandboxes", "husk_sandboxes", state="running")


def pool(families: dict, family: str, sample: str = "") -> float:
    return value(families, family, sample or family, template="base")


def wait_until(port: int, what: str, check, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        families = scrape(port)
        if check(families):
            return families
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def metered():
    server = start_server(extra_args=("--warm", "base=1", "--metrics-listen", "127.0.0.1:0"))
    try:
        yield server
    finally:
        server.close()


def test_creates_kills_and_the_pool_are_counted_as_they_happen(metered):
    port = metrics_port(metered)
    before = wait_until(
        port, "the pool to fill", lambda f: pool(f, "husk_pool_ready") == 1
    )
    assert pool(before, "husk_pool_target") == 1
    assert running(before) == 0
    assert creates(before, "pool") + creates(before, "new") == 0
    # The families Prometheus expects, of the types it expects.
    types = {name: f.type for name, f in before.items()}
    for name, kind in [
        ("husk_build_info", "gauge"),
        ("husk_spawners", "gauge"),
        ("husk_sandboxes", "gauge"),
        ("husk_sandbox_creates", "counter"),
        ("husk_sandbox_create_failures", "counter"),
        ("husk_sandbox_ends", "counter"),
        ("husk_sandbox_create_duration_seconds", "histogram"),
        ("husk_pool_ready", "gauge"),
        ("husk_pool_claims", "counter"),
        ("husk_host_memory_available_bytes", "gauge"),
        ("husk_memory_reserve_bytes", "gauge"),
    ]:
        assert types.get(name) == kind, f"{name}: {types.get(name)}"
    assert value(before, "husk_spawners", "husk_spawners") >= 1
    assert value(before, "husk_host_memory_available_bytes", "husk_host_memory_available_bytes") > 0

    first = Sandbox.create(template="base", **metered.opts())
    second = Sandbox.create(template="base", **metered.opts())
    try:
        after = scrape(port)
        assert running(after) == 2
        # The first claimed the warm sandbox; the second found the pool refilled or not.
        from_pool = creates(after, "pool")
        assert from_pool >= 1
        assert from_pool + creates(after, "new") == 2
        assert pool(after, "husk_pool_claims", "husk_pool_claims_total") == from_pool
        # Each good create is in its source's histogram: buckets never fall, +Inf is the count.
        for source, n in [("pool", from_pool), ("new", 2 - from_pool)]:
            buckets = [
                (float(s.labels["le"]), s.value)
                for s in after["husk_sandbox_create_duration_seconds"].samples
                if s.name.endswith("_bucket") and s.labels["source"] == source
            ]
            assert buckets == sorted(buckets), buckets
            assert buckets[-1] == (float("inf"), n), buckets
            count = value(
                after,
                "husk_sandbox_create_duration_seconds",
                "husk_sandbox_create_duration_seconds_count",
                source=source,
            )
            assert count == n
        assert failures(after, "rejected") == 0

        # An unknown template and a full quota: the request's fault, counted as rejected.
        with pytest.raises(Exception):
            Sandbox.create(template="no-such-template", **metered.opts())
        metered.set_quota("default", 2)
        try:
            with pytest.raises(Exception):
                Sandbox.create(template="base", **metered.opts())
        finally:
            metered.set_quota("default", 100)
        rejected = scrape(port)
        assert failures(rejected, "rejected") == 2
        assert failures(rejected, "failed") == 0
        assert creates(rejected, "pool") + creates(rejected, "new") == 2
    finally:
        first.kill()
        second.kill()
    ended = wait_until(port, "the kills to show", lambda f: running(f) == 0)
    assert value(ended, "husk_sandbox_ends", "husk_sandbox_ends_total", reason="killed") == 2
    assert value(ended, "husk_sandbox_ends", "husk_sandbox_ends_total", reason="agent_gone") == 0


def test_the_metrics_are_on_their_own_listener_only(metered):
    port = metrics_port(metered)
    # Not on the API's listener, for an admin, another team or nobody.
    other = metered.create_key("metrics-other-team")
    for headers in ({"X-API-Key": metered.admin_key}, {"X-API-Key": other}, {}):
        r = http_request(metered.port, "GET", "/metrics", headers)
        assert r.status in (401, 404), (headers.keys(), r.status, r.text)
        assert b"husk_" not in r.body
    # The metrics listener serves GET /metrics and nothing else.
    for method, path, status in [
        ("GET", "/", 404),
        ("GET", "/v2/sandboxes", 404),
        ("GET", "/husk/v1/pools", 404),
        ("POST", "/metrics", 405),
    ]:
        r = http_request(port, method, path, {"X-API-Key": metered.admin_key})
        assert r.status == status, (method, path, r.status, r.text)
        assert b"husk_sandbox" not in r.body


def test_without_the_flag_there_is_no_metrics_listener():
    server = start_server()
    try:
        assert METRICS_RE.search(server.log_path.read_bytes()) is None, server.log_tail()
    finally:
        server.close()


def test_the_variable_opens_the_listener_as_the_flag_does():
    # HUSK_METRICS_LISTEN is how deploy/kubernetes/components/metrics sets it.
    server = start_server(env_extra={"HUSK_METRICS_LISTEN": "127.0.0.1:0"})
    try:
        families = scrape(metrics_port(server))
        assert families["husk_build_info"].type == "gauge", sorted(families)
        assert families["husk_sandboxes"].type == "gauge", sorted(families)
    finally:
        server.close()
