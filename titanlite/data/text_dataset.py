"""Text documents -> packed token windows, tokenized on the fly.

Every data-parallel rank reads the same global token stream: the files in an order shuffled per
epoch by (seed, epoch) (so one topic or file type never fills many steps in a row), each
document framed by BOS/EOS, concatenated and cut into non-overlapping windows of seq_len + 1 tokens
(input = window[:-1], labels = window[1:]); the stream repeats by epochs without end. Windows are
shared between data-parallel ranks by `RankSplit`, so the global batch of a step is the same set
of windows whatever the data-parallel degree, and the loader's state at a step boundary is the
same on every rank (and resumes onto another degree exactly).
Tokenizing it is shared: given a group of the ranks that read different sequences (the trainer
makes one gloo group per data-parallel group), each rank tokenizes 1/dp of every batch of
documents and the ids are all-gathered within that group (`SplitTokenizer`), so a rank's
tokenizing work is its own share whatever the data-parallel degree (every rank still reads and
parses every record). Reading, tokenizing and the exchange run on a thread of their own
(`DocumentReader` under a `Prefetcher`), a few refills ahead of the training thread, which only
cuts windows from the ids; the checkpointed position is the training thread's, so reading ahead
changes nothing about resume.
The BOS framing is also what block_causal attention reads document boundaries from.
"""

from __future__ import annotations

import random
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from titanlite.data.documents import DatasetError, SkippedRecords, iter_documents
from titanlite.data.prefetch import Prefetcher
from titanlite.data.rank_split import RankSplit
from titanlite.data.split_tokenize import SplitTokenizer
from titanlite.data.tokenizer import Tokenizer

_TOKENIZE_BATCH_CHARS = 1 << 18  # text gathered per encode_batch call
# A group tokenizes this many batches' worth at a time (one exchange each, so fewer of them),
# capped so that the buffer of ids not yet cut into windows (and checkpointed) stays small.
_MAX_BATCHES_PER_EXCHANGE = 8


@dataclass(frozen=True)
class Refill:
    """The ids of the next documents, and the reader's position after them."""

    ids: list[int]
    epoch: int
    file_idx: int
    record_idx: int
    skipped: int
    examples: tuple[str, ...]
    # Where in `ids` an epoch began (the stream wrapped inside this refill): what a mixture's
    # text source measures its epochs by (titanlite/data/mixture_text.py).
    epoch_starts: tuple[int, ...] = ()


class DocumentReader:
    """Reads and tokenizes the global stream from a position, about `fill_chars` of text per
    `next_refill()`, wrapping around to a new epoch at the end of the data."""

    def __init__(
        self,
        files: list[Path],
        seed: int,
        text_field: str,
        encoder: SplitTokenizer,
        fill_chars: int,
        position: tuple[int, int, int],
        skipped: SkippedRecords,
    ):
        self.files, self.seed, self.text_field = files, seed, text_field
        self.encoder, self.fill_chars = encoder, fill_chars
        self.epoch, self.file_idx, self.record_idx = position
        self.skipped = SkippedRecords(skipped.count, list(skipped.examples))

    def _epoch_files(self) -> list[Path]:
        return epoch_files(self.files, self.seed, self.epoch)

    def next_refill(self) -> Refill:
        texts: list[str] = []
        wraps: list[int] = []  # len(texts) at each new epoch
        size = 0
        while size < self.fill_chars:
            from_start = (self.file_idx, self.record_idx) == (0, 0)
            got_any = False
            for fi, ri, text in iter_documents(
                self._epoch_files(), self.text_field, self.file_idx, self.record_idx, self.skipped
            ):
                got_any = True
                texts.append(text)
                size += len(text)
                self.file_idx, self.record_idx = fi, ri + 1
                if size >= self.fill_chars:
                    break
            else:
                if from_start and not got_any:
                    raise DatasetError(
                        f"training dataset: no readable document in {len(self.files)} file(s) "
                        f"({self.skipped.count} malformed records)"
                    )
                self.epoch, self.file_idx, self.record_idx = self.epoch + 1, 0, 0
                wraps.append(len(texts))
        ids, epoch_starts = self._encode(texts, wraps)
        return Refill(
            ids,
            self.epoch,
            self.file_idx,
            self.record_idx,
            self.skipped.count,
            tuple(self.skipped.examples),
            epoch_starts,
        )

    def _encode(self, texts: list[str], wraps: list[int]) -> tuple[list[int], tuple[int, ...]]:
        """The ids of `texts`, and where in them each epoch began: the texts of each epoch are
        encoded apart (ids are per document, so the stream is the same; on a group, one more
        exchange where the stream wraps, the same on every rank)."""
        if not wraps:
            return self.encoder.encode(texts), ()
        ids: list[int] = []
        starts = []
        for i, (begin, end) in enumerate(zip([0, *wraps], [*wraps, len(texts)])):
            if i:
                starts.append(len(ids))
            if end > begin:
                ids.extend(self.encoder.encode(texts[begin:end]))
        return ids, tuple(starts)


def epoch_files(files: list[Path], seed: int, epoch: int) -> list[Path]:
    order = list(files)
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


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
        prefetch: bool = True,
    ):
        """`tokenize_group`: the processes that read this same stream and share tokenizing it
        (all of them must iterate their readers in step, as the trainer's ranks do); with
        `prefetch`, a group nothing else uses: the reader's thread exchanges on it at any time.
        `prefetch`: read and tokenize on a thread of its own (False: on the caller's, when it
        needs ids; kept for measuring the difference)."""
        self.files, self.tokenizer, self.seq_len, self.seed = files, tokenizer, seq_len, seed
        self.encoder = SplitTokenizer(tokenizer, tokenize_group)
        self._fill_chars = _TOKENIZE_BATCH_CHARS * min(self.encoder.size, _MAX_BATCHES_PER_EXCHANGE)
        self.local_batch_size, self.dp_rank, self.dp_size = local_batch_size, dp_rank, dp_size
        self.text_field = text_field
        self.skipped = SkippedRecords()
        # Position in the global stream, as far as the windows cut so far: the next document to
        # read, the tokens read but not yet cut into windows, and the index of the next window.
        # The reader (on its thread) may be refills ahead of it.
        self.epoch, self.file_idx, self.record_idx = 0, 0, 0
        self.buffer: list[int] = []
        self.window_idx = 0
        # Tokens per epoch, once the stream has wrapped (None before): not in this reader's
        # state, a mixture's text source keeps it to enforce its max_repetition.
        self.epoch_tokens: int | None = None
        self.split = RankSplit(local_batch_size, dp_rank, dp_size)
        self.prefetch = prefetch
        self._reader: DocumentReader | None = None
        self._prefetcher: Prefetcher[Refill] | None = None
        self._finalizer: weakref.finalize | None = None

    def _epoch_files(self) -> list[Path]:
        return epoch_files(self.files, self.seed, self.epoch)

    def _next_refill(self) -> Refill:
        if self._reader is None:
            self._reader = DocumentReader(
                self.files,
                self.seed,
                self.text_field,
                self.encoder,
                self._fill_chars,
                (self.epoch, self.file_idx, self.record_idx),
                self.skipped,
            )
            if self.prefetch:
                self._prefetcher = Prefetcher(self._reader.next_refill)
                # The thread holds the reader, not this dataset: stop it when the dataset goes.
                self._finalizer = weakref.finalize(self, self._prefetcher.close, 0)
        if self._prefetcher is not None:
            return self._prefetcher.get()
        return self._reader.next_refill()

    def _fill(self) -> None:
        refill = self._next_refill()
        if refill.epoch_starts:
            # Every epoch holds the same tokens (each document is tokenized on its own), so
            # where epoch e begins in the stream is e epochs' worth.
            begins = self.window_idx * (self.seq_len + 1) + len(self.buffer)
            self.epoch_tokens = (begins + refill.epoch_starts[-1]) // refill.epoch
        self.buffer.extend(refill.ids)
        self.epoch, self.file_idx, self.record_idx = (
            refill.epoch,
            refill.file_idx,
            refill.record_idx,
        )
        self.skipped.count, self.skipped.examples = refill.skipped, list(refill.examples)

    def close(self, timeout: float | None = None) -> None:
        """Stop reading ahead (at the same refill on every rank that cut as many windows: see
        prefetch.py); the next window asked for starts a reader at the position reached."""
        if self._prefetcher is not None:
            self._prefetcher.close(timeout)
        if self._finalizer is not None:
            self._finalizer.detach()
        self._reader, self._prefetcher, self._finalizer = None, None, None

    @property
    def reader_thread(self) -> threading.Thread | None:
        return self._prefetcher.thread if self._prefetcher is not None else None

    def read_through(self, windows: int) -> None:
        """Read until the stream's first `windows` windows are cut or in the buffer (a mixture's
        text source reads a micro-batch's worth at its start: titanlite/data/mixture_text.py)."""
        n = self.seq_len + 1
        while self.window_idx * n + len(self.buffer) < windows * n:
            self._fill()

    def cut_window(self) -> list[int]:
        """The next window of the global stream, whichever rank reads it (a mixture's text
        source cuts its own: titanlite/data/mixture_text.py)."""
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
            window = self.cut_window()
            if not self.split.owns(pos):
                continue
            if self.split.ends_share(pos):
                # The rest of this micro-batch belongs to other ranks: step past it before
                # yielding, so that between steps every rank's state is the same.
                while self.window_idx < self.split.chunk_end(pos):
                    self.cut_window()
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
        # What was read ahead continues the old position: dropped, read again from the new one.
        self.close()
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
