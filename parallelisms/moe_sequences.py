"""An MoE layer that holds only a piece of each sequence (tensor parallel's sequence shard,
context parallel's chunks): its per-sequence auxiliary loss needs each sequence's whole
statistics. `complete_sequences_over(moe, group, ...)` makes the layer average its (sequences,
2E) shares and probabilities over `group`'s ranks (their pieces are equal in length, so the
mean of the pieces' means is the sequence's mean); under both TP and CP it averages over each.

Every rank of the group then holds the same loss and back-propagates it, so the mean's backward
sends no collective; what it keeps depends on how the layout combines the ranks' gradients:
tensor parallel sums them (the replicated experts' all-reduce), so each rank keeps its 1/size
share (as DTensor's Partial -> Replicate); FSDP averages them over context-parallel ranks, so
each keeps the whole gradient and the average makes the loss count once."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from models.moe import MoE


def complete_sequences_over(moe: MoE, group: dist.ProcessGroup, *, grads_summed: bool) -> None:
    """`grads_summed`: the group's ranks' gradients are summed (else averaged)."""
    moe.sequence_mean = _SequenceMean(group, grads_summed, moe.sequence_mean)


class _SequenceMean:
    def __init__(
        self,
        group: dist.ProcessGroup,
        grads_summed: bool,
        inner: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.group, self.grads_summed, self.inner = group, grads_summed, inner

    def __call__(self, value: torch.Tensor) -> torch.Tensor:
        if self.inner is not None:
            value = self.inner(value)
        return _MeanOverPieces.apply(value, self.group, self.grads_summed)


class _MeanOverPieces(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, value: torch.Tensor, group: dist.ProcessGroup, grads_summed: bool
    ) -> torch.Tensor:
        size = dist.get_world_size(group)
        ctx.keep = 1 / size if grads_summed else 1.0
        total = value.contiguous().clone()
        dist.all_reduce(total, group=group)
        return total / size

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.keep, None, None
