"""Built templates through the stock SDK: `Sandbox.create(template)` with a template built by
`husk template build` next to the running server (they share its state directory); the
template's packages, files, environment and start/ready commands; a damaged image refused at
creation with a clear error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from husk_compat import REPO_ROOT, unique

SPEC = REPO_ROOT / "tests" / "compat" / "templates" / "debian" / "husk.toml"
# Shared with the cargo tests (crates/husk/tests/common/templates.rs): layers are keyed by
# content, so a machine bootstraps Debian once.
LAYER_CACHE = "/var/tmp/husk-test-layers"


def build(husk, spec: Path, name: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(husk.bin), "template", "build", str(spec), "--name", name, "--quiet",
         "--state-dir", str(husk.state_dir), "--layer-cache", LAYER_CACHE, *extra],
        capture_output=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def debian_template(husk):
    name = unique("compat-deb")
    out = build(husk, SPEC, name)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    yield name
    subprocess.run([str(husk.bin), "template", "rm", name, "--state-dir", str(husk.state_dir)],
                   capture_output=True, timeout=60)


def test_sandbox_from_a_built_template(husk, debian_template, sandbox_factory):
    sbx = sandbox_factory(template=debian_template, timeout=60)
    assert sbx.get_info().template_id == debian_template
    r = sbx.commands.run(
        "cat /etc/husk-compat /srv/data/file; . /etc/os-release; echo $VERSION_CODENAME; "
        "echo '{\"n\": 41}' | jq '.n + 1'; whoami; echo $HOME; echo $TEMPLATE_ENV; "
        "cat /tmp/started-by-template; test -e /usr/bin/mmdebstrap && echo HOST-VISIBLE; echo end"
    )
    assert r.stdout == (
        "compat-template\ndata\nbookworm\n42\nuser\n/home/user\nfrom-the-template\nstarted\nend\n"
    )
    # The start command keeps running in the background, like any process of the sandbox.
    tags = [p.tag for p in sbx.commands.list()]
    assert "start_cmd" in tags, tags
    # The request's env wins over the template's.
    sbx2 = sandbox_factory(template=debian_template, timeout=60, envs={"TEMPLATE_ENV": "mine"})
    assert sbx2.commands.run("echo $TEMPLATE_ENV").stdout == "mine\n"
    # sudo works in built templates too (husk's brokered sudo is layered into /usr/local/bin).
    assert sbx.commands.run("sudo id -u").stdout == "0\n"
    # Files written by the template's root stay root's; the user's home is the user's.
    r = sbx.commands.run("stat -c %U /etc/husk-compat /home/user; touch /etc/x 2>&1 || echo denied")
    assert r.stdout.splitlines() == ["root", "user", "touch: cannot touch '/etc/x': Permission denied", "denied"]


def test_a_damaged_template_is_refused_with_a_clear_error(husk, debian_template, tmp_path):
    name = unique("compat-damaged")
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM {debian_template}\nRUN echo layered > /layered\n")
    out = build(husk, df, name)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    try:
        info = subprocess.run([str(husk.bin), "template", "inspect", name, "--state-dir", str(husk.state_dir)],
                              capture_output=True, check=True, timeout=60)
        import json

        image = Path(json.loads(info.stdout)["image"])
        with open(image, "r+b") as f:
            f.truncate(image.stat().st_size // 2)
        with pytest.raises(SandboxException) as e:
            Sandbox.create(name, timeout=30, **husk.opts())
        assert "damaged" in str(e.value), str(e.value)
        # The server is fine and other templates still work.
        sbx = Sandbox.create(debian_template, timeout=30, **husk.opts())
        try:
            assert sbx.commands.run("cat /etc/husk-compat").stdout == "compat-template\n"
        finally:
            sbx.kill()
    finally:
        subprocess.run([str(husk.bin), "template", "rm", name, "--state-dir", str(husk.state_dir)],
                       capture_output=True, timeout=60)
