"""Megatron-style tensor parallel with sequence parallel, expressed as DTensor plans.

Inside a block: q/k/v and w1/w3 are split column-wise (each rank owns whole heads / a slice of
the hidden units), wo and w2 row-wise, so a block costs one all-gather in and one reduce-scatter
out. Between blocks activations stay sharded on the sequence dim (the RMSNorms run on their
shard). The output head is column-wise; with loss parallel the logits stay sharded over the
vocabulary and cross-entropy runs on the shards.
"""

from __future__ import annotations

import contextlib

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)


class _EmbeddingParallel(RowwiseParallel):
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


def apply_tp(
    model: nn.Module,
    blocks: list[nn.Module],
    tp_mesh: DeviceMesh,
    *,
    loss_parallel_enabled: bool,
    float8_all_gather: bool = False,
) -> None:
    """Apply the plan to a Llama-structured model (tok_embeddings, layers, norm, output).

    With `float8_all_gather`, blocks whose Linear layers are all Float8Linear get torchao's
    float8 styles: activations are cast before the all-gather, halving its bytes."""
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_embeddings": _EmbeddingParallel(
                input_layouts=Replicate(), output_layouts=Shard(1)
            ),
            "norm": SequenceParallel(),
            "output": ColwiseParallel(
                input_layouts=Shard(1),
                output_layouts=Shard(-1) if loss_parallel_enabled else Replicate(),
                use_local_output=not loss_parallel_enabled,
            ),
        },
    )
    for block in blocks:
        colwise, rowwise, prepare_input = ColwiseParallel, RowwiseParallel, PrepareModuleInput
        if float8_all_gather and _all_float8(block):
            from parallelisms.float8 import float8_tp_styles

            colwise, rowwise, prepare_input = float8_tp_styles()
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                # The second input (RoPE rotations) is the same on every rank: leave it alone.
                "attention": prepare_input(
                    input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
                ),
                "attention.wq": colwise(),
                "attention.wk": colwise(),
                "attention.wv": colwise(),
                "attention.wo": rowwise(output_layouts=Shard(1)),
                "ffn_norm": SequenceParallel(),
                "feed_forward": prepare_input(
                    input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
                ),
                "feed_forward.w1": colwise(),
                "feed_forward.w2": rowwise(output_layouts=Shard(1)),
                "feed_forward.w3": colwise(),
            },
        )


def _all_float8(block: nn.Module) -> bool:
    from parallelisms.float8 import is_float8_linear

    linears = [m for m in block.modules() if isinstance(m, nn.Linear)]
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
