"""A checkpoint folder's layout: which steps it holds complete and where each step lives. Kept
apart from storage.py (DCP's readers and writers) so that preflight and the launch path find the
checkpoint to resume without importing torch.distributed.checkpoint (~1 s)."""

from __future__ import annotations

import re
from pathlib import Path

MANIFEST = "manifest.json"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the path and what is wrong."""


def step_dir(folder: Path, step: int) -> Path:
    return folder / f"step-{step}"


def partial_dir(folder: Path, step: int) -> Path:
    return folder / f".step-{step}.partial"


def complete_steps(folder: Path) -> list[int]:
    """Steps of the complete checkpoints in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    steps = []
    for p in folder.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and p.is_dir() and (p / MANIFEST).is_file():
            steps.append(int(m.group(1)))
    return sorted(steps)
