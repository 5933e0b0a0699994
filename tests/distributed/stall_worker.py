"""Train under torchrun, but rank STALL_RANK stalls at step 2 just before its token embedding's
reduce-scatter (a TP-group collective), as a hung GPU or process would; its TP peer is left
waiting inside that collective. Only in the first attempt: a group torchrun restarts
(--max-restarts) trains normally. For the collective-timeout tests.

    torchrun --nproc_per_node 4 tests/distributed/stall_worker.py STALL_RANK [--section.key v ...]
"""

import os
import signal
import sys
import time

from titanlite.core.logging import init_logger
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def main() -> None:
    init_logger()
    stall_rank, argv = int(sys.argv[1]), sys.argv[2:]
    job, pre = preflight.run(argv, int(os.environ["WORLD_SIZE"]))
    trainer = Trainer(job, pre)
    calls = 0

    def stall(module, args):
        nonlocal calls
        calls += 1
        if calls == 2:
            # A hung rank runs no Python signal handler: let torchrun's SIGTERM end it.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            print(f"STALL_START {time.time():.3f}", file=sys.stderr, flush=True)
            time.sleep(600)

    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    if int(os.environ["RANK"]) == stall_rank and first_attempt:
        trainer.model.tok_embeddings.register_forward_pre_hook(stall)
    try:
        trainer.train()
    finally:
        trainer.close()


if __name__ == "__main__":
    main()
