"""Non-finite training stops instead of saving garbage.

The signal is the global gradient norm, which every rank already holds (clipping reduces it
over the whole mesh), so every rank sees the same verdict at the same step without another
collective. A non-finite loss on any rank makes it non-finite too: the loss's backward feeds
NaN/inf into that rank's gradients, and the reductions carry them into everyone's norm.

A bad step's update is never applied (no optimizer step, no LR step), so the weights, the
optimizer state and any checkpoint written afterwards stay those of the last good step.

A run whose last step was skipped, or that skipped more than MAX_SKIPPED_FRACTION of the steps
it ran, did not train: it ends with exit 3, and no checkpoint is written while it is in that
state (the save waits for a step that could end the run well), so its latest checkpoint is
always from a good step.
"""

from __future__ import annotations

import math

import torch

from titanlite.core.logging import logger


class NonFiniteTraining(RuntimeError):
    """Training produced NaN/inf more often in a row than allowed; the message names the step."""


# More than this share of a launch's steps skipped fails the run (exit 3) even if its last step
# was good: a run that mostly skipped its updates has not trained the model it claims.
MAX_SKIPPED_FRACTION = 0.5


class NonFiniteGuard:
    def __init__(self, max_consecutive_skips: int):
        self.max_skips = max_consecutive_skips
        self.consecutive = 0
        self.skipped = 0  # over this launch
        self.steps = 0  # decided over this launch
        self.last_step = 0

    def allow_update(self, step: int, grad_norm: torch.Tensor) -> bool:
        """True to apply this step's update. Reads the norm (one device sync per step: skipping
        must be decided before the optimizer runs)."""
        norm = float(grad_norm)
        self.steps, self.last_step = self.steps + 1, step
        if math.isfinite(norm):
            self.consecutive = 0
            return True
        self.consecutive += 1
        if self.consecutive > self.max_skips:
            in_a_row = f" after {self.max_skips} skipped step(s) in a row" if self.max_skips else ""
            raise NonFiniteTraining(
                f"step {step}: the gradient norm is {norm}{in_a_row}; training stopped without "
                "applying it and without a checkpoint of it (the latest checkpoint, if any, is "
                "from a good step). Lower optimizer.lr, check the data, or allow skips with "
                "--training.skip_nonfinite_steps N"
            )
        self.skipped += 1
        logger.warning(
            f"step {step}: gradient norm {norm}, update skipped "
            f"({self.consecutive} of at most {self.max_skips} in a row)"
        )
        return False

    def failing(self) -> str:
        """Why the run, were it to end now, has not trained (exit 3); "" when it has."""
        if self.consecutive:
            return (
                f"{self.skipped} of {self.steps} step(s) skipped for a non-finite gradient norm, "
                f"the last one (step {self.last_step}) among them"
            )
        if self.skipped > MAX_SKIPPED_FRACTION * self.steps:
            return (
                f"{self.skipped} of {self.steps} step(s) skipped for a non-finite gradient norm, "
                f"more than {MAX_SKIPPED_FRACTION:.0%}"
            )
        return ""

    def check_finished(self) -> None:
        """At the end of training: raise NonFiniteTraining if the run has not trained."""
        if why := self.failing():
            raise NonFiniteTraining(
                f"{why}: training failed; no checkpoint was written while it was failing (the "
                "latest, if any, is from a good step). Lower optimizer.lr or check the data"
            )
