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
