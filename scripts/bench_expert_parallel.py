"""Expert parallel on CPU: tokens/s and per-rank memory of the MoE debug preset on 4 ranks
(gloo) at a fixed global batch, with the experts split over 1 (FSDP 4 alone), 2 and 4 ranks,
side by side in one run: rounds alternate the order of the degrees, so that a busy machine
slows all alike; the medians and their ratios to EP 1 are reported.

    python scripts/bench_expert_parallel.py                  # 2 rounds of 20 steps
    python scripts/bench_expert_parallel.py --rounds 3 --steps 30 --seq 256

Per degree: the median tokens/s per rank over the steps after the first 3 (rank 0's, as the
trainer logs it), rank 0's peak resident memory (the process's, torch and gloo included), and
the dry run's plan of the same job for this world (titanlite/planning; bytes of the experts'
states, of what FSDP gathers, of the all-to-all buffers). What CPU shows is the dispatch's cost
(two all-to-alls and a host sync per MoE layer and micro-batch, through gloo's TCP), not a GPU's
trade of all-to-all against FSDP all-gathers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEGREES = (1, 2, 4)
WORLD = 4


def job_args(ep: int, steps: int, seq: int, batch: int) -> list[str]:
    return [
        "--config",
        "qwen3_moe_debug.toml",
        "--parallelism.expert_parallel_degree",
        str(ep),
        "--training.steps",
        str(steps),
        "--training.seq_len",
        str(seq),
        "--training.local_batch_size",
        str(batch),
        "--metrics.enable_tensorboard",
        "false",
    ]


def train(ep: int, args: argparse.Namespace, folder: Path) -> tuple[float, float]:
    """(median tokens/s per rank after the first 3 steps, peak resident GiB of rank 0)."""
    argv = [*job_args(ep, args.steps, args.seq, args.batch), "--job.dump_folder", str(folder)]
    env = {**os.environ, "NGPU": str(WORLD)}
    subprocess.run(
        ["./run_train.sh", *argv], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL
    )
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tps" in r]
    return statistics.median(r["tps"] for r in steps[3:]), max(r["memory_gib"] for r in steps)


def planned(ep: int, args: argparse.Namespace) -> dict[str, float]:
    from titanlite.config import loader as config
    from titanlite.planning.dry_run import plan

    p = plan(config.load(job_args(ep, args.steps, args.seq, args.batch)), WORLD, device_type="cpu")
    gib = 2**30
    return {
        "experts": p.moe["expert weights + grads + optimizer"] / gib,
        "gathered": p.bytes.get("FSDP unsharded params/grads", 0) / gib,
        "all-to-all": p.bytes.get("all-to-all buffers (EP, balanced)", 0) / gib,
        "total": p.total / gib,
    }


def main() -> int:
    p = ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int_arg(1, 10**9), default=2)
    p.add_argument("--steps", type=int_arg(4, 10**9), default=20)
    p.add_argument("--seq", type=int_arg(1, 2**24), default=256)
    p.add_argument(
        "--batch", type=int_arg(1, 2**20), default=2, help="local batch: x 4 ranks = global"
    )
    args = p.parse_args()
    tps: dict[int, list[float]] = {ep: [] for ep in DEGREES}
    rss: dict[int, list[float]] = {ep: [] for ep in DEGREES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = DEGREES if round_ % 2 == 0 else tuple(reversed(DEGREES))
            for ep in order:
                speed, memory = train(ep, args, Path(tmp) / f"ep{ep}_{round_}")
                tps[ep].append(speed)
                rss[ep].append(memory)
                print(f"round {round_ + 1} EP {ep}: {speed:,.0f} tok/s per rank", file=sys.stderr)
    plans = {ep: planned(ep, args) for ep in DEGREES}
    base = statistics.median(tps[1])
    print(
        f"{WORLD} ranks (gloo, CPU), global batch {WORLD * args.batch} x {args.seq}, "
        f"{args.rounds} rounds of {args.steps} steps\n"
    )
    print(
        "| EP | tok/s per rank (median) | vs EP 1 | peak RSS rank 0 | planned: expert states | "
        "FSDP gathered | all-to-all | total |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for ep in DEGREES:
        speed, q = statistics.median(tps[ep]), plans[ep]
        print(
            f"| {ep} | {speed:,.0f} | {speed / base:.2f} | {max(rss[ep]):.2f} GiB | "
            f"{q['experts'] * 1024:.1f} MiB | {q['gathered'] * 1024:.1f} MiB | "
            f"{q['all-to-all'] * 1024:.1f} MiB | {q['total'] * 1024:.0f} MiB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
