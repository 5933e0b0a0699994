from models.qwen3.args import FLAVORS, Qwen3Args, num_params, training_flops_per_token
from models.qwen3.estimate import ESTIMATOR
from models.qwen3.hf_mapping import HF
from models.qwen3.model import Qwen3
from models.spec import ModelSpec

SPEC = ModelSpec("qwen3", FLAVORS, Qwen3, num_params, training_flops_per_token)

__all__ = [
    "ESTIMATOR",
    "FLAVORS",
    "HF",
    "SPEC",
    "Qwen3",
    "Qwen3Args",
    "num_params",
    "training_flops_per_token",
]
