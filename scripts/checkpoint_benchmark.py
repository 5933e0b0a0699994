"""How much a checkpoint save costs training, sync vs async, and how fast a checkpoint loads.

Why: an async save is only worth having if (a) training is blocked for a small fraction of a
synchronous save and (b) the steps that run while the background write is in flight are not
slowed much. Both are properties of the real code path, so this script measures them with
titanlite's own Trainer and CheckpointManager on a ~300M-parameter model (fp32, AdamW: model
+ optimizer state is ~3.6 GB), in one process:

  1. sync save  -- save(step, force_sync=True): training is blocked for the whole write;
                   bytes on disk and write GB/s.
  2. async save -- save(step) on the same state: blocked time (last_blocking_s, i.e. the copy
                   into host memory), then K training steps timed one by one while the
                   background write runs (pending.done() tells which ones overlapped) against
                   the median of K+K steps with no save in flight (before and after).
  3. load       -- CheckpointManager.load() of the async checkpoint (manifest CRC check +
                   shape check + DCP read). Its files are evicted from the page cache first
                   (posix_fadvise DONTNEED), unless --warm-load, so the read comes from disk.

The trainer is built once with --checkpoint.async_mode async (the mode is fixed at
construction); the sync save uses force_sync=True on the same manager, so both saves write the
same state to the same kind of files. Every save uses a new step number (1001, 1002, ...): the
manager refuses to overwrite a step-N it did not resume from. Repetitions report medians.
Default shape: seq 32 x batch 1, the smallest useful step; on a 2-core CPU a ~300M step is
still seconds (weight-bandwidth-bound matmuls and a 300M-parameter AdamW update).

    python scripts/checkpoint_benchmark.py --json ckpt.json
    python scripts/checkpoint_benchmark.py --dim 256 --n-layers 2 --n-heads 4 --steps 2 --reps 1
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

DEBUG_TOML = ROOT / "train_configs" / "debug_model.toml"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def evict(path: Path) -> None:
    """Drop the (already fsynced, hence clean) pages of these files from the page cache."""
    for f in path.rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def run(a: argparse.Namespace) -> dict:
    import torch

    if a.threads:
        torch.set_num_threads(a.threads)
    from models.llama import num_params
    from titanlite.components.checkpoint.folder import step_dir
    from titanlite.preflight import checks as preflight
    from titanlite.trainer.trainer import Trainer

    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(var, None)  # a leftover torchrun environment would confuse the Trainer
    dump = Path(a.workdir or tempfile.mkdtemp(prefix="titanlite-ckpt-bench-")) / "dump"
    argv = [
        "--config",
        str(DEBUG_TOML),
        "--eval.enabled",
        "false",
        "--job.dump_folder",
        str(dump),
        "--metrics.enable_tensorboard",
        "false",
        "--training.steps",
        "100000",
        "--model.dim",
        str(a.dim),
        "--model.n_layers",
        str(a.n_layers),
        "--model.n_heads",
        str(a.n_heads),
        "--training.seq_len",
        str(a.seq_len),
        "--training.local_batch_size",
        str(a.batch),
        "--training.mixed_precision_param",
        "float32",
        "--checkpoint.enable_checkpoint",
        "--checkpoint.interval",
        "1000000",
        "--checkpoint.async_mode",
        "async",
        "--checkpoint.keep_latest_k",
        "0",
    ]
    job, pre = preflight.run(argv, 1)
    trainer = Trainer(job, pre)
    ckpt = trainer.checkpointer
    n_params = num_params(pre.model_args)
    data_iter = iter(trainer.dataloader)

    def step() -> tuple[float, float]:
        """(wall s, process CPU s) of one training step."""
        t0, c0 = time.perf_counter(), time.process_time()
        loss, _, _ = trainer.train_step(trainer.next_microbatches(data_iter))
        loss.item()
        return time.perf_counter() - t0, time.process_time() - c0

    threads = torch.get_num_threads()
    print(
        f"{n_params:,} parameters; seq {a.seq_len} x batch {a.batch}; torch {torch.__version__}, "
        f"{threads} threads; checkpoints under {ckpt.folder}",
        flush=True,
    )
    gc.disable()  # as Trainer.train() does
    warm = [step()[0] for _ in range(a.warmup)]
    print(f"warm-up steps: {', '.join(f'{s:.2f}s' for s in warm)}", flush=True)
    next_step, reps = 1001, []
    try:
        for r in range(a.reps):
            base = [step() for _ in range(a.steps)]
            # 1. synchronous save: the whole write blocks training.
            sync_step, next_step = next_step, next_step + 1
            ckpt.save(sync_step, config_hash=trainer.config_hash, force_sync=True)
            sync_blocked = ckpt.last_blocking_s
            nbytes = dir_bytes(step_dir(ckpt.folder, sync_step))
            # 2. async save of the same state, then K steps while the write is in flight.
            async_step, next_step = next_step, next_step + 1
            ckpt.save(async_step, config_hash=trainer.config_hash)
            returned, async_blocked = time.perf_counter(), ckpt.last_blocking_s
            done_at: list[float] = []
            ckpt.pending.add_done_callback(lambda _f, d=done_at: d.append(time.perf_counter()))
            during, overlapped = [], 0
            for _ in range(a.steps):
                overlapped += not ckpt.pending.done()
                during.append(step())
            w0 = time.perf_counter()
            ckpt.wait()
            wait_s = time.perf_counter() - w0
            write_s = (done_at[0] if done_at else time.perf_counter()) - returned
            base += [step() for _ in range(a.steps)]
            # 3. load the async checkpoint (the newest complete one), from disk unless --warm-load.
            path = step_dir(ckpt.folder, async_step)
            async_bytes = dir_bytes(path)
            if not a.warm_load:
                evict(path)
            t0 = time.perf_counter()
            loaded = ckpt.load()
            load_s = time.perf_counter() - t0
            if not loaded or ckpt.resumed_from != async_step:
                raise RuntimeError(f"load() did not load step-{async_step} ({ckpt.resumed_from})")

            base_med = statistics.median(s for s, _ in base)
            ov = [s for s, _ in during[:overlapped]]
            slowdown = statistics.mean(ov) / base_med - 1 if ov else float("nan")
            rec = {
                "sync_step": sync_step,
                "async_step": async_step,
                "bytes": nbytes,
                "async_bytes": async_bytes,
                "sync_blocked_s": sync_blocked,
                "save_gbps": nbytes / sync_blocked / 1e9,
                "async_blocked_s": async_blocked,
                "blocked_ratio": async_blocked / sync_blocked,
                "async_write_s": write_s,
                "wait_after_steps_s": wait_s,
                "base_step_s": [s for s, _ in base],
                "during_step_s": [s for s, _ in during],
                "base_cpu_util": [c / s / threads for s, c in base],
                "during_cpu_util": [c / s / threads for s, c in during],
                "base_step_median_s": base_med,
                "overlapped_steps": overlapped,
                "step_slowdown": slowdown,
                "load_s": load_s,
                "load_gbps": async_bytes / load_s / 1e9,
            }
            reps.append(rec)
            print(
                f"rep {r + 1}/{a.reps}: {nbytes / 1e9:.2f} GB; sync blocked {sync_blocked:.2f}s "
                f"({rec['save_gbps']:.2f} GB/s); async blocked {async_blocked:.2f}s "
                f"(ratio {rec['blocked_ratio']:.3f}), write in background {write_s:.2f}s; "
                f"steps {', '.join(f'{s:.2f}' for s, _ in during)}s ({overlapped} overlapped) vs "
                f"median {base_med:.2f}s without -> slowdown {slowdown:+.1%}; "
                f"load {load_s:.2f}s ({rec['load_gbps']:.2f} GB/s)",
                flush=True,
            )
            for s in (sync_step, async_step):  # keep the disk from filling up; not timed
                shutil.rmtree(step_dir(ckpt.folder, s), ignore_errors=True)
        # Diagnostic: the part of the async blocked time spent staging the non-tensor state
        # (data-loader token buffer, RNG, scheduler, train state) rather than tensors.
        small = {
            k: v.state_dict() for k, v in ckpt.states.items() if k not in ("model", "optimizer")
        }
        t0 = time.perf_counter()
        ckpt._stage(small)
        stage_small_s = time.perf_counter() - t0
    finally:
        gc.enable()
        trainer.close()
        if not a.workdir:
            shutil.rmtree(dump.parent, ignore_errors=True)

    med = {
        k: statistics.median(r[k] for r in reps)
        for k in (
            "bytes",
            "sync_blocked_s",
            "async_blocked_s",
            "blocked_ratio",
            "step_slowdown",
            "save_gbps",
            "load_s",
            "load_gbps",
            "async_write_s",
            "base_step_median_s",
        )
    }
    return {
        "params": n_params,
        "seq_len": a.seq_len,
        "local_batch_size": a.batch,
        "dim": a.dim,
        "n_layers": a.n_layers,
        "n_heads": a.n_heads,
        "threads": threads,
        "torch": torch.__version__,
        "steps_per_phase": a.steps,
        "reps": a.reps,
        "cold_load": not a.warm_load,
        "stage_non_tensor_s": stage_small_s,
        "median": med,
        "repetitions": reps,
    }


def table(res: dict) -> str:
    m, n = res["median"], res["reps"]
    return "\n".join(
        [
            f"| metric (median of {n} repetition(s)) | value | target |",
            "|---|---:|---:|",
            f"| checkpoint size (model + AdamW state, {res['params']:,} params) | {m['bytes'] / 1e9:.2f} GB | |",
            f"| sync save: training blocked | {m['sync_blocked_s']:.2f} s | |",
            f"| async save: training blocked | {m['async_blocked_s']:.2f} s | |",
            f"| of which staging the non-tensor state (measured once) | {res['stage_non_tensor_s']:.2f} s | |",
            f"| blocked(async) / blocked(sync) | {m['blocked_ratio']:.1%} | <= 10% |",
            f"| async background write | {m['async_write_s']:.2f} s | |",
            f"| step time, no save in flight | {m['base_step_median_s']:.2f} s | |",
            f"| step slowdown during background write | {m['step_slowdown']:+.1%} | <= 20% |",
            f"| save throughput (sync) | {m['save_gbps']:.2f} GB/s | |",
            f"| load() throughput ({'cold' if res['cold_load'] else 'warm'} page cache) | "
            f"{m['load_gbps']:.2f} GB/s ({m['load_s']:.2f} s) | |",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    ap = ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--dim", type=int_arg(1, 2**20), default=1024)
    ap.add_argument("--n-layers", type=int_arg(1, 2**20), default=24)
    ap.add_argument("--n-heads", type=int_arg(1, 2**20), default=16)
    ap.add_argument("--seq-len", type=int_arg(1, 2**24), default=32)
    ap.add_argument("--batch", type=int_arg(1, 2**20), default=1, help="local batch size")
    ap.add_argument(
        "--steps",
        type=int_arg(1, 10**9),
        default=3,
        help="K: steps timed during the async write, and before and after it (default 3)",
    )
    ap.add_argument(
        "--threads",
        type=int_arg(0, 2**16),
        default=0,
        help="torch intra-op threads (default: torch's)",
    )
    ap.add_argument(
        "--warmup", type=int_arg(0, 10**9), default=2, help="untimed steps first (default 2)"
    )
    ap.add_argument(
        "--reps",
        type=int_arg(1, 10**9),
        default=2,
        help="repetitions; medians reported (default 2)",
    )
    ap.add_argument(
        "--warm-load",
        action="store_true",
        help="do not evict the checkpoint from the page cache before load()",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the dump folder goes (default: a fresh temp dir, removed at the end)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write all figures here")
    a = ap.parse_args(argv)
    res = run(a)
    print()
    print(table(res))
    if a.json:
        a.json.write_text(json.dumps(res, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
