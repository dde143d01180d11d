#!/usr/bin/env bash
# Runs husk's E2B-SDK compatibility suite: the stock Python SDKs (e2b==2.63.0 and
# e2b-code-interpreter==2.11.5, sync and async) and the stock JS SDKs (e2b@2.51.0 and
# @e2b/code-interpreter@2.8.0) against a real `husk serve` that each suite starts itself.
#
#   tests/compat/run.sh              # both suites
#   COMPAT_ONLY=python tests/compat/run.sh [pytest args...]
#   COMPAT_ONLY=js tests/compat/run.sh
#   HUSK_COMPAT_STORE=postgres COMPAT_ONLY=python tests/compat/run.sh test_x.py  # state in PostgreSQL
#
# A whole run also runs the store-heavy Python suites a second time with the servers' state in
# PostgreSQL (COMPAT_POSTGRES=0 skips that pass).
# The server binary is $HUSK_BIN, else target/x86_64-unknown-linux-gnu/debug/husk (build it
# first: cargo build). Must run as root (husk creates namespaces, cgroups and mounts).
# Exits non-zero if anything failed.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"

"$HERE/setup.sh" || { echo "compat: setup failed" >&2; exit 1; }

export HUSK_BIN="${HUSK_BIN:-$ROOT/target/x86_64-unknown-linux-gnu/debug/husk}"
if [ ! -x "$HUSK_BIN" ]; then
  echo "compat: husk binary not found at $HUSK_BIN: build husk first: cargo build" >&2
  exit 1
fi

# Nothing from the caller's environment may point the SDKs anywhere else: the suites set the
# server's URL themselves, and traffic must only ever reach 127.0.0.1.
unset E2B_API_KEY E2B_ACCESS_TOKEN E2B_DOMAIN E2B_API_URL E2B_SANDBOX_URL E2B_VOLUME_API_URL E2B_DEBUG E2B_HTTP_VERSION
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost

only="${COMPAT_ONLY:-all}"
py_rc=0
js_rc=0

if [ "$only" = all ] || [ "$only" = python ]; then
  echo "compat: Python (e2b==2.63.0, e2b-code-interpreter==2.11.5)" >&2
  (cd "$HERE/python" && .venv/bin/python -m pytest -q "$@")
  py_rc=$?
  # The suites that exercise the store most, again with every server's state in PostgreSQL
  # (a private server on a free loopback port; husk_postgres.py) instead of SQLite. Only in a
  # whole run: given pytest arguments, the caller chose what to run.
  if [ $# -eq 0 ] && [ "${COMPAT_POSTGRES:-1}" != 0 ]; then
    echo "compat: Python again, with the state in PostgreSQL (HUSK_COMPAT_STORE=postgres)" >&2
    (cd "$HERE/python" && HUSK_COMPAT_STORE=postgres .venv/bin/python -m pytest -q \
      test_sandbox.py test_async.py test_tenancy.py test_secrets.py test_limits.py \
      test_restart.py test_pause.py test_snapshots.py test_volumes.py test_workspaces.py \
      test_templates.py) || py_rc=1
  fi
fi

if [ "$only" = all ] || [ "$only" = js ]; then
  echo "compat: JS (e2b@2.51.0, @e2b/code-interpreter@2.8.0)" >&2
  # node --test applies --test-timeout to each file as a whole too. The code-interpreter and
  # template-build files build templates first (minutes when the layer cache is cold), so they
  # run on their own with a long limit; their tests carry their own timeouts.
  (
    cd "$HERE/js" || exit 1
    rc=0
    files=()
    for f in ./*.test.mjs; do
      case "$f" in
        ./code_interpreter.test.mjs | ./templates.test.mjs) ;;
        *) files+=("$f") ;;
      esac
    done
    node --test --test-concurrency=1 --test-timeout=90000 "${files[@]}" || rc=1
    node --test --test-timeout=1500000 ./code_interpreter.test.mjs || rc=1
    node --test --test-timeout=900000 ./templates.test.mjs || rc=1
    exit $rc
  )
  js_rc=$?
fi

if [ $py_rc -ne 0 ] || [ $js_rc -ne 0 ]; then
  echo "compat: FAILED (python rc=$py_rc, js rc=$js_rc)" >&2
  exit 1
fi
echo "compat: all passed" >&2
