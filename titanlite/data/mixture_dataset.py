"""A data mixture's window stream over prepared shards: global window n comes from source
`schedule(n)` (titanlite/data/mixture_schedule.py) at that source's own window index, each
source read as ShardWindowDataset reads a single dataset (its shuffled windows, epoch after
epoch). The loader's state is the global window count, as for one dataset, so a run resumes
exactly on any data-parallel degree; each source's position follows from it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from titanlite.data.documents import DatasetError
from titanlite.data.mixture_schedule import MixtureSchedule
from titanlite.data.rank_split import RankSplit
from titanlite.data.shard_dataset import ShardWindowDataset


class MixtureWindowDataset(IterableDataset):
    """Windows of seq_len + 1 tokens for one data-parallel rank from a mixture of sources."""

    def __init__(
        self,
        names: Sequence[str],
        sources: Sequence[ShardWindowDataset],
        schedule: MixtureSchedule,
        local_batch_size: int,
        dp_rank: int,
        dp_size: int,
        allow_change: bool = False,
    ):
        self.names, self.sources, self.schedule = list(names), list(sources), schedule
        self.local_batch_size, self.dp_rank, self.dp_size = local_batch_size, dp_rank, dp_size
        self.allow_change = allow_change
        self.split = RankSplit(local_batch_size, dp_rank, dp_size)
        self.read = 0
        # Added to each source's scheduled index: 0, except after resuming another mixture,
        # where each source continues from its recorded position.
        self.offsets = [0] * len(self.sources)

    def description(self) -> dict[str, Any]:
        """What the stream is a function of: each source's name and data, the phases' starts
        and weights, the seed and the window length."""
        return {
            "sources": {n: s.shards.fingerprint for n, s in zip(self.names, self.sources)},
            "phases": [[p.start, list(p.weights)] for p in self.schedule.phases],
            "seed": self.sources[0].seed,
            "seq_len": self.sources[0].seq_len,
        }

    @property
    def fingerprint(self) -> str:
        text = json.dumps(self.description(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def window_at(self, pos: int) -> tuple[int, np.ndarray]:
        source, index = self.schedule(pos)
        return source, self.sources[source].window_at(index + self.offsets[source])

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            _, window = self.window_at(self.split.position(self.read))
            t = torch.from_numpy(window.astype(np.int64))
            self.read += 1
            yield t[:-1], t[1:]

    def windows_per_source(self) -> list[int]:
        """Each source's windows read so far (at a micro-batch boundary)."""
        taken = self.schedule.consumed(self.split.consumed(self.read))
        return [t + o for t, o in zip(taken, self.offsets)]

    def state_dict(self) -> dict[str, Any]:
        consumed = self.split.consumed(self.read)
        taken = self.schedule.consumed(consumed)
        return {
            "consumed": consumed,
            "partial": self.read % self.local_batch_size,
            "mixture": self.fingerprint,
            "description": json.dumps(self.description(), sort_keys=True),
            "per_source": {n: t + o for n, t, o in zip(self.names, taken, self.offsets)},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        consumed = int(state["consumed"])
        self.split = RankSplit(self.local_batch_size, self.dp_rank, self.dp_size, consumed)
        self.read = int(state.get("partial", 0))
        if state["mixture"] == self.fingerprint:
            self.offsets = [0] * len(self.sources)  # the stream goes on as it was
            return
        changed = what_changed(json.loads(state["description"]), self.description())
        if not self.allow_change:
            raise DatasetError(
                f"the checkpoint's data loader read another mixture ({changed}); resume with the "
                "same [[data.sources]] and [[data.phases]], or set data.allow_mixture_change = "
                "true to continue each source from its recorded position"
            )
        # Each source continues from where the saving run left it (a new source from 0).
        recorded, now = state["per_source"], self.schedule.consumed(consumed)
        self.offsets = [int(recorded.get(n, 0)) - t for n, t in zip(self.names, now)]


def what_changed(saved: dict[str, Any], now: dict[str, Any]) -> str:
    """One phrase naming the first difference between two mixture descriptions."""
    old, new = saved["sources"], now["sources"]
    for name in sorted(set(old) | set(new)):
        if name not in new:
            return f"source {name!r} was dropped"
        if name not in old:
            return f"source {name!r} is new"
        if old[name] != new[name]:
            return f"source {name!r} holds other data"
    for key, what in (
        ("phases", "the weights or phases"),
        ("seed", "the seed"),
        ("seq_len", "seq_len"),
    ):
        if saved[key] != now[key]:
            return f"{what} changed ({saved[key]} -> {now[key]})"
    return "its fingerprint differs"
