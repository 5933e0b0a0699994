"""Where a launch's wall-clock time goes, kept in one place for throughput and goodput.

The loop wraps the work that is not training in `span("data" | "validation" | "eval" |
"checkpoint")`; what remains of a step is training, counted as productive, or as re-done when an
earlier launch had already trained that step past its last checkpoint. Throughput windows (metrics) and the
end-of-launch goodput read the same figures, so they cannot disagree.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

SPANS = ("data", "validation", "eval", "checkpoint")
# Held-out work, not training: left out of throughput.
HELD_OUT = ("validation", "eval")


class Clock:
    def __init__(self, launch_start: float | None = None, redo_until: int = 0):
        now = time.perf_counter()
        self.launch_start = now if launch_start is None else launch_start
        self.redo_until = redo_until  # steps up to here are trained again by this launch
        self.totals = dict.fromkeys(("init", *SPANS, "redone", "productive"), 0.0)
        self.window: dict[str, float] = {}
        self.reset_window(now)
        self._step: dict[str, float] = dict.fromkeys(SPANS, 0.0)
        self._step_start = now

    def start_training(self) -> None:
        """Everything before the first step (imports, process group, init, loading) is lost."""
        now = time.perf_counter()
        self.totals["init"] = now - self.launch_start
        self.reset_window(now)

    @contextlib.contextmanager
    def span(self, kind: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self.totals[kind] += seconds
            self.window[kind] += seconds
            self._step[kind] += seconds

    def step_begin(self) -> None:
        self._step_start = time.perf_counter()
        self._step = dict.fromkeys(SPANS, 0.0)

    def step_end(self, step: int) -> float:
        """The step's wall seconds since step_begin (its data and validation included)."""
        wall = time.perf_counter() - self._step_start
        trained = wall - sum(self._step.values())
        self.totals["redone" if step <= self.redo_until else "productive"] += trained
        return wall

    def reset_window(self, now: float | None = None) -> None:
        self.window_start = time.perf_counter() if now is None else now
        self.window = dict.fromkeys(SPANS, 0.0)

    def window_seconds(self, now: float) -> float:
        """Seconds since the window began, validation and eval left out (not training work)."""
        held_out = sum(self.window[k] for k in HELD_OUT)
        return max(now - self.window_start - held_out, 1e-9)

    def goodput(self) -> dict[str, float]:
        wall = time.perf_counter() - self.launch_start
        return {
            "goodput_pct": 100 * self.totals["productive"] / wall,
            "wall_s": wall,
            **{f"{k}_s": v for k, v in self.totals.items()},
        }
