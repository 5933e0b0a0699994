"""When a run that skipped non-finite steps has failed: its last step skipped, or more than half
of its steps (the save callbacks that follow this verdict: tests/unit/trainer/test_callbacks.py;
the run itself through ./run_train.sh: tests/e2e/test_bad_input_pipeline.py)."""

import math

import pytest
import torch
from helpers import guarded_steps

from titanlite.components.nonfinite import NonFiniteGuard, NonFiniteTraining

NAN, OK = math.nan, 1.0


def guard_after(norms: list[float], max_skips: int = 100) -> NonFiniteGuard:
    guard = NonFiniteGuard(max_skips)
    for _ in guarded_steps(guard, norms):
        pass
    return guard


@pytest.mark.parametrize(
    "norms, words",
    [
        (
            [OK, OK, NAN],
            "1 of 3 step(s) skipped for a non-finite gradient norm, the last one (step 3)",
        ),
        (
            [NAN, NAN, NAN, OK, OK],
            "3 of 5 step(s) skipped for a non-finite gradient norm, more than 50%",
        ),
        ([OK, OK, NAN, NAN, NAN, NAN, NAN, NAN], "6 of 8 step(s)"),  # the run
    ],
)
def test_a_run_that_skipped_its_last_step_or_most_steps_fails(norms, words):
    guard = guard_after(norms)
    assert words in guard.failing()
    with pytest.raises(NonFiniteTraining, match="training failed"):
        guard.check_finished()


@pytest.mark.parametrize("norms", [[OK], [NAN, OK], [NAN, NAN, OK, OK], [OK, NAN, OK], []])
def test_a_run_whose_skips_are_half_or_fewer_and_not_last_succeeds(norms):
    guard = guard_after(norms)
    assert guard.failing() == ""
    guard.check_finished()


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_a_nonfinite_step_leaves_the_weights_alone_and_is_read_only_when_settled(fused):
    guard = NonFiniteGuard(1)
    after = dict(guarded_steps(guard, [OK, NAN, OK, NAN], fused=fused))
    assert not torch.equal(after[1], torch.zeros(2))
    assert torch.equal(after[2], after[1]) and torch.equal(after[4], after[3])
    assert not torch.equal(after[3], after[2])
    # The fused optimizer skipped on the device: nothing was read until now.
    assert guard._skipped == (0 if fused else 2)
    assert guard.skipped == 2 and guard.failing().endswith("the last one (step 4) among them")


def test_past_the_allowed_skips_the_error_names_the_bad_step_and_when_it_was_read():
    guard = NonFiniteGuard(1)
    for _ in guarded_steps(guard, [OK, NAN, NAN, OK]):
        pass
    with pytest.raises(
        NonFiniteTraining,
        match=r"^step 3: the gradient norm is nan after 1 "
        r"skipped step\(s\) in a row \(read after step 4\)",
    ):
        guard.settle()
