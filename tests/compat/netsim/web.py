"""A web server of the simulated internet (run inside the test's network namespace with
`ip netns exec NAME python3 web.py HITS READY ADDR:PORT...`).

Listens on every ADDR:PORT given and answers each request with `public host=<Host header>`
(HTTP/1.0, then closes). Every connection is appended to the HITS file as one JSON line
{"to": "ADDR:PORT", "host": "<Host or ->"}; READY is created once all sockets are bound.
Exits when its parent (the test) goes away. Standard library only."""

import json
import os
import socket
import sys
import threading
import time

lock = threading.Lock()


def serve(listener: socket.socket, at: str, hits_path: str) -> None:
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=answer, args=(conn, at, hits_path), daemon=True).start()


def answer(conn: socket.socket, at: str, hits_path: str) -> None:
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
        host = "-"
        for line in data.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "host":
                host = value.strip()
                break
        with lock, open(hits_path, "a") as f:
            f.write(json.dumps({"to": at, "host": host}) + "\n")
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
    if not binds:
        sys.exit("usage: web.py HITS READY ADDR:PORT...")
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    for at in binds:
        addr, port = at.rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((addr, int(port)))
        s.listen(64)
        threading.Thread(target=serve, args=(s, at, hits_path), daemon=True).start()
    open(ready_path + ".tmp", "w").close()
    os.rename(ready_path + ".tmp", ready_path)
    threading.Event().wait()


if __name__ == "__main__":
    main()
