"""Optimizer, learning-rate schedule and gradient clipping (all work on DTensor parameters)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from titanlite.config.schema import LRScheduler, Optimizer


def build_optimizer(model: nn.Module, cfg: Optimizer) -> torch.optim.Optimizer:
    # Norm gains (1-D) are not decayed: shrinking them towards 0 only fights the normalization.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    cls = torch.optim.AdamW if cfg.name == "AdamW" else torch.optim.Adam
    return cls(
        groups,
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=cfg.implementation == "fused",
        foreach=cfg.implementation == "foreach",
    )


def lr_factor(step: int, total_steps: int, cfg: LRScheduler) -> float:
    """Multiplier of the peak LR for the optimizer step with 0-based index `step`: linear warmup,
    a stable phase, then decay towards lr_min (warmup-stable-decay when decay_ratio is set).

    The same value at every step as TorchTitan (every release from 0.1.0 to 0.3.0), whose
    [lr_scheduler] keys these are: warmup reaches the peak at its last step ((step + 1) /
    warmup), and the decay counts one virtual step past the end, so the last step still
    learns (lr_min + (1 - lr_min) / decay_steps of the peak under linear decay, not lr_min).
    docs/performance.md shows the loss curves this gives next to TorchTitan's."""
    # Too long a warmup or decay for the run (e.g. --training.steps 5 on a preset) is
    # shortened, as TorchTitan does, rather than refused.
    warmup = min(cfg.warmup_steps, total_steps)
    decay = (
        total_steps - warmup if cfg.decay_ratio is None else round(total_steps * cfg.decay_ratio)
    )
    decay = min(decay, total_steps - warmup)
    decay_start = total_steps + 1 - decay  # warmup + stable steps, with the virtual last step
    if step < warmup:
        return (step + 1) / warmup
    if step < decay_start:
        return 1.0
    progress = (step + 1 - decay_start) / decay
    if cfg.decay_type == "linear":
        shape = 1 - progress
    elif cfg.decay_type == "sqrt":
        shape = 1 - math.sqrt(progress)
    else:
        shape = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.lr_min + (1 - cfg.lr_min) * shape


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer, cfg: LRScheduler, total_steps: int
) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, total_steps, cfg))


@torch.no_grad()
def clip_grad_norm_(
    params: Sequence[torch.Tensor],
    max_norm: float,
    pp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """Global gradient norm over all ranks' shards, clipping when max_norm > 0.

    With sharded (DTensor) gradients the per-shard norms are reduced across the mesh by
    DTensor itself; full_tensor() then gives every rank the same global value. Gradients on
    different meshes (expert-parallel experts next to the dense parameters) are normed per mesh
    and their squares summed. Pipeline stages hold different parameters: their squared norms
    are summed over `pp_group`.
    """
    by_mesh: dict[object, list[torch.Tensor]] = {}
    for p in params:
        if p.grad is not None:
            mesh = p.grad.device_mesh if isinstance(p.grad, DTensor) else None
            by_mesh.setdefault(mesh, []).append(p)
    norms = [_norm([p.grad for p in group if p.grad is not None]) for group in by_mesh.values()]
    norms = norms or [_norm([])]
    total = norms[0] if len(norms) == 1 else torch.stack(norms).square().sum().sqrt()
    if pp_group is not None:
        squared = total**2
        dist.all_reduce(squared, group=pp_group)
        total = squared.sqrt()
    if max_norm > 0:
        for group in by_mesh.values():  # a foreach op takes the DTensors of one mesh
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total, foreach=True)
    return total


def _norm(grads: list[torch.Tensor]) -> torch.Tensor:
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=True)
    return total.full_tensor() if isinstance(total, DTensor) else total


def _hyperparameters(optimizer: torch.optim.Optimizer, scheduler: LambdaLR) -> dict[str, float]:
    """The [optimizer] values an optimizer and its schedule run with (group 0 is the decayed
    one; the peak LR is the schedule's base)."""
    group = optimizer.param_groups[0]
    return {
        "lr": float(scheduler.base_lrs[0]),
        "beta1": float(group["betas"][0]),
        "beta2": float(group["betas"][1]),
        "eps": float(group["eps"]),
        "weight_decay": float(group["weight_decay"]),
    }


def reconcile_resumed_settings(
    optimizer: torch.optim.Optimizer, scheduler: LambdaLR, cfg: Optimizer, apply_config: bool
) -> dict[str, tuple[float, float]]:
    """After a resume, the checkpoint's optimizer state carries its own hyper-parameters, which
    silently win over the config unless applied here. Returns {key: (checkpointed, configured)}
    for each that differs; with `apply_config` the configured values replace them (the LR
    schedule's shape always comes from the config: it is code, not state)."""
    configured = {
        "lr": cfg.lr,
        "beta1": cfg.beta1,
        "beta2": cfg.beta2,
        "eps": cfg.eps,
        "weight_decay": cfg.weight_decay,
    }
    saved = _hyperparameters(optimizer, scheduler)
    differences = {
        k: (saved[k], configured[k])
        for k in configured
        if not math.isclose(saved[k], configured[k], rel_tol=1e-12, abs_tol=0.0)
    }
    if apply_config and differences:
        scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]
        for i, group in enumerate(optimizer.param_groups):
            group["initial_lr"] = cfg.lr
            group["lr"] = cfg.lr * scheduler.lr_lambdas[i](scheduler.last_epoch)
            group["betas"] = (cfg.beta1, cfg.beta2)
            group["eps"] = cfg.eps
            if i == 0:  # group 1 (norm gains, 1-D) is never decayed
                group["weight_decay"] = cfg.weight_decay
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return differences
