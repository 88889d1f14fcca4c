#!/usr/bin/env bash
# `make newcomer`: what a newcomer does. Clones this repository's committed HEAD into a temporary
# directory and runs the README's first two commands there, as the README writes them, one after the
# other in one shell; fails when either fails. Each command's time is printed, and the log is kept.
#
#   bash tools/newcomer.sh           # with this machine's caches (warm: minutes)
#   bash tools/newcomer.sh --cold    # first empties them: everything downloaded and built from nothing
#
# --cold deletes the caches a fresh machine has not got: the dev tooling's ($QWEN_OPERATOR_CACHE or
# ~/.cache/qwen-operator: binaries, images, the vLLM venv, the real node's image store), Go's module
# and build caches and pip's cache. They fill again during the run, so the next run is warm. Debian
# packages and the Go toolchain stay (a newcomer installs those by hand, README "Quickstart").
# Not part of CI: cold, the two commands take about an hour on 2 cores.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
COLD=0
[[ ${1:-} == --cold ]] && COLD=1
# The README's first ```bash block: its command lines, comments dropped.
mapfile -t COMMANDS < <(awk '/^```bash$/ {inside=1; next} inside && /^```/ {exit} inside' "$HERE/README.md" |
  sed 's/[[:space:]]*#.*$//' | grep -v '^[[:space:]]*$')
if [[ ${#COMMANDS[@]} -ne 2 ]]; then
  echo "[newcomer] the README's first bash block has ${#COMMANDS[@]} commands, not 2: ${COMMANDS[*]}" >&2
  exit 1
fi
WORK=$(mktemp -d /tmp/qwen-newcomer.XXXXXX)
LOG="$WORK/newcomer.log"
say() { printf '[newcomer] %s (%s)\n' "$1" "$(date +%H:%M:%S)" | tee -a "$LOG"; }
# Dev clusters started from another checkout would refuse this one (and one holds the real node).
if [[ -x $HERE/.venv/bin/python ]]; then
  for name in demo test test-real; do
    (cd "$HERE" && .venv/bin/python -m qwen_devtools.devcluster down --name "$name" >/dev/null 2>&1) || true
  done
fi
if [[ $COLD == 1 ]]; then
  cache=$(python3 "$HERE/operator/qwen_devtools/cache.py")
  say "--cold: removing $cache, $(go env GOMODCACHE), $(go env GOCACHE) and pip's cache"
  go clean -modcache  # its files are read-only
  rm -rf "$cache" "$(go env GOCACHE)" "${XDG_CACHE_HOME:-$HOME/.cache}/pip"
fi
git clone -q --no-tags "$HERE" "$WORK/qwen-operator"
cd "$WORK/qwen-operator"
say "clone of $(git rev-parse --short HEAD) in $PWD; running: ${COMMANDS[*]}"
started=$SECONDS
for command in "${COMMANDS[@]}"; do
  say "\$ $command"
  t0=$SECONDS
  set +e
  bash -c "$command" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  set -e
  say "$command: rc $rc in $((SECONDS - t0)) s"
  if [[ $rc -ne 0 ]]; then
    say "FAILED: $command (log: $LOG)"
    exit "$rc"
  fi
done
say "both commands passed in $((SECONDS - started)) s$([[ $COLD == 1 ]] && echo ', cold') (log: $LOG)"
# `make test` stopped the demo and its own clusters; nothing of this clone is left running.
