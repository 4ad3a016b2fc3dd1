#!/usr/bin/env bash
# One `somnus bench e2e --events 100000` with py-spy sampling the worker and the projector (100 Hz,
# raw collapsed stacks): OUT.json (the bench), OUT.worker.txt, OUT.projector.txt.
# Usage: tools/profile_e2e.sh TREE OUT [VAR=value ...]   (py-spy in TREE/.venv: pip install py-spy)
set -uo pipefail
tree=$(cd "$1" && pwd) out=$2
shift 2
(cd "$tree" && env "$@" SOMNUS_HOME="$(mktemp -d)" .venv/bin/somnus bench e2e --events 100000 --json) \
  > "$out.json" 2> "$out.err" &
bench=$!
for _ in $(seq 1 300); do
  w=$(pgrep -f "$tree/.venv/bin/python[0-9.]* -m somnus.streams.worker" | head -1)
  p=$(pgrep -f "$tree/.venv/bin/python[0-9.]* -m somnus.projections.projector" | head -1)
  [ -n "$w" ] && [ -n "$p" ] && break
  sleep 0.2
done
"$tree/.venv/bin/py-spy" record -r 100 -p "$w" -f raw -o "$out.worker.txt" --nonblocking > /dev/null 2>&1 &
"$tree/.venv/bin/py-spy" record -r 100 -p "$p" -f raw -o "$out.projector.txt" --nonblocking > /dev/null 2>&1 &
wait "$bench"
sleep 2
