from models.llama.args import FLAVORS, LlamaArgs, num_params, training_flops_per_token
from models.llama.model import Transformer

__all__ = ["FLAVORS", "LlamaArgs", "Transformer", "num_params", "training_flops_per_token"]
