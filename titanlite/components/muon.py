"""Muon for every layout: Newton-Schulz orthogonalized momentum for the hidden matrices, AdamW
for the rest, in one optimizer (one LR schedule, one state dict, one checkpoint key space).

The update of a matrix is torch.optim.Muon's (torch 2.13, optim/_muon.py), op for op: the
momentum buffer moves by lerp, Nesterov's look-ahead is another lerp, the orthogonalization
runs in bfloat16 on the matrix transposed to be wide, the decay uses the schedule's LR and the
step the shape-adjusted one. On one process a 2-D parameter gets the same bits as torch's.

What differs is where the matrix is. Orthogonalization is not elementwise: the Newton-Schulz
iteration of a shard is not the shard of the iteration. Every rank therefore gathers each
parameter's momentum update into whole matrices (an all-gather over the mesh dimensions that
split them: FSDP's, TP's; expert parallel's and FSDP-of-experts' split on the expert dimension
only separates matrices and stays), orthogonalizes them and keeps its own shard of the result;
the momentum buffers, the weights and the checkpointed state stay sharded like the parameter.
Cost per step: one all-gather of every Muon parameter in fp32 (the size of the gradient that
FSDP reduce-scattered), one whole matrix (+ its bf16 copies) at a time in memory, and each rank
orthogonalizes every matrix it holds a piece of (docs/optimizers.md weighs this against
distributing whole matrices over ranks). Experts' 3-D weights are E matrices each, a fused w13
2 per expert (its gate rows and its up rows: models/moe.py), orthogonalized in one batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate

# torch.optim.Muon's defaults (Keller Jordan's constants).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
MUON, ADAMW = "muon", "adamw"


def newton_schulz(
    g: torch.Tensor,
    coefficients: tuple[float, float, float],
    steps: int,
    eps: float,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """torch 2.13's `_zeropower_via_newtonschulz` over a batch of matrices (..., m, n): the same
    ops, batched (on CPU bit for bit the 2-D function's result for each matrix); in `dtype`,
    torch's bfloat16 unless asked."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
    batched = x.unsqueeze(0) if x.dim() == 2 else x.flatten(0, -3)
    for _ in range(steps):
        gram = batched @ batched.mT
        update = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        batched = torch.baddbmm(batched, update, batched, beta=a)
    x = batched.reshape(x.shape)
    return x.mT if tall else x


def adjusted_lr(lr: float, adjust_lr_fn: str | None, rows: int, cols: int) -> float:
    """torch's `_adjust_lr` for a (rows, cols) = (out, in) matrix."""
    if adjust_lr_fn in (None, "original"):
        return lr * math.sqrt(max(1, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(rows, cols))
    return lr


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _whole_matrices(
    update: torch.Tensor, param: torch.Tensor
) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """This rank's local `update` of `param` as whole matrices (every row and column of each,
    gathered over the mesh), and the function that takes such a tensor back to the local shard.
    A 3-D expert weight keeps its split of the expert dimension (dim 0), which only separates
    matrices."""
    if not isinstance(param, DTensor):
        return update, lambda t: t
    mesh, placements = param.device_mesh, tuple(param.placements)
    kept = tuple(
        q if param.dim() == 3 and getattr(q, "dim", None) == 0 else Replicate() for q in placements
    )
    shard = DTensor.from_local(
        update, mesh, placements, run_check=False, shape=param.shape, stride=param.stride()
    )
    whole = shard.redistribute(mesh, kept).to_local() if kept != placements else update

    def back(t: torch.Tensor) -> torch.Tensor:
        if kept == placements:
            return t
        spread = DTensor.from_local(
            t, mesh, kept, run_check=False, shape=param.shape, stride=param.stride()
        )
        return spread.redistribute(mesh, placements).to_local()

    return whole, back


class Muon(torch.optim.Optimizer):
    """Groups marked `"algorithm": "muon"` (2-D matrices or 3-D stacks of experts' matrices;
    `row_blocks` > 1: each matrix is that many matrices stacked by rows, as w13's gate and up)
    are stepped here; groups marked "adamw" by torch.optim.AdamW, which shares this optimizer's
    state and those groups' dicts (one state dict, one schedule over every group)."""

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = NS_EPS,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        ns_dtype: str = "bfloat16",
        adamw: dict[str, Any] | None = None,
    ):
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum should be within [0, 1) but is {momentum}")
        if not 0 < ns_steps < 100:  # torch's own limit
            raise ValueError(f"ns_steps should be within [1, 99] but is {ns_steps}")
        if ns_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"ns_dtype should be bfloat16 or float32, not {ns_dtype}")
        if len(ns_coefficients) != 3:
            raise ValueError(f"ns_coefficients should be 3 numbers, not {ns_coefficients}")
        groups = [dict(g) for g in params]
        self._muon_defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": tuple(ns_coefficients),
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "ns_dtype": ns_dtype,
            "row_blocks": 1,
        }
        adamw_groups = [g for g in groups if g.get("algorithm") == ADAMW]
        self._adamw = torch.optim.AdamW(adamw_groups, **(adamw or {})) if adamw_groups else None
        self._adamw_dicts = iter(self._adamw.param_groups if self._adamw else [])
        super().__init__(groups, {})
        self._link()

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if param_group.setdefault("algorithm", MUON) == ADAMW:
            # The dict AdamW filled with its defaults, so that both optimizers read one dict.
            param_group = next(self._adamw_dicts)
        else:
            for key, value in self._muon_defaults.items():
                param_group.setdefault(key, value)
            for p in param_group["params"]:
                if p.dim() not in (2, 3):
                    raise ValueError(f"Muon takes matrices (2-D) or experts (3-D), not {p.shape}")
        super().add_param_group(param_group)

    def _link(self) -> None:
        if self._adamw is not None:
            self._adamw.param_groups = [g for g in self.param_groups if g["algorithm"] == ADAMW]
            self._adamw.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)  # new group dicts and a new state
        self._link()

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            if group["algorithm"] == MUON:
                for p in group["params"]:
                    if p.grad is not None:
                        self._step_matrix(p, group)
        if self._adamw is not None:
            self._adamw.step()
        return loss

    def _step_matrix(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        grad = p.grad
        assert grad is not None
        if isinstance(grad, DTensor) and isinstance(p, DTensor):
            grad = grad.redistribute(p.device_mesh, p.placements)
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(grad, memory_format=torch.preserve_format)
        g, buf, momentum = _local(grad), _local(state["momentum_buffer"]), group["momentum"]
        buf.lerp_(g, 1 - momentum)
        update = g.lerp(buf, momentum) if group["nesterov"] else buf
        whole, back = _whole_matrices(update, p)
        blocks = group["row_blocks"]
        rows, cols = whole.shape[-2] // blocks, whole.shape[-1]
        matrices = whole.reshape(*whole.shape[:-2], blocks, rows, cols)
        dtype = getattr(torch, group["ns_dtype"])
        ortho = newton_schulz(
            matrices, group["ns_coefficients"], group["ns_steps"], group["eps"], dtype
        )
        local = back(ortho.reshape(whole.shape))
        lr = float(group["lr"])
        weights = _local(p)
        weights.mul_(1 - lr * group["weight_decay"])
        weights.add_(local, alpha=-adjusted_lr(lr, group["adjust_lr_fn"], rows, cols))
