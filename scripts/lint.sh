#!/usr/bin/env bash
# The static gates CI runs before the tests: lint, formatting, types, the import layers
# (import-linter's contracts in pyproject.toml) and no import circle. Each failure fails the run.
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
run "$PYTHON" -c "import sys; from importlinter.cli import lint_imports_command; sys.argv[0] = 'lint-imports'; lint_imports_command()" --no-cache
run "$PYTHON" scripts/import_cycles.py
exit "$status"
