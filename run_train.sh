#!/usr/bin/env bash
# Train with torchrun on this node.
#   ./run_train.sh [--config NAME|PATH] [--section.key value ...]
# Environment:
#   NGPU      processes per node (default: number of visible CUDA GPUs, else 1)
#   LOG_RANK  comma-separated ranks whose output is shown (default 0)
#   CONFIG    config file when --config is not given (default train_configs/debug_model.toml)
#   MAX_RESTARTS  times torchrun restarts the whole group after a rank fails (default 0); the
#             restarted group resumes from the latest checkpoint
#   STOP_GRACE_SECONDS  how long, after SIGTERM/SIGUSR1 reaches torchrun, the ranks get to finish
#             the step and save a checkpoint before torchrun kills them (default 300)
#   PYTORCH_ALLOC_CONF  the CUDA allocator's settings (default expandable_segments:True; left
#             alone when it or the legacy PYTORCH_CUDA_ALLOC_CONF is set)
# --dry-run [--dry-run.world_size N] [--dry-run.device_memory_gib 80]: plan without training
#   (world size default: NGPU x NNODES); see docs/dry_run.md
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_installed.sh
titanlite_ensure_installed "" "torch torchdata tokenizers tensorboard" || {
    echo "titanlite: error: installation failed; see the pip output above" >&2; exit 1; }

config="${CONFIG:-train_configs/debug_model.toml}"
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --config) [[ $# -ge 2 ]] || { echo "titanlite: error: --config needs a value" >&2; exit 2; }
                  config="$2"; shift 2 ;;
        --config=*) config="${1#--config=}"; shift ;;
        *) args+=("$1"); shift ;;
    esac
done
# A bare preset name (llama_8b.toml) means the one in train_configs/.
if [[ ! -e "$config" && "$config" != */* && -e "train_configs/$config" ]]; then
    config="train_configs/$config"
fi

# --dry-run: plan the launch (layout, memory, FLOPs) in one process with a fake process group.
for a in ${args[@]+"${args[@]}"}; do
    if [[ "$a" == "--dry-run" ]]; then
        exec "$PYTHON" -m titanlite.dry_run --config "$config" "${args[@]}"
    fi
done

if [[ -z "${NGPU:-}" ]]; then
    # Counted without importing torch (seconds saved on every launch).
    if [[ -n "${CUDA_VISIBLE_DEVICES+x}" ]]; then
        NGPU=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .) || true
    elif command -v nvidia-smi >/dev/null 2>&1; then
        NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || true
    fi
    [[ "${NGPU:-0}" -ge 1 ]] || NGPU=1
fi
LOG_RANK="${LOG_RANK:-0}"

# Expandable segments let the CUDA caching allocator grow a segment in place instead of keeping
# many fixed-size ones half used: the fragmentation that the dry run's headroom no longer
# reserves for. torch 2.13 reads PYTORCH_ALLOC_CONF, and the legacy PYTORCH_CUDA_ALLOC_CONF
# first when that is set; a user's own value under either name is kept.
if [[ -z "${PYTORCH_ALLOC_CONF+x}" && -z "${PYTORCH_CUDA_ALLOC_CONF+x}" ]]; then
    export PYTORCH_ALLOC_CONF=expandable_segments:True
fi

# Validate the config and layout in one quick process first, so that a mistake is one line and
# exit code 2 instead of a torchrun traceback from every rank.
WORLD_SIZE="$NGPU" "$PYTHON" -m titanlite.preflight --config "$config" ${args[@]+"${args[@]}"}

# torchrun forwards SIGUSR1 too (a preemption notice; by default it would kill torchrun), and
# waits STOP_GRACE_SECONDS for the ranks' final checkpoint; see titanlite/components/preemption.py.
# titanlite.launch is torchrun in the same process (signals reach it as before) that ends with a
# failed rank's own line and exit code, keeping torchrun's report in job.dump_folder/torchrun.log.
exec "$PYTHON" -m titanlite.launch --nproc_per_node="$NGPU" --nnodes=1 --standalone \
    --max-restarts "${MAX_RESTARTS:-0}" --signals_to_handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 \
    --shutdown_timeout "${STOP_GRACE_SECONDS:-300}" --local-ranks-filter "$LOG_RANK" \
    -m titanlite.rank titanlite.train --config "$config" ${args[@]+"${args[@]}"}
