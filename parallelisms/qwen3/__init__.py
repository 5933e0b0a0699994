from parallelisms.qwen3.parallelize import parallelize_qwen3
from parallelisms.qwen3.tensor_parallel import apply_tp

__all__ = ["apply_tp", "parallelize_qwen3"]
