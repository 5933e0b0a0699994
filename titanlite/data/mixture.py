"""A data mixture as training reads it: its sources (prepared shards or text files, checked
like any dataset), their weights per phase (from step 1, then each [[data.phases]] start), the
schedule of which source each window comes from, and the plan preflight shows and checks: per
source its target and achieved share over the configured steps, tokens, epochs, and the step at
which it would read more than `max_repetition` epochs (docs/data.md). A text source's epochs
are unknown until it has been tokenized: the plan says so, and training enforces its
max_repetition as it reads (titanlite/data/mixture_text.py).

Weights are relative. With weight_unit "tokens" a source's weight is its share of the training
windows (all windows have seq_len + 1 tokens). With "documents" it is its share of documents:
each weight is scaled by the source's mean document length before normalizing, so that a
source of long documents takes more windows for the same number of documents (so every
source must be prepared: a text source's mean is unknown before it is read).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from titanlite.data.documents import DatasetError
from titanlite.data.mixture_schedule import MixtureSchedule, Phase
from titanlite.data.shards import ShardSet

# A source's data: prepared shards, or the text files under its path (as open_dataset gives).
SourceData = ShardSet | list[Path]


@dataclass(frozen=True)
class SourcePlan:
    name: str
    target: float  # its share of the windows the phases ask for over the run
    achieved: float  # its share of the windows the run reads
    windows: int
    tokens: int  # the training tokens it gives (seq_len a window)
    epochs: float | None  # None: a text source's, unknown before it is read
    exhausted_at: int | None  # the first step past max_repetition epochs (None: never, unknown)


class Mixture:
    def __init__(
        self,
        names: Sequence[str],
        sources: Sequence[SourceData],
        phases: Sequence[tuple[int, Sequence[float]]],
        max_repetition: Sequence[float],
        weight_unit: str = "tokens",
        allow_change: bool = False,
    ):
        """`phases`: (start step, one weight per source), the first at step 1; `allow_change`:
        a checkpoint of another mixture resumes, each source from its recorded position."""
        self.names, self.sources, self.allow_change = list(names), list(sources), allow_change
        self.max_repetition = list(max_repetition)
        scale = [1.0] * len(self.sources)
        if weight_unit == "documents":
            scale = [_mean_document(n, s) for n, s in zip(self.names, self.sources)]
        self.phases = [
            (start, _normalized([w * c for w, c in zip(weights, scale)]))
            for start, weights in phases
        ]

    @property
    def shards(self) -> list[ShardSet]:
        """The prepared sources (the trainer verifies their checksums)."""
        return [s for s in self.sources if isinstance(s, ShardSet)]

    @property
    def text_sources(self) -> list[int]:
        """The indices of the text sources (each reads, and tokenizes, a stream of its own)."""
        return [i for i, s in enumerate(self.sources) if not isinstance(s, ShardSet)]

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
            epochs, past = None, None
            data = self.sources[s]
            if isinstance(data, ShardSet):
                per_epoch = data.num_windows(seq_len)
                allowed = math.floor(per_epoch * self.max_repetition[s])
                epochs = taken[s] / per_epoch
                past = _first_step_past(schedule, s, allowed, steps, windows_per_step)
            rows.append(
                SourcePlan(
                    name,
                    targets[s],
                    taken[s] / total,
                    taken[s],
                    taken[s] * seq_len,  # trained tokens (inputs), as tokens_<name> counts
                    epochs,
                    past,
                )
            )
        return rows

    def check_finite(self, steps: int, windows_per_step: int, seq_len: int) -> list[SourcePlan]:
        """The plan; DatasetError (one line) if a source would read more than max_repetition
        epochs within the configured steps, or if a text source that is read has a
        max_repetition below one epoch (training measures its epochs as it reads: too late)."""
        rows = self.plan(steps, windows_per_step, seq_len)
        for row, limit in zip(rows, self.max_repetition):
            if row.epochs is None and row.windows and limit < 1:
                raise DatasetError(
                    f"data.sources.{row.name}.max_repetition = {limit:g}: a text source's size "
                    "is known only once it has been read through, so it may not be limited to "
                    "less than one epoch; set it >= 1, or prepare the source (python -m "
                    "titanlite.data.prepare)"
                )
            if row.exhausted_at is not None:
                raise DatasetError(
                    f"data source {row.name!r} would be read {row.epochs:.2f} times over "
                    f"training.steps = {steps} (past max_repetition = {limit:g} at step "
                    f"{row.exhausted_at}); add data, lower its weight or raise its "
                    "max_repetition"
                )
        return rows


def describe(rows: Sequence[SourcePlan], unknown: str = "unknown (text)") -> str:
    """The plan's lines; `unknown`: what an unknown number of epochs reads as."""
    lines = ["data mixture: source, target share, achieved share, tokens, epochs"]
    lines += [
        f"  {r.name:<16} {r.target:7.2%} {r.achieved:7.2%} {r.tokens:>14,} "
        + (f"{r.epochs:8.3f}" if r.epochs is not None else f" {unknown}")
        for r in rows
    ]
    return "\n".join(lines)


def _normalized(weights: Sequence[float]) -> tuple[float, ...]:
    total = sum(weights)
    return tuple(w / total for w in weights)


def _mean_document(name: str, data: SourceData) -> float:
    """A prepared source's mean document length in tokens, from its manifest."""
    if not isinstance(data, ShardSet):
        raise DatasetError(
            f'data.weight_unit = "documents" weighs sources by their mean document length, '
            f"unknown for a text source before it is tokenized (data.sources.{name}.path); "
            'prepare it (python -m titanlite.data.prepare) or use weight_unit = "tokens"'
        )
    return data.total_tokens / max(_documents(data), 1)


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
