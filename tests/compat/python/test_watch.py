"""Directory watching with the stock sync SDK, which polls (CreateWatcher / GetWatcherEvents /
RemoveWatcher): creates, writes, removes, renames, recursion, entry info, errors."""

from __future__ import annotations

import pytest

from e2b import (
    FileNotFoundException,
    FilesystemEventType,
    InvalidArgumentException,
    SandboxException,
)

from husk_compat import wait_for


class Collector:
    def __init__(self, handle):
        self.handle = handle
        self.events = []

    def poll(self):
        self.events.extend(self.handle.get_new_events())
        return self.events

    def wait_event(self, name, types, timeout=15):
        types = set(types)

        def seen():
            self.poll()
            return [e for e in self.events if e.name == name and e.type in types]

        return wait_for(seen, timeout, f"event {sorted(t.value for t in types)} for {name!r}; got {self.events}")

    def names(self):
        return {e.name for e in self.events}


@pytest.fixture
def watch(sandbox):
    handles = []

    def start(path, **kwargs):
        h = sandbox.files.watch_dir(path, **kwargs)
        handles.append(h)
        return Collector(h)

    yield start
    for h in handles:
        try:
            h.stop()
        except Exception:
            pass


def test_watch_create_write_remove(sandbox, watch):
    sandbox.files.make_dir("/home/user/w")
    c = watch("/home/user/w")
    sandbox.files.write("/home/user/w/f.txt", "one")
    c.wait_event("f.txt", [FilesystemEventType.CREATE, FilesystemEventType.WRITE])
    sandbox.commands.run("echo more >> /home/user/w/f.txt")
    c.wait_event("f.txt", [FilesystemEventType.WRITE])
    sandbox.files.remove("/home/user/w/f.txt")
    c.wait_event("f.txt", [FilesystemEventType.REMOVE])


def test_watch_events_are_not_repeated(sandbox, watch):
    sandbox.files.make_dir("/tmp/w-once")
    c = watch("/tmp/w-once")
    sandbox.commands.run("touch /tmp/w-once/a")
    c.wait_event("a", [FilesystemEventType.CREATE])
    # A later poll returns only what happened since the previous one.
    sandbox.commands.run("touch /tmp/w-once/b")
    c.wait_event("b", [FilesystemEventType.CREATE])
    creates_of_a = [e for e in c.events if e.name == "a" and e.type == FilesystemEventType.CREATE]
    assert len(creates_of_a) == 1, c.events


def test_watch_rename_and_chmod(sandbox, watch):
    sandbox.files.make_dir("/tmp/w-ren")
    sandbox.files.write("/tmp/w-ren/old", "x")
    c = watch("/tmp/w-ren")
    sandbox.files.rename("/tmp/w-ren/old", "/tmp/w-ren/new")
    c.wait_event("old", [FilesystemEventType.RENAME])
    c.wait_event("new", [FilesystemEventType.CREATE, FilesystemEventType.RENAME])
    sandbox.commands.run("chmod 600 /tmp/w-ren/new")
    c.wait_event("new", [FilesystemEventType.CHMOD])


def test_watch_recursive(sandbox, watch):
    sandbox.commands.run("mkdir -p /tmp/w-rec/sub")
    c = watch("/tmp/w-rec", recursive=True)
    sandbox.files.write("/tmp/w-rec/sub/nested.txt", "n")
    c.wait_event("sub/nested.txt", [FilesystemEventType.CREATE, FilesystemEventType.WRITE])
    # A directory created after the watch started is watched too.
    sandbox.commands.run("mkdir /tmp/w-rec/later && touch /tmp/w-rec/later/x")
    c.wait_event("later/x", [FilesystemEventType.CREATE])


def test_watch_non_recursive_ignores_subdirs(sandbox, watch):
    sandbox.commands.run("mkdir -p /tmp/w-flat/sub")
    c = watch("/tmp/w-flat")
    sandbox.commands.run("touch /tmp/w-flat/sub/hidden")
    sandbox.commands.run("touch /tmp/w-flat/sentinel")
    c.wait_event("sentinel", [FilesystemEventType.CREATE])
    c.poll()
    assert not any("hidden" in e.name for e in c.events), c.events


def test_watch_include_entry(sandbox, watch):
    sandbox.files.make_dir("/tmp/w-entry")
    c = watch("/tmp/w-entry", include_entry=True)
    sandbox.files.write("/tmp/w-entry/e.txt", "12345")
    events = c.wait_event("e.txt", [FilesystemEventType.CREATE, FilesystemEventType.WRITE])
    with_entry = [e for e in c.events if e.name == "e.txt" and e.entry is not None]
    assert with_entry, events
    assert with_entry[-1].entry.path == "/tmp/w-entry/e.txt"
    assert with_entry[-1].entry.name == "e.txt"


def test_watch_stop(sandbox):
    sandbox.files.make_dir("/tmp/w-stop")
    h = sandbox.files.watch_dir("/tmp/w-stop")
    assert h.get_new_events() == []
    h.stop()
    # The server forgot the watcher: removing it again is NOT_FOUND.
    with pytest.raises(SandboxException):
        h.stop()


def test_watch_missing_dir(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.watch_dir("/tmp/w-missing")


def test_watch_a_file_is_invalid(sandbox):
    sandbox.files.write("/tmp/w-file", "x")
    with pytest.raises(InvalidArgumentException):
        sandbox.files.watch_dir("/tmp/w-file")


def test_two_watchers_are_independent(sandbox, watch):
    sandbox.commands.run("mkdir -p /tmp/w-a /tmp/w-b")
    a = watch("/tmp/w-a")
    b = watch("/tmp/w-b")
    sandbox.commands.run("touch /tmp/w-a/only-a /tmp/w-b/only-b")
    a.wait_event("only-a", [FilesystemEventType.CREATE])
    b.wait_event("only-b", [FilesystemEventType.CREATE])
    a.poll()
    b.poll()
    assert "only-b" not in a.names(), a.events
    assert "only-a" not in b.names(), b.events
