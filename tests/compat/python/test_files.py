"""Files with the stock sync SDK: read/write text, bytes and streams, many files, list depth,
exists, stat, make_dir, rename, remove, users, metadata (xattrs) and gzip."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re

import pytest

from e2b import (
    FileNotFoundException,
    FileType,
    InvalidArgumentException,
)

from husk_compat import http_request, sandbox_headers


def test_write_read_text(sandbox):
    info = sandbox.files.write("/home/user/hello.txt", "Hello, husk!\n")
    assert info.path == "/home/user/hello.txt"
    assert info.name == "hello.txt"
    assert info.type == FileType.FILE
    assert sandbox.files.read("/home/user/hello.txt") == "Hello, husk!\n"
    assert sandbox.commands.run("cat /home/user/hello.txt").stdout == "Hello, husk!\n"


def test_relative_and_tilde_paths_resolve_to_home(sandbox):
    info = sandbox.files.write("relative.txt", "rel")
    assert info.path == "/home/user/relative.txt"
    assert sandbox.files.read("/home/user/relative.txt") == "rel"
    assert sandbox.files.read("~/relative.txt") == "rel"
    assert sandbox.files.exists("relative.txt")
    assert sandbox.files.get_info("~/relative.txt").path == "/home/user/relative.txt"


def test_unicode_text(sandbox):
    text = "grüße ✓ 日本語\n" * 100
    sandbox.files.write("/tmp/u.txt", text)
    assert sandbox.files.read("/tmp/u.txt") == text


def test_write_read_bytes(sandbox):
    data = bytes(range(256)) * 64
    sandbox.files.write("/tmp/bin.dat", data)
    got = sandbox.files.read("/tmp/bin.dat", format="bytes")
    assert isinstance(got, bytearray)
    assert bytes(got) == data
    digest = sandbox.commands.run("sha256sum /tmp/bin.dat | cut -c1-64").stdout.strip()
    assert digest == hashlib.sha256(data).hexdigest()


def test_read_stream(sandbox):
    data = os.urandom(3 * 1024 * 1024 + 17)
    sandbox.files.write("/tmp/stream.dat", data)
    with sandbox.files.read("/tmp/stream.dat", format="stream") as stream:
        got = b"".join(stream)
    assert got == data


def test_large_file_roundtrip(sandbox):
    data = os.urandom(16 * 1024 * 1024)
    sandbox.files.write("/tmp/large.dat", data)
    assert sandbox.files.get_info("/tmp/large.dat").size == len(data)
    assert bytes(sandbox.files.read("/tmp/large.dat", format="bytes")) == data


def test_write_file_like_and_iterable(sandbox):
    sandbox.files.write("/tmp/io.dat", io.BytesIO(b"from a file object"))
    assert sandbox.files.read("/tmp/io.dat") == "from a file object"
    sandbox.files.write("/tmp/iter.dat", iter([b"chunk1-", b"chunk2-", b"chunk3"]))
    assert sandbox.files.read("/tmp/iter.dat") == "chunk1-chunk2-chunk3"


@pytest.mark.parametrize("octet", [True, False])
def test_octet_stream_and_multipart_uploads(sandbox, octet):
    path = f"/tmp/upload-{'octet' if octet else 'multipart'}.txt"
    info = sandbox.files.write(path, b"payload \x00\x01\x02", use_octet_stream=octet)
    assert info.path == path
    assert bytes(sandbox.files.read(path, format="bytes")) == b"payload \x00\x01\x02"


def test_empty_file(sandbox):
    sandbox.files.write("/tmp/empty", b"")
    assert sandbox.files.read("/tmp/empty") == ""
    assert sandbox.files.get_info("/tmp/empty").size == 0


def test_overwrite(sandbox):
    sandbox.files.write("/tmp/over.txt", "first version, longer")
    sandbox.files.write("/tmp/over.txt", "second")
    assert sandbox.files.read("/tmp/over.txt") == "second"


def test_write_creates_parent_dirs(sandbox):
    info = sandbox.files.write("/home/user/a/b/c/deep.txt", "deep")
    assert info.path == "/home/user/a/b/c/deep.txt"
    assert sandbox.files.get_info("/home/user/a/b").type == FileType.DIR
    assert sandbox.files.get_info("/home/user/a/b").owner == "user"
    assert sandbox.files.read("/home/user/a/b/c/deep.txt") == "deep"


def test_write_many_files(sandbox):
    files = [{"path": f"/home/user/many/d{i % 4}/f{i}.txt", "data": f"content {i}"} for i in range(40)]
    files.append({"path": "/home/user/many/bin.dat", "data": b"\x00\xff" * 10})
    infos = sandbox.files.write_files(files)
    assert sorted(i.path for i in infos) == sorted(f["path"] for f in files)
    for f in files[:40]:
        assert sandbox.files.read(f["path"]) == f["data"]
    assert bytes(sandbox.files.read("/home/user/many/bin.dat", format="bytes")) == b"\x00\xff" * 10
    listed = sandbox.commands.run("find /home/user/many -type f | wc -l").stdout.strip()
    assert listed == "41"


def test_write_many_files_octet_stream(sandbox):
    files = [{"path": f"/tmp/octet-many/f{i}", "data": f"{i}"} for i in range(10)]
    infos = sandbox.files.write_files(files, use_octet_stream=True)
    assert sorted(i.path for i in infos) == sorted(f["path"] for f in files)
    assert sandbox.commands.run("cat /tmp/octet-many/f7").stdout == "7"


def test_read_missing(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.read("/tmp/does-not-exist")


def test_read_directory_is_invalid(sandbox):
    with pytest.raises(InvalidArgumentException):
        sandbox.files.read("/tmp")


def test_list_depth(sandbox):
    sandbox.commands.run("mkdir -p /tmp/tree/sub/subsub && echo 1 > /tmp/tree/f1 && "
                         "echo 22 > /tmp/tree/sub/f2 && echo 333 > /tmp/tree/sub/subsub/f3")
    one = sandbox.files.list("/tmp/tree")
    assert {(e.name, e.type) for e in one} == {("f1", FileType.FILE), ("sub", FileType.DIR)}
    assert {e.path for e in one} == {"/tmp/tree/f1", "/tmp/tree/sub"}

    two = sandbox.files.list("/tmp/tree", depth=2)
    assert {e.path for e in two} == {
        "/tmp/tree/f1",
        "/tmp/tree/sub",
        "/tmp/tree/sub/f2",
        "/tmp/tree/sub/subsub",
    }
    three = sandbox.files.list("/tmp/tree", depth=3)
    assert "/tmp/tree/sub/subsub/f3" in {e.path for e in three}
    f2 = next(e for e in two if e.name == "f2")
    assert f2.size == 3 and f2.type == FileType.FILE


def test_list_entry_details(sandbox):
    sandbox.files.write("/tmp/ls/one.txt", "12345")
    sandbox.commands.run("ln -s one.txt /tmp/ls/link && mkdir /tmp/ls/dir")
    entries = {e.name: e for e in sandbox.files.list("/tmp/ls")}
    assert set(entries) == {"one.txt", "link", "dir"}
    assert entries["one.txt"].size == 5
    assert entries["one.txt"].owner == "user"
    assert entries["dir"].type == FileType.DIR
    # As E2B's envd lists a symlink: the type of what it leads to, the link's target (the
    # absolute path it resolves to) in `symlink_target`.
    assert entries["link"].type == FileType.FILE
    assert entries["link"].symlink_target == "/tmp/ls/one.txt"
    assert entries["one.txt"].symlink_target is None


def test_list_missing_and_empty(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.list("/tmp/nope-dir")
    sandbox.files.make_dir("/tmp/empty-dir")
    assert sandbox.files.list("/tmp/empty-dir") == []


def test_exists(sandbox):
    sandbox.files.write("/tmp/exists.txt", "x")
    assert sandbox.files.exists("/tmp/exists.txt") is True
    assert sandbox.files.exists("/tmp") is True
    assert sandbox.files.exists("/tmp/exists.txt.nope") is False


def test_get_info_file(sandbox):
    sandbox.files.write("/home/user/stat.txt", "0123456789")
    sandbox.commands.run("chmod 640 /home/user/stat.txt")
    info = sandbox.files.get_info("/home/user/stat.txt")
    assert info.name == "stat.txt"
    assert info.path == "/home/user/stat.txt"
    assert info.type == FileType.FILE
    assert info.size == 10
    assert info.owner == "user"
    assert info.group == "user"
    assert info.mode & 0o777 == 0o640
    assert re.search(r"rw-r-----$", info.permissions), info.permissions
    mtime = int(sandbox.commands.run("stat -c %Y /home/user/stat.txt").stdout)
    assert abs(info.modified_time.timestamp() - mtime) <= 1


def test_get_info_dir_and_owners(sandbox):
    d = sandbox.files.get_info("/home/user")
    assert d.type == FileType.DIR
    assert d.owner == "user"
    sandbox.commands.run("mkdir /tmp/root-dir", user="root")
    r = sandbox.files.get_info("/tmp/root-dir")
    assert (r.owner, r.group) == ("root", "root")
    # Owner and group are names as the sandbox itself resolves them (its own /etc/passwd).
    for path in ["/usr/bin", "/tmp", "/home/user"]:
        want = sandbox.commands.run(f"stat -c '%U %G' {path}").stdout.split()
        got = sandbox.files.get_info(path)
        assert [got.owner, got.group] == want, path


def test_get_info_missing(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.get_info("/tmp/missing-entry")


def test_make_dir(sandbox):
    assert sandbox.files.make_dir("/home/user/newdir") is True
    assert sandbox.files.make_dir("/home/user/newdir") is False
    assert sandbox.files.get_info("/home/user/newdir").type == FileType.DIR
    assert sandbox.files.make_dir("/home/user/p/q/r") is True
    assert sandbox.files.get_info("/home/user/p/q").type == FileType.DIR
    assert sandbox.files.get_info("/home/user/p/q/r").owner == "user"


def test_rename(sandbox):
    sandbox.files.write("/tmp/old-name.txt", "moving")
    info = sandbox.files.rename("/tmp/old-name.txt", "/tmp/new-name.txt")
    assert info.path == "/tmp/new-name.txt"
    assert info.name == "new-name.txt"
    assert info.type == FileType.FILE
    assert sandbox.files.exists("/tmp/old-name.txt") is False
    assert sandbox.files.read("/tmp/new-name.txt") == "moving"


def test_rename_directory(sandbox):
    sandbox.files.write("/tmp/dir-a/inner.txt", "inner")
    info = sandbox.files.rename("/tmp/dir-a", "/tmp/dir-b")
    assert info.type == FileType.DIR
    assert sandbox.files.read("/tmp/dir-b/inner.txt") == "inner"
    assert not sandbox.files.exists("/tmp/dir-a")


def test_rename_missing(sandbox):
    with pytest.raises(FileNotFoundException):
        sandbox.files.rename("/tmp/not-here", "/tmp/whatever")


def test_remove_file_and_tree(sandbox):
    sandbox.files.write("/tmp/rm/a/b.txt", "b")
    sandbox.files.write("/tmp/rm/c.txt", "c")
    sandbox.files.remove("/tmp/rm/c.txt")
    assert not sandbox.files.exists("/tmp/rm/c.txt")
    sandbox.files.remove("/tmp/rm")
    assert not sandbox.files.exists("/tmp/rm")
    assert sandbox.commands.run("test -e /tmp/rm || echo gone").stdout == "gone\n"


def test_remove_missing_succeeds_so_clean_up_first_code_works(sandbox):
    # E2B's envd removes with `os.RemoveAll`: a path that is not there is removed already.
    sandbox.files.remove("/tmp/never-there")
    sandbox.files.remove("/tmp/never/there/either")
    # The clean-up-first pattern: remove, make, watch.
    work = "/tmp/clean-first"
    for _ in range(2):
        sandbox.files.remove(work)
        assert sandbox.files.make_dir(work) is True
        h = sandbox.files.watch_dir(work, recursive=True)
        sandbox.files.write(f"{work}/x.txt", "x")
        h.stop()
    assert [e.name for e in sandbox.files.list(work)] == ["x.txt"]


def test_get_info_of_symlinks_is_their_targets(sandbox):
    sandbox.files.write("/tmp/links/target.txt", "12345")
    sandbox.commands.run(
        "cd /tmp/links && ln -s target.txt to-file && ln -s /tmp/links to-dir && "
        "ln -s to-file chain && ln -s nowhere dangling"
    )
    info = sandbox.files.get_info("/tmp/links/to-file")
    assert info.type == FileType.FILE
    assert info.symlink_target == "/tmp/links/target.txt"
    assert info.name == "to-file" and info.path == "/tmp/links/to-file"
    assert info.permissions.startswith("l")
    info = sandbox.files.get_info("/tmp/links/to-dir")
    assert info.type == FileType.DIR
    assert info.symlink_target == "/tmp/links"
    info = sandbox.files.get_info("/tmp/links/chain")
    assert (info.type, info.symlink_target) == (FileType.FILE, "/tmp/links/target.txt")
    # A link that leads nowhere: no type, itself as its target.
    info = sandbox.files.get_info("/tmp/links/dangling")
    assert info.type is None, info
    assert info.symlink_target == "/tmp/links/dangling"
    # A plain file has no target.
    assert sandbox.files.get_info("/tmp/links/target.txt").symlink_target is None


def test_files_as_root(sandbox):
    info = sandbox.files.write("/root/root-file.txt", "root data", user="root")
    assert info.path == "/root/root-file.txt"
    st = sandbox.files.get_info("/root/root-file.txt", user="root")
    assert st.owner == "root"
    assert sandbox.files.read("/root/root-file.txt", user="root") == "root data"
    # Relative paths resolve against root's home for root.
    assert sandbox.files.write("rel-root.txt", "r", user="root").path == "/root/rel-root.txt"


def test_metadata_on_write(sandbox):
    info = sandbox.files.write("/tmp/meta.txt", "with metadata", metadata={"Owner-Team": "alpha", "k": "v"})
    # Keys are lowercased by the sandbox.
    assert info.metadata == {"owner-team": "alpha", "k": "v"}
    assert sandbox.files.get_info("/tmp/meta.txt").metadata == {"owner-team": "alpha", "k": "v"}
    listed = {e.name: e for e in sandbox.files.list("/tmp")}
    assert listed["meta.txt"].metadata == {"owner-team": "alpha", "k": "v"}
    # Stored as user.e2b.* extended attributes, visible inside the sandbox.
    r = sandbox.commands.run(
        "python3 -c \"import os; print(os.getxattr('/tmp/meta.txt', 'user.e2b.k').decode())\""
    )
    assert r.stdout == "v\n"
    # The metadata moves with a rename.
    moved = sandbox.files.rename("/tmp/meta.txt", "/tmp/meta2.txt")
    assert moved.metadata == {"owner-team": "alpha", "k": "v"}
    # A new upload with metadata replaces the old metadata.
    sandbox.files.write("/tmp/meta2.txt", "again", metadata={"other": "1"})
    assert sandbox.files.get_info("/tmp/meta2.txt").metadata == {"other": "1"}


def test_metadata_on_write_files_applies_to_each(sandbox):
    infos = sandbox.files.write_files(
        [{"path": "/tmp/m1", "data": "1"}, {"path": "/tmp/m2", "data": "2"}],
        metadata={"batch": "b1"},
    )
    assert {i.path: i.metadata for i in infos} == {"/tmp/m1": {"batch": "b1"}, "/tmp/m2": {"batch": "b1"}}
    assert sandbox.files.get_info("/tmp/m2").metadata == {"batch": "b1"}


def test_no_metadata_is_none(sandbox):
    sandbox.files.write("/tmp/plain.txt", "plain")
    assert sandbox.files.get_info("/tmp/plain.txt").metadata is None


def test_gzip_upload_and_download(sandbox):
    text = "compress me " * 5000
    info = sandbox.files.write("/tmp/gz.txt", text, gzip=True)
    assert info.path == "/tmp/gz.txt"
    # Stored decompressed.
    assert sandbox.commands.run("wc -c < /tmp/gz.txt").stdout.strip() == str(len(text))
    assert sandbox.files.read("/tmp/gz.txt", gzip=True) == text
    assert sandbox.files.read("/tmp/gz.txt") == text
    data = os.urandom(100_000)
    sandbox.files.write("/tmp/gz.bin", data, gzip=True)
    assert bytes(sandbox.files.read("/tmp/gz.bin", format="bytes", gzip=True)) == data


def test_gzip_download_on_the_wire(tokened_sandbox, husk):
    """The SDK hides the encoding; check that the server really compresses when asked."""
    t = tokened_sandbox()
    sandbox, token = t.sbx, t.token
    text = "abc" * 10000
    sandbox.files.write("/tmp/wire.txt", text)
    r = http_request(
        husk.port,
        "GET",
        "/files?path=/tmp/wire.txt",
        {**sandbox_headers(sandbox.sandbox_id, token), "Accept-Encoding": "gzip"},
    )
    assert r.status == 200
    assert r.headers.get("content-encoding") == "gzip"
    assert gzip.decompress(r.body).decode() == text
    plain = http_request(husk.port, "GET", "/files?path=/tmp/wire.txt", sandbox_headers(sandbox.sandbox_id, token))
    assert plain.status == 200
    assert plain.headers.get("content-encoding") in (None, "identity")
    assert plain.body.decode() == text


def test_read_range(tokened_sandbox, husk):
    t = tokened_sandbox()
    t.sbx.files.write("/tmp/range.txt", "0123456789")
    r = http_request(
        husk.port,
        "GET",
        "/files?path=/tmp/range.txt",
        {**sandbox_headers(t.id, t.token), "Range": "bytes=2-5"},
    )
    assert r.status == 206
    assert r.body == b"2345"
