"""Hugging Face weights in and out of a training run: `checkpoint.initial_load_in_hf` starts
from a Hugging Face folder of the model's family, `checkpoint.last_save_in_hf` exports the final weights as one.

Loading is streamed per rank: each rank reads, from the safetensors files, only the rows of the
tensors its own parameters hold (its pipeline stage's; of a sharded DTensor, the rows of its
shard), so no rank reads or holds the whole model. Exporting folds into the offline converter:
the final DCP checkpoint is read back one tensor at a time by rank 0 (`dcp_to_hf`), which works
whichever ranks hold which parameters (pipeline stages included) and gives the converter's
files exactly.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from models import ModelArgs
from titanlite.components.checkpoint.folder import CheckpointError
from titanlite.components.checkpoint.hf import HFFolder, dcp_to_hf
from titanlite.core.logging import logger


def _local_slice(
    files: dict[Path, BinaryIO],
    folder: HFFolder,
    key: str,
    shape: tuple[int, ...],
    offset: tuple[int, ...],
) -> torch.Tensor:
    """The block `shape` at `offset` of titanlite parameter `key`, from the HF files. The
    adapter's conversion moves rows within a row group only (for Llama, the q/k permutation
    within a head), so whole groups around the block are read; of an MoE's experts, stacked
    from one HF tensor per expert, only the block's experts' tensors."""
    first, stop = offset[0], offset[0] + shape[0]
    span = folder.hf.row_group(key, folder.args)
    lo, hi = first // span * span, -(-stop // span) * span
    rows = folder.hf.from_hf_tensor(key, folder.rows(key, lo, hi, files), folder.args)
    block = rows[first - lo : stop - lo]
    for dim in range(1, len(shape)):
        block = block.narrow(dim, offset[dim], shape[dim])
    return block


def load_hf_weights(model: nn.Module, src: Path, expect: ModelArgs) -> None:
    """Set the model's parameters and persistent buffers (this rank's share) from Hugging Face
    folder `src`; a titanlite-only buffer (an MoE's expert bias) starts at zero."""
    start = time.perf_counter()
    current: dict[str, torch.Tensor] = get_model_state_dict(model)  # type: ignore[assignment]
    # The model holds every weight in one dtype (float32 masters): what the folder is cast to.
    folder = HFFolder(src, expect, next(iter(current.values())).dtype)
    if folder.cast_note:
        logger.info(folder.cast_note.removeprefix("note: "))
    files: dict[Path, BinaryIO] = {}
    loaded: dict[str, Any] = {}
    try:
        for key, value in current.items():
            if isinstance(value, DTensor):
                shape, offset = compute_local_shape_and_global_offset(
                    value.shape, value.device_mesh, value.placements
                )
            else:
                shape, offset = tuple(value.shape), (0,) * value.dim()
            local = _local_slice(files, folder, key, tuple(shape), tuple(offset))
            local = local.to(device=value.device, dtype=value.dtype)
            if isinstance(value, DTensor):
                local = DTensor.from_local(
                    local,
                    value.device_mesh,
                    value.placements,
                    run_check=False,
                    shape=value.shape,
                    stride=value.stride(),
                )
            loaded[key] = local
    finally:
        for f in files.values():
            f.close()
    set_model_state_dict(model, loaded, options=StateDictOptions(strict=True))
    logger.info(
        f"loaded model from Hugging Face folder {src} in {time.perf_counter() - start:.1f}s"
    )


def export_hf(step_folder: Path, dst: Path, dtype: torch.dtype, mtp: bool = False) -> None:
    """Rank 0 writes the model of the complete checkpoint `step_folder` as Hugging Face folder
    `dst` (a failure raises CheckpointError there: its exit code and line end the launch). The
    other ranks return at once: the export of a large model takes longer than any collective
    timeout, so no rank waits for it in one."""
    if dist.get_rank() != 0:
        return
    start = time.perf_counter()

    def note(line: str) -> None:
        if line.startswith("note:"):  # not the per-tensor progress
            logger.warning(line.removeprefix("note: "))

    try:
        dcp_to_hf(step_folder, dst, dtype=dtype, report=note, mtp=mtp)
    except (CheckpointError, OSError) as e:
        raise CheckpointError(f"the Hugging Face export {dst} failed: {e}") from None
    logger.info(f"wrote Hugging Face folder {dst} in {time.perf_counter() - start:.1f}s")
