"""Checkpoints with torch Distributed Checkpoint: async saves, exact resume, resharding on load.

A checkpoint holds the model, the optimizer, the LR scheduler, the data loader, the train state
and the RNG state. Sharded (DTensor) state is saved by every rank in parallel through DCP's
state-dict helpers, so a checkpoint saved on one layout loads on any other. Data-loader state is
the same on every rank (each rank reads the same global token stream), so it too survives a
change of data-parallel degree.

    python -m titanlite.checkpoint verify PATH     # check a checkpoint against its manifest
"""

from __future__ import annotations

import datetime
import errno
import shutil
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from titanlite.components.checkpoint.folder import (
    CheckpointError,
    complete_steps,
    partial_dir,
    step_dir,
)
from titanlite.components.checkpoint.record import model_differences, titanlite_version
from titanlite.components.checkpoint.resume import resume_point
from titanlite.components.checkpoint.states import (
    KEYS,
    ModelState,
    OptimizerState,
    RNGState,
    optimizer_saved_flattened,
)
from titanlite.components.checkpoint.storage import (
    ChecksummingWriter,
    SafeFileSystemReader,
    SafeLoadPlanner,
    read_manifest,
    verify,
    write_manifest,
)
from titanlite.config.schema import Checkpoint
from titanlite.core.distributed import shared_check
from titanlite.core.dtypes import DTYPES
from titanlite.core.io import file_crc32
from titanlite.core.logging import logger


class CheckpointSaveError(CheckpointError):
    """A save failed on some rank (disk full, permissions, ...); the message names the folder."""


def _causes(error: BaseException) -> list[BaseException]:
    """The error, what caused it, and the per-rank failures inside DCP's CheckpointException."""
    pending: list[BaseException | None] = [error]
    found: list[BaseException] = []
    while pending:
        e = pending.pop(0)
        if e is None or any(e is f for f in found):
            continue
        found.append(e)
        if isinstance(e, dcp.api.CheckpointException):
            pending += [exc for exc, _trace in e.failures.values()]
        pending += [e.__cause__, e.__context__]
    return found


def _caused_by(error: BaseException, kind: type[BaseException]) -> bool:
    return any(isinstance(e, kind) for e in _causes(error))


# torch.save's zip writer reports a short write as "unexpected pos N vs M", without the errno:
# a file system this close to full is the explanation worth giving.
_NEARLY_FULL_BYTES = 1 << 20


def describe_save_error(error: BaseException, folder: Path) -> str:
    """The root cause in a few words: the OSError behind DCP's per-rank failure report, or a
    full disk where the writer lost the errno."""
    try:
        if shutil.disk_usage(folder).free < _NEARLY_FULL_BYTES:
            return "no space left on device"
    except OSError:
        pass
    for e in _causes(error):
        if isinstance(e, OSError):
            if e.errno == errno.ENOSPC:
                return "no space left on device"
            return f"{e.strerror or e}".lower() + (f": {e.filename}" if e.filename else "")
    return f"{type(error).__name__}: {str(error).strip().splitlines()[-1] if str(error).strip() else ''}"


class CheckpointManager:
    def __init__(
        self,
        cfg: Checkpoint,
        dump_folder: Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        lr_scheduler: Any,
        dataloader: Any,
        train_state: Stateful,
        total_steps: int,
        model_config: dict[str, Any] | None = None,
    ):
        self.cfg, self.total_steps = cfg, total_steps
        # What the manifest records about the model (model_config_record).
        self.model_config = model_config
        self.folder = Path(dump_folder) / cfg.folder
        self.model = model
        self.states: dict[str, Any] = {
            "model": ModelState(model),
            "optimizer": OptimizerState(model, optimizer),
            "lr_scheduler": lr_scheduler,
            "dataloader": dataloader,
            "train_state": train_state,
            "rng": RNGState(),
        }
        self.enabled = cfg.enable_checkpoint or cfg.create_seed_checkpoint
        self.rank = dist.get_rank()
        # A group of its own: background saves must not interleave collectives with training,
        # and a save waits in it for the slowest writer, which can take far longer than a
        # training collective may (checkpoint.timeout_seconds, not comm.train_timeout_seconds).
        self.pg = None
        if self.enabled:
            timeout = datetime.timedelta(seconds=cfg.timeout_seconds)
            self.pg = dist.new_group(backend="gloo", timeout=timeout)
        self.async_mode = cfg.async_mode
        if cfg.async_mode == "async_with_pinned_mem" and not torch.cuda.is_available():
            logger.warning(
                "checkpoint.async_mode = async_with_pinned_mem needs CUDA: using 'async'"
            )
            self.async_mode = "async"
        self.stager = None
        if self.async_mode == "async_with_pinned_mem":
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            # Reused across saves: the pinned host buffers are allocated once.
            self.stager = DefaultStager(StagingOptions(True, False, False, True))
        self.executor = (
            ThreadPoolExecutor(1, thread_name_prefix="ckpt")
            if self.async_mode != "disabled"
            else None
        )
        self.pending: Future | None = None
        self._purges: list[threading.Thread] = []  # retention deletions still running
        self._staging_buffers: dict[Any, Any] = {}
        self._staging_shapes: dict[tuple, Any] | None = None
        self.resumed_from: int | None = None
        self.last_blocking_s = 0.0

    # ----------------------------------------------------------------------------------------
    # loading

    def load(self) -> bool:
        """Resume from the configured checkpoint if there is one; True if something was loaded."""
        point = resume_point(self.cfg, self.folder)
        if point is None:
            return False
        if point.step is None and self.cfg.initial_load_in_hf:
            return False  # a Hugging Face folder: the trainer's HFInitialLoad reads it
        if point.step is None:
            self._load(
                point.path, ["model"] if self.cfg.initial_load_model_weights_only else list(KEYS)
            )
            return True
        step = point.step
        newer = [s for s in point.complete if s > step]
        if newer and not self.cfg.overwrite:
            raise CheckpointError(
                f"{self.folder} holds step-{newer[-1]}, newer than step-{step} which this run "
                "resumes from; later saves would overwrite it. Use another checkpoint.folder, "
                "remove it, or pass --checkpoint.overwrite"
            )
        path = point.path
        manifest = read_manifest(path)
        keys = [k for k in manifest.get("keys", KEYS) if k not in self.cfg.exclude_from_loading]
        self._load(path, keys)
        self.resumed_from = step
        return True

    def _load(self, path: Path, keys: list[str]) -> None:
        # The model's key names and shapes were checked by preflight (check_checkpoint).
        self._check_files(path)
        # The reader DCP loads through is the first to unpickle `.metadata`: whatever read
        # preflight did, this path must refuse a crafted one on its own.
        reader = SafeFileSystemReader(str(path))
        saved = reader.read_metadata().state_dict_metadata
        self._warn_model_differences(path)
        if "dataloader" in keys:
            self._check_loader_state(path, saved)
        optimizer = self.states["optimizer"]
        optimizer.flatten = optimizer_saved_flattened(saved)
        start = time.perf_counter()
        try:
            dcp.load(
                {k: self.states[k] for k in keys},
                storage_reader=reader,
                planner=SafeLoadPlanner(),
                process_group=self.pg,
            )
        finally:
            optimizer.flatten = True  # saves always write the flattened form
        logger.info(f"loaded {', '.join(keys)} from {path} in {time.perf_counter() - start:.1f}s")

    def _check_files(self, path: Path) -> None:
        """Each rank checksums a share of the files; all agree before anything is read."""
        names = sorted(read_manifest(path)["files"])
        found = shared_check(
            len(names),
            lambda mine: verify(path, files=[names[i] for i in mine]),
            self.cfg.timeout_seconds,
            self.pg,
        )
        if found:
            raise CheckpointError(f"cannot load {path}: " + "; ".join(found[:3]))

    def _warn_model_differences(self, path: Path) -> None:
        saved = (read_manifest(path).get("model_config") or {}).get("args")
        mine = (self.model_config or {}).get("args")
        differ = model_differences(saved, mine) if saved and mine else []
        if differ and self.rank == 0:
            logger.warning(
                f"{path} was saved from a model with other hyper-parameters: " + "; ".join(differ)
            )

    def _check_loader_state(self, path: Path, saved: dict) -> None:
        """The saved loader state must be the kind this run's reader loads (text and prepared
        shards keep different state); DCP would only say 'missing key'. `saved`: the
        checkpoint's state_dict_metadata."""
        missing = [
            k
            for k in _leaf_keys(self.states["dataloader"].state_dict(), "dataloader")
            if k not in saved
        ]
        if missing:
            raise CheckpointError(
                f"checkpoint {path}: its data loader state was saved by another reader or titanlite "
                f"version (no '{missing[0]}'; text and prepared shards keep different state); resume with the "
                "same kind of training.dataset_path, or start the loader afresh with "
                "--checkpoint.exclude_from_loading dataloader"
            )

    # ----------------------------------------------------------------------------------------
    # saving

    def should_save(self, step: int) -> bool:
        if not self.cfg.enable_checkpoint:
            return False
        first = step == 1 and self.cfg.enable_first_step_checkpoint
        return first or step % self.cfg.interval == 0 or step == self.total_steps

    def save(
        self, step: int, *, config_hash: str, force_sync: bool = False, weights_only: bool = False
    ) -> None:
        """Save at `step`, its manifest recording `config_hash` (the hash of the config that
        runs); async modes return once the state is staged in host memory."""
        last = step == self.total_steps
        weights_only = (
            weights_only
            or self.cfg.model_weights_only
            or (last and self.cfg.last_save_model_weights_only)
        )
        if weights_only:
            dtype = DTYPES[self.cfg.export_dtype] if last else None
            states: dict[str, Any] = {"model": ModelState(self.model, dtype)}
        else:
            states = self.states
        start = time.perf_counter()
        self.wait()  # the next save waits for the previous one (counted as blocked time)
        final, partial = step_dir(self.folder, step), partial_dir(self.folder, step)
        if final.exists() and not self.cfg.overwrite and self.resumed_from != step:
            raise CheckpointError(
                f"{final} already exists (another run?); refusing to overwrite it. Use another "
                "checkpoint.folder or pass --checkpoint.overwrite"
            )
        if self.rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
        dist.barrier(group=self.pg)
        state_dict = {
            k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in states.items()
        }
        info = {
            "step": step,
            "keys": list(states),
            "config_hash": config_hash,
            "torch_version": torch.__version__,
            "titanlite_version": titanlite_version(),
            "world_size": dist.get_world_size(),
            "saved_at": time.time(),
        }
        if self.model_config is not None:
            info["model_config"] = self.model_config
        if self.executor is None or force_sync:
            try:
                self._write(state_dict, partial, final, info)
            except CheckpointSaveError as e:
                self.save_failed(e)
        else:
            staged = self._stage(state_dict)
            self.pending = self.executor.submit(self._write, staged, partial, final, info)
        self.last_blocking_s = time.perf_counter() - start
        logger.info(
            f"checkpoint step-{step}: training blocked {self.last_blocking_s:.2f}s "
            f"({'async' if self.pending else 'sync'})"
        )

    def _stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Copy the tensors off the training state into host buffers (reused across saves: a
        copy into warm memory is several times faster than into fresh pages), so training can
        go on. Plain data (e.g. the loader's token buffer) is already a fresh copy from
        state_dict() and passes through: torch's copy helpers would walk it element by element."""
        if self.stager is not None:
            staged = self.stager.stage(state_dict)
            assert isinstance(staged, dict)  # the stager's non-blocking mode is not used
            return staged
        from torch.distributed._state_dict_utils import _copy_state_dict, _create_cpu_state_dict

        flat = _flatten(state_dict)
        # The helpers only need a mapping; their str-key annotation is narrower than needed.
        tensors: dict[Any, Any] = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
        shapes = {k: (tuple(v.shape), v.dtype) for k, v in tensors.items()}
        if self._staging_shapes != shapes:
            self._staging_buffers = _create_cpu_state_dict(tensors)
            self._staging_shapes = shapes
        _copy_state_dict(tensors, self._staging_buffers)
        return _unflatten({**flat, **self._staging_buffers})

    def _write(
        self, state_dict: dict[str, Any], partial: Path, final: Path, info: dict[str, Any]
    ) -> None:
        """Write, then agree on the outcome: a failure on any rank (DCP raises its
        CheckpointException on every rank; rank 0's manifest step is shared by the agreement)
        removes the partial folder on every rank, so the previous checkpoint stays the latest."""
        error: BaseException | None = None
        try:
            self._write_and_publish(state_dict, partial, final, info)
        except (Exception, dcp.api.CheckpointException) as e:
            if _caused_by(e, KeyboardInterrupt):  # a second Ctrl-C: stop at once, not a failure
                raise KeyboardInterrupt from e
            error = e
        failed = torch.tensor([error is not None], dtype=torch.int32)
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.pg)
        if failed.item():
            # Before the cleanup frees the space again.
            cause = describe_save_error(error, partial) if error else "failed on another rank"
            if self.rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            dist.barrier(group=self.pg)
            raise CheckpointSaveError(
                f"checkpoint {final} could not be written ({cause}); the partial folder was "
                "removed and the previous checkpoint is still the latest"
            )
        dist.barrier(group=self.pg)

    def _write_and_publish(
        self, state_dict: dict[str, Any], partial: Path, final: Path, info: dict[str, Any]
    ) -> None:
        writer = ChecksummingWriter(partial)
        dcp.save(state_dict, storage_writer=writer, process_group=self.pg)
        records: list[dict] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(records, writer.records, group=self.pg)
        if self.rank == 0:
            # DCP writes .metadata under a temporary name first; record the final file instead.
            merged = {
                name: rec for r in records for name, rec in r.items() if not name.endswith(".tmp")
            }
            merged[".metadata"] = {
                "size": (partial / ".metadata").stat().st_size,
                "crc32": file_crc32(partial / ".metadata"),
            }
            write_manifest(partial, merged, info)
            if (
                final.exists()
            ):  # only reachable with checkpoint.overwrite or re-saving a resumed step
                shutil.rmtree(final)
            partial.rename(final)
            self._purge()

    def _purge(self) -> None:
        k = self.cfg.keep_latest_k
        if k <= 0:
            return
        old = complete_steps(self.folder)[:-k]

        # Off the training thread; the newest complete checkpoint is never among them.
        def remove_old() -> None:
            for s in old:
                shutil.rmtree(step_dir(self.folder, s), ignore_errors=True)

        # Not a daemon: close() joins it, so no thread is still deleting files while the process
        # exits (a run once aborted at exit with "terminate called without an active
        # exception" right after its last background deletion began).
        thread = threading.Thread(target=remove_old, name="ckpt-retention")
        thread.start()
        self._purges = [t for t in self._purges if t.is_alive()] + [thread]

    def wait(self) -> None:
        """Wait for a background save; its failure is handled here (see save_failed)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            try:
                pending.result()
            except CheckpointSaveError as e:
                self.save_failed(e)

    def save_failed(self, error: CheckpointSaveError) -> None:
        """checkpoint.on_save_error: "stop" raises (the run ends, exit 2); "continue" warns
        and training goes on, the next interval trying again. Every rank decides alike: the
        failure was agreed in _write."""
        if self.cfg.on_save_error == "stop":
            raise error
        logger.warning(f"{error}; training continues (checkpoint.on_save_error = continue)")

    def close(self) -> None:
        self.wait()
        for thread in self._purges:
            thread.join()
        if self.executor is not None:
            self.executor.shutdown()
        if self.stager is not None:
            self.stager.close()


def _leaf_keys(tree: Any, prefix: str) -> list[str]:
    """DCP's flattened keys of nested dicts (lists are leaves, as for the loader's state)."""
    if not isinstance(tree, dict) or not tree:
        return [prefix]
    return [k for key, v in tree.items() for k in _leaf_keys(v, f"{prefix}.{key}")]


def _flatten(tree: Any, prefix: tuple = ()) -> dict[tuple, Any]:
    """Nested dicts (and lists holding tensors or dicts) -> {path: leaf}; plain lists are leaves."""
    items: Any
    if isinstance(tree, dict) and tree:
        items = tree.items()
    elif isinstance(tree, (list, tuple)) and any(
        isinstance(v, (torch.Tensor, dict, list)) for v in tree
    ):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    out: dict[tuple, Any] = {}
    for key, value in items:
        out.update(_flatten(value, prefix + ((type(tree), key),)))
    return out


def _unflatten(flat: dict[tuple, Any]) -> Any:
    root: dict = {}
    for path, value in flat.items():
        if not path:
            return value
        node = root
        for kind, key in path[:-1]:
            node = node.setdefault((kind, key), {})
        node[path[-1]] = value
    return _rebuild(root)


def _rebuild(node: Any) -> Any:
    if not isinstance(node, dict) or not node or not all(isinstance(k, tuple) for k in node):
        return node
    kind = next(iter(node))[0]
    children = {key: _rebuild(value) for (_, key), value in node.items()}
    if issubclass(kind, dict):
        return children
    return kind(children[i] for i in range(len(children)))
