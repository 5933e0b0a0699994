"""The dry run's formulas for Qwen3 dense: the shared decoder block's (models/estimate.py) with
the per-head query/key norms, Qwen3's vocabulary, and its outer FSDP unit: the final norm and
the head, or, tied, the embedding and the norm (one unit: the head is the embedding)."""

from __future__ import annotations

import functools

from models.estimate import activations
from models.qwen3.args import QWEN3_VOCAB, Qwen3Args
from models.spec import Estimator


def fsdp_outer_unit_params(args: Qwen3Args) -> int:
    return args.vocab_size * args.dim + args.dim


ESTIMATOR = Estimator(
    functools.partial(activations, qk_norm=True), fsdp_outer_unit_params, QWEN3_VOCAB
)
