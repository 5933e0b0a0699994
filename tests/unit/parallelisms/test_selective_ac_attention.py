"""Selective per-op activation checkpointing keeps attention's output, whichever kernel runs: one
training step runs the attention forward once per block, not again in backward."""

from typing import cast

import pytest
import torch
from helpers import tiny_llama_args
from torch.utils._python_dispatch import TorchDispatchMode

from models.llama import Transformer
from parallelisms import Meshes, ParallelDims, ParallelizeOptions
from parallelisms.llama.parallelize import parallelize_llama

# The forward ops of the kernels that run on CPU (CUDA's are in the same save list).
_FORWARDS = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.titanlite.document_attention.default,
}


class _CountAttention(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func in _FORWARDS
        return func(*args, **(kwargs or {}))


def _attention_forwards(attn_type: str, mask: str, ac_mode: str) -> int:
    args = tiny_llama_args(attn_type=attn_type, attn_mask_type=mask)
    model = Transformer(args)
    opts = ParallelizeOptions(ac_mode=ac_mode, ac_option="op")
    parallelize_llama(model, ParallelDims(1, 1, 1, 1), cast(Meshes, None), opts)
    model.init_weights(seed=0)
    tokens = torch.randint(1, args.vocab_size, (2, 64), generator=torch.Generator().manual_seed(0))
    with _CountAttention() as counter:
        model(tokens).float().pow(2).mean().backward()
    return counter.calls


@pytest.mark.parametrize(
    "attn_type, mask",
    [("sdpa", "causal"), ("sdpa", "block_causal"), ("varlen", "block_causal")],
)
def test_selective_op_ac_runs_attention_once_per_block(attn_type, mask):
    n_layers = tiny_llama_args().n_layers
    assert _attention_forwards(attn_type, mask, "selective") == n_layers
    # The count sees recomputation: full checkpointing reruns every block's attention.
    assert _attention_forwards(attn_type, mask, "full") == 2 * n_layers
