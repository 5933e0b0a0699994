"""Files that are either whole or absent, and their checksums: what checkpoints, prepared data
and the run's own records rely on."""

from __future__ import annotations

import zlib
from pathlib import Path

_CHUNK = 1 << 22  # 4 MiB reads: large enough for full disk speed, small enough for any memory


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` through a temporary file renamed over it: a crash leaves the old file or
    the new one, never half of either."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def file_crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc
