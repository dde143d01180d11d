"""Secrets through the stock SDK: `husk-secret://NAME` in `envs` (sandbox or command) is the
team's secret in that process's environment, masked as `****` in the output streamed back
(also when split across chunks), absent from PID 1's environment and the sandbox's disk, and
recorded in the audit (never the value). A running command's secret is not in the process list
(only its `husk-secret://` reference), and the other commands of the sandbox cannot read it
from its /proc/PID/environ, as the user or as root."""

from __future__ import annotations

import subprocess

import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import SandboxException

from husk_compat import unique, wait_for

VALUE = "sk-compat-7c1f0e9a2b3d-not-for-eyes"


def set_secret(husk, name: str, value: str, team: str = "default") -> None:
    out = subprocess.run(
        [str(husk.bin), "secret", "set", name, "--team", team, "--state-dir", str(husk.state_dir)],
        input=value.encode(), capture_output=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")


@pytest.fixture(scope="module")
def secret_name(husk) -> str:
    name = unique("API_KEY").replace("-", "_").upper()
    set_secret(husk, name, VALUE)
    return name


def test_a_secret_reaches_the_process_masked_and_nowhere_else(husk, secret_name, sandbox_factory):
    sbx = sandbox_factory(envs={"FROM_SANDBOX": f"husk-secret://{secret_name}"})
    r = sbx.commands.run(f'echo "v=$FROM_SANDBOX"; test "$FROM_SANDBOX" = "{VALUE}" && echo match')
    assert r.stdout == "v=****\nmatch\n"
    # A command's own envs; the value printed in two pieces, in two chunks.
    r = sbx.commands.run(
        'printf %s "${K:0:9}"; sleep 0.3; printf "%s\\n" "${K:9}"; echo done',
        envs={"K": f"husk-secret://{secret_name}"},
    )
    assert r.stdout == "****\ndone\n"
    # Not in PID 1's environment, not on the sandbox's disk.
    r = sbx.commands.run(
        f'if tr "\\0" "\\n" < /proc/1/environ | grep -qF "{VALUE}"; then echo leaked; else echo clean; fi; '
        f'grep -rslF "{VALUE}" /tmp /home /etc /root /var 2>/dev/null | head -3; echo end',
        user="root",
    )
    assert r.stdout == "clean\nend\n"
    # Masking can be turned off per command.
    r = sbx.commands.run('echo "$K"', envs={"K": f"husk-secret://{secret_name}", "HUSK_REDACT": "0"})
    assert r.stdout == VALUE + "\n"
    # The audit says which secret went into which sandbox, never the value.
    audit = subprocess.run(
        [str(husk.bin), "secret", "audit", "--team", "default", "--state-dir", str(husk.state_dir)],
        capture_output=True, timeout=30,
    ).stdout.decode()
    assert secret_name in audit and sbx.sandbox_id in audit and VALUE not in audit, audit


def test_unknown_secrets_and_other_teams_secrets_are_refused(husk, secret_name, sandbox_factory, other_key):
    with pytest.raises(SandboxException) as e:
        Sandbox.create(envs={"X": "husk-secret://NO_SUCH_SECRET"}, timeout=30, **husk.opts())
    assert "secret 'NO_SUCH_SECRET' not found" in str(e.value)
    # Another team cannot use this team's secret, at create or per command.
    with pytest.raises(SandboxException) as e:
        Sandbox.create(envs={"X": f"husk-secret://{secret_name}"}, timeout=30, **husk.opts(api_key=other_key))
    assert "not found" in str(e.value)
    sbx = sandbox_factory(api_key=other_key)
    with pytest.raises(Exception) as e:
        sbx.commands.run('echo "$X"', envs={"X": f"husk-secret://{secret_name}"})
    assert "not found" in str(e.value)
    # The sandbox is fine afterwards.
    assert sbx.commands.run("echo ok").stdout == "ok\n"


def test_a_running_commands_secret_is_neither_listed_nor_readable_by_other_commands(secret_name, sandbox_factory):
    sbx = sandbox_factory()
    reference = f"husk-secret://{secret_name}"
    h = sbx.commands.run("sleep 60", background=True, envs={"S": reference})
    try:
        # The list shows the reference the command was started with, never the value.
        procs = sbx.commands.list()
        assert VALUE not in repr(procs), procs
        mine = [p for p in procs if p.pid == h.pid]
        assert mine and mine[0].envs.get("S") == reference, procs
        # The command itself has the value; another command cannot read it, as the user, as
        # root or through sudo. (Its output would be masked; the exit status tells.)
        r = sbx.commands.run(f"grep -qzx 'S={VALUE}' /proc/$$/environ && echo own", envs={"S": reference})
        assert r.stdout == "own\n"
        probe = f"if cat /proc/{h.pid}/environ > /dev/null 2>&1; then echo readable; else echo denied; fi"
        assert sbx.commands.run(probe).stdout == "denied\n"
        assert sbx.commands.run(probe, user="root").stdout == "denied\n"
        assert sbx.commands.run(probe.replace("if cat", "if sudo cat")).stdout == "denied\n"
        # Signals still cross commands.
        sbx.commands.run(f"kill {h.pid}")
        with pytest.raises(CommandExitException):
            h.wait()
        wait_for(lambda: h.pid not in [p.pid for p in sbx.commands.list()], 10, "killed pid to leave the list")
    finally:
        h.kill()


# E2B's secret API (`Secret.create/update/get_info/list/exists/destroy`) on the same store.


def test_e2b_secret_api(husk, sandbox_factory, other_key):
    from e2b import Secret
    from e2b.exceptions import AuthenticationException, SecretException, SecretNotFoundException

    opts = dict(api_url=husk.url, api_key=husk.admin_key, request_timeout=30)
    name = unique("OpenAI-Key")
    made = Secret.create(name, VALUE, metadata={"owner": "ci"}, **opts)
    # E2B lower-cases names; ids are `sec_`; values never come back.
    assert made.name == name.lower() and made.secret_id.startswith("sec_")
    assert (made.version, made.metadata) == (1, {"owner": "ci"})
    assert made.created_at.tzinfo is not None
    for ref in (made.secret_id, made.name, name):
        info = Secret.get_info(ref, **opts)
        assert (info.secret_id, info.name, info.version) == (made.secret_id, made.name, 1)
    with pytest.raises(SecretException) as e:
        Secret.create(name, "other", **opts)
    assert "already exists" in str(e.value)
    # A new value is a new version; metadata stays unless given.
    updated = Secret.update(made.secret_id, VALUE + "-2", **opts)
    assert (updated.version, updated.metadata) == (2, {"owner": "ci"})
    updated = Secret.update(made.name, VALUE + "-3", metadata={}, **opts)
    assert (updated.version, updated.metadata) == (3, {})
    with pytest.raises(SecretNotFoundException):
        Secret.update("no-such-secret", "x", **opts)
    # Listed in pages, with husk's own secrets of the team.
    seen, paginator = [], Secret.list(limit=1, **opts)
    while paginator.has_next:
        page = paginator.next_items()
        assert len(page) <= 1
        seen += page
    assert made.secret_id in {s.secret_id for s in seen}
    # The same store as husk's: a process gets it by `husk-secret://name`, masked.
    sbx = sandbox_factory()
    r = sbx.commands.run('echo "$K"; test "$K" = "' + VALUE + '-3" && echo match', envs={"K": f"husk-secret://{made.name}"})
    assert r.stdout == "****\nmatch\n"
    # Another team: not found, not listed, not destroyed; nobody: 401.
    other = dict(opts, api_key=other_key)
    assert not Secret.exists(made.secret_id, **other)
    assert Secret.destroy(made.secret_id, **other) is False
    assert made.secret_id not in {s.secret_id for s in Secret.list(**other).next_items()}
    with pytest.raises(AuthenticationException):
        Secret.get_info(made.secret_id, **dict(opts, api_key="e2b_" + "0" * 40))
    # Bad input: clear errors, nothing stored.
    for bad_name, what in (("sec_taken", "invalid secret name"), ("a{b}", "invalid secret name")):
        with pytest.raises(SecretException) as e:
            Secret.create(bad_name, "x", **opts)
        assert what in str(e.value)
    with pytest.raises(SecretException) as e:
        Secret.create(unique("meta"), "x", metadata={f"k{i}": "v" for i in range(33)}, **opts)
    assert "metadata" in str(e.value)
    assert Secret.exists(made.name, **opts)
    assert Secret.destroy(made.secret_id, **opts) is True
    assert Secret.destroy(made.secret_id, **opts) is False
    assert not Secret.exists(made.name, **opts)


@pytest.mark.asyncio
async def test_e2b_secret_api_async(husk):
    from e2b import AsyncSecret
    from e2b.exceptions import SecretNotFoundException

    opts = dict(api_url=husk.url, api_key=husk.admin_key, request_timeout=30)
    made = await AsyncSecret.create(unique("async-key"), VALUE, **opts)
    assert (await AsyncSecret.get_info(made.secret_id, **opts)).name == made.name
    assert (await AsyncSecret.update(made.secret_id, "v2", metadata={"a": "b"}, **opts)).version == 2
    page = await AsyncSecret.list(**opts).next_items()
    assert {"a": "b"} in [s.metadata for s in page if s.secret_id == made.secret_id]
    assert await AsyncSecret.destroy(made.secret_id, **opts) is True
    with pytest.raises(SecretNotFoundException):
        await AsyncSecret.get_info(made.secret_id, **opts)
