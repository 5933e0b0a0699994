"""A rank's module for `python -m titanlite.rank fault_worker ARGS` under titanlite.launch: it
trains through titanlite's own entry point (titanlite.cli.outcome: the exit code and the one
line, which titanlite.rank hands to the launcher) with one fault planted, chosen by FAULT, on
rank FAULT_RANK:

    nan_output       the model's output at forward number FAULT_AT turns to NaN, as one bad
                     batch or one faulty device would make it on one rank only
    slow_first_step  the first forward waits FAULT_SECONDS first (a slow compile or a late rank)
    slow_writer      the first checkpoint write waits FAULT_SECONDS first (a slow filesystem)
    slow_export      the Hugging Face export waits FAULT_SECONDS first (a large model); rank 0
                     is the one that exports
    slow_shard_check each shard of the start-up checksum pass waits FAULT_SECONDS first (one
                     rank's share of terabytes, or a slow disk)

At close every rank saves its local parameters (its FSDP shards) to DUMP/rank{r}_params.pt and
the timeout of each of its process groups to DUMP/rank{r}_timeouts.json.

    FAULT=nan_output FAULT_RANK=1 FAULT_AT=3 PYTHONPATH=tests/distributed \\
        python -m titanlite.launch --nproc_per_node 2 ... -m titanlite.rank fault_worker ARGS
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from helpers import group_timeouts
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.tensor import DTensor

from titanlite import cli
from titanlite.components.checkpoint import hf_training
from titanlite.components.checkpoint.storage import ChecksummingWriter
from titanlite.data.shards import ShardSet
from titanlite.trainer.trainer import Trainer


def _once_slow(fn, seconds: float):
    done = False

    def wrapper(*args, **kwargs):
        nonlocal done
        if not done:
            done = True
            time.sleep(seconds)
        return fn(*args, **kwargs)

    return wrapper


def outcome(argv: list[str]) -> tuple[int, str]:
    fault, mine = os.environ["FAULT"], int(os.environ["FAULT_RANK"]) == int(os.environ["RANK"])
    seconds = float(os.environ.get("FAULT_SECONDS", "0"))
    build, close = Trainer._build_model, Trainer.close

    def build_with_fault(self) -> None:
        build(self)
        if not mine:
            return
        if fault == "nan_output":
            at, calls = int(os.environ["FAULT_AT"]), 0

            def corrupt(module, args, output):
                nonlocal calls
                calls += 1
                return output * float("nan") if calls == at else output

            self.model.register_forward_hook(corrupt)
        elif fault == "slow_first_step":
            self.model.register_forward_pre_hook(_once_slow(lambda *a: None, seconds))

    def save_and_close(self) -> None:
        params = {
            name: (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in self.model.named_parameters()
        }
        folder, rank = Path(self.job.job.dump_folder), os.environ["RANK"]
        torch.save(params, folder / f"rank{rank}_params.pt")
        (folder / f"rank{rank}_timeouts.json").write_text(json.dumps(group_timeouts()))
        close(self)

    Trainer._build_model, Trainer.close = build_with_fault, save_and_close  # type: ignore[method-assign]
    if mine and fault == "slow_writer":
        ChecksummingWriter.write_data = _once_slow(FileSystemWriter.write_data, seconds)  # type: ignore[method-assign]
    if mine and fault == "slow_export":
        hf_training.dcp_to_hf = _once_slow(hf_training.dcp_to_hf, seconds)
    if mine and fault == "slow_shard_check":
        check = ShardSet.verify_checksums

        def slow_check(self, indices=None):
            time.sleep(seconds * len(self.shards if indices is None else indices))
            return check(self, indices)

        ShardSet.verify_checksums = slow_check  # type: ignore[method-assign]
    code, line = cli.outcome(argv)
    # How this rank itself ended: the launcher shows one rank's line, and a rank that only
    # failed because its peer stopped first would hide behind it.
    folder = Path(argv[argv.index("--job.dump_folder") + 1])
    (folder / f"rank{os.environ['RANK']}_outcome.json").write_text(json.dumps([code, line]))
    return code, line
