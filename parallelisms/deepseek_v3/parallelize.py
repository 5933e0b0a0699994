"""Compose the parallelisms for a DeepSeek-V3 model: the shared decoder composition
(parallelisms/decoder.py: float8 -> EP -> TP -> CP -> AC -> compile -> FSDP / DDP) with the
DeepSeek-V3 TP plan; each MTP module is an FSDP unit of its own after the blocks (its MoE's
experts are split by expert parallel and sharded over their own mesh with the blocks'), and its
block's attention is context parallel as theirs.
Activation checkpointing and compile wrap the main blocks only: an MTP module runs once per
forward, after them.

Knows the model through its public structure (`layers`, `mtp`, `tok_embeddings`, `norm`,
`output`)."""

from __future__ import annotations

from torch import nn

from parallelisms.decoder import parallelize_decoder
from parallelisms.deepseek_v3.tensor_parallel import apply_tp
from parallelisms.float8 import ConversionPlan
from parallelisms.options import ParallelizeOptions
from parallelisms.parallel_dims import Meshes, ParallelDims


def parallelize_deepseek_v3(
    model: nn.Module, dims: ParallelDims, meshes: Meshes, opts: ParallelizeOptions
) -> ConversionPlan | None:
    """Parallelize `model` in place; returns the float8 conversion plan when float8 is on."""
    mtp = getattr(model, "mtp", None)
    units = list(mtp.values()) if mtp is not None else []
    return parallelize_decoder(
        model,
        dims,
        meshes,
        opts,
        apply_tp=apply_tp,
        extra_units=units,
        extra_blocks=[u.get_submodule("block") for u in units],
    )
