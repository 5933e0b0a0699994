"""The callbacks around the loop, without a process group: the save when due and the
preemption agreement share one Saver, the agreement saves a step only when no earlier
callback just did, and neither saves while the run is failing (the non-finite guard's verdict)."""

import math
import signal
from pathlib import Path

from helpers import guarded_steps

from titanlite.components.clock import Clock
from titanlite.components.nonfinite import NonFiniteGuard
from titanlite.trainer import callbacks as cb


class FakeCheckpointer:
    folder = Path("/ckpt")

    def __init__(self, interval: int):
        self.interval, self.saves, self.waits = interval, [], 0

    def should_save(self, step: int) -> bool:
        return step % self.interval == 0

    def save(self, step: int, *, config_hash: str, force_sync: bool = False) -> None:
        self.saves.append((step, config_hash, force_sync))

    def wait(self) -> None:
        self.waits += 1


class FakeStop:
    def __init__(self, at_step: int):
        self.at_step, self.step = at_step, 0

    def agreed(self) -> int:
        self.step += 1
        return signal.SIGTERM if self.step >= self.at_step else 0


def _callbacks(interval: int, stop_at: int, total: int = 10, failing=lambda: ""):
    ckpt, callbacks = FakeCheckpointer(interval), cb.Callbacks()
    saver = cb.Saver(ckpt, Clock(), "hash", callbacks.post_checkpoint_saved, failing)
    preemption = cb.PreemptionAgreement(FakeStop(stop_at), saver, True, total)
    callbacks += [cb.CheckpointWhenDue(saver), cb.GarbageCollection(1), preemption]
    return ckpt, callbacks, preemption


def test_preemption_saves_a_step_not_saved_when_due_synchronously():
    ckpt, callbacks, preemption = _callbacks(interval=2, stop_at=3)
    for step in (1, 2, 3):
        callbacks.post_step(step)
    assert ckpt.saves == [(2, "hash", False), (3, "hash", True)]
    assert preemption.signum == signal.SIGTERM
    assert "stopped after step 3; checkpoint /ckpt/step-3 is complete" in preemption.message


def test_preemption_after_the_due_save_of_the_same_step_does_not_save_it_again():
    ckpt, callbacks, preemption = _callbacks(interval=2, stop_at=2)
    for step in (1, 2):
        callbacks.post_step(step)
    assert ckpt.saves == [(2, "hash", False)]  # the due save came first, in the list's order
    assert ckpt.waits == 1  # the agreement waited for it to complete
    assert preemption.signum == signal.SIGTERM


def test_no_preemption_at_the_last_step():
    ckpt, callbacks, preemption = _callbacks(interval=4, stop_at=3, total=3)
    for step in (1, 2, 3):
        callbacks.post_step(step)
    assert ckpt.saves == [] and preemption.signum == 0


def _steps(norms: list[float], interval: int, stop_at: int = 10**9):
    """Steps with these gradient norms through the non-finite guard, then the callbacks."""
    guard = NonFiniteGuard(100)
    ckpt, callbacks, preemption = _callbacks(interval, stop_at, 100, guard.failing)
    for step, _ in guarded_steps(guard, norms):
        callbacks.post_step(step)
        if preemption.signum:
            break
    return [step for step, *_ in ckpt.saves], preemption


NAN = math.nan


def test_a_save_due_while_the_run_fails_waits_for_the_first_step_that_could_end_it_well():
    # Due at 2 and 4: step 2 was skipped; after step 3 (good, 1 of 3 skipped) the run could end
    # well, so 3 saves instead; step 4 is skipped, and after step 5 2 of 5 are: 5 saves.
    assert _steps([1, NAN, 1, NAN, 1], interval=2)[0] == [3, 5]
    # Every step from 3 on skipped: nothing after step 2 is written.
    assert _steps([1, 1, NAN, NAN, NAN, NAN], interval=1)[0] == [1, 2]


def test_a_stop_signal_while_the_run_fails_writes_no_checkpoint():
    saves, preemption = _steps([1, 1, NAN], interval=10, stop_at=3)
    assert saves == [] and preemption.signum == signal.SIGTERM
    assert "stopped after step 3 without a checkpoint of it (1 of 3 step(s)" in preemption.message
    saves, preemption = _steps([1, NAN, 1], interval=10, stop_at=3)
    assert saves == [3] and "checkpoint /ckpt/step-3 is complete" in preemption.message
