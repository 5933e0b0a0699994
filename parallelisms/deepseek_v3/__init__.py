from parallelisms.deepseek_v3.parallelize import parallelize_deepseek_v3
from parallelisms.deepseek_v3.tensor_parallel import apply_tp

__all__ = ["apply_tp", "parallelize_deepseek_v3"]
