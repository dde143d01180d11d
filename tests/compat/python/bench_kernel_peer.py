"""The peer of the code-interpreter benchmark: the same ipykernel (7.4.0) driven directly by the
reference client (jupyter_client 8.10.0), on this host, without husk.

Run with the interpreter of scripts/jupyter-test-venv. Prints one JSON object: the round trip of
`execute_interactive(code)` (request to the kernel's idle, output received) per iteration, in ms,
and the kernel's own time per execution (its reply's header date minus its `started`
metadata), in ms.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime

from jupyter_client.manager import start_new_kernel


def main() -> None:
    code = sys.argv[1]
    n = int(sys.argv[2])
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        for _ in range(3):
            kc.execute_interactive(code, timeout=30, output_hook=lambda m: None)
        round_trips = []
        inside = []
        for _ in range(n):
            t = time.perf_counter()
            reply = kc.execute_interactive(code, timeout=30, output_hook=lambda m: None)
            round_trips.append((time.perf_counter() - t) * 1000)
            started = reply["metadata"].get("started")
            done = reply["header"].get("date")
            if isinstance(started, str):
                started = datetime.fromisoformat(started.replace("Z", "+00:00"))
            if isinstance(done, str):
                done = datetime.fromisoformat(done.replace("Z", "+00:00"))
            if started is not None and done is not None:
                inside.append((done - started).total_seconds() * 1000)
        print(json.dumps({"round_trip_ms": round_trips, "kernel_ms": inside}))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


if __name__ == "__main__":
    main()
