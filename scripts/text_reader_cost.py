"""What the text reader costs each rank, and the training thread, side by side in one run.

Readers (on real gloo process groups, one process per rank, pure data parallel):

  alone        every rank tokenizes the whole global stream itself, on the training thread
               (the reader before the tokenizing was shared)
  world_sync   the ranks share tokenizing, ids all-gathered over WORLD, on the training thread
               (the reader before issue 27 item 7)
  dp_thread    the ranks share tokenizing within their data-parallel group, on a gloo group of
               its own, on the reader's thread a few refills ahead (the reader now)

For each: tokens tokenized per rank per step, and the seconds per step the training thread
waits for data while a stand-in step of --step-ms runs between batches (a sleep: what the host
does while the GPU computes a step); data share = wait / (wait + step), from the second batch
on (the first waits for the first refill with every reader, and is given apart). Each rank reads
`--local-batch` windows of `--seq-len` per step, as in training with a fixed local batch, so the
global batch grows with the degree.

    python scripts/text_reader_cost.py [--degrees 1 2 4] [--steps 300] [--seq-len 256]
        [--local-batch 8] [--step-ms 20] [--project 64] [--json out.json]

--train REV: the real thing instead, at the debug shape: ./run_train.sh with its defaults
(train_configs/debug_model.toml, CPU) on NGPU=--nproc ranks for --train-steps steps, from a copy
of commit REV (`git archive`, nothing installed) and from this tree, in alternating rounds. The
data share of a run is sum(data_loading_pct x step_time_s) / sum(step_time_s) over rank 0's
metrics.jsonl, for all steps and for steps 2 on (step 1 waits for the first refill either way).

    python scripts/text_reader_cost.py --train d61aef9 [--rounds 2] [--train-steps 40] [--nproc 2]

The corpus is the bundled one repeated (--copies), so that the stream does not wrap every few
steps. On a machine with fewer cores than ranks the seconds are shared CPU time; the token counts
are exact either way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Also sets one tokenizer thread per process, as a rank with its cores busy would have.
from data_benchmark import make_corpus  # noqa: E402

from titanlite.core.arguments import ArgumentParser, float_arg, int_arg  # noqa: E402

MODES = ("alone", "world_sync", "dp_thread")
KEYS = ("tokens_tokenized_per_step", "first_wait_s", "wait_s_per_step", "data_share")


def _loader(mode: str, rank: int, world: int, args: argparse.Namespace):
    import torch.distributed as dist

    from titanlite.data import Tokenizer, build_dataloader, list_files
    from titanlite.data.split_tokenize import exchange_group
    from titanlite.data.tokenizer import BUILTIN_TOKENIZER

    group = None
    if world > 1 and mode == "world_sync":
        group = dist.group.WORLD
    elif mode == "dp_thread":
        group = exchange_group([list(range(world))])  # pure data parallel: one dp group
    return build_dataloader(
        list_files(Path(args.corpus)),
        Tokenizer(BUILTIN_TOKENIZER),
        seq_len=args.seq_len,
        local_batch_size=args.local_batch,
        dp_rank=rank,
        dp_size=world,
        seed=0,
        tokenize_groups=[group],
        prefetch=mode == "dp_thread",
    )


def _rank(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {}
    for mode in MODES:
        loader = _loader(mode, rank, world, args)
        it = iter(loader)
        dist.barrier()
        waits = []
        for _ in range(args.steps):
            start = time.perf_counter()
            next(it)
            waits.append(time.perf_counter() - start)
            time.sleep(args.step_ms / 1e3)
        # The first batch waits for the first refill whatever the reader (nothing was read
        # ahead yet): told apart from the steady state.
        wait, steps = sum(waits[1:]), args.steps - 1
        result[mode] = {
            "tokens_tokenized_per_step": loader.dataset.encoder.tokens_tokenized / args.steps,
            "first_wait_s": waits[0],
            "wait_s_per_step": wait / steps,
            "data_share": wait / (wait + args.step_ms / 1e3 * steps),
        }
        loader.dataset.close()
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def measure(world: int, args: argparse.Namespace) -> dict:
    import torch.multiprocessing as mp

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import free_port

    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank, args=(world, free_port(), args, out), nprocs=world, start_method="spawn"
        )
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]
    return {
        mode: {key: statistics.mean(r[mode][key] for r in ranks) for key in KEYS} for mode in MODES
    }


def reader_table(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        args.corpus = str(make_corpus(Path(tmp), args.copies))
        rows = {w: measure(w, args) for w in args.degrees}
    share = args.local_batch * (args.seq_len + 1)
    print(
        f"own share: {share:,} tokens per rank per step (local batch x (seq_len + 1)); "
        f"stand-in step {args.step_ms:g} ms"
    )
    print("degree | tokenized/rank/step: " + " | ".join(MODES) + " | x own share: dp_thread")
    print(
        "       | training-thread wait ms/step from step 2 (data share); first batch s: "
        + " | ".join(MODES)
    )
    for w, r in rows.items():
        tok = " | ".join(f"{r[m]['tokens_tokenized_per_step']:,.0f}" for m in MODES)
        print(f"{w:6d} | {tok} | {r['dp_thread']['tokens_tokenized_per_step'] / share:.2f}")
        wait = " | ".join(
            f"{1e3 * r[m]['wait_s_per_step']:.2f} ({100 * r[m]['data_share']:.1f}%); "
            f"{r[m]['first_wait_s']:.2f}"
            for m in MODES
        )
        print(f"       | {wait}")
    # Projection: alone tokenizes the global stream (degree x share); shared, its share (the
    # measured ratio to the share at the largest degree carries over).
    top = rows[max(rows)]["dp_thread"]["tokens_tokenized_per_step"] / share
    print(
        f"projected at degree {args.project}: alone {args.project * share:,} tokens per rank per "
        f"step, shared {top * share:,.0f} (x{top:.2f} the share); at seq 8192, local batch 1: "
        f"alone {args.project * 8193:,}, shared {top * 8193:,.0f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in rows.items()}, indent=1))


def _train_once(tree: Path, folder: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "NGPU": str(args.nproc), "PYTHONPATH": str(tree)}
    cmd = [
        "./run_train.sh",
        "--training.steps",
        str(args.train_steps),
        "--job.dump_folder",
        str(folder),
        "--metrics.enable_tensorboard",
        "false",
    ]
    subprocess.run(cmd, cwd=tree, env=env, check=True, capture_output=True)
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]

    def share(rs: list[dict]) -> float:
        wall = sum(r["step_time_s"] for r in rs)
        return sum(r["data_loading_pct"] * r["step_time_s"] for r in rs) / wall

    return {
        "data_share_pct": share(records),
        "data_share_pct_from_step2": share(records[1:]),
        "data_s": sum(r["data_loading_pct"] / 100 * r["step_time_s"] for r in records),
        "step_s_median": statistics.median(r["step_time_s"] for r in records[1:]),
        "tps_median": statistics.median(r["tps"] for r in records[1:]),
    }


def train_table(args: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp, "before")
        before.mkdir()
        archive = subprocess.run(
            ["git", "archive", args.train], cwd=ROOT, check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        trees = {"before": before, "after": ROOT}
        for r in range(args.rounds):
            for side in ("before", "after") if r % 2 == 0 else ("after", "before"):
                got = _train_once(trees[side], Path(tmp, f"{side}{r}"), args)
                results[side].append(got)
                print(f"  round {r + 1} {side}: {json.dumps(got)}", file=sys.stderr)
    print(
        f"./run_train.sh defaults, NGPU={args.nproc} (CPU), {args.train_steps} steps, "
        f"before = {args.train}, after = this tree; medians of {args.rounds} rounds"
    )
    print("side | data share (all steps) | data share (steps 2+) | data s | step s | tok/s")
    for side, runs in results.items():
        m = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        print(
            f"{side} | {m['data_share_pct']:.3f}% | {m['data_share_pct_from_step2']:.3f}% | "
            f"{m['data_s']:.2f} | {m['step_s_median']:.2f} | {m['tps_median']:,.0f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def main() -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--degrees", type=int_arg(1, 2**20), nargs="+", default=[1, 2, 4])
    p.add_argument("--steps", type=int_arg(2, 10**9), default=300)
    p.add_argument("--seq-len", type=int_arg(1, 2**24), default=256)
    p.add_argument("--local-batch", type=int_arg(1, 2**20), default=8)
    p.add_argument("--step-ms", type=float_arg(0, 1e3 * 30 * 24 * 3600), default=20.0)
    p.add_argument("--copies", type=int_arg(1, 10**6), default=20)
    p.add_argument("--project", type=int_arg(1, 2**24), default=64, help="degree to project to")
    p.add_argument("--train", metavar="REV", help="measure ./run_train.sh: REV against this tree")
    p.add_argument("--rounds", type=int_arg(1, 10**9), default=2)
    p.add_argument("--train-steps", type=int_arg(2, 10**9), default=40)
    p.add_argument("--nproc", type=int_arg(1, 2**24), default=2)
    p.add_argument("--json")
    args = p.parse_args()
    if args.train:
        train_table(args)
    else:
        reader_table(args)


if __name__ == "__main__":
    main()
