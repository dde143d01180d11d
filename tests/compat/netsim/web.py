"""A web server of the simulated internet (run inside the test's network namespace with
`ip netns exec NAME python3 web.py HITS READY [--tls CERT KEY] ADDR:PORT...`).

Listens on every ADDR:PORT given and answers each request with `public host=<Host header>`
(HTTP/1.0, then closes); with `--tls`, those on port 443 speak TLS with CERT and KEY (PEM).
Every connection is appended to the HITS file as one JSON line {"to": "ADDR:PORT", "host":
"<Host or ->", "authorization": "<its Authorization header, or null>", "tls": bool}; READY is
created once all sockets are bound. Exits when its parent (the test) goes away. Standard
library only."""

import json
import os
import socket
import ssl
import sys
import threading
import time

lock = threading.Lock()


def serve(listener: socket.socket, at: str, hits_path: str, tls) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn, at, hits_path, tls), daemon=True).start()


def answer(conn: socket.socket, at: str, hits_path: str, tls) -> None:
    if tls is not None:
        try:
            conn.settimeout(5)
            conn = tls.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError):
            conn.close()
            return
    with conn:
        conn.settimeout(5)
        data = b""
        try:
            while b"\r\n\r\n" not in data and len(data) < 8192:
                chunk = conn.recv(2048)
                if not chunk:
                    break
                data += chunk
        except OSError:
            pass
        host, authorization = "-", None
        for line in data.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "host":
                host = value.strip()
            elif name.strip().lower() == "authorization":
                authorization = value.strip()
        hit = {"to": at, "host": host, "authorization": authorization, "tls": tls is not None}
        with lock, open(hits_path, "a") as f:
            f.write(json.dumps(hit) + "\n")
        body = f"public host={host}".encode()
        try:
            conn.sendall(
                b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\n\r\n"
                + body
            )
        except OSError:
            pass


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main() -> None:
    hits_path, ready_path, *binds = sys.argv[1:]
    tls = None
    if binds[:1] == ["--tls"]:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(binds[1], binds[2])
        binds = binds[3:]
    if not binds:
        sys.exit("usage: web.py HITS READY [--tls CERT KEY] ADDR:PORT...")
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    for at in binds:
        addr, port = at.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, int(port)))
        s.listen(64)
        on_tls = tls if port == "443" else None
        threading.Thread(target=serve, args=(s, at, hits_path, on_tls), daemon=True).start()
    open(ready_path + ".tmp", "w").close()
    os.rename(ready_path + ".tmp", ready_path)
    threading.Event().wait()


if __name__ == "__main__":
    main()
