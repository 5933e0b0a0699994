"""When a run that skipped non-finite steps has failed: its last step skipped, or more than half
of its steps (the save callbacks that follow this verdict: tests/unit/trainer/test_callbacks.py;
the run itself through ./run_train.sh: tests/e2e/test_bad_input_pipeline.py)."""

import math

import pytest
import torch

from titanlite.components.nonfinite import NonFiniteGuard, NonFiniteTraining

NAN, OK = math.nan, 1.0


def guard_after(norms: list[float], max_skips: int = 100) -> NonFiniteGuard:
    guard = NonFiniteGuard(max_skips)
    for step, norm in enumerate(norms, 1):
        guard.allow_update(step, torch.tensor(norm))
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
