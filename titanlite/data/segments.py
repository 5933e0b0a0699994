"""What the preparation tool cuts its input into, and how it reads one piece.

A piece is a list of segments (parts of input files, or row ranges of a Hugging Face dataset)
of about --shard-mb of text; it depends only on the inputs, so a rerun plans the same pieces and
can tell which shards are already done. Documents are read by the on-the-fly reader's code
(documents.py), so both see the same documents in the same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from titanlite.data.documents import (
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    DatasetError,
    SkippedRecords,
    iter_file,
    iter_parquet,
    need_pyarrow,
    parse_jsonl_line,
)

_HF_ROWS = 1000  # rows fetched from a Hugging Face dataset at a time


@dataclasses.dataclass(frozen=True)
class Segment:
    """A contiguous part of one input: a whole text file, a byte range of a .jsonl file
    (starting at line `line`), row groups [start, stop) of a parquet file, or rows [start, stop)
    of a Hugging Face dataset. Size and mtime make a changed file a different segment."""

    kind: str
    path: str
    start: int
    stop: int
    line: int = 1
    size: int = 0
    mtime_ns: int = 0
    hf_config: str | None = None
    hf_split: str = ""
    nbytes: int = 0  # text size, roughly: for planning and the progress line


def plan_files(files: list[Path], target_bytes: int) -> list[list[Segment]]:
    """Split the files, in order, into pieces of about target_bytes (a piece never splits a
    document)."""
    pieces: list[list[Segment]] = [[]]
    fill = 0

    def add(seg: Segment) -> None:
        nonlocal fill
        if pieces[-1] and fill + seg.nbytes > target_bytes:
            pieces.append([])
            fill = 0
        pieces[-1].append(seg)
        fill += seg.nbytes

    for f in files:
        st = f.stat()
        size, mtime_ns = st.st_size, st.st_mtime_ns
        if f.suffix in PARQUET_SUFFIXES:
            meta = need_pyarrow().ParquetFile(f).metadata
            for g in range(meta.num_row_groups):
                add(
                    Segment(
                        "parquet",
                        str(f),
                        g,
                        g + 1,
                        size=size,
                        mtime_ns=mtime_ns,
                        nbytes=meta.row_group(g).total_byte_size,
                    )
                )
        elif f.suffix in JSONL_SUFFIXES:
            for start, stop, line in _jsonl_ranges(f, target_bytes):
                add(
                    Segment(
                        "jsonl",
                        str(f),
                        start,
                        stop,
                        line,
                        size=size,
                        mtime_ns=mtime_ns,
                        nbytes=stop - start,
                    )
                )
        else:
            add(Segment("text", str(f), 0, size, size=size, mtime_ns=mtime_ns, nbytes=size))
    return [p for p in pieces if p]


def _jsonl_ranges(path: Path, target_bytes: int) -> list[tuple[int, int, int]]:
    """(start byte, stop byte, first line number) ranges of about target_bytes, cut at line ends."""
    ranges, start, line, size = [], 0, 1, path.stat().st_size
    with path.open("rb") as f:
        while start < size:
            f.seek(min(size, start + target_bytes))
            f.readline()  # to the end of the line the cut fell in
            stop = min(size, f.tell())
            ranges.append((start, stop, line))
            f.seek(start)
            left = stop - start
            while left:  # count the range's lines, for file:line in error reports
                chunk = f.read(min(left, 1 << 24))
                line += chunk.count(b"\n")
                left -= len(chunk)
            start = stop
    return ranges


def plan_hf(name: str, config: str | None, split: str, target_bytes: int) -> list[list[Segment]]:
    """A Hugging Face dataset in row ranges of about target_bytes (its own path: `datasets` is an
    optional, heavy dependency and is imported only here and in _hf_dataset)."""
    ds = _hf_dataset(name, config, split)
    rows, nbytes = len(ds), max(1, int(getattr(ds.data, "nbytes", 0) or 1))
    per = max(1, int(rows * target_bytes / nbytes)) if nbytes > 1 else 10_000
    return [
        [
            Segment(
                "hf",
                name,
                a,
                min(rows, a + per),
                hf_config=config,
                hf_split=split,
                nbytes=nbytes * (min(rows, a + per) - a) // max(rows, 1),
            )
        ]
        for a in range(0, rows, per)
    ]


_HF_CACHE: dict[tuple, Any] = {}


def _hf_dataset(name: str, config: str | None, split: str) -> Any:
    key = (name, config, split)
    if key not in _HF_CACHE:
        try:
            import datasets
        except ImportError:
            raise DatasetError(
                "--hf-dataset needs the datasets library: pip install datasets"
            ) from None
        _HF_CACHE[key] = datasets.load_dataset(name, config, split=split)
    return _HF_CACHE[key]


def read_segment(seg: Segment, text_field: str, skipped: SkippedRecords) -> Iterator[str]:
    """The texts of one segment, in order."""
    if seg.kind == "text":
        for _, whole in iter_file(Path(seg.path), text_field, skipped):
            yield whole
    elif seg.kind == "parquet":
        for _, row_text in iter_parquet(
            Path(seg.path), text_field, skipped, row_groups=(seg.start, seg.stop)
        ):
            yield row_text
    elif seg.kind == "jsonl":
        with open(seg.path, "rb") as f:
            f.seek(seg.start)
            line_no, pos = seg.line, seg.start
            while pos < seg.stop:
                line = f.readline()
                pos += len(line)
                text = parse_jsonl_line(line, text_field, f"{seg.path}:{line_no}", skipped)
                if text is not None:
                    yield text
                line_no += 1
    else:
        ds = _hf_dataset(seg.path, seg.hf_config, seg.hf_split)
        for a in range(seg.start, seg.stop, _HF_ROWS):
            for i, text in enumerate(ds[a : min(seg.stop, a + _HF_ROWS)][text_field]):
                if isinstance(text, str):
                    yield text
                else:
                    skipped.add(f"{seg.path}:row {a + i}", f"field '{text_field}' is not text")
