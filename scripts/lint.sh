#!/usr/bin/env bash
# The static gates CI runs before the tests: lint, formatting, types. Each failure fails the run.
#   scripts/lint.sh            (from a checkout where run_tests.sh has installed the dev extra)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
status=0
run() {
    echo "lint: $*" >&2
    "$@" || { echo "lint: FAILED: $*" >&2; status=1; }
}
run "$PYTHON" -m ruff check .
run "$PYTHON" -m ruff format --check .
run "$PYTHON" -m mypy
exit "$status"
