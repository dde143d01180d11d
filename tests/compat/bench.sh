#!/usr/bin/env bash
# Benchmarks `husk serve` through the stock Python E2B SDK (e2b==2.63.0) and plain HTTP; see
# tests/compat/python/bench_server.py for what is measured. Figures are printed, not asserted.
#
#   cargo build --release && tests/compat/bench.sh          # the full run (as root)
#   tests/compat/bench.sh --iterations 5 --seconds 1 --size-mb 8   # a quick one
#
# The server binary is $HUSK_BIN, else the release build if there is one, else the debug build.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
"$HERE/setup.sh" >&2
if [ -z "${HUSK_BIN:-}" ]; then
  HUSK_BIN="$ROOT/target/x86_64-unknown-linux-gnu/release/husk"
  [ -x "$HUSK_BIN" ] || HUSK_BIN="$ROOT/target/x86_64-unknown-linux-gnu/debug/husk"
fi
export HUSK_BIN
unset E2B_API_KEY E2B_ACCESS_TOKEN E2B_DOMAIN E2B_API_URL E2B_SANDBOX_URL E2B_DEBUG E2B_HTTP_VERSION
export NO_PROXY=127.0.0.1,localhost no_proxy=127.0.0.1,localhost
cd "$HERE/python"
exec .venv/bin/python bench_server.py "$@"
