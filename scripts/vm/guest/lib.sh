# shellcheck shell=bash disable=SC2034  # sourced: the variables are used by its callers
# Shared by the guest's check scripts (sourced): where things are, recording results, running
# husk with a deadline, and what "left behind" means.
V="${HUSK_VM_DIR:-/var/lib/husk-vm}"
P="$V/payload"
R="$V/results"
H=/usr/local/bin/husk
VENV_PY=/opt/husk-vm/venv/bin/python
# Settings from scripts/test-vm (HUSK_VM_KINDS, TEMPLATE_NAME, TEMPLATE_STATE).
# shellcheck disable=SC1091
[ -f "$P/config" ] && . "$P/config"
# The kinds that run the whole SDK check (the others a smoke of it, should TCG get too slow):
# all of them by default (a full check takes seconds once the server works).
FULL_SDK_KINDS="${HUSK_VM_FULL_SDK_KINDS:-scope service login script script-deleg container}"
# The template built on the host and carried in (see scripts/test-vm), set by the payload's
# config; the directory exists only if the build worked.
TEMPLATE_NAME="${TEMPLATE_NAME:-vmt-busybox}"
TEMPLATE_STATE="${TEMPLATE_STATE:-$V/template-state}"

# record KIND CHECK ok|FAIL|skip [DETAIL]: one line of results.tsv (read by the host after
# poweroff), echoed to the console so that the host's console log shows progress.
record() {
  local d="${4:-}"
  d="${d//$'\t'/ }"; d="${d//$'\n'/ | }"; d="${d:0:600}"
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$d" >>"$R/results.tsv"
  printf 'HUSK-VM: [%6.0fs] %-13s %-15s %-4s %s\n' "$(cut -d' ' -f1 /proc/uptime)" "$1" "$2" "$3" "${d:0:160}" \
    >/dev/console 2>/dev/null || true
}

# What husk runs under: nothing, or (the "scope" kind) a delegated transient scope of its own.
HUSK_WRAP=()

# hr NAME SECONDS ARGS...: runs husk with ARGS under a deadline; stdout in $L/NAME.out (and
# $OUT), stderr in $L/NAME.err; returns husk's exit status (124 from `timeout` means the
# deadline, which the --timeout check tells apart by the duration).
hr() {
  local name="$1" secs="$2"; shift 2
  local rc=0
  { printf '+ husk'; printf ' %q' "$@"; echo; } >"$L/$name.err"
  timeout -k 10 "$secs" "${HUSK_WRAP[@]}" "$H" "$@" >"$L/$name.out" 2>>"$L/$name.err" </dev/null || rc=$?
  OUT="$(cat "$L/$name.out")"
  ERR_TAIL="$(grep -v "^+ husk " "$L/$name.err" | tail -n 3 | tr "\n" " ")"
  return "$rc"
}

# What husk may leave behind, one line each: cgroups, mounts (outside the state dirs of these
# checks, whose workspace mounts stay by design), processes of the husk binary, network links,
# nftables tables. (Files in /run/husk are not counted: husk keeps caches there.) Compared before and after a host kind's checks.
leftover_state() {
  # A husk cgroup that holds the caller's own processes (the leaf husk moves a delegated unit's
  # other processes into) lives as long as they do, by design; empty ones must be gone.
  local c pid husky procs
  find /sys/fs/cgroup -mindepth 1 -type d -ipath '*husk*' 2>/dev/null | while read -r c; do
    procs="$(cat "$c/cgroup.procs" 2>/dev/null)"  # (cgroup files have no size: no test -s)
    if [ -n "$procs" ]; then
      husky=""
      for pid in $procs; do
        [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$H"* ]] && husky=1
      done
      [ -z "$husky" ] && continue
    fi
    echo "cgroup $c"
  done
  awk -v v="$V" 'index($5, v) != 1 && /husk/ { print "mount " $5 }' /proc/self/mountinfo
  # (find reads the links itself: a readlink per process takes seconds under TCG.)
  local p
  find /proc -mindepth 2 -maxdepth 2 -name exe -lname "$H*" 2>/dev/null | while read -r p; do
    p="${p%/exe}"
    echo "process ${p#/proc/} $(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
  done
  ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print "link " $2 }'
  nft list tables 2>/dev/null | sed 's/^/nft /'
}

# Unmounts everything at or below DIR (deepest first) and removes it.
remove_tree() {
  local dir="$1" m
  awk -v d="$dir" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$dir"
}
