"""What would make the host wait for the device, or for every other rank, in a training step:
counted on CPU by watching the trainer's own loop (`HostSyncProbe`).

On CUDA a step runs ahead of the GPU unless the host reads a device value: `.item()`, `float()`,
`int()`, `bool()` (all `aten._local_scalar_dense`), `.tolist()`, `.numpy()`, `.cpu()`, and ops
whose output size depends on the data (`nonzero`, `masked_select`, `unique`, `repeat_interleave`
without `output_size`). On CPU these run without waiting, but they are the same calls, so the
probe sees them. A collective on the default (world) group that the host waits for
(`async_op=False`, or any object collective) stalls every rank on the slowest: counted too. The
mesh groups' collectives on device tensors are ordered on the GPU's streams by NCCL and do not
block the host, so they are not counted.

Events are filed under the step being trained (`trainer.train_state.step`): the data, the step
itself and every callback after it."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = {"titanlite", "parallelisms", "models"}
aten = torch.ops.aten
SYNCING_OPS = {
    aten._local_scalar_dense.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
}
SYNCING_METHODS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}
COLLECTIVES = [
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all_single",
    "barrier",
]
OBJECT_COLLECTIVES = ["all_gather_object", "broadcast_object_list", "gather_object"]


def _caller() -> str:
    """The innermost frame of the product's own code (titanlite, parallelisms, models)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if path.is_relative_to(ROOT) and path.parts[len(ROOT.parts)] in PRODUCT:
            return f"{path.relative_to(ROOT)}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


class _Ops(TorchDispatchMode):
    def __init__(self, record) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING_OPS or (
            func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None
        ):
            self.record(str(func))
        return func(*args, **kwargs)


class _Methods(TorchFunctionMode):
    def __init__(self, record) -> None:
        super().__init__()
        self.record = record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNCING_METHODS:
            self.record(f"Tensor.{func.__name__}")
        return func(*args, **(kwargs or {}))


class HostSyncProbe:
    def __init__(self, trainer) -> None:
        self.trainer = trainer
        self.events: dict[int, list[str]] = defaultdict(list)

    def record(self, what: str) -> None:
        self.events[self.trainer.train_state.step].append(f"{what} at {_caller()}")

    @contextlib.contextmanager
    def watching(self):
        with contextlib.ExitStack() as stack:
            for name in COLLECTIVES + OBJECT_COLLECTIVES:
                original = getattr(dist, name)
                stack.callback(setattr, dist, name, original)
                setattr(dist, name, self._watched(name, original))
            stack.enter_context(_Methods(self.record))
            stack.enter_context(_Ops(self.record))
            yield

    def _watched(self, name: str, original):
        @functools.wraps(original)
        def collective(*args, **kwargs):
            group = kwargs.get("group")
            world = group is None or group is dist.group.WORLD
            if name in OBJECT_COLLECTIVES:
                self.record(f"dist.{name}")
            elif world and not kwargs.get("async_op", False):
                self.record(f"dist.{name} (world, blocking)")
            return original(*args, **kwargs)

        return collective


def probed_train(trainer) -> HostSyncProbe:
    """Make `trainer.train()` run under a probe, which is returned."""
    probe, train = HostSyncProbe(trainer), trainer.train

    def watched(*args, **kwargs):
        with probe.watching():
            return train(*args, **kwargs)

    trainer.train = watched
    return probe
