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
    ARROW_SUFFIX,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    DatasetError,
    SkippedRecords,
    iter_file,
    iter_parquet,
    need_pyarrow,
    parse_jsonl_line,
    saved_dataset_files,
)

_HF_ROWS = 1000  # rows fetched from a Hugging Face dataset at a time


@dataclasses.dataclass(frozen=True)
class Segment:
    """A contiguous part of one input: a whole text file or saved dataset's arrow file, a byte
    range of a .jsonl file (starting at line `line`), row groups [start, stop) of a parquet file,
    rows [start, stop) of a Hugging Face dataset, or its streaming shards [start, stop) (of its
    data files). Size and mtime make a changed file a different segment."""

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
    hf_data_files: tuple[str, ...] = ()
    hf_streaming: bool = False


def segment_record(seg: Segment) -> dict[str, Any]:
    """The segment as recorded with its shard (what a rerun compares). The Hugging Face fields
    added later appear only when used, so the records of shards made before still match."""
    record = dataclasses.asdict(seg)
    for key in ("hf_data_files", "hf_streaming"):
        if not record[key]:
            del record[key]
    if "hf_data_files" in record:
        record["hf_data_files"] = list(record["hf_data_files"])  # as JSON reads it back
    return record


@dataclasses.dataclass(frozen=True)
class HFSource:
    """What `--hf-dataset` names: a hub name, a local builder ("json", "parquet", ... with
    data_files) or dataset folder, or a folder written by `save_to_disk`."""

    name: str
    config: str | None = None
    split: str = "train"
    data_files: tuple[str, ...] = ()
    streaming: bool = False


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
            kind = "arrow" if f.suffix == ARROW_SUFFIX else "text"
            add(Segment(kind, str(f), 0, size, size=size, mtime_ns=mtime_ns, nbytes=size))
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


def plan_hf(src: HFSource, target_bytes: int, text_field: str) -> list[list[Segment]]:
    """A Hugging Face dataset in row ranges of about target_bytes, or streamed: one piece per
    streaming shard (a data file; its length is unknown until read). Its own path: `datasets`
    is an optional, heavy dependency, imported only in _hf_dataset."""
    ds = _hf_dataset(src)
    columns = ds.column_names  # None for a stream whose features are not declared
    if columns is not None and text_field not in columns:
        raise DatasetError(
            f"--hf-dataset {src.name}: no column '{text_field}' (columns: {', '.join(columns)}); "
            "set --text-field to one of them"
        )

    def segment(a: int, b: int, nbytes: int) -> Segment:
        return Segment(
            "hf",
            src.name,
            a,
            b,
            hf_config=src.config,
            hf_split=src.split,
            nbytes=nbytes,
            hf_data_files=src.data_files,
            hf_streaming=src.streaming,
        )

    if src.streaming:
        return [[segment(i, i + 1, target_bytes)] for i in range(ds.n_shards)]
    rows, nbytes = len(ds), max(1, int(getattr(ds.data, "nbytes", 0) or 1))
    per = max(1, int(rows * target_bytes / nbytes)) if nbytes > 1 else 10_000
    return [
        [segment(a, min(rows, a + per), nbytes * (min(rows, a + per) - a) // max(rows, 1))]
        for a in range(0, rows, per)
    ]


_HF_CACHE: dict[HFSource, Any] = {}


def _hf_dataset(src: HFSource) -> Any:
    if src not in _HF_CACHE:
        try:
            import datasets
        except ImportError:
            raise DatasetError(
                "--hf-dataset needs the datasets library: pip install 'titanlite[hf]' "
                "(or pip install datasets)"
            ) from None
        try:
            if saved_dataset_files(Path(src.name), "--hf-dataset") is not None:
                ds = datasets.load_from_disk(src.name)  # memory-mapped: streaming adds nothing
                _HF_CACHE[src] = ds.to_iterable_dataset() if src.streaming else ds
            else:
                _HF_CACHE[src] = datasets.load_dataset(
                    src.name,
                    src.config,
                    split=src.split,
                    data_files=list(src.data_files) or None,
                    streaming=src.streaming,
                )
        except DatasetError:
            raise
        except Exception as e:  # datasets raises many kinds (not found, offline, bad split)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            raise DatasetError(
                f"--hf-dataset {src.name}: cannot load it ({type(e).__name__}: {first})"
            ) from None
    return _HF_CACHE[src]


def read_segment(seg: Segment, text_field: str, skipped: SkippedRecords) -> Iterator[str]:
    """The texts of one segment, in order."""
    if seg.kind in ("text", "arrow"):
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
    elif seg.hf_streaming:
        yield from _read_hf_stream(seg, text_field, skipped)
    else:
        ds = _hf_dataset(_hf_source(seg))
        for a in range(seg.start, seg.stop, _HF_ROWS):
            for i, text in enumerate(ds[a : min(seg.stop, a + _HF_ROWS)][text_field]):
                if isinstance(text, str):
                    yield text
                else:
                    skipped.add(f"{seg.path}:row {a + i}", f"field '{text_field}' is not text")


def _hf_source(seg: Segment) -> HFSource:
    return HFSource(seg.path, seg.hf_config, seg.hf_split, seg.hf_data_files, seg.hf_streaming)


def _read_hf_stream(seg: Segment, text_field: str, skipped: SkippedRecords) -> Iterator[str]:
    ds = _hf_dataset(_hf_source(seg))
    for shard in range(seg.start, seg.stop):
        for i, row in enumerate(ds.shard(num_shards=ds.n_shards, index=shard)):
            text = row.get(text_field)
            if isinstance(text, str):
                yield text
            else:
                why = "is missing" if text_field not in row else "is not text"
                skipped.add(f"{seg.path}:shard {shard} row {i}", f"field '{text_field}' {why}")
