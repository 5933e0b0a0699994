"""The Llama TP plan: Megatron-style tensor parallel with sequence parallel, as DTensor plans.

Inside a block: q/k/v and w1/w3 are split column-wise (each rank owns whole heads / a slice of
the hidden units), wo and w2 row-wise, so a block costs one all-gather in and one reduce-scatter
out. Between blocks activations stay sharded on the sequence dim (the RMSNorms run on their
shard). The output head is column-wise; with loss parallel the logits stay sharded over the
vocabulary and cross-entropy runs on the shards.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from parallelisms.tensor_parallel import EmbeddingParallel, tp_styles


def apply_tp(
    model: nn.Module,
    blocks: list[nn.Module],
    tp_mesh: DeviceMesh,
    *,
    loss_parallel_enabled: bool,
    float8_all_gather: bool = False,
) -> None:
    """Apply the plan to a Llama-structured model (tok_embeddings, layers, norm, output)."""
    plan = {
        "tok_embeddings": EmbeddingParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(
            input_layouts=Shard(1),
            output_layouts=Shard(-1) if loss_parallel_enabled else Replicate(),
            use_local_output=not loss_parallel_enabled,
        ),
    }
    # A pipeline stage has only some of these; between stages the hidden states travel as each
    # tp rank's sequence shard, which is what the next stage's first block takes.
    present = {name: style for name, style in plan.items() if getattr(model, name) is not None}
    if present:
        parallelize_module(model, tp_mesh, present)
    for block in blocks:
        colwise, rowwise, prepare_input = tp_styles(block, float8_all_gather)
        parallelize_module(
            block,
            tp_mesh,
            {
                "attention_norm": SequenceParallel(),
                # The RoPE rotations and the attention mask (None, a boolean tensor over the
                # whole sequence or a BlockMask) are the same on every rank and the attention
                # sees the whole sequence after the all-gather: leave them alone.
                "attention": prepare_input(
                    input_layouts=(Shard(1), None, None),
                    desired_input_layouts=(Replicate(), None, None),
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
