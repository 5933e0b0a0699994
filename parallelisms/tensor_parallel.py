"""Tensor-parallel building blocks shared by every model family: the DTensor styles (plain or
torchao's float8 ones), async TP and the loss-parallel context. Each family's TP plan (which
module gets which style) lives with its parallelize code, e.g. parallelisms/llama/."""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    loss_parallel,
)


def tp_styles(module: nn.Module, float8_all_gather: bool) -> tuple[type, type, type]:
    """(colwise, rowwise, prepare_input) styles for `module`: torchao's float8 ones when
    float8 all-gather is on and every Linear inside is a Float8Linear (they cast activations
    before the all-gather, halving its bytes), else DTensor's."""
    if float8_all_gather and _all_float8(module):
        from parallelisms.float8 import float8_tp_styles

        return float8_tp_styles()
    return ColwiseParallel, RowwiseParallel, PrepareModuleInput


def _all_float8(module: nn.Module) -> bool:
    from parallelisms.float8 import is_float8_linear

    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return bool(linears) and all(is_float8_linear(m) for m in linears)


def enable_async_tp(tp_mesh: DeviceMesh) -> None:
    """Overlap TP communication with matmuls (CUDA, compiled blocks, symmetric memory)."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def loss_context(enabled: bool) -> contextlib.AbstractContextManager:
    """Wrap loss and backward: cross-entropy on vocab-sharded logits when loss parallel is on."""
    return loss_parallel() if enabled else contextlib.nullcontext()
