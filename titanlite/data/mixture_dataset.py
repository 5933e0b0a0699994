"""A data mixture's window stream: global window n comes from source `schedule(n)`
(titanlite/data/mixture_schedule.py) at that source's own window index. A prepared source is
read as ShardWindowDataset reads a single dataset (its shuffled windows, epoch after epoch, any
one at once); a text source is its own stream, read in order (TextWindows,
titanlite/data/mixture_text.py), which every rank steps through to the end of each micro-batch.
The loader's state is the global window count, as for one dataset, and each text source's reader
state at that count, so a run resumes exactly on any data-parallel degree; each source's
position follows from the count."""

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
from titanlite.data.mixture_text import TextWindows
from titanlite.data.rank_split import RankSplit
from titanlite.data.shard_dataset import ShardWindowDataset

Source = ShardWindowDataset | TextWindows


class MixtureWindowDataset(IterableDataset):
    """Windows of seq_len + 1 tokens for one data-parallel rank from a mixture of sources."""

    def __init__(
        self,
        names: Sequence[str],
        sources: Sequence[Source],
        schedule: MixtureSchedule,
        local_batch_size: int,
        dp_rank: int,
        dp_size: int,
        allow_change: bool = False,
        windows_per_step: int = 0,
    ):
        """`windows_per_step`: the global batch, for naming the step in an error (0: unknown)."""
        self.names, self.sources, self.schedule = list(names), list(sources), schedule
        self.local_batch_size, self.dp_rank, self.dp_size = local_batch_size, dp_rank, dp_size
        self.allow_change, self.windows_per_step = allow_change, windows_per_step
        self.texts = {s: t for s, t in enumerate(self.sources) if isinstance(t, TextWindows)}
        self.split = RankSplit(local_batch_size, dp_rank, dp_size)
        self.read = 0
        # Added to each source's scheduled index: 0, except after resuming another mixture,
        # where each source continues from its recorded position.
        self.offsets = [0] * len(self.sources)

    def description(self) -> dict[str, Any]:
        """What the stream is a function of: each source's name and data, the phases' starts
        and weights, the seed and the window length."""
        return {
            "sources": {n: _fingerprint(s) for n, s in zip(self.names, self.sources)},
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
            pos = self.split.position(self.read)
            if self.texts and self.read % self.local_batch_size == 0:
                self._read_texts(self.split.chunk_end(pos))
            _, window = self.window_at(pos)
            if self.texts and self.split.ends_share(pos):
                # The rest of this micro-batch is other ranks': the text sources step past their
                # windows in it before yielding, so that between micro-batches every rank's
                # text positions (and so its state) are the same.
                self._texts_to(self.split.chunk_end(pos))
            t = torch.from_numpy(window.astype(np.int64))
            self.read += 1
            yield t[:-1], t[1:]

    def _read_texts(self, n: int) -> None:
        """Each text source's reader through its windows among the first n global windows, in
        source order. Each source's reader exchanges on a group of its own, and a rank waiting
        on one source's next refill needs the other ranks' readers of it to make it, which they
        do only a few refills ahead of their own rank's use. Cutting on demand, ranks would use
        the sources in different orders (each its own windows first): one could wait on source
        a while another waits on b, each for the other. Read here, at the start of every
        micro-batch, every rank takes the same refills in the same order."""
        taken = self.schedule.consumed(n)
        for s, text in self.texts.items():
            text.read_through(taken[s] + self.offsets[s])

    def _texts_to(self, n: int) -> None:
        """Each text source to its count among the first n global windows; DatasetError if one
        has then been read past its max_repetition (the same on every rank, at the same
        micro-batch: the micro-batch is not trained on)."""
        taken = self.schedule.consumed(n)
        for s, text in self.texts.items():
            text.skip_to(taken[s] + self.offsets[s])
        per_step = self.windows_per_step
        when = f"at step {(n - 1) // per_step + 1}" if per_step else f"by global window {n}"
        for text in self.texts.values():
            text.check_repetition(when)

    def close(self, timeout: float | None = None) -> None:
        """Stop the text sources' readers (see PackedTextDataset.close)."""
        for text in self.texts.values():
            text.close(timeout)

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
            # JSON leaves, not nested dicts: DCP loads into a fresh loader's keys, and a resume
            # with allow_mixture_change may name sources the checkpoint does not.
            "per_source": json.dumps(
                {n: t + o for n, t, o in zip(self.names, taken, self.offsets)}, sort_keys=True
            ),
            "text": json.dumps(
                {self.names[s]: text.state_dict() for s, text in self.texts.items()},
                sort_keys=True,
            ),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        consumed = int(state["consumed"])
        self.split = RankSplit(self.local_batch_size, self.dp_rank, self.dp_size, consumed)
        self.read = int(state.get("partial", 0))
        texts = json.loads(state["text"])
        if state["mixture"] == self.fingerprint:
            self.offsets = [0] * len(self.sources)  # the stream goes on as it was
            for s, text in self.texts.items():
                text.load_state_dict(texts[self.names[s]])
            return
        changed = what_changed(json.loads(state["description"]), self.description())
        if not self.allow_change:
            raise DatasetError(
                f"the checkpoint's data loader read another mixture ({changed}); resume with the "
                "same [[data.sources]] and [[data.phases]], or set data.allow_mixture_change = "
                "true to continue each source from its recorded position"
            )
        # Each source continues from where the saving run left it (a new source from 0; so
        # does a text source whose files changed: its recorded reader position is in others).
        recorded, now = json.loads(state["per_source"]), self.schedule.consumed(consumed)
        saved = json.loads(state["description"])["sources"]
        for s, name in enumerate(self.names):
            source = self.sources[s]
            if isinstance(source, TextWindows):
                if name not in texts or saved.get(name) != source.fingerprint:
                    self.offsets[s] = -now[s]
                    continue
                source.load_state_dict(texts[name])
            self.offsets[s] = int(recorded.get(name, 0)) - now[s]


def _fingerprint(source: Source) -> str:
    return source.fingerprint if isinstance(source, TextWindows) else source.shards.fingerprint


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
