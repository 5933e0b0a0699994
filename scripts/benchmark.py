"""Time titanlite's real training step against a bare PyTorch loop, in the same process.

Why: a framework earns its keep only if it costs (almost) nothing per step. The only honest
way to show that on a shared, noisy machine is to run both sides in one process, on one
machine state, interleaved: titanlite's Trainer (built by preflight + Trainer exactly as
`python -m titanlite.train` builds it, data from its real StatefulDataLoader included) and a
hand-written loop over the same model, optimizer, loss and clipping fed from tokens already in
memory. Warm-up steps first, then alternating timed rounds (A B, B A, A B, ...); the median
tokens/s of each side and their ratio are reported, with two noise checks: the median of the
per-round (paired) ratios, and the ratio on process CPU time, which another process competing
for the cores barely moves (its share shows as "CPU utilization" well below 1).

Each workload runs in a fresh subprocess (`--one NAME`): a process can create the default
process group only once, and a fresh process also keeps one workload's allocator and thread
state from leaking into the next.

    python scripts/benchmark.py                          # all workloads, markdown table
    python scripts/benchmark.py --workloads debug --steps 5 --rounds 2 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

DEBUG_TOML = ROOT / "train_configs" / "debug_model.toml"

# ~100M parameters with the bundled 512-token vocabulary: 14 blocks of dim 768 (the GPT-2 small
# width) land at 99.9M; memory_benchmark.py imports this so both scripts mean the same model.
MODEL_100M = ["--model.dim", "768", "--model.n_layers", "14", "--model.n_heads", "12"]

# name -> (titanlite overrides on top of debug_model.toml, default timed steps per round, what).
# Steps per round are sized so that a round lasts seconds, not milliseconds: long enough that
# timer resolution and one-off hiccups do not matter, short enough that rounds interleave.
WORKLOADS: dict[str, tuple[list[str], int, str]] = {
    "debug": ([], 5, "debug_model.toml as is: debugmodel, seq 256, batch 8"),
    "torchtitan_debug": (
        [
            "--training.seq_len",
            "2048",
            "--training.local_batch_size",
            "8",
            "--training.mixed_precision_param",
            "float32",
            "--activation_checkpoint.mode",
            "none",
            "--optimizer.name",
            "AdamW",
            "--optimizer.implementation",
            "fused",
            "--optimizer.lr",
            "8e-4",
        ],
        1,
        "TorchTitan's debug run, CPU-sized: debugmodel, seq 2048, batch 8, fp32, no AC",
    ),
    "100m": (
        MODEL_100M + ["--training.seq_len", "256", "--training.local_batch_size", "2"],
        2,
        "dim 768, 14 layers, 12 heads, vocab 512: seq 256, batch 2",
    ),
}


def run_one(name: str, steps: int, rounds: int, warmup: int, threads: int) -> dict[str, Any]:
    """Build both sides for one workload in this process, time them, return the figures."""
    # Both sides must see the same intra-op thread pool; set it before any parallel work.
    import torch

    torch.set_num_threads(threads)
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT))
    from models.llama import Transformer, num_params
    from titanlite.components.optim import build_optimizer
    from titanlite.preflight import checks as preflight
    from titanlite.trainer.trainer import Trainer

    # A leftover torchrun environment would make Trainer join a group that does not exist.
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)
    overrides, _, what = WORKLOADS[name]
    total_steps = warmup + steps * rounds
    with tempfile.TemporaryDirectory(prefix="titanlite-bench-") as dump:
        argv = [
            "--config",
            str(DEBUG_TOML),
            "--eval.enabled",
            "false",
            "--job.dump_folder",
            dump,
            "--training.seed",
            "0",
            # No per-step metrics are written in the timed path; TensorBoard would only
            # add start-up time and files.
            "--metrics.enable_tensorboard",
            "false",
            # The LR schedule spans exactly the steps run, as in a real job.
            "--training.steps",
            str(total_steps),
            *overrides,
        ]
        job, pre = preflight.run(argv, 1)
        trainer = Trainer(job, pre)
        try:
            args, t = pre.model_args, job.training
            tokens_per_step = t.local_batch_size * t.seq_len * pre.grad_accum_steps

            # The bare side: same shapes, same init, same optimizer groups, nothing else.
            bare = Transformer(args)
            bare.init_weights(trainer.seed)
            bare.train()
            bare_params = [p for p in bare.parameters() if p.requires_grad]
            bare_opt = build_optimizer(bare, job.optimizer)
            n_params = num_params(args)
            assert n_params == sum(p.numel() for p in bare_params), "num_params != the model"
            gen = torch.Generator().manual_seed(0)
            # A handful of distinct batches, so the loop does not train on one batch forever.
            pool = []
            for _ in range(4):
                w = torch.randint(
                    args.vocab_size, (t.local_batch_size, t.seq_len + 1), generator=gen
                )
                pool.append((w[:, :-1].contiguous(), w[:, 1:].contiguous()))

            def bare_step(i: int) -> torch.Tensor:
                inputs, labels = pool[i % len(pool)]
                bare_opt.zero_grad(set_to_none=True)
                logits = bare(inputs)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
                loss.backward()
                torch.nn.utils.clip_grad_norm_(bare_params, t.max_norm, foreach=True)
                bare_opt.step()
                return loss.detach()

            data_iter = iter(trainer.dataloader)

            def titan_step(_: int) -> torch.Tensor:
                loss, _grad_norm, _lr = trainer.train_step(trainer.next_microbatches(data_iter))
                return loss

            def timed(step_fn, n: int) -> tuple[float, float]:
                """(wall seconds, process CPU seconds) for n steps."""
                gc.collect()
                start, cpu = time.perf_counter(), time.process_time()
                for i in range(n):
                    loss = step_fn(i)
                loss.item()  # waits for the device (on CPU the work is already done)
                return time.perf_counter() - start, time.process_time() - cpu

            print(
                f"[{name}] {what}; {n_params:,} parameters, {tokens_per_step:,} tokens/step, "
                f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
                f"inter-op threads {torch.get_num_interop_threads()}",
                flush=True,
            )
            # Trainer.train() runs with the cyclic GC off; do the same for both sides so a
            # collection never lands inside one side's round only.
            gc.disable()
            (w_titan, _), (w_bare, _) = timed(titan_step, warmup), timed(bare_step, warmup)
            print(
                f"[{name}] warm-up {warmup} steps: titanlite {w_titan:.2f}s, bare {w_bare:.2f}s",
                flush=True,
            )
            titan_tps, bare_tps, data_s, cpu_util, cpu_tps = [], [], [], [], []
            for r in range(rounds):
                # A B, then B A: a load that rises or falls over the run hits both sides alike.
                if r % 2:
                    wall_b, cpu_b = timed(bare_step, steps)
                d0 = trainer.clock.totals["data"]
                wall_t, cpu_t = timed(titan_step, steps)
                data_s.append((trainer.clock.totals["data"] - d0) / steps)
                if not r % 2:
                    wall_b, cpu_b = timed(bare_step, steps)
                titan_tps.append(steps * tokens_per_step / wall_t)
                bare_tps.append(steps * tokens_per_step / wall_b)
                # Tokens per CPU-second barely move when another process takes the cores, so
                # their ratio separates "titanlite does more work" from "the machine was busy".
                cpu_tps.append((steps * tokens_per_step / cpu_t, steps * tokens_per_step / cpu_b))
                # CPU seconds per wall second per thread: well below 1 means another process
                # held the cores during the round, so its wall-clock figure is mostly noise.
                cpu_util.append((cpu_t / wall_t / threads, cpu_b / wall_b / threads))
                print(
                    f"[{name}] round {r + 1}/{rounds}: titanlite {titan_tps[-1]:,.0f} tok/s "
                    f"(data {1e3 * data_s[-1]:.1f} ms/step, cpu util {cpu_util[-1][0]:.2f}), "
                    f"bare {bare_tps[-1]:,.0f} tok/s (cpu util {cpu_util[-1][1]:.2f}), "
                    f"ratio {titan_tps[-1] / bare_tps[-1]:.3f}, "
                    f"CPU-time ratio {cpu_tps[-1][0] / cpu_tps[-1][1]:.3f}",
                    flush=True,
                )
            gc.enable()
        finally:
            trainer.close()
    med_t, med_b = statistics.median(titan_tps), statistics.median(bare_tps)
    return {
        "workload": name,
        "what": what,
        "params": n_params,
        "tokens_per_step": tokens_per_step,
        "seq_len": t.seq_len,
        "local_batch_size": t.local_batch_size,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "steps_per_round": steps,
        "rounds": rounds,
        "warmup_steps": warmup,
        "titanlite_tps_rounds": titan_tps,
        "bare_tps_rounds": bare_tps,
        "titanlite_data_ms_per_step_rounds": [1e3 * x for x in data_s],
        "cpu_utilization_rounds": cpu_util,
        "tokens_per_cpu_second_rounds": cpu_tps,
        "titanlite_tps": med_t,
        "bare_tps": med_b,
        "ratio": med_t / med_b,
        "ratio_paired_median": statistics.median(a / b for a, b in zip(titan_tps, bare_tps)),
        "cpu_time_ratio": (
            statistics.median(a for a, _ in cpu_tps) / statistics.median(b for _, b in cpu_tps)
        ),
        "min_cpu_utilization": min(min(pair) for pair in cpu_util),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| workload | params | tokens/step | titanlite tok/s | bare tok/s | ratio |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['workload']} | {r['params']:,} | {r['tokens_per_step']:,} | "
            f"{r['titanlite_tps']:,.0f} | {r['bare_tps']:,.0f} | {r['ratio']:.3f} |"
        )
    lines += [
        "",
        "| workload | median of paired ratios | CPU-time ratio | lowest CPU utilization |",
        "|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['workload']} | {r['ratio_paired_median']:.3f} | "
            f"{r['cpu_time_ratio']:.3f} | {r['min_cpu_utilization']:.2f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--workloads",
        default=",".join(WORKLOADS),
        help=f"comma-separated, from {', '.join(WORKLOADS)} (default: all)",
    )
    ap.add_argument(
        "--steps",
        type=int_arg(1, 10**9),
        default=None,
        help="timed steps per round and side (default: per workload, "
        + ", ".join(f"{k} {v[1]}" for k, v in WORKLOADS.items())
        + ")",
    )
    ap.add_argument(
        "--rounds", type=int_arg(1, 10**9), default=3, help="timed rounds per side (default 3)"
    )
    # One step allocates everything (activations, Adam state, the first tokenized text);
    # from the second step on, a step is what every later step will be.
    ap.add_argument(
        "--warmup",
        type=int_arg(1, 10**9),
        default=1,
        help="untimed steps per side first (default 1)",
    )
    ap.add_argument(
        "--threads",
        type=int_arg(1, 2**16),
        default=len(os.sched_getaffinity(0)),
        help="torch intra-op threads (default: the CPUs this process may use)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument(
        "--one",
        choices=list(WORKLOADS),
        default=None,
        help="run a single workload in this process (what the parent runs per child)",
    )
    ap.add_argument("--result-file", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    unknown = [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        result = run_one(
            args.one, args.steps or WORKLOADS[args.one][1], args.rounds, args.warmup, args.threads
        )
        if args.result_file:
            args.result_file.write_text(json.dumps(result))
        else:
            print(table([result]))
        if args.json:
            args.json.write_text(json.dumps([result], indent=2) + "\n")
        return 0

    results = []
    # OpenMP reads its thread count at start-up; set it for the child before torch loads.
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="titanlite-bench-") as tmp:
        for name in args.workloads.split(","):
            out = Path(tmp) / f"{name}.json"
            cmd = [
                sys.executable,
                str(Path(__file__).resolve()),
                "--one",
                name,
                "--rounds",
                str(args.rounds),
                "--warmup",
                str(args.warmup),
                "--threads",
                str(args.threads),
                "--result-file",
                str(out),
            ]
            if args.steps:
                cmd += ["--steps", str(args.steps)]
            proc = subprocess.run(cmd, cwd=ROOT, env=env)
            if proc.returncode != 0:
                print(
                    f"benchmark: workload {name} failed (exit {proc.returncode})", file=sys.stderr
                )
                return 1
            results.append(json.loads(out.read_text()))
    print()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
