"""Where documents come from: text, .jsonl and .parquet files, and Hugging Face datasets saved
with `save_to_disk`, read the same way by the on-the-fly reader (text_dataset.py) and by the shard
preparation tool (prepare.py), so the two produce the same token stream.

A .txt/.py file is one document; a .jsonl line, a .parquet row and a saved dataset's row are one
document each, the text in a named field. A malformed record is skipped, counted, and the first
few reported as file:line (file:row for parquet and saved datasets).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from titanlite.core.io import special_kind
from titanlite.core.logging import logger

TEXT_SUFFIXES = (".txt", ".py")  # one file = one document
JSONL_SUFFIXES = (".jsonl",)  # one line = one document
PARQUET_SUFFIXES = (".parquet",)  # one row = one document
SUFFIXES = TEXT_SUFFIXES + JSONL_SUFFIXES + PARQUET_SUFFIXES
# One row = one document. Read only as the files a saved dataset's state.json lists, never found
# by searching a folder (`datasets` also keeps .arrow files in its caches).
ARROW_SUFFIX = ".arrow"
_MAX_REPORTED = 5


class DatasetError(ValueError):
    pass


def need_pyarrow():
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DatasetError(
            "reading .parquet files needs pyarrow: pip install 'titanlite[data]' (or pip install pyarrow)"
        ) from None
    return pq


def list_files(path: Path, key: str = "training.dataset_path") -> list[Path]:
    """The dataset's files in a fixed order; DatasetError if there is nothing to read."""
    if not path.exists():
        raise DatasetError(f"{key}: {path} does not exist")
    if kind := special_kind(path):
        raise DatasetError(f"{key}: {path} is {kind}; give a file or a folder of files")
    if (saved := saved_dataset_files(path, key)) is not None:
        files = saved
    elif path.is_file():
        files = [path] if path.suffix in SUFFIXES else []
    else:
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        raise DatasetError(f"{key}: {path} holds no {'/'.join(SUFFIXES)} files to train on")
    if sum(f.stat().st_size for f in files) == 0:
        raise DatasetError(f"{key}: {path}: every file is empty")
    if any(f.suffix in PARQUET_SUFFIXES + (ARROW_SUFFIX,) for f in files):
        need_pyarrow()
    return files


def saved_dataset_files(path: Path, key: str) -> list[Path] | None:
    """The arrow files, in row order, of a folder written by `datasets`' `save_to_disk` (told by
    its state.json and dataset_info.json); None for any other path. The files are Arrow IPC
    streams read with pyarrow: training from a saved dataset does not need `datasets` itself."""
    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text()).get("splits", [])
        raise DatasetError(
            f"{key}: {path} is a Hugging Face DatasetDict (splits: {', '.join(splits)}); "
            f"point it at one split's folder, e.g. {path / (splits[0] if splits else 'train')}"
        )
    state = path / "state.json"
    if not (state.is_file() and (path / "dataset_info.json").is_file()):
        return None
    try:
        names = [f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    except (ValueError, KeyError, TypeError):
        raise DatasetError(f"{key}: {state} is not a saved dataset's state.json") from None
    files = [path / name for name in names]
    if missing := [f for f in files if not f.is_file()]:
        raise DatasetError(f"{key}: {missing[0]}, listed in {state}, is missing")
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


def parse_jsonl_line(
    line: bytes, text_field: str, where: str, skipped: SkippedRecords
) -> str | None:
    """The text of one .jsonl line; None (counted in `skipped` unless blank) if it has none."""
    if not line.strip():
        return None
    try:
        text = json.loads(line)[text_field]
        if not isinstance(text, str):
            raise TypeError(f"field '{text_field}' is {type(text).__name__}, not text")
    except (ValueError, KeyError, TypeError) as e:
        why = f"no '{text_field}' field" if isinstance(e, KeyError) else str(e)
        skipped.add(where, why[:120])
        return None
    return text


def iter_parquet(
    path: Path,
    text_field: str,
    skipped: SkippedRecords,
    first_row: int = 0,
    row_groups: tuple[int, int] | None = None,
) -> Iterator[tuple[int, str]]:
    """(row index, text) of a parquet file's rows from `first_row` (or of row groups [a, b)),
    one row group in memory at a time."""
    pf = need_pyarrow().ParquetFile(path)
    if text_field not in pf.schema_arrow.names:
        raise DatasetError(
            f"{path}: no column '{text_field}' (columns: "
            f"{', '.join(pf.schema_arrow.names)}); set the text field to one of them"
        )
    start, stop = row_groups or (0, pf.num_row_groups)
    groups = (
        (pf.metadata.row_group(g).num_rows, lambda g=g: pf.read_row_group(g, columns=[text_field]))
        for g in range(start, stop)
    )
    first = sum(pf.metadata.row_group(g).num_rows for g in range(start))
    yield from _row_texts(groups, first, first_row, path, text_field, skipped)


def iter_arrow(
    path: Path, text_field: str, skipped: SkippedRecords, first_row: int = 0
) -> Iterator[tuple[int, str]]:
    """(row index, text) of a saved dataset's arrow file (an Arrow IPC stream) from `first_row`,
    memory-mapped, one record batch at a time."""
    import pyarrow as pa

    reader = pa.ipc.open_stream(pa.memory_map(str(path)))
    if text_field not in reader.schema.names:
        raise DatasetError(
            f"{path}: no column '{text_field}' (columns: {', '.join(reader.schema.names)}); set "
            "the text field to one of them"
        )
    batches = ((b.num_rows, lambda b=b: b.select([text_field])) for b in reader)
    yield from _row_texts(batches, 0, first_row, path, text_field, skipped)


def _row_texts(
    chunks: Iterator[tuple[int, Callable[[], Any]]],
    row: int,
    first_row: int,
    path: Path,
    text_field: str,
    skipped: SkippedRecords,
) -> Iterator[tuple[int, str]]:
    """(row index, text) of a table read in chunks given as (rows, a function reading it as one
    column), the first chunk's first row being `row`; chunks wholly before `first_row` are
    skipped without reading them."""
    for n, read in chunks:
        if row + n <= first_row:
            row += n
            continue
        for text in read().column(0).to_pylist():
            if row >= first_row:
                if isinstance(text, str):
                    yield row, text
                else:
                    skipped.add(
                        f"{path}:row {row}",
                        f"field '{text_field}' is {type(text).__name__}, not text",
                    )
            row += 1


def iter_file(
    path: Path, text_field: str, skipped: SkippedRecords, first_record: int = 0
) -> Iterator[tuple[int, str]]:
    """(record index, text) of one file's non-empty documents, from `first_record` on."""
    if path.suffix in TEXT_SUFFIXES:
        if first_record == 0:
            raw = path.read_bytes()
            try:
                whole = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                # Replacing bad bytes would train on U+FFFD silently: the file is skipped and
                # counted like a malformed jsonl line, with where the first bad byte is.
                skipped.add(f"{path}", f"not UTF-8 (byte {e.start}: {e.reason})")
                return
            if whole.strip():
                yield 0, whole
    elif path.suffix in PARQUET_SUFFIXES:
        yield from iter_parquet(path, text_field, skipped, first_record)
    elif path.suffix == ARROW_SUFFIX:
        yield from iter_arrow(path, text_field, skipped, first_record)
    else:
        with path.open("rb") as f:
            for ri, line in enumerate(f):
                if ri >= first_record:
                    text = parse_jsonl_line(line, text_field, f"{path}:{ri + 1}", skipped)
                    if text is not None:
                        yield ri, text


def iter_documents(
    files: list[Path], text_field: str, start_file: int, start_record: int, skipped: SkippedRecords
) -> Iterator[tuple[int, int, str]]:
    """(file index, record index, text) from position (start_file, start_record) to the end."""
    for fi in range(start_file, len(files)):
        first = start_record if fi == start_file else 0
        for ri, text in iter_file(files[fi], text_field, skipped, first):
            yield fi, ri, text
