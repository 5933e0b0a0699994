"""Which checkpoint a run loads: checkpoint.load_step, else the latest complete step, else
checkpoint.initial_load_path. The one rule, used by preflight (checked before the ranks start)
and by CheckpointManager.load (what the ranks then load)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from titanlite.components.checkpoint.folder import CheckpointError, complete_steps, step_dir
from titanlite.config.schema import Checkpoint


@dataclass(frozen=True)
class ResumePoint:
    path: Path
    step: int | None  # a complete step of the checkpoint folder; None: initial_load_path
    complete: list[int]  # every complete step in the folder, oldest first


def resume_point(cfg: Checkpoint, folder: Path) -> ResumePoint | None:
    """What to load from checkpoint folder `folder`; None for a fresh start (or checkpointing
    off). CheckpointError when checkpoint.load_step names no complete checkpoint."""
    if not (cfg.enable_checkpoint or cfg.create_seed_checkpoint):
        return None
    steps = complete_steps(folder)
    if cfg.load_step >= 0:
        if cfg.load_step not in steps:
            raise CheckpointError(
                f"checkpoint.load_step = {cfg.load_step}: {step_dir(folder, cfg.load_step)} "
                f"is not a complete checkpoint (complete: {steps or 'none'})"
            )
        return ResumePoint(step_dir(folder, cfg.load_step), cfg.load_step, steps)
    if steps:
        return ResumePoint(step_dir(folder, steps[-1]), steps[-1], steps)
    if cfg.initial_load_path:
        return ResumePoint(Path(cfg.initial_load_path), None, steps)
    return None
