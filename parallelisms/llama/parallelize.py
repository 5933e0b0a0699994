"""Compose the parallelisms for a Llama model: the shared decoder composition
(parallelisms/decoder.py: float8 -> TP -> CP -> AC -> compile -> FSDP / DDP) with the Llama TP
plan (parallelisms/llama/tensor_parallel.py).

Knows the model only through its public structure: `layers` (a ModuleDict of blocks),
`tok_embeddings`, `norm`, `output`.
"""

from __future__ import annotations

from torch import nn

from parallelisms.decoder import parallelize_decoder
from parallelisms.float8 import ConversionPlan
from parallelisms.llama.tensor_parallel import apply_tp
from parallelisms.options import ParallelizeOptions
from parallelisms.parallel_dims import Meshes, ParallelDims


def parallelize_llama(
    model: nn.Module, dims: ParallelDims, meshes: Meshes, opts: ParallelizeOptions
) -> ConversionPlan | None:
    """Parallelize `model` in place; returns the float8 conversion plan when float8 is on."""
    return parallelize_decoder(model, dims, meshes, opts, apply_tp=apply_tp)
