"""Measure what FSDP2 keeps between micro-batches that do not reduce-scatter, through the
trainer's own step: `helpers.spawn(write_kept_bytes, N, OUT, argv)` writes each rank's
OUT.rank<R>.json with {"unsynced": bytes, "synced": bytes}.

The bytes are those of every tensor storage that an operation created during a micro-batch's
forward and backward and that is still alive after it (each storage once, at its size then: a
freed all-gather buffer counts 0): an account that knows nothing of FSDP's attributes. A whole
step runs first, so that FSDP's lazy initialization and the optimizer's state are not in it."""

import gc
import json

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from titanlite.components.loss import local_batch
from titanlite.preflight import checks as preflight
from titanlite.trainer.trainer import Trainer


def _is(t) -> bool:
    return isinstance(t, torch.Tensor)


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    return (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()


class NewStorages(TorchDispatchMode):
    """The storages that operations create while it is active, held weakly."""

    def __init__(self):
        super().__init__()
        self.seen = WeakIdKeyDictionary()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # A view or an in-place result shares an input's storage: created earlier, or seen then.
        given = {_storage(t).data_ptr() for t in pytree.tree_leaves((args, kwargs)) if _is(t)}
        for t in pytree.tree_leaves(out):
            if _is(t) and _storage(t).data_ptr() not in given:
                self.seen[_storage(t)] = True
        return out

    def live_bytes(self) -> int:
        gc.collect()
        sizes = {}
        for storage in list(self.seen.keys()):
            sizes[storage.data_ptr()] = max(sizes.get(storage.data_ptr(), 0), storage.nbytes())
        return sum(sizes.values())


def write_kept_bytes(rank: int, world_size: int, out: str, argv: list[str]) -> None:
    job, pre = preflight.run(argv, world_size)
    trainer = Trainer(job, pre)
    try:
        data = iter(trainer.dataloader)
        trainer.train_step(trainer.next_microbatches(data))
        step = trainer.train_step
        first, last = (
            local_batch(step.sequence_shards, x, y) for x, y in trainer.next_microbatches(data)
        )
        step.optimizer.zero_grad(set_to_none=True)
        with NewStorages() as new:
            step.forward_backward(first, torch.tensor(1.0), last=False)
            unsynced = new.live_bytes()
            step.forward_backward(last, torch.tensor(1.0), last=True)
            synced = new.live_bytes()
        with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
            json.dump({"unsynced": unsynced, "synced": synced}, f)
    finally:
        trainer.close()


def write_pipeline_kept_bytes(rank: int, world_size: int, out: str, argv: list[str]) -> None:
    """The same account under pipeline parallel, where torch's stage syncs once per step: taken
    when the schedule calls the stage's perform_reduce_grad, after every micro-batch's backward
    and before the reduce-scatter."""
    from torch.distributed.pipelining.stage import _PipelineStageBase

    job, pre = preflight.run(argv, world_size)
    trainer = Trainer(job, pre)
    reduce_grad = _PipelineStageBase.perform_reduce_grad
    try:
        data = iter(trainer.dataloader)
        trainer.train_step(trainer.next_microbatches(data))
        microbatches = trainer.next_microbatches(data)
        taken = []

        def account_then_reduce(stage, *args, **kwargs):
            taken.append(new.live_bytes())
            return reduce_grad(stage, *args, **kwargs)

        _PipelineStageBase.perform_reduce_grad = account_then_reduce  # type: ignore[method-assign]
        with NewStorages() as new:
            trainer.train_step(microbatches)
        with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
            json.dump({"before_reduce": taken}, f)
    finally:
        _PipelineStageBase.perform_reduce_grad = reduce_grad  # type: ignore[method-assign]
        trainer.close()
