#!/usr/bin/env bash
# Reproduce docs/images/tensorboard.png: a TensorBoard (Time Series) screenshot of a short
# debug-model run.
#   scripts/tb_screenshot.sh [DUMP_FOLDER] [OUT_PNG]
# DUMP_FOLDER (default /tmp/tbshot): if it has no tb/ folder yet, a 30-step debug run is trained
#   there first (OMP_NUM_THREADS=1 ./run_train.sh --training.steps 30 --job.dump_folder ...).
# OUT_PNG (default docs/images/tensorboard.png).
# Environment: TB_PORT (default 6006), CHROMIUM (default: chromium, chromium-browser or
#   google-chrome from PATH; on Debian/Ubuntu: apt-get install chromium).
# No network needed: TensorBoard is served on localhost and read by headless Chromium.
set -euo pipefail
cd "$(dirname "$0")/.."

dump="${1:-/tmp/tbshot}"
out="${2:-docs/images/tensorboard.png}"
port="${TB_PORT:-6006}"

browser="${CHROMIUM:-}"
if [[ -z "$browser" ]]; then
    for b in chromium chromium-browser google-chrome; do
        if command -v "$b" >/dev/null 2>&1; then browser="$b"; break; fi
    done
fi
[[ -n "$browser" ]] || { echo "tb_screenshot: no chromium found (apt-get install chromium)" >&2; exit 1; }

if [[ ! -d "$dump/tb" ]]; then
    OMP_NUM_THREADS=1 ./run_train.sh --training.steps 30 --job.dump_folder "$dump"
fi

tensorboard --logdir "$dump/tb" --port "$port" --bind_all >"$dump/tensorboard.log" 2>&1 &
tb_pid=$!
trap 'kill "$tb_pid" 2>/dev/null || true' EXIT

for _ in $(seq 60); do
    if curl -sf "http://localhost:$port/data/runs" >/dev/null; then break; fi
    kill -0 "$tb_pid" 2>/dev/null || { cat "$dump/tensorboard.log" >&2; exit 1; }
    sleep 1
done

# Query parameters: light theme, SVG line charts (with the default WebGL renderer, headless
# Chromium drew some charts empty), no smoothing, and a tag filter for the main curves.
filter='%5E(loss%7Cthroughput%2Ftps%7Coptim%7Cmemory%7Ctime%2Fstep_s)'
url="http://localhost:$port/?darkMode=false&forceSVG=true&smoothing=0&tagFilter=$filter#timeseries"

mkdir -p "$(dirname "$out")"
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1420 \
    --virtual-time-budget=20000 --screenshot="$out" "$url"
ls -l "$out"
