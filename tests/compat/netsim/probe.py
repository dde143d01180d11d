"""Runs inside a sandbox (`python3 probe.py PROBE...`): tries each probe and prints one JSON
object {probe: {"r": result, "ms": elapsed}}. Exit code 0 whatever the results.

Probes: `http:URL` (GET, result `ok:<body>`), `tcp:HOST:PORT` (connect and send an HTTP
request, result `ok:<first bytes of the answer>`), `dns:NAME` (getaddrinfo, result
`ok:<addresses>`). Failures: `refused`, `reset`, `closed`, `timeout`, `urlerror:<reason>`,
`oserror:<errno>`, `dnserror:<code>`."""

import json
import socket
import sys
import time
import urllib.error
import urllib.request

out = {}
for spec in sys.argv[1:]:
    kind, _, rest = spec.partition(":")
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
