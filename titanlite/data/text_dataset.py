"""Text documents -> packed token windows, tokenized on the fly.

Every data-parallel rank reads the same global token stream: the files in an order shuffled per
epoch by (seed, epoch) (so one topic or file type never fills many steps in a row), each
document framed by BOS/EOS, concatenated and cut into non-overlapping windows of seq_len + 1 tokens
(input = window[:-1], labels = window[1:]); the stream repeats by epochs without end. Window g
goes to rank (g // local_batch_size) % dp_size, so the global batch of a step is the same set of
windows whatever the data-parallel degree, and the loader's position is the same on every rank.
The price is that each rank tokenizes the whole stream; the Rust tokenizer's batched encoding
keeps that far below a training step's time at the scales this reader is meant for.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset

from titanlite.data.tokenizer import Tokenizer
from titanlite.logging import logger

TEXT_SUFFIXES = (".txt", ".py")  # one file = one document
JSONL_SUFFIXES = (".jsonl",)  # one line = one document
_TOKENIZE_BATCH_CHARS = 1 << 18  # text gathered per encode_batch call
_MAX_REPORTED = 5


class DatasetError(ValueError):
    pass


def list_files(path: Path) -> list[Path]:
    """The dataset's files in a fixed order; DatasetError if there is nothing to read."""
    if not path.exists():
        raise DatasetError(f"training.dataset_path: {path} does not exist")
    suffixes = TEXT_SUFFIXES + JSONL_SUFFIXES
    if path.is_file():
        files = [path] if path.suffix in suffixes else []
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in suffixes)
    if not files:
        raise DatasetError(
            f"training.dataset_path: {path} holds no {'/'.join(suffixes)} files to train on"
        )
    if sum(f.stat().st_size for f in files) == 0:
        raise DatasetError(f"training.dataset_path: {path}: every file is empty")
    return files


@dataclass
class SkippedRecords:
    """Malformed records are skipped, counted, and the first few reported with file:line."""

    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, where: str, why: str) -> None:
        self.count += 1
        if len(self.examples) < _MAX_REPORTED:
            self.examples.append(f"{where}: {why}")
            logger.warning(f"skipping malformed record {where}: {why}")


def iter_documents(files: list[Path], text_field: str, start_file: int, start_record: int,
                   skipped: SkippedRecords) -> Iterator[tuple[int, int, str]]:
    """(file index, record index, text) from position (start_file, start_record) to the end."""
    for fi in range(start_file, len(files)):
        path = files[fi]
        first = start_record if fi == start_file else 0
        if path.suffix in TEXT_SUFFIXES:
            if first == 0:
                text = path.read_text(encoding="utf-8", errors="replace")
                if text.strip():
                    yield fi, 0, text
            continue
        with path.open("rb") as f:
            for ri, line in enumerate(f):
                if ri < first or not line.strip():
                    continue
                try:
                    text = json.loads(line)[text_field]
                    if not isinstance(text, str):
                        raise TypeError(f"field '{text_field}' is {type(text).__name__}, not text")
                except (ValueError, KeyError, TypeError) as e:
                    why = f"no '{text_field}' field" if isinstance(e, KeyError) else str(e)
                    skipped.add(f"{path}:{ri + 1}", why[:120])
                    continue
                yield fi, ri, text


class PackedTextDataset(IterableDataset):
    """Windows of seq_len + 1 tokens for one data-parallel rank; stateful for exact resume."""

    def __init__(self, files: list[Path], tokenizer: Tokenizer, seq_len: int, local_batch_size: int,
                 dp_rank: int, dp_size: int, seed: int = 0, text_field: str = "text"):
        self.files, self.tokenizer, self.seq_len, self.seed = files, tokenizer, seq_len, seed
        self.local_batch_size, self.dp_rank, self.dp_size = local_batch_size, dp_rank, dp_size
        self.text_field = text_field
        self.skipped = SkippedRecords()
        # Position in the global stream: the next document to read, the tokens read but not yet
        # cut into windows, and the index of the next window.
        self.epoch, self.file_idx, self.record_idx = 0, 0, 0
        self.buffer: list[int] = []
        self.window_idx = 0

    def _epoch_files(self) -> list[Path]:
        order = list(self.files)
        random.Random(f"{self.seed}:{self.epoch}").shuffle(order)
        return order

    def _owns(self, window: int) -> bool:
        return (window // self.local_batch_size) % self.dp_size == self.dp_rank

    def _fill(self) -> None:
        """Tokenize the next documents (about _TOKENIZE_BATCH_CHARS of text) into the buffer,
        wrapping around to a new epoch at the end of the data."""
        texts: list[str] = []
        size = 0
        while size < _TOKENIZE_BATCH_CHARS:
            from_start = (self.file_idx, self.record_idx) == (0, 0)
            got_any = False
            files = self._epoch_files()
            for fi, ri, text in iter_documents(files, self.text_field, self.file_idx,
                                               self.record_idx, self.skipped):
                got_any = True
                texts.append(text)
                size += len(text)
                self.file_idx, self.record_idx = fi, ri + 1
                if size >= _TOKENIZE_BATCH_CHARS:
                    break
            else:
                if from_start and not got_any:
                    raise DatasetError(
                        f"training dataset: no readable document in {len(self.files)} file(s) "
                        f"({self.skipped.count} malformed records)"
                    )
                self.epoch, self.file_idx, self.record_idx = self.epoch + 1, 0, 0
        for ids in self.tokenizer.encode_documents(texts):
            self.buffer.extend(ids)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n = self.seq_len + 1
        while True:
            while len(self.buffer) < n:
                self._fill()
            window = self.buffer[:n]
            # Deleting the head in place avoids copying the whole remaining buffer per window.
            del self.buffer[:n]
            owned = self._owns(self.window_idx)
            self.window_idx += 1
            if owned:
                t = torch.tensor(window, dtype=torch.long)
                yield t[:-1], t[1:]

    def state_dict(self) -> dict[str, Any]:
        # Plain data only (a list, not a tensor): its length varies, and DCP loads tensors in
        # place into a template of the saved size, which a fresh loader cannot provide.
        return {"epoch": self.epoch, "file_idx": self.file_idx, "record_idx": self.record_idx,
                "buffer": list(self.buffer), "window_idx": self.window_idx,
                "skipped": self.skipped.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.file_idx = state["epoch"], state["file_idx"]
        self.record_idx, self.window_idx = state["record_idx"], state["window_idx"]
        self.buffer = list(state["buffer"])
        self.skipped.count = state["skipped"]
