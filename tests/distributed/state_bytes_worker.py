"""Train one real step and write each rank's parameter, gradient and optimizer bytes (as the dry
run counts them) to OUT.rank<R>.json: `helpers.spawn(write_state_bytes, N, OUT, argv)`."""

import json

import torch.distributed as dist

from titanlite.planning.dry_run import state_bytes
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def write_state_bytes(rank: int, world_size: int, out: str, argv: list[str]) -> None:
    job, pre = preflight.run(argv, world_size)
    trainer = Trainer(job, pre)
    try:
        trainer.train_step(trainer.next_microbatches(iter(trainer.dataloader)))
        sizes = state_bytes(trainer.model, trainer.optimizer)
        with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
            json.dump(sizes, f)
    finally:
        trainer.close()
