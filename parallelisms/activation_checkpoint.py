"""Activation checkpointing of transformer blocks: none, full, selective (every N-th block, or
per operator: keep the expensive outputs, recompute the cheap ones), or memory_budget
(torch.compile's min-cut partitioner chooses what to recompute so that each compiled block keeps
at most a given fraction of its activations)."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.attention.varlen  # noqa: F401  (registers torch_attn::_varlen_attn, saved below)
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    ActivationWrapper,
    checkpoint_wrapper,
)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import models.attention  # noqa: F401  (registers titanlite::document_attention, saved below)

# Outputs worth keeping: they are the costly ones to recompute (matmuls, attention) or need
# communication (reduce-scatter under tensor parallel).
# Every attention kernel a block may run is listed: one missing is recomputed in backward, a
# second attention forward per block (tests count them).
_aten = torch.ops.aten
_SAVE = {
    _aten.mm.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.torch_attn._varlen_attn.default,
    torch.ops.titanlite.document_attention.default,
    torch.ops.higher_order.flex_attention,
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


class MemoryBudgetWrapper(ActivationWrapper):
    """A block whose compiled graph the min-cut partitioner splits under `budget`: 0 keeps only
    the graph's inputs (recompute everything, as full AC), 1 its default runtime-optimal choice,
    b in between at most b of the way from the one to the other in saved bytes.

    The budget is an annotation on the traced forward (torch 2.13's
    `region_activation_memory_budget`) rather than the process-global
    `torch._functorch.config.activation_memory_budget` that TorchTitan sets: it is read when the
    graph is compiled, lazily, so a global would apply whatever value is set at that moment (to
    every graph, the loss's too), whereas the annotation belongs to this block's graph and is
    part of what dynamo guards and the compile caches key on. Only valid under torch.compile
    (torch raises in eager). Subclassing ActivationWrapper keeps the parameter and checkpoint
    names of the other AC modes."""

    def __init__(self, module: nn.Module, budget: float):
        super().__init__(module)
        # Kept as text: dynamo would turn a float attribute that differs between two traces of
        # this code (two models in one process) into a symbolic float, which the annotation
        # cannot take; a string is always specialized, so each budget gets its own graph.
        self._budget = repr(float(budget))

    def forward(self, *args, **kwargs):
        with torch.autograd.graph.region_activation_memory_budget(float(self._budget)):
            return self._checkpoint_wrapped_module(*args, **kwargs)


def apply_ac(
    blocks: dict[str, nn.Module], mode: str, option: str, memory_budget: float = 1.0
) -> dict[str, nn.Module]:
    """Return the blocks, wrapped as `mode` asks ("none" / "full" / "selective" with `option`
    either "op" or an integer N meaning every N-th block / "memory_budget" with `memory_budget`
    in [0, 1], for blocks that are then compiled)."""
    if mode == "none":
        return blocks
    wrapped = {}
    for i, (name, block) in enumerate(blocks.items()):
        if mode == "memory_budget":
            block = MemoryBudgetWrapper(block, memory_budget)
        elif mode == "full":
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        elif option == "op":
            block = checkpoint_wrapper(
                block, context_fn=_op_policy_context, preserve_rng_state=False
            )
        elif i % int(option) == 0:
            block = checkpoint_wrapper(block, preserve_rng_state=False)
        wrapped[name] = block
    return wrapped
