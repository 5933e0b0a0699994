"""Compose the parallelisms for a decoder with the shared public structure (`tok_embeddings`,
`layers` as a ModuleDict of blocks, `norm`, `output`; models/decoder.py), in the order they must
be applied: float8 conversion -> expert parallel -> tensor parallel -> context parallel ->
activation checkpointing -> compile -> FSDP / DDP. Each family's parallelize function is this with its own
TP plan (parallelisms/<family>/).

Context parallel swaps each block's attention kernel before AC and compile wrap the block, so
that its key/value all-gather is recomputed and compiled with it. Float8 goes first because
torchao's float8 TP styles accept only Float8Linear modules, and FSDP must shard the float8
weight wrapper when float8 all-gather is on.

Expert parallel splits the MoE experts before tensor parallel replicates the rest of each MoE
over the tp ranks (which leaves the split experts alone), and the experts are FSDP-sharded over
their own mesh before their blocks are (parallelisms/expert_parallel.py).

A tied output head (the embedding's weight, one parameter) is one FSDP unit with the embedding
and the final norm, since FSDP shards each parameter in exactly one unit; tensor parallel
replaces both ends' weights with DTensors, so the family's plan ties them again after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from models.moe import moe_layers
from parallelisms.activation_checkpoint import apply_ac
from parallelisms.compile import apply_compile
from parallelisms.context_parallel import apply_cp
from parallelisms.ddp import apply_ddp
from parallelisms.expert_parallel import apply_ep
from parallelisms.float8 import ConversionPlan, convert_to_float8, uses_float8_tp
from parallelisms.fsdp import apply_expert_fsdp, apply_fsdp
from parallelisms.options import ParallelizeOptions
from parallelisms.parallel_dims import Meshes, ParallelDims
from parallelisms.tensor_parallel import enable_async_tp

# (model, blocks, tp mesh, *, loss_parallel_enabled, float8_all_gather) -> None
TPPlan = Callable[..., None]


def parallelize_decoder(
    model: nn.Module,
    dims: ParallelDims,
    meshes: Meshes,
    opts: ParallelizeOptions,
    *,
    apply_tp: TPPlan,
    tied_embeddings: bool = False,
    extra_units: list[nn.Module] | None = None,
    extra_blocks: list[nn.Module] | None = None,
) -> ConversionPlan | None:
    """Parallelize `model` in place; returns the float8 conversion plan when float8 is on.
    `extra_units`: modules outside `layers` that are FSDP units of their own after the blocks
    (DeepSeek-V3's MTP modules); the family's TP plan covers them. `extra_blocks`: the blocks
    inside them, whose attention context parallel spreads too."""
    float8_plan = convert_to_float8(model, opts.float8) if opts.float8 is not None else None
    layers = cast(nn.ModuleDict, model.layers)
    experts: list[nn.Module] = [moe.experts for _, moe in moe_layers(model)]

    if dims.ep_enabled:
        for _, moe in moe_layers(model):
            apply_ep(moe, meshes.get("ep"))

    if dims.tp_enabled:
        _tensor_parallel(model, layers, meshes.get("tp"), opts, apply_tp, float8_plan)

    if opts.sequence_shards is not None:
        apply_cp(model, [*layers.values(), *(extra_blocks or [])], opts.sequence_shards)

    if opts.ac_mode == "memory_budget" and not opts.compile:
        raise ValueError("activation checkpointing by memory budget needs compile")
    if opts.ac_mode != "none":
        blocks = apply_ac(dict(layers.items()), opts.ac_mode, opts.ac_option, opts.ac_memory_budget)
        for name, block in blocks.items():
            layers.register_module(name, block)

    if opts.compile:
        apply_compile(
            list(layers.values()),
            graphs_hold_collectives=dims.tp_enabled or dims.cp_enabled or dims.ep_enabled,
            # The all-to-all's split sizes are host integers read from the device.
            breaks_at_dispatch=dims.ep_enabled,
        )

    if dims.fsdp_enabled:
        first = _present(model, "tok_embeddings")
        last = _present(model, "norm", "output")
        if tied_embeddings:
            first, last = [], first + last
        if dims.ep_enabled:
            apply_expert_fsdp(
                experts,
                meshes.get("efsdp"),
                divide_factor=dims.loss_ranks,
                param_dtype=opts.param_dtype,
                reduce_dtype=opts.reduce_dtype,
                reshard_after_forward=opts.reshard_after_forward != "never" and not dims.pp_enabled,
                cpu_offload=opts.cpu_offload,
            )
        apply_fsdp(
            model,
            list(layers.values()) + list(extra_units or []),
            meshes.get("fsdp"),
            param_dtype=opts.param_dtype,
            reduce_dtype=opts.reduce_dtype,
            # Under pipeline parallel a stage runs forward once per micro-batch: freeing the
            # gathered parameters after each would all-gather them again every time (TorchTitan
            # keeps them too).
            reshard_after_forward=(
                "never"
                if dims.pp_enabled and opts.reshard_after_forward == "default"
                else opts.reshard_after_forward
            ),
            cpu_offload=opts.cpu_offload,
            # Absent on the pipeline stages that do not hold them.
            first=first,
            last=last,
        )
    elif dims.ddp_enabled:
        apply_ddp(model, meshes.get("ddp"))
    return float8_plan


def _tensor_parallel(
    model: nn.Module,
    layers: nn.ModuleDict,
    tp_mesh: DeviceMesh,
    opts: ParallelizeOptions,
    apply_tp: TPPlan,
    float8_plan: ConversionPlan | None,
) -> None:
    float8_tp = uses_float8_tp(opts.float8)
    apply_tp(
        model,
        list(layers.values()),
        tp_mesh,
        loss_parallel_enabled=opts.loss_parallel,
        float8_all_gather=float8_tp,
    )
    if float8_plan is not None:
        float8_plan.collectives.append(
            "TP all-gathers activations in float8"
            if float8_tp
            else "TP all-gathers stay high precision (rowwise recipe, or a backend without float8)"
        )
    if opts.async_tp:
        enable_async_tp(tp_mesh)


def _present(model: nn.Module, *names: str) -> list[nn.Module]:
    """The named submodules this model (or pipeline stage) holds."""
    return [m for m in (getattr(model, n, None) for n in names) if isinstance(m, nn.Module)]
