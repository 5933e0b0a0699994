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


class EmbeddingParallel(RowwiseParallel):
    """RowwiseParallel for the token embedding, whose output is awaited before it leaves.

    The stock style reduce-scatters with async_op=True, so `to_local()` hands on an
    AsyncCollectiveTensor (ACT) whose autograd history lives on the wrapper only: its inner
    tensor has none. That ACT is the input of the first block, and when the block is compiled,
    torch 2.13's AOTAutograd (`process_inputs` in torch/_functorch/_aot_autograd/
    frontend_utils.py, and the runtime wrapper generated in subclass_codegen.py) replaces it by
    `trigger_wait()`, i.e. by that inner tensor, before tracing and before calling the graph.
    The input then no longer requires grad, the graph returns no gradient for it, and the
    embedding's gradient is silently zero (with FSDP; without FSDP backward crashes instead).
    Upstream: pytorch/pytorch#191113. Waiting costs nothing here: the next op consumes the
    output. (The head's Replicate output, an all-gather on the last dim, is already plain.)"""

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        if outputs.placements != output_layouts:
            outputs = outputs.redistribute(placements=output_layouts, async_op=False)
        return outputs.to_local() if use_local_output else outputs


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
