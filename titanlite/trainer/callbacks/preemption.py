"""The preemption agreement, after every other step-end callback: every rank learns at the same
step whether any got a stop signal, and then saves once more (synchronously: the job may be
killed soon after) unless that step was just saved or training is over anyway."""

from __future__ import annotations

import signal

from titanlite.components.checkpoint.folder import step_dir
from titanlite.components.preemption import StopRequest
from titanlite.trainer.callbacks.base import Callback
from titanlite.trainer.callbacks.checkpoint import Saver


class PreemptionAgreement(Callback):
    def __init__(self, stop: StopRequest, saver: Saver, enabled: bool, total_steps: int):
        """`enabled`: checkpoint.enable_checkpoint."""
        self.stop, self.saver, self.enabled, self.total_steps = stop, saver, enabled, total_steps
        self.signum = 0  # the agreed signal that stops training after this step
        self.message = ""
        self.last_saved = -1

    def post_checkpoint_saved(self, step: int) -> None:
        self.last_saved = step

    def post_step(self, step: int) -> None:
        signum = self.stop.agreed()
        if not signum or step >= self.total_steps:
            return
        self.signum = signum
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if not self.enabled:
            self.message = (
                f"{name}: stopped after step {step} WITHOUT a checkpoint "
                "(checkpoint.enable_checkpoint is off): a restart begins at step 0"
            )
            return
        self.saver.wait()
        if why := self.saver.failing():
            self.message = (
                f"{name}: stopped after step {step} without a checkpoint of it ({why}); a "
                "restart resumes from the latest checkpoint"
            )
            return
        if self.last_saved != step:
            self.saver.save(step, force_sync=True)
        folder = step_dir(self.saver.checkpointer.folder, step)
        self.message = f"{name}: stopped after step {step}; checkpoint {folder} is complete"
