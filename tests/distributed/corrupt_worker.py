"""A rank's module for `python -m titanlite.rank corrupt_worker ARGS` under titanlite.launch: it
trains through titanlite's own entry point (titanlite.cli.main: the one line and the exit
code), but on rank CORRUPT_RANK alone the model's output at forward number CORRUPT_FORWARD turns
to NaN, as one bad batch or one faulty device would make it. At close every rank saves its
local parameters (its FSDP shards) to DUMP/rank{r}_params.pt, so a test can tell whether any
rank applied the bad step's update.

    CORRUPT_RANK=1 CORRUPT_FORWARD=3 PYTHONPATH=tests/distributed \\
        python -m titanlite.launch --nproc_per_node 2 ... -m titanlite.rank corrupt_worker ARGS
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from titanlite import cli
from titanlite.trainer.trainer import Trainer


def main(argv: list[str]) -> int:
    rank, at = int(os.environ["CORRUPT_RANK"]), int(os.environ["CORRUPT_FORWARD"])
    build, close = Trainer._build_model, Trainer.close

    def build_and_corrupt(self) -> None:
        build(self)
        if int(os.environ["RANK"]) != rank:
            return
        calls = 0

        def corrupt(module, args, output):
            nonlocal calls
            calls += 1
            return output * float("nan") if calls == at else output

        self.model.register_forward_hook(corrupt)

    def save_and_close(self) -> None:
        params = {
            name: (p.to_local() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in self.model.named_parameters()
        }
        folder = Path(self.job.job.dump_folder)
        torch.save(params, folder / f"rank{os.environ['RANK']}_params.pt")
        close(self)

    Trainer._build_model, Trainer.close = build_and_corrupt, save_and_close  # type: ignore[method-assign]
    return cli.main(argv)
