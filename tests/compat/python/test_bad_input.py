"""Bad input, mostly in plain HTTP below the SDK: wrong API keys, wrong access tokens, unknown
sandboxes, malformed and oversize Connect envelopes, and paths that try to leave the sandbox.
After each abuse the server must still serve normal requests."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time

import pytest

from e2b import (
    AuthenticationException,
    FileNotFoundException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
)

from husk_compat import (
    connect_stream_error,
    envelope,
    http_request,
    parse_envelopes,
    sandbox_headers,
)

WRONG_KEY = "e2b_" + "0" * 40
START_JSON = json.dumps(
    {"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo should-not-run > /tmp/ran"]}, "stdin": False}
).encode()


def stream_headers(t) -> dict:
    return {
        **sandbox_headers(t.id, t.token),
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "Connect-Timeout-Ms": "10000",
    }


def unary_headers(t) -> dict:
    return {
        **sandbox_headers(t.id, t.token),
        "Content-Type": "application/json",
        "Connect-Protocol-Version": "1",
    }


def assert_still_serving(t):
    assert t.sbx.commands.run("echo alive", timeout=20).stdout == "alive\n"
    assert t.sbx.files.exists("/tmp/ran") is False, "a malformed Start ran its command"


# --- control plane ------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, WRONG_KEY, "not-a-key", ""])
def test_control_plane_rejects_bad_keys(husk, key):
    headers = {} if key is None else {"X-API-Key": key}
    for method, path, body in [
        ("GET", "/v2/sandboxes", None),
        ("POST", "/v2/sandboxes", b'{"templateID": "base"}'),
        ("POST", "/sandboxes", b'{"templateID": "base", "timeout": 60}'),
        ("GET", "/sandboxes/whatever", None),
        ("DELETE", "/sandboxes/whatever", None),
    ]:
        h = dict(headers)
        if body:
            h["Content-Type"] = "application/json"
        r = http_request(husk.port, method, path, h, body)
        assert r.status == 401, (method, path, r.status, r.text)
        err = r.json()
        assert err["code"] == 401 and isinstance(err["message"], str), err


def test_api_key_header_is_case_insensitive(husk):
    for name in ("X-API-KEY", "x-api-key", "X-Api-Key"):
        r = http_request(husk.port, "GET", "/v2/sandboxes", {name: husk.admin_key})
        assert r.status == 200, (name, r.status, r.text)
        assert isinstance(r.json(), list)


def test_sdk_wrong_key(husk):
    opts = husk.opts(api_key=WRONG_KEY)
    with pytest.raises(AuthenticationException):
        Sandbox.create(timeout=30, **opts)
    with pytest.raises(AuthenticationException):
        Sandbox.list(**opts).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.get_info("whatever", **opts)


def test_malformed_create_bodies(husk, cleanup_ids):
    h = {"X-API-Key": husk.admin_key, "Content-Type": "application/json"}
    for body in [b"{not json", b"[]", b'"base"', b'{"templateID": 5}', b'{"templateID": "base", "timeout": "soon"}']:
        r = http_request(husk.port, "POST", "/v2/sandboxes", h, body)
        if r.status == 201:
            cleanup_ids.append((r.json()["sandboxID"], husk.admin_key))
        assert r.status == 400, (body, r.status, r.text)
        assert isinstance(r.json().get("message"), str)


def test_unknown_template(husk, cleanup_ids):
    r = http_request(
        husk.port,
        "POST",
        "/v2/sandboxes",
        {"X-API-Key": husk.admin_key, "Content-Type": "application/json"},
        b'{"templateID": "no-such-template-xyz", "timeout": 30}',
    )
    if r.status == 201:
        cleanup_ids.append((r.json()["sandboxID"], husk.admin_key))
    assert r.status in (400, 404), (r.status, r.text)
    with pytest.raises(SandboxException):
        sbx = Sandbox.create("no-such-template-xyz", timeout=30, **husk.opts())
        cleanup_ids.append((sbx.sandbox_id, husk.admin_key))


def test_unknown_sandbox_on_control_plane(husk):
    opts = husk.opts()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info("nosuchsandbox0000000", **opts)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.set_timeout("nosuchsandbox0000000", 30, **opts)
    assert Sandbox.kill("nosuchsandbox0000000", **opts) is False
    r = http_request(husk.port, "GET", "/sandboxes/nosuchsandbox0000000", {"X-API-Key": husk.admin_key})
    assert r.status == 404
    assert r.json()["code"] == 404


# --- sandbox routing and envd auth -------------------------------------------------------------


@pytest.mark.parametrize("sandbox_id", ["nosuchsandbox0000000", "UPPER", "../../etc", "a-b"])
def test_unknown_sandbox_is_502_not_found(husk, sandbox_id):
    for method, path, extra in [
        ("GET", "/health", {}),
        ("GET", "/files?path=/etc/hostname", {}),
        ("POST", "/filesystem.Filesystem/Stat", {"Content-Type": "application/json"}),
    ]:
        r = http_request(
            husk.port,
            method,
            path,
            {**sandbox_headers(sandbox_id, "x" * 32), **extra},
            b'{"path": "/"}' if method == "POST" else None,
        )
        assert r.status in (400, 502), (sandbox_id, path, r.status, r.text)
        if r.status == 502:
            body = r.json()
            assert "The sandbox was not found" in body["message"], body
            assert body.get("code") == 502


def test_health_of_running_sandbox(husk, tokened_sandbox):
    t = tokened_sandbox()
    r = http_request(husk.port, "GET", "/health", sandbox_headers(t.id))
    assert 200 <= r.status < 300


@pytest.mark.parametrize("token", [None, "wrong-token", ""])
def test_envd_rpc_rejects_bad_token(husk, tokened_sandbox, token):
    t = tokened_sandbox()
    h = sandbox_headers(t.id, token)
    h.update({"Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    for path, body in [
        ("/filesystem.Filesystem/Stat", b'{"path": "/home/user"}'),
        ("/filesystem.Filesystem/ListDir", b'{"path": "/", "depth": 1}'),
        ("/process.Process/List", b"{}"),
        ("/filesystem.Filesystem/Remove", b'{"path": "/home/user"}'),
    ]:
        r = http_request(husk.port, "POST", path, h, body)
        assert r.status == 401, (path, r.status, r.text)
        assert "unauthorized" in r.text.lower(), r.text
    # Streaming Start with a bad token runs nothing.
    sh = {**h, "Content-Type": "application/connect+json"}
    r = http_request(husk.port, "POST", "/process.Process/Start", sh, envelope(START_JSON))
    assert r.status == 401, (r.status, r.body)
    assert "unauthorized" in r.text.lower(), r.text
    assert t.sbx.files.exists("/home/user") is True
    assert_still_serving(t)


def test_files_rejects_bad_token(husk, tokened_sandbox):
    t = tokened_sandbox()
    t.sbx.files.write("/tmp/guarded", "guarded")
    r = http_request(husk.port, "GET", "/files?path=/tmp/guarded", sandbox_headers(t.id, "wrong"))
    assert r.status == 401
    assert b"guarded" not in r.body
    body = b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/tmp/guarded\"\r\n\r\nevil\r\n--b--\r\n"
    r = http_request(
        husk.port,
        "POST",
        "/files?path=/tmp/guarded",
        {**sandbox_headers(t.id, "wrong"), "Content-Type": "multipart/form-data; boundary=b"},
        body,
    )
    assert r.status == 401
    assert t.sbx.files.read("/tmp/guarded") == "guarded"


def test_valid_token_unary_rpc_works(husk, tokened_sandbox):
    """Control for the malformed cases below: the same hand-made requests, well formed."""
    t = tokened_sandbox()
    r = http_request(husk.port, "POST", "/filesystem.Filesystem/Stat", unary_headers(t), b'{"path": "/home/user"}')
    assert r.status == 200, r.text
    entry = r.json()["entry"]
    assert entry["path"] == "/home/user"
    assert entry["type"] == "FILE_TYPE_DIRECTORY"
    r = http_request(husk.port, "POST", "/process.Process/Start", stream_headers(t), envelope(
        json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo wire"]}, "stdin": False}).encode()
    ))
    assert r.status == 200
    assert r.headers["content-type"].startswith("application/connect+json")
    msgs = parse_envelopes(r.body)
    first = json.loads(msgs[0][1])
    assert "start" in first["event"] and first["event"]["start"]["pid"] > 0
    assert msgs[-1][0] & 0x02
    assert json.loads(msgs[-1][1] or b"{}") == {}
    events = [json.loads(p)["event"] for f, p in msgs[:-1]]
    ends = [e["end"] for e in events if "end" in e]
    assert len(ends) == 1
    assert ends[0].get("exitCode", 0) == 0
    assert ends[0]["exited"] is True


# --- malformed Connect traffic --------------------------------------------------------------


def test_unary_malformed_json(husk, tokened_sandbox):
    t = tokened_sandbox()
    for body in [b"{not json", b'{"path": 5}', b"\x00\x01\x02"]:
        r = http_request(husk.port, "POST", "/filesystem.Filesystem/Stat", unary_headers(t), body)
        assert r.status == 400, (body, r.status, r.text)
        assert r.json()["code"] == "invalid_argument"
    assert_still_serving(t)


def test_unary_wrong_content_type_and_unknown_method(husk, tokened_sandbox):
    t = tokened_sandbox()
    h = {**unary_headers(t), "Content-Type": "text/plain"}
    r = http_request(husk.port, "POST", "/filesystem.Filesystem/Stat", h, b'{"path": "/"}')
    assert 400 <= r.status < 500, (r.status, r.text)
    # Unknown procedures: a plain 404, or Connect's `unimplemented` (HTTP 501).
    for path in ["/filesystem.Filesystem/NoSuchMethod", "/nosuch.Service/Call"]:
        r = http_request(husk.port, "POST", path, unary_headers(t), b"{}")
        assert r.status == 404 or (r.status == 501 and r.json()["code"] == "unimplemented"), (path, r.status, r.text)
    assert_still_serving(t)


@pytest.mark.parametrize(
    "name,body",
    [
        ("truncated header", b"\x00\x00\x00"),
        ("length beyond body", b"\x00\x00\x00\x01\x00" + START_JSON[:20]),
        ("compressed flag without encoding", envelope(START_JSON, flags=0x01)),
        ("not json", envelope(b"{\"process\": ")),
        ("empty body", b""),
    ],
)
def test_malformed_start_envelopes(husk, tokened_sandbox, name, body):
    t = tokened_sandbox()
    start = time.monotonic()
    r = http_request(husk.port, "POST", "/process.Process/Start", stream_headers(t), body, timeout=15)
    assert time.monotonic() - start < 12, f"{name}: took too long"
    code, message = connect_stream_error(r)
    assert code, (name, r.status, r.body)
    assert_still_serving(t)


def _complete(data: bytes) -> bool:
    head, _, rest = data.partition(b"\r\n\r\n")
    h = head.lower()
    if b"transfer-encoding: chunked" in h:
        return rest.endswith(b"0\r\n\r\n")
    for line in h.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(rest) >= int(line.split(b":")[1])
    return False


def test_oversize_envelope_is_refused(husk, tokened_sandbox):
    """The envelope header claims 100 MB, the body holds a few bytes: a prompt Connect error
    (or 4xx), no started process, and the server keeps serving."""
    t = tokened_sandbox()
    body = b"\x00" + (100 * 1024 * 1024).to_bytes(4, "big") + START_JSON
    start = time.monotonic()
    r = http_request(husk.port, "POST", "/process.Process/Start", stream_headers(t), body, timeout=15)
    assert time.monotonic() - start < 10
    code, _ = connect_stream_error(r)
    assert code in ("resource_exhausted", "invalid_argument", "413", "400"), (code, r.body)
    assert_still_serving(t)


def test_oversize_envelope_with_a_stalled_body(husk, tokened_sandbox):
    """The header claims 100 MB and the client then stalls with the body open. The server
    may answer at once or wait for the body, but it must keep serving others meanwhile, and
    answer with an error once the body ends."""
    t = tokened_sandbox()
    first = b"\x00" + (100 * 1024 * 1024).to_bytes(4, "big") + b'{"process":'
    head = "POST /process.Process/Start HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    for k, v in stream_headers(t).items():
        head += f"{k}: {v}\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n"
    s = socket.create_connection(("127.0.0.1", husk.port), timeout=15)
    try:
        s.sendall(head.encode() + f"{len(first):x}\r\n".encode() + first + b"\r\n")
        s.settimeout(2)
        try:
            early = s.recv(65536)
        except socket.timeout:
            early = b""
        # Meanwhile the server serves other requests.
        assert_still_serving(t)
        if not early:
            try:
                s.sendall(b"0\r\n\r\n")
            except OSError:
                pass
        s.settimeout(10)
        answer = early
        deadline = time.monotonic() + 10
        while not _complete(answer) and time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            answer += chunk
    finally:
        s.close()
    assert answer.startswith(b"HTTP/1.1 "), f"no answer (got {answer[:300]!r})"
    status = int(answer.split(b" ")[1])
    if status == 200:
        assert b'"error"' in answer, answer[:500]
        assert b'"start"' not in answer, answer[:500]
    else:
        assert 400 <= status < 500, answer[:300]
    assert_still_serving(t)


def test_many_bad_requests_do_not_break_the_server(husk, tokened_sandbox):
    t = tokened_sandbox()
    for i in range(50):
        http_request(husk.port, "POST", "/process.Process/Start", stream_headers(t), b"\x01\xff\xff\xff\xff" + bytes([i]))
        http_request(husk.port, "POST", "/filesystem.Filesystem/ListDir", unary_headers(t), b"}{")
    assert_still_serving(t)
    t.sbx.files.write("/home/user/after-abuse.txt", "ok")
    assert "after-abuse.txt" in {e.name for e in t.sbx.files.list("/home/user")}


# --- paths that try to leave the sandbox ---------------------------------------------------------


@pytest.fixture
def host_only_file():
    """A file that exists on the host only; no sandbox may ever see it."""
    fd, path = tempfile.mkstemp(prefix="husk-compat-hostonly-", dir="/tmp")
    os.write(fd, b"HOST ONLY - must never be visible in a sandbox\n")
    os.close(fd)
    yield path
    os.unlink(path)


def sandbox_view(sbx, path: str):
    r = sbx.commands.run(f"cat {path} 2>/dev/null || echo '<missing>'", user="root")
    return r.stdout


def test_dotdot_paths_stay_inside(sandbox, host_only_file):
    sandbox.commands.run("echo inside > /tmp/marker")
    assert sandbox.files.read("../../tmp/marker") == "inside\n"
    assert sandbox.files.read("/home/user/../../../../../tmp/marker") == "inside\n"
    with pytest.raises(FileNotFoundException):
        sandbox.files.read(host_only_file)
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("../../../../.." + host_only_file)
    assert not sandbox.files.exists(host_only_file)


def test_shadow_through_dotdot(sandbox):
    """`../../etc/shadow` is the sandbox's own /etc/shadow (if it has one), never the host's."""
    with open("/etc/shadow", "rb") as f:
        host_shadow = f.read()
    inside = sandbox_view(sandbox, "/etc/shadow")
    if inside == "<missing>\n":
        with pytest.raises(FileNotFoundException):
            sandbox.files.read("../../etc/shadow", user="root")
    else:
        assert inside.encode() != host_shadow, "the host's /etc/shadow is visible in the sandbox"
        assert sandbox.files.read("/root/../etc/shadow", user="root") == inside
    # As the default user: either refused, or (if the sandbox made it readable) its own copy.
    try:
        got = sandbox.files.read("../../etc/shadow")
    except (SandboxException, AuthenticationException):
        got = None
    if got is not None:
        assert got == inside
        assert got.encode() != host_shadow


def test_symlink_to_root_reads_sandbox_files(sandbox, host_only_file):
    sandbox.commands.run(
        "ln -s / /home/user/to-root && ln -s /etc /home/user/to-etc && "
        f"ln -s {host_only_file} /home/user/to-host-file"
    )
    inside_hostname = sandbox_view(sandbox, "/etc/hostname")
    with open("/etc/hostname") as f:
        host_hostname = f.read()
    if inside_hostname == "<missing>\n":
        with pytest.raises(FileNotFoundException):
            sandbox.files.read("/home/user/to-etc/hostname")
    else:
        assert sandbox.files.read("/home/user/to-etc/hostname") == inside_hostname
        assert sandbox.files.read("/home/user/to-root/etc/hostname") == inside_hostname
        if inside_hostname != host_hostname:
            assert sandbox.files.read("/home/user/to-etc/hostname") != host_hostname
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/to-host-file")
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/home/user/to-root" + host_only_file)
    # Listing through the link shows the sandbox's root, where the host-only file is absent.
    names = {e.name for e in sandbox.files.list("/home/user/to-root/tmp")}
    assert os.path.basename(host_only_file) not in names


def test_write_through_symlink_stays_inside(sandbox):
    name = f"husk-compat-escape-{os.getpid()}-{time.monotonic_ns()}"
    sandbox.commands.run("ln -s / /home/user/root-link")
    sandbox.files.write(f"/home/user/root-link/tmp/{name}", "written through a link")
    assert sandbox.commands.run(f"cat /tmp/{name}").stdout == "written through a link"
    assert not os.path.exists(f"/tmp/{name}"), "a sandbox write landed on the host"
    sandbox.files.make_dir(f"/home/user/root-link/tmp/{name}.d")
    assert not os.path.exists(f"/tmp/{name}.d")
    sandbox.files.rename(f"/home/user/root-link/tmp/{name}", f"/home/user/root-link/tmp/{name}.moved")
    assert not os.path.exists(f"/tmp/{name}.moved")
    assert sandbox.files.exists(f"/tmp/{name}.moved")


def test_raw_files_path_escapes(husk, tokened_sandbox, host_only_file):
    t = tokened_sandbox()
    t.sbx.commands.run("echo mine > /tmp/raw-marker")
    h = sandbox_headers(t.id, t.token)
    for path in ["../../tmp/raw-marker", "/../../../tmp/raw-marker", "/tmp/./raw-marker", "//tmp//raw-marker"]:
        r = http_request(husk.port, "GET", "/files?path=" + path.replace("/", "%2F"), h)
        assert (r.status, r.body) == (200, b"mine\n"), (path, r.status, r.text)
    for path in [
        host_only_file,
        "../../../../" + host_only_file,
        "/proc/1/root" + host_only_file,
        "/proc/self/root" + host_only_file,
    ]:
        r = http_request(husk.port, "GET", "/files?path=" + path, h)
        assert r.status in (400, 401, 403, 404), (path, r.status, r.text)
        assert b"HOST ONLY" not in r.body


@pytest.mark.parametrize("prefix", ["/proc/1/root", "/proc/self/root", "/proc/thread-self/root"])
def test_proc_root_links_are_the_sandbox(sandbox, host_only_file, prefix):
    """/proc/*/root, resolved on the sandbox's side, is the sandbox's own root."""
    try:
        got = sandbox.files.read(prefix + host_only_file, user="root")
    except (SandboxException, AuthenticationException):
        got = None
    assert got is None, f"read {prefix}{host_only_file} succeeded: {got!r}"
    r = sandbox.commands.run(f"cat {prefix}{host_only_file} 2>/dev/null || echo absent", user="root")
    assert r.stdout == "absent\n"
