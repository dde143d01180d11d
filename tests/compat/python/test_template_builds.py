"""E2B's templates as code through the stock SDK (`Template().from_template(...).copy(...)
.run_cmd(...)`, `Template.build`, `build_in_background`, `get_build_status`, `exists`) on
husk's builder: a multi-step template built twice (the second time every step from the
cache and no file uploaded again), then sandboxes from it; build failures that name their
step; what husk refuses and says so; upload URLs that only their signature opens; admin keys
only."""

from __future__ import annotations

import asyncio
import os
import json
import secrets
import socket
import warnings
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
from e2b import AsyncTemplate, Sandbox, Template
from e2b.exceptions import BuildException

from husk_compat import REPO_ROOT, http_request, unique

SPEC = REPO_ROOT / "tests" / "compat" / "templates" / "debian" / "husk.toml"
LAYER_CACHE = "/var/tmp/husk-test-layers"


def husk_cli(husk, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(husk.bin), *args, "--state-dir", str(husk.state_dir)],
                          capture_output=True, timeout=timeout)


@pytest.fixture(scope="module")
def base_template(husk):
    """A small Debian template built with husk's CLI: what the SDK's templates start from
    (tests cannot pull from Docker Hub)."""
    name = unique("sdk-base")
    out = husk_cli(husk, "template", "build", str(SPEC), "--name", name, "--quiet",
                   "--layer-cache", LAYER_CACHE)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    yield name
    husk_cli(husk, "template", "rm", name, timeout=60)


@pytest.fixture
def built(husk):
    """Names of templates a test builds; removed at the end."""
    names = []
    yield names
    for n in names:
        husk_cli(husk, "template", "rm", n, timeout=60)


@pytest.fixture
def context(tmp_path):
    (tmp_path / "app" / "sub").mkdir(parents=True)
    (tmp_path / "app" / "main.py").write_text("print('hi from main')\n")
    (tmp_path / "app" / "sub" / "data.txt").write_text("data\n")
    (tmp_path / "app" / ".hidden").write_text("h\n")
    (tmp_path / "config.json").write_text('{"k": 1}\n')
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "tool.sh").write_text("#!/bin/sh\necho tool ran\n")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.md").write_text("a\n")
    (tmp_path / "notes" / "b.md").write_text("b\n")
    (tmp_path / "notes" / "c.txt").write_text("c\n")
    return tmp_path


def template_of(context: Path, base: str):
    return (
        Template(file_context_path=str(context))
        .from_template(base)
        .set_envs({"GREETING": "hello from e2b", "EMPTY": ""})
        .copy("app", "/home/user/app")
        .copy("config.json", "/etc/myapp/", user="root")
        .copy("bin/tool.sh", "/usr/local/bin/tool", mode=0o755)
        .copy("notes/*.md", "docs/", mode=0o600)
        .run_cmd("echo built-by-$(whoami)-in-$(pwd) > /home/user/marker")
        .run_cmd(["mkdir -p /opt/root-made", "touch /opt/root-made/f"], user="root")
        .set_workdir("/home/user/app")
        .run_cmd("pwd > /tmp/build-pwd && cat sub/data.txt > copied")
        .set_start_cmd("echo $GREETING > /tmp/started && exec sleep infinity",
                       "test -f /tmp/started")
    )


def messages(logs) -> list:
    return [e.message for e in logs]


# The first test also builds the base template (Debian, when the layer cache is cold).
@pytest.mark.timeout(600)
def test_an_sdk_template_builds_twice_the_second_from_the_cache(
        husk, base_template, context, built, sandbox_factory):
    name = unique("sdk-tpl")
    built.append(name)
    logs = []
    info = Template.build(template_of(context, base_template), name,
                          on_build_logs=logs.append, api_key=husk.admin_key)
    assert info.template_id == name and info.name == name
    assert len(info.build_id) == 36
    text = messages(logs)
    assert any(m.startswith("Uploaded 'app'") for m in text), text
    assert any("RUN echo built-by" in m for m in text), text
    # Steps are labelled as E2B labels them: the base, then the SDK's step numbers.
    assert any(getattr(e, "message", "").startswith("[1/") for e in logs), text

    sbx = sandbox_factory(template=name, timeout=60)
    r = sbx.commands.run(
        "echo $GREETING; whoami; pwd; cat /tmp/started; cat /home/user/marker; "
        "cat /home/user/app/main.py /home/user/app/sub/data.txt /home/user/app/.hidden; "
        "cat /etc/myapp/config.json; tool; ls /home/user/docs; cat /tmp/build-pwd; "
        "cat /home/user/app/copied; ls /opt/root-made"
    )
    assert r.stdout.splitlines() == [
        "hello from e2b", "user", "/home/user/app", "hello from e2b",
        "built-by-user-in-/home/user",
        "print('hi from main')", "data", "h",
        '{"k": 1}', "tool ran", "a.md", "b.md", "/home/user/app", "data", "f",
    ]
    # Owners: the current user unless the step names one; modes where given.
    r = sbx.commands.run(
        "stat -c '%U %a %n' /home/user/app/main.py /etc/myapp/config.json "
        "/usr/local/bin/tool /home/user/docs/a.md /opt/root-made/f"
    )
    got = [line.split(" ", 2) for line in r.stdout.splitlines()]
    assert [(u, n) for u, _, n in got] == [
        ("user", "/home/user/app/main.py"), ("root", "/etc/myapp/config.json"),
        ("user", "/usr/local/bin/tool"), ("user", "/home/user/docs/a.md"),
        ("root", "/opt/root-made/f"),
    ]
    assert [m for _, m, _ in got][2:4] == ["755", "600"]
    assert sbx.commands.run("echo ${EMPTY-unset}").stdout == "\n"

    # Again: nothing uploaded, every step from the cache, the same template.
    logs2 = []
    info2 = Template.build(template_of(context, base_template), name,
                           on_build_logs=logs2.append, api_key=husk.admin_key)
    assert info2.template_id == name and info2.build_id != info.build_id
    text2 = messages(logs2)
    assert not any(m.startswith("Uploaded") for m in text2), text2
    assert sum(m.startswith("Skipping upload") for m in text2) == 4, text2
    starts = [m for m in text2 if m.startswith("[") and "/" in m.split("]")[0]]
    cached = [m for m in text2 if m.startswith("CACHED [")]
    assert starts and len(cached) == len(starts), text2
    assert not any(m.startswith("done [") for m in text2), text2
    assert Template.exists(name, api_key=husk.admin_key)
    sbx2 = sandbox_factory(template=name, timeout=60)
    assert sbx2.commands.run("cat /home/user/marker").stdout == "built-by-user-in-/home/user\n"

    # skip_cache() before a step rebuilds it and every step after it, nothing before it.
    logs3 = []
    t = (Template(file_context_path=str(context)).from_template(base_template)
         .run_cmd("echo one > /tmp/one").skip_cache().run_cmd("echo two > /tmp/two")
         .run_cmd("echo three > /tmp/three"))
    t2 = (Template(file_context_path=str(context)).from_template(base_template)
          .run_cmd("echo one > /tmp/one").run_cmd("echo two > /tmp/two")
          .run_cmd("echo three > /tmp/three"))
    name3 = unique("sdk-force")
    built.append(name3)
    Template.build(t2, name3, api_key=husk.admin_key)
    Template.build(t, name3, on_build_logs=logs3.append, api_key=husk.admin_key)
    text3 = messages(logs3)
    assert "CACHED [2]" in text3, text3
    assert any(m.startswith("done [3]") for m in text3), text3
    assert any(m.startswith("done [4]") for m in text3), text3


@pytest.mark.timeout(300)
def test_build_failures_name_their_step_and_refusals_are_clear(husk, base_template, context):
    name = unique("sdk-fail")
    t = (Template(file_context_path=str(context)).from_template(base_template)
         .run_cmd("echo fine").run_cmd("echo about to fail; exit 7"))
    with pytest.raises(BuildException) as e:
        Template.build(t, name, api_key=husk.admin_key)
    assert "exit" in str(e.value) and "7" in str(e.value), str(e.value)
    assert not Template.exists(name, api_key=husk.admin_key)
    status_logs = []
    info = Template.build_in_background(t, name, api_key=husk.admin_key)
    deadline = time.time() + 300
    while True:
        st = Template.get_build_status(info, logs_offset=len(status_logs), api_key=husk.admin_key)
        status_logs += st.log_entries
        if st.status.value in ("ready", "error"):
            break
        assert time.time() < deadline, "the build did not finish"
        time.sleep(0.2)
    assert st.status.value == "error"
    assert st.reason is not None and st.reason.step == "2", st.reason
    assert any("about to fail" in e.message for e in status_logs), messages(status_logs)

    # What husk cannot do is refused before anything runs, and says why.
    cases = [
        (Template().from_template(base_template).set_user("guest").run_cmd("id"), '"root" or "user"'),
        (Template().from_template("no-such-template-here").run_cmd("id"), "not found"),
        (Template().from_aws_registry("1.dkr.ecr.us-east-1.amazonaws.com/x:1", "a", "b", "us-east-1")
         .run_cmd("id"), "not supported by husk"),
    ]
    for tpl, want in cases:
        with pytest.raises(BuildException) as e:
            Template.build(tpl, unique("sdk-refused"), api_key=husk.admin_key)
        assert want in str(e.value), str(e.value)
    with pytest.raises(BuildException) as e:
        Template.build(t, "name:bad tag", api_key=husk.admin_key)
    assert "invalid tag" in str(e.value)
    with pytest.raises(BuildException) as e:
        Template.build(t, "Bad Name", api_key=husk.admin_key)
    assert "invalid template name" in str(e.value)


@pytest.mark.timeout(300)
def test_template_builds_need_an_admin_key_and_uploads_their_signature(husk, base_template):
    team_key = husk.create_key(unique("tb-team"))
    for key, status in ((team_key, 403), (None, 401)):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["X-API-KEY"] = key
        r = http_request(husk.port, "POST", "/v3/templates", headers, json.dumps({"name": "x"}).encode())
        assert r.status == status, r.text
        r = http_request(husk.port, "GET", f"/templates/x/files/{'a' * 64}", headers)
        assert r.status == status, r.text
        r = http_request(husk.port, "GET", "/templates/x/builds/y/status", headers)
        assert r.status == status, r.text
        for method in ("POST", "DELETE"):
            body = json.dumps({"target": f"{base_template}:default", "name": base_template, "tags": ["t"]})
            r = http_request(husk.port, method, "/templates/tags", headers, body.encode())
            # (a body with both fields: the key is checked before the body)
            assert r.status == status, r.text
    assert http_request(husk.port, "GET", f"/templates/{base_template}/tags", {}).status == 401
    with pytest.raises(BuildException):
        Template.build(Template().from_template(base_template).run_cmd("id"), unique("x"), api_key=team_key)

    admin = {"X-API-KEY": husk.admin_key, "Content-Type": "application/json"}
    h = "e" * 64
    r = http_request(husk.port, "GET", f"/templates/x/files/{h}", admin)
    assert r.status == 201, r.text
    link = r.json()
    assert link["present"] is False
    url = urllib.parse.urlsplit(link["url"])
    assert url.netloc == f"127.0.0.1:{husk.port}" and url.path == f"/husk/v1/template-files/{h}"
    q = dict(urllib.parse.parse_qsl(url.query))
    tar = _tar({"f.txt": b"x"})

    def put(query: str, path: str = url.path):
        return http_request(husk.port, "PUT", f"{path}?{query}", {}, tar)

    bad_sig = dict(q, signature="0" * 64)
    assert put(urllib.parse.urlencode(bad_sig)).status == 403
    # Another hash under this hash's signature.
    assert put(url.query, f"/husk/v1/template-files/{'f' * 64}").status == 403
    expired = dict(q, expires=str(int(time.time()) - 10))
    assert put(urllib.parse.urlencode(expired)).status in (401, 403)
    assert put("").status == 401
    assert put(url.query).status == 200
    r = http_request(husk.port, "GET", f"/templates/x/files/{h}", admin)
    assert r.json()["present"] is True
    # Bad hashes and unknown builds.
    assert http_request(husk.port, "GET", "/templates/x/files/..%2f..", admin).status in (400, 404)
    assert http_request(husk.port, "GET", "/templates/x/files/ABC", admin).status == 400
    r = http_request(husk.port, "POST", "/v2/templates/x/builds/nope", admin, b'{"fromTemplate": "base"}')
    assert r.status == 404, r.text
    # Steps that name files never uploaded are refused at once.
    r = http_request(husk.port, "POST", "/v3/templates", admin, json.dumps({"name": unique("tb")}).encode())
    assert r.status == 202, r.text
    tid, bid = r.json()["templateID"], r.json()["buildID"]
    body = {"fromTemplate": base_template,
            "steps": [{"type": "COPY", "args": ["a", "/a"], "filesHash": "9" * 64, "force": False}]}
    r = http_request(husk.port, "POST", f"/v2/templates/{tid}/builds/{bid}", admin, json.dumps(body).encode())
    assert r.status == 400 and "never uploaded" in r.text, r.text
    r = http_request(husk.port, "POST", f"/v2/templates/{tid}/builds/{bid}", admin, b'{"steps": [], "bogus": 1}')
    assert r.status == 400 and "bogus" in r.text, r.text
    r = http_request(husk.port, "GET", f"/templates/{tid}/builds/{bid}/status?logsOffset=x", admin)
    assert r.status == 400, r.text
    r = http_request(husk.port, "GET", f"/templates/{tid}/builds/{bid}/status", admin)
    assert r.status == 200 and r.json()["status"] == "waiting", r.text
    # Aliases: any key may ask.
    hdr = {"X-API-KEY": team_key}
    assert http_request(husk.port, "GET", f"/templates/aliases/{base_template}", hdr).status == 200
    assert http_request(husk.port, "GET", "/templates/aliases/not-here-at-all", hdr).status == 404


@pytest.mark.timeout(300)
def test_tags_name_builds_and_move_between_them(husk, base_template, context, built, sandbox_factory):
    name = unique("sdk-tags")
    built.extend([name, f"{name}:v1", f"{name}:v2", f"{name}:stable", f"{name}:prod"])
    admin = dict(api_key=husk.admin_key)

    def version(v: str):
        return (Template(file_context_path=str(context)).from_template(base_template)
                .run_cmd(f"echo {v} > /home/user/version"))

    def version_of(template: str) -> str:
        sbx = sandbox_factory(template=template, timeout=60)
        return sbx.commands.run("cat /home/user/version").stdout.strip()

    info = Template.build(version("v1"), f"{name}:v1", tags=["stable"], **admin)
    assert sorted(info.tags) == ["stable", "v1"]
    assert version_of(f"{name}:v1") == "v1" and version_of(f"{name}:stable") == "v1"
    # No `default` tag was given: the bare name is not a template yet.
    with pytest.raises(Exception) as e:
        sandbox_factory(template=name, timeout=60)
    assert "not found" in str(e.value).lower(), str(e.value)
    assert Template.exists(f"{name}:v1", **admin)
    assert not Template.exists(name, **admin)

    tags = {t.tag: t for t in Template.get_tags(name, **admin)}
    assert set(tags) == {"v1", "stable"}
    assert tags["v1"].build_id == tags["stable"].build_id
    assigned = Template.assign_tags(f"{name}:v1", ["prod", "default"], **admin)
    assert sorted(assigned.tags) == ["default", "prod"] and assigned.build_id == tags["v1"].build_id
    assert version_of(name) == "v1" and version_of(f"{name}:default") == "v1"
    assert version_of(f"{name}:prod") == "v1"

    # A new build takes `stable` with it; v1 stays.
    Template.build(version("v2"), f"{name}:v2", tags=["stable"], **admin)
    assert version_of(f"{name}:stable") == "v2" and version_of(f"{name}:v1") == "v1"
    tags = {t.tag: t.build_id for t in Template.get_tags(name, **admin)}
    assert set(tags) == {"default", "v1", "v2", "stable", "prod"}
    assert tags["stable"] == tags["v2"] != tags["v1"]

    Template.remove_tags(name, ["stable", "prod"], **admin)
    assert set(t.tag for t in Template.get_tags(name, **admin)) == {"default", "v1", "v2"}
    with pytest.raises(Exception):
        sandbox_factory(template=f"{name}:stable", timeout=60)
    assert version_of(f"{name}:v2") == "v2"
    # Tags of templates that are not there, and team keys.
    from e2b.exceptions import TemplateException
    with pytest.raises(TemplateException):
        Template.assign_tags(f"{unique('none')}:v1", ["x"], **admin)
    with pytest.raises(TemplateException):
        Template.remove_tags(name, ["never-assigned"], **admin)
    team_key = husk.create_key(unique("tags-team"))
    with pytest.raises(TemplateException):
        Template.assign_tags(f"{name}:v1", ["mine"], api_key=team_key)
    assert {t.tag for t in Template.get_tags(name, api_key=team_key)} == {"default", "v1", "v2"}

    # E2B's template info and delete (`e2b template delete`): the template and all its tags.
    r = http_request(husk.port, "GET", f"/templates/{name}", {"X-API-KEY": team_key})
    assert r.status == 200, r.text
    got = r.json()
    assert got["templateID"] == name and got["buildCount"] == 2 and len(got["builds"]) == 2
    assert {b["buildID"] for b in got["builds"]} == {tags["v1"], tags["v2"]}
    assert http_request(husk.port, "GET", f"/templates/{name}", {}).status == 401
    assert http_request(husk.port, "DELETE", f"/templates/{name}", {}).status == 401
    assert http_request(husk.port, "DELETE", f"/templates/{name}", {"X-API-KEY": team_key}).status == 403
    r = http_request(husk.port, "DELETE", f"/templates/{name}:v1", {"X-API-KEY": husk.admin_key})
    assert r.status == 204, r.text
    assert {t.tag for t in Template.get_tags(name, **admin)} == {"default", "v2"}
    r = http_request(husk.port, "DELETE", f"/templates/{name}", {"X-API-KEY": husk.admin_key})
    assert r.status == 204, r.text
    with pytest.raises(TemplateException):
        Template.get_tags(name, **admin)
    assert http_request(husk.port, "GET", f"/templates/{name}", {"X-API-KEY": team_key}).status == 404
    assert http_request(husk.port, "DELETE", f"/templates/{name}", {"X-API-KEY": husk.admin_key}).status == 404


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """Debian's docker-registry on a free loopback port, with a login (htpasswd, bcrypt)."""
    binary = Path("/usr/bin/docker-registry")
    assert binary.exists(), "docker-registry is missing: run scripts/test (it installs it)"
    d = tmp_path_factory.mktemp("registry")
    user, password = "husk-test", secrets.token_hex(12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt
        hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    (d / "htpasswd").write_text(f"{user}:{hashed}\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = d / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {d / 'data'}\nhttp:\n  addr: 127.0.0.1:{port}\n"
        f"auth:\n  htpasswd:\n    realm: husk-test\n    path: {d / 'htpasswd'}\n"
    )
    proc = subprocess.Popen([str(binary), "serve", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.time() < deadline, "docker-registry did not start"
                time.sleep(0.05)
        yield f"127.0.0.1:{port}", user, password
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.timeout(300)
def test_from_an_image_in_a_private_registry(husk, base_template, context, built, registry, sandbox_factory):
    """`from_image(..., username=, password=)`: the login is used for this build's pull (a real
    registry that wants it); a wrong one, or none, fails the build and says why."""
    addr, user, password = registry
    image = f"{addr}/husk-test/base:1"
    env = dict(os.environ, HUSK_REGISTRY_USERNAME=user, HUSK_REGISTRY_PASSWORD=password)
    out = subprocess.run([str(husk.bin), "template", "export", base_template, "--push", image,
                          "--state-dir", str(husk.state_dir)], capture_output=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    name = unique("sdk-registry")
    built.append(name)
    t = (Template(file_context_path=str(context)).from_image(image, username=user, password=password)
         .run_cmd("echo pulled-as-$(whoami) > /home/user/pulled"))
    Template.build(t, name, api_key=husk.admin_key)
    sbx = sandbox_factory(template=name, timeout=60)
    assert sbx.commands.run("cat /home/user/pulled /etc/husk-compat").stdout == "pulled-as-user\ncompat-template\n"
    for login in ({"username": user, "password": "wrong"}, {}):
        t = Template().from_image(image, **login).run_cmd("true")
        with pytest.raises(BuildException) as e:
            Template.build(t, unique("sdk-registry-no"), api_key=husk.admin_key)
        assert addr in str(e.value), str(e.value)


def _tar(files: dict) -> bytes:
    import io
    import tarfile
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.timeout(300)
def test_async_template_build(husk, base_template, context, built, sandbox_factory):
    name = unique("sdk-async")
    built.append(name)

    async def go():
        t = (AsyncTemplate(file_context_path=str(context)).from_template(base_template)
             .copy("config.json", "/home/user/").run_cmd("cat /home/user/config.json > /home/user/seen"))
        return await AsyncTemplate.build(t, name, api_key=husk.admin_key)

    info = asyncio.run(go())
    assert info.template_id == name
    sbx = sandbox_factory(template=name, timeout=60)
    assert sbx.commands.run("cat /home/user/seen").stdout == '{"k": 1}\n'
