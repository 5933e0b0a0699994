"""Calibrate the dry run's per-stage activation memory under pipeline parallel against real
pipeline steps on CPU.

Two gloo processes train the debug model with PP 2 (the trainer itself, as `./run_train.sh`
builds it); each reports the peak, during its second step, of the bytes autograd holds saved for
backward (saved-tensor hooks; each storage counted once, parameters excluded, released when the
last reference to the saved tensor goes), next to what `titanlite.planning.dry_run.plan` predicts for the
same rank ("activations (saved)"). torch's MemTracker cannot follow a module called once per
micro-batch, hence the hooks; they see what backward keeps, not short-lived temporaries.

    python scripts/calibrate_pipeline_memory.py                 # 1F1B and GPipe, the docs' table
    python scripts/calibrate_pipeline_memory.py --schedules GPipe --local-batch 8
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import weakref
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from titanlite.core.arguments import ArgumentParser, int_arg  # noqa: E402

MIB = 2**20


def job_args(schedule: str, local_batch: int, seq_len: int) -> list[str]:
    return [
        "--config",
        str(ROOT / "train_configs" / "debug_model.toml"),
        "--eval.enabled",
        "false",
        "--parallelism.pipeline_parallel_degree",
        "2",
        "--parallelism.pipeline_parallel_schedule",
        schedule,
        "--training.local_batch_size",
        str(local_batch),
        "--training.seq_len",
        str(seq_len),
        "--metrics.enable_tensorboard",
        "false",
    ]


def _rank(rank: int, port: int, argv: list[str], out: str) -> None:
    import torch

    from titanlite.preflight import checks as preflight
    from titanlite.trainer.trainer import Trainer

    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
    )
    job, pre = preflight.run([*argv, "--job.dump_folder", f"{out}/run"], 2)
    trainer = Trainer(job, pre)
    data = iter(trainer.dataloader)
    trainer.train_step(trainer.next_microbatches(data))  # optimizer state and stage shapes exist
    params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}
    live: dict[int, list[int]] = {}  # storage -> [bytes, saved tensors alive]
    usage = {"now": 0, "peak": 0}

    def release(ptr: int) -> None:
        live[ptr][1] -= 1
        if live[ptr][1] == 0:
            usage["now"] -= live.pop(ptr)[0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr = t.untyped_storage().data_ptr()
        if ptr in params or ptr == 0:
            return t
        if ptr in live:
            live[ptr][1] += 1
        else:
            live[ptr] = [t.untyped_storage().nbytes(), 1]
            usage["now"] += live[ptr][0]
            usage["peak"] = max(usage["peak"], usage["now"])
        weakref.finalize(t, release, ptr)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainer.train_step(trainer.next_microbatches(data))
    measured = usage["peak"]
    Path(out, f"rank{rank}.json").write_text(json.dumps({"measured": measured}))
    trainer.close()


def measure(schedule: str, local_batch: int, seq_len: int) -> list[dict]:
    import torch.multiprocessing as mp

    sys.path.insert(0, str(ROOT / "tests"))
    from helpers import free_port

    from titanlite.config import loader as config
    from titanlite.planning.dry_run import plan

    argv = job_args(schedule, local_batch, seq_len)
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank, args=(free_port(), argv, out), nprocs=2, start_method="spawn")
        measured = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    rows = []
    for rank in range(2):
        b = plan(config.load(argv), 2, rank=rank, device_type="cpu").bytes
        predicted = b["activations (saved)"]
        rows.append({"rank": rank, "measured": measured[rank]["measured"], "predicted": predicted})
    return rows


def main() -> None:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--schedules", nargs="+", default=["1F1B", "GPipe"])
    p.add_argument("--local-batch", type=int_arg(1, 2**20), default=8)
    p.add_argument("--seq-len", type=int_arg(1, 2**24), default=256)
    a = p.parse_args()
    print(
        "| schedule | stage | measured saved peak (MiB) | predicted (MiB) | predicted / measured |"
    )
    print("|---|---:|---:|---:|---:|")
    for schedule in a.schedules:
        for r in measure(schedule, a.local_batch, a.seq_len):
            print(
                f"| {schedule} | {r['rank']} | {r['measured'] / MIB:.1f} | "
                f"{r['predicted'] / MIB:.1f} | {r['predicted'] / r['measured']:.2f} |"
            )


if __name__ == "__main__":
    main()
