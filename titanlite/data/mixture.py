"""A data mixture as training reads it: its sources (prepared shards, checked like any
dataset), their weights per phase (from step 1, then each [[data.phases]] start), the schedule
of which source each window comes from, and the plan preflight shows and checks: per source its
target and achieved share over the configured steps, tokens, epochs, and the step at which it
would read more than `max_repetition` epochs (docs/data.md).

Weights are relative. With weight_unit "tokens" a source's weight is its share of the training
windows (all windows have seq_len + 1 tokens). With "documents" it is its share of documents:
each weight is scaled by the source's mean document length before normalizing, so that a
source of long documents takes more windows for the same number of documents.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from titanlite.data.documents import DatasetError
from titanlite.data.mixture_schedule import MixtureSchedule, Phase
from titanlite.data.shards import ShardSet


@dataclass(frozen=True)
class SourcePlan:
    name: str
    target: float  # its share of the windows the phases ask for over the run
    achieved: float  # its share of the windows the run reads
    windows: int
    tokens: int  # the training tokens it gives (seq_len a window)
    epochs: float
    exhausted_at: int | None  # the first step past max_repetition epochs (None: never)


class Mixture:
    def __init__(
        self,
        names: Sequence[str],
        shards: Sequence[ShardSet],
        phases: Sequence[tuple[int, Sequence[float]]],
        max_repetition: Sequence[float],
        weight_unit: str = "tokens",
        allow_change: bool = False,
    ):
        """`phases`: (start step, one weight per source), the first at step 1; `allow_change`:
        a checkpoint of another mixture resumes, each source from its recorded position."""
        self.names, self.shards, self.allow_change = list(names), list(shards), allow_change
        self.max_repetition = list(max_repetition)
        scale = [1.0] * len(self.shards)
        if weight_unit == "documents":
            scale = [s.total_tokens / max(_documents(s), 1) for s in self.shards]
        self.phases = [
            (start, _normalized([w * c for w, c in zip(weights, scale)]))
            for start, weights in phases
        ]

    def schedule(self, windows_per_step: int) -> MixtureSchedule:
        return MixtureSchedule(
            [Phase((start - 1) * windows_per_step, tuple(w)) for start, w in self.phases]
        )

    def plan(self, steps: int, windows_per_step: int, seq_len: int) -> list[SourcePlan]:
        schedule = self.schedule(windows_per_step)
        total = steps * windows_per_step
        taken = schedule.consumed(total)
        targets = [0.0] * len(self.names)
        bounds = [start for start, _ in self.phases] + [steps + 1]
        for (start, weights), end in zip(self.phases, bounds[1:]):
            for s, w in enumerate(weights):
                targets[s] += w * (end - start) / steps
        rows = []
        for s, name in enumerate(self.names):
            per_epoch = self.shards[s].num_windows(seq_len)
            allowed = math.floor(per_epoch * self.max_repetition[s])
            rows.append(
                SourcePlan(
                    name,
                    targets[s],
                    taken[s] / total,
                    taken[s],
                    taken[s] * seq_len,  # trained tokens (inputs), as tokens_<name> counts
                    taken[s] / per_epoch,
                    _first_step_past(schedule, s, allowed, steps, windows_per_step),
                )
            )
        return rows

    def check_finite(self, steps: int, windows_per_step: int, seq_len: int) -> list[SourcePlan]:
        """The plan; DatasetError (one line) if a source would read more than max_repetition
        epochs within the configured steps."""
        rows = self.plan(steps, windows_per_step, seq_len)
        for row, limit in zip(rows, self.max_repetition):
            if row.exhausted_at is not None:
                raise DatasetError(
                    f"data source {row.name!r} would be read {row.epochs:.2f} times over "
                    f"training.steps = {steps} (past max_repetition = {limit:g} at step "
                    f"{row.exhausted_at}); add data, lower its weight or raise its "
                    "max_repetition"
                )
        return rows


def describe(rows: Sequence[SourcePlan]) -> str:
    lines = ["data mixture: source, target share, achieved share, tokens, epochs"]
    lines += [
        f"  {r.name:<16} {r.target:7.2%} {r.achieved:7.2%} {r.tokens:>14,} {r.epochs:8.3f}"
        for r in rows
    ]
    return "\n".join(lines)


def _normalized(weights: Sequence[float]) -> tuple[float, ...]:
    total = sum(weights)
    return tuple(w / total for w in weights)


def _documents(shards: ShardSet) -> int:
    return sum(int(s["documents"]) for s in shards.shards)


def _first_step_past(
    schedule: MixtureSchedule, source: int, allowed: int, steps: int, per_step: int
) -> int | None:
    """The first step whose windows take `source` past `allowed` windows (binary search over
    the schedule's closed-form counts), or None within `steps`."""
    if schedule.consumed(steps * per_step)[source] <= allowed:
        return None
    low, high = 1, steps  # consumed after step `high` exceeds allowed
    while low < high:
        mid = (low + high) // 2
        if schedule.consumed(mid * per_step)[source] > allowed:
            high = mid
        else:
            low = mid + 1
    return low
