#!/usr/bin/env bash
# Installs what husk's E2B-SDK compatibility suite needs, idempotently:
#   - Debian packages, only if missing: python3-venv (when python3 cannot make a venv),
#     nodejs/npm (when `node`/`npm` are missing), openssl (the cluster tests' certificates);
#   - python/.venv with the pinned stock SDKs (e2b==2.63.0, e2b-code-interpreter==2.11.5) and
#     pytest (python/requirements.txt);
#   - js/node_modules with the pinned stock SDKs (e2b@2.51.0, @e2b/code-interpreter@2.8.0) via
#     `npm ci` (js/package-lock.json).
# A stamp file per environment records the hash of its lock file, so a second run does nothing.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY_DIR="$HERE/python"
JS_DIR="$HERE/js"
VENV="$PY_DIR/.venv"

log() { echo "compat/setup: $*" >&2; }

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need Debian packages ($*) but not running as root; install them and retry"
    exit 1
  fi
  log "installing $*"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

need=()
if ! command -v python3 >/dev/null 2>&1; then
  need+=(python3 python3-venv)
elif ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
  need+=(python3-venv)
fi
if ! command -v node >/dev/null 2>&1; then
  need+=(nodejs)
  command -v npm >/dev/null 2>&1 || need+=(npm)
elif ! command -v npm >/dev/null 2>&1; then
  need+=(npm)
fi
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then
  apt_install "${need[@]}"
fi

# e2b@2.51.0 declares engines.node ">=20.18.1 <21 || >=22" (Debian 12's nodejs 18 is too old).
node -e '
  const [maj, min, pat] = process.versions.node.split(".").map(Number);
  const ok = maj >= 22 || (maj === 20 && (min > 18 || (min === 18 && pat >= 1)));
  if (!ok) {
    console.error(`compat/setup: node ${process.versions.node} is too old: e2b@2.51.0 needs >=20.18.1 <21 || >=22`);
    process.exit(1);
  }
'

hash_of() { sha256sum "$@" | sha256sum | cut -d' ' -f1; }

# --- Python -----------------------------------------------------------------------------------
py_stamp="$(hash_of "$PY_DIR/requirements.txt")"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1 \
   && [ "$(cat "$VENV/.husk-compat-stamp" 2>/dev/null)" = "$py_stamp" ]; then
  :
else
  if [ -d "$VENV" ] && ! "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "removing a broken venv at $VENV"
    rm -rf "$VENV"
  fi
  [ -d "$VENV" ] || { log "creating $VENV"; python3 -m venv "$VENV"; }
  log "installing pinned Python packages"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$PY_DIR/requirements.txt"
  "$VENV/bin/python" -c '
import importlib.metadata as m
for name, want in (("e2b", "2.63.0"), ("e2b-code-interpreter", "2.11.5")):
    have = m.version(name)
    assert have == want, f"{name} is {have}, want {want}"
'
  echo "$py_stamp" > "$VENV/.husk-compat-stamp"
fi

# --- JavaScript -------------------------------------------------------------------------------
js_stamp="$(hash_of "$JS_DIR/package.json" "$JS_DIR/package-lock.json")"
if [ "$(cat "$JS_DIR/node_modules/.husk-compat-stamp" 2>/dev/null)" != "$js_stamp" ]; then
  log "running npm ci in $JS_DIR"
  (cd "$JS_DIR" && npm ci --no-audit --no-fund --loglevel=error)
  node -e '
    const want = { "e2b": "2.51.0", "@e2b/code-interpreter": "2.8.0" }
    for (const [name, v] of Object.entries(want)) {
      const have = require(`${process.argv[1]}/node_modules/${name}/package.json`).version
      if (have !== v) { console.error(`${name} is ${have}, want ${v}`); process.exit(1) }
    }
  ' "$JS_DIR"
  echo "$js_stamp" > "$JS_DIR/node_modules/.husk-compat-stamp"
fi
