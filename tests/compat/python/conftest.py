"""Fixtures for husk's compatibility tests with the stock `e2b` Python SDK (pinned 2.63.0).

One `husk serve` per test session (fresh state dir, random port on 127.0.0.1), stopped with
SIGTERM at the end. Every sandbox a test creates is killed in teardown, pass or fail."""

from __future__ import annotations

import os
import warnings
from typing import Callable, List, Tuple

import pytest
import pytest_asyncio

from e2b import AsyncSandbox, Sandbox

from husk_compat import (
    CODE_INTERPRETER_PRESETS,
    PRESETS_DIR,
    HuskServer,
    build_template,
    create_raw_sandbox,
    kill_raw_sandbox,
    remove_template,
    start_server,
)


@pytest.fixture(scope="session")
def husk() -> HuskServer:
    if os.geteuid() != 0:
        pytest.exit("husk serve needs root (namespaces, cgroups, mounts): run as root", 2)
    try:
        server = start_server()
    except RuntimeError as e:
        pytest.exit(str(e), 2)
    # Safety net: an SDK call that forgot its per-call URLs still reaches this server and
    # nothing else. No API key is set here, so such a call fails loudly instead of passing.
    # E2B_VOLUME_API_URL: the volume content API, which the SDKs do not look for at
    # E2B_API_URL (see the README, "E2B's volume API").
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_VOLUME_API_URL", "E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG", "HUSK_DATABASE_URL", "HUSK_NODE_NAME")}
    # On PostgreSQL (HUSK_COMPAT_STORE=postgres), the tests' own `husk template …` and
    # `husk key …` commands must reach the session server's database.
    if server.database_url:
        os.environ.update({k: v for k, v in server.store_env().items() if k.startswith("HUSK_")})
    os.environ["E2B_API_URL"] = server.url
    os.environ["E2B_SANDBOX_URL"] = server.url
    os.environ["E2B_VOLUME_API_URL"] = server.url
    for k in ("E2B_API_KEY", "E2B_DOMAIN", "E2B_DEBUG"):
        os.environ.pop(k, None)
    try:
        yield server
    finally:
        _warn_about_leftover_sandboxes(server)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        rc, log_tail = server.close()
        if rc not in (0, None):
            print(f"\nhusk serve exited with {rc}; last log lines:\n{log_tail}")


def _warn_about_leftover_sandboxes(server: HuskServer) -> None:
    """Every test kills what it made; anything still running at the end is a leak in a test."""
    left = set()
    for key in {server.admin_key, *server.extra_keys.values()}:
        try:
            paginator = Sandbox.list(**server.opts(api_key=key))
            while paginator.has_next:
                left |= {s.sandbox_id for s in paginator.next_items()}
        except Exception:
            pass
    if left:
        warnings.warn(f"{len(left)} sandbox(es) still running at the end of the session: {sorted(left)}")


@pytest.fixture(scope="session")
def other_key(husk: HuskServer) -> str:
    """An API key of a second team (`husk key create --team other`)."""
    return husk.create_key("other")


@pytest.fixture
def opts(husk: HuskServer) -> dict:
    return husk.opts()


@pytest.fixture
def sandbox_factory(husk: HuskServer) -> Callable[..., Sandbox]:
    """Creates sandboxes with the stock SDK (admin key unless `api_key=` is given); kills
    every one of them in teardown."""
    made: List[Tuple[str, str]] = []

    def make(**kwargs) -> Sandbox:
        api_key = kwargs.pop("api_key", None) or husk.admin_key
        kwargs.setdefault("timeout", 120)
        sbx = Sandbox.create(**kwargs, **husk.opts(api_key=api_key))
        made.append((sbx.sandbox_id, api_key))
        return sbx

    yield make
    for sandbox_id, api_key in made:
        try:
            Sandbox.kill(sandbox_id, **husk.opts(api_key=api_key))
        except Exception:
            pass


@pytest.fixture
def sandbox(sandbox_factory) -> Sandbox:
    return sandbox_factory()


@pytest.fixture
def cleanup_ids(husk: HuskServer):
    """A list tests (e.g. async or raw-HTTP ones) append (sandbox_id, api_key) to; each is
    killed in teardown with the sync SDK."""
    ids: List[Tuple[str, str]] = []
    yield ids
    for sandbox_id, api_key in ids:
        try:
            Sandbox.kill(sandbox_id, **husk.opts(api_key=api_key))
        except Exception:
            pass


class TokenedSandbox:
    """A sandbox created with plain HTTP (so the test knows its envd access token) and
    driven with the stock SDK through `Sandbox.connect`."""

    def __init__(self, sbx: Sandbox, token: str):
        self.sbx = sbx
        self.token = token
        self.id = sbx.sandbox_id


@pytest.fixture
def tokened_sandbox(husk: HuskServer):
    made = []

    def make(api_key=None, **kwargs) -> TokenedSandbox:
        key = api_key or husk.admin_key
        raw = create_raw_sandbox(husk.port, key, **kwargs)
        made.append((raw["sandboxID"], key))
        sbx = Sandbox.connect(raw["sandboxID"], **husk.opts(api_key=key))
        return TokenedSandbox(sbx, raw["envdAccessToken"])

    yield make
    for sandbox_id, key in made:
        kill_raw_sandbox(husk.port, key, sandbox_id)


# --------------------------------------------------------------------------------------------
# The code interpreter (e2b-code-interpreter==2.11.5)


@pytest.fixture(scope="session")
def ci_husk(husk: HuskServer) -> HuskServer:
    """A `husk serve` of its own for the code-interpreter suites, with husk's `base` and
    `code-interpreter` presets (templates/) built into its state directory with the shared layer
    cache. Not the session's main server: a built `base` would replace the host template as
    every other test's default. (Depends on `husk` only for its environment safety net.)
    The code-interpreter modules mark their tests `timeout(..., func_only=True)`, so this
    fixture's builds (seconds with a warm layer cache, minutes cold) are bounded by their own
    timeout, not the per-test one. The templates are removed and the server stopped at the end."""
    server = start_server()
    built = []
    try:
        for preset in CODE_INTERPRETER_PRESETS:
            line = build_template(server, PRESETS_DIR / preset)
            built.append(preset)
            print(f"\ncode-interpreter suite: {line}")
        yield server
    finally:
        _warn_about_leftover_sandboxes(server)
        for preset in reversed(built):
            remove_template(server, preset)
        rc, log_tail = server.close()
        if rc not in (0, None):
            print(f"\nhusk serve (code interpreter) exited with {rc}; last log lines:\n{log_tail}")


@pytest.fixture
def ci_sandbox_factory(ci_husk: HuskServer):
    """Creates code-interpreter sandboxes with the stock SDK (`e2b_code_interpreter.Sandbox`;
    its default template, `code-interpreter-v1`, unless one is given) on `ci_husk`; kills every
    one of them in teardown."""
    from e2b_code_interpreter import Sandbox as CodeSandbox

    made: List[str] = []

    def make(template=None, **kwargs) -> CodeSandbox:
        kwargs.setdefault("timeout", 180)
        if template is not None:
            kwargs["template"] = template
        sbx = CodeSandbox.create(**kwargs, **ci_husk.opts())
        made.append(sbx.sandbox_id)
        return sbx

    yield make
    for sandbox_id in made:
        try:
            CodeSandbox.kill(sandbox_id, **ci_husk.opts())
        except Exception:
            pass


@pytest.fixture
def ci_cleanup_ids(ci_husk: HuskServer):
    """Sandbox ids (e.g. of async sandboxes) killed on `ci_husk` in teardown."""
    ids: List[str] = []
    yield ids
    for sandbox_id in ids:
        try:
            Sandbox.kill(sandbox_id, **ci_husk.opts())
        except Exception:
            pass


# Async sandboxes with the stock AsyncSandbox, killed in teardown pass or fail (test_async.py,
# test_pause_async.py).
@pytest_asyncio.fixture
async def asbx_factory(husk):
    made = []

    async def make(api_key=None, **kwargs) -> AsyncSandbox:
        key = api_key or husk.admin_key
        kwargs.setdefault("timeout", 120)
        sbx = await AsyncSandbox.create(**kwargs, **husk.opts(api_key=key))
        made.append((sbx.sandbox_id, key))
        return sbx

    yield make
    for sandbox_id, key in made:
        try:
            await AsyncSandbox.kill(sandbox_id, **husk.opts(api_key=key))
        except Exception:
            pass
