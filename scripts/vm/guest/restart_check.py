"""A sandbox through a restart of its server, with the stock E2B Python SDK (e2b==2.63.0):
restart_check.py prepare URL API_KEY STATE_FILE  (a sandbox with a file and a background
process; what to check later goes to STATE_FILE), then, once the server restarted,
restart_check.py verify URL API_KEY STATE_FILE  (the same sandbox: its file, the same
process still running and counting, then killed). Prints one `RESULT<TAB>sdk-restart<TAB>
ok|FAIL<TAB>detail` line in verify (and on a failed prepare)."""

import json
import sys
import time
import traceback

from e2b import Sandbox

PHASE, URL, KEY, STATE = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
OPTS = dict(api_url=URL, sandbox_url=URL, api_key=KEY, request_timeout=180)
COUNT = "i=0; while true; do i=$((i+1)); echo $i > /home/user/count; sleep 0.2; done"


def result(status, detail):
    detail = " ".join(str(detail).split())[:500]
    print(f"RESULT\tsdk-restart\t{status}\t{detail}", flush=True)


def prepare():
    sbx = Sandbox.create(timeout=600, metadata={"restart": "yes"}, **OPTS)
    sbx.files.write("/home/user/kept", "before the restart")
    handle = sbx.commands.run(COUNT, background=True)
    with open(STATE, "w") as f:
        json.dump({"id": sbx.sandbox_id, "pid": handle.pid, "token": sbx._envd_access_token}, f)


def count(sbx):
    return int(sbx.files.read("/home/user/count").strip() or 0)


def verify():
    with open(STATE) as f:
        was = json.load(f)
    sbx = Sandbox.connect(was["id"], **OPTS)
    assert sbx.get_info().metadata == {"restart": "yes"}, sbx.get_info().metadata
    assert sbx._envd_access_token == was["token"], "a new access token"
    kept = sbx.files.read("/home/user/kept")
    assert kept == "before the restart", repr(kept)
    pids = [p.pid for p in sbx.commands.list()]
    assert was["pid"] in pids, f"process {was['pid']} not in {pids}"
    first = count(sbx)
    deadline = time.monotonic() + 30
    while count(sbx) <= first:
        assert time.monotonic() < deadline, "the background process stopped counting"
        time.sleep(0.2)
    assert sbx.kill() is True
    return f"same sandbox, pid {was['pid']} still counting ({first}+)"


try:
    if PHASE == "prepare":
        prepare()
    else:
        result("ok", verify())
except Exception as e:  # every failure is a result, never a crash of the check
    traceback.print_exc()
    result("FAIL", f"{PHASE}: {type(e).__name__}: {e}")
    sys.exit(1)
