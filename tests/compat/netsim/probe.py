"""Runs inside a sandbox (`python3 probe.py PROBE...`): tries each probe and prints one JSON
object {probe: {"r": result, "ms": elapsed}}. Exit code 0 whatever the results.

Probes: `http:URL` (GET, result `ok:<body>`), `tcp:HOST:PORT` (connect and send an HTTP
request, result `ok:<first bytes of the answer>`), `dns:NAME` (getaddrinfo, result
`ok:<addresses>`), `udp:HOST:PORT` (a datagram, then wait for any answer or error: `ok`),
`dnsat:SERVER:NAME` (a raw A query sent to SERVER:53, result `ok:<who answered>:<address>`),
`tls:HOST:PORT` (a TLS handshake with SNI HOST, unverified: `ok` or `tls-error`). `GW` in a
probe is the sandbox's name server (its gateway). Failures: `refused`, `reset`, `closed`,
`timeout`, `urlerror:<reason>`, `oserror:<errno>`, `dnserror:<code>`.

Shared by the Python and JS compat suites and by crates/husk/tests/net.rs (include_str!)."""

import json
import socket
import ssl
import sys
import time
import urllib.error
import urllib.request

try:
    gw = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")]
except OSError:
    gw = []

out = {}
for spec in sys.argv[1:]:
    kind, _, rest = spec.partition(":")
    if gw:
        rest = rest.replace("GW", gw[0])
    t = time.monotonic()
    try:
        if kind == "http":
            r = "ok:" + urllib.request.urlopen(rest, timeout=5).read().decode()
        elif kind == "tcp":
            host, port = rest.rsplit(":", 1)
            s = socket.create_connection((host, int(port)), timeout=5)
            s.settimeout(5)
            s.sendall(b"GET / HTTP/1.0\r\nHost: " + host.encode() + b"\r\n\r\n")
            d = s.recv(300)
            r = "ok:" + d.decode(errors="replace") if d else "closed"
        elif kind == "dns":
            r = "ok:" + ",".join(sorted({a[4][0] for a in socket.getaddrinfo(rest, 80, socket.AF_INET)}))
        elif kind == "udp":
            host, port = rest.rsplit(":", 1)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.connect((host, int(port)))
            s.send(b"x")
            s.recv(100)
            r = "ok"
        elif kind == "dnsat":
            server, name = rest.split(":", 1)
            q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
            q += b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\x00\x00\x01\x00\x01"
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(3)
            s.sendto(q, (server, 53))
            d, frm = s.recvfrom(512)
            r = "ok:" + frm[0] + ":" + ".".join(str(b) for b in d[-4:])
        elif kind == "tls":
            host, port = rest.rsplit(":", 1)
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            s = socket.create_connection((host, int(port)), timeout=5)
            try:
                ctx.wrap_socket(s, server_hostname=host)
                r = "ok"
            except ssl.SSLError:
                r = "tls-error"
        else:
            r = "unknown probe"
    except socket.gaierror as e:
        r = "dnserror:" + str(e.errno)
    except ConnectionRefusedError:
        r = "refused"
    except ConnectionResetError:
        r = "reset"
    except socket.timeout:
        r = "timeout"
    except urllib.error.URLError as e:
        r = "urlerror:" + str(e.reason)
    except OSError as e:
        r = "oserror:" + str(e.errno)
    except Exception as e:  # e.g. http.client.BadStatusLine: recorded, never a crash
        r = "error:" + type(e).__name__
    out[spec] = {"r": r, "ms": int((time.monotonic() - t) * 1000)}
print(json.dumps(out))
