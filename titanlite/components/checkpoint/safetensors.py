"""safetensors files streamed, without the safetensors package: a header read and checked, a
tensor (or a range of its rows) read straight from its byte range, and a writer that puts the
header first and then each tensor in turn, so that neither side ever holds a whole model."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from titanlite.components.checkpoint.folder import CheckpointError

_ST_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
_MAX_HEADER = 100 * 2**20


@dataclass(frozen=True)
class Entry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def nbytes(shape: Iterable[int], dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def read_safetensors_header(path: Path) -> dict[str, Entry]:
    """The tensors of a safetensors file, checked: known dtypes, sizes that match the shapes,
    byte ranges that tile the file exactly."""

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{path}: not a valid safetensors file ({why})")

    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise bad("shorter than its header")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise bad(f"header length {n} for a file of {size} bytes")
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise bad(f"header is not JSON: {e}") from None
    entries, base = {}, 8 + n
    for name, record in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = _ST_NAMES[record["dtype"]], tuple(record["shape"])
            start, end = record["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name}: unreadable entry {record}") from None
        if end - start != nbytes(shape, dtype):
            raise bad(
                f"tensor {name}: {end - start} bytes for shape {list(shape)} {record['dtype']}"
            )
        entries[name] = Entry(path, dtype, shape, base + start, base + end)
    pos = base
    for name, entry in sorted(entries.items(), key=lambda kv: kv[1].start):
        if entry.start != pos:
            raise bad(f"tensor {name} starts at byte {entry.start}, expected {pos}")
        pos = entry.end
    if pos != size:
        raise bad(f"data ends at byte {pos}, the file has {size} (truncated?)")
    return entries


def read_tensor(f: BinaryIO, e: Entry) -> torch.Tensor:
    buf = torch.empty(e.end - e.start, dtype=torch.uint8)
    f.seek(e.start)
    if f.readinto(memoryview(buf.numpy())) != e.end - e.start:  # type: ignore[attr-defined,arg-type]
        raise CheckpointError(f"{e.file}: truncated")
    return buf.view(e.dtype).reshape(e.shape)


def read_rows(f: BinaryIO, e: Entry, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a tensor's first dimension: one contiguous byte range."""
    row = nbytes(e.shape[1:], e.dtype)
    part = Entry(e.file, e.dtype, (stop - start, *e.shape[1:]), e.start + start * row, 0)
    return read_tensor(f, dataclasses.replace(part, end=part.start + (stop - start) * row))


class SafetensorsWriter:
    """Writes the header for `entries` (name, shape, dtype) at once, then each tensor in turn."""

    def __init__(self, path: Path, entries: list[tuple[str, tuple[int, ...], torch.dtype]]):
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for name, shape, dtype in entries:
            n = nbytes(shape, dtype)
            header[name] = {
                "dtype": _ST_DTYPES[dtype],
                "shape": list(shape),
                "data_offsets": [offset, offset + n],
            }
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
        self.path, self.pending = path, list(entries)
        self.f = path.open("xb")
        self.f.write(struct.pack("<Q", len(raw)) + raw)

    def write(self, name: str, t: torch.Tensor) -> None:
        want = self.pending.pop(0)
        if (name, tuple(t.shape), t.dtype) != want:
            raise AssertionError(
                f"{self.path}: got {name} {tuple(t.shape)} {t.dtype}, expected {want}"
            )
        # A view, not a copy: tensors can be GBs. (numpy's stubs omit the buffer protocol.)
        self.f.write(memoryview(t.contiguous().view(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]

    def close(self) -> None:
        if self.pending:
            raise AssertionError(f"{self.path}: {len(self.pending)} tensors never written")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
