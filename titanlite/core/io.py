"""Files that are either whole or absent, and their checksums: what checkpoints, prepared data
and the run's own records rely on."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

_CHUNK = 1 << 22  # 4 MiB reads: large enough for full disk speed, small enough for any memory


def _temporary(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def atomic_write_text(path: Path, text: str) -> None:
    """Write `path` through a temporary file renamed over it: a crash leaves the old file or
    the new one, never half of either."""
    tmp = _temporary(path)
    tmp.write_text(text)
    tmp.replace(path)


@contextmanager
def atomic_writer(path: Path) -> Iterator[BinaryIO]:
    """A binary file to stream `path` into, renamed over `path` when the block ends without an
    error (as atomic_write_text); after an error the temporary file is left as it is."""
    tmp = _temporary(path)
    with tmp.open("wb") as f:
        yield f
    tmp.replace(path)


def file_crc32(path: Path) -> int:
    crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def special_kind(path: Path) -> str | None:
    """What `path` is when it exists and is neither a regular file nor a folder (a named pipe,
    a device, a socket): reading one blocks or never ends, so callers refuse it by name before
    opening it. None otherwise."""
    import stat

    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kinds = {
        stat.S_ISFIFO: "a named pipe (FIFO)",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), None)
