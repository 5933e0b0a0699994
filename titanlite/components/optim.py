"""Optimizer, learning-rate schedule and gradient clipping (all work on DTensor parameters)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR

from titanlite.components.muon import ADAMW, MUON, Muon
from titanlite.components.param_groups import row_blocks, split_summary, trainable, uses_muon
from titanlite.config.schema import LRScheduler, Optimizer
from titanlite.core.logging import logger


def build_optimizer(model: nn.Module, cfg: Optimizer) -> torch.optim.Optimizer:
    if cfg.name == "Muon":
        return build_muon(model, cfg)
    # Norm gains (1-D) are not decayed: shrinking them towards 0 only fights the normalization.
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    cls = torch.optim.AdamW if cfg.name == "AdamW" else torch.optim.Adam
    return cls(groups, lr=cfg.lr, **_adamw_settings(cfg))


def _adamw_settings(cfg: Optimizer) -> dict[str, Any]:
    return {
        "betas": (cfg.beta1, cfg.beta2),
        "eps": cfg.eps,
        "fused": cfg.implementation == "fused",
        "foreach": cfg.implementation == "foreach",
    }


def build_muon(model: nn.Module, cfg: Optimizer) -> Muon:
    """Muon for the hidden matrices (param_groups.py says which), AdamW for the rest: its
    matrices decayed by adamw_weight_decay, its vectors not."""
    groups: dict[str, dict[str, Any]] = {
        "muon": {"algorithm": MUON, "row_blocks": 1},
        "muon_w13": {"algorithm": MUON, "row_blocks": 2},
        "adamw_decay": {"algorithm": ADAMW, "weight_decay": _or(cfg.adamw_weight_decay, cfg)},
        "adamw_no_decay": {"algorithm": ADAMW, "weight_decay": 0.0},
    }
    for g in groups.values():
        g["params"] = []
    for name, p, owner in trainable(model):
        if uses_muon(name, p, owner, cfg.muon_exclude):
            key = "muon" if row_blocks(name) == 1 else "muon_w13"
        else:
            key = "adamw_decay" if p.dim() >= 2 else "adamw_no_decay"
        groups[key]["params"].append(p)
    adamw_lr = cfg.lr if cfg.adamw_lr is None else cfg.adamw_lr
    for g in groups.values():
        if g["algorithm"] == ADAMW:
            g["lr"] = adamw_lr
    logger.info(split_summary(model, cfg.muon_exclude))
    return Muon(
        [g for g in groups.values() if g["params"]],
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        momentum=cfg.momentum,
        nesterov=cfg.nesterov,
        ns_coefficients=cast(tuple[float, float, float], tuple(cfg.ns_coefficients)),
        eps=cfg.muon_eps,
        ns_steps=cfg.ns_steps,
        adjust_lr_fn=cfg.adjust_lr_fn,
        ns_dtype=cfg.muon_ns_dtype,
        adamw={"lr": adamw_lr, **_adamw_settings(cfg)},
    )


def _or(value: float | None, cfg: Optimizer) -> float:
    return cfg.weight_decay if value is None else value


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


# Config key -> (group key, index into it) of a group's settings, by the group's role.
_ADAM_KEYS = {"beta1": ("betas", 0), "beta2": ("betas", 1), "eps": ("eps", None)}
_MUON_KEYS = {
    "weight_decay": ("weight_decay", None),
    "momentum": ("momentum", None),
    "nesterov": ("nesterov", None),
    "ns_steps": ("ns_steps", None),
    "ns_coefficients": ("ns_coefficients", None),
    "muon_eps": ("eps", None),
    "adjust_lr_fn": ("adjust_lr_fn", None),
    "muon_ns_dtype": ("ns_dtype", None),
}


def _group_keys(group: dict[str, Any], muon_run: bool) -> tuple[str, dict[str, tuple[str, Any]]]:
    """(the config key of the group's peak LR, its other config keys -> where they are)."""
    if group.get("algorithm") == MUON:
        return "lr", _MUON_KEYS
    keys = dict(_ADAM_KEYS)
    if any(p.dim() >= 2 for p in group["params"]):  # the vectors' group is never decayed
        keys["adamw_weight_decay" if muon_run else "weight_decay"] = ("weight_decay", None)
    return ("adamw_lr" if muon_run else "lr"), keys


def _configured(cfg: Optimizer) -> dict[str, Any]:
    values: dict[str, Any] = {
        k: getattr(cfg, k) for k in ("lr", *_ADAM_KEYS, *_MUON_KEYS) if k != "ns_coefficients"
    }
    values["ns_coefficients"] = tuple(cfg.ns_coefficients)
    values["adamw_lr"] = cfg.lr if cfg.adamw_lr is None else cfg.adamw_lr
    values["adamw_weight_decay"] = _or(cfg.adamw_weight_decay, cfg)
    return values


def _differs(saved: Any, configured: Any) -> bool:
    if isinstance(saved, float) or isinstance(configured, float):
        return not math.isclose(float(saved), float(configured), rel_tol=1e-12, abs_tol=0.0)
    return (
        tuple(saved) != tuple(configured)
        if isinstance(saved, (list, tuple))
        else (saved != configured)
    )


def reconcile_resumed_settings(
    optimizer: torch.optim.Optimizer, scheduler: LambdaLR, cfg: Optimizer, apply_config: bool
) -> dict[str, tuple[Any, Any]]:
    """After a resume, the checkpoint's optimizer state carries its own hyper-parameters, which
    silently win over the config unless applied here. Returns {config key: (checkpointed,
    configured)} for each that differs; with `apply_config` the configured values replace them
    (the LR schedule's shape always comes from the config: it is code, not state)."""
    configured, muon_run = _configured(cfg), cfg.name == "Muon"
    differences: dict[str, tuple[Any, Any]] = {}
    for i, group in enumerate(optimizer.param_groups):
        lr_key, keys = _group_keys(group, muon_run)
        saved: dict[str, Any] = {lr_key: float(scheduler.base_lrs[i])}
        for key, (field, index) in keys.items():
            value = group[field] if index is None else group[field][index]
            saved[key] = tuple(value) if isinstance(value, list) else value
        for key, value in saved.items():
            if key not in differences and _differs(value, configured[key]):
                differences[key] = (value, configured[key])
    if apply_config and differences:
        for i, group in enumerate(optimizer.param_groups):
            _apply(group, i, scheduler, *_group_keys(group, muon_run), configured)
        scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
    return differences


def _apply(
    group: dict[str, Any],
    i: int,
    scheduler: LambdaLR,
    lr_key: str,
    keys: dict[str, tuple[str, Any]],
    configured: dict[str, Any],
) -> None:
    peak = configured[lr_key]
    scheduler.base_lrs[i] = peak
    group["initial_lr"] = peak
    group["lr"] = peak * scheduler.lr_lambdas[i](scheduler.last_epoch)
    for key, (field, index) in keys.items():
        if index is None:
            group[field] = configured[key]
        else:
            parts = list(group[field])
            parts[index] = configured[key]
            group[field] = tuple(parts)
