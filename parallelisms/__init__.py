"""Parallelisms, one module each, composed per model family (`parallelisms/<family>/`).

Which family uses which parallelize function is recorded once, in titanlite/families.py."""

from parallelisms.llama import parallelize_llama
from parallelisms.options import ParallelizeOptions
from parallelisms.parallel_dims import LayoutError, Meshes, ParallelDims, check_layout
from parallelisms.tensor_parallel import loss_context

__all__ = [
    "LayoutError",
    "Meshes",
    "ParallelDims",
    "ParallelizeOptions",
    "check_layout",
    "loss_context",
    "parallelize_llama",
]
