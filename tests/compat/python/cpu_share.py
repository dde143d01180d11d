"""Where a benchmark's CPU goes: a server's process tree, by role, beside the whole machine.

`CpuShare(server_pid)` snapshots the CPU time (user + system, with that of children already
reaped) of every process under the server, grouped by what it is, together with this process
(the client) and the machine's busy time from /proc/stat; `.per(n)` says what each took per
unit of work since the snapshot, in ms. A sandbox's processes are children of the spawner that
made it and are counted with it once reaped; what no process is charged for (the kernel's
workers: network namespaces and cgroups released after a destroy, soft interrupts) is the
machine's busy time minus all the rest.
"""

from __future__ import annotations

import os
from typing import Dict, Tuple

from husk_compat import children

HZ = os.sysconf("SC_CLK_TCK")

# Process names (comm) of the server's helpers, and what to call them.
ROLES = {
    "husk-state": "state helper",
    "husk-net": "network helper",
    "husk-files": "files helper",
    "husk-build": "build helper",
}
SPAWNERS = "spawners and sandboxes"


def _stat(pid: int) -> Tuple[str, float]:
    """(comm, CPU seconds with reaped children) of `pid`; raises OSError if gone."""
    with open(f"/proc/{pid}/stat") as f:
        st = f.read()
    comm = st[st.index("(") + 1:st.rindex(")")]
    fields = st.rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime are fields 14-17 of stat(5); fields[0] here is field 3.
    cpu = sum(int(x) for x in fields[11:15]) / HZ
    return comm, cpu


def _tree(root: int) -> Dict[int, int]:
    """Every process under `root` (itself included), each with its parent."""
    parent = {root: 0}
    todo = [root]
    while todo:
        pid = todo.pop()
        for child in children(pid):
            parent[child] = pid
            todo.append(child)
    return parent


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy since boot (all CPUs)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    # Everything but idle and iowait.
    return (sum(v) - v[3] - v[4]) / HZ


class CpuShare:
    def __init__(self, server_pid: int) -> None:
        self.root = server_pid
        parent = _tree(server_pid)
        stats: Dict[int, Tuple[str, float]] = {}
        for pid in parent:
            try:
                comm, cpu = _stat(pid)
            except OSError:
                continue
            stats[pid] = (comm, cpu)
        comms = {pid: comm for pid, (comm, _) in stats.items()}
        self.before = {pid: (self._role(pid, parent, comms), cpu) for pid, (_, cpu) in stats.items()}
        self.machine = machine_busy()
        self.client = sum(os.times()[:2])

    def _role(self, pid: int, parent: Dict[int, int], comms: Dict[int, str]) -> str:
        """The server itself; a helper, or a process a helper started; else a spawner or a
        process of a sandbox (a spawner's comm is the binary's name, whatever it is)."""
        if pid == self.root:
            return "server"
        p = pid
        while p in parent and p != self.root:
            if comms.get(p) in ROLES:
                return ROLES[comms[p]]
            p = parent[p]
        return SPAWNERS

    def per(self, n: int, client_cpu: float = 0.0) -> Dict[str, float]:
        """ms of CPU per unit of work (n units) since the snapshot, by role, with `client`,
        `rest of the machine` and `total`. `client_cpu`: CPU seconds of clients in other
        processes over the same time (they report their own: their start-up, before the
        snapshot, must not count), added to this process's."""
        out: Dict[str, float] = {}
        for pid, (role, cpu0) in self.before.items():
            try:
                _, cpu1 = _stat(pid)
            except OSError:
                continue
            out[role] = out.get(role, 0.0) + (cpu1 - cpu0) * 1e3 / n
        out["client"] = (sum(os.times()[:2]) - self.client + client_cpu) * 1e3 / n
        total = (machine_busy() - self.machine) * 1e3 / n
        out["rest of the machine"] = max(0.0, total - sum(out.values()))
        out["total"] = total
        return out

    def line(self, n: int, client_cpu: float = 0.0) -> str:
        shares = self.per(n, client_cpu)
        total = shares.pop("total")
        parts = [f"{k} {v:.2f}" for k, v in sorted(shares.items(), key=lambda kv: -kv[1]) if v >= 0.005]
        return f"{total:.2f} ms of CPU each: " + ", ".join(parts)
