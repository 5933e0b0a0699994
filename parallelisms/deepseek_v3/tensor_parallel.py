"""The DeepSeek-V3 TP plan: the shared decoder's outside the blocks and for the feed-forwards
(parallelisms/decoder_tp.py), and for multi-head latent attention (models/deepseek_v3/attention.py)
the heads split over the tp ranks, the latents computed whole on every rank:

- The attention's input is all-gathered on the sequence and handed on as a plain tensor.
- `wq` (or `wq_b`) and `wkv_b` are column-wise: each rank owns whole heads of queries, keys and
  values; `wo` is row-wise, its output reduce-scattered back onto the sequence shard.
- `wq_a`, `q_norm`, `wkv_a` and `kv_norm` are replicated (Replicate DTensors, computed on
  their local tensors): every rank computes the same latents from the same whole sequence. Their
  gradients come out the same on every rank, because the column-wise layers after them sum
  their input gradients over the ranks in backward (DTensor's Replicate input).
- The RoPE key that every head shares is the exception: each rank's heads use it, so its
  gradient is summed over the ranks at `share_rope_key` (SumGradOverGroup).

Backward communication per block: one all-reduce each of the query latent's (or, without one,
the input's), the key/value latent's and the RoPE key's gradients, where grouped-query attention
needs one reduce-scatter of the input's. The MTP modules' norms and `eh_proj` work token-wise on
the sequence shard (replicated, their gradients summed by DTensor), and their block is planned as
the main blocks."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

from parallelisms.decoder_tp import apply_block_tp, apply_outer_tp
from parallelisms.local_params import SumGradOverGroup, compute_on_local_params
from parallelisms.tensor_parallel import tp_styles

_LATENTS = ("wq_a", "q_norm", "wkv_a", "kv_norm")


def apply_tp(
    model: nn.Module,
    blocks: list[nn.Module],
    tp_mesh: DeviceMesh,
    *,
    loss_parallel_enabled: bool,
    float8_all_gather: bool = False,
) -> None:
    """Apply the plan to a DeepSeek-V3 model (tok_embeddings, layers, norm, output, mtp)."""
    apply_outer_tp(model, tp_mesh, loss_parallel_enabled=loss_parallel_enabled)
    mtp = getattr(model, "mtp", None)
    modules = list(mtp.values()) if mtp is not None else []
    for block in blocks + [m.get_submodule("block") for m in modules]:
        _block_tp(block, tp_mesh, float8_all_gather)
    for module in modules:
        parallelize_module(
            module,
            tp_mesh,
            {
                name: SequenceParallel(use_local_output=True)
                for name in ("enorm", "hnorm", "eh_proj", "norm")
            },
        )


def _block_tp(block: nn.Module, tp_mesh: DeviceMesh, float8_all_gather: bool) -> None:
    colwise, rowwise, prepare_input = tp_styles(block, float8_all_gather)
    attention = block.get_submodule("attention")
    queries = "attention.wq" if getattr(attention, "wq", None) is not None else "attention.wq_b"
    plan = {
        "attention_norm": SequenceParallel(),
        "attention": prepare_input(
            input_layouts=(Shard(1), None, None),
            desired_input_layouts=(Replicate(), None, None),
            use_local_output=True,
        ),
        queries: colwise(),
        "attention.wkv_b": colwise(),
        "attention.wo": rowwise(output_layouts=Shard(1)),
    }
    apply_block_tp(block, tp_mesh, plan, colwise, rowwise, prepare_input)
    for name in _LATENTS:
        latent = getattr(attention, name, None)
        if latent is not None:
            _replicate(latent, tp_mesh)
    group = tp_mesh.get_group()
    attention.get_submodule("share_rope_key").register_forward_pre_hook(
        lambda _module, args: (SumGradOverGroup.apply(args[0], group), *args[1:])
    )


def _replicate(module: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Parameters as Replicate DTensors (FSDP shards them as any other), computed with their
    local tensors on plain inputs."""
    distribute_module(module, tp_mesh)  # every parameter Replicate
    params = [(module, name) for name, _ in module.named_parameters(recurse=False)]
    compute_on_local_params(module, params, lambda param: param.to_local())
