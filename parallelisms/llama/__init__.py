from parallelisms.llama.parallelize import parallelize_llama
from parallelisms.llama.tensor_parallel import apply_tp

__all__ = ["apply_tp", "parallelize_llama"]
