#!/usr/bin/env bash
# GPU benchmark for docs/performance.md: bf16 vs float8 tensorwise, with and without compile, on
# the largest Llama-3-8B-shaped model that fits one GPU. Rehearse on CPU first:
#     bash scripts/bench_gpu.sh --smoke
# On the GPU machine (writes the table to ${OUT:-.}/bench_gpu.md as well as stdout):
#     bash scripts/bench_gpu.sh [--steps 30 --seq-len 8192 --memory-gib 120]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure_installed.sh
titanlite_ensure_installed "float8" "torch torchao" || { echo "bench_gpu: could not install titanlite[float8]" >&2; exit 1; }
out="${OUT:-.}/bench_gpu.md"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
python -c "import torch, torchao; print('torch', torch.__version__, 'torchao', torchao.__version__)"
python scripts/bench_float8.py --out "$out" "$@"
echo "table written to $out"
