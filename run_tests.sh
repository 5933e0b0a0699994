#!/usr/bin/env bash
# Run the whole test suite (unit, distributed on gloo, end to end). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_installed.sh
titanlite_ensure_installed "dev,float8" "torch torchdata tokenizers tensorboard numpy pyarrow pytest pytest_timeout xdist torchao transformers safetensors ruff mypy importlinter grimp datasets wandb matplotlib ray lm_eval accelerate" || {
    echo "titanlite: error: installation failed; see the pip output above" >&2; exit 1; }
# Two test modules at a time by default (pytest-xdist; each module stays in one worker, so its
# module fixtures run once): one module at a time kept 2 cores only 68% busy on average.
# TITANLITE_TEST_WORKERS sets another count; 0 (or `-n 0` among the arguments) runs in this
# process, which `-s` and pdb need.
workers="${TITANLITE_TEST_WORKERS:-$("$PYTHON" -c 'import os; print(min(4, max(2, os.cpu_count() or 1)))')}"
exec "$PYTHON" -m pytest -n "$workers" --dist loadscope "$@"
