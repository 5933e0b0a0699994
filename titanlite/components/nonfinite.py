"""Non-finite training stops instead of saving garbage.

The signal is the global gradient norm, which every rank already holds (clipping reduces it
over the whole mesh), so every rank sees the same verdict at the same step without another
collective. A non-finite loss on any rank makes it non-finite too: the loss's backward feeds
NaN/inf into that rank's gradients, and the reductions carry them into everyone's norm.

A bad step's update is never applied, so the weights, the optimizer state and any checkpoint
written afterwards stay those of the last good step. The decision is made on the device, with
no host sync in the step: the fused optimizers skip their update (and their step count) when
given `found_inf`, as torch's GradScaler uses them. The LR schedule follows the step number, so
a skipped step uses up its slot in the schedule (as under GradScaler). The host reads the norms
lazily, all pending ones at once, when it needs the verdict: on steps that log or save, and at
the end (`settle`). A run past its allowed skips therefore stops at the next of those steps,
naming the step that went bad; the steps in between cannot have harmed the weights (their bad
updates were skipped too) and no checkpoint is written from them. The foreach and for-loop
optimizers take no `found_inf`: with them the norm is read every step (one sync).

A run whose last step was skipped, or that skipped more than MAX_SKIPPED_FRACTION of the steps
it ran, did not train: it ends with exit 3, and no checkpoint is written while it is in that
state (the save waits for a step that could end the run well), so its latest checkpoint is
always from a good step.
"""

from __future__ import annotations

import math
from typing import Any, cast

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
        self._skipped = 0  # over this launch
        self._steps = 0  # decided over this launch
        self.last_step = 0
        self._pending: list[tuple[int, torch.Tensor]] = []  # (step, norm) not read yet

    def step_optimizer(self, optimizer: torch.optim.Optimizer, step: int, norm: torch.Tensor):
        """The optimizer step, skipped on the device when `norm` is not finite; the verdict is
        read later (settle). Optimizers without `found_inf` support read it now."""
        self._pending.append((step, norm.detach()))
        if not supports_found_inf(optimizer):
            self.settle()
            if self.consecutive:
                return
            optimizer.step()
            return
        # The attribute torch's Adam reads (GradScaler sets it the same way).
        scaled = cast(Any, optimizer)  # torch.optim.Optimizer declares no found_inf
        scaled.found_inf = (~torch.isfinite(norm.detach())).to(torch.float32)
        try:
            optimizer.step()
        finally:
            del scaled.found_inf  # a later step without the guard must not see it

    def settle(self) -> None:
        """Read the pending norms (one host sync for all of them) and count their verdicts;
        raises NonFiniteTraining for the first step past the allowed skips."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        norms = torch.stack([n.float() for _, n in pending]).tolist()
        noticed = pending[-1][0]
        for (step, _), norm in zip(pending, norms):
            self._count(step, norm, noticed)

    def _count(self, step: int, norm: float, noticed: int) -> None:
        self._steps, self.last_step = self._steps + 1, step
        if math.isfinite(norm):
            self.consecutive = 0
            return
        self.consecutive += 1
        if self.consecutive > self.max_skips:
            in_a_row = f" after {self.max_skips} skipped step(s) in a row" if self.max_skips else ""
            later = f" (read after step {noticed})" if noticed != step else ""
            raise NonFiniteTraining(
                f"step {step}: the gradient norm is {norm}{in_a_row}{later}; training stopped "
                "without applying it and without a checkpoint of it (the latest checkpoint, if "
                "any, is from a good step). Lower optimizer.lr, check the data, or allow skips "
                "with --training.skip_nonfinite_steps N"
            )
        self._skipped += 1
        logger.warning(
            f"step {step}: gradient norm {norm}, update skipped "
            f"({self.consecutive} of at most {self.max_skips} in a row)"
        )

    @property
    def skipped(self) -> int:
        """Steps skipped over this launch (reads the pending verdicts)."""
        self.settle()
        return self._skipped

    @property
    def steps(self) -> int:
        self.settle()
        return self._steps

    def failing(self) -> str:
        """Why the run, were it to end now, has not trained (exit 3); "" when it has."""
        self.settle()
        if self.consecutive:
            return (
                f"{self._skipped} of {self._steps} step(s) skipped for a non-finite gradient norm, "
                f"the last one (step {self.last_step}) among them"
            )
        if self._skipped > MAX_SKIPPED_FRACTION * self._steps:
            return (
                f"{self._skipped} of {self._steps} step(s) skipped for a non-finite gradient norm, "
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


def supports_found_inf(optimizer: torch.optim.Optimizer) -> bool:
    """torch 2.13's fused Adam/AdamW skip on `found_inf` (optim/adam.py's _fused_adam); the
    foreach and single-tensor paths refuse it."""
    return bool(optimizer.defaults.get("fused"))
