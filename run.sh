#!/usr/bin/env bash
# Somnus developer entry point.
#   bash run.sh demo   # set everything up (venv, packages, Kafka jars) and run the pipeline on sample data
#   bash run.sh test   # set everything up, lint, and run the whole test suite (unit + integration, real broker)
#   bash run.sh lint   # ruff, the import contracts (import-linter) and mypy (tools/lint.sh)
#   bash run.sh test-unit  # the unit tests alone (no broker), for daily work
#   bash run.sh setup  # only set up
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${SOMNUS_VENV:-.venv}

# One line per step; a step's own output is shown only when it fails.
quiet() {
  local what=$1; shift
  local log; log=$(mktemp)
  echo "setup: $what" >&2
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"
    echo "setup: $what failed" >&2
    return 1
  fi
  rm -f "$log"
}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    quiet "virtualenv $VENV" "$PY" -m venv "$VENV"
  fi
  quiet "pip" "$VENV/bin/python" -m pip install -q --upgrade pip
  quiet "packages (pip install -e .[test])" "$VENV/bin/python" -m pip install -q -e '.[test]'
  quiet "Kafka jars (Maven, once)" "$VENV/bin/somnus" broker fetch
}

cmd=${1:-demo}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/somnus" demo "$@" ;;
  lint) setup; VENV="$VENV" exec bash tools/lint.sh ;;
  test)
    # Lint, then the whole suite, in two processes: the unit tier, then the integration tier (real
    # broker). pytest exits 5 when no test was collected: that is a failure here, not a pass.
    setup
    set +e
    VENV="$VENV" bash tools/lint.sh
    lint=$?
    "$VENV/bin/python" -m pytest -p no:cacheprovider -m "not integration" "$@"
    unit=$?
    "$VENV/bin/python" -m pytest -p no:cacheprovider -m integration "$@"
    integration=$?
    set -e
    echo "lint: exit $lint; unit tier: exit $unit; integration tier: exit $integration"
    [ "$lint" -eq 0 ] && [ "$unit" -eq 0 ] && [ "$integration" -eq 0 ] ;;
  test-unit)
    # The quick tier for daily work: unit tests only, no broker, in parallel processes (pytest-xdist;
    # many tests wait on threads and subprocesses, so more processes than cores). The CI tier stays serial.
    setup
    exec "$VENV/bin/python" -m pytest -p no:cacheprovider -m "not integration" -n "${SOMNUS_TEST_PROCS:-4}" "$@" ;;
  *) echo "usage: bash run.sh [setup|demo|lint|test|test-unit] [args...]" >&2; exit 2 ;;
esac
