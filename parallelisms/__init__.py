"""Parallelisms, one module each, composed per model family by `parallelize_<model>.py`."""

from parallelisms.parallel_dims import LayoutError, Meshes, ParallelDims, check_layout
from parallelisms.parallelize_llama import ParallelizeOptions, parallelize_llama
from parallelisms.tensor_parallel import loss_context

# Model family name (models.MODELS) -> the function that parallelizes it.
PARALLELIZE_FNS = {"llama3": parallelize_llama}

__all__ = [
    "PARALLELIZE_FNS",
    "LayoutError",
    "Meshes",
    "ParallelDims",
    "ParallelizeOptions",
    "check_layout",
    "loss_context",
    "parallelize_llama",
]
