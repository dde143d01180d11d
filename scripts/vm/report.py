"""scripts/test-vm's report: report.py LOGS LABEL...: for each kernel LABEL, reads
LOGS/LABEL/results.tsv (kind, check, ok|FAIL|skip, detail, written by the guest) and prints a
table, host kind x check, then every failure with its detail (husk's last words).
Exits 1 if any check failed or a kernel has no results."""

import os
import sys

KINDS = ["vm", "scope", "service", "login", "script", "script-deleg", "container"]


def main():
    logs, labels = sys.argv[1], sys.argv[2:]
    bad = False
    for label in labels:
        d = os.path.join(logs, label)
        try:
            ver = open(os.path.join(d, "kernel-version")).read().strip()
        except OSError:
            ver = "?"
        rows = []
        try:
            with open(os.path.join(d, "results.tsv"), errors="replace") as f:
                for line in f:
                    parts = line.rstrip("\n").split("\t")
                    if len(parts) >= 3:
                        rows.append((parts + [""])[:4])
        except OSError:
            pass
        print(f"\n== kernel {label} ({ver}) ==")
        if not rows:
            print("   no results: the guest never reported (see the console log)")
            bad = True
            continue
        kinds = [k for k in KINDS if any(r[0] == k for r in rows)]
        kinds += [k for k in dict.fromkeys(r[0] for r in rows) if k not in kinds]
        checks = list(dict.fromkeys(r[1] for r in rows))
        cell = {}
        for kind, check, status, _ in rows:
            # A check recorded twice keeps its worst result.
            old = cell.get((kind, check))
            if old != "FAIL":
                cell[(kind, check)] = status
        w = max(len(c) for c in checks) + 1
        cw = [max(len(k), 4) + 1 for k in kinds]
        print(" " * w + " ".join(k.ljust(x) for k, x in zip(kinds, cw)))
        for c in checks:
            line = c.ljust(w) + " ".join(cell.get((k, c), "-").ljust(x) for k, x in zip(kinds, cw))
            print(line.rstrip())
        fails = [r for r in rows if r[2] == "FAIL"]
        if fails:
            bad = True
            print(f"\n-- kernel {label}: {len(fails)} failed --")
            for kind, check, _, detail in fails:
                print(f"* {kind} / {check}: {detail[:400]}")
            print(f"   (each check's full output: {d}/logs/KIND/; the guest's journal: {d}/journal.txt)")
        durations = os.path.join(d, "durations.tsv")
        if os.path.exists(durations):
            print("   seconds per kind: " + ", ".join(l.strip().replace("\t", " ") for l in open(durations)))
    print("\n(ok: passed, FAIL: failed, skip: not applicable or not reached, -: not run;"
          f" full logs under {logs}/<kernel>/)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
