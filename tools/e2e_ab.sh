#!/usr/bin/env bash
# Alternates `somnus bench e2e` between checkouts (each with its own .venv), one JSON line per run
# appended to OUT: tree, round, start (UTC), 1-minute load, events/s, CPU µs per event, peak RSS,
# the plain consumer's rate and the ratio.
# Usage: tools/e2e_ab.sh OUT ROUNDS EVENTS TREE [TREE ...] [-- VAR=value ...]
# The variables after -- are set for every run (e.g. SOMNUS_MULTIPART_RECORDS=true). Summarise with
# tools/e2e_ab_summary.py OUT. The machine is shared: alternate, and report medians with the loads.
set -uo pipefail
out=$1 rounds=$2 events=$3
shift 3
trees=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do trees+=("$(cd "$1" && pwd)"); shift; done
[ "${1:-}" = "--" ] && shift
for r in $(seq 1 "$rounds"); do
  for t in "${trees[@]}"; do
    home=$(mktemp -d)
    load=$(cut -d' ' -f1 /proc/loadavg)
    start=$(date -u +%H:%M:%S)
    res=$(cd "$t" && env "$@" SOMNUS_HOME="$home" .venv/bin/somnus bench e2e --events "$events" --json 2>/dev/null)
    python3 - "$res" "$t" "$r" "$start" "$load" >> "$out" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
print(json.dumps({"tree": sys.argv[2], "round": int(sys.argv[3]), "start": sys.argv[4], "load": float(sys.argv[5]),
                  "eps": d["events_per_s"], "cpu": d.get("cpu_us_per_event"), "rss": d.get("peak_rss_mb"),
                  "raw": d.get("raw_consume_per_s"), "ratio": d.get("ratio")}))
PY
    rm -rf "$home"
  done
done
