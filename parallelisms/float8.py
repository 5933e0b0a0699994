"""Float8 training with torchao: swap eligible nn.Linear layers for Float8Linear, pick float8-aware
tensor-parallel styles, refresh FSDP float8 weight scales after each optimizer step.

The swap happens on the meta model before any other parallelism: the float8 TP styles refuse
anything but a Float8Linear, and FSDP must see the float8 weight wrapper when it shards. A
Float8Linear keeps its weight in high precision (float8 exists only inside the matmuls and the
collectives), so its state dict is that of the nn.Linear it replaced: checkpoints move freely
between float8 and bf16 runs.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field

from torch import nn

from parallelisms.parallel_dims import LayoutError

RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
# float8 matmuls (torch._scaled_mm) need both matrix dims to be multiples of 16.
ALIGNMENT = 16
ROUTER_GATE = "router.gate"  # models/moe.py's TopKRouter
MIN_CUDA_CAPABILITY = (8, 9)


@dataclass(frozen=True)
class Float8Options:
    recipe: str = "tensorwise"
    emulate: bool = False
    filter_fqns: tuple[str, ...] = ("output",)
    fsdp_float8_all_gather: bool = False
    precompute_scale: bool = False
    # NCCL moves float8 tensors; gloo cannot, so on CPU the TP all-gathers stay high precision.
    float8_collectives: bool = True


@dataclass
class ConversionPlan:
    """Which Linear layers become Float8Linear, and why each other one does not."""

    converted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    collectives: list[str] = field(default_factory=list)  # which all-gathers move float8

    def describe(self) -> str:
        lines = [
            f"float8: converting {len(self.converted)} of "
            f"{len(self.converted) + len(self.skipped)} Linear layers"
        ]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        lines += [f"  {note}" for note in self.collectives]
        return "\n".join(lines)


def check_float8(
    opts: Float8Options,
    *,
    fsdp_enabled: bool,
    device_type: str,
    cuda_capability: tuple[int, int] | None,
) -> None:
    """Raise LayoutError (one line, with the fix) for a float8 setup this hardware cannot run.
    `cuda_capability` is None when unknown (a dry run planning for another machine)."""
    if opts.recipe not in RECIPES:
        raise LayoutError(
            f"[float8] recipe_name = {opts.recipe!r}: expected one of {', '.join(RECIPES)}"
        )
    if (
        device_type == "cuda"
        and cuda_capability is not None
        and cuda_capability < MIN_CUDA_CAPABILITY
        and not opts.emulate
    ):
        have, need = ".".join(map(str, cuda_capability)), ".".join(map(str, MIN_CUDA_CAPABILITY))
        raise LayoutError(
            f"[float8] this GPU has compute capability {have}, and float8 matmuls need >= {need} "
            "(H100/H200, L40S, RTX 4090); set --float8.emulate true to run the float8 path in "
            "high precision, or remove float8 from model.converters"
        )
    if opts.fsdp_float8_all_gather and opts.recipe != "tensorwise":
        raise LayoutError(
            f"[float8] recipe_name = {opts.recipe!r} scales weights per row, which the FSDP float8 "
            "all-gather cannot carry (it needs one scale per tensor); set "
            "--float8.enable_fsdp_float8_all_gather false or use recipe_name = 'tensorwise'"
        )
    if opts.fsdp_float8_all_gather and fsdp_enabled and not opts.float8_collectives:
        raise LayoutError(
            f"[float8] enable_fsdp_float8_all_gather: the {device_type} backend (gloo) cannot "
            "all-gather float8 tensors; set --float8.enable_fsdp_float8_all_gather false "
            "(and precompute_float8_dynamic_scale_for_fsdp false) on this machine"
        )


def plan_conversion(model: nn.Module, opts: Float8Options) -> ConversionPlan:
    plan = ConversionPlan()
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        hit = next((f for f in opts.filter_fqns if f and f in name), None)
        if hit is not None:
            plan.skipped[name] = f"matches filter_fqns entry {hit!r}"
        elif name.endswith(ROUTER_GATE):
            # Its scores choose the experts: float8's rounding would move tokens between them
            # (TorchTitan keeps it out too). Experts are 3-D weights, not Linear layers.
            plan.skipped[name] = "an MoE router, kept in high precision"
        elif module.in_features % ALIGNMENT or module.out_features % ALIGNMENT:
            plan.skipped[name] = (
                f"shape {module.out_features} x {module.in_features} is not a "
                f"multiple of {ALIGNMENT} in both dims"
            )
        else:
            plan.converted.append(name)
    return plan


def torchao_config(opts: Float8Options):
    from torchao.float8 import Float8LinearConfig

    if opts.recipe == "tensorwise":
        return Float8LinearConfig(
            enable_fsdp_float8_all_gather=opts.fsdp_float8_all_gather,
            emulate=opts.emulate,
        )
    config = Float8LinearConfig.from_recipe_name(opts.recipe)
    return dataclasses.replace(config, emulate=opts.emulate)


def convert_to_float8(model: nn.Module, opts: Float8Options) -> ConversionPlan:
    """Swap the planned Linear layers in place (on the meta model) and return the plan."""
    quiet_torchao_import()
    from torchao.float8 import convert_to_float8_training

    plan = plan_conversion(model, opts)
    if opts.fsdp_float8_all_gather:
        plan.collectives.append(
            "FSDP all-gathers weights in float8"
            + (", scales precomputed after each step" if opts.precompute_scale else "")
        )
    chosen = set(plan.converted)
    convert_to_float8_training(
        model, config=torchao_config(opts), module_filter_fn=lambda _module, fqn: fqn in chosen
    )
    return plan


def is_float8_linear(module: nn.Module) -> bool:
    from torchao.float8.float8_linear import Float8Linear

    return isinstance(module, Float8Linear)


def uses_float8_tp(opts: Float8Options | None) -> bool:
    """Float8 TP styles all-gather activations in float8: tensorwise scaling only, and only on a
    backend that can move float8 tensors."""
    return opts is not None and opts.recipe == "tensorwise" and opts.float8_collectives


def float8_tp_styles():
    """(colwise, rowwise, prepare-input) style classes that all-gather in float8."""
    from torchao.float8.float8_tensor_parallel import (
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput


def register_scale_precompute(optimizer, model: nn.Module) -> None:
    """After each optimizer step, compute every float8 weight's scale in one all-reduce instead of
    one per layer inside the FSDP all-gathers."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda *_: precompute_float8_dynamic_scale_for_fsdp(model))


def quiet_torchao_import() -> None:
    """Import torchao.float8 without its import-time noise: a warning per CUDA kernel library it
    cannot load (expected on CPU, irrelevant to float8 training) and a torch deprecation note."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        import torchao.float8  # noqa: F401
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
