#!/usr/bin/env bash
# The lint step of CI (bash run.sh lint): ruff (rules and format), the import contracts, mypy.
# Each runs; the step fails when any of them does. Tools from $VENV (default .venv).
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bin=${VENV:-.venv}/bin
bin=$(cd "$bin" && pwd)
status=0
echo "lint: ruff check" >&2
"$bin/ruff" check . || status=1
echo "lint: ruff format --check" >&2
"$bin/ruff" format --check . || status=1
tree=$(bash tools/staged_tree.sh)
trap 'rm -rf "$tree"' EXIT
echo "lint: import contracts (lint-imports)" >&2
(cd "$tree" && PYTHONPATH="$tree" "$bin/lint-imports" --no-cache --no-logo "$root/pyproject.toml") || status=1
echo "lint: mypy" >&2
# paths printed as they are in the repository (somnus/schemas/x.py is schemas/x.py)
(cd "$tree" && PYTHONPATH="$tree" "$bin/mypy" --config-file "$root/pyproject.toml" --cache-dir /dev/null -p somnus) \
  | sed -E 's#^somnus/(schemas|streams|processors|projections)/#\1/#' || status=1
exit $status
