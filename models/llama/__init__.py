from models.llama.args import FLAVORS, LlamaArgs, num_params, training_flops_per_token
from models.llama.estimate import ESTIMATOR
from models.llama.hf_mapping import HF
from models.llama.model import Transformer
from models.spec import ModelSpec

SPEC = ModelSpec("llama3", FLAVORS, Transformer, num_params, training_flops_per_token)

__all__ = [
    "ESTIMATOR",
    "FLAVORS",
    "HF",
    "SPEC",
    "LlamaArgs",
    "Transformer",
    "num_params",
    "training_flops_per_token",
]
