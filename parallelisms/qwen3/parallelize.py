"""Compose the parallelisms for a Qwen3 model: the shared decoder composition
(parallelisms/decoder.py: float8 -> TP -> CP -> AC -> compile -> FSDP / DDP) with the Qwen3 TP
plan; a tied head is one FSDP unit with the embedding and the final norm.

Knows the model through its public structure (`layers`, `tok_embeddings`, `norm`, `output`) and
`args.tie_word_embeddings`.
"""

from __future__ import annotations

from torch import nn

from parallelisms.decoder import parallelize_decoder
from parallelisms.float8 import ConversionPlan
from parallelisms.options import ParallelizeOptions
from parallelisms.parallel_dims import Meshes, ParallelDims
from parallelisms.qwen3.tensor_parallel import apply_tp


def parallelize_qwen3(
    model: nn.Module, dims: ParallelDims, meshes: Meshes, opts: ParallelizeOptions
) -> ConversionPlan | None:
    """Parallelize `model` in place; returns the float8 conversion plan when float8 is on."""
    tied = bool(getattr(model.args, "tie_word_embeddings", False))
    return parallelize_decoder(model, dims, meshes, opts, apply_tp=apply_tp, tied_embeddings=tied)
