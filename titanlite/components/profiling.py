"""torch.profiler traces every `profiling.profile_freq` steps, one Chrome trace per rank; and on
CUDA, allocator memory snapshots at the same cadence and when a step runs out of memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from titanlite.config.schema import Profiling
from titanlite.core.logging import logger


@contextlib.contextmanager
def maybe_profile(
    cfg: Profiling, dump_folder: Path, rank: int
) -> Iterator[torch.profiler.profile | None]:
    if not cfg.enable_profiling:
        yield None
        return
    trace_dir = dump_folder / cfg.save_traces_folder
    active = 1
    warmup = min(3, cfg.profile_freq - active)
    wait = cfg.profile_freq - active - warmup

    def save(prof: torch.profiler.profile) -> None:
        out = trace_dir / f"iteration_{prof.step_num}"
        out.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out / f"rank{rank}_trace.json"))
        logger.info(f"profiler trace saved to {out}")

    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(
        activities=activities,
        record_shapes=True,
        on_trace_ready=save,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
    ) as prof:
        yield prof


# Allocator events kept in the ring buffer: about a step of a large model's allocations, at a
# few hundred bytes each (TorchTitan keeps the same number).
MAX_MEMORY_EVENTS = 100_000


class MemorySnapshots:
    """The CUDA caching allocator's history, written as a pickle that https://pytorch.org/memory_viz
    reads: where each live block was allocated, and the timeline that led to the peak."""

    def __init__(self, cfg: Profiling, dump_folder: Path, rank: int):
        self.folder = dump_folder / cfg.save_memory_snapshot_folder
        self.freq, self.rank = cfg.profile_freq, rank
        torch.cuda.memory._record_memory_history(max_entries=MAX_MEMORY_EVENTS)

    def step(self, step: int) -> None:
        if step % self.freq == 0:
            self.dump(f"iteration_{step}")

    def dump(self, name: str) -> None:
        out = self.folder / name
        out.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(out / f"rank{self.rank}_memory_snapshot.pickle"))
        logger.info(f"memory snapshot saved to {out}")

    def close(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)


@contextlib.contextmanager
def maybe_memory_snapshots(
    cfg: Profiling, dump_folder: Path, rank: int
) -> Iterator[MemorySnapshots | None]:
    if not cfg.enable_memory_snapshot:
        yield None
        return
    snapshots = MemorySnapshots(cfg, dump_folder, rank)
    try:
        yield snapshots
    finally:
        snapshots.close()
