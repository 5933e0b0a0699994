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
    assert calls == ["start", "end", "start", "end"]
    with pytest.raises(RuntimeError, match="closed"):
        p.get()
