from models.deepseek_v3.args import (
    FLAVORS,
    DeepSeekV3Args,
    num_params,
    training_flops_per_token,
)
from models.deepseek_v3.estimate import ESTIMATOR
from models.deepseek_v3.hf_mapping import HF
from models.deepseek_v3.model import DeepSeekV3
from models.spec import ModelSpec

SPEC = ModelSpec("deepseek_v3", FLAVORS, DeepSeekV3, num_params, training_flops_per_token)

__all__ = [
    "ESTIMATOR",
    "FLAVORS",
    "HF",
    "SPEC",
    "DeepSeekV3",
    "DeepSeekV3Args",
    "num_params",
    "training_flops_per_token",
]
