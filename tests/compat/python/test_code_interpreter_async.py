"""The code interpreter through the stock async SDK (`e2b_code_interpreter.AsyncSandbox`,
pinned 2.11.5), more briefly than test_code_interpreter.py: state, contexts, async callbacks,
errors, charts, env vars, timeouts with reuse, restart, bash, bad input, a killed sandbox, and
two contexts running at the same time.

Runs against `ci_husk` (conftest.py). Every sandbox is killed in teardown (`ci_cleanup_ids`)."""

from __future__ import annotations

import asyncio
import base64
import time

import pytest
from e2b import InvalidArgumentException, NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import AsyncSandbox, Context

# Tests bound their own body; the session fixture that builds the templates is not counted.
pytestmark = pytest.mark.timeout(120, func_only=True)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def stdout_of(execution) -> str:
    return "".join(execution.logs.stdout)


@pytest.fixture
def make(ci_husk, ci_cleanup_ids):
    async def create(template=None, **kwargs) -> AsyncSandbox:
        kwargs.setdefault("timeout", 180)
        if template is not None:
            kwargs["template"] = template
        sbx = await AsyncSandbox.create(**kwargs, **ci_husk.opts())
        ci_cleanup_ids.append(sbx.sandbox_id)
        return sbx

    return create


@pytest.mark.asyncio
async def test_state_and_execution_count(make):
    sbx = await make()
    a = await sbx.run_code("x = 20")
    b = await sbx.run_code("x += 1; x * 2")
    assert a.error is None and b.error is None, (a.error, b.error)
    assert b.text == "42"
    assert b.execution_count == a.execution_count + 1
    named = await make("code-interpreter")
    assert (await named.run_code("'named'")).text == "named"


@pytest.mark.asyncio
async def test_contexts(make):
    sbx = await make()
    ctx = await sbx.create_code_context(cwd="/tmp")
    assert (ctx.language, ctx.cwd) == ("python", "/tmp")
    assert (await sbx.run_code("only_here = 1", context=ctx)).error is None
    r = await sbx.run_code("only_here")
    assert r.error is not None and r.error.name == "NameError"
    assert stdout_of(await sbx.run_code("import os; print(os.getcwd())", context=ctx)) == "/tmp\n"
    assert ctx.id in {c.id for c in await sbx.list_code_contexts()}

    await sbx.restart_code_context(ctx)
    r = await sbx.run_code("only_here", context=ctx)
    assert r.error is not None and r.error.name == "NameError"
    assert (await sbx.run_code("2 + 2", context=ctx)).text == "4"

    await sbx.remove_code_context(ctx.id)
    assert ctx.id not in {c.id for c in await sbx.list_code_contexts()}
    with pytest.raises(NotFoundException):
        await sbx.run_code("1", context=ctx)


@pytest.mark.asyncio
async def test_async_and_sync_callbacks(make):
    sbx = await make()
    events = []

    async def on_stdout(m):
        await asyncio.sleep(0)
        events.append(("stdout", m.line))

    async def on_result(res):
        events.append(("result", res.is_main_result, res.text))

    r = await sbx.run_code(
        "import sys, time\n"
        "print('one', flush=True)\n"
        "time.sleep(0.3)\n"
        "print('two', file=sys.stderr, flush=True)\n"
        "time.sleep(0.3)\n"
        "display(3)\n"
        "4",
        on_stdout=on_stdout,
        on_stderr=lambda m: events.append(("stderr", m.line)),
        on_result=on_result,
    )
    assert r.error is None, r.error
    assert events == [("stdout", "one\n"), ("stderr", "two\n"), ("result", False, "3"), ("result", True, "4")]

    errors = []
    r = await sbx.run_code("import json; json.loads('{')", on_error=errors.append)
    assert r.error.name == "JSONDecodeError"
    assert "Expecting property name" in r.error.value
    assert "JSONDecodeError" in r.error.traceback
    assert errors and errors[0].name == "JSONDecodeError"


@pytest.mark.asyncio
async def test_chart_dataframe_and_envs(make):
    sbx = await make(envs={"HUSK_ASYNC_GLOBAL": "g"})
    r = await sbx.run_code("import matplotlib.pyplot as plt\nplt.scatter([1, 2], [3, 4])\nplt.show()")
    assert r.error is None, r.error
    [png] = [res.png for res in r.results if res.png]
    assert base64.b64decode(png).startswith(PNG_MAGIC)

    r = await sbx.run_code("import pandas as pd\npd.DataFrame({'n': [1, 2]})")
    assert r.results[0].data == {"n": [1, 2]}
    assert "<table" in r.results[0].html

    show = "import os; print(os.environ.get('HUSK_ASYNC_GLOBAL'), os.environ.get('HUSK_ASYNC_CALL'))"
    assert stdout_of(await sbx.run_code(show, envs={"HUSK_ASYNC_CALL": "c"})) == "g c\n"
    assert stdout_of(await sbx.run_code(show)) == "g None\n"


@pytest.mark.asyncio
async def test_timeout_then_reuse(make):
    sbx = await make()
    assert (await sbx.run_code("survivor = 'yes'")).error is None
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        await sbx.run_code("import time; time.sleep(30)", timeout=2)
    assert time.monotonic() - t0 < 15
    t1 = time.monotonic()
    r = await sbx.run_code("survivor", timeout=20)
    assert r.text == "yes", (r.results, r.error)
    assert time.monotonic() - t1 < 20


@pytest.mark.asyncio
async def test_two_contexts_run_at_the_same_time(make):
    sbx = await make()
    a, b = await asyncio.gather(sbx.create_code_context(), sbx.create_code_context())
    t0 = time.monotonic()
    ra, rb = await asyncio.gather(
        sbx.run_code("import time; time.sleep(3); 'a'", context=a, timeout=30),
        sbx.run_code("import time; time.sleep(3); 'b'", context=b, timeout=30),
    )
    elapsed = time.monotonic() - t0
    assert (ra.text, rb.text) == ("a", "b"), (ra, rb)
    assert elapsed < 5.5, f"two 3 s cells in two contexts took {elapsed:.1f} s"


@pytest.mark.asyncio
async def test_bash_bad_input_and_kill(make):
    sbx = await make()
    r = await sbx.run_code("for i in 1 2 3; do echo n$i; done", language="bash")
    assert stdout_of(r) == "n1\nn2\nn3\n"

    with pytest.raises(SandboxException) as e:
        await sbx.run_code("1", language="cobol")
    assert "cobol" in str(e.value)
    with pytest.raises(NotFoundException):
        await sbx.run_code("1", context=Context("nosuchcontext", "python", "/"))
    ctx = await sbx.create_code_context()
    with pytest.raises(InvalidArgumentException):
        await sbx.run_code("1", context=ctx, language="python")

    assert await sbx.kill() is True
    with pytest.raises(SandboxException):
        await sbx.run_code("1", timeout=20)


@pytest.mark.asyncio
async def test_killing_the_sandbox_during_run_code_raises_timeout(make, ci_husk):
    sbx = await make()
    started = asyncio.Event()
    running = asyncio.create_task(
        sbx.run_code(
            "print('go', flush=True)\nimport time\ntime.sleep(60)",
            on_stdout=lambda _m: started.set(),
            timeout=90,
        )
    )
    await asyncio.wait_for(started.wait(), 30)
    assert await AsyncSandbox.kill(sbx.sandbox_id, **ci_husk.opts()) is True
    with pytest.raises(TimeoutException) as e:
        await asyncio.wait_for(running, 30)
    assert "killed while the request was in progress" in str(e.value), str(e.value)
