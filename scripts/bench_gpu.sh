#!/usr/bin/env bash
# The prepared session for one GPU (planned to fit 10 minutes on an H200; not yet run on one):
#  1. the correctness pass, scripts/gpu_check.py: compiled vs eager per-parameter gradients,
#     float8 vs bf16 over 50 steps, async_with_pinned_mem save + bit-exact resume,
#     training.deterministic twice, a memory snapshot, the dry run vs the allocator's peak,
#     the default block_causal kernel vs masked SDPA over 20 steps, context parallel's
#     per-document pieces through flash varlen vs one masked SDPA;
#  2. the benchmark, scripts/bench_float8.py: bf16 vs float8 tensorwise, with and without
#     compile, on the largest Llama-3-8B-shaped model that fits one GPU;
#  3. scripts/bench_attention.py: forward + backward tokens/s and step peak memory of varlen
#     (the default) and compiled FlexAttention block_causal vs SDPA causal and SDPA
#     block_causal on 2 Llama-3-8B-shaped blocks, seq 8192.
# Rehearse on CPU first (the same code paths in tiny sizes; CUDA-only checks say SKIPPED):
#     bash scripts/bench_gpu.sh --smoke [--checks-only]
# On the GPU machine:
#     bash scripts/bench_gpu.sh [--checks-only | --bench-only] [--steps 30 --seq-len 8192 --memory-gib 120]
# Writes under ${OUT:-.}: gpu_check/gpu_check.{json,txt} (+ logs/ of every run) and
# bench_gpu.md, bench_attention.md; exits non-zero when a check fails or a benchmark variant
# does not run (a variant out of memory in bench_attention counts).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ensure_installed.sh
titanlite_ensure_installed "float8" "torch torchao" || { echo "bench_gpu: could not install titanlite[float8]" >&2; exit 1; }
checks=1 bench=1 smoke=() bench_args=() attention_args=(--device cuda)
for a in "$@"; do
    case "$a" in
        --checks-only) bench=0 ;;
        --bench-only) checks=0 ;;
        --smoke) smoke=(--smoke); bench_args+=("$a"); attention_args=(--quick) ;;
        *) bench_args+=("$a") ;;
    esac
done
out="${OUT:-.}"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
"$PYTHON" -c "import torch, torchao; print('torch', torch.__version__, 'torchao', torchao.__version__)"
status=0
start=$SECONDS
if [[ $checks == 1 ]]; then
    "$PYTHON" scripts/gpu_check.py ${smoke[@]+"${smoke[@]}"} --out "$out/gpu_check" || status=1
    echo "bench_gpu: correctness pass took $((SECONDS - start))s"
fi
if [[ $bench == 1 ]]; then
    "$PYTHON" scripts/bench_float8.py --out "$out/bench_gpu.md" ${bench_args[@]+"${bench_args[@]}"} || status=1
    echo "bench_gpu: table written to $out/bench_gpu.md"
    "$PYTHON" scripts/bench_attention.py "${attention_args[@]}" --out "$out/bench_attention.md" || status=1
fi
echo "bench_gpu: $((SECONDS - start))s in all, exit $status"
exit $status
