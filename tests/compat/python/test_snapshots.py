"""Snapshots and forks with the stock sync SDK (e2b==2.63.0).

`create_snapshot` (unnamed, `name`, `name:tag`, both modes; the source frozen for the copy
only, then going on with the same id and expiry), `Sandbox.create` from a snapshot (by its
snapshot id, bare id, `team/name[:tag]`, bare name; files as they were at the snapshot, later
changes not; special files; volumes left out), snapshots of sandboxes made from snapshots or
resumed from disk (stacked, up to husk's depth), a name taken over, `list_snapshots` (the
team's live ones, newest first, filters, pages), `delete_snapshot` (any key of the team;
sandboxes standing on a deleted snapshot go on, pause and resume; deletes racing creates),
`fork` (files, envs, metadata, network, volumes, lifecycle, own ids and tokens, timeouts,
count bounds, 20 at once), tenancy, no key, malformed bodies, concurrent calls, husk's CLI, the
quotas (`--max-snapshots`, also under concurrent requests; `--max-sandboxes` for forks), a
restart of the server (SIGTERM, then SIGKILL), and that nothing is left under
STATE_DIR/snapshots once everything is killed and deleted (also after a crash).

Every test undoes what it made, pass or fail (`Kit`: sandboxes killed, snapshots deleted with
the key that made them). Tests that need an exact team-wide view use a team of their own."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import secrets
import subprocess
import threading
import urllib.parse
from typing import Dict, List, Optional, Tuple

import pytest

from e2b import (
    AuthenticationException,
    InvalidArgumentException,
    RateLimitException,
    Sandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    Volume,
)

from husk_compat import HuskServer, http_request, start_server, unique, wait_for

UNKNOWN_ID = "nosuchsandbox0000000"
BAD_KEY = "e2b_" + "0" * 40
BLOB = bytes(range(256)) * 64
WEB_PORT = 8000
# husk's depth limit: a snapshot holds at most this many snapshot layers (MAX_SAVED_LAYERS,
# 16, less room for a paused layer of a sandbox made from it).
MAX_STACK = 15


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# --------------------------------------------------------------------------------------------
# What a test makes, undone at the end


class Kit:
    """Creates sandboxes, snapshots and forks on one server and remembers each with the key
    that made it; `close()` kills the sandboxes and deletes the snapshots (best effort)."""

    def __init__(self, server: HuskServer):
        self.server = server
        self.keys: Dict[str, str] = {}  # sandbox id -> key
        self.sandboxes: List[Tuple[str, str]] = []
        self.snapshots: List[Tuple[str, str]] = []

    def opts(self, key: Optional[str] = None) -> dict:
        return self.server.opts(api_key=key)

    def key_of(self, key: Optional[str]) -> str:
        return key or self.server.admin_key

    def track(self, sandbox_id: str, key: Optional[str] = None) -> None:
        self.keys[sandbox_id] = self.key_of(key)
        self.sandboxes.append((sandbox_id, self.key_of(key)))

    def track_snapshot(self, snapshot_id: str, key: Optional[str] = None) -> None:
        self.snapshots.append((snapshot_id, self.key_of(key)))

    def create(self, template: Optional[str] = None, key: Optional[str] = None, **kw) -> Sandbox:
        kw.setdefault("timeout", 120)
        if template is not None:
            kw["template"] = template
        sbx = Sandbox.create(**kw, **self.opts(key))
        self.track(sbx.sandbox_id, key)
        return sbx

    def snapshot(self, sbx: Sandbox, name: Optional[str] = None, **kw):
        """`sbx.create_snapshot(...)` (the instance call, with the key `sbx` was made with)."""
        info = sbx.create_snapshot(name=name, **kw)
        self.track_snapshot(info.snapshot_id, self.keys.get(sbx.sandbox_id))
        return info

    def adopt(self, results: list, key: Optional[str] = None) -> list:
        for r in results:
            if isinstance(r, Sandbox):
                self.track(r.sandbox_id, key)
        return results

    def fork(self, sbx: Sandbox, **kw) -> list:
        key = self.keys.get(sbx.sandbox_id)
        results = sbx.fork(**kw)
        return self.adopt(results, key)

    def close(self) -> None:
        for sandbox_id, key in reversed(self.sandboxes):
            try:
                Sandbox.kill(sandbox_id, **self.opts(key))
            except Exception:
                pass
        for snapshot_id, key in reversed(self.snapshots):
            try:
                Sandbox.delete_snapshot(snapshot_id, **self.opts(key))
            except Exception:
                pass


@pytest.fixture
def kit(husk):
    k = Kit(husk)
    try:
        yield k
    finally:
        k.close()


@contextlib.contextmanager
def own_server(*extra_args: str):
    """A server of the test's own (fresh state dir), with a Kit on it; both undone at the end."""
    server = start_server(extra_args=tuple(extra_args))
    k = Kit(server)
    try:
        yield server, k
    finally:
        try:
            k.close()
        finally:
            rc, tail = server.close()
            assert rc in (0, None), f"husk serve exited with {rc}:\n{tail}"


# --------------------------------------------------------------------------------------------
# Helpers


def listed(paginator) -> List[str]:
    """Every snapshot id of every page, in order."""
    out: List[str] = []
    while paginator.has_next:
        out += [s.snapshot_id for s in paginator.next_items()]
    return out


def listed_infos(paginator) -> list:
    out = []
    while paginator.has_next:
        out += paginator.next_items()
    return out


def own_id(info) -> str:
    """An unnamed snapshot's own id (its snapshot id is `<id>:default`)."""
    assert info.snapshot_id.endswith(":default") and "/" not in info.snapshot_id, info
    return info.snapshot_id[: -len(":default")]


def snapshot_dirs(server: HuskServer) -> List[str]:
    root = server.state_dir / "snapshots"
    return sorted(os.listdir(root)) if root.exists() else []


def paused_dirs(server: HuskServer) -> List[str]:
    root = server.state_dir / "paused"
    return sorted(os.listdir(root)) if root.exists() else []


def sandbox_ids(paginator) -> Dict[str, SandboxState]:
    out = {}
    while paginator.has_next:
        for s in paginator.next_items():
            out[s.sandbox_id] = s.state
    return out


def pids(sbx: Sandbox) -> set:
    return {p.pid for p in sbx.commands.list()}


def ps(sbx: Sandbox) -> str:
    return sbx.commands.run("ps -e -o args=").stdout


def post(server: HuskServer, path: str, body, key: Optional[str] = "admin"):
    headers = {"Content-Type": "application/json"}
    if key == "admin":
        headers["X-API-KEY"] = server.admin_key
    elif key is not None:
        headers["X-API-KEY"] = key
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    return http_request(server.port, "POST", path, headers, body)


def get(server: HuskServer, path: str, key: Optional[str] = "admin"):
    headers = {}
    if key == "admin":
        headers["X-API-KEY"] = server.admin_key
    elif key is not None:
        headers["X-API-KEY"] = key
    return http_request(server.port, "GET", path, headers)


def delete_raw(server: HuskServer, snapshot_id: str, key: Optional[str] = "admin"):
    headers = {}
    if key == "admin":
        headers["X-API-KEY"] = server.admin_key
    elif key is not None:
        headers["X-API-KEY"] = key
    return http_request(server.port, "DELETE", f"/templates/{urllib.parse.quote(snapshot_id, safe='')}", headers)


def another_key_of(server: HuskServer, team: str) -> str:
    """A further key of `team` (not the cached one create_key returns)."""
    out = subprocess.run(
        [str(server.bin), "key", "create", "--team", team, "--state-dir", str(server.state_dir)],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def ticks(sbx: Sandbox) -> None:
    """Starts a loop that rewrites /tmp/tick ten times a second."""
    sbx.commands.run("sh -c 'while :; do date +%s%N > /tmp/tick; sleep 0.1; done'", background=True)
    wait_for(lambda: sbx.files.exists("/tmp/tick"), 10, "the first tick")


def assert_ticking(sbx: Sandbox) -> None:
    """The loop of `ticks` runs (not frozen): /tmp/tick changes."""
    first = sbx.files.read("/tmp/tick")
    wait_for(lambda: sbx.files.read("/tmp/tick") != first, 10, f"{sbx.sandbox_id} to tick on")


# Files of every kind, written before a snapshot; `change_after` changes them afterwards, and
# `assert_files_at_snapshot` checks a sandbox has them as they were at the snapshot.


def prepare(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/keep.txt", "kept")
    sbx.files.write("/home/user/changed.txt", "v1")
    sbx.files.write("/home/user/doomed.txt", "doomed")
    sbx.files.write("/home/user/blob.bin", BLOB)
    sbx.files.write("/tmp/t.txt", "in tmp")
    sbx.commands.run(
        "mkdir -p /home/user/d/e && printf deep > /home/user/d/e/f"
        " && ln -s /home/user/keep.txt /home/user/link"
        " && printf '#!/bin/sh\\necho ran\\n' > /home/user/run.sh && chmod 0750 /home/user/run.sh"
        " && printf x > /tmp/short-lived && rm /tmp/short-lived"
    )
    # A template file to delete (the host template's /etc copy has it).
    assert sbx.files.exists("/etc/issue"), "the template has no /etc/issue to delete"
    sbx.commands.run(
        "mkdir -p /opt/snap && printf opt > /opt/snap/data && chmod 0600 /opt/snap/data"
        " && printf etc > /etc/snap.conf && rm /etc/issue",
        user="root",
    )


def change_after(sbx: Sandbox) -> None:
    sbx.files.write("/home/user/changed.txt", "v2")
    sbx.files.remove("/home/user/doomed.txt")
    sbx.files.write("/home/user/later.txt", "later")
    sbx.commands.run("printf later > /etc/later.conf && rm /etc/snap.conf && rm -r /opt/snap", user="root")


def assert_files_at_snapshot(sbx: Sandbox) -> None:
    assert sbx.files.read("/home/user/keep.txt") == "kept"
    assert sbx.files.read("/home/user/changed.txt") == "v1"
    assert sbx.files.read("/home/user/doomed.txt") == "doomed"
    assert sbx.files.read("/home/user/blob.bin", format="bytes") == BLOB
    assert sbx.files.read("/tmp/t.txt") == "in tmp"
    assert sbx.files.read("/home/user/d/e/f") == "deep"
    assert sbx.files.read("/opt/snap/data", user="root") == "opt"
    assert sbx.files.read("/etc/snap.conf") == "etc"
    # Deleted before the snapshot: deleted; made after it: absent.
    assert sbx.files.exists("/etc/issue") is False
    assert sbx.files.exists("/tmp/short-lived") is False
    assert sbx.files.exists("/home/user/later.txt") is False
    assert sbx.files.exists("/etc/later.conf") is False
    r = sbx.commands.run(
        "readlink /home/user/link; /home/user/run.sh;"
        " stat -c '%U %a' /home/user/keep.txt /home/user/run.sh /home/user/d/e /tmp/t.txt;"
        " sudo stat -c '%U %a' /opt/snap/data /etc/snap.conf"
    )
    assert r.stdout == (
        "/home/user/keep.txt\nran\n"
        "user 644\nuser 750\nuser 755\nuser 644\n"
        "root 600\nroot 644\n"
    ), r.stdout


# --------------------------------------------------------------------------------------------
# Snapshots and sandboxes from them


def test_a_sandbox_from_a_snapshot_has_the_files_of_that_moment(kit):
    marker = f"sleep {secrets.randbelow(900_000) + 100_000}"
    src = kit.create(envs={"SRC_ENV": "src"}, metadata={"role": "source"})
    prepare(src)
    sleeper = src.commands.run(marker, background=True)
    ticks(src)
    assert src.list_snapshots().next_items() == []

    end_before = src.get_info().end_at
    info = kit.snapshot(src)
    assert info.names == []
    assert own_id(info) != src.sandbox_id
    assert own_id(info) != ""

    # The source goes on: the same id, running, its processes there and not frozen.
    same = src.get_info()
    assert same.sandbox_id == src.sandbox_id and same.state == SandboxState.RUNNING
    assert same.end_at == end_before, (same.end_at, end_before)
    assert same.metadata == {"role": "source"}
    assert sleeper.pid in pids(src)
    assert_ticking(src)
    assert src.commands.run("echo $SRC_ENV").stdout == "src\n"
    # Its later changes are its own.
    change_after(src)

    new = kit.create(info.snapshot_id, envs={"NEW_ENV": "new"}, metadata={"role": "copy"})
    assert new.sandbox_id not in (src.sandbox_id, own_id(info))
    assert_files_at_snapshot(new)
    # Files only: no process of the source runs in it.
    assert marker not in ps(new)
    # A sandbox of its own: its create's envs and metadata, the template's user and directory.
    r = new.commands.run('echo "$NEW_ENV|$(whoami)|$(pwd)"')
    assert r.stdout == "new|user|/home/user\n", r.stdout
    info_new = new.get_info()
    assert info_new.metadata == {"role": "copy"}
    assert info_new.state == SandboxState.RUNNING
    # Writes stay where they are made.
    new.files.write("/home/user/keep.txt", "the copy's")
    assert src.files.read("/home/user/keep.txt") == "kept"
    assert src.files.read("/home/user/changed.txt") == "v2"
    assert src.files.exists("/home/user/doomed.txt") is False
    # A second sandbox from the snapshot starts from the snapshot, not from the first copy.
    again = kit.create(info.snapshot_id)
    assert_files_at_snapshot(again)
    # The source's own snapshot list names it (and only it).
    assert listed(src.list_snapshots()) == [info.snapshot_id]


def test_snapshot_modes_are_accepted_and_hold_files_only(kit, husk):
    src = kit.create()
    src.files.write("/home/user/m.txt", "m")
    marker = f"sleep {secrets.randbelow(900_000) + 100_000}"
    src.commands.run(marker, background=True)
    full = kit.snapshot(src, mode="full")
    fs = kit.snapshot(src, mode="filesystem")
    # The static call too.
    static = Sandbox.create_snapshot(src.sandbox_id, **husk.opts())
    kit.track_snapshot(static.snapshot_id)
    ids = [full.snapshot_id, fs.snapshot_id, static.snapshot_id]
    assert len(set(ids)) == 3, ids
    # And raw, with `memory` either way.
    for memory in (True, False):
        r = post(husk, f"/sandboxes/{src.sandbox_id}/snapshots", {"memory": memory})
        assert r.status == 201, (memory, r.status, r.text)
        body = r.json()
        assert set(body) == {"snapshotID", "names"} and body["names"] == [], body
        kit.track_snapshot(body["snapshotID"])
        ids.append(body["snapshotID"])
    for snapshot_id in ids:
        s = kit.create(snapshot_id)
        assert s.files.read("/home/user/m.txt") == "m"
        assert marker not in ps(s), snapshot_id
    assert marker in ps(src)


def test_the_copy_is_faithful(kit):
    """Special files, links, modes, times, extended attributes, a large file, and a template
    directory removed: a sandbox from the snapshot sees them as the source did."""
    src = kit.create()
    script = (
        "set -e; cd /home/user"
        " && mkdir emptydir && chmod 0701 emptydir"
        " && mkfifo fifo"
        " && printf h > hard1 && ln hard1 hard2"
        " && head -c 20000000 /dev/urandom > big.bin && sha256sum big.bin > big.sum"
        " && printf u > 'sp ace ü.txt'"
        " && touch -d '2001-02-03 04:05:06' old.txt"
        " && python3 -c \"import os; os.setxattr('hard1', 'user.k', b'v')\""
    )
    src.commands.run(script)
    # Template files: one replaced by a directory, one by a symlink.
    for f in ("/etc/debian_version", "/etc/host.conf"):
        assert src.files.get_info(f).type.value == "file", f"the template has no file {f}"
    src.commands.run(
        "rm /etc/debian_version && mkdir /etc/debian_version && printf in > /etc/debian_version/inside"
        " && rm /etc/host.conf && ln -s /etc/issue.gone /etc/host.conf",
        user="root",
    )
    describe = (
        "cd /home/user && stat -c '%n %h %a %F %Y %U' emptydir fifo hard1 hard2 old.txt 'sp ace ü.txt'"
        " && [ $(stat -c %i hard1) = $(stat -c %i hard2) ] && echo same-inode"
        " && sha256sum -c big.sum"
        " && python3 -c \"import os; print(os.getxattr('hard1', 'user.k'))\""
        " && cat /etc/debian_version/inside && echo && readlink /etc/host.conf"
    )
    expected = src.commands.run(describe).stdout
    assert "same-inode" in expected and "big.bin: OK" in expected and "b'v'" in expected, expected
    assert expected.endswith("in\n/etc/issue.gone\n"), expected
    info = kit.snapshot(src)
    copy = kit.create(info.snapshot_id)
    assert copy.commands.run(describe).stdout == expected


@pytest.mark.timeout(90)
def test_a_snapshot_of_a_resumed_sandbox_outlives_it(kit, husk):
    """A sandbox paused to disk (twice) and resumed stands on its saved layers; a snapshot
    of it, and a fork, hold all of its files, also once it is killed (and its layers go)."""
    o = husk.opts()
    src = kit.create()
    src.files.write("/home/user/f1", "1")
    src.files.write("/home/user/gone", "g")
    early = kit.snapshot(src)
    assert src.pause(mode="filesystem") is True
    Sandbox.connect(src.sandbox_id, **o)
    src.files.write("/home/user/f2", "2")
    src.files.remove("/home/user/gone")
    assert src.pause(mode="filesystem") is True
    Sandbox.connect(src.sandbox_id, **o)
    src.files.write("/home/user/f3", "3")
    info = kit.snapshot(src)
    [fork] = kit.fork(src)
    assert isinstance(fork, Sandbox), fork
    assert src.kill() is True
    # Snapshots outlive the sandbox they were taken of, and are still found by its id.
    assert listed(Sandbox.list_snapshots(sandbox_id=src.sandbox_id, **o)) == [info.snapshot_id, early.snapshot_id]

    check = "ls /home/user; cat /home/user/f1 /home/user/f2 /home/user/f3"
    want = "f1\nf2\nf3\n123"
    assert kit.create(early.snapshot_id).commands.run("ls /home/user").stdout == "f1\ngone\n"
    assert kit.create(info.snapshot_id).commands.run(check).stdout == want
    assert fork.commands.run(check).stdout == want
    assert fork.pause(mode="filesystem") is True
    Sandbox.connect(fork.sandbox_id, **o)
    assert fork.commands.run(check).stdout == want
    # And a sandbox from the snapshot, paused to disk and resumed, snapshotted again.
    again = kit.create(info.snapshot_id)
    again.files.write("/home/user/f4", "4")
    assert again.pause(mode="filesystem") is True
    Sandbox.connect(again.sandbox_id, **o)
    stacked = kit.snapshot(again)
    assert again.kill() is True
    assert kit.create(stacked.snapshot_id).commands.run(check + " /home/user/f4").stdout == "f1\nf2\nf3\nf4\n1234"


def test_names_tags_and_every_way_to_name_a_snapshot(kit, husk):
    team = unique("snapnames")
    key = husk.create_key(team)
    src = kit.create(key=key)
    name = unique("web")

    src.files.write("/home/user/which", "web")
    web = kit.snapshot(src, name=name)
    assert web.snapshot_id == f"{team}/{name}:default", web
    assert web.names == [web.snapshot_id]
    src.files.write("/home/user/which", "v2")
    tagged = kit.snapshot(src, name=f"{name}:v2")
    assert tagged.snapshot_id == f"{team}/{name}:v2", tagged
    assert tagged.names == [tagged.snapshot_id]
    src.files.write("/home/user/which", "anon")
    anon = kit.snapshot(src)
    assert anon.names == []

    for ref, expected in [
        (web.snapshot_id, "web"),
        (f"{team}/{name}", "web"),
        (name, "web"),
        (f"{name}:default", "web"),
        (tagged.snapshot_id, "v2"),
        (f"{name}:v2", "v2"),
        (anon.snapshot_id, "anon"),
        (own_id(anon), "anon"),
    ]:
        s = kit.create(ref, key=key)
        assert s.files.read("/home/user/which") == expected, ref

    # A tag no snapshot has is not found.
    with pytest.raises(SandboxException) as ei:
        kit.create(f"{name}:v3", key=key)
    assert ei.value.status_code == 404, ei.value


@pytest.mark.parametrize("tag_len", [63, 64])
def test_the_longest_names_and_tags(kit, husk, tag_len):
    """A name and a tag of 64 characters each (of every allowed character) are valid: a
    snapshot is taken under them and reached by them."""
    team = unique("snaplong")
    key = husk.create_key(team)
    src = kit.create(key=key)
    src.files.write("/home/user/which", "long")
    longest = "0" + "a._-9" * 12 + "zzz"
    assert len(longest) == 64
    tag = "t" * tag_len
    r = post(husk, f"/sandboxes/{src.sandbox_id}/snapshots", {"name": f"{longest}:{tag}"}, key)
    if r.status == 201:
        kit.track_snapshot(r.json()["snapshotID"], key)
    assert r.status == 201, (len(longest) + 1 + tag_len, r.status, r.text)
    assert r.json() == {"snapshotID": f"{team}/{longest}:{tag}", "names": [f"{team}/{longest}:{tag}"]}
    for ref in (f"{longest}:{tag}", f"{team}/{longest}:{tag}"):
        assert kit.create(ref, key=key).files.read("/home/user/which") == "long", ref
    assert listed(Sandbox.list_snapshots(name=longest, **husk.opts(api_key=key))) == [f"{team}/{longest}:{tag}"]
    assert Sandbox.delete_snapshot(f"{longest}:{tag}", **husk.opts(api_key=key)) is True


def test_a_bare_name_means_a_template_first(kit, husk):
    """Named like a template (`base`), a snapshot is reached by `team/name`; the bare name
    still means the template."""
    team = unique("snapbase")
    key = husk.create_key(team)
    src = kit.create(key=key)
    src.files.write("/home/user/from-snapshot", "yes")
    info = kit.snapshot(src, name="base")
    assert info.snapshot_id == f"{team}/base:default"
    assert kit.create(f"{team}/base", key=key).files.read("/home/user/from-snapshot") == "yes"
    plain = kit.create("base", key=key)
    assert plain.files.exists("/home/user/from-snapshot") is False
    assert plain.get_info().template_id == "base"


@pytest.mark.parametrize(
    "bad",
    ["Web", "-web", ".web", "web:", ":v1", "a:b:c", "team/web", "a b", "wéb", "web\n",
     "a" * 65, "web:" + "t" * 65, "web:-t", "web:T"],
)
def test_invalid_names_are_refused_with_400(kit, husk, bad):
    src = kit.create()
    r = post(husk, f"/sandboxes/{src.sandbox_id}/snapshots", {"name": bad})
    assert r.status == 400, (bad, r.status, r.text)
    assert "invalid snapshot name" in r.json()["message"], r.text
    with pytest.raises(SandboxException) as ei:
        kit.snapshot(src, name=bad)
    assert ei.value.status_code == 400, ei.value
    assert "invalid snapshot name" in str(ei.value)
    # Nothing was made, and the sandbox is as it was.
    assert listed(src.list_snapshots()) == []
    assert src.get_info().state == SandboxState.RUNNING
    assert src.commands.run("echo ok").stdout == "ok\n"


def test_a_second_snapshot_under_a_name_takes_it_over(kit, husk):
    team = unique("snaptake")
    key = husk.create_key(team)
    o = husk.opts(api_key=key)
    name = unique("app")
    a = kit.create(key=key)
    a.files.write("/home/user/which", "a")
    b = kit.create(key=key)
    b.files.write("/home/user/which", "b")

    first = kit.snapshot(a, name=name)
    from_first = kit.create(name, key=key)
    assert from_first.files.read("/home/user/which") == "a"

    second = kit.snapshot(b, name=name)
    assert second.snapshot_id == first.snapshot_id == f"{team}/{name}:default"
    # One live snapshot of that name: the second.
    assert listed(Sandbox.list_snapshots(**o)) == [second.snapshot_id]
    assert listed(Sandbox.list_snapshots(name=name, **o)) == [second.snapshot_id]
    assert listed(a.list_snapshots()) == []
    assert listed(b.list_snapshots()) == [second.snapshot_id]
    for ref in (name, second.snapshot_id, f"{team}/{name}"):
        assert kit.create(ref, key=key).files.read("/home/user/which") == "b", ref

    # A sandbox made from the first goes on, and can be snapshotted and forked.
    assert from_first.files.read("/home/user/which") == "a"
    from_first.files.write("/home/user/more", "more")
    child = kit.snapshot(from_first)
    c = kit.create(child.snapshot_id, key=key)
    assert c.files.read("/home/user/which") == "a" and c.files.read("/home/user/more") == "more"
    [fork] = kit.fork(from_first)
    assert isinstance(fork, Sandbox), fork
    assert fork.files.read("/home/user/which") == "a"


def test_snapshots_of_sandboxes_from_snapshots_stack(kit, husk):
    a = kit.create()
    a.files.write("/home/user/g1.txt", "one")
    a.files.write("/home/user/shared.txt", "v1")
    a.files.write("/home/user/doomed.txt", "doomed")
    a.commands.run("mkdir -p /tmp/d && printf old > /tmp/d/old")
    a.commands.run("printf g1 > /etc/gen.conf", user="root")
    s1 = kit.snapshot(a)

    b = kit.create(s1.snapshot_id)
    b.files.write("/home/user/g2.txt", "two")
    b.files.write("/home/user/shared.txt", "v2")
    b.files.remove("/home/user/doomed.txt")
    b.commands.run("rm -rf /tmp/d && mkdir /tmp/d && printf new > /tmp/d/new")
    b.commands.run("printf g2 > /etc/gen.conf", user="root")
    s2 = kit.snapshot(b)

    c = kit.create(s2.snapshot_id)
    c.files.write("/home/user/g3.txt", "three")
    c.files.write("/home/user/shared.txt", "v3")
    c.files.remove("/home/user/g1.txt")
    c.commands.run("printf g3 > /etc/gen.conf", user="root")
    s3 = kit.snapshot(c)

    def check(s: Sandbox):
        assert s.files.exists("/home/user/g1.txt") is False
        assert s.files.read("/home/user/g2.txt") == "two"
        assert s.files.read("/home/user/g3.txt") == "three"
        assert s.files.read("/home/user/shared.txt") == "v3"
        assert s.files.exists("/home/user/doomed.txt") is False
        assert [e.name for e in s.files.list("/tmp/d")] == ["new"]
        assert s.files.read("/etc/gen.conf") == "g3"

    check(kit.create(s3.snapshot_id))
    # The lower ones are as they were.
    s2_again = kit.create(s2.snapshot_id)
    assert s2_again.files.read("/home/user/g1.txt") == "one"
    assert s2_again.files.exists("/home/user/g3.txt") is False
    assert s2_again.files.read("/home/user/shared.txt") == "v2"
    s1_again = kit.create(s1.snapshot_id)
    assert s1_again.files.read("/home/user/doomed.txt") == "doomed"
    assert s1_again.files.read("/tmp/d/old") == "old"
    assert s1_again.files.exists("/home/user/g2.txt") is False

    # Deleting the snapshots below takes nothing from the one on top.
    assert Sandbox.delete_snapshot(s1.snapshot_id, **husk.opts()) is True
    assert Sandbox.delete_snapshot(s2.snapshot_id, **husk.opts()) is True
    check(kit.create(s3.snapshot_id))
    for gone in (s1.snapshot_id, s2.snapshot_id):
        with pytest.raises(SandboxException) as ei:
            kit.create(gone)
        assert ei.value.status_code == 404, (gone, ei.value)
    # Their sandboxes go on.
    assert s1_again.files.read("/home/user/g1.txt") == "one"
    assert s2_again.files.read("/home/user/g2.txt") == "two"


@pytest.mark.timeout(120)
def test_a_stack_as_deep_as_husk_allows(kit, husk):
    """MAX_STACK snapshots, each of a sandbox made from the one before: the deepest holds every
    level's file; a snapshot (or fork) one deeper is refused with a 4xx that says why; the
    deepest sandbox still pauses to disk and resumes."""
    sbx = kit.create()
    infos = []
    for level in range(1, MAX_STACK + 1):
        sbx.files.write(f"/home/user/level{level}", str(level))
        infos.append(kit.snapshot(sbx))
        sbx = kit.create(infos[-1].snapshot_id)
    r = sbx.commands.run(f"cat {' '.join(f'/home/user/level{i}' for i in range(1, MAX_STACK + 1))}")
    assert r.stdout == "".join(str(i) for i in range(1, MAX_STACK + 1)), r.stdout

    for path, body in [(f"/sandboxes/{sbx.sandbox_id}/snapshots", {}), (f"/sandboxes/{sbx.sandbox_id}/fork", {"count": 1})]:
        r = post(husk, path, body)
        if r.status == 201:  # a snapshot or forks made anyway must not outlive the test
            made = r.json()
            for item in made if isinstance(made, list) else []:
                if "sandbox" in item:
                    kit.track(item["sandbox"]["sandboxID"])
            if isinstance(made, dict):
                kit.track_snapshot(made["snapshotID"])
        assert 400 <= r.status < 500, (path, r.status, r.text)
        assert "stands on" in r.json()["message"], r.text
    assert sbx.pause(mode="filesystem") is True
    Sandbox.connect(sbx.sandbox_id, **husk.opts())
    assert sbx.files.read(f"/home/user/level{MAX_STACK}") == str(MAX_STACK)
    assert sbx.files.read("/home/user/level1") == "1"


# --------------------------------------------------------------------------------------------
# Listing


def test_list_snapshots_filters_orders_and_pages(kit, husk):
    team = unique("snaplist")
    key = husk.create_key(team)
    o = husk.opts(api_key=key)
    a = kit.create(key=key)
    b = kit.create(key=key)
    assert listed(Sandbox.list_snapshots(**o)) == []
    n = unique("app")
    made = [
        kit.snapshot(a),
        kit.snapshot(a, name=f"{n}:v1"),
        kit.snapshot(b, name=f"{n}:v2"),
        kit.snapshot(b),
        kit.snapshot(a, name=unique("other")),
    ]
    ids = [m.snapshot_id for m in made]
    newest_first = ids[::-1]

    got = listed_infos(Sandbox.list_snapshots(**o))
    assert [s.snapshot_id for s in got] == newest_first
    assert [s.names for s in got] == [m.names for m in made[::-1]]

    # By sandbox (the instance call, and the static one).
    assert listed(a.list_snapshots()) == [ids[4], ids[1], ids[0]]
    assert listed(Sandbox.list_snapshots(sandbox_id=b.sandbox_id, **o)) == [ids[3], ids[2]]
    assert listed(Sandbox.list_snapshots(sandbox_id=UNKNOWN_ID, **o)) == []
    # By name: without a tag, every tag; team-qualified; with a tag, that one; by id.
    for name, expected in [
        (n, [ids[2], ids[1]]),
        (f"{team}/{n}", [ids[2], ids[1]]),
        (f"{n}:v1", [ids[1]]),
        (f"{team}/{n}:v2", [ids[2]]),
        (f"{n}:v3", []),
        (own_id(made[0]), [ids[0]]),
        (ids[0], [ids[0]]),
        (own_id(made[3]), [ids[3]]),
        ("nosuch", []),
        (f"someoneelse/{n}", []),
    ]:
        assert listed(Sandbox.list_snapshots(name=name, **o)) == expected, name
    # Both filters.
    assert listed(Sandbox.list_snapshots(sandbox_id=a.sandbox_id, name=n, **o)) == [ids[1]]
    assert listed(a.list_snapshots(name=n)) == [ids[1]]
    assert listed(b.list_snapshots(name=f"{n}:v1")) == []

    # Pages.
    p = Sandbox.list_snapshots(limit=2, **o)
    pages = []
    while p.has_next:
        pages.append([s.snapshot_id for s in p.next_items()])
    assert pages == [newest_first[0:2], newest_first[2:4], newest_first[4:]]
    p = Sandbox.list_snapshots(limit=2, **o)
    assert [s.snapshot_id for s in p.next_items()] == newest_first[:2]
    assert p.has_next and p.next_token
    rest = Sandbox.list_snapshots(limit=3, next_token=p.next_token, **o)
    assert [s.snapshot_id for s in rest.next_items()] == newest_first[2:]
    assert rest.has_next is False
    # Pages of a filtered list.
    p = a.list_snapshots(limit=1)
    pages = []
    while p.has_next:
        pages.append([s.snapshot_id for s in p.next_items()])
    assert pages == [[ids[4]], [ids[1]], [ids[0]]]

    # Raw: the header, the body's shape, bad limits.
    r = get(husk, "/snapshots?limit=1", key)
    assert r.status == 200, r.text
    assert r.json() == [{"snapshotID": ids[4], "names": made[4].names}], r.text
    assert r.headers.get("x-next-token"), r.headers
    r2 = get(husk, f"/snapshots?limit=10&nextToken={urllib.parse.quote(r.headers['x-next-token'])}", key)
    assert [s["snapshotID"] for s in r2.json()] == newest_first[1:], r2.text
    assert "x-next-token" not in r2.headers
    for bad in ("0", "101", "-1", "x"):
        r = get(husk, f"/snapshots?limit={bad}", key)
        assert r.status == 400, (bad, r.status, r.text)
        assert r.json()["message"], r.text

    # Deleted snapshots leave the list; a fork's snapshot is never in it.
    assert Sandbox.delete_snapshot(ids[3], **o) is True
    [fork] = kit.fork(a)
    assert isinstance(fork, Sandbox), fork
    assert listed(Sandbox.list_snapshots(**o)) == [ids[4], ids[2], ids[1], ids[0]]
    assert listed(a.list_snapshots()) == [ids[4], ids[1], ids[0]]
    assert listed(Sandbox.list_snapshots(sandbox_id=fork.sandbox_id, **o)) == []


# --------------------------------------------------------------------------------------------
# Deleting


@pytest.mark.timeout(90)
def test_delete_snapshot_and_what_stands_on_it(kit, husk, other_key):
    team = unique("snapdel")
    key = husk.create_key(team)
    second_key = another_key_of(husk, team)
    assert second_key != key
    o = husk.opts(api_key=key)
    src = kit.create(key=key)
    src.files.write("/home/user/f", "snap")
    info = kit.snapshot(src)
    n = unique("named")
    named = kit.snapshot(src, name=n)
    tagged = kit.snapshot(src, name=f"{n}-2:t1")
    user = kit.create(info.snapshot_id, key=key)
    user.files.write("/home/user/mine", "user's")

    # Another team cannot delete it, nor learn it exists.
    assert Sandbox.delete_snapshot(info.snapshot_id, **husk.opts(api_key=other_key)) is False
    r = delete_raw(husk, info.snapshot_id, other_key)
    assert r.status == 404, (r.status, r.text)
    # Nor can anyone without a key.
    for k in (None, BAD_KEY):
        r = delete_raw(husk, info.snapshot_id, k)
        assert r.status == 401, (k, r.status, r.text)
    with pytest.raises(AuthenticationException):
        Sandbox.delete_snapshot(info.snapshot_id, **husk.opts(api_key=BAD_KEY))
    assert info.snapshot_id in listed(Sandbox.list_snapshots(**o))

    # Another key of the team deletes it (raw: 204, for the tagged one).
    assert Sandbox.delete_snapshot(info.snapshot_id, **husk.opts(api_key=second_key)) is True
    extra = kit.snapshot(src)
    r = delete_raw(husk, extra.snapshot_id, second_key)
    assert r.status == 204 and r.body == b"", (r.status, r.text)
    assert Sandbox.delete_snapshot(info.snapshot_id, **o) is False
    assert Sandbox.delete_snapshot(own_id(info), **o) is False
    r = delete_raw(husk, info.snapshot_id, key)
    assert r.status == 404, (r.status, r.text)
    assert Sandbox.delete_snapshot("nosuchsnapshot0000000:default", **o) is False
    assert listed(Sandbox.list_snapshots(**o)) == [tagged.snapshot_id, named.snapshot_id]
    for ref in (info.snapshot_id, own_id(info)):
        with pytest.raises(SandboxException) as ei:
            kit.create(ref, key=key)
        assert ei.value.status_code == 404, (ref, ei.value)

    # The sandbox made from it goes on: reads, writes, commands, pauses of both kinds.
    assert user.files.read("/home/user/f") == "snap"
    assert user.commands.run("cat /home/user/f /home/user/mine").stdout == "snapuser's"
    assert user.pause(mode="filesystem") is True
    assert Sandbox.get_info(user.sandbox_id, **o).state == SandboxState.PAUSED
    Sandbox.connect(user.sandbox_id, **o)
    assert user.files.read("/home/user/f") == "snap"
    assert user.files.read("/home/user/mine") == "user's"
    assert user.pause() is True
    Sandbox.connect(user.sandbox_id, **o)
    assert user.commands.run("cat /home/user/f /home/user/mine").stdout == "snapuser's"
    # A snapshot of it, and a fork of it, stand on the deleted one's files too.
    child = kit.snapshot(user)
    c = kit.create(child.snapshot_id, key=key)
    assert c.commands.run("cat /home/user/f /home/user/mine").stdout == "snapuser's"
    [fork] = kit.fork(user)
    assert isinstance(fork, Sandbox), fork
    assert fork.commands.run("cat /home/user/f /home/user/mine").stdout == "snapuser's"

    # Named ones, by name: `team/name` (no tag: `:default`) and a bare `name:tag`.
    assert Sandbox.delete_snapshot(f"{n}-2", **o) is False  # its tag is t1, not default
    assert Sandbox.delete_snapshot(f"{team}/{n}", **o) is True
    assert Sandbox.delete_snapshot(f"{n}-2:t1", **o) is True
    assert listed(Sandbox.list_snapshots(**o)) == [child.snapshot_id]
    with pytest.raises(SandboxException) as ei:
        kit.create(n, key=key)
    assert ei.value.status_code == 404, ei.value
    # The source was never touched.
    assert src.files.read("/home/user/f") == "snap"
    assert src.get_info().state == SandboxState.RUNNING


@pytest.mark.timeout(90)
def test_a_list_longer_than_a_page(kit, husk):
    """Without a limit, pages of 100 (E2B's default)."""
    team = unique("snapmany")
    key = husk.create_key(team)
    o = husk.opts(api_key=key)
    src = kit.create(key=key)
    ids = [kit.snapshot(src).snapshot_id for _ in range(101)]
    p = Sandbox.list_snapshots(**o)
    first = [s.snapshot_id for s in p.next_items()]
    assert first == ids[::-1][:100]
    assert p.has_next
    assert [s.snapshot_id for s in p.next_items()] == [ids[0]]
    assert p.has_next is False


def test_deleting_a_snapshot_while_sandboxes_are_created_from_it(kit, husk):
    """Each create racing the delete either fails with 404 or gives a sandbox with the
    snapshot's files, which it keeps (they are not removed from under it)."""
    src = kit.create()
    src.files.write("/home/user/race", "r")
    outcomes = []
    for round_ in range(5):
        info = kit.snapshot(src)
        results: Dict[str, object] = {}

        def create(i):
            try:
                results[f"c{i}"] = kit.create(info.snapshot_id)
            except Exception as e:  # noqa: BLE001 - checked below
                results[f"c{i}"] = e

        def delete():
            results["delete"] = Sandbox.delete_snapshot(info.snapshot_id, **husk.opts())

        threads = [threading.Thread(target=create, args=(i,)) for i in range(3)]
        threads.insert(round_ % 4, threading.Thread(target=delete))
        for t in threads:
            t.start()
        for t in threads:
            t.join(45)
        assert results["delete"] is True, results
        for i in range(3):
            got = results[f"c{i}"]
            if isinstance(got, Sandbox):
                assert got.files.read("/home/user/race") == "r"
                outcomes.append("made")
            else:
                assert isinstance(got, SandboxException) and got.status_code == 404, repr(got)
                outcomes.append("404")
    # Whatever was made still works once the deletes are done.
    for sbx_id, _ in kit.sandboxes[1:]:
        assert Sandbox.connect(sbx_id, **husk.opts()).files.read("/home/user/race") == "r"
    assert len(outcomes) == 15


# --------------------------------------------------------------------------------------------
# Forks


def test_fork_copies_files_envs_metadata_and_network(kit, husk):
    tag = unique("fork")
    network = {"allow_public_traffic": False, "mask_request_host": "${PORT}-forked.example.com"}
    src = kit.create(
        timeout=150,
        envs={"FORK_ENV": "from-source"},
        metadata={"suite": tag, "role": "source"},
        network=network,
    )
    prepare(src)
    marker = f"sleep {secrets.randbelow(900_000) + 100_000}"
    sleeper = src.commands.run(marker, background=True)
    ticks(src)
    src_info = src.get_info()

    forks = kit.fork(src, count=3)
    assert len(forks) == 3, forks
    assert all(isinstance(f, Sandbox) for f in forks), forks
    ids = {f.sandbox_id for f in forks}
    assert len(ids) == 3 and src.sandbox_id not in ids, ids
    # Their own credentials.
    tokens = {f._envd_access_token for f in forks}
    assert len(tokens) == 3 and None not in tokens and src._envd_access_token not in tokens
    traffic = {f.traffic_access_token for f in forks}
    assert len(traffic) == 3 and None not in traffic and src.traffic_access_token not in traffic

    # The source goes on, unchanged; its later changes reach no fork.
    assert src.get_info().state == SandboxState.RUNNING
    assert sleeper.pid in pids(src)
    assert_ticking(src)
    change_after(src)

    for f in forks:
        info = f.get_info()
        assert info.state == SandboxState.RUNNING
        assert info.metadata == {"suite": tag, "role": "source"}
        assert info.network == src_info.network, (info.network, src_info.network)
        assert info.network["allow_public_traffic"] is False
        assert info.network["mask_request_host"] == network["mask_request_host"]
        # The source's timeout.
        left = (info.end_at - now()).total_seconds()
        assert 135 <= left <= 155, left
        assert_files_at_snapshot(f)
        r = f.commands.run('echo "$FORK_ENV|$(whoami)|$(pwd)"')
        assert r.stdout == "from-source|user|/home/user\n", r.stdout

    # Forks are independent of each other and of the source.
    forks[0].files.write("/home/user/keep.txt", "fork 0's")
    assert forks[1].files.read("/home/user/keep.txt") == "kept"
    assert src.files.read("/home/user/keep.txt") == "kept"

    # The team lists them, with the source's metadata; no snapshot of the fork is listed.
    q = SandboxQuery(metadata={"suite": tag})
    assert set(sandbox_ids(Sandbox.list(query=q, **husk.opts()))) == ids | {src.sandbox_id}
    assert listed(src.list_snapshots()) == []

    # Private like the source: a fork's port opens with its own traffic token only.
    f = forks[1]
    f.files.write("/tmp/www/hello.txt", "from the fork\n")
    f.commands.run(f"python3 -m http.server {WEB_PORT} --bind 0.0.0.0 --directory /tmp/www", background=True)
    host = f.get_host(WEB_PORT)

    def via(token):
        headers = {"Host": host}
        if token:
            headers["E2B-Traffic-Access-Token"] = token
        return http_request(husk.port, "GET", "/hello.txt", headers)

    def served():
        r = via(f.traffic_access_token)
        return r if r.status == 200 else None

    assert wait_for(served, 30, "the fork's web server").body == b"from the fork\n"
    for token in (None, src.traffic_access_token, forks[0].traffic_access_token):
        r = via(token)
        assert r.status == 403, (token, r.status, r.text)
    # And its envd takes its own token, not the source's.
    r = http_request(
        husk.port, "GET", "/files?path=/home/user/keep.txt",
        {"E2b-Sandbox-Id": f.sandbox_id, "E2b-Sandbox-Port": "49983", "X-Access-Token": src._envd_access_token},
    )
    assert r.status == 401, (r.status, r.text)


def test_fork_timeouts_the_static_call_and_forks_of_forks(kit, husk):
    lifecycle = {"on_timeout": "pause", "auto_resume": True}
    src = kit.create(timeout=100, lifecycle=lifecycle)
    src.files.write("/home/user/gen", "0")
    # The wire format: 201, one {"sandbox": ...} per fork, shaped as a create's answer.
    r = post(husk, f"/sandboxes/{src.sandbox_id}/fork", {"count": 2, "timeout": 60})
    items = r.json() if r.status == 201 else []
    for item in items:
        if "sandbox" in item:
            kit.track(item["sandbox"]["sandboxID"])
    assert r.status == 201, (r.status, r.text)
    created = post(husk, "/v2/sandboxes", {"templateID": "base", "timeout": 30})
    assert created.status == 201, created.text
    kit.track(created.json()["sandboxID"])
    assert len(items) == 2 and all(set(i) == {"sandbox"} for i in items), items
    for item in items:
        sb = item["sandbox"]
        assert set(sb) == set(created.json()), (sb, created.json())
        assert sb["sandboxID"] != src.sandbox_id and sb["envdAccessToken"] and sb["templateID"] == "base", sb
        assert Sandbox.get_info(sb["sandboxID"], **husk.opts()).lifecycle == lifecycle
    # No body at all: one fork.
    r = post(husk, f"/sandboxes/{src.sandbox_id}/fork", b"")
    items = r.json() if r.status == 201 else []
    for item in items:
        if "sandbox" in item:
            kit.track(item["sandbox"]["sandboxID"])
    assert r.status == 201 and len(items) == 1 and "sandbox" in items[0], (r.status, r.text)
    forks = kit.adopt(Sandbox.fork(src.sandbox_id, timeout=200, count=2, **husk.opts()))
    assert len(forks) == 2 and all(isinstance(f, Sandbox) for f in forks), forks
    for f in forks:
        left = (f.get_info().end_at - now()).total_seconds()
        assert 185 <= left <= 205, left
        assert f.files.read("/home/user/gen") == "0"
    # Count omitted: one, with the source's timeout.
    one = kit.fork(src)
    assert len(one) == 1 and isinstance(one[0], Sandbox), one
    left = (one[0].get_info().end_at - now()).total_seconds()
    assert 85 <= left <= 105, left
    # The source's own timeout is untouched.
    left = (src.get_info().end_at - now()).total_seconds()
    assert left <= 100, left

    # A fork forks and snapshots like any sandbox.
    forks[0].files.write("/home/user/gen", "1")
    [grandchild] = kit.fork(forks[0])
    assert isinstance(grandchild, Sandbox), grandchild
    assert grandchild.files.read("/home/user/gen") == "1"
    info = kit.snapshot(forks[0])
    assert kit.create(info.snapshot_id).files.read("/home/user/gen") == "1"
    # So does a sandbox made from a snapshot, named or not.
    named = kit.snapshot(grandchild, name=unique("gc"))
    from_named = kit.create(named.snapshot_id)
    from_named.files.write("/home/user/gen", "2")
    [f2] = kit.fork(from_named, count=1)
    assert isinstance(f2, Sandbox), f2
    assert f2.files.read("/home/user/gen") == "2"
    assert src.files.read("/home/user/gen") == "0"


def test_a_fork_of_twenty(kit, husk):
    """The most forks one call starts (20), at once, each a whole copy."""
    src = kit.create()
    src.files.write("/home/user/n", "twenty")
    forks = kit.fork(src, count=20)
    assert len(forks) == 20 and all(isinstance(f, Sandbox) for f in forks), [repr(f) for f in forks if not isinstance(f, Sandbox)]
    assert len({f.sandbox_id for f in forks}) == 20
    results = {}

    def read(f):
        results[f.sandbox_id] = f.files.read("/home/user/n")

    threads = [threading.Thread(target=read, args=(f,)) for f in forks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == {f.sandbox_id: "twenty" for f in forks}


WRITER = """
import os
pad = b"." * 200_000
os.makedirs("/home/user/lock", exist_ok=True)
i = 0
while True:
    i += 1
    for f in range(10):
        with open(f"/home/user/lock/t{f}", "wb") as out:
            out.write(b"%d\\n" % i + pad)
        os.replace(f"/home/user/lock/t{f}", f"/home/user/lock/{f}")
    if i == 1:
        open("/home/user/lock/started", "w").close()
"""
READ = """
import os
out = []
for f in range(10):
    data = open(f"/home/user/lock/{f}", "rb").read()
    head, _, pad = data.partition(b"\\n")
    assert pad == b"." * 200_000, (f, len(pad))
    out.append(head.decode())
print(" ".join(out))
"""


def test_the_source_is_frozen_for_the_copy(kit):
    """A loop rewrites ten files of 200 kB in turn (each by an atomic rename) with its round
    number: in a copy taken while it runs, every file is whole, and the numbers never rise
    from the first file to the last and differ by one at most (a copy made while the loop ran
    on would show later rounds in files copied later)."""
    src = kit.create()
    src.files.write("/tmp/writer.py", WRITER)
    src.files.write("/tmp/read.py", READ)
    src.commands.run("python3 /tmp/writer.py", background=True)
    wait_for(lambda: src.files.exists("/home/user/lock/started"), 20, "the writer to go round once")
    seen = []
    for _ in range(4):
        info = kit.snapshot(src)
        copy = kit.create(info.snapshot_id)
        values = [int(v) for v in copy.commands.run("python3 /tmp/read.py").stdout.split()]
        assert len(values) == 10, values
        assert all(a >= b for a, b in zip(values, values[1:])), values
        assert values[0] - values[-1] <= 1, values
        seen.append(values[0])
        copy.kill()
    # And the loop went on between the snapshots.
    assert seen == sorted(seen) and seen[-1] > seen[0], seen


def test_volumes_stay_out_of_snapshots_and_forks_share_them(kit, husk):
    """A volume is not part of a snapshot (a sandbox from it has the mount point, empty); a
    fork mounts the source's volumes as the source does (the same files, live)."""
    api = dict(api_url=husk.url, api_key=husk.admin_key, request_timeout=30)
    vol = Volume.create(unique("snapvol"), **api)
    try:
        src = kit.create(volume_mounts={"/mnt/w": f"{vol.name}:rw", "/mnt/r": vol.name})
        mounts = src.get_info().volume_mounts
        src.files.write("/mnt/w/in-volume", "vol")
        src.files.write("/home/user/in-root", "root")
        info = kit.snapshot(src)
        copy = kit.create(info.snapshot_id)
        assert copy.files.read("/home/user/in-root") == "root"
        assert copy.files.exists("/mnt/w/in-volume") is False
        assert copy.get_info().volume_mounts == []
        [fork] = kit.fork(src)
        assert isinstance(fork, Sandbox), fork
        assert fork.get_info().volume_mounts == mounts
        assert fork.files.read("/mnt/r/in-volume") == "vol"
        r = fork.commands.run("touch /mnt/r/nope 2>&1 || echo refused; echo from-fork > /mnt/w/from-fork")
        assert "Read-only file system" in r.stdout and "refused" in r.stdout, r.stdout
        assert src.files.read("/mnt/w/from-fork") == "from-fork\n"
        assert vol.read_file("/from-fork") == "from-fork\n"
    finally:
        kit.close()
        Volume.destroy(vol.volume_id, **api)


def test_fork_errors(kit, husk, other_key):
    tag = unique("forkerr")
    src = kit.create(metadata={"suite": tag})
    o = husk.opts()
    q = SandboxQuery(metadata={"suite": tag})

    # The SDK refuses counts out of range before sending anything ...
    for bad in (0, 21, -1):
        with pytest.raises(InvalidArgumentException):
            kit.fork(src, count=bad)
    # ... and the server answers 400 to them, and to other malformed bodies.
    path = f"/sandboxes/{src.sandbox_id}/fork"
    for body in ({"count": 0}, {"count": 21}, {"count": -3}, {"count": "2"}, {"count": 1.5},
                 {"timeout": -1}, {"timeout": "x"}, b"{not json", b"[1]", b'"fork"'):
        r = post(husk, path, body)
        assert r.status == 400, (body, r.status, r.text)
        assert r.json()["message"], r.text
    # Unknown, another team's, killed: not found.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(UNKNOWN_ID, **o)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(src.sandbox_id, **husk.opts(api_key=other_key))
    r = post(husk, path, {"count": 1}, other_key)
    assert r.status == 404, (r.status, r.text)
    gone = kit.create()
    assert gone.kill() is True
    with pytest.raises(SandboxNotFoundException):
        gone.fork()
    # No key, a bad key.
    for k in (None, BAD_KEY):
        r = post(husk, path, {"count": 1}, k)
        assert r.status == 401, (k, r.status, r.text)
    with pytest.raises(AuthenticationException):
        Sandbox.fork(src.sandbox_id, **husk.opts(api_key=BAD_KEY))
    # Paused, either way: 409.
    for mode in ("full", "filesystem"):
        assert src.pause(mode=mode) is True
        with pytest.raises(SandboxException) as ei:
            src.fork()
        assert ei.value.status_code == 409, (mode, ei.value)
        r = post(husk, path, {"count": 2})
        assert r.status == 409, (mode, r.status, r.text)
        assert Sandbox.get_info(src.sandbox_id, **o).state == SandboxState.PAUSED
        Sandbox.connect(src.sandbox_id, **o)

    # None of that started a sandbox; the source forks fine now.
    assert set(sandbox_ids(Sandbox.list(query=q, **o))) == {src.sandbox_id}
    forks = kit.fork(src, count=2)
    assert all(isinstance(f, Sandbox) for f in forks), forks
    assert set(sandbox_ids(Sandbox.list(query=q, **o))) == {src.sandbox_id} | {f.sandbox_id for f in forks}


# --------------------------------------------------------------------------------------------
# Errors of create_snapshot, tenancy, no key, malformed bodies


def test_create_snapshot_errors(kit, husk, other_key):
    src = kit.create()
    o = husk.opts()
    path = f"/sandboxes/{src.sandbox_id}/snapshots"
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(UNKNOWN_ID, **o)
    gone = kit.create()
    assert gone.kill() is True
    with pytest.raises(SandboxNotFoundException):
        kit.snapshot(gone)
    # Another team's sandbox.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(src.sandbox_id, **husk.opts(api_key=other_key))
    r = post(husk, path, {}, other_key)
    assert r.status == 404, (r.status, r.text)
    # No key, a bad key.
    for k in (None, BAD_KEY):
        r = post(husk, path, {}, k)
        assert r.status == 401, (k, r.status, r.text)
    with pytest.raises(AuthenticationException):
        Sandbox.create_snapshot(src.sandbox_id, **husk.opts(api_key=BAD_KEY))
    # Paused, either way: 409, from the instance, the static call and raw.
    for mode in ("full", "filesystem"):
        assert src.pause(mode=mode) is True
        with pytest.raises(SandboxException) as ei:
            kit.snapshot(src, name=unique("paused"))
        assert ei.value.status_code == 409, (mode, ei.value)
        assert "paused" in str(ei.value)
        with pytest.raises(SandboxException) as ei:
            Sandbox.create_snapshot(src.sandbox_id, **o)
        assert ei.value.status_code == 409, (mode, ei.value)
        r = post(husk, path, {"name": unique("paused")})
        assert r.status == 409, (mode, r.status, r.text)
        assert Sandbox.get_info(src.sandbox_id, **o).state == SandboxState.PAUSED
        Sandbox.connect(src.sandbox_id, **o)
    # Nothing was made; once running, it snapshots.
    assert listed(src.list_snapshots()) == []
    src.files.write("/home/user/x", "x")
    info = kit.snapshot(src)
    assert kit.create(info.snapshot_id).files.read("/home/user/x") == "x"


def test_another_team_sees_and_uses_none_of_the_snapshots(kit, husk):
    team_a, team_b = unique("snapa"), unique("snapb")
    key_a, key_b = husk.create_key(team_a), husk.create_key(team_b)
    oa, ob = husk.opts(api_key=key_a), husk.opts(api_key=key_b)
    n = unique("shared")
    mine = kit.create(key=key_a)
    mine.files.write("/home/user/which", "a")
    a_named = kit.snapshot(mine, name=n)
    a_anon = kit.snapshot(mine)
    theirs = kit.create(key=key_b)
    theirs.files.write("/home/user/which", "b")
    b_named = kit.snapshot(theirs, name=n)
    assert b_named.snapshot_id == f"{team_b}/{n}:default"

    # The same bare name is each team's own.
    assert kit.create(n, key=key_a).files.read("/home/user/which") == "a"
    assert kit.create(n, key=key_b).files.read("/home/user/which") == "b"
    # Team B can use none of team A's, by any name.
    for ref in (a_named.snapshot_id, f"{team_a}/{n}", a_anon.snapshot_id, own_id(a_anon)):
        with pytest.raises(SandboxException) as ei:
            kit.create(ref, key=key_b)
        assert ei.value.status_code == 404, (ref, ei.value)
    # Lists: each its own; no filter reaches the other's.
    assert listed(Sandbox.list_snapshots(**oa)) == [a_anon.snapshot_id, a_named.snapshot_id]
    assert listed(Sandbox.list_snapshots(**ob)) == [b_named.snapshot_id]
    for kw in ({"sandbox_id": mine.sandbox_id}, {"name": own_id(a_anon)}, {"name": f"{team_a}/{n}"},
               {"name": a_anon.snapshot_id}):
        assert listed(Sandbox.list_snapshots(**kw, **ob)) == [], kw
    assert listed(Sandbox.list_snapshots(name=n, **ob)) == [b_named.snapshot_id]
    r = get(husk, f"/snapshots?sandboxID={mine.sandbox_id}", key_b)
    assert r.status == 200 and r.json() == [], r.text
    # Nor snapshot, fork or delete.
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(mine.sandbox_id, **ob)
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(mine.sandbox_id, **ob)
    for ref in (a_anon.snapshot_id, own_id(a_anon), a_named.snapshot_id, f"{team_a}/{n}"):
        assert Sandbox.delete_snapshot(ref, **ob) is False, ref
    # Everything of team A is as it was.
    assert listed(Sandbox.list_snapshots(**oa)) == [a_anon.snapshot_id, a_named.snapshot_id]
    assert kit.create(a_anon.snapshot_id, key=key_a).files.read("/home/user/which") == "a"


def test_without_a_valid_key_nothing_is_said_or_done(kit, husk):
    tag = unique("nokey")
    src = kit.create(metadata={"suite": tag})
    info = kit.snapshot(src)
    bad = husk.opts(api_key=BAD_KEY)
    for method, path, body in [
        ("POST", f"/sandboxes/{src.sandbox_id}/snapshots", b"{}"),
        ("POST", f"/sandboxes/{UNKNOWN_ID}/snapshots", b"{}"),
        ("GET", "/snapshots", None),
        ("GET", f"/snapshots?sandboxID={src.sandbox_id}", None),
        ("POST", f"/sandboxes/{src.sandbox_id}/fork", b'{"count": 2}'),
        ("POST", f"/sandboxes/{UNKNOWN_ID}/fork", b"{}"),
        ("DELETE", f"/templates/{urllib.parse.quote(info.snapshot_id, safe='')}", None),
        ("DELETE", "/templates/nosuch", None),
    ]:
        for headers in ({}, {"X-API-KEY": BAD_KEY}):
            r = http_request(husk.port, method, path, headers, body)
            assert r.status == 401, (method, path, headers, r.status, r.text)
    with pytest.raises(AuthenticationException):
        Sandbox.list_snapshots(**bad).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.create(info.snapshot_id, **bad)
    # Nothing changed.
    assert listed(src.list_snapshots()) == [info.snapshot_id]
    assert set(sandbox_ids(Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), **husk.opts()))) == {src.sandbox_id}
    assert kit.create(info.snapshot_id).get_info().state == SandboxState.RUNNING


def test_malformed_bodies_are_400_and_change_nothing(kit, husk):
    tag = unique("malformed")
    src = kit.create(metadata={"suite": tag})
    path = f"/sandboxes/{src.sandbox_id}/snapshots"
    for body in (b"{not json", b'{"name": 5}', b'{"name": ["web"]}', b'{"name": {"a": 1}}',
                 b'{"memory": "yes"}', b'{"memory": 1}', b"[]", b'"web"', b"null{"):
        r = post(husk, path, body)
        assert r.status == 400, (body, r.status, r.text)
        assert r.json()["message"], r.text
    # A body over husk's 1 MiB limit (under the point where the server stops reading).
    r = post(husk, path, b'{"name": "' + b"a" * ((1 << 20) + 16) + b'"}')
    assert r.status == 413, (r.status, r.text[:200])
    assert listed(src.list_snapshots()) == []
    assert set(sandbox_ids(Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), **husk.opts()))) == {src.sandbox_id}
    # The server and the sandbox are fine.
    src.files.write("/home/user/ok", "ok")
    info = kit.snapshot(src)
    assert kit.create(info.snapshot_id).files.read("/home/user/ok") == "ok"
    [f] = kit.fork(src)
    assert isinstance(f, Sandbox) and f.files.read("/home/user/ok") == "ok"


def test_concurrent_snapshots_forks_and_a_pause(kit, husk):
    """Snapshots and forks of one sandbox at once all succeed, each a whole copy; a pause
    racing a snapshot leaves one of two clean outcomes (201, or 409 once paused)."""
    src = kit.create()
    src.files.write("/home/user/c", "c")
    results: Dict[str, object] = {}

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # noqa: BLE001 - recorded and checked below
            results[name] = e

    threads = [threading.Thread(target=run, args=(f"snap{i}", lambda: src.create_snapshot())) for i in range(4)]
    threads += [threading.Thread(target=run, args=(f"fork{i}", lambda: src.fork(count=2))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
    assert not any(t.is_alive() for t in threads)
    # Record everything for cleanup before asserting.
    for k, v in results.items():
        if k.startswith("snap") and not isinstance(v, Exception):
            kit.track_snapshot(v.snapshot_id)
        if k.startswith("fork") and isinstance(v, list):
            kit.adopt(v)
    assert all(not isinstance(v, Exception) for v in results.values()), results
    snaps = {results[f"snap{i}"].snapshot_id for i in range(4)}
    assert len(snaps) == 4
    forks = [f for i in range(2) for f in results[f"fork{i}"]]
    assert len(forks) == 4 and all(isinstance(f, Sandbox) for f in forks), forks
    for s in snaps:
        assert kit.create(s).files.read("/home/user/c") == "c"
    for f in forks:
        assert f.files.read("/home/user/c") == "c"
    assert set(listed(src.list_snapshots())) == snaps

    # Six at once under one name: all taken, one left under the name.
    results.clear()
    name = unique("same")
    threads = [threading.Thread(target=run, args=(f"named{i}", lambda: src.create_snapshot(name=name))) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
    for v in results.values():
        if not isinstance(v, Exception):
            kit.track_snapshot(v.snapshot_id)
    assert all(not isinstance(v, Exception) for v in results.values()), results
    assert len(results) == 6
    # (Every one of them is called `team/name:default`.)
    assert {v.snapshot_id for v in results.values()} == {results["named0"].snapshot_id}
    assert listed(Sandbox.list_snapshots(name=name, **husk.opts())) == [results["named0"].snapshot_id]
    assert kit.create(name).files.read("/home/user/c") == "c"

    # A pause racing a snapshot.
    results.clear()
    threads = [
        threading.Thread(target=run, args=("pause", lambda: src.pause())),
        threading.Thread(target=run, args=("snap", lambda: src.create_snapshot())),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(45)
    snap = results["snap"]
    if not isinstance(snap, Exception):
        kit.track_snapshot(snap.snapshot_id)
    assert results["pause"] is True, results
    if isinstance(snap, Exception):
        assert isinstance(snap, SandboxException) and snap.status_code == 409, repr(snap)
    else:
        assert kit.create(snap.snapshot_id).files.read("/home/user/c") == "c"
    assert Sandbox.get_info(src.sandbox_id, **husk.opts()).state == SandboxState.PAUSED
    Sandbox.connect(src.sandbox_id, **husk.opts())
    assert src.files.read("/home/user/c") == "c"


def test_husk_cli_snapshots_and_forks(kit, husk):
    src = kit.create()
    src.files.write("/home/user/cli", "cli")
    name = unique("cli")

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(husk.bin), "sandbox", *args, "--server", husk.url, "--state-dir", str(husk.state_dir)],
            capture_output=True, text=True, timeout=60,
        )

    r = cli("snapshot", src.sandbox_id, "--name", name)
    assert r.returncode == 0, r.stderr
    snapshot_id = r.stdout.strip()
    kit.track_snapshot(snapshot_id)
    assert snapshot_id.endswith(f"/{name}:default"), r.stdout
    assert listed(src.list_snapshots()) == [snapshot_id]
    assert kit.create(snapshot_id).files.read("/home/user/cli") == "cli"
    # `husk template list` shows it.
    t = subprocess.run([str(husk.bin), "template", "list", "--json", "--state-dir", str(husk.state_dir)],
                       capture_output=True, text=True, timeout=60)
    assert t.returncode == 0, t.stderr
    rows = [json.loads(line) for line in t.stdout.splitlines() if line.strip()]
    mine = [row for row in rows if row.get("name") == snapshot_id]
    assert len(mine) == 1 and mine[0]["kind"] == "snapshot" and mine[0]["source"] == src.sandbox_id, rows

    r = cli("fork", src.sandbox_id, "--count", "2", "--timeout", "90")
    forked = r.stdout.split()
    for sandbox_id in forked:
        kit.track(sandbox_id)
    assert r.returncode == 0, r.stderr
    assert len(forked) == 2, r.stdout
    for sandbox_id in forked:
        # (Before the connect, which extends a timeout to the SDK's default.)
        left = (Sandbox.get_info(sandbox_id, **husk.opts()).end_at - now()).total_seconds()
        assert 80 <= left <= 95, left
        f = Sandbox.connect(sandbox_id, **husk.opts())
        assert f.files.read("/home/user/cli") == "cli"

    assert src.pause() is True
    for args in (("snapshot", src.sandbox_id), ("fork", src.sandbox_id)):
        r = cli(*args)
        assert r.returncode != 0 and "paused" in r.stderr, (args, r.returncode, r.stdout, r.stderr)
    r = cli("snapshot", UNKNOWN_ID)
    assert r.returncode != 0 and r.stdout.strip() == "", (r.returncode, r.stdout, r.stderr)
    assert listed(src.list_snapshots()) == [snapshot_id]


# --------------------------------------------------------------------------------------------
# Servers of their own: quotas, a restart, cleanup


@pytest.mark.timeout(90)
def test_quotas_of_snapshots_and_of_sandboxes_for_forks():
    with own_server("--max-sandboxes", "3", "--max-snapshots", "2") as (server, k):
        o = server.opts()
        src = k.create(metadata={"q": "1"})
        src.files.write("/home/user/q", "q")

        # Room for two more sandboxes: of four forks, two start, two are refused with 429.
        forks = k.fork(src, count=4)
        assert len(forks) == 4, forks
        started = [f for f in forks if isinstance(f, Sandbox)]
        refused = [f for f in forks if not isinstance(f, Sandbox)]
        assert len(started) == 2, forks
        assert all(isinstance(e, RateLimitException) for e in refused), refused
        for f in started:
            assert f.files.read("/home/user/q") == "q"
        assert len(sandbox_ids(Sandbox.list(**o))) == 3
        # Full: every fork is refused, and nothing of it is kept.
        before = snapshot_dirs(server)
        forks = k.fork(src, count=2)
        assert len(forks) == 2 and all(isinstance(e, RateLimitException) for e in forks), forks
        r = post(server, f"/sandboxes/{src.sandbox_id}/fork", {"count": 1})
        assert r.status == 201, (r.status, r.text)
        [item] = r.json()
        assert set(item) == {"error"} and item["error"]["code"] == 429 and item["error"]["message"], item
        wait_for(lambda: snapshot_dirs(server) == before, 10, "the refused forks' snapshots to go")
        for f in started:
            assert f.kill() is True

        # Two snapshots; a third is refused with 429 (SDK and raw).
        name = "kept"
        first = k.snapshot(src, name=name)
        second = k.snapshot(src)
        with pytest.raises(RateLimitException):
            k.snapshot(src)
        r = post(server, f"/sandboxes/{src.sandbox_id}/snapshots", {"name": "third"})
        assert r.status == 429, (r.status, r.text)
        assert r.json()["message"], r.text
        assert listed(Sandbox.list_snapshots(**o)) == [second.snapshot_id, first.snapshot_id]
        # Taking a name over needs no new place; forks' snapshots are not counted.
        src.files.write("/home/user/q", "q2")
        again = k.snapshot(src, name=name)
        assert again.snapshot_id == first.snapshot_id
        assert k.create(name).files.read("/home/user/q") == "q2"
        [f] = k.fork(src)
        assert isinstance(f, Sandbox), f
        # Another team has places of its own.
        other = server.create_key("quota-other")
        theirs = k.create(key=other)
        t1 = k.snapshot(theirs)
        t2 = k.snapshot(theirs, name="x")
        assert len({t1.snapshot_id, t2.snapshot_id}) == 2
        # Deleting one frees its place.
        assert Sandbox.delete_snapshot(second.snapshot_id, **o) is True
        third = k.snapshot(src)
        assert listed(Sandbox.list_snapshots(**o)) == [third.snapshot_id, again.snapshot_id]


def test_the_snapshot_quota_holds_under_concurrent_requests():
    """With room for one more snapshot, of six requests at once one is taken and five are
    refused with 429."""
    with own_server("--max-snapshots", "2") as (server, k):
        o = server.opts()
        src = k.create()
        # Enough files that a copy takes a moment.
        src.commands.run("mkdir -p /home/user/many && cd /home/user/many && for i in $(seq 300); do echo $i > f$i; done")
        first = k.snapshot(src)
        results = []

        def take(body):
            r = post(server, f"/sandboxes/{src.sandbox_id}/snapshots", body)
            results.append(r)

        threads = [threading.Thread(target=take, args=({},)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(45)
        for r in results:
            if r.status == 201:
                k.track_snapshot(r.json()["snapshotID"])
        statuses = sorted(r.status for r in results)
        assert statuses == [201, 429, 429, 429, 429, 429], [(r.status, r.text) for r in results]
        assert len(listed(Sandbox.list_snapshots(**o))) == 2


@pytest.mark.timeout(150)
def test_snapshots_survive_a_restart_of_the_server():
    first = start_server()
    servers = [first]
    state_dir = first.state_dir
    made: List[Tuple[str, str]] = []  # snapshot ids to delete at the end
    try:
        o = first.opts()
        a = Sandbox.create(timeout=300, **o)
        a.files.write("/home/user/a", "a")
        named = a.create_snapshot(name="keep")
        anon = a.create_snapshot()
        # (Named, so its own id is not in its snapshot id: learnt from the files that appear.)
        known = set(snapshot_dirs(first))
        doomed = a.create_snapshot(name="doomed")
        [doomed_own_id] = set(snapshot_dirs(first)) - known
        made += [(named.snapshot_id, "live"), (anon.snapshot_id, "live")]
        # A sandbox paused to disk on a snapshot deleted since, one paused in place on a
        # snapshot, and a running one made from a snapshot and a fork (both die at the stop).
        on_deleted = Sandbox.create(doomed.snapshot_id, timeout=300, **o)
        on_deleted.files.write("/home/user/own", "own")
        assert on_deleted.pause(mode="filesystem") is True
        assert Sandbox.delete_snapshot(doomed.snapshot_id, **o) is True
        in_place = Sandbox.create(anon.snapshot_id, timeout=300, **o)
        in_place.files.write("/home/user/own", "in place")
        assert in_place.pause() is True
        running = Sandbox.create(named.snapshot_id, timeout=300, **o)
        [fork] = a.fork()
        assert isinstance(fork, Sandbox), fork
        before = listed_infos(Sandbox.list_snapshots(**o))
        assert [s.snapshot_id for s in before] == [anon.snapshot_id, named.snapshot_id]
        assert first.stop() == 0, first.log_tail()

        second = start_server(state_dir=state_dir)
        servers.append(second)
        o = second.opts()
        # The files of the two live snapshots and of the deleted one a paused sandbox stands
        # on; not those of the fork's, which nothing stands on since the stop.
        assert len(snapshot_dirs(second)) == 3, snapshot_dirs(second)
        assert own_id(anon) in snapshot_dirs(second) and doomed_own_id in snapshot_dirs(second)
        after = listed_infos(Sandbox.list_snapshots(**o))
        assert [(s.snapshot_id, s.names) for s in after] == [(s.snapshot_id, s.names) for s in before]
        assert listed(Sandbox.list_snapshots(sandbox_id=a.sandbox_id, **o)) == [anon.snapshot_id, named.snapshot_id]
        for ref in (named.snapshot_id, "keep", anon.snapshot_id, own_id(anon)):
            s = Sandbox.create(ref, timeout=60, **o)
            try:
                assert s.files.read("/home/user/a") == "a", ref
            finally:
                s.kill()
        with pytest.raises(SandboxException) as ei:
            Sandbox.create(doomed.snapshot_id, timeout=60, **o)
        assert ei.value.status_code == 404, ei.value
        # What ran is gone; what was paused comes back on its snapshot's files.
        for gone in (a.sandbox_id, running.sandbox_id, fork.sandbox_id):
            with pytest.raises(SandboxNotFoundException):
                Sandbox.connect(gone, **o)
        back = Sandbox.connect(on_deleted.sandbox_id, **o)
        assert back.files.read("/home/user/a") == "a"
        assert back.files.read("/home/user/own") == "own"
        back2 = Sandbox.connect(in_place.sandbox_id, **o)
        assert back2.files.read("/home/user/a") == "a"
        assert back2.files.read("/home/user/own") == "in place"
        # New snapshots stack on the old ones; then the server is killed outright.
        back.files.write("/home/user/b", "b")
        stacked = back.create_snapshot(name="stacked")
        made.append((stacked.snapshot_id, "live"))
        assert back.pause(mode="filesystem") is True
        second.proc.kill()
        second.proc.wait(timeout=30)

        third = start_server(state_dir=state_dir)
        servers.append(third)
        o = third.opts()
        assert listed(Sandbox.list_snapshots(**o)) == [stacked.snapshot_id, anon.snapshot_id, named.snapshot_id]
        s = Sandbox.create("stacked", timeout=60, **o)
        try:
            assert s.commands.run("cat /home/user/a /home/user/own /home/user/b").stdout == "aownb"
        finally:
            s.kill()
        again = Sandbox.connect(on_deleted.sandbox_id, **o)
        assert again.files.read("/home/user/b") == "b"

        # Everything killed and deleted: nothing is left of any snapshot.
        assert again.kill() is True
        Sandbox.kill(in_place.sandbox_id, **o)
        for snapshot_id, _ in made:
            assert Sandbox.delete_snapshot(snapshot_id, **o) is True, snapshot_id
        assert listed(Sandbox.list_snapshots(**o)) == []
        wait_for(lambda: snapshot_dirs(third) == [], 10, f"STATE_DIR/snapshots to empty (has {snapshot_dirs(third)})")
        assert paused_dirs(third) == []
    finally:
        for srv in servers[:-1]:
            try:
                srv.stop()
            except Exception:
                pass
        last = servers[-1]
        if last.proc.poll() is None:
            # Best effort, on a failure half-way: whatever is left goes with the state dir.
            try:
                for sandbox_id in sandbox_ids(Sandbox.list(**last.opts())):
                    Sandbox.kill(sandbox_id, **last.opts())
                for snapshot_id, _ in made:
                    Sandbox.delete_snapshot(snapshot_id, **last.opts())
            except Exception:
                pass
        last.close()


@pytest.mark.timeout(120)
def test_files_of_deleted_snapshots_stay_while_used_and_then_go():
    """A deleted snapshot's files stay while a sandbox (running, paused in place or to disk)
    or another snapshot stands on them, and go when the last does; once everything is
    killed and deleted, STATE_DIR/snapshots is empty."""
    with own_server() as (server, k):
        o = server.opts()

        def dirs():
            return set(snapshot_dirs(server))

        a = k.create()
        a.files.write("/home/user/g", "1")
        s1 = k.snapshot(a)
        id1 = own_id(s1)
        assert id1 in dirs()
        b = k.create(s1.snapshot_id)
        b.files.write("/home/user/g", "2")
        s2 = k.snapshot(b)
        id2 = own_id(s2)
        c = k.create(s2.snapshot_id)
        forks = k.fork(c, count=2)
        assert all(isinstance(f, Sandbox) for f in forks), forks
        # Named, then taken over while a sandbox stands on the first one.
        n1 = k.snapshot(a, name="n")
        d = k.create("n")
        n2 = k.snapshot(a, name="n")
        assert n2.snapshot_id == n1.snapshot_id
        assert len(dirs()) >= 5, dirs()  # s1, s2, the fork's, n (first), n (second)

        # s1 deleted: b stands on it, and s2 (live) over it.
        assert Sandbox.delete_snapshot(s1.snapshot_id, **o) is True
        assert b.kill() is True
        assert id1 in dirs() and id2 in dirs()
        # s2 deleted: c (paused to disk) and c's forks stand on it.
        assert c.pause(mode="filesystem") is True
        assert Sandbox.delete_snapshot(s2.snapshot_id, **o) is True
        assert {id1, id2} <= dirs()
        assert Sandbox.kill(c.sandbox_id, **o) is True
        assert {id1, id2} <= dirs()
        # A fork paused in place still stands on them; with the forks gone, they go.
        assert forks[0].pause() is True
        assert forks[1].kill() is True
        assert {id1, id2} <= dirs()
        assert forks[0].kill() is True
        wait_for(lambda: not ({id1, id2} & dirs()), 10, f"{id1} and {id2} to be removed (left: {dirs()})")

        # The taken-over name's first snapshot: kept while d stands on it.
        with_d = dirs()
        assert d.kill() is True
        wait_for(lambda: len(dirs()) == len(with_d) - 1, 10, f"the replaced snapshot to go (left: {dirs()})")
        # The rest: a's files are in n's second snapshot only.
        assert Sandbox.delete_snapshot("n", **o) is True
        assert a.kill() is True
        assert listed(Sandbox.list_snapshots(**o)) == []
        wait_for(lambda: dirs() == set(), 10, f"STATE_DIR/snapshots to empty (left: {dirs()})")
        assert paused_dirs(server) == []


@pytest.mark.timeout(90)
def test_after_a_crash_nothing_is_left_of_snapshots_no_one_stands_on():
    """The server is killed (SIGKILL) while forks and a sandbox on a deleted snapshot run:
    the next server has neither sandboxes nor snapshots, and so no snapshot files either."""
    first = start_server()
    servers = [first]
    try:
        o = first.opts()
        a = Sandbox.create(timeout=120, **o)
        a.files.write("/home/user/x", "x")
        forks = a.fork(count=2)
        assert all(isinstance(f, Sandbox) for f in forks), forks
        doomed = a.create_snapshot()
        on_doomed = Sandbox.create(doomed.snapshot_id, timeout=120, **o)
        assert Sandbox.delete_snapshot(doomed.snapshot_id, **o) is True
        assert on_doomed.files.read("/home/user/x") == "x"
        assert len(snapshot_dirs(first)) == 2, snapshot_dirs(first)  # the forks', the deleted one
        first.proc.kill()
        first.proc.wait(timeout=30)

        second = start_server(state_dir=first.state_dir)
        servers.append(second)
        o = second.opts()
        assert sandbox_ids(Sandbox.list(**o)) == {}
        assert listed(Sandbox.list_snapshots(**o)) == []
        wait_for(lambda: snapshot_dirs(second) == [], 10,
                 f"STATE_DIR/snapshots to empty (left: {snapshot_dirs(second)})")
    finally:
        for srv in servers[:-1]:
            try:
                srv.stop()
            except Exception:
                pass
        servers[-1].close()
