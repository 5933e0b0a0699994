"""On-disk side of checkpoints: a DCP writer that checksums files as it writes them, a loader
that never unpickles code, the manifest, and verification.

A checkpoint folder `step-N/` is complete when it exists under that name: it is written as
`.step-N.partial/` and renamed only after every rank's files, DCP's `.metadata` and the
manifest are on disk. Anything else in the checkpoint folder is ignored by resume.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
import warnings
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from titanlite.components.checkpoint.folder import MANIFEST, CheckpointError
from titanlite.core.io import atomic_write_text, file_crc32


class _ChecksummingStream:
    """Forwards writes to a file, keeping its size and CRC32 so the manifest costs no re-read.
    (Not an io.IOBase subclass: those define tell/seek themselves instead of forwarding.)"""

    def __init__(self, inner: io.IOBase):
        self.inner, self.size, self.crc = inner, 0, 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        return self.inner.write(data)

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno (fsync), ...
        return getattr(self.inner, name)


class _ChecksummingFileSystem(FileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with super().create_stream(path, mode) as stream:
            wrapped = _ChecksummingStream(stream)
            yield wrapped  # type: ignore[misc]
        with self._lock:
            self.records[Path(path).name] = {"size": wrapped.size, "crc32": wrapped.crc}


class ChecksummingWriter(FileSystemWriter):
    """FileSystemWriter that records (size, crc32) of every file it writes, per rank."""

    def __init__(self, path: Path, single_file_per_rank: bool = True):
        super().__init__(
            path, single_file_per_rank=single_file_per_rank, sync_files=True, overwrite=True
        )
        self.checksums = _ChecksummingFileSystem()
        self.fs = self.checksums
        self.path = self.fs.init_path(path)

    @property
    def records(self) -> dict[str, dict[str, int]]:
        return self.checksums.records


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner unpickles non-tensor entries with weights_only=False; this one only
    accepts plain data, so loading a checkpoint can never run code from it."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# What DCP's `.metadata` pickle may name: its own dataclasses (torch/distributed/checkpoint/
# metadata.py), the filesystem writer's _StorageInfo, torch.Size, dtypes, layouts by name, and
# the path DCP records as the checkpoint id. Read with plain pickle (as torch's FileSystemReader
# does), a crafted `.metadata` could run any code; this list is all a real one needs.
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_METADATA_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream: Any, where: str):
        super().__init__(stream)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        import torch.distributed.checkpoint.metadata as dcp_metadata

        obj = getattr(dcp_metadata, name, None) if module == _METADATA_MODULE else None
        if isinstance(obj, type) and obj.__module__ == _METADATA_MODULE:
            return obj
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in _METADATA_GLOBALS:
            return super().find_class(module, name)
        raise CheckpointError(
            f"{self.where} names {module}.{name}, which DCP metadata never holds; refusing to "
            "unpickle it (loading a checkpoint runs no code from it)"
        )


def load_metadata(stream: Any, where: str) -> Metadata:
    """DCP's Metadata from a `.metadata` stream, admitting only the classes it is made of."""
    try:
        metadata = _MetadataUnpickler(stream, where).load()
    except CheckpointError:
        raise
    except Exception as e:  # truncated or garbage: pickle raises many kinds
        raise CheckpointError(f"{where} is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(f"{where} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


def read_metadata(path: Path) -> Metadata:
    """The DCP metadata of checkpoint folder `path`, read safely."""
    f = Path(path) / ".metadata"
    if not f.is_file():
        raise CheckpointError(f"{f} is missing")
    with f.open("rb") as stream:
        return load_metadata(stream, str(f))


class SafeFileSystemReader(FileSystemReader):
    """torch's FileSystemReader with `.metadata` read by the restricted unpickler above (torch
    2.13's uses plain pickle.load); the tensors and bytes go through SafeLoadPlanner."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream, str(path))
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


def write_manifest(path: Path, records: dict[str, dict[str, int]], info: dict[str, Any]) -> None:
    manifest = {**info, "files": dict(sorted(records.items()))}
    atomic_write_text(path / MANIFEST, json.dumps(manifest, indent=1))


def read_manifest(path: Path) -> dict[str, Any]:
    mf = path / MANIFEST
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not mf.is_file():
        raise CheckpointError(
            f"checkpoint {path} has no {MANIFEST}: it is incomplete (the save "
            "did not finish) or not a titanlite checkpoint"
        )
    try:
        manifest = json.loads(mf.read_text())
    except ValueError as e:
        raise ManifestError(f"checkpoint {path}: {MANIFEST} is corrupted ({e})") from None
    _check_records(mf, manifest)
    return manifest


class ManifestError(CheckpointError):
    """A manifest that is not what titanlite writes (damaged or edited by hand)."""


def _check_records(mf: Path, manifest: Any) -> None:
    """Every file record holds an integer size and CRC32: each reader indexes them."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise ManifestError(f"{mf}: no 'files' table; it is not a titanlite manifest")
    for name, rec in files.items():
        for field in ("size", "crc32"):
            value = rec.get(field) if isinstance(rec, dict) else None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ManifestError(
                    f"{mf}: the record of {name} has no valid '{field}' (got "
                    f"{value!r}); the manifest is damaged or was edited: restore it, or "
                    "resume from another checkpoint"
                )


def verify(path: Path, files: list[str] | None = None, checksums: bool = True) -> list[str]:
    """Problems with the checkpoint at `path` (empty if none). `files` limits the checksum pass
    to a subset, so that ranks can share the work."""
    try:
        manifest = read_manifest(path)
    except CheckpointError as e:
        return [str(e)]
    problems = []
    if not (path / ".metadata").is_file():
        problems.append(f"{path}/.metadata is missing")
    for name, rec in manifest["files"].items():
        f = path / name
        if not f.is_file():
            problems.append(f"{f} is missing")
        elif f.stat().st_size != rec["size"]:
            problems.append(
                f"{f} is {f.stat().st_size} bytes, the manifest says {rec['size']} (truncated?)"
            )
        elif checksums and (files is None or name in files) and file_crc32(f) != rec["crc32"]:
            problems.append(f"{f} is corrupted (CRC32 differs from the manifest)")
    return problems


class _SafeEmptyLoadPlanner(DefaultLoadPlanner):
    """Loads everything a checkpoint holds (no template), plain data only, in one process."""

    def __init__(self) -> None:
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner

        super().__init__()
        self._empty = _EmptyStateDictLoadPlanner()

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        self._empty.set_up_planner(state_dict, metadata, is_coordinator)
        self.__dict__.update({k: v for k, v in self._empty.__dict__.items() if k != "_empty"})

    load_bytes = SafeLoadPlanner.load_bytes


def load_full_state_dict(path: Path, keys: list[str] | None = None) -> dict[str, Any]:
    """A whole checkpoint (or its `keys`) as full tensors in this process, from any layout."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    problems = verify(path, checksums=False)
    if problems:
        raise CheckpointError("; ".join(problems[:3]))
    read_metadata(path)  # refused here with its own message; DCP would wrap it in its own
    sd: dict[str, Any] = {}
    _load_state_dict(
        sd,
        storage_reader=SafeFileSystemReader(str(path)),
        planner=_SafeEmptyLoadPlanner(),
        no_dist=True,
    )
    return {k: v for k, v in sd.items() if keys is None or k in keys}


def save_full_state_dict(
    sd: dict[str, Any],
    path: Path,
    info: dict[str, Any],
    *,
    planner: Any = None,
    file_per_tensor: bool = False,
) -> None:
    """Write full tensors as a complete titanlite checkpoint (manifest included) from one process.
    `file_per_tensor` bounds memory when `planner` produces the tensors lazily (torch's
    single-file writer keeps every tensor of a file alive until the file is closed)."""
    import shutil

    import torch.distributed.checkpoint as dcp

    if path.exists():
        raise CheckpointError(f"{path} already exists; refusing to overwrite it")
    partial = path.with_name(f".{path.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # a save of ours that died part-way
    writer = ChecksummingWriter(partial, single_file_per_rank=not file_per_tensor)
    try:
        with warnings.catch_warnings():  # "torch.distributed is ... uninitialized": we know
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.save(sd, storage_writer=writer, planner=planner, no_dist=True)
        records = {n: r for n, r in writer.records.items() if not n.endswith(".tmp")}
        records[".metadata"] = {
            "size": (partial / ".metadata").stat().st_size,
            "crc32": file_crc32(partial / ".metadata"),
        }
        write_manifest(partial, records, {**info, "keys": sorted(sd)})
        partial.rename(path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
