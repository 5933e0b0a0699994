"""The TP plan of the shared decoder structure (models/decoder.py): Megatron-style tensor
parallel with sequence parallel, as DTensor plans. Each family's plan is this one, with its
options (parallelisms/<family>/tensor_parallel.py).

Inside a block: q/k/v and w1/w3 are split column-wise (each rank owns whole heads / a slice of
the hidden units), wo and w2 row-wise, so a block costs one all-gather in and one reduce-scatter
out. A Mixture-of-Experts feed-forward instead runs on the sequence shard with its parameters
replicated (parallelisms/moe_tp.py). Between blocks activations stay sharded on the sequence dim (the RMSNorms run on their
shard). The output head is column-wise; with loss parallel the logits stay sharded over the
vocabulary and cross-entropy runs on the shards.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    SequenceParallel,
    parallelize_module,
)

from models.moe import MoE
from parallelisms.moe_tp import apply_moe_tp
from parallelisms.tensor_parallel import EmbeddingParallel, tp_styles


def apply_decoder_tp(
    model: nn.Module,
    blocks: list[nn.Module],
    tp_mesh: DeviceMesh,
    *,
    loss_parallel_enabled: bool,
    float8_all_gather: bool = False,
    qk_norm: bool = False,
) -> None:
    """Apply the plan to a decoder (tok_embeddings, layers, norm, output). `qk_norm`: the
    blocks' attention has per-head `q_norm` / `k_norm` (see below)."""
    apply_outer_tp(model, tp_mesh, loss_parallel_enabled=loss_parallel_enabled)
    for block in blocks:
        colwise, rowwise, prepare_input = tp_styles(block, float8_all_gather)
        block_plan = {
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
        }
        if qk_norm:
            block_plan |= _qk_norms()
        apply_block_tp(block, tp_mesh, block_plan, colwise, rowwise, prepare_input)


def apply_outer_tp(model: nn.Module, tp_mesh: DeviceMesh, *, loss_parallel_enabled: bool) -> None:
    """The plan outside the blocks: the embedding's output sharded on the sequence, the final
    norm on its shard, the head column-wise (vocabulary-sharded logits under loss parallel)."""
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


def apply_block_tp(
    block: nn.Module,
    tp_mesh: DeviceMesh,
    attention_plan: dict[str, ParallelStyle],
    colwise: type,
    rowwise: type,
    prepare_input: type,
) -> None:
    """A pre-norm block (models/decoder.py DecoderBlock): the family's attention plan (its
    norm included), the feed-forward's norm on the sequence shard, and the feed-forward: a
    SwiGLU column- then row-wise, or an MoE token-wise with its parameters replicated."""
    plan = {**attention_plan, "ffn_norm": SequenceParallel()}
    ffn = block.get_submodule("feed_forward")
    if not isinstance(ffn, MoE):
        plan |= _feed_forward(colwise, rowwise, prepare_input)
    parallelize_module(block, tp_mesh, plan)
    if isinstance(ffn, MoE):  # token-wise on the sequence shard, parameters replicated
        apply_moe_tp(ffn, tp_mesh)


def _feed_forward(colwise: type, rowwise: type, prepare_input: type) -> dict[str, ParallelStyle]:
    return {
        "feed_forward": prepare_input(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
        ),
        "feed_forward.w1": colwise(),
        "feed_forward.w2": rowwise(output_layouts=Shard(1)),
        "feed_forward.w3": colwise(),
    }


# A query/key norm sees only this rank's heads: (batch, seq, local heads, head_dim) after the
# column-sharded wq / wk. Its forward needs nothing, but its weight is shared by all heads, so
# each rank's gradient is a partial sum over its own heads: the weight is a replicated DTensor
# and the input a DTensor sharded on the heads dim, so DTensor sums the gradient over the tp
# ranks (as Hugging Face's "replicated_with_grad_allreduce"); a plain weight would drift apart.
def _qk_norms() -> dict[str, ParallelStyle]:
    return {
        f"attention.{name}": SequenceParallel(sequence_dim=2, use_local_output=True)
        for name in ("q_norm", "k_norm")
    }
