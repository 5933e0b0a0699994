"""Weights & Biases: rank 0 logs the TensorBoard scalars under the same tags, with the resolved
config, and a relaunch (a restart from a checkpoint, a SLURM requeue) continues the same W&B run:
its id is kept in {dump_folder}/wandb_run_id and passed back with resume="allow".

Where it goes is wandb's own business, set by its environment variables as in TorchTitan:
WANDB_PROJECT (default "titanlite"), WANDB_ENTITY, WANDB_NAME, WANDB_MODE (offline: no network,
`wandb sync` later), WANDB_DIR (default: the dump folder)."""

from __future__ import annotations

import os
import secrets
import tomllib
from pathlib import Path
from typing import Any

from titanlite.core.errors import EnvironmentProblem
from titanlite.core.io import atomic_write_text

RUN_ID_FILE = "wandb_run_id"
STEP = "step"  # every scalar is plotted against the training step, logged as a value


def run_id(dump_folder: Path) -> str:
    """The W&B run id of this dump folder: the saved one, else a new one saved first (so a launch
    that dies before its first log still hands the same id to the next one)."""
    path = dump_folder / RUN_ID_FILE
    if path.is_file() and (saved := path.read_text().strip()):
        return saved
    new = secrets.token_hex(4)
    atomic_write_text(path, new + "\n")
    return new


class WandbRun:
    def __init__(self, dump_folder: Path, config_text: str):
        import wandb

        try:
            self.run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "titanlite"),
                id=run_id(dump_folder),
                resume="allow",
                config=tomllib.loads(config_text) if config_text else None,
                dir=None if os.environ.get("WANDB_DIR") else str(dump_folder),
            )
        except Exception as e:  # no API key, no network, a bad WANDB_* setting, ...
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise EnvironmentProblem(
                f"metrics.enable_wandb: wandb.init failed ({type(e).__name__}: {first}); run "
                "`wandb login`, or set WANDB_MODE=offline"
            ) from None
        # A step axis of its own, not wandb's internal one: wandb drops points logged at a step
        # below its last, and a run resumed from a checkpoint logs the steps after it again.
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)

    def log(self, step: int, scalars: dict[str, Any]) -> None:
        self.run.log({STEP: step, **scalars})

    def close(self) -> None:
        self.run.finish()
