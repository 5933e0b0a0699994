"""The text reader's prefetcher: results in order, errors where they are reached, and a close
that never leaves a `produce` (a collective, in training) half done or starts another."""

import threading

import pytest

from titanlite.data.prefetch import Prefetcher


def test_results_in_order_a_bounded_way_ahead_and_errors_at_their_turn():
    made = []

    def produce():
        if len(made) == 5:
            raise ValueError("bad record")
        made.append(len(made))
        return made[-1]

    p = Prefetcher(produce, depth=2)
    assert [p.get() for _ in range(3)] == [0, 1, 2]
    assert p.thread is not threading.current_thread()
    with pytest.raises(ValueError, match="bad record"):
        p.get(), p.get(), p.get()
    assert p.close(timeout=5)


def test_close_lets_the_produce_in_progress_finish_and_starts_no_other():
    """Closed while a call runs: that call completes (a collective is never cut), and the
    producer stops at its stop point, not at the first chance: the one call it would have
    blocked after anyway, the same on every rank."""
    started, release = threading.Event(), threading.Event()
    calls = []

    def produce():
        calls.append("start")
        if calls.count("start") == 2:  # the second call: closed while it runs
            started.set()
            release.wait(5)
        calls.append("end")
        return calls.count("end")

    p = Prefetcher(produce, depth=1)
    assert p.get() == 1
    assert started.wait(5)
    closer = threading.Thread(target=p.close)
    closer.start()
    closer.join(0.2)
    assert closer.is_alive()  # close waits for the produce in progress
    release.set()
    closer.join(5)
    assert not p.thread.is_alive()
    # Taken 1, depth 1: call 2 fills the queue, call 3 is the one in hand; no call 4.
    assert calls == ["start", "end"] * 3
    with pytest.raises(RuntimeError, match="closed"):
        p.get()


@pytest.mark.parametrize("depth", [1, 2, 3])
@pytest.mark.parametrize("taken", [0, 1, 4])
def test_the_stop_point_depends_on_what_was_taken_not_on_when_close_came(depth, taken):
    """Two ranks' producers (a collective each call, in training) closed at different moments
    after their consumers took as many results make exactly as many calls."""
    counts = []
    for delay in (0.0, 0.05):
        made = []
        p = Prefetcher(lambda made=made: made.append(1) or len(made), depth=depth)
        for _ in range(taken):
            p.get()
        threading.Event().wait(delay)
        assert p.close(timeout=5)
        counts.append(len(made))
    assert counts == [taken + depth + 1] * 2
