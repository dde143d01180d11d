"""Ingress with the stock SDK: a server started in the sandbox through the SDK's commands API is
reached at the host `get_host(port)` names (sent to husk as the `Host` header: the SDK's domain
is never resolved) and by the routing headers; a closed port is the answer the SDK classifies
as "port is not open". A private sandbox (`network={"allow_public_traffic": False}`) exposes
`traffic_access_token`, which opens it, as a key of its own team does and another team's
does not."""

from __future__ import annotations

import json

from e2b import Sandbox
from e2b.exceptions import is_sandbox_port_not_open_message

from husk_compat import http_request, sandbox_headers, wait_for

PORT = 8000
BODY = b"hello from inside the sandbox\n"


def via_host(husk, host: str, path: str = "/hello.txt", headers=None):
    return http_request(husk.port, "GET", path, headers={"Host": host, **(headers or {})})


def start_file_server(sbx: Sandbox) -> None:
    sbx.files.write("/tmp/www/hello.txt", BODY)
    sbx.commands.run(
        f"python3 -m http.server {PORT} --bind 0.0.0.0 --directory /tmp/www",
        background=True,
    )


def wait_serving(husk, host: str, headers=None):
    def ok():
        r = via_host(husk, host, headers=headers)
        return r if r.status == 200 else None

    return wait_for(ok, 30, f"the server at {host}")


def test_get_host_reaches_a_server_in_the_sandbox(sandbox, husk):
    # husk gives every sandbox a traffic token (the code interpreter's port wants a credential
    # and the SDK sends this one with every call); a public sandbox's ports ignore it.
    assert isinstance(sandbox.traffic_access_token, str) and len(sandbox.traffic_access_token) == 40
    host = sandbox.get_host(PORT)
    assert host.startswith(f"{PORT}-{sandbox.sandbox_id}.")

    # Before anything listens: the SDK's own classification of the answer.
    r = via_host(husk, host)
    assert r.status == 502, r.text
    assert is_sandbox_port_not_open_message(r.json()["message"]), r.text

    start_file_server(sandbox)
    assert wait_serving(husk, host).body == BODY
    # The routing headers reach it too.
    r = http_request(husk.port, "GET", "/hello.txt", headers=sandbox_headers(sandbox.sandbox_id, port=PORT))
    assert r.status == 200 and r.body == BODY, r.text

    r = via_host(husk, sandbox.get_host(PORT + 1))
    assert r.status == 502 and is_sandbox_port_not_open_message(r.json()["message"]), r.text


def test_a_private_sandbox_needs_its_traffic_token(sandbox_factory, husk, other_key):
    sbx = sandbox_factory(network={"allow_public_traffic": False})
    token = sbx.traffic_access_token
    assert isinstance(token, str) and len(token) >= 32
    info = Sandbox.get_info(sbx.sandbox_id, **husk.opts())
    assert info.network is not None and info.network["allow_public_traffic"] is False
    assert Sandbox.connect(sbx.sandbox_id, **husk.opts()).traffic_access_token == token

    start_file_server(sbx)
    host = sbx.get_host(PORT)
    good = {"E2B-Traffic-Access-Token": token}
    assert wait_serving(husk, host, headers=good).body == BODY

    for headers in ({}, {"E2B-Traffic-Access-Token": "0" * len(token)}, {"X-API-Key": other_key}):
        r = via_host(husk, host, headers=headers)
        assert r.status == 403, (headers, r.status, r.text)
        assert r.json()["code"] == 403
    r = via_host(husk, host, headers={"X-API-Key": husk.admin_key})
    assert r.status == 200 and r.body == BODY, r.text

    # The SDK itself keeps working: the daemon's port has its own authentication.
    assert sbx.commands.run("echo still here").stdout == "still here\n"


ECHO_HOST = (
    "import http.server\n"
    "class H(http.server.BaseHTTPRequestHandler):\n"
    "    def do_GET(self):\n"
    "        body = self.headers.get('Host', '').encode()\n"
    "        self.send_response(200); self.send_header('Content-Length', str(len(body)))\n"
    "        self.end_headers(); self.wfile.write(body)\n"
    f"http.server.HTTPServer(('0.0.0.0', {PORT}), H).serve_forever()\n"
)


def test_mask_request_host_is_the_host_the_sandboxs_server_sees(sandbox_factory, husk):
    sbx = sandbox_factory(network={"mask_request_host": "${PORT}-myapp.example.com"})
    sbx.files.write("/tmp/echo_host.py", ECHO_HOST)
    sbx.commands.run("python3 /tmp/echo_host.py", background=True)
    r = wait_serving(husk, sbx.get_host(PORT))
    assert r.body == f"{PORT}-myapp.example.com".encode(), r.body
    info = http_request(husk.port, "GET", f"/sandboxes/{sbx.sandbox_id}", {"X-API-Key": husk.admin_key})
    assert info.json()["network"]["maskRequestHost"] == "${PORT}-myapp.example.com", info.text
    # Without a mask, the client's Host.
    plain = sandbox_factory()
    plain.files.write("/tmp/echo_host.py", ECHO_HOST)
    plain.commands.run("python3 /tmp/echo_host.py", background=True)
    assert wait_serving(husk, plain.get_host(PORT)).body == plain.get_host(PORT).encode()


def post_create(husk, settings: dict):
    """A raw create (`POST /sandboxes`) of `base` with `settings` added to its body."""
    return http_request(
        husk.port,
        "POST",
        "/sandboxes",
        {"X-API-Key": husk.admin_key, "Content-Type": "application/json"},
        json.dumps({"templateID": "base", "timeout": 30, **settings}).encode(),
    )


def test_settings_husk_cannot_honour_are_refused_clearly(husk):
    # Never silence: each of these asks for something husk does not do, and says which.
    for body, words in [
        ({"network": {"httpsPorts": [3000]}}, "httpsPorts"),
        ({"network": {"dnsServers": ["not-an-ip"]}}, "dnsServers"),
        ({"network": {"dnsServers": ["1.1.1.1"] * 11}}, "dnsServers"),
        ({"network": {"maskRequestHost": "has space"}}, "maskRequestHost"),
        ({"iam": {"tokens": {"aws": {"audience": "sts", "token_type": "JWT-SVID"}}}}, "iam"),
        ({"mcp": {"github": {"token": "x"}}}, "mcp"),
        # Auto-resume only with a pause at the timeout (a killed sandbox cannot resume).
        ({"autoResume": {"enabled": True}}, "autoResume needs autoPause"),
        ({"autoPause": True, "autoResume": {"enabled": "yes"}}, "autoResume.enabled"),
        ({"autoPause": True, "autoResume": 3}, "autoResume"),
    ]:
        r = post_create(husk, body)
        assert r.status == 400 and words in r.text, (body, r.status, r.text)
    # What asks for nothing passes: an empty token map, a disabled resume.
    for body in [
        {"iam": {"tokens": {}}},
        {"autoResume": {"enabled": False}},
        {"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
    ]:
        r = post_create(husk, body)
        assert r.status == 201, (body, r.status, r.text)
        Sandbox.kill(r.json()["sandboxID"], **husk.opts())
