"""Run a short training under torchrun and record, on rank 0, every step's loss and the final
full weights (gathered from their shards and pipeline stages), for the layout-parity tests.

    torchrun --nproc_per_node N tests/distributed/train_worker.py OUT.pt [--section.key value ...]
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titanlite.core.logging import init_logger
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def main() -> None:
    init_logger()
    out, argv = sys.argv[1], sys.argv[2:]
    job, pre = preflight.run(argv, int(os.environ.get("WORLD_SIZE", "1")))
    trainer = Trainer(job, pre)
    try:
        records = trainer.train()
        weights = {}
        for name, p in trainer.model.named_parameters():
            full = p.full_tensor() if isinstance(p, DTensor) else p
            weights[name.replace("_checkpoint_wrapped_module.", "")] = full.detach().cpu().float()
        # Pipeline stages hold different parameters: rank 0 gathers every stage's.
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, weights)
        for part in everyone:
            weights.update(part)
        if dist.get_rank() == 0:
            torch.save(
                {
                    "losses": [r["loss"] for r in records],
                    "grad_norms": [r["grad_norm"] for r in records],
                    "weights": weights,
                },
                out,
            )
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
