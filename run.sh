#!/usr/bin/env bash
# Somnus developer entry point.
#   bash run.sh demo   # set everything up (venv, packages, Kafka jars) and run the pipeline on sample data
#   bash run.sh test   # set everything up and run the whole test suite (unit + integration, real broker)
#   bash run.sh setup  # only set up
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
VENV=${SOMNUS_VENV:-.venv}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
  "$VENV/bin/python" -m pip install -q -e '.[test]'
  "$VENV/bin/somnus" broker fetch
}

cmd=${1:-demo}
shift || true
case "$cmd" in
  setup) setup ;;
  demo) setup; exec "$VENV/bin/somnus" demo "$@" ;;
  test)
    setup
    set +e
    "$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
    rc=$?
    set -e
    # pytest exits 5 when no test was collected: that is a failure here, not a pass.
    exit $rc ;;
  *) echo "usage: bash run.sh [setup|demo|test] [args...]" >&2; exit 2 ;;
esac
