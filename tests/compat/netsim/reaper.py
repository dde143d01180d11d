"""Removes a test's network namespace if the test dies before its own teardown
(`python3 reaper.py NAME [DIR]`, started by the test in the host's namespaces).

Waits for its parent to go away, then runs `ip netns del NAME` and removes DIR (the simulated
internet's helpers exit by themselves when their parent goes). SIGTERM ends it without doing anything:
the test sends it after its own teardown. Standard library only."""

import os
import shutil
import signal
import subprocess
import sys
import time


def main() -> None:
    name, *dirs = sys.argv[1:]
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while os.getppid() == parent:
        time.sleep(0.2)
    subprocess.run(["ip", "netns", "del", name], capture_output=True, timeout=30)
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
