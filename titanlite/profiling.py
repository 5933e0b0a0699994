"""torch.profiler traces every `profiling.profile_freq` steps, one Chrome trace per rank."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from titanlite.config_schema import Profiling
from titanlite.logging import logger


@contextlib.contextmanager
def maybe_profile(cfg: Profiling, dump_folder: Path, rank: int) -> Iterator[torch.profiler.profile | None]:
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
        activities=activities, record_shapes=True, on_trace_ready=save,
        schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active),
    ) as prof:
        yield prof
