"""`husk serve --tls-cert/--tls-key`: HTTPS only, through the stock SDKs (e2b==2.63.0, JS
e2b@2.51.0) trusting the operator's CA as any client on the host would (SSL_CERT_FILE,
NODE_EXTRA_CA_CERTS; each runs in a process of its own, started with it, as a user's program
is), and a certificate renewed in place used within seconds, without a restart, while a
sandbox keeps working. The server that serves it runs unprivileged and cannot read the files:
its state helper reads them again. (The cluster's TLS, gateways to nodes, is in
test_cluster.py.)"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from husk_cluster import make_ca, make_cert
from husk_compat import http_request, sdk_in_process, start_server, wait_for


def served_serial(port: int, ca: Path) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.getpeercert()["serialNumber"]


# Run by the SDK in a process of its own (sdk_in_process): a sandbox made and used over HTTPS.
CREATE_AND_USE = """
opts = dict(api_url=args["url"], sandbox_url=args["url"], api_key=args["key"], request_timeout=30)
sbx = Sandbox.create(timeout=120, **opts)
result["id"] = sbx.sandbox_id
result["out"] = sbx.commands.run("echo over https").stdout
sbx.files.write("/tmp/f", "tls")
result["file"] = sbx.files.read("/tmp/f")
result["listed"] = sbx.sandbox_id in [s.sandbox_id for s in Sandbox.list(**opts).next_items()]
"""
# A command in a sandbox made before.
RUN = """
opts = dict(api_url=args["url"], sandbox_url=args["url"], api_key=args["key"], request_timeout=30)
result["out"] = Sandbox.connect(args["id"], **opts).commands.run(args["cmd"]).stdout
"""


def test_husk_serve_over_https_with_a_certificate_renewed_live(tmp_path):
    ca = make_ca(tmp_path)
    cert, key = make_cert(tmp_path, ca, "server", "IP:127.0.0.1")
    server = start_server(extra_args=("--tls-cert", str(cert), "--tls-key", str(key)))
    verified = ssl.create_default_context(cafile=str(ca[0]))
    # The stock Python SDK trusts the CA as any program on the host would: SSL_CERT_FILE.
    trust = {"SSL_CERT_FILE": str(ca[0])}
    args = {"url": server.url, "key": server.admin_key}
    sid = None
    try:
        assert server.url.startswith("https://"), server.url
        made = sdk_in_process(CREATE_AND_USE, trust, args)
        sid = made["id"]
        assert (made["out"], made["file"], made["listed"]) == ("over https\n", "tls", True)
        # Plain HTTP gets nothing: no answer, no service.
        with pytest.raises((http.client.HTTPException, OSError)):
            http_request(server.port, "GET", "/health", timeout=10)
        # The stock JS SDK, trusting the CA through Node's NODE_EXTRA_CA_CERTS.
        js = Path(__file__).resolve().parent.parent / "js"
        env = dict(os.environ, HUSK_URL=server.url, HUSK_API_KEY=server.admin_key,
                   NODE_EXTRA_CA_CERTS=str(ca[0]))
        out = subprocess.run(["node", "--test", "--test-timeout=120000", "tls_server.mjs"],
                             cwd=js, env=env, capture_output=True, timeout=300)
        text = (out.stdout + out.stderr).decode(errors="replace")
        assert out.returncode == 0 and "# pass 1" in text and "# fail 0" in text, text[-4000:]
        assert http_request(server.port, "GET", "/health", tls=verified).status == 204
        # A client that trusts another CA is refused by its own check.
        (tmp_path / "other").mkdir()
        stranger = ssl.create_default_context(cafile=str(make_ca(tmp_path / "other")[0]))
        with pytest.raises(ssl.SSLCertVerificationError):
            http_request(server.port, "GET", "/health", tls=stranger)
        # Renewed in place: presented to the next connection, without a restart.
        first = served_serial(server.port, ca[0])
        new_cert, new_key = make_cert(tmp_path, ca, "server-renewed", "IP:127.0.0.1")
        os.replace(new_key, key)
        os.replace(new_cert, cert)
        wait_for(lambda: served_serial(server.port, ca[0]) != first, 20,
                 "the renewed certificate to be served", 0.1)
        assert "the TLS certificate changed" in server.log_tail(20000)
        ran = sdk_in_process(RUN, trust, {**args, "id": sid, "cmd": "echo renewed"})
        assert ran["out"] == "renewed\n"
        # A broken pair (a key that is not the certificate's) changes nothing, and is
        # reported (once: crates/husk-server/src/tls_tests.rs).
        other_cert, _ = make_cert(tmp_path, ca, "stray", "IP:127.0.0.1")
        renewed = served_serial(server.port, ca[0])
        os.replace(other_cert, cert)
        wait_for(lambda: "stays in use" in server.log_tail(20000), 20,
                 "the broken pair to be reported", 0.1)
        assert served_serial(server.port, ca[0]) == renewed
        ran = sdk_in_process(RUN, trust, {**args, "id": sid, "cmd": "echo still"})
        assert ran["out"] == "still\n"
    finally:
        if sid is not None:
            http_request(server.port, "DELETE", f"/sandboxes/{sid}",
                         headers={"X-API-Key": server.admin_key}, tls=verified)
        server.close()


def test_husk_serve_refuses_a_certificate_it_cannot_use(tmp_path):
    ca = make_ca(tmp_path)
    cert, _ = make_cert(tmp_path, ca, "server", "IP:127.0.0.1")
    with pytest.raises(RuntimeError) as refused:
        start_server(extra_args=("--tls-cert", str(cert), "--tls-key", str(ca[1])))
    assert "--tls-key is not the key of --tls-cert's certificate" in str(refused.value)
    assert "exited with 2" in str(refused.value)
