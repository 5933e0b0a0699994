"""FSDP2 (`fully_shard`) over the data-parallel mesh: 1D for FSDP, 2D for HSDP; expert-parallel
experts over the experts' own FSDP mesh."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard


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
    # A unit of several modules (the final norm with the head) shares one state: once each.
    groups = {
        id(group): group
        for module in model.modules()
        if isinstance(module, FSDPModule)
        for group in module._get_fsdp_state()._fsdp_param_groups
    }
    return [p._orig_size.numel() for group in groups.values() for p in group.fsdp_params]


def apply_expert_fsdp(
    experts: list[nn.Module],
    mesh: DeviceMesh,
    *,
    divide_factor: int,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    reshard_after_forward: bool,
    cpu_offload: bool = False,
) -> None:
    """Shard each expert-parallel experts module (its weights split over the ep mesh) over the
    experts' FSDP mesh, before its block is sharded so that the block leaves them out.

    A local expert's gradient already sums every ep rank's tokens, so the reduction over `mesh`
    completes the sum over all ranks; dividing by `divide_factor` (the dense parameters'
    data-parallel x context-parallel ranks, which their own reduction averages over) gives the
    gradient the dense parameters get, as TorchTitan sets it. The weights are split on the
    expert dim when the shard dim of `mesh` divides each rank's experts, on the next dim
    otherwise (FSDP would pad the expert dim with empty experts)."""
    policy = MixedPrecisionPolicy(param_dtype, reduce_dtype)
    extra: dict = {"offload_policy": CPUOffloadPolicy()} if cpu_offload else {}

    def placement(param: nn.Parameter) -> Shard:
        local_experts = param.to_local().shape[0] if isinstance(param, DTensor) else param.shape[0]
        return Shard(0) if local_experts % mesh.size(-1) == 0 else Shard(1)

    for module in experts:
        fully_shard(
            module,
            mesh=mesh,
            mp_policy=policy,
            reshard_after_forward=reshard_after_forward,
            shard_placement_fn=placement,
            **extra,
        )
        cast(FSDPModule, module).set_gradient_divide_factor(divide_factor)
        # gloo has no PREMUL_SUM: sum, then divide. Not on a 1-rank shard dim, where torch 2.13
        # divides its copy by the factor and then again after (_fsdp_collectives.foreach_reduce;
        # the EP 2 x efsdp 1 layouts caught a gradient half the size).
        if mesh.device_type == "cpu" and mesh.size(-1) > 1:
            cast(FSDPModule, module).set_force_sum_reduction_for_comms(True)
