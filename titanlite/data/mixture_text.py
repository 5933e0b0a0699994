"""A text source of a data mixture: its files tokenized on the fly, its windows read in order.

The k-th window the schedule gives a text source is the k-th window of the source's own stream,
cut as training.dataset_path's text is cut (PackedTextDataset on one rank, one window a
micro-batch, so it cuts every window; files shuffled per epoch by the run's seed). A stream has
no random access: each rank cuts, and drops, the windows of it that other ranks read
(MixtureWindowDataset steps past them at the end of its share of each micro-batch), so that at
every micro-batch boundary a text source is at the same window on every rank, the one the
schedule's count gives. Its reader state there is what the mixture's checkpoint records; a
resume, on any data-parallel degree, continues from it.

Tokenizing stays shared across the data-parallel ranks, a group per text source: each source's
reader thread exchanges ids on its group at any time, and two threads exchanging on one group
could pair one rank's call for source a with another rank's for source b. Since a rank waiting
on a source's refill waits for the other ranks' readers of that source, which run only a few
refills ahead of their own rank's use, every rank reads the refills of a micro-batch at its
start, source after source, the same sequence on every rank (MixtureWindowDataset._read_texts);
cutting on demand, two ranks could each wait on a source the other has yet to read.

A text source's size is unknown until it has been read to the end, so preflight does not check
its max_repetition (that would mean tokenizing the corpus). The stream measures an epoch's tokens
when it first wraps (every epoch holds the same tokens); once its windows hold more than
max_repetition epochs' worth, the mixture stops at that micro-batch's boundary, before training
on it, with one line (DatasetError: exit 2). Before the first wrap everything read is of the
first epoch, so a limit below one epoch cannot be kept; preflight refuses it for a text source.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from titanlite.data.documents import DatasetError
from titanlite.data.text_dataset import PackedTextDataset
from titanlite.data.tokenizer import Tokenizer


def text_fingerprint(files: list[Path], tokenizer_fingerprint: str, text_field: str) -> str:
    """Identifies a text source's stream without reading it: the tokenizer, the text field, and
    its files' names (relative to their common folder, so a copy elsewhere is the same source)
    and sizes."""
    root = Path(os.path.commonpath(files)) if len(files) > 1 else files[0].parent
    h = hashlib.sha256(f"{tokenizer_fingerprint}:{text_field};".encode())
    for f in files:
        h.update(f"{f.relative_to(root).as_posix()}:{f.stat().st_size};".encode())
    return "text:" + h.hexdigest()[:16]


class TextWindows:
    """A text source's windows, in its stream's order, for MixtureWindowDataset (which reads
    prepared sources through ShardWindowDataset's window_at, seed and seq_len too)."""

    def __init__(
        self,
        name: str,
        files: list[Path],
        tokenizer: Tokenizer,
        seq_len: int,
        seed: int,
        text_field: str = "text",
        tokenize_group: Any = None,
        prefetch: bool = True,
        max_repetition: float = math.inf,
    ):
        self.name, self.max_repetition = name, max_repetition
        self.stream = PackedTextDataset(
            files, tokenizer, seq_len, 1, 0, 1, seed, text_field, tokenize_group, prefetch
        )
        self.fingerprint = text_fingerprint(files, tokenizer.fingerprint, text_field)

    @property
    def seed(self) -> int:
        return self.stream.seed

    @property
    def seq_len(self) -> int:
        return self.stream.seq_len

    @property
    def position(self) -> int:
        """Windows of the stream cut so far."""
        return self.stream.window_idx

    def window_at(self, index: int) -> np.ndarray:
        """Window `index` of the stream: at or after its position (the windows before it are
        cut and dropped)."""
        self.skip_to(index)
        return np.array(self.stream.cut_window(), dtype=np.int64)

    def skip_to(self, index: int) -> None:
        if index < self.position:
            raise RuntimeError(
                f"text source {self.name!r} is read in order: window {index} is behind its "
                f"position {self.position}"
            )
        while self.position < index:
            self.stream.cut_window()

    def read_through(self, index: int) -> None:
        """Read (and tokenize) until the stream's first `index` windows are cut or buffered."""
        self.stream.read_through(index)

    def check_repetition(self, when: str) -> None:
        """DatasetError (one line) if the windows cut so far hold more than max_repetition
        epochs of the source's tokens."""
        per_epoch = self.stream.epoch_tokens
        read = self.position * (self.seq_len + 1)
        if per_epoch is None or read <= per_epoch * self.max_repetition:
            return
        raise DatasetError(
            f"data source {self.name!r} (text, data.sources.{self.name}.path) would be read "
            f"{read / per_epoch:.2f} times {when}, past max_repetition = "
            f"{self.max_repetition:g} (an epoch of it is {per_epoch:,} tokens); add data, lower "
            "its weight or raise its max_repetition"
        )

    def state_dict(self) -> dict[str, Any]:
        return {**self.stream.state_dict(), "epoch_tokens": self.stream.epoch_tokens}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)
        self.stream.epoch_tokens = state["epoch_tokens"]

    def close(self, timeout: float | None = None) -> None:
        self.stream.close(timeout)
