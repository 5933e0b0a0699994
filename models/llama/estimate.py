"""The dry run's formulas for Llama: the shared decoder block's (models/estimate.py, where the
formula is documented and calibrated), Llama 3's vocabulary and its outer FSDP unit."""

from __future__ import annotations

from models.estimate import activations, fsdp_outer_unit_params
from models.spec import Estimator

# Llama 3's tokenizer: what a dry run assumes when the tokenizer file is not on this machine.
LLAMA3_VOCAB = 128_256

ESTIMATOR = Estimator(activations, fsdp_outer_unit_params, LLAMA3_VOCAB)

__all__ = ["ESTIMATOR", "LLAMA3_VOCAB", "activations"]
