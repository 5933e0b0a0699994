#!/usr/bin/env bash
# Block-causal attention against TorchTitan on its own CPU recipe, runs back to back in rounds:
# TorchTitan (causal SDPA, which its CPU runner uses), titanlite causal, titanlite block_causal
# through masked SDPA (the default before attn_type "auto") and titanlite's default
# (block_causal through "auto", i.e. the per-document varlen kernel). Prints one SUMMARY line per
# run and a table of median tokens/s with each run's ratio to the same round's TorchTitan run.
# Usage: scripts/attention_vs_torchtitan.sh TOOL_DIR TT_VENV ROUNDS STEPS
#   TOOL_DIR: ../shared/tools/torchtitan_cpu (torchtitan_cpu.sh, titanlite_cpu.sh)
#   TT_VENV:  a venv with torch==2.13.0 and torchtitan==0.3.0 (see TOOL_DIR/README.md)
# titanlite runs from this checkout with the python on PATH.
set -euo pipefail
TOOL=${1:?tool dir}; TT_VENV=${2:?torchtitan venv}; ROUNDS=${3:-3}; STEPS=${4:-10}
HERE=$(cd "$(dirname "$0")/.." && pwd)
VENV=$(python -c "import sys; print(sys.prefix)")  # titanlite_cpu.sh runs $VENV/bin/python
declare -A ARGS=(
    [titanlite_causal]="--model.attn_mask_type causal"
    [titanlite_block_causal_sdpa]="--model.attn_type sdpa"
    [titanlite_block_causal_auto]=""
)
ORDER=(torchtitan titanlite_causal titanlite_block_causal_sdpa titanlite_block_causal_auto)
results=$(mktemp)
for round in $(seq 1 "$ROUNDS"); do
    for name in "${ORDER[@]}"; do
        if [[ $name == torchtitan ]]; then
            line=$("$TOOL/torchtitan_cpu.sh" "$TT_VENV" 1 "$STEPS" 2>&1 | grep SUMMARY)
        else
            # shellcheck disable=SC2086
            line=$("$TOOL/titanlite_cpu.sh" "$HERE" "$VENV" 1 "$STEPS" ${ARGS[$name]} 2>&1 | grep SUMMARY)
        fi
        tps=$(sed -E 's/.*median_tps[^=]*=([0-9,]+).*/\1/' <<<"$line" | tr -d ,)
        echo "round $round $name: $line"
        echo "$round $name $tps" >>"$results"
    done
done
python - "$results" <<'PY'
import collections, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
tps = {(int(r), n): float(t) for r, n, t in rows}
names = list(dict.fromkeys(n for _, n, _ in rows))
rounds = sorted({r for r, _ in tps})
print("\n| run | " + " | ".join(f"round {r} tokens/s (/ TorchTitan)" for r in rounds) + " | median ratio |")
print("|---" + "|---:" * (len(rounds) + 1) + "|")
for n in names:
    ratios = [tps[r, n] / tps[r, "torchtitan"] for r in rounds]
    cells = [f"{tps[r, n]:,.0f} ({x:.2f})" for r, x in zip(rounds, ratios)]
    print(f"| {n} | " + " | ".join(cells) + f" | {statistics.median(ratios):.2f} |")
PY
