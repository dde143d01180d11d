"""Signed file URLs from the stock sync SDK (`download_url` / `upload_url`), fetched with plain
urllib: valid ones work without the access token, expired or tampered ones get 401.

With `sandbox_url` set, the SDK builds the URL on that one base URL, which carries no sandbox
id; the request names the sandbox with the routing headers (`E2b-Sandbox-Id`,
`E2b-Sandbox-Port`), as every other per-sandbox request does in single-base-URL mode. The
signature, not the access token, is what authorizes it. A client that sends no routing header
(a browser, curl) reaches the sandbox too: husk finds it by the signature."""

from __future__ import annotations

import json
import time
import urllib.parse

from husk_compat import fetch_url as fetch
from husk_compat import multipart, wait_for

EXPIRED_BODY = {"code": 401, "message": "signature is already expired"}


def query(url: str) -> dict:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(url).query))


def with_query(url: str, **changes) -> str:
    """The same URL with some query parameters replaced."""
    parts = urllib.parse.urlsplit(url)
    q = query(url)
    q.update(changes)
    new = parts._replace(query=urllib.parse.urlencode(q, quote_via=urllib.parse.quote))
    out = urllib.parse.urlunsplit(new)
    assert out != url
    return out


def flip(sig: str) -> str:
    return sig[:-2] + ("AA" if sig[-2:] != "AA" else "BB")


def test_download_url_works(sandbox, husk):
    sandbox.files.write("/home/user/dl.txt", "signed download")
    url = sandbox.download_url("/home/user/dl.txt")
    assert url.startswith(husk.url + "/files?")
    q = query(url)
    assert q["path"] == "/home/user/dl.txt"
    assert q["signature"].startswith("v1_")
    assert "signature_expiration" not in q
    status, body = fetch(url, sandbox.sandbox_id)
    assert status == 200
    assert body == b"signed download"


def test_download_url_binary(sandbox):
    data = bytes(range(256)) * 100
    sandbox.files.write("/tmp/dl.bin", data)
    status, body = fetch(sandbox.download_url("/tmp/dl.bin"), sandbox.sandbox_id)
    assert (status, body) == (200, data)


def test_download_url_with_expiration_then_expired(sandbox):
    sandbox.files.write("/tmp/exp.txt", "expiring")
    url = sandbox.download_url("/tmp/exp.txt", use_signature_expiration=3)
    exp = int(query(url)["signature_expiration"])
    assert abs(exp - (time.time() + 3)) <= 2
    status, body = fetch(url, sandbox.sandbox_id)
    assert (status, body) == (200, b"expiring")

    def expired():
        status, body = fetch(url, sandbox.sandbox_id)
        return (status, body) if status != 200 else None

    status, body = wait_for(expired, 15, "the signed URL to expire", 0.5)
    assert status == 401
    assert json.loads(body) == EXPIRED_BODY


def test_already_expired_signature(sandbox):
    sandbox.files.write("/tmp/old.txt", "old")
    url = sandbox.download_url("/tmp/old.txt", use_signature_expiration=-30)
    status, body = fetch(url, sandbox.sandbox_id)
    assert status == 401
    assert body.strip() == b'{"code":401,"message":"signature is already expired"}'


def test_upload_url_works(sandbox):
    url = sandbox.upload_url("/home/user/up.txt")
    assert query(url)["signature"].startswith("v1_")
    body, headers = multipart("/home/user/up.txt", b"uploaded via signed url")
    status, resp = fetch(url, sandbox.sandbox_id, "POST", body, headers)
    assert status == 200, resp
    assert sandbox.files.read("/home/user/up.txt") == "uploaded via signed url"
    assert sandbox.files.get_info("/home/user/up.txt").owner == "user"


def test_upload_url_expired(sandbox):
    url = sandbox.upload_url("/tmp/late.txt", use_signature_expiration=-30)
    body, headers = multipart("/tmp/late.txt", b"too late")
    status, resp = fetch(url, sandbox.sandbox_id, "POST", body, headers)
    assert status == 401
    assert json.loads(resp) == EXPIRED_BODY
    assert not sandbox.files.exists("/tmp/late.txt")


def test_upload_url_with_valid_expiration(sandbox):
    url = sandbox.upload_url("/tmp/in-time.txt", use_signature_expiration=120)
    body, headers = multipart("/tmp/in-time.txt", b"in time")
    status, _ = fetch(url, sandbox.sandbox_id, "POST", body, headers)
    assert status == 200
    assert sandbox.files.read("/tmp/in-time.txt") == "in time"


def test_tampered_signature_rejected(sandbox):
    sandbox.files.write("/tmp/t.txt", "t")
    url = sandbox.download_url("/tmp/t.txt")
    status, body = fetch(with_query(url, signature=flip(query(url)["signature"])), sandbox.sandbox_id)
    assert status == 401
    assert body != b"t"


def test_signature_is_bound_to_path(sandbox):
    sandbox.files.write("/tmp/allowed.txt", "allowed")
    sandbox.files.write("/tmp/other.txt", "other")
    url = sandbox.download_url("/tmp/allowed.txt")
    assert fetch(url, sandbox.sandbox_id) == (200, b"allowed")
    status, body = fetch(with_query(url, path="/tmp/other.txt"), sandbox.sandbox_id)
    assert status == 401
    assert body != b"other"


def test_signature_is_bound_to_expiration(sandbox):
    sandbox.files.write("/tmp/e.txt", "e")
    url = sandbox.download_url("/tmp/e.txt", use_signature_expiration=60)
    exp = int(query(url)["signature_expiration"])
    status, _ = fetch(with_query(url, signature_expiration=str(exp + 3600)), sandbox.sandbox_id)
    assert status == 401
    # Dropping the expiration does not turn it into a signature without one.
    parts = urllib.parse.urlsplit(url)
    q = {k: v for k, v in query(url).items() if k != "signature_expiration"}
    no_exp = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(q, quote_via=urllib.parse.quote)))
    status, _ = fetch(no_exp, sandbox.sandbox_id)
    assert status == 401


def test_read_signature_cannot_write(sandbox):
    sandbox.files.write("/tmp/ro.txt", "original")
    url = sandbox.download_url("/tmp/ro.txt")
    body, headers = multipart("/tmp/ro.txt", b"overwritten")
    status, _ = fetch(url, sandbox.sandbox_id, "POST", body, headers)
    assert status == 401
    assert sandbox.files.read("/tmp/ro.txt") == "original"


def test_write_signature_cannot_read(sandbox):
    sandbox.files.write("/tmp/wo.txt", "secret")
    status, body = fetch(sandbox.upload_url("/tmp/wo.txt"), sandbox.sandbox_id)
    assert status == 401
    assert body != b"secret"


def test_no_signature_no_token_is_unauthorized(sandbox, husk):
    sandbox.files.write("/tmp/nosig.txt", "nosig")
    status, body = fetch(f"{husk.url}/files?path=/tmp/nosig.txt", sandbox.sandbox_id)
    assert status == 401
    assert body != b"nosig"


def test_signed_url_for_root(sandbox):
    sandbox.files.write("/root/r.txt", "root only", user="root")
    sandbox.commands.run("chmod 600 /root/r.txt", user="root")
    url = sandbox.download_url("/root/r.txt", user="root")
    assert query(url)["username"] == "root"
    assert fetch(url, sandbox.sandbox_id) == (200, b"root only")
    # The username is part of what was signed.
    status, body = fetch(with_query(url, username="user"), sandbox.sandbox_id)
    assert status == 401
    assert body != b"root only"


def test_signed_url_dies_with_the_sandbox(sandbox):
    sandbox.files.write("/tmp/gone.txt", "gone")
    url = sandbox.download_url("/tmp/gone.txt")
    assert fetch(url, sandbox.sandbox_id)[0] == 200
    sandbox.kill()
    status, body = fetch(url, sandbox.sandbox_id)
    assert status == 502
    assert "was not found" in body.decode()


def fetch_plain(url: str, method: str = "GET", body=None, headers=None):
    """Opens a URL as a browser, curl or urllib would: no routing header, no token."""
    return fetch(url, None, method, body, headers)


def test_signed_urls_work_for_a_client_that_names_no_sandbox(sandbox_factory):
    # Two sandboxes with the same path: each URL reaches its own sandbox, by its signature.
    a, b = sandbox_factory(), sandbox_factory()
    a.files.write("/tmp/same.txt", "from a")
    b.files.write("/tmp/same.txt", "from b")
    for sbx, want in ((a, b"from a"), (b, b"from b")):
        url = sbx.download_url("/tmp/same.txt")
        assert fetch_plain(url) == (200, want)
        assert fetch_plain(url) == (200, want), "a second time (remembered)"
        timed = sbx.download_url("/tmp/same.txt", use_signature_expiration=60)
        assert fetch_plain(timed) == (200, want)

    up = a.upload_url("/home/user/plain-up.txt")
    body, headers = multipart("/home/user/plain-up.txt", b"uploaded plainly")
    status, resp = fetch_plain(up, "POST", body, headers)
    assert status == 200, resp
    assert a.files.read("/home/user/plain-up.txt") == "uploaded plainly"
    assert not b.files.exists("/home/user/plain-up.txt")


def test_signed_urls_without_a_sandbox_are_refused_as_envd_refuses_them(sandbox):
    sandbox.files.write("/tmp/p.txt", "p")
    expired = sandbox.download_url("/tmp/p.txt", use_signature_expiration=-30)
    status, body = fetch_plain(expired)
    assert (status, json.loads(body)) == (401, EXPIRED_BODY)
    url = sandbox.download_url("/tmp/p.txt")
    status, body = fetch_plain(with_query(url, signature=flip(query(url)["signature"])))
    assert status == 401 and json.loads(body)["message"] == "invalid signature", body
    # Bound to its path and operation, as with the routing headers.
    status, _ = fetch_plain(with_query(url, path="/tmp/other.txt"))
    assert status == 401
    body, headers = multipart("/tmp/p.txt", b"overwrite")
    status, _ = fetch_plain(url, "POST", body, headers)
    assert status == 401
    assert sandbox.files.read("/tmp/p.txt") == "p"
    # Gone with its sandbox.
    assert fetch_plain(url) == (200, b"p")
    sandbox.kill()
    status, body = fetch_plain(url)
    assert status == 401 and json.loads(body)["message"] == "invalid signature", body
