"""Run a module's forward on the local tensors of its DTensor parameters.

A layout that splits or replicates an MoE's parameters as DTensors computes with their local
tensors (grouped GEMMs, routing and gathers are not DTensor ops). A pre-forward hook swaps each
chosen parameter for `to_local(param)` (an autograd function of it, so the gradient reaches the
DTensor with its placements, where FSDP reduces it), and a post-forward hook puts the
parameters back. Registered before `fully_shard`, these hooks run after FSDP's all-gather and
before its reshard.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def compute_on_local_params(
    module: nn.Module,
    params: list[tuple[nn.Module, str]],
    to_local: Callable[[DTensor], torch.Tensor],
) -> None:
    """During `module`'s forward, each (owner, name) parameter is `to_local` of itself."""
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []

    def swap(module: nn.Module, args: tuple) -> tuple:
        for owner, name in params:
            param = owner._parameters[name]
            if isinstance(param, DTensor):
                swapped.append((owner, name, param))
                owner._parameters[name] = to_local(param)
        return tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)

    def restore(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        while swapped:
            owner, name, param = swapped.pop()
            owner._parameters[name] = param
        return output

    module.register_forward_pre_hook(swap)
    module.register_forward_hook(restore, always_call=True)


class SumGradOverGroup(torch.autograd.Function):
    """Identity forward; the backward all-reduces the gradient over `group`: for a tensor each
    rank uses only part of (its own tokens, or its own heads), whose gradient is the sum of the
    ranks' parts."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return local.view_as(local)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None
