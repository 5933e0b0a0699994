"""Grouped GEMM of rows sorted by group: `grouped_mm(x, weight, ends)` = x_g @ weight[g].T for
each group g of x's rows (`ends`: the groups' end rows, int32), forward and backward.

torch 2.13's `torch._grouped_mm` computes any dtype eagerly (on CUDA its CUTLASS kernel for
bf16 on sm90/sm100, elsewhere a loop that reads `ends` on the host), but its compiled form (the
meta function torch.compile traces with) takes bf16 only. bf16 goes to it directly, so Inductor
sees the real op. Other dtypes go through three custom ops (the product and its two gradients),
which torch.compile keeps whole in its graph, each with its output shape for tracing: the
float32 CPU runs that the parity tests use compile with fullgraph, no graph break."""

from __future__ import annotations

import torch


def grouped_mm(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    if x.dtype == torch.bfloat16:
        return torch._grouped_mm(x, weight.transpose(-2, -1), offs=ends)
    return _product(x, weight, ends)


@torch.library.custom_op("titanlite::grouped_mm", mutates_args=())
def _product(x: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(x, weight.transpose(-2, -1), offs=ends)


@_product.register_fake
def _(x, weight, ends):
    return x.new_empty(x.shape[0], weight.shape[1])


@torch.library.custom_op("titanlite::grouped_mm_grad_input", mutates_args=())
def _grad_input(grad: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    return torch._grouped_mm(grad.contiguous(), weight, offs=ends)


@_grad_input.register_fake
def _(grad, weight, ends):
    return grad.new_empty(grad.shape[0], weight.shape[2])


@torch.library.custom_op("titanlite::grouped_mm_grad_weight", mutates_args=())
def _grad_weight(grad: torch.Tensor, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    # (out, rows) @ (rows, in) per group of rows -> (groups, out, in); an empty group's is 0.
    return torch._grouped_mm(grad.contiguous().t(), x.contiguous(), offs=ends)


@_grad_weight.register_fake
def _(grad, x, ends):
    return grad.new_empty(ends.shape[0], grad.shape[1], x.shape[1])


def _setup(ctx, inputs, output) -> None:
    x, weight, ends = inputs
    ctx.save_for_backward(x, weight, ends)


def _backward(ctx, grad):
    x, weight, ends = ctx.saved_tensors
    grad_x = _grad_input(grad, weight, ends) if ctx.needs_input_grad[0] else None
    grad_w = _grad_weight(grad, x, ends) if ctx.needs_input_grad[1] else None
    return grad_x, grad_w, None


_product.register_autograd(_backward, setup_context=_setup)
