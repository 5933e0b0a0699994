"""Which source each window of a data mixture comes from: a pure function of (mixture, global
window position), O(1) per window, the same on 1 or N ranks.

A phase (its start window and its normalized weights w_s) repeats a period of D windows in which
source s holds c_s = round(w_s x D) slots (largest remainders, so the counts sum to D; D = 4096
puts every share within 1/8192 of its target). The slots are interleaved by Megatron's greedy
error-minimizing rule (each slot goes to the source furthest behind its target), so any prefix of
the period is as close to the weights as whole windows allow. A table of the period's slot ->
(source, that source's slots before it) makes one lookup per window:

    window n of the phase: period k = n // D, slot r = n % D
    source = table[r].source, its window in that source = start_s + k x c_s + table[r].before

where start_s counts the source's windows in the earlier phases (closed form per phase). A
source's windows are its own stream (its prepared shards' shuffled windows, epoch after epoch),
so a source's position is a count, and a run resumes from the global window count alone.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

PERIOD = 4096


@dataclass(frozen=True)
class Phase:
    start: int  # its first global window
    weights: tuple[float, ...]  # one per source, normalized


class MixtureSchedule:
    def __init__(self, phases: Sequence[Phase], period: int = PERIOD):
        if not phases or phases[0].start != 0:
            raise ValueError("the first phase starts at window 0")
        self.phases, self.period = list(phases), period
        self.sources = len(phases[0].weights)
        self._starts_at = [p.start for p in self.phases]
        self._counts = [_counts(p.weights, period) for p in self.phases]
        self._tables = [_period_table(c, period) for c in self._counts]
        # Each source's windows before each phase.
        self._before_phase: list[list[int]] = [[0] * self.sources]
        for i in range(1, len(self.phases)):
            taken = self._taken(i - 1, self.phases[i].start - self.phases[i - 1].start)
            self._before_phase.append([a + b for a, b in zip(self._before_phase[-1], taken)])

    def phase_of(self, n: int) -> int:
        return bisect.bisect_right(self._starts_at, n) - 1

    def __call__(self, n: int) -> tuple[int, int]:
        """(source, the source's window index) of global window n."""
        i = self.phase_of(n)
        k, r = divmod(n - self.phases[i].start, self.period)
        source, before = self._tables[i][r]
        return source, self._before_phase[i][source] + k * self._counts[i][source] + before

    def consumed(self, n: int) -> list[int]:
        """Each source's windows among the first n global windows (a resume's per-source
        positions, the metrics' per-source counts)."""
        i = self.phase_of(n)
        taken = self._taken(i, n - self.phases[i].start)
        return [a + b for a, b in zip(self._before_phase[i], taken)]

    def _taken(self, phase: int, n: int) -> list[int]:
        """Each source's windows among the first n windows of `phase`."""
        k, r = divmod(n, self.period)
        taken = [k * c for c in self._counts[phase]]
        for source, _ in self._tables[phase][:r]:
            taken[source] += 1
        return taken


def _counts(weights: Sequence[float], period: int) -> list[int]:
    """Slots per source in a period: round(w x period) by largest remainders (summing to it)."""
    exact = [w * period for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda s: (counts[s] - exact[s], s))
    for s in by_remainder[: period - sum(counts)]:
        counts[s] += 1
    return counts


def _period_table(counts: Sequence[int], period: int) -> list[tuple[int, int]]:
    """slot -> (source, the source's slots before it): greedy, each slot to the source whose
    count so far is furthest below its share of the slots so far (ties: the lower index)."""
    given = [0] * len(counts)
    table = []
    for slot in range(period):
        source = max(
            (s for s in range(len(counts)) if given[s] < counts[s]),
            key=lambda s: (counts[s] * (slot + 1) / period - given[s], -s),
        )
        table.append((source, given[source]))
        given[source] += 1
    return table
