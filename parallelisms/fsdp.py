"""FSDP2 (`fully_shard`) over the data-parallel mesh: 1D for FSDP, 2D for HSDP."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard


def apply_fsdp(
    model: nn.Module,
    blocks: list[nn.Module],
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: str = "default",
    cpu_offload: bool = False,
) -> None:
    """Shard each block, then the root (which picks up the embeddings, final norm and head).

    reshard_after_forward: "always" frees every gathered block after its forward (least memory,
    one more all-gather in backward); "never" keeps them (no re-gather); "default" frees all but
    the last block, whose parameters backward needs first anyway, and keeps the root.
    """
    common: dict = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype, reduce_dtype)}
    if cpu_offload:
        common["offload_policy"] = CPUOffloadPolicy()
    for i, block in enumerate(blocks):
        if reshard_after_forward == "default":
            reshard = i < len(blocks) - 1
        else:
            reshard = reshard_after_forward == "always"
        fully_shard(block, reshard_after_forward=reshard, **common)
    fully_shard(model, reshard_after_forward=reshard_after_forward == "always", **common)
