#!/usr/bin/env bash
# Prints the path of a temporary copy of the package laid out as the wheel installs it: somnus/ with
# the design card's folders (schemas/, streams/, processors/, projections/) inside it (package-dir in
# pyproject.toml). import-linter and mypy read a package from one folder; the caller removes the copy.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=$(mktemp -d)
mkdir "$tree/somnus"
cp -r somnus/. "$tree/somnus/"
for d in schemas streams processors projections; do cp -r "$d" "$tree/somnus/$d"; done
find "$tree" -name __pycache__ -prune -exec rm -rf {} +
echo "$tree"
