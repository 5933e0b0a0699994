"""A producer on a thread of its own, a few results ahead of the training thread.

The text reader's refills (read documents, tokenize, exchange ids with the other data-parallel
ranks) take a second or more; made on the training thread they stall the step that needs them.
A thread, not a DataLoader worker process: the exchange is a collective on a process group,
which a worker process cannot join.

When the producer may stop matters, because `produce` can be a collective: every rank's producer
must make the same calls, or one waits for the others until the group's timeout. A stop decided
by the clock (stop after the call in progress) is not the same call on every rank: one rank's
producer may be inside call k while another's has just finished call k-1 and would stop there.
So a closed producer stops where it would have blocked anyway: with `depth` results waiting and
one more in hand, that is after call c + depth + 1 when its consumer has taken c. Ranks whose
consumers took the same number of results (the trainer's ranks, at the end of training or at a
resume) stop after the same call, and no collective is left open.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Prefetcher(Generic[T]):
    """`get()` returns what `produce()` returned, in order, computed up to `depth` ahead on a
    daemon thread; an exception `produce` raised is raised by the `get` that reaches it."""

    def __init__(self, produce: Callable[[], T], depth: int = 2, name: str = "titanlite-data"):
        self._produce, self._depth = produce, depth
        self._ready: collections.deque[tuple[T | None, BaseException | None]] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                item: tuple[T | None, BaseException | None] = (self._produce(), None)
            except BaseException as error:  # handed to the consumer, raised there
                item = (None, error)
            with self._cond:
                while len(self._ready) >= self._depth and not self._closed:
                    self._cond.wait()
                if len(self._ready) >= self._depth:  # closed, at the stop point (see above)
                    return
                self._ready.append(item)
                self._cond.notify_all()
            if item[1] is not None:
                return

    def get(self) -> T:
        with self._cond:
            while self._closed or not self._ready:
                if self._closed:
                    raise RuntimeError("the data reader's prefetcher is closed")
                self._cond.wait()
            value, error = self._ready.popleft()
            self._cond.notify_all()
        if error is not None:
            raise error
        return value  # type: ignore[return-value]

    def close(self, timeout: float | None = None) -> bool:
        """Stop at the stop point (up to depth + 1 more calls of `produce`, none left half done;
        what was produced is dropped); True once the thread has ended (waiting up to `timeout`
        seconds, None = until it does)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def thread(self) -> threading.Thread:
        return self._thread
