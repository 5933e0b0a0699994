#!/usr/bin/env bash
# Run the whole test suite (unit, distributed on gloo, end to end). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_installed.sh
titanlite_ensure_installed "dev,float8" "torch torchdata tokenizers tensorboard numpy pyarrow pytest pytest_timeout torchao transformers safetensors ruff mypy importlinter grimp datasets wandb matplotlib ray" || {
    echo "titanlite: error: installation failed; see the pip output above" >&2; exit 1; }
exec "$PYTHON" -m pytest "$@"
