"""Prepared shards: the on-disk format, a memory-mapped reader, and the checks made before training.

A prepared dataset is a folder written by `titanlite.data.prepare`:

    manifest.json      format, tokenizer fingerprint, dtype, and per shard: token and document
                       counts, largest id, EOS count, CRC32 of each file
    shard_00000.bin    token ids, little-endian uint16 (vocabularies up to 65,536) or uint32;
                       documents back to back, each BOS ... EOS, as the on-the-fly reader frames them
    shard_00000.idx    uint64 offsets of each document's first token in the shard, then the end
    shard_00000.json   the shard's manifest entry, written last: proof that the shard is complete

The shards, in manifest order, form one token stream; the reader cuts it into windows of
seq_len + 1 tokens. Nothing is read into memory beyond the windows asked for.
`python -m titanlite.data.prepare --verify PATH` checks a prepared dataset's checksums.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from titanlite.core.io import file_crc32
from titanlite.data.documents import DatasetError

FORMAT, VERSION = "titanlite-shards", 1
MANIFEST = "manifest.json"
_OPEN_MAPS = 64  # memory maps kept open (a corpus may have thousands of shards)
_SAMPLES_PER_SHARD = 1024  # token ids read per shard by the startup check
_REPREPARE = "prepare it again (scripts/prepare_data.py redoes missing or damaged shards)"


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def manifest_path(path: Path | str) -> Path:
    path = Path(path)
    return path if path.name == MANIFEST else path / MANIFEST


def is_prepared(path: Path) -> bool:
    """Does `path` hold prepared shards (a manifest, or a folder with one)?"""
    return manifest_path(path).is_file()


def read_manifest(path: Path, key: str = "training.dataset_path") -> dict[str, Any]:
    path = manifest_path(path)
    try:
        m = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DatasetError(f"{key}: cannot read {path}: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise DatasetError(f"{key}: {path} is not a titanlite shard manifest; {_REPREPARE}")
    if m.get("version") != VERSION:
        raise DatasetError(
            f"{key}: {path} has format version {m.get('version')}, this titanlite "
            f"reads version {VERSION}; {_REPREPARE}"
        )
    return m


class ShardSet:
    """The shards of a manifest as one token stream, read through memory maps."""

    def __init__(self, path: Path | str, key: str = "training.dataset_path"):
        self.manifest_file, self.key = manifest_path(path), key
        self.root = self.manifest_file.parent
        self.manifest = read_manifest(self.manifest_file, key)
        self.shards: list[dict[str, Any]] = self.manifest["shards"]
        if self.manifest["dtype"] not in ("uint16", "uint32"):
            raise DatasetError(
                f"{key}: {self.manifest_file}: dtype {self.manifest['dtype']!r} is "
                f"not uint16/uint32; {_REPREPARE}"
            )
        self.dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        self.starts = [0]  # global offset of each shard's first token, then the total
        for s in self.shards:
            self.starts.append(self.starts[-1] + s["tokens"])
        self.total_tokens = self.starts[-1]
        self._maps: OrderedDict[int, np.ndarray] = OrderedDict()

    @property
    def fingerprint(self) -> str:
        """Identifies the token stream (not the folder it lives in)."""
        h = hashlib.sha256(self.manifest["tokenizer"]["fingerprint"].encode())
        for s in self.shards:
            h.update(f"{s['tokens']}:{s['bin_crc32']};".encode())
        return h.hexdigest()[:16]

    def bin_path(self, i: int) -> Path:
        return self.root / f"{self.shards[i]['name']}.bin"

    def idx_path(self, i: int) -> Path:
        return self.root / f"{self.shards[i]['name']}.idx"

    def _map(self, i: int) -> np.ndarray:
        m = self._maps.pop(i, None)
        if m is None:
            m = np.memmap(self.bin_path(i), dtype=self.dtype, mode="r")
            if len(self._maps) >= _OPEN_MAPS:
                self._maps.popitem(last=False)
        self._maps[i] = m
        return m

    def tokens(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start + n) of the stream (a copy, possibly spanning shards)."""
        i = int(np.searchsorted(self.starts, start, side="right")) - 1
        pieces, need = [], n
        while need > 0:
            local = start - self.starts[i]
            take = min(need, self.shards[i]["tokens"] - local)
            pieces.append(self._map(i)[local : local + take])
            start, need, i = start + take, need - take, i + 1
        return np.concatenate(pieces) if len(pieces) > 1 else np.array(pieces[0])

    def num_windows(self, seq_len: int) -> int:
        return self.total_tokens // (seq_len + 1)

    def window(self, w: int, seq_len: int) -> np.ndarray:
        n = seq_len + 1
        return self.tokens(w * n, n)

    def documents(self, i: int) -> np.ndarray:
        """Document start offsets within shard i, then its end."""
        return np.fromfile(self.idx_path(i), dtype="<u8")

    # ------------------------------------------------------------------------------------------
    # checks

    def check(self, vocab_size: int, tokenizer_fingerprint: str, tokenizer_path: Path) -> None:
        """The cheap checks, before training: same tokenizer, non-empty shards, files of the
        manifest's size, ids below the vocabulary size (manifest stats and a sample of each
        shard), EOS present, dtype as stated (a shard starts with BOS and ends with EOS).
        Raise DatasetError naming the shard and the fix."""
        m, where = self.manifest, f"{self.key}: {self.manifest_file}"
        tok = m["tokenizer"]
        if tok["fingerprint"] != tokenizer_fingerprint:
            raise DatasetError(
                f"{where} was prepared with another tokenizer ({tok['path']}, fingerprint "
                f"{tok['fingerprint']}) than this run's {tokenizer_path} ({tokenizer_fingerprint}); "
                "set model.tokenizer_path to the one it was prepared with, or prepare the data "
                "again with this one"
            )
        if not self.shards or self.total_tokens == 0:
            raise DatasetError(f"{where} lists no tokens; {_REPREPARE} from a non-empty corpus")
        for i, s in enumerate(self.shards):
            self._check_shard(i, s, vocab_size, tok["bos_id"], tok["eos_id"])

    def _check_shard(self, i: int, s: dict[str, Any], vocab_size: int, bos: int, eos: int) -> None:
        path = self.bin_path(i)
        fix = f"{self.key}: shard {path}"
        if s["tokens"] <= 0:
            raise DatasetError(f"{fix} is empty in the manifest; {_REPREPARE}")
        for file, want in (
            (path, s["tokens"] * self.dtype.itemsize),
            (self.idx_path(i), (s["documents"] + 1) * 8),
        ):
            size = file.stat().st_size if file.is_file() else None
            if size != want:
                got = "is missing" if size is None else f"has {size} bytes"
                raise DatasetError(
                    f"{self.key}: shard file {file} {got}, the manifest says {want} "
                    f"({self.manifest['dtype']}); {_REPREPARE}"
                )
        if s["max_id"] >= vocab_size:
            raise DatasetError(
                f"{fix} holds token id {s['max_id']}, beyond the model's vocabulary "
                f"of {vocab_size}; prepare it with this run's tokenizer"
            )
        if s["eos_count"] <= 0:
            raise DatasetError(f"{fix} holds no EOS token (id {eos}); {_REPREPARE}")
        data = self._map(i)
        sample = data[:: max(1, len(data) // _SAMPLES_PER_SHARD)]
        if data[0] != bos or data[-1] != eos or int(sample.max()) >= vocab_size:
            raise DatasetError(
                f"{fix} does not read as {self.manifest['dtype']} documents (first id {data[0]}, "
                f"last {data[-1]}, expected BOS {bos} ... EOS {eos}, ids < {vocab_size}); "
                f"{_REPREPARE}"
            )

    def verify_checksums(self, indices: list[int] | None = None) -> list[str]:
        """Shards whose files do not match the manifest's CRC32 (the slow check: reads every
        byte; ranks share it at startup)."""
        # Here, not at the top: checkpoint_storage imports torch, which the preparation tool
        # and its workers do without.

        problems = []
        for i in range(len(self.shards)) if indices is None else indices:
            s = self.shards[i]
            for path, want in (
                (self.bin_path(i), s["bin_crc32"]),
                (self.idx_path(i), s["idx_crc32"]),
            ):
                if not path.is_file():
                    problems.append(f"shard file {path} is missing; {_REPREPARE}")
                elif file_crc32(path) != want:
                    problems.append(
                        f"shard file {path} is corrupted (CRC32 differs from the "
                        f"manifest's); {_REPREPARE}"
                    )
        return problems
