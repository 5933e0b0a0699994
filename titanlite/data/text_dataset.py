"""Text documents -> packed token windows, tokenized on the fly.

Every data-parallel rank reads the same global token stream: the files in an order shuffled per
epoch by (seed, epoch) (so one topic or file type never fills many steps in a row), each
document framed by BOS/EOS, concatenated and cut into non-overlapping windows of seq_len + 1 tokens
(input = window[:-1], labels = window[1:]); the stream repeats by epochs without end. Windows are
shared between data-parallel ranks by `RankSplit`, so the global batch of a step is the same set
of windows whatever the data-parallel degree, and the loader's state at a step boundary is the
same on every rank (and resumes onto another degree exactly).
Tokenizing it is shared: given the run's process group, each rank tokenizes 1/world of every
batch of documents and the ids are all-gathered (`SplitTokenizer`), so a rank's tokenizing work is
its own share whatever the data-parallel degree (every rank still reads and parses every record).
The BOS framing is also what block_causal attention reads document boundaries from.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from titanlite.data.documents import DatasetError, SkippedRecords, iter_documents
from titanlite.data.rank_split import RankSplit
from titanlite.data.split_tokenize import SplitTokenizer
from titanlite.data.tokenizer import Tokenizer

_TOKENIZE_BATCH_CHARS = 1 << 18  # text gathered per encode_batch call
# A group tokenizes this many batches' worth at a time (one exchange each, so fewer of them),
# capped so that the buffer of ids not yet cut into windows (and checkpointed) stays small.
_MAX_BATCHES_PER_EXCHANGE = 8


class PackedTextDataset(IterableDataset):
    """Windows of seq_len + 1 tokens for one data-parallel rank; stateful for exact resume."""

    def __init__(
        self,
        files: list[Path],
        tokenizer: Tokenizer,
        seq_len: int,
        local_batch_size: int,
        dp_rank: int,
        dp_size: int,
        seed: int = 0,
        text_field: str = "text",
        tokenize_group: dist.ProcessGroup | None = None,
    ):
        """`tokenize_group`: the processes that read this same stream and share tokenizing it
        (all of them must iterate their readers in step, as the trainer's ranks do)."""
        self.files, self.tokenizer, self.seq_len, self.seed = files, tokenizer, seq_len, seed
        self.encoder = SplitTokenizer(tokenizer, tokenize_group)
        self._fill_chars = _TOKENIZE_BATCH_CHARS * min(self.encoder.size, _MAX_BATCHES_PER_EXCHANGE)
        self.local_batch_size, self.dp_rank, self.dp_size = local_batch_size, dp_rank, dp_size
        self.text_field = text_field
        self.skipped = SkippedRecords()
        # Position in the global stream: the next document to read, the tokens read but not yet
        # cut into windows, and the index of the next window.
        self.epoch, self.file_idx, self.record_idx = 0, 0, 0
        self.buffer: list[int] = []
        self.window_idx = 0
        self.split = RankSplit(local_batch_size, dp_rank, dp_size)

    def _epoch_files(self) -> list[Path]:
        order = list(self.files)
        random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def _fill(self) -> None:
        """Tokenize the next documents (about `_fill_chars` of text) into the buffer, wrapping
        around to a new epoch at the end of the data."""
        texts: list[str] = []
        size = 0
        while size < self._fill_chars:
            from_start = (self.file_idx, self.record_idx) == (0, 0)
            got_any = False
            files = self._epoch_files()
            for fi, ri, text in iter_documents(
                files, self.text_field, self.file_idx, self.record_idx, self.skipped
            ):
                got_any = True
                texts.append(text)
                size += len(text)
                self.file_idx, self.record_idx = fi, ri + 1
                if size >= self._fill_chars:
                    break
            else:
                if from_start and not got_any:
                    raise DatasetError(
                        f"training dataset: no readable document in {len(self.files)} file(s) "
                        f"({self.skipped.count} malformed records)"
                    )
                self.epoch, self.file_idx, self.record_idx = self.epoch + 1, 0, 0
        self.buffer.extend(self.encoder.encode(texts))

    def _cut_window(self) -> list[int]:
        n = self.seq_len + 1
        while len(self.buffer) < n:
            self._fill()
        window = self.buffer[:n]
        # Deleting the head in place avoids copying the whole remaining buffer per window.
        del self.buffer[:n]
        self.window_idx += 1
        return window

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            pos = self.window_idx
            window = self._cut_window()
            if not self.split.owns(pos):
                continue
            if self.split.ends_share(pos):
                # The rest of this micro-batch belongs to other ranks: step past it before
                # yielding, so that between steps every rank's state is the same.
                while self.window_idx < self.split.chunk_end(pos):
                    self._cut_window()
            t = torch.tensor(window, dtype=torch.long)
            yield t[:-1], t[1:]

    def state_dict(self) -> dict[str, Any]:
        # Plain data only (a list, not a tensor): its length varies, and DCP loads tensors in
        # place into a template of the saved size, which a fresh loader cannot provide.
        return {
            "epoch": self.epoch,
            "file_idx": self.file_idx,
            "record_idx": self.record_idx,
            "buffer": list(self.buffer),
            "window_idx": self.window_idx,
            "skipped": self.skipped.count,
            "seed": self.seed,
            "base": self.split.base,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.file_idx = state["epoch"], state["file_idx"]
        self.record_idx, self.window_idx = state["record_idx"], state["window_idx"]
        self.buffer = list(state["buffer"])
        self.skipped.count = state["skipped"]
        # The saving run's seed keeps the file order the same even if this run drew another.
        self.seed = state.get("seed", self.seed)
        # Between micro-batches (always, in training) the position is the same on every rank and
        # the layout may differ from the saving run's: micro-batches restart here. A state taken
        # inside a micro-batch resumes exactly with the saving layout only.
        base = state.get("base", 0)
        at_boundary = (self.window_idx - base) % self.split.chunk == 0
        self.split = RankSplit(
            self.local_batch_size,
            self.dp_rank,
            self.dp_size,
            self.window_idx if at_boundary else base,
        )


def read_stream(files: list[Path], tokenizer: Tokenizer, text_field: str = "text") -> list[int]:
    """One pass over `files` in the given order, framed and tokenized as the reader does it (for
    held-out data small enough to keep in memory, and for tests)."""
    stream: list[int] = []
    texts: list[str] = []
    for _, _, text in iter_documents(files, text_field, 0, 0, SkippedRecords()):
        texts.append(text)
        if sum(map(len, texts)) >= _TOKENIZE_BATCH_CHARS:
            for ids in tokenizer.encode_documents(texts):
                stream.extend(ids)
            texts = []
    for ids in tokenizer.encode_documents(texts):
        stream.extend(ids)
    return stream
