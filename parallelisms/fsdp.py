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
    first: list[nn.Module] | None = None,
    last: list[nn.Module] | None = None,
) -> None:
    """Shard `first` (the embedding) as one unit, each block, `last` (final norm and head) as
    one unit, then the root. Separate units let the embedding's all-gather and the head's
    reduce-scatter overlap with the blocks' compute instead of opening and closing every step
    with nothing to hide behind (and keep only one of them unsharded at a time).

    reshard_after_forward: "always" frees every gathered unit after its forward (least memory,
    one more all-gather in backward); "never" keeps them (no re-gather); "default" frees all but
    the last block and `last`, whose parameters backward needs first anyway.
    """
    common: dict = {"mesh": mesh, "mp_policy": MixedPrecisionPolicy(param_dtype, reduce_dtype)}
    if cpu_offload:
        common["offload_policy"] = CPUOffloadPolicy()
    always, never = reshard_after_forward == "always", reshard_after_forward == "never"
    if first:
        fully_shard(first, reshard_after_forward=not never, **common)
    for i, block in enumerate(blocks):
        if reshard_after_forward == "default":
            reshard = i < len(blocks) - 1
        else:
            reshard = always
        fully_shard(block, reshard_after_forward=reshard, **common)
    if last:
        fully_shard(last, reshard_after_forward=always, **common)
    fully_shard(model, reshard_after_forward=always, **common)


def unsharded_numels(model: nn.Module) -> list[int]:
    """Elements of each parameter FSDP manages, as all-gathered on this rank: the size of the
    gradient FSDP2 leaves on the unsharded parameter when it does not reduce-scatter (a
    tensor-parallel shard stays a shard). Read off FSDP's own records, so meta tensors do."""
    from torch.distributed.fsdp import FSDPModule

    # A unit of several modules (the final norm with the head) shares one state: once each.
    groups = {
        id(group): group
        for module in model.modules()
        if isinstance(module, FSDPModule)
        for group in module._get_fsdp_state()._fsdp_param_groups
    }
    return [p._orig_size.numel() for group in groups.values() for p in group.fsdp_params]
