"""Parallelisms, one module each, composed per model family (`parallelisms/<family>/`).

Which family uses which parallelize function is recorded once, in titanlite/families.py."""

from parallelisms.options import ParallelizeOptions
from parallelisms.parallel_dims import LayoutError, Meshes, ParallelDims, check_layout

# Only the layout types here: preflight checks a layout before launch, and importing FSDP,
# DTensor and pipelining would add ~1.8 s to every launch. Each parallelism is imported from
# its own module (parallelisms.llama, parallelisms.tensor_parallel, ...).
__all__ = ["LayoutError", "Meshes", "ParallelDims", "ParallelizeOptions", "check_layout"]
