"""Activation checkpointing of transformer blocks: none, full, or selective (every N-th block,
or per operator: keep the expensive outputs, recompute the cheap ones)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

# Outputs worth keeping: they are the costly ones to recompute (matmuls, attention) or need
# communication (reduce-scatter under tensor parallel).
_aten = torch.ops.aten
_SAVE = {
    _aten.mm.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    # float8 scaling reads the abs-max; recomputing it would change nothing but cost time.
    _aten.max.default,
}


def _op_policy_context():
    counts = defaultdict[str, int](int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == _aten.mm.default:
            counts[mode] += 1
        # Every second matmul is recomputed: halves the saved matmul outputs for ~1/6 more FLOPs.
        keep = func in _SAVE and not (func == _aten.mm.default and counts[mode] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def apply_ac(blocks: dict[str, nn.Module], mode: str, option: str) -> dict[str, nn.Module]:
    """Return the blocks, wrapped as `mode` asks ("none" / "full" / "selective" with `option`
    either "op" or an integer N meaning every N-th block)."""
    if mode == "none":
        return blocks
    wrapped = {}
    for i, (name, block) in enumerate(blocks.items()):
        if mode == "full":
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        elif option == "op":
            block = checkpoint_wrapper(
                block, context_fn=_op_policy_context, preserve_rng_state=False
            )
        elif i % int(option) == 0:
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        wrapped[name] = block
    return wrapped
