"""The metrics line (console, metrics.jsonl, TensorBoard, W&B) when due, and the launch's
goodput at the end."""

from __future__ import annotations

from collections.abc import Callable

import torch

from titanlite.components.metrics.logger import MetricsLogger
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.trainer.callbacks.base import Callback
from titanlite.trainer.train_step import StepOutput


class MetricsLogging(Callback):
    def __init__(
        self,
        metrics: MetricsLogger,
        global_mean: Callable[[torch.Tensor], float],
        nonfinite: NonFiniteGuard,
        step: Callable[[], int],
    ):
        """`step()`: the step reached (the resumed one when no step was trained)."""
        self.metrics, self.global_mean, self.nonfinite = metrics, global_mean, nonfinite
        self.step = step
        self.records: list[dict] = []  # what was logged, step by step

    def post_train_batch(self, step: int, out: StepOutput, val_loss: float | None) -> None:
        self.metrics.count_step()
        # Reading the loss syncs with the device: only on the steps that log it. The non-finite
        # verdicts are read there too, first: a run past its allowed skips stops before it logs.
        if self.metrics.should_log(step) or val_loss is not None:
            self.nonfinite.settle()
            record = self.metrics.log(
                step,
                self.global_mean(out.loss),
                out.grad_norm.item(),
                out.lr,
                val_loss,
                skipped_steps=self.nonfinite.skipped,
            )
            self.records.append(record)

    def post_train(self) -> None:
        self.metrics.log_goodput(self.step())
