"""The mixture's source schedule: a pure function of the window position, each source's windows
taken in order, every prefix within a window of its targets, phases exact at their start."""

import random

import pytest

from titanlite.data.mixture_schedule import PERIOD, MixtureSchedule, Phase


def _walk(schedule: MixtureSchedule, n: int) -> list[int]:
    seen = [0] * schedule.sources
    for position in range(n):
        source, index = schedule(position)
        assert index == seen[source], (position, source, index, seen)  # in order, none skipped
        seen[source] += 1
    return seen


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.3, 0.2), (0.01, 0.99), (1 / 3,) * 3])
def test_every_prefix_is_within_one_window_of_the_targets(weights):
    schedule = MixtureSchedule([Phase(0, weights)])
    seen = [0] * len(weights)
    for n in range(1, 3 * PERIOD):
        source, _ = schedule(n - 1)
        seen[source] += 1
        for s, w in enumerate(weights):
            # Largest-remainder counts put each share within 1/PERIOD of w; the greedy order
            # keeps every prefix within a window of its share of it.
            assert abs(seen[s] - w * n) <= 1 + n / PERIOD, (n, s, seen)


def test_phases_change_exactly_at_their_start_and_sources_continue_where_they_were():
    phases = [Phase(0, (0.7, 0.3)), Phase(10_000, (0.5, 0.5)), Phase(13_001, (0.1, 0.9))]
    schedule = MixtureSchedule(phases)
    assert _walk(schedule, 10_000) == schedule.consumed(10_000) == [7_000, 3_000]
    assert _walk(schedule, 13_001) == schedule.consumed(13_001)
    assert schedule.phase_of(9_999) == 0 and schedule.phase_of(10_000) == 1
    seen = _walk(schedule, 20_000)
    assert seen == schedule.consumed(20_000)
    # Phase 2's 6,999 windows are 10% / 90% to within a window.
    after = [a - b for a, b in zip(seen, schedule.consumed(13_001))]
    assert abs(after[0] - 0.1 * 6_999) <= 1 + 6_999 / PERIOD and sum(after) == 6_999


def test_a_position_is_computed_on_its_own():
    """Any rank can jump to any window: the value at n does not depend on what was asked
    before (the same answers in a shuffled order)."""
    schedule = MixtureSchedule([Phase(0, (0.6, 0.25, 0.15)), Phase(5_000, (0.2, 0.2, 0.6))])
    positions = list(range(0, 30_000, 7))
    want = [schedule(n) for n in positions]
    random.Random(0).shuffle(order := list(range(len(positions))))
    fresh = MixtureSchedule([Phase(0, (0.6, 0.25, 0.15)), Phase(5_000, (0.2, 0.2, 0.6))])
    assert all(fresh(positions[i]) == want[i] for i in order)
