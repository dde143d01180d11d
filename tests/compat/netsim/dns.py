"""The name server of the simulated internet (run inside the test's network namespace with
`ip netns exec NAME python3 dns.py READY ADDR:PORT NAME=IPV4...`).

Answers one-question UDP queries: an A record (TTL 30) for each NAME given, an empty NOERROR
answer for other types of those names, NXDOMAIN for everything else. READY is created once
the socket is bound. Exits when its parent (the test) goes away. Standard library only."""

import os
import socket
import struct
import sys
import threading
import time


def parse_question(q: bytes):
    """(lowercase name without the trailing dot, qtype, offset after the question)."""
    if len(q) < 12 or struct.unpack("!H", q[4:6])[0] != 1:
        raise ValueError("not a one-question query")
    labels, i = [], 12
    while True:
        n = q[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(q[i + 1 : i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    qtype, _qclass = struct.unpack("!HH", q[i : i + 4])
    return ".".join(labels).lower(), qtype, i + 4


def reply(q: bytes, names: dict) -> bytes:
    name, qtype, end = parse_question(q)
    (qid,) = struct.unpack("!H", q[:2])
    rd = q[2] & 0x01
    flags = 0x8000 | (rd << 8) | 0x0080  # QR, RD copied, RA
    answers = b""
    if name not in names:
        flags |= 3  # NXDOMAIN
    elif qtype == 1:
        answers = struct.pack("!HHHIH", 0xC00C, 1, 1, 30, 4) + socket.inet_aton(names[name])
    header = struct.pack("!HHHHHH", qid, flags, 1, 1 if answers else 0, 0, 0)
    return header + q[12:end] + answers


def watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(0.2)
    os._exit(0)


def main() -> None:
    ready_path, at, *pairs = sys.argv[1:]
    names = {}
    for p in pairs:
        n, _, ip = p.partition("=")
        socket.inet_aton(ip)
        names[n.lower().rstrip(".")] = ip
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    addr, port = at.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, int(port)))
    open(ready_path + ".tmp", "w").close()
    os.rename(ready_path + ".tmp", ready_path)
    while True:
        q, frm = s.recvfrom(1500)
        try:
            s.sendto(reply(q, names), frm)
        except (ValueError, IndexError, struct.error):
            pass


if __name__ == "__main__":
    main()
