"""Train one real step under torchrun and write each rank's parameter, gradient and optimizer
bytes (as the dry run counts them) to OUT.rank<R>.json.

    torchrun --nproc_per_node N tests/distributed/state_bytes_worker.py OUT [--section.key value ...]
"""

import json
import os
import sys

import torch.distributed as dist

from titanlite.planning.dry_run import state_bytes
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    job, pre = preflight.run(argv, int(os.environ.get("WORLD_SIZE", "1")))
    trainer = Trainer(job, pre)
    try:
        trainer.train_step(trainer.next_microbatches(iter(trainer.dataloader)))
        sizes = state_bytes(trainer.model, trainer.optimizer)
        with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
            json.dump(sizes, f)
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
