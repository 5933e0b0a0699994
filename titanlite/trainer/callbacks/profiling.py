"""The profiler's step and the CUDA memory snapshots (at their cadence and when a step runs out
of memory), each open from the start of training to its end."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from titanlite.components import profiling
from titanlite.config.schema import Profiling
from titanlite.trainer.callbacks.base import Callback


class _Opened(Callback):
    """Holds a context open from pre_train to post_train (or close, after an error)."""

    def __init__(self) -> None:
        self.stack = contextlib.ExitStack()

    def post_train(self) -> None:
        self.stack.close()

    def close(self) -> None:
        self.stack.close()


class Profiler(_Opened):
    def __init__(self, cfg: Profiling, dump_folder: Path, rank: int):
        super().__init__()
        self.cfg, self.dump_folder, self.rank = cfg, dump_folder, rank
        self.profiler: torch.profiler.profile | None = None

    def pre_train(self) -> None:
        self.profiler = self.stack.enter_context(
            profiling.maybe_profile(self.cfg, self.dump_folder, self.rank)
        )

    def post_step(self, step: int) -> None:
        if self.profiler is not None:
            self.profiler.step()


class MemorySnapshots(_Opened):
    def __init__(self, cfg: Profiling, dump_folder: Path, rank: int):
        super().__init__()
        self.cfg, self.dump_folder, self.rank = cfg, dump_folder, rank
        self.snapshots: profiling.MemorySnapshots | None = None

    def pre_train(self) -> None:
        self.snapshots = self.stack.enter_context(
            profiling.maybe_memory_snapshots(self.cfg, self.dump_folder, self.rank)
        )

    def post_step(self, step: int) -> None:
        if self.snapshots is not None:
            self.snapshots.step(step)

    def on_error(self, step: int, error: BaseException) -> None:
        """Out of memory: dump what filled the memory before the error unwinds."""
        if isinstance(error, torch.OutOfMemoryError) and self.snapshots is not None:
            self.snapshots.dump(f"iteration_{step}_oom")
