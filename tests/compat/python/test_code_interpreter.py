"""The code interpreter through the stock sync SDK (`e2b_code_interpreter.Sandbox`, pinned
2.11.5): `run_code` on the Jupyter kernels husk's agent runs in sandboxes of the
`code-interpreter` preset (port 49999: `/execute` NDJSON, `/contexts`, `/health`; see
/work/shared/e2b-protocol.md §4).

Runs against `ci_husk` (conftest.py): a server of its own with the `base` and
`code-interpreter` presets built. The SDK's default template, `code-interpreter-v1`, is the
`code-interpreter` preset."""

from __future__ import annotations

import base64
import json
import time
from datetime import datetime

import pytest
from e2b import InvalidArgumentException, NotFoundException, SandboxException, TimeoutException
from e2b_code_interpreter import Context, Sandbox
from e2b_code_interpreter.charts import ChartType

from husk_compat import JUPYTER_PORT, http_request, sandbox_headers

# Tests bound their own body; the session fixture that builds the templates is not counted.
pytestmark = pytest.mark.timeout(120, func_only=True)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def stdout_of(execution) -> str:
    return "".join(execution.logs.stdout)


def timestamp_value(ts) -> float:
    """An OutputMessage timestamp as a number: the server sends the kernel message's date
    (ISO 8601), which the SDK passes through; an integer (epoch ns) is taken as is."""
    assert ts, f"empty timestamp {ts!r}"
    if isinstance(ts, (int, float)):
        return float(ts) / 1e9
    return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()


def raw_execute(ci_husk, sbx: Sandbox, body: dict, timeout: float = 60):
    """POST /execute with plain HTTP, named by the routing headers (port 49999) and carrying the
    access token, like the SDK."""
    headers = sandbox_headers(sbx.sandbox_id, sbx._envd_access_token, port=JUPYTER_PORT)
    headers["Content-Type"] = "application/json"
    return http_request(ci_husk.port, "POST", "/execute", headers, json.dumps(body).encode(), timeout=timeout)


def test_default_template_is_stateful(ci_sandbox_factory):
    sbx = ci_sandbox_factory()  # code-interpreter-v1
    first = sbx.run_code("x = 1")
    assert first.error is None, first.error
    assert first.results == []
    assert isinstance(first.execution_count, int) and first.execution_count >= 1
    second = sbx.run_code("x + 1")
    assert second.error is None, second.error
    assert [r.text for r in second.results] == ["2"]
    assert second.results[0].is_main_result is True
    assert second.text == "2"
    assert second.execution_count == first.execution_count + 1
    # The sandbox is an ordinary one too.
    assert sbx.commands.run("echo $HOME").stdout == "/home/user\n"


def test_template_by_name(ci_sandbox_factory):
    sbx = ci_sandbox_factory("code-interpreter")
    r = sbx.run_code("import sys; sys.version_info[:2]")
    assert r.error is None, r.error
    assert r.text == "(3, 11)"


def test_contexts_are_isolated(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    ctx = sbx.create_code_context()
    assert isinstance(ctx, Context) and ctx.id
    assert ctx.language == "python"
    assert ctx.cwd == "/home/user"
    assert sbx.run_code("secret = 41", context=ctx).error is None
    assert sbx.run_code("secret + 1", context=ctx).text == "42"

    # Not in the default context, nor in a second one.
    r = sbx.run_code("secret")
    assert r.error is not None and r.error.name == "NameError", r.error
    other = sbx.create_code_context(language="python")
    assert other.id != ctx.id
    r = sbx.run_code("secret", context=other)
    assert r.error is not None and r.error.name == "NameError", r.error

    listed = {c.id: c for c in sbx.list_code_contexts()}
    assert ctx.id in listed and other.id in listed, listed
    assert listed[ctx.id].language == "python" and listed[ctx.id].cwd == "/home/user"

    sbx.remove_code_context(other)
    assert other.id not in {c.id for c in sbx.list_code_contexts()}
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=other)
    # By id too; the first context still has its state.
    sbx.remove_code_context(ctx.id)
    assert ctx.id not in {c.id for c in sbx.list_code_contexts()}
    assert sbx.run_code("2 * 21").text == "42"


def test_default_contexts_are_listed(ci_sandbox_factory):
    # As on E2B: a new sandbox lists its default Python context, the one `run_code` uses.
    sbx = ci_sandbox_factory()
    listed = sbx.list_code_contexts()
    python = [c for c in listed if c.language == "python"]
    assert len(python) == 1, listed
    assert python[0].cwd == "/home/user"
    assert sbx.run_code("in_default = 7").error is None
    assert sbx.run_code("in_default", context=python[0]).text == "7"
    # A default context used first (bash) is listed from then on.
    assert not any(c.language == "bash" for c in listed)
    sbx.run_code("echo hi", language="bash")
    assert [c.language for c in sbx.list_code_contexts()].count("bash") == 1


def test_streaming_callbacks_in_order(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    events = []
    code = "\n".join([
        "import sys, time",
        "print('out-1', flush=True)",
        "time.sleep(0.3)",
        "print('err-1', file=sys.stderr, flush=True)",
        "time.sleep(0.3)",
        "print('out-2', flush=True)",
        "time.sleep(0.3)",
        "from IPython.display import display, Markdown",
        "display(Markdown('**shown**'))",
        "'last'",
    ])
    r = sbx.run_code(
        code,
        on_stdout=lambda m: events.append(("stdout", m)),
        on_stderr=lambda m: events.append(("stderr", m)),
        on_result=lambda res: events.append(("result", res)),
        on_error=lambda e: events.append(("error", e)),
    )
    assert r.error is None, r.error
    assert stdout_of(r) == "out-1\nout-2\n"
    assert "".join(r.logs.stderr) == "err-1\n"
    kinds = [k for k, _ in events]
    assert "error" not in kinds, events

    def first(kind, text):
        for i, (k, v) in enumerate(events):
            if k == kind and text in (v.line if k in ("stdout", "stderr") else (v.markdown or v.text or "")):
                return i
        raise AssertionError(f"no {kind} event with {text!r}: {events!r}")

    order = [first("stdout", "out-1"), first("stderr", "err-1"), first("stdout", "out-2"),
             first("result", "**shown**"), first("result", "last")]
    assert order == sorted(order), events
    msgs = [v for k, v in events if k in ("stdout", "stderr")]
    assert [m.error for m in msgs] == [k == "stderr" for k, _ in events if k in ("stdout", "stderr")]
    stamps = [timestamp_value(m.timestamp) for m in msgs]
    assert stamps == sorted(stamps), stamps
    assert abs(stamps[0] - time.time()) < 300, stamps
    # The display is not the main result; the last expression is.
    results = [v for k, v in events if k == "result"]
    assert [res.is_main_result for res in results] == [False, True]
    # text/plain of a str, with one level of single quotes stripped (as E2B's server does).
    assert results[1].text == "last"
    assert r.results == results


def test_error_has_name_value_and_traceback(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    seen = []
    r = sbx.run_code("print('before')\n1 / 0", on_error=seen.append)
    assert r.error is not None
    assert r.error.name == "ZeroDivisionError"
    assert r.error.value == "division by zero"
    assert isinstance(r.error.traceback, str) and "ZeroDivisionError" in r.error.traceback
    assert seen and seen[0].name == "ZeroDivisionError"
    assert stdout_of(r) == "before\n"
    assert r.results == []
    r = sbx.run_code("raise ValueError('boom ' + 'bang')")
    assert (r.error.name, r.error.value) == ("ValueError", "boom bang")
    # The kernel is fine afterwards.
    assert sbx.run_code("6 * 7").text == "42"


def test_matplotlib_chart_is_a_png(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    r = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.title('squares')\n"
        "plt.show()"
    )
    assert r.error is None, r.error
    pngs = [res for res in r.results if res.png]
    assert len(pngs) == 1, r.results
    png = base64.b64decode(pngs[0].png)
    assert png.startswith(PNG_MAGIC)
    assert len(png) > 1000
    assert pngs[0].is_main_result is False
    # husk's startup file adds the figure as data (e2b/chart, via e2b-charts).
    chart = pngs[0].chart
    assert chart is not None, pngs[0].formats()
    assert chart.type == ChartType.LINE and chart.title == "squares"
    # A figure as the last expression is the main result.
    r = sbx.run_code("fig = plt.figure(); plt.bar(['a', 'b'], [3, 5]); fig")
    assert r.error is None, r.error
    main = [res for res in r.results if res.is_main_result]
    assert len(main) == 1 and main[0].png, r.results
    assert base64.b64decode(main[0].png).startswith(PNG_MAGIC)
    assert main[0].chart is not None and main[0].chart.type == ChartType.BAR


def test_box_and_whisker_chart(ci_sandbox_factory):
    # E2B's own example of a box-and-whisker chart (its charts package's test).
    sbx = ci_sandbox_factory()
    r = sbx.run_code(
        "import matplotlib.pyplot as plt\n"
        "data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87],\n"
        "        'Class C': [75, 82, 88, 79, 86]}\n"
        "fig, ax = plt.subplots(figsize=(10, 6))\n"
        "ax.boxplot(data.values(), tick_labels=data.keys(), patch_artist=True)\n"
        "ax.set_title('Exam Scores Distribution')\n"
        "ax.set_xlabel('Class')\n"
        "ax.set_ylabel('Score')\n"
        "plt.show()"
    )
    assert r.error is None, r.error
    charts = [res.chart for res in r.results if res.chart is not None]
    assert len(charts) == 1, [res.formats() for res in r.results]
    chart = charts[0]
    assert chart.type == ChartType.BOX_AND_WHISKER, chart.type
    assert chart.title == "Exam Scores Distribution"
    assert (chart.x_label, chart.y_label) == ("Class", "Score")
    boxes = chart.elements
    assert [b.label for b in boxes] == ["Class A", "Class B", "Class C"]
    a = boxes[0]
    assert (a.min, a.median, a.max) == (78, 88, 92), a
    assert a.first_quartile <= a.median <= a.third_quartile


def test_an_image_a_cell_saves_or_shows_is_a_png_result(ci_sandbox_factory):
    # As on E2B: PIL's Image.save(path) and Image.show() also display the image.
    sbx = ci_sandbox_factory()
    r = sbx.run_code(
        "from PIL import Image\n"
        "img = Image.new('RGB', (40, 30), (200, 20, 20))\n"
        "img.save('red.png')\n"
        "print('saved')"
    )
    assert r.error is None, r.error
    assert "".join(r.logs.stdout) == "saved\n"
    pngs = [base64.b64decode(res.png) for res in r.results if res.png]
    assert len(pngs) == 1 and pngs[0].startswith(PNG_MAGIC), r.results
    # The file is written too, where the cell said.
    assert sbx.files.read("/home/user/red.png", format="bytes").startswith(PNG_MAGIC)
    # show() displays instead of looking for a viewer; saving to a file object does not.
    r = sbx.run_code(
        "import io\n"
        "img.show()\n"
        "img.save(io.BytesIO(), format='PNG')"
    )
    assert r.error is None, r.error
    assert len([res for res in r.results if res.png]) == 1, r.results


def test_dataframe_as_html_and_data(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    r = sbx.run_code(
        "import pandas as pd\n"
        "pd.DataFrame({'a': [1, 2, 3], 'b': ['x', 'y', None], 'c': [0.5, float('nan'), 2.5]})"
    )
    assert r.error is None, r.error
    assert len(r.results) == 1
    res = r.results[0]
    assert res.is_main_result
    assert "<table" in res.html and "<th>a</th>" in res.html
    assert res.data == {"a": [1, 2, 3], "b": ["x", "y", None], "c": [0.5, None, 2.5]}
    assert "a" in res.text and "x" in res.text
    assert set(res.formats()) >= {"text", "html", "data"}


def test_display_data_are_not_main_results(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    r = sbx.run_code(
        "from IPython.display import display, HTML, JSON, Markdown\n"
        "display(HTML('<b>bold</b>'))\n"
        "display(Markdown('# title'))\n"
        "display(JSON({'k': [1, 2]}))\n"
        "40 + 2"
    )
    assert r.error is None, r.error
    assert [res.is_main_result for res in r.results] == [False, False, False, True]
    assert r.results[0].html == "<b>bold</b>"
    assert r.results[1].markdown == "# title"
    assert r.results[2].json == {"k": [1, 2]}
    assert r.results[3].text == "42"
    assert r.text == "42"


def test_env_vars_per_call_and_global(ci_sandbox_factory):
    sbx = ci_sandbox_factory(envs={"HUSK_GLOBAL": "global-value"})
    show = "import os; print(os.environ.get('HUSK_GLOBAL'), os.environ.get('HUSK_CALL'))"
    assert stdout_of(sbx.run_code(show)) == "global-value None\n"
    r = sbx.run_code(show, envs={"HUSK_CALL": "call-value", "HUSK_GLOBAL": "overridden"})
    assert r.error is None, r.error
    assert stdout_of(r) == "overridden call-value\n"
    # Only for that call.
    assert stdout_of(sbx.run_code(show)) == "global-value None\n"
    # Global ones reach new contexts too; per-call ones work in them.
    ctx = sbx.create_code_context()
    assert stdout_of(sbx.run_code(show, context=ctx)) == "global-value None\n"
    assert stdout_of(sbx.run_code(show, context=ctx, envs={"HUSK_CALL": "c2"})) == "global-value c2\n"
    assert stdout_of(sbx.run_code(show, context=ctx)) == "global-value None\n"


def test_context_cwd(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    ctx = sbx.create_code_context(cwd="/tmp")
    assert ctx.cwd == "/tmp"
    assert stdout_of(sbx.run_code("import os; print(os.getcwd())", context=ctx)) == "/tmp\n"
    assert stdout_of(sbx.run_code("import os; print(os.getcwd())")) == "/home/user\n"
    listed = {c.id: c for c in sbx.list_code_contexts()}
    assert listed[ctx.id].cwd == "/tmp"


def test_timeout_interrupts_and_the_context_is_reused(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    ctx = sbx.create_code_context()
    assert sbx.run_code("kept = 7", context=ctx).error is None
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code("import time; time.sleep(30)", context=ctx, timeout=2)
    assert time.monotonic() - t0 < 15
    # The client went away, so the server interrupted the kernel: the next call neither waits
    # for the sleep to end nor loses the context's state.
    t1 = time.monotonic()
    r = sbx.run_code("kept + 1", context=ctx, timeout=20)
    assert r.error is None, r.error
    assert r.text == "8"
    assert time.monotonic() - t1 < 20
    # The default context was never blocked.
    assert sbx.run_code("1 + 1", timeout=20).text == "2"


def test_restart_context(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    ctx = sbx.create_code_context()
    assert sbx.run_code("gone_after_restart = 5", context=ctx).error is None
    sbx.restart_code_context(ctx)
    r = sbx.run_code("gone_after_restart", context=ctx)
    assert r.error is not None and r.error.name == "NameError", r.error
    assert sbx.run_code("3 * 3", context=ctx).text == "9"
    # By id, and the default context.
    assert sbx.run_code("d = 1").error is None
    default_ctx = sbx.create_code_context()
    sbx.restart_code_context(default_ctx.id)
    assert sbx.run_code("1 + 2", context=default_ctx).text == "3"
    assert sbx.run_code("d").text == "1"  # another context: untouched


def test_killed_sandbox(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    assert sbx.run_code("1").text == "1"
    assert sbx.kill() is True
    with pytest.raises(SandboxException):
        sbx.run_code("1", timeout=20)
    with pytest.raises(SandboxException):
        sbx.create_code_context()


def test_the_base_template_has_the_commands_e2b_users_rely_on(ci_husk):
    # E2B's base image has these on PATH; code written for it calls them by these names.
    from e2b import Sandbox as BaseSandbox

    sbx = BaseSandbox.create("base", timeout=60, **ci_husk.opts())
    try:
        names = ["python", "python3", "pip", "pip3", "node", "npm", "git", "curl", "sudo"]
        r = sbx.commands.run(" && ".join(f"command -v {n}" for n in names))
        assert len(r.stdout.split()) == len(names), r.stdout
        assert sbx.commands.run("python --version").stdout.startswith("Python 3."), "python"
        assert sbx.commands.run("pip --version").stdout.startswith("pip "), "pip"
        assert sbx.commands.run("sudo whoami").stdout == "root\n"
        sbx.files.write("/home/user/script.py", "print(6 * 7)")
        assert sbx.commands.run("python script.py").stdout == "42\n"
    finally:
        sbx.kill()


def test_killing_the_sandbox_during_run_code_raises_timeout(ci_husk, ci_sandbox_factory):
    # E2B: the `/execute` stream breaks off, the SDK finds the sandbox gone and raises
    # TimeoutException "The sandbox was killed while the request was in progress".
    import threading

    sbx = ci_sandbox_factory()
    started = threading.Event()
    outcome = {}

    def run():
        try:
            outcome["ok"] = sbx.run_code(
                "print('go', flush=True)\nimport time\ntime.sleep(60)",
                on_stdout=lambda _m: started.set(),
                timeout=90,
            )
        except Exception as e:  # noqa: BLE001 - the test inspects whatever it was
            outcome["err"] = e

    t = threading.Thread(target=run)
    t.start()
    assert started.wait(30), "the cell did not start"
    assert Sandbox.kill(sbx.sandbox_id, **ci_husk.opts()) is True
    t.join(30)
    assert not t.is_alive(), "run_code still waits after the kill"
    err = outcome.get("err")
    assert isinstance(err, TimeoutException), outcome
    assert "killed while the request was in progress" in str(err), str(err)


def test_bad_language_context_id_and_both(ci_husk, ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    with pytest.raises(SandboxException) as e:
        sbx.run_code("1", language="cobol")
    assert "cobol" in str(e.value), str(e.value)
    with pytest.raises(SandboxException) as e:
        sbx.create_code_context(language="cobol")
    assert "cobol" in str(e.value), str(e.value)

    missing = Context("nosuchcontext", "python", "/home/user")
    with pytest.raises(NotFoundException):
        sbx.run_code("1", context=missing)
    with pytest.raises(NotFoundException):
        sbx.remove_code_context("nosuchcontext")
    with pytest.raises(NotFoundException):
        sbx.restart_code_context("nosuchcontext")

    ctx = sbx.create_code_context()
    # The SDK refuses both itself; the server does too.
    with pytest.raises(InvalidArgumentException):
        sbx.run_code("1", language="python", context=ctx)
    r = raw_execute(ci_husk, sbx, {"code": "1", "context_id": ctx.id, "language": "python"})
    assert r.status == 400, (r.status, r.text)
    assert "Only one of context_id or language can be provided" in r.text
    # Still usable.
    assert sbx.run_code("5", context=ctx).text == "5"


def test_wire_format_and_health(ci_husk, ci_sandbox_factory):
    """Below the SDK: the NDJSON lines of /execute and GET /health on port 49999."""
    sbx = ci_sandbox_factory()
    r = raw_execute(ci_husk, sbx, {"code": "print('hi')\n1 + 1", "context_id": None, "language": None,
                                   "env_vars": None})
    assert r.status == 200, (r.status, r.text)
    lines = [json.loads(line) for line in r.text.splitlines() if line.strip()]
    types = [line["type"] for line in lines if line["type"] != "keepalive"]
    assert types[0] == "number_of_executions" and isinstance(lines[0]["execution_count"], int), lines
    assert types[-1] == "end_of_execution", lines
    assert {"type": "stdout", "text": "hi\n", "timestamp": lines[types.index("stdout")]["timestamp"]} in lines
    result = next(line for line in lines if line["type"] == "result")
    assert result["is_main_result"] is True and result["text"] == "2", result
    assert "html" not in result  # exclude_none: absent formats are absent
    # JS sends only the keys it has.
    r = raw_execute(ci_husk, sbx, {"code": "3"})
    assert r.status == 200
    assert any(json.loads(line).get("text") == "3" for line in r.text.splitlines() if line.strip())

    h = http_request(ci_husk.port, "GET", "/health", sandbox_headers(sbx.sandbox_id, port=JUPYTER_PORT))
    assert h.status == 200, (h.status, h.text)
    assert "OK" in h.text


def test_the_port_wants_a_credential_the_sdk_sends(ci_husk, ci_sandbox_factory):
    """Port 49999 runs code as the sandbox's user: a public sandbox does not open it to whoever
    names the sandbox. The SDK's own calls (above) carry the access or traffic token; a raw
    call without one, or a browser-style text/plain POST, is refused and runs nothing."""
    sbx = ci_sandbox_factory()
    before = sorted(c.id for c in sbx.list_code_contexts())
    code = json.dumps({"code": "open('/tmp/pwned', 'w').write('x')"}).encode()
    bare = sandbox_headers(sbx.sandbox_id, port=JUPYTER_PORT)
    for method, path, body in (("POST", "/execute", code), ("GET", "/contexts", b""),
                               ("POST", "/contexts", b"{}")):
        r = http_request(ci_husk.port, method, path, {**bare, "Content-Type": "application/json"}, body)
        assert r.status == 401, (method, path, r.status, r.text)
    r = http_request(ci_husk.port, "POST", "/execute",
                     {"Host": f"49999-{sbx.sandbox_id}.e2b.app", "Content-Type": "text/plain"}, code)
    assert r.status == 401, (r.status, r.text)
    # With the token, a text/plain body is still refused (415).
    r = http_request(ci_husk.port, "POST", "/execute",
                     {**sandbox_headers(sbx.sandbox_id, sbx._envd_access_token, port=JUPYTER_PORT),
                      "Content-Type": "text/plain"}, code)
    assert r.status == 415, (r.status, r.text)
    assert sbx.run_code("import os; os.path.exists('/tmp/pwned')").text == "False"
    assert sorted(c.id for c in sbx.list_code_contexts()) == before


def test_bash(ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    r = sbx.run_code("echo hello-$((40 + 2))", language="bash")
    assert r.error is None, r.error
    assert stdout_of(r) == "hello-42\n"
    # The bash context keeps its state (variables, cwd) across calls.
    assert sbx.run_code("export HUSK_BASH=kept; cd /tmp", language="bash").error is None
    assert stdout_of(sbx.run_code("echo $HUSK_BASH $(pwd) $(whoami)", language="bash")) == "kept /tmp user\n"
    # A bash context of its own does not share it.
    ctx = sbx.create_code_context(language="bash")
    assert ctx.language == "bash"
    assert stdout_of(sbx.run_code("echo \"[$HUSK_BASH]\"", context=ctx)) == "[]\n"
    # Python is unaffected.
    assert sbx.run_code("'py'").text == "py"


def test_r(ci_sandbox_factory):
    """`language="r"`: IRkernel from Debian, with the context's state, env vars, cwd, errors
    and plots as results. IRkernel shows a value as display data, so (as in E2B's own tests)
    it is `results[0]`, not the main result's `text`."""
    sbx = ci_sandbox_factory(envs={"TEST_ENV_VAR": "supertest"})
    r = sbx.run_code("x <- 40 + 2\nx", language="r")
    assert r.error is None, r.error
    assert r.results[0].text.strip() == "[1] 42", r
    # E2B's R env-var tests: the sandbox's, a call's own, overridden by a call.
    r = sbx.run_code("Sys.getenv('TEST_ENV_VAR')", language="r")
    assert r.results[0].text.strip() == '[1] "supertest"', r
    r = sbx.run_code("Sys.getenv('FOO')", envs={"FOO": "bar"}, language="r")
    assert r.results[0].text.strip() == '[1] "bar"', r
    r = sbx.run_code("Sys.getenv('FOO', unset = 'default')", language="r")
    assert r.results[0].text.strip() == '[1] "default"', r
    r = sbx.run_code("Sys.getenv('TEST_ENV_VAR')", envs={"TEST_ENV_VAR": "overwrite"}, language="r")
    assert r.results[0].text.strip() == '[1] "overwrite"', r
    # State kept per context; printing is stdout; the default cwd and user.
    r = sbx.run_code('print(paste("x is", x))', language="r")
    assert stdout_of(r) == '[1] "x is 42"\n', r
    r = sbx.run_code('cat(getwd(), Sys.info()[["user"]], "\\n")', language="r")
    assert stdout_of(r) == "/home/user user \n", r
    # An error names itself and leaves the context usable.
    r = sbx.run_code('stop("boom")', language="r")
    assert r.error is not None and "boom" in r.error.value, r
    assert sbx.run_code("x * 2", language="r").results[0].text.strip() == "[1] 84"
    # A plot is a PNG result.
    r = sbx.run_code("plot(1:10)", language="r")
    assert r.error is None, r.error
    assert any(res.png for res in r.results), r.results
    # A context of its own, with its own state.
    ctx = sbx.create_code_context(language="r")
    assert ctx.language == "r"
    r = sbx.run_code('exists("x")', context=ctx)
    assert r.results[0].text.strip() == "[1] FALSE", r


def test_javascript_and_typescript(ci_sandbox_factory):
    """E2B's JavaScript tests (`language="js"`, `"ts"`, `"deno"`): Deno's kernel."""
    sbx = ci_sandbox_factory()
    r = sbx.run_code("console.log('Hello, World!')", language="js")
    assert r.logs.stdout == ["Hello, World!\n"], r
    r = sbx.run_code("async function main() {\n  return 'Hello, World!'\n}\n\nawait main()", language="js")
    assert r.results[0].text == "Hello, World!", r
    r = sbx.run_code("const add = (x, y) => x + y;\nadd(1, 2);", language="js")
    assert r.results[0].text == "3", r
    sbx.run_code("const x = 1", language="js")
    assert sbx.run_code("x", language="js").results[0].text == "1"
    assert sbx.run_code("process.cwd()", language="js").results[0].text == "/home/user"
    r = sbx.run_code("function subtract(x: number, y: number): number {\n  return x - y;\n}\n\nsubtract(1, 2);", language="ts")
    assert r.results[0].text == "-1", r
    r = sbx.run_code("import { join } from 'node:path'\njoin('a', 'b')", language="deno")
    assert r.results[0].text == "a/b", r
    ctx = sbx.create_code_context("/home", language="js")
    assert sbx.run_code("process.cwd()", context=ctx).results[0].text == "/home"


def test_javascript_interrupts_and_a_kernel_that_ignores_them(ci_sandbox_factory):
    """A timed-out JavaScript cell is interrupted (Deno takes an `interrupt_request`, not
    SIGINT) and the context keeps its state; one that an interrupt cannot end (Deno waiting on
    a timer) gets its kernel killed after husk's grace, and the next call runs on a fresh
    kernel, saying on stderr that the state is gone."""
    sbx = ci_sandbox_factory()
    sbx.run_code("let kept = 41", language="js")
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", language="js", timeout=3)
    r = sbx.run_code("kept + 1", language="js", timeout=30)
    assert r.error is None and r.results[0].text == "42", r
    with pytest.raises(TimeoutException):
        sbx.run_code("await new Promise(r => setTimeout(r, 600000)); 'late'", language="js", timeout=3)
    r = sbx.run_code("typeof kept", language="js", timeout=60)
    assert r.error is None and r.results[0].text == "undefined", r
    assert r.logs.stderr == [
        "husk: this context's kernel did not stop when an earlier execution was interrupted, "
        "so it was restarted: the context's variables are gone\n"
    ], r
    assert sbx.run_code("1 + 2", language="js").results[0].text == "3"


def test_java(ci_sandbox_factory):
    """`language="java"`: husk's JShell kernel, with the context's state (variables, methods,
    classes, imports), printing, the last expression as the result, env vars (the sandbox's, a
    call's own, restored after), cwd, errors (compilation and exceptions) and interrupts."""
    sbx = ci_sandbox_factory(envs={"TEST_ENV_VAR": "supertest"})
    r = sbx.run_code('System.out.println("Hello, World!");', language="java")
    assert r.error is None, r.error
    assert stdout_of(r) == "Hello, World!\n", r
    r = sbx.run_code("int x = 40 + 2;\nx", language="java")
    assert r.text == "42", r
    r = sbx.run_code(
        "import java.util.*;\nint twice(int n) { return 2 * n; }\n"
        "var l = new ArrayList<Integer>(List.of(3, 1, 2));\nCollections.sort(l);\n"
        "System.out.print(twice(x));\nl",
        language="java",
    )
    assert stdout_of(r) == "84" and r.text == "[1, 2, 3]", r
    r = sbx.run_code('"a string, unquoted"', language="java")
    assert r.text == "a string, unquoted", r
    # E2B's env-var tests: the sandbox's, a call's own, overridden by a call, then restored.
    assert sbx.run_code('System.getenv("TEST_ENV_VAR")', language="java").text == "supertest"
    r = sbx.run_code('System.getenv("FOO")', envs={"FOO": "bar"}, language="java")
    assert r.text == "bar", r
    assert sbx.run_code('System.getenv("FOO")', language="java").text == "null"
    r = sbx.run_code('System.getenv("TEST_ENV_VAR")', envs={"TEST_ENV_VAR": "overwrite"}, language="java")
    assert r.text == "overwrite", r
    assert sbx.run_code('System.getenv("TEST_ENV_VAR")', language="java").text == "supertest"
    # The default cwd and user.
    r = sbx.run_code('System.getProperty("user.dir") + " " + System.getProperty("user.name")', language="java")
    assert r.text == "/home/user user", r
    # Errors: a compilation error and an exception, each named; the context goes on.
    r = sbx.run_code('int y = "s";', language="java")
    assert r.error is not None and r.error.name == "CompilationException", r
    assert "incompatible types" in r.error.value, r.error
    r = sbx.run_code('throw new IllegalStateException("boom")', language="java")
    assert r.error.name == "java.lang.IllegalStateException" and r.error.value == "boom", r.error
    assert "IllegalStateException: boom" in r.error.traceback
    assert sbx.run_code("x * 2", language="java").text == "84"
    # A timed-out cell is interrupted and the context keeps its state.
    with pytest.raises(TimeoutException):
        sbx.run_code("while (true) {}", language="java", timeout=3)
    assert sbx.run_code("x + 1", language="java", timeout=30).text == "43"
    # A context of its own, with its own state.
    ctx = sbx.create_code_context(language="java")
    assert ctx.language == "java"
    r = sbx.run_code("x", context=ctx)
    assert r.error is not None and r.error.name == "CompilationException", r


def test_a_full_pause_keeps_the_kernels_state_and_a_filesystem_pause_starts_it_again(ci_husk, ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    assert sbx.run_code("x = 41; open('/home/user/nb.txt', 'w').write('saved')").error is None
    assert sbx.pause() is True
    Sandbox.connect(sbx.sandbox_id, **ci_husk.opts())
    # Frozen and thawed: the kernel's variables are still there.
    r = sbx.run_code("x + 1")
    assert r.error is None and r.text == "42", (r.error, r.text)
    assert sbx.pause(mode="filesystem") is True
    Sandbox.connect(sbx.sandbox_id, **ci_husk.opts())
    # Booted again: the template's kernel starts afresh, the files are the sandbox's.
    r = sbx.run_code("print(open('/home/user/nb.txt').read())")
    assert r.error is None and r.logs.stdout == ["saved\n"], (r.error, r.logs)
    r = sbx.run_code("x")
    assert r.error is not None and r.error.name == "NameError", r.error


def test_a_snapshot_and_a_fork_start_the_kernels_again_on_the_sandboxs_files(ci_husk, ci_sandbox_factory):
    sbx = ci_sandbox_factory()
    assert sbx.run_code("x = 41; open('/home/user/nb.txt', 'w').write('saved')").error is None
    info = sbx.create_snapshot(name="notebook")
    # The source goes on, its kernel's state whole.
    r = sbx.run_code("x + 1")
    assert r.error is None and r.text == "42", (r.error, r.text)
    # A sandbox from the snapshot: the template's kernel starts afresh on the sandbox's files.
    child = ci_sandbox_factory(template=info.snapshot_id)
    r = child.run_code("print(open('/home/user/nb.txt').read())")
    assert r.error is None and r.logs.stdout == ["saved\n"], (r.error, r.logs)
    r = child.run_code("x")
    assert r.error is not None and r.error.name == "NameError", r.error
    # A fork: the same, in a sandbox of its own.
    forks = sbx.fork(count=1)
    assert len(forks) == 1 and not isinstance(forks[0], Exception), forks
    fork = forks[0]
    try:
        assert fork.sandbox_id not in (sbx.sandbox_id, child.sandbox_id)
        r = fork.run_code("print(open('/home/user/nb.txt').read()); 1 + 1")
        assert r.error is None and r.text == "2" and r.logs.stdout == ["saved\n"], (r.error, r.text, r.logs)
    finally:
        fork.kill()
    assert Sandbox.delete_snapshot(info.snapshot_id, **ci_husk.opts()) is True



def slim_code_interpreter_spec(directory) -> str:
    """A spec of the `code-interpreter` preset's first steps (base, its pinned pip packages and
    IPython startup file: cached layers, shared with the preset) plus the Python kernel alone,
    started with every sandbox: what a test of Python kernels needs, packed in a fraction of
    the full preset's time. Written into `directory`; returns the template's name."""
    import shutil

    from husk_compat import PRESETS_DIR

    preset = PRESETS_DIR / "code-interpreter"
    text = (preset / "husk.toml").read_text()
    head = text[: text.index("\n[[run]]")]
    assert 'name = "code-interpreter"' in head and "[packages]" in head, head
    name = "ci-restart"
    head = head.replace('name = "code-interpreter"', f'name = "{name}"')
    head += (
        '\n[[run]]\ncmd = "python3 -m ipykernel install --prefix /usr/local"\n'
        '\n[sandbox]\ncontexts = ["python"]\n'
    )
    (directory / "husk.toml").write_text(head)
    shutil.copytree(preset / "ipython", directory / "ipython")
    return name


@pytest.mark.timeout(600, func_only=True)
def test_kernels_keep_their_state_through_a_restart_of_the_server(husk, tmp_path):
    """A server of its own (its sandboxes outlive it: `keep`), with `base` and a slim
    code-interpreter template built into its state directory, stopped with SIGTERM; the next
    server on that state directory takes the sandbox up with its kernels: the default
    context's variables and a context of its own are still there. (`husk` only for its safety
    net.)"""
    from husk_compat import PRESETS_DIR, build_template, start_server, wait_for

    first = start_server(keep=True)
    servers = [first]
    done = False
    try:
        build_template(first, PRESETS_DIR / "base")
        template = slim_code_interpreter_spec(tmp_path)
        build_template(first, tmp_path)
        sbx = Sandbox.create(template=template, timeout=300, **first.opts())
        assert sbx.run_code("x = 41").error is None
        ctx = sbx.create_code_context()
        assert sbx.run_code("y = 1", context=ctx).error is None
        assert first.stop() == 0, first.log_tail()

        second = start_server(state_dir=first.state_dir)  # its stop destroys the sandbox
        servers.append(second)
        back = Sandbox.connect(sbx.sandbox_id, **second.opts())
        r = back.run_code("x + 1")
        assert r.error is None and r.text == "42", (r.error, r.text)
        r = back.run_code("y", context=ctx)
        assert r.error is None and r.text == "1", (r.error, r.text)
        assert ctx.id in {c.id for c in back.list_code_contexts()}
        # The kernels go on: new state in the default context, still apart from the other.
        assert back.run_code("x += 1").error is None
        assert back.run_code("x").text == "42"
        r = back.run_code("x", context=ctx)
        assert r.error is not None and r.error.name == "NameError", r.error
        assert second.stop() == 0, second.log_tail()
        second.close()
        done = True
    finally:
        if not done:
            # A failure half-way: each stops its own process, then a server that destroys at
            # its stop what was kept, once it has taken it up; its close removes the state dir.
            for s in servers:
                try:
                    s.stop()
                except Exception:
                    pass
            sweeper = start_server(state_dir=first.state_dir)
            try:
                wait_for(lambda: "took up" in sweeper.log_tail(100_000)
                         or "taking them up" not in sweeper.log_tail(100_000), 30, "the take-up")
            finally:
                sweeper.close()
