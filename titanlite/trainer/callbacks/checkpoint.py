"""Checkpoint callbacks: the save when due, the Hugging Face load at the start
(`checkpoint.initial_load_in_hf`) and the Hugging Face export at the end
(`checkpoint.last_save_in_hf`). `Saver` is the one way callbacks save: timed as checkpoint
time, under the hash of the config that runs, and announced to every callback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from titanlite.components.checkpoint.folder import step_dir
from titanlite.components.checkpoint.hf_training import export_hf, load_hf_weights
from titanlite.components.checkpoint.manager import CheckpointManager
from titanlite.components.clock import Clock
from titanlite.config.schema import Checkpoint
from titanlite.core.dtypes import DTYPES
from titanlite.core.logging import logger
from titanlite.trainer.callbacks.base import Callback


class Saver:
    def __init__(
        self,
        checkpointer: CheckpointManager,
        clock: Clock,
        config_hash: str,
        saved: Callable[[int], None],
        failing: Callable[[], str] = lambda: "",
    ):
        """`saved(step)`: told of each save (the callbacks' post_checkpoint_saved); `failing()`:
        why the run, were it to end now, would fail ("" when it would not): no checkpoint is
        written then, so that the latest is always one a good run could end with."""
        self.checkpointer, self.clock, self.config_hash = checkpointer, clock, config_hash
        self.saved, self.failing = saved, failing

    def save(self, step: int, *, force_sync: bool = False) -> None:
        with self.clock.span("checkpoint"):
            self.checkpointer.save(step, config_hash=self.config_hash, force_sync=force_sync)
        self.saved(step)

    def wait(self) -> None:
        """For a background save to finish (counted as checkpoint time)."""
        with self.clock.span("checkpoint"):
            self.checkpointer.wait()


class CheckpointWhenDue(Callback):
    """The save at its interval; one withheld because the run is failing (saver.failing) is
    written at the first step after which it is not."""

    def __init__(self, saver: Saver):
        self.saver = saver
        self.owed = False

    def post_step(self, step: int) -> None:
        due = self.saver.checkpointer.should_save(step)
        if not (due or self.owed):
            return
        if why := self.saver.failing():
            if due:
                logger.warning(f"checkpoint step-{step} not written: {why}")
            self.owed = True
            return
        self.owed = False
        self.saver.save(step)

    def post_train(self) -> None:
        self.saver.wait()


class HFInitialLoad(Callback):
    """The model's weights from a Hugging Face folder, when there is no checkpoint to resume
    (the checkpoint manager leaves that case to this callback)."""

    def __init__(self, checkpointer: CheckpointManager, model: nn.Module, model_args: Any):
        """`model_args`: what the Hugging Face folder must match (Llama's: preflight checks)."""
        self.checkpointer, self.model, self.model_args = checkpointer, model, model_args

    def pre_train(self) -> None:
        ckpt, cfg = self.checkpointer, self.checkpointer.cfg
        if ckpt.enabled and ckpt.resumed_from is None and cfg.initial_load_path:
            if cfg.initial_load_in_hf:
                load_hf_weights(self.model, Path(cfg.initial_load_path), self.model_args)


class HFExport(Callback):
    """The final checkpoint as a Hugging Face folder, only by the launch that saved the final
    step: a relaunch that resumes there trains nothing and finds the export already written."""

    def __init__(self, saver: Saver, cfg: Checkpoint, total_steps: int):
        self.saver, self.cfg, self.total_steps = saver, cfg, total_steps
        self.last_saved = -1

    def post_checkpoint_saved(self, step: int) -> None:
        self.last_saved = step

    def post_train(self) -> None:
        if not self.cfg.last_save_in_hf or self.last_saved != self.total_steps:
            return
        ckpt, step = self.saver.checkpointer, self.last_saved
        with self.saver.clock.span("checkpoint"):
            ckpt.wait()
            dst = ckpt.folder / f"hf-step-{step}"
            export_hf(
                step_dir(ckpt.folder, step),
                dst,
                DTYPES[self.cfg.export_dtype],
                mtp=self.cfg.export_mtp,
            )
