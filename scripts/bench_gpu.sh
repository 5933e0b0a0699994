#!/usr/bin/env bash
# The prepared session for one GPU, as two commands, each planned to fit 6 minutes on an H200
# (estimates: neither has run on a GPU yet):
#     bash scripts/bench_gpu.sh --checks-only   # scripts/gpu_check.py, checks (a)-(k): compiled
#         vs eager gradients, float8 vs bf16, async_with_pinned_mem resume, determinism, memory
#         snapshot, dry run vs allocator peak, block_causal training, context-parallel pieces,
#         a one-rank NCCL FSDP2 + DTensor step, every block_causal kernel vs an explicit masked
#         computation, a float8 checkpoint loaded without torchao;
#     bash scripts/bench_gpu.sh --bench-only    # scripts/bench_float8.py (bf16 vs float8
#         tensorwise, with and without compile, Llama-3-8B-shaped, a fixed 8 blocks: --layers N
#         to change it) and scripts/bench_attention.py --device cuda.
# Other arguments go to the script that runs (e.g. --only i,j,k; --steps 20). Each command
# prints its figures as it goes. Nothing is installed: the checkout's root goes on
# PYTHONPATH, so a copy of the tree on an offline machine that has torch runs as it is. torchdata
# and tokenizers must be importable too (torchao for the float8 parts); wheels of missing ones,
# put in .whl/ at the checkout's root, are unpacked onto the path (no pip, no network).
# Rehearse on CPU (the same code paths in tiny sizes; CUDA-only checks say SKIPPED):
#     bash scripts/bench_gpu.sh --smoke --checks-only     bash scripts/bench_gpu.sh --smoke --bench-only
# Writes under ${OUT:-.}: gpu_check/gpu_check.{json,txt} (+ logs/ of every run), bench_gpu.md,
# bench_attention.md; exits non-zero when a check fails or a benchmark variant does not run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if compgen -G ".whl/*.whl" >/dev/null; then
    deps="${TMPDIR:-/tmp}/titanlite_gpu_deps"
    for w in .whl/*.whl; do "$PYTHON" -m zipfile -e "$w" "$deps"; done
    export PYTHONPATH="$PYTHONPATH:$deps"
fi
mode="" smoke=() extra=() attention_args=(--device cuda) layers=(--layers 8)
for a in "$@"; do
    case "$a" in
        --checks-only | --bench-only) mode="$a" ;;
        --smoke) smoke=(--smoke); attention_args=(--quick); layers=() ;;
        --layers | --layers=*) layers=() ; extra+=("$a") ;;
        *) extra+=("$a") ;;
    esac
done
if [[ -z $mode ]]; then
    echo "bench_gpu: give --checks-only or --bench-only (each fits 6 minutes on one H200: run them as two commands)" >&2
    exit 2
fi
"$PYTHON" - <<'EOF' || exit 2
import importlib.util, sys
missing = [m for m in ("torch", "torchdata", "tokenizers", "numpy") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"bench_gpu: {', '.join(missing)} not importable by {sys.executable}; put their wheels in .whl/ (docs/performance.md)")
import torch
ao = importlib.util.find_spec("torchao") is not None
print(f"torch {torch.__version__}, CUDA {torch.cuda.is_available()}, torchao {'yes' if ao else 'absent: float8 parts SKIPPED'}", flush=True)
EOF
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
out="${OUT:-.}"
mkdir -p "$out"
status=0
start=$SECONDS
if [[ $mode == --checks-only ]]; then
    "$PYTHON" scripts/gpu_check.py ${smoke[@]+"${smoke[@]}"} --out "$out/gpu_check" \
        ${extra[@]+"${extra[@]}"} || status=1
else
    "$PYTHON" scripts/bench_float8.py ${smoke[@]+"${smoke[@]}"} ${layers[@]+"${layers[@]}"} \
        --out "$out/bench_gpu.md" ${extra[@]+"${extra[@]}"} || status=1
    echo "bench_gpu: float8 table written to $out/bench_gpu.md after $((SECONDS - start))s"
    "$PYTHON" scripts/bench_attention.py "${attention_args[@]}" --out "$out/bench_attention.md" || status=1
fi
echo "bench_gpu $mode: $((SECONDS - start))s, exit $status"
exit $status
