"""Reads what an offline W&B run wrote: its `run-ID.wandb` file. wandb (0.31) ships no Python
reader for it (its Go core writes and syncs it), only the protobuf classes of its records, which
this uses. The framing is LevelDB's log format, as wandb-core writes it: a 7-byte header
(":W&B", magic 0xBEE1, version 0), then 32 KiB blocks of records, each a 7-byte header (masked
CRC-32C, length, type: 1 full, 2 first, 3 middle, 4 last) and a piece of a serialized `Record`."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wandb.proto import wandb_internal_pb2

_BLOCK, _HEADER = 32 * 1024, 7
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[Any]:
    data = path.read_bytes()
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1, data[:7]
    pos, parts = _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + _HEADER])
        if kind == 0:  # zeros: the rest of the block is padding
            pos += left
            continue
        piece = data[pos + _HEADER : pos + _HEADER + length]
        pos += _HEADER + length
        parts = piece if kind in (_FULL, _FIRST) else parts + piece
        if kind in (_FULL, _LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            yield record


def read_run(path: Path) -> dict[str, Any]:
    """{"id", "config": {key: value}, "history": [{tag: value}, ...]} of one .wandb file."""
    run: dict[str, Any] = {"id": None, "config": {}, "history": []}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            run["id"] = r.run.run_id
            run["config"].update({u.key: json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "config":
            run["config"].update({u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "history":
            run["history"].append(
                {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            )
    return run
